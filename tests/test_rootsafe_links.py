"""Root trusts nothing, round two (issue 48 item 1): no write by root, p2pkit's own code or its Ansible
modules (p2pkit_files, p2pkit_user), through a link it did not make. The state directory itself, and every
directory between the host's root and it, is reached without following a link; the modules walk every
directory below the host's root with openat(O_NOFOLLOW) from the root's descriptor. A link found is refused
(exit 2) naming the path, its target and the fix, before anything is written.

The campaign over every path a whole `up --reboot` writes (strace of its process tree, Ansible's modules and
the host's tools included) is tests/test_trust_campaign.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from p2pkit.core.ansible import COLLECTION
from p2pkit.sim import lifecycle
from tests.conftest import REPO, make_sim

MODULES = Path(os.environ.get("P2PKIT_TEST_MODULES") or REPO / COLLECTION / "plugins/modules")


def listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def elsewhere(tmp_path: Path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / "kept").write_text("not p2pkit's\n")
    return d


# the state directory itself -------------------------------------------------------------------------------

def test_a_link_at_the_state_directory_is_refused_naming_it_and_its_target(cli, tmp_path):
    """The campaign's victim: every artifact was written into the target of a link at var/lib/p2pkit."""
    root = make_sim(tmp_path / "host")
    away = elsewhere(tmp_path)
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/p2pkit").symlink_to(away)
    for args in (("--yes", "up", "--to", "preflight"), ("status",)):
        r = cli("--root", str(root), *args)
        assert r.code == 2, (args, r.err)
        assert f"{root / 'var/lib/p2pkit'} is a symbolic link (to {away})" in r.err, r.err
        assert f"rm {root / 'var/lib/p2pkit'}" in r.err, r.err
    assert listing(away) == ["kept"]


def test_a_link_between_the_host_root_and_the_state_directory_is_refused(cli, tmp_path):
    root = make_sim(tmp_path / "host")
    away = elsewhere(tmp_path)
    if (root / "var/lib").exists():
        os.rename(root / "var/lib", away / "lib")
    (root / "var/lib").symlink_to(away / "lib")
    before = listing(away)
    r = cli("--root", str(root), "--yes", "up", "--to", "preflight")
    assert r.code == 2 and f"{root / 'var/lib'} is a symbolic link (to {away / 'lib'})" in r.err, r.err
    assert listing(away) == before


def test_a_second_up_never_writes_through_a_link_that_replaced_the_state_directory(cli, tmp_path):
    """A done host whose state directory was moved away and a link left in its place: refused, the moved
    directory left as it was (the issue: a second `up` wrote through it again)."""
    root = make_sim(tmp_path / "host")
    assert cli("--root", str(root), "--yes", "up", "--to", "preflight").code == 0
    state = root / "var/lib/p2pkit"
    moved = tmp_path / "moved"
    os.rename(state, moved)
    state.symlink_to(moved)
    before = {p: p.read_bytes() for p in moved.rglob("*") if p.is_file()}
    r = cli("--root", str(root), "--yes", "up", "--to", "preflight")
    assert r.code == 2 and f"{state} is a symbolic link (to {moved})" in r.err, r.err
    assert {p: p.read_bytes() for p in moved.rglob("*") if p.is_file()} == before


def test_a_state_directory_given_as_a_link_is_refused_and_its_own_path_works(cli, tmp_path):
    root = make_sim(tmp_path / "host")
    real = tmp_path / "real-state"
    real.mkdir()
    (tmp_path / "state").symlink_to(real)
    r = cli("--root", str(root), "--state-dir", str(tmp_path / "state"), "--yes", "up", "--to", "preflight")
    assert r.code == 2 and f"{tmp_path / 'state'} is a symbolic link (to {real})" in r.err, r.err
    assert list(real.iterdir()) == []
    r = cli("--root", str(root), "--state-dir", str(real), "--yes", "up", "--to", "preflight")
    assert r.code == 0 and (real / "preflight.json").is_file(), r.err


# p2pkit_files and p2pkit_user, run as Ansible runs them ---------------------------------------------------

def run_module(name: str, args: dict, tmp: Path) -> tuple[int, dict]:
    """A WANT_JSON module as Ansible runs it: the script with its arguments file."""
    f = tmp / f"{name}.args.json"
    f.write_text(json.dumps(args))
    r = subprocess.run([sys.executable, str(MODULES / f"{name}.py"), str(f)], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}"}, timeout=120)
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize("planted,entries", [
    ("etc/p2pkit", [{"path": "/etc/p2pkit", "state": "directory", "mode": "0755"},
                    {"path": "/etc/p2pkit/engine.env", "content": "A=1\n", "mode": "0600"}]),
    ("opt/p2pkit", [{"path": "/opt/p2pkit", "state": "directory", "mode": "0755"}]),
    ("etc/kernel/header_postinst.d", [{"path": "/etc/kernel/header_postinst.d", "state": "directory"},
                                      {"path": "/etc/kernel/header_postinst.d/zz-p2pkit", "content": "#!/bin/sh\n",
                                       "mode": "0755"}]),
    ("etc/kernel", [{"path": "/etc/kernel/postinst.d/zz-p2pkit", "content": "#!/bin/sh\n", "mode": "0755"}]),
    ("etc/p2pkit/engine.env", [{"path": "/etc/p2pkit/engine.env", "content": "A=1\n", "mode": "0644"}]),
    ("opt/p2pkit/engine", [{"path": "/opt/p2pkit", "state": "directory"},
                           {"path": "/opt/p2pkit/engine", "state": "checked"}]),
])
def test_the_files_module_refuses_a_link_where_it_writes_before_writing_anything(tmp_path, planted, entries):
    """The campaign's victims: links at etc/p2pkit (engine.env and the 0600 secrets written into the target,
    exit 0), opt/p2pkit (the engine cloned and built there) and etc/kernel/header_postinst.d; the module used
    os.stat and followed them."""
    root = tmp_path / "host"
    for d in ("etc/p2pkit", "etc/kernel/postinst.d", "opt/p2pkit"):
        (root / d).mkdir(parents=True, exist_ok=True)
    away = elsewhere(tmp_path)
    (away / "postinst.d").mkdir()
    link = root / planted
    if link.is_dir():
        shutil.rmtree(link)
    link.symlink_to(away / "kept" if planted.endswith(".env") else away)
    entries = [{"path": "/etc/modprobe.d/first.conf", "content": "x\n"}, *entries]  # written only after the scan
    (root / "etc/modprobe.d").mkdir(parents=True)
    code, res = run_module("p2pkit_files", {"root": str(root), "files": entries}, tmp_path)
    assert code == 1 and res["failed"], res
    target = os.readlink(link)
    assert res["p2pkit_refused"]["path"] == str(link) and f"{link} is a symbolic link (to {target})" in res["msg"]
    assert f"rm {link}" in res["p2pkit_refused"]["hint"]
    assert listing(away) == ["kept", "postinst.d"] and (away / "kept").read_text() == "not p2pkit's\n"
    assert not (root / "etc/modprobe.d/first.conf").exists()


def test_the_files_module_never_waits_on_a_fifo_where_a_file_belongs(tmp_path):
    root = tmp_path / "host"
    (root / "etc/p2pkit").mkdir(parents=True)
    os.mkfifo(root / "etc/p2pkit/engine.env")
    code, res = run_module("p2pkit_files", {"root": str(root), "files": [
        {"path": "/etc/p2pkit/engine.env", "content": "A=1\n"}]}, tmp_path)
    assert code == 1 and "engine.env is not a regular file (a FIFO)" in res["msg"], res


def test_the_files_module_still_writes_where_no_link_is(tmp_path):
    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    entries = [{"path": "/etc/p2pkit", "state": "directory", "mode": "0750"},
               {"path": "/etc/p2pkit/engine.secrets.env", "content": "T=1\n", "mode": "0600"},
               {"path": "/opt/p2pkit/engine", "state": "checked"}]
    code, res = run_module("p2pkit_files", {"root": str(root), "files": entries}, tmp_path)
    assert code == 0 and res["changed_paths"] == ["/etc/p2pkit", "/etc/p2pkit/engine.secrets.env"], res
    assert (root / "etc/p2pkit/engine.secrets.env").stat().st_mode & 0o777 == 0o600
    assert (root / "etc/p2pkit").stat().st_mode & 0o777 == 0o750
    code, res = run_module("p2pkit_files", {"root": str(root), "files": entries}, tmp_path)
    assert code == 0 and res["changed_paths"] == [], res


@pytest.mark.parametrize("planted", ["etc", "etc/passwd", "etc/group"])
def test_the_user_module_refuses_a_link_at_the_account_files_before_any_tool_runs(tmp_path, planted):
    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\n")
    away = elsewhere(tmp_path)
    (away / "passwd").write_text("victim\n")
    (away / "group").write_text("victim\n")
    link = root / planted
    if link.is_dir():
        os.rename(link, tmp_path / "etc-moved")
    else:
        link.unlink()
    link.symlink_to(away if planted == "etc" else away / link.name)
    bin_ = tmp_path / "bin"  # a useradd that leaves a mark if it ever runs
    bin_.mkdir()
    (bin_ / "useradd").write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\n")
    (bin_ / "useradd").chmod(0o755)
    code, res = run_module("p2pkit_user", {"root": str(root), "name": "p2pkit-engine", "groups": ["video"]},
                           tmp_path)
    assert code == 1 and res["p2pkit_refused"]["path"] == str(link), res
    assert f"{link} is a symbolic link (to {os.readlink(link)})" in res["msg"], res
    assert not (tmp_path / "ran").exists() and (away / "passwd").read_text() == "victim\n"


# through the CLI: a module's refusal is exit 2 ------------------------------------------------------------

@pytest.mark.slow
def test_a_link_at_a_directory_the_driver_role_writes_into_is_refused_by_up_with_exit_2(cli, sim, tmp_path):
    """The driver playbook's first module run meets a link at /etc/modprobe.d (where nouveau's blacklist
    goes): `up` exits 2 naming it (not a failed stage), the link's target untouched, and the stage resumes
    once it is gone."""
    root = sim("healthy")
    away = elsewhere(tmp_path)
    conf = root / "etc/modprobe.d"
    if conf.is_dir():
        for f in conf.iterdir():
            os.rename(f, away / f.name)
        conf.rmdir()
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.symlink_to(away)
    before = listing(away)
    r = cli("--root", str(root), "--yes", "up", "--to", "driver")
    assert r.code == 2, r.err[-2000:]
    assert f"{conf} is a symbolic link (to {away})" in r.err and f"rm {conf}" in r.err, r.err[-2000:]
    assert listing(away) == before
    conf.unlink()
    conf.mkdir()
    assert cli("--root", str(root), "--yes", "up", "--to", "driver").code == 0


def planted(root: Path, rel: str, tmp_path: Path) -> tuple[Path, Path]:
    """A link at root/rel to a victim file outside the host's root (its text "victim"): (the link, the victim)."""
    victim = elsewhere(tmp_path) / "victim"
    victim.write_text("victim\n")
    link = root / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    return link, victim


@pytest.mark.slow
def test_a_link_at_the_secrets_file_is_refused_by_up_with_exit_2_naming_it(cli, sim, tmp_path):
    """Found by the campaign on the container host (issue 48 item 1): the task that writes the secrets is no_log,
    and Ansible hides its whole result, the module's refusal with it: `up` stopped with a bare "failed", exit 1.
    The link is now refused by the task before it (exit 2, naming it and the fix); nothing written through it."""
    root = sim("healthy")
    secrets, victim = planted(root, "etc/p2pkit/engine.secrets.env", tmp_path)
    mode = victim.stat().st_mode
    try:
        r = cli("--root", str(root), "--yes", "up", "--reboot")
        assert r.code == 2, r.err[-2000:]
        assert f"{secrets} is a symbolic link (to {victim})" in r.err and f"rm {secrets}" in r.err, r.err[-2000:]
        assert victim.read_text() == "victim\n" and victim.stat().st_mode == mode
        secrets.unlink()
        assert cli("--root", str(root), "--yes", "up").code == 0
    finally:
        lifecycle.stop_services(root)


@pytest.mark.slow
def test_a_refused_link_is_never_what_rollback_puts_back(cli, sim, tmp_path):
    """Found by the planted-link campaign on the container host: the p2p-module stage's backup, taken before its
    role refused a link at the GRUB drop-in, recorded that link as what was there; `rollback p2p-module` then made
    it again, and the real update-grub, as root, read the link's target as the drop-in ("victim: not found"). A
    link where a role writes a file is left unrecorded: the next run records what is there then."""
    root = sim("healthy")
    dropin, victim = planted(root, "etc/default/grub.d/60-p2pkit-iommu.cfg", tmp_path)
    try:
        r = cli("--root", str(root), "--yes", "up", "--reboot")
        assert r.code == 2 and f"{dropin} is a symbolic link" in r.err, r.err[-2000:]
        dropin.unlink()
        assert cli("--root", str(root), "--yes", "up", "--reboot").code == 0
        assert cli("--root", str(root), "rollback", "p2p-module", "--yes").code == 4
        assert not dropin.is_symlink() and not dropin.exists(), "rollback made the refused link again"
        assert victim.read_text() == "victim\n"
    finally:
        lifecycle.stop_services(root)
