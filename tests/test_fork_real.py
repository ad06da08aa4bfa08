"""p2pkit's reading of the real fork's build, install and signing, on what the real tools printed
(tests/fixtures/fork-570.86.16-p2p/README.md says where each file came from): the failed builds' own
errors and their likely cause, the successful build with none, modinfo's fields, depmod's map, and the
signing check on the real signed module's sig_key."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pkit.core.ansible import COLLECTION, PlaybookFailed
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


# ---------------------------------------------------------------- the successful build, install and signing

KERNEL = "6.1.0-47-amd64"  # the kernel the real fork built for
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")


def fields_F(name: str) -> dict[str, str]:
    """modinfo-F-*.txt: FIELD=`modinfo -F FIELD` per line."""
    return dict(line.split("=", 1) for line in (FIX / name).read_text().splitlines() if "=" in line)


def role_values(task_file: str) -> dict:
    """The set_fact values of a task file of the p2p-module role, as written there."""
    import yaml

    doc = yaml.safe_load((Path(__file__).parent.parent / COLLECTION / "roles/p2pkit_p2p_module/tasks" / task_file)
                         .read_text())
    out: dict = {}
    for task in doc:
        out.update(task.get("ansible.builtin.set_fact") or {})
    return out


def test_the_successful_real_build_shows_no_build_error():
    """Its stderr holds two -Wvla warnings and kbuild's BTF notes, none of them an error."""
    text = (FIX / "build.stderr").read_text() + (FIX / "build.stdout").read_text()
    assert "warning: ISO C90 forbids variable length array" in text
    assert pbuild.kbuild_errors(text) == []


def test_modinfo_of_the_real_modules_reads_as_p2pkit_reads_it():
    from p2pkit.parse import system as ps

    installed = ps.modinfo_fields((FIX / "modinfo-k-installed-signed-nvidia.txt").read_text())
    f = fields_F("modinfo-F-installed-signed-nvidia.txt")
    assert installed["filename"] == f["filename"] == f"/lib/modules/{KERNEL}/kernel/drivers/video/nvidia.ko"
    assert installed["srcversion"] == f["srcversion"] == "1A398A95216071231183CE0"
    assert installed["sig_key"] == f["sig_key"] and installed["signer"] == f["signer"]
    assert installed["sig_id"] == "PKCS#7" and installed["sig_hashalgo"] == "sha256"
    assert installed["signature"].endswith(":")  # a signature goes on over tab-indented lines: its first only
    for m in MODULES:
        built = ps.modinfo_fields((FIX / f"modinfo-built-unsigned-{m}.txt").read_text())
        assert built["version"] == "570.86.16" and built["vermagic"].split()[0] == KERNEL
        assert built["name"] == m.replace("-", "_") and "sig_key" not in built
        signed = ps.modinfo_fields((FIX / f"modinfo-built-signed-{m}.txt").read_text())
        assert signed["srcversion"] == built["srcversion"]  # signing appends; the module is the same build


def test_p2pkit_judges_the_real_signed_module_by_its_sig_key():
    """sign.yml's key (the openssl command of the role's tasks/mok.yml) and the headers' scripts/sign-file: modinfo's
    sig_key is the certificate's serial as p2pkit reads it; the unsigned install is no one's."""
    from p2pkit.parse import mok as pm
    from p2pkit.stages.p2p_module import checks

    cert = pm.cert_identity((FIX / "x509-serial-subject.txt").read_text())
    mok = {"cert_id": cert}
    installed = fields_F("modinfo-F-installed-signed-nvidia.txt")
    sig_key = installed["sig_key"]
    assert checks.signed_by_key(sig_key, mok)
    assert not checks.signed_by_key(fields_F("modinfo-F-built-unsigned-nvidia.txt")["sig_key"], mok)
    facts = {"secure_boot": "on", "mok": {**mok, "cert": "/var/lib/p2pkit/mok/MOK.der", "enrolment": "enrolled",
                                           "module_sig_key": sig_key,
                                           "module_signer": installed["signer"]}}
    by_id = {c.id: c for c in checks._secure_boot(facts)}
    assert by_id["p2p.secure_boot"].status == "pass" and by_id["p2p.mok_enrolled"].status == "pass"


def test_modules_install_keeps_the_signature_p2pkit_made():
    """Debian sets CONFIG_MODULE_SIG_ALL: modules_install signs each module it installs with the build's
    key, which Debian's headers do not ship (sign-file fails, `|| true`): the installed module is the
    signed one byte for byte, so the role's install check (built sha256 = installed) holds next run."""
    sums: dict[str, list[str]] = {}
    for line in (FIX / "sha256.txt").read_text().splitlines():
        digest, path = line.split()
        sums.setdefault(path.rsplit("/", 1)[1], []).append(digest)
    assert sorted(sums) == sorted(f"{m}.ko" for m in MODULES)
    assert all(len(d) == 2 and d[0] == d[1] for d in sums.values())
    out = (FIX / "modules_install.stdout").read_text()
    assert all(f"SIGN    //lib/modules/{KERNEL}/kernel/drivers/video/{m}.ko" in out for m in MODULES)
    assert (FIX / "modules_install.stderr").read_text().count("sign-file: ./output/signing_key.pem") == 5


def test_the_role_reads_the_modules_where_the_real_build_and_install_put_them():
    """kernel-open/nvidia.ko (the built probe, sign.yml, the built_module fact) and
    /lib/modules/K/kernel/drivers/video (the installed probe, sign.yml, checks.module_file)."""
    from p2pkit.stages.p2p_module import checks

    assert (FIX / "built-ko.txt").read_text().split() == sorted(f"{m}.ko" for m in MODULES)
    values = role_values("render.yml")
    probes = {p["name"]: p for p in values["p2pkit_p2p_module_probes"]}
    assert probes["built"]["path"] == "{{ p2pkit_p2p_module_src_dir }}/kernel-open/nvidia.ko"
    ko = values["p2pkit_p2p_module_ko"].replace("{{ p2pkit_p2p_module_release }}", KERNEL)
    installed = (FIX / "installed-files.txt").read_text().split()
    assert ko in installed and ko == checks.module_file(KERNEL)
    assert {p.rsplit("/", 1)[0] for p in installed} == {f"/lib/modules/{KERNEL}/kernel/drivers/video"}


def test_the_depmod_probe_finds_the_patched_module_in_the_real_map():
    """followups.yml decides whether depmod must run from the modules_dep probe (render.yml's findall)
    over modules.dep: on the real map it finds kernel/drivers/video/nvidia.ko and nothing under updates/."""
    import re

    probe = next(p for p in role_values("render.yml")["p2pkit_p2p_module_probes"] if p["name"] == "modules_dep")
    found = re.findall(probe["findall"], (FIX / "modules.dep-nvidia.txt").read_text(), re.M)
    assert found == ["kernel/drivers/video/nvidia.ko"]


def test_the_version_string_the_fork_compiles_in_reads_as_p2pkit_reads_it():
    """/proc/driver/nvidia/version prints "NVRM version: " and pNVRM_ID (kernel-open/nvidia/nv-procfs.c:232),
    NVRM_ID past its 11 characters "nvidia id: " (src/nvidia's generated g_nvid_string.c, utils.mk:550-555)."""
    import re

    from p2pkit.core import config
    from p2pkit.parse import system as ps
    from p2pkit.stages.p2p_module import checks

    nvrm_id = re.search(r'NVRM_ID\[\] = "(.*)";', (FIX / "g_nvid_string.c.txt").read_text()).group(1)
    v = ps.nvidia_version(f"NVRM version: {nvrm_id[11:]}\n")
    assert (v.version, v.open_module, v.builder) == ("570.86.16", True, "root@vm")
    p = config.load("dual-5090-ninfer", ["driver.version=570.86.16", "driver.allow_other_version=true",
                                         "p2p_module.branch=570.86.16-p2p"])
    facts = {"nvidia_version": {"loaded": True, "version": v.version, "open_module": v.open_module},
             "module": {}, "built_module": {}, "nvml": {}, "secure_boot": "off", "iommu": {"error": "x"}}
    loaded = next(c for c in checks.runtime_checks(facts, p) if c.id == "p2p.loaded_version")
    assert loaded.status == "pass", loaded
