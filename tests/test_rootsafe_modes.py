"""Ownership and modes of what root later executes, loads or hands to a service (issue 48 item 2): the unit and
environment files, the installer cache, the engine's checkout, the model's directory, the logs and the
artifacts. One another user could write (or owned by someone else) makes its stage stale in `status`, naming the
path, owner and mode; `up` repairs what p2pkit wrote, says so and proves the stage again; a directory above it
that is not p2pkit's is refused (exit 2) with the fix. The campaign's figures: 17 of 33 such cases were used
as they were ("done", "nothing to do")."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from p2pkit.sim import lifecycle
from tests.conftest import make_sim

MAIN = "import sys; from p2pkit.cli.main import main; sys.argv[0] = 'p2pkit'; sys.exit(main())"


def p2pkit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", MAIN, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "1000"})


@pytest.fixture(scope="module")
def done_host(tmp_path_factory) -> Path:
    """A simulated host brought up fully, its engine stopped (each test works on a copy)."""
    root = make_sim(tmp_path_factory.mktemp("modes") / "host")
    r = p2pkit("--root", str(root), "up", "--reboot")
    lifecycle.stop_services(root)
    assert r.returncode == 0, r.stderr[-3000:]
    return root


@pytest.fixture
def changed(done_host):
    """change(rel, mode or "nobody") on the done host, put back after the test (copies of a host are other
    files: the engine's and the model's re-proofs would see new inodes)."""
    saved = []

    def change(rel: str, how) -> Path:
        p = done_host / rel
        st = p.stat()
        saved.append((p, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid))
        if how == "nobody":
            os.chown(p, 65534, 65534)
        else:
            p.chmod(how)
        return p
    yield change
    for p, mode, uid, gid in reversed(saved):
        os.chown(p, uid, gid)
        p.chmod(mode)
    lifecycle.stop_services(done_host)


def states(root: Path) -> dict[str, tuple[str, str]]:
    r = p2pkit("--root", str(root), "--json", "status", timeout=120)
    return {s["stage"]: (s["state"], s["reason"]) for s in json.loads(r.stdout)["stages"]}


CASES = [  # (path under the host, stage, chmod or "nobody")
    ("etc/systemd/system/p2pkit-engine.service", "service", 0o666),
    ("etc/p2pkit/engine.env", "service", "nobody"),
    ("etc/p2pkit", "service", 0o777),
    ("var/cache/p2pkit", "driver", 0o777),
    ("opt/p2pkit/ninfer", "engine", 0o777),
    ("srv/models", "model", 0o777),
    ("var/lib/p2pkit/logs", "driver", 0o777),
    ("var/lib/p2pkit/preflight.json", "preflight", 0o666),
    ("etc/kernel/postinst.d/zz-p2pkit", "p2p-module", 0o777),
]


@pytest.mark.slow
@pytest.mark.parametrize("rel,stage,how", CASES)
def test_a_place_another_user_could_change_makes_its_stage_stale_naming_it(done_host, changed, rel, stage, how):
    p = changed(rel, how)
    said = "is owned by nobody" if how == "nobody" else "is writable by every user"
    got = states(done_host)
    assert got[stage][0] == "stale" and f"{p} {said}" in got[stage][1], got[stage]
    assert "repairs it" in got[stage][1], got[stage]


@pytest.mark.slow
def test_up_repairs_what_p2pkit_wrote_says_so_and_proves_the_stage_again(done_host, changed):
    unit = changed("etc/systemd/system/p2pkit-engine.service", 0o666)
    env_dir = changed("etc/p2pkit", 0o777)
    r = p2pkit("--root", str(done_host), "up")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"repaired what another user could change: {unit}: mode -rw-rw-rw- -> -rw-r--r--" in r.stderr, r.stderr
    assert f"{env_dir}: mode drwxrwxrwx -> drwxr-xr-x" in r.stderr, r.stderr
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644 and stat.S_IMODE(env_dir.stat().st_mode) == 0o755
    doc = json.loads((done_host / "var/lib/p2pkit/service.json").read_text())
    assert doc["acted"].get("started") is not False, doc["acted"]  # acted again, not gated as proven
    assert all(state == "done" for state, _ in states(done_host).values())


@pytest.mark.slow
def test_a_directory_above_that_is_not_p2pkits_is_refused_with_the_fix(done_host, changed):
    d = changed("etc/systemd", 0o777)
    assert states(done_host)["service"][0] == "stale"
    r = p2pkit("--root", str(done_host), "up")
    assert r.returncode == 2 and f"{d} is writable by every user" in r.stderr and f"chmod go-w {d}" in r.stderr, \
        r.stderr[-2000:]


def test_a_recorded_profile_another_user_could_write_is_refused(cli, tmp_path):
    root = make_sim(tmp_path / "host")
    assert cli("--root", str(root), "--yes", "up", "--to", "preflight").code == 0
    rec = root / "var/lib/p2pkit/profile.json"
    rec.chmod(0o666)
    r = cli("--root", str(root), "status")
    assert r.code == 2 and f"the recorded profile: {rec} is writable by every user" in r.err, r.err
    assert f"chmod go-w {rec}" in r.err


def test_the_simulated_hosts_own_profile_another_user_could_write_is_refused(cli, tmp_path):
    root = make_sim(tmp_path / "host")
    own = root / ".p2pkit-sim/profile.toml"
    own.chmod(0o666)
    r = cli("--root", str(root), "--profile", "dual-5090-ninfer", "plan")
    assert r.code == 2 and f"{own} is writable by every user" in r.err, r.err
