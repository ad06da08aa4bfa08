"""p2pkit's reading of the real fork's build, install and signing, on what the real tools printed
(tests/fixtures/fork-570.86.16-p2p/README.md says where each file came from): the failed builds' own
errors and their likely cause, the successful build with none, modinfo's fields, depmod's map, and the
signing check on the real signed module's sig_key."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pkit.core.ansible import PlaybookFailed
from p2pkit.core.errors import P2pkitError
from p2pkit.parse import build as pbuild
from p2pkit.stages.p2p_module import act

FIX = Path(__file__).parent / "fixtures/fork-570.86.16-p2p"
TASK = "p2pkit_p2p_module : Build the modules"


def output(name: str) -> dict:
    return {"rc": 2, "msg": "non-zero return code", "stdout": (FIX / f"{name}.stdout").read_text(),
            "stderr": (FIX / f"{name}.stderr").read_text()}


def failed(name: str, task: str = TASK) -> PlaybookFailed:
    """The error run_playbook raises for the role's make task with the real output (the message as
    failed_task writes it: msg and the last four lines of stderr)."""
    res = output(name)
    tail = " | ".join([ln for ln in res["stderr"].splitlines() if ln.strip()][-4:])
    return PlaybookFailed(f"the p2p-module playbook failed: task '{task}': {res['msg']}; stderr: {tail}",
                          hint="nothing after the failed task ran; the full log is L", task=task, result=res)


@pytest.mark.parametrize(("name", "first", "cause"), [
    # p2pkit's own command on Debian's headers (SYSSRC=/lib/modules/K/build alone): the fork's conftest
    # finds no header there
    ("fail-syssrc-build", "error: #error dma_buf_export() conftest failed!", "the fork's conftest could not compile"),
    # the source and build trees given apart, on Debian's 6.1.0-57 (6.1.192): pci_resize_resource gained an
    # argument the fork's nv-pci.c does not pass
    ("fail-6.1.0-57", "error: too few arguments to function \u2018pci_resize_resource\u2019",
     "the kernel is newer than the fork's branch supports"),
])
def test_a_failed_real_build_is_named_by_its_own_error_and_cause(name, first, cause):
    e = failed(name)
    assert first not in e.message  # make's exit lines end the output: the message held only them
    act.explain(e)
    assert first in e.message.split("the build's errors: ", 1)[1].split(" | ")[0]
    assert e.hint.startswith(f"likely cause: {cause}")
    assert "make[" not in e.message.split("the build's errors: ", 1)[1]  # not make's exit lines


def test_the_build_errors_leave_out_make_exit_lines_and_keep_a_missing_tool():
    text = (FIX / "fail-syssrc-build.stderr").read_text()
    errors = pbuild.kbuild_errors(text)
    assert errors[:2] == [
        "/var/cache/p2pkit/open-gpu-kernel-modules/kernel-open/conftest/functions.h:76:2: error: #error "
        "dma_buf_export() conftest failed!",
        "/var/cache/p2pkit/open-gpu-kernel-modules/kernel-open/conftest/functions.h:92:2: error: #error "
        "radix_tree_replace_slot() conftest failed!"]
    assert any("fatal error: stdarg.h: No such file or directory" in x for x in errors)
    assert len(errors) == len(set(errors))  # each once (two objects failed the same way)
    assert pbuild.kbuild_errors("/bin/sh: 1: xz: not found\nmake[1]: *** [Makefile:201: a.xz] Error 127\n"
                                "make[1]: *** Deleting file 'a.xz'\nmake: *** Waiting for unfinished jobs....") \
        == ["/bin/sh: 1: xz: not found"]


def test_a_failure_outside_the_build_keeps_its_message():
    e = failed("fail-6.1.0-57", task="p2pkit_p2p_module : Ensure the restore timer is enabled")
    before = e.message
    act.explain(e)
    assert e.message == before
    plain = P2pkitError("the p2p-module playbook failed: something else")
    act.explain(plain)
    assert plain.message == "the p2p-module playbook failed: something else" and plain.hint == ""
