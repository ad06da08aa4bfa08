"""What a new user and an operator hit outside the demo path (issue 17): nothing is lost and
every refusal names its fix, with its exit code."""

import os
from pathlib import Path

from p2pkit.host import SIM_MARKER


def test_sim_init_force_with_a_mistyped_scenario_keeps_the_host(cli, sim):
    root = sim("healthy")
    (root / "var/lib/p2pkit").mkdir(parents=True)
    (root / "var/lib/p2pkit/keep.json").write_text("{}")
    r = cli("sim", "init", "--force", str(root), "--scenario", "helthy")
    assert r.code == 2 and "no simulated scenario named 'helthy'" in r.err
    assert (root / SIM_MARKER).is_file() and (root / "var/lib/p2pkit/keep.json").is_file()


def test_up_as_a_user_that_is_not_root_says_what_to_do(cli, monkeypatch, tmp_path):
    """As a user that is not root, the kernel refuses to make the state directory (EACCES). The
    tests run as root, so the refusal is the kernel's own error raised at that one mkdir."""
    state = tmp_path / "var/lib/p2pkit"
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **kw):
        if self == state:
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *a, **kw)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = cli("--state-dir", str(state), "up")
    assert r.code == 2, r.err
    assert f"cannot write the state directory {state}: Permission denied (p2pkit is not running as root)" in r.err
    assert "sudo p2pkit" in r.err and "--state-dir" in r.err and "internal error" not in r.err


def test_a_mistyped_root_is_refused(cli, sim, tmp_path):
    root = sim("healthy")
    r = cli("--root", str(root) + "x", "plan")
    assert r.code == 2 and "does not exist" in r.err and "typo" in r.err
    (tmp_path / "empty").mkdir()
    r = cli("--root", str(tmp_path / "empty"), "up")
    assert r.code == 2 and "neither a simulated host nor a host's root filesystem" in r.err
    assert cli("--root", str(root), "--json", "plan").code == 0
