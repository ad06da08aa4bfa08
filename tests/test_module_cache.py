"""One cache of the modules Ansible builds, shared by a state directory's stage playbooks
(playbooks/callback_plugins/p2pkit_module_cache.py, core/ansible.module_cache): each module's payload
is built once per `up`, not once per playbook, and never reused across a change to what it is built
from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from p2pkit.core import ansible
from p2pkit.core.ansible import COLLECTION
from tests.conftest import REPO
from tests.test_playbooks import ctx_for


def test_the_cache_is_named_by_what_the_payloads_are_built_from(tmp_path, monkeypatch):
    """The same sources give the same directory; a changed module of p2pkit's gives another, and the
    directory of the old key is removed rather than left to be reused."""
    share = tmp_path / "share"
    shutil.copytree(REPO / "playbooks", share / "playbooks", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(ansible, "share_dir", lambda: share)
    state = tmp_path / "state"
    first = ansible.module_cache(state)
    assert first == ansible.module_cache(state)
    first.mkdir(parents=True)
    (first / "ansible.modules.command-ZIP_DEFLATED-none").write_text("a payload built before")
    lib = share / COLLECTION / "plugins/modules/p2pkit_files.py"
    lib.write_text(lib.read_text() + "\n# changed\n")
    second = ansible.module_cache(state)
    assert second != first and second.parent == first.parent
    assert not first.exists()


@pytest.mark.slow
def test_a_stage_playbook_builds_into_the_shared_cache_and_the_next_reuses_it(sim):
    """The driver's playbook leaves its built modules in <state>/.ansible/modules/<key>; the p2p-module
    playbook, a later ansible-playbook process, finds the command module there and builds it no more
    (the payload file is the one the first run wrote). p2pkit's own modules are WANT_JSON scripts:
    nothing is built for them."""
    from p2pkit.stages.driver import act as driver_act
    from p2pkit.stages.p2p_module import act as acting

    root = sim("healthy")
    ctx = ctx_for(root)
    driver_act.driver(ctx)
    cache = ansible.module_cache(ctx.store.dir)
    payload = cache / "ansible.modules.command-ZIP_DEFLATED-none"
    assert payload.is_file(), sorted(p.name for p in cache.parent.rglob("*"))
    built = payload.stat().st_mtime_ns
    acting.p2p_module(ctx)
    assert payload.stat().st_mtime_ns == built
    assert (cache / "ansible.modules.git-ZIP_DEFLATED-none").is_file()
    assert not list(cache.glob("*p2pkit_files*"))
    # Ansible's own temporary directories are gone; the cache is what stays
    assert not list(Path(ctx.store.dir, ".ansible/tmp").glob("run*"))


def run_module(name: str, args: dict, tmp_path: Path) -> tuple[int, dict]:
    """One of p2pkit's WANT_JSON modules run as Ansible runs it: the interpreter, the script, a file
    of its arguments as JSON; its result is the JSON it prints."""
    import json
    import subprocess
    import sys

    f = tmp_path / "args"
    f.write_text(json.dumps(args))
    r = subprocess.run([sys.executable, str(REPO / COLLECTION / "plugins/modules" / f"{name}.py"), str(f)],
                       capture_output=True, text=True)
    return r.returncode, json.loads(r.stdout)


def test_the_files_module_checks_its_arguments_as_ansible_module_did(tmp_path):
    """Unknown names, a list that is not one, entries that are not mappings: refused with Ansible's
    own wording, nothing written. Check mode writes nothing and says what would change."""
    rc, res = run_module("p2pkit_files", {"root": str(tmp_path), "flies": []}, tmp_path)
    assert rc == 1 and res["failed"] and "Unsupported parameters for (p2pkit_files) module: flies" in res["msg"]
    rc, res = run_module("p2pkit_files", {"root": str(tmp_path), "files": "/etc/x"}, tmp_path)
    assert rc == 1 and "argument 'files' is of type str" in res["msg"]
    rc, res = run_module("p2pkit_files", {"root": str(tmp_path), "files": ["/etc/x"]}, tmp_path)
    assert rc == 1 and "Elements value for option 'files' is not a dict" in res["msg"]
    entry = {"path": "/etc/x.conf", "content": "a\n", "mode": "0644"}
    rc, res = run_module("p2pkit_files", {"root": str(tmp_path), "files": [entry], "_ansible_check_mode": True},
                         tmp_path)
    assert (rc, res["changed"], res["changed_paths"]) == (0, True, ["/etc/x.conf"])
    assert not (tmp_path / "etc/x.conf").exists()
    # a directory entry first, then the file in it; Ansible's own keys (_ansible_*) are not options
    rc, res = run_module("p2pkit_files", {"root": str(tmp_path), "_ansible_no_log": False,
                                          "files": [{"path": "/etc", "state": "directory", "mode": "0755"}]},
                         tmp_path)
    assert (rc, res["changed_paths"]) == (0, ["/etc"]) and (tmp_path / "etc").is_dir()
    rc, res = run_module("p2pkit_files", {"root": str(tmp_path), "files": [entry]}, tmp_path)
    assert (rc, res["changed"]) == (0, True) and (tmp_path / "etc/x.conf").read_text() == "a\n"
    rc, res = run_module("p2pkit_files", {"root": str(tmp_path), "files": [entry]}, tmp_path)
    assert (rc, res["changed"]) == (0, False)


def test_the_user_module_checks_its_arguments_and_reads_the_hosts_files(tmp_path):
    """name is required; a user already in its groups in <root>/etc/passwd and /etc/group is unchanged
    (its uid and gid returned); a group the host lacks is refused naming it."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0::/root:/bin/bash\np2pkit:x:998:997::/:/usr/sbin/nologin\n")
    (tmp_path / "etc/group").write_text("video:x:44:p2pkit\nrender:x:105:p2pkit\n")
    rc, res = run_module("p2pkit_user", {"root": str(tmp_path)}, tmp_path)
    assert rc == 1 and res["msg"] == "missing required arguments: name"
    rc, res = run_module("p2pkit_user", {"root": str(tmp_path), "name": "p2pkit", "groups": "video"}, tmp_path)
    assert rc == 1 and "'groups' is a list" in res["msg"]
    rc, res = run_module("p2pkit_user", {"root": str(tmp_path), "name": "p2pkit", "groups": ["video", "render"]},
                         tmp_path)
    assert (rc, res["changed"], res["uid"], res["gid"]) == (0, False, 998, 997)
    rc, res = run_module("p2pkit_user", {"root": str(tmp_path), "name": "p2pkit", "groups": ["kvm"]}, tmp_path)
    assert rc == 1 and "the group(s) kvm are not in" in res["msg"]
