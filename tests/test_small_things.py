"""The small things a new user met (issue 29, item 7): each fix, with the words and exit code the
user sees."""

from __future__ import annotations

import shlex


def test_a_bad_set_names_a_validate_command_that_runs(cli, sim):
    r = cli("--set", "serve.port=abc", "--set", "serve.env.HF_TOKEN=hf_x1y2z3", "plan")
    assert r.code == 2 and "serve.port: expected an integer" in r.err
    hint = r.err.split("check it with `", 1)[1].split("`", 1)[0]
    # the bad value is not given back (issue 47 item 12): what the key expects stands in its place
    assert hint == "p2pkit --set 'serve.port=<an integer>' --set 'serve.env.HF_TOKEN=<your value>' profile validate " \
                   "dual-5090-ninfer"
    args = shlex.split(hint.replace("<an integer>", "8001"))[1:]
    r = cli(*args)  # the hint runs once filled in: it validates the same profile with the corrected override
    assert r.code == 0 and "No such command" not in r.err, r.err


def test_a_truncated_profile_record_is_fixed_the_way_its_hint_says(cli, sim):
    root = sim("healthy")
    state = root / "var/lib/p2pkit"
    assert cli("--root", str(root), "--set", "host.min_free_disk_gib=10", "up", "--to", "preflight").code == 0
    (state / "profile.json").write_text('{"source": "dual-5090-nin')  # cut short
    r = cli("--root", str(root), "status")
    assert r.code == 2 and "cannot be read" in r.err
    assert f"`p2pkit --root {root} --profile NAME|FILE [--set SECTION.KEY=VALUE ...] up`" in r.err
    from p2pkit.host import Host

    own = Host.at(root).sim["profile"]  # the host's own (pinned) profile file: what the hint's FILE means here
    r = cli("--root", str(root), "--profile", own, "--set", "host.min_free_disk_gib=10", "up", "--to", "preflight")
    assert r.code == 0, r.err
    assert cli("--root", str(root), "status").code in (0, 1)  # readable again (stages after preflight not run)
    assert '"host.min_free_disk_gib=10"' in (state / "profile.json").read_text()




def test_a_state_dir_that_names_a_file_is_refused_as_such(cli, sim, tmp_path):
    root = sim("healthy")
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    for cmd in (["status"], ["up", "--to", "preflight"], ["report", str(tmp_path / "r.tar.gz")]):
        r = cli("--root", str(root), "--state-dir", str(f), *cmd)
        assert r.code == 2 and f"--state-dir {f} is not a directory" in r.err, (cmd, r.err)
        assert "Not a directory" not in r.err and f.read_text() == "mine"


def test_up_and_status_as_a_user_on_a_host_without_gpus_name_the_simulated_host(cli, tmp_path, monkeypatch):
    """A host root that is not simulated (os-release, /proc, /sys) and has no NVIDIA GPU; the user is
    not root. Nothing is recorded there yet, so `up` proves preflight before it makes the state directory (issue
    47 item 11): preflight names both (not root, no GPU) and nothing is written."""
    import os
    import shutil
    from pathlib import Path

    root = tmp_path / "box"
    for d in ("etc", "proc", "sys/bus/pci/devices"):
        (root / d).mkdir(parents=True)
    shutil.copy("/etc/os-release", root / "etc/os-release")
    state = tmp_path / "state"
    r = cli("--root", str(root), "--state-dir", str(state), "status")
    assert r.code == 1 and "this host has no NVIDIA GPU; to try p2pkit without GPUs: `p2pkit sim init" in r.err
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **kw):
        if self == state:
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *a, **kw)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = cli("--root", str(root), "--state-dir", str(state), "up")
    assert r.code == 1 and "FAIL    preflight.root: False (expected True)" in r.err, r.err
    assert "to try p2pkit without GPUs: `p2pkit sim init" in r.err and not state.exists()


def moved(standin, here: str, to: str) -> None:
    """A stand-in as an earlier install laid it out: it names p2pkit's old directory."""
    text = standin.read_text()
    assert f"sys.path.append({here!r})" in text
    standin.write_text(text.replace(f"sys.path.append({here!r})", f"sys.path.append({to!r})"))


def test_a_simulated_host_laid_out_by_another_install_keeps_working(sim, tmp_path):
    """`pip install .` laid the host out (its stand-ins name site-packages), `pip install -e .` replaced
    it: the stand-ins find p2pkit through the interpreter's own site-packages and .pth hooks."""
    import subprocess
    from pathlib import Path

    import p2pkit

    root = sim("healthy")
    here = str(Path(p2pkit.__file__).resolve().parent.parent)
    before = subprocess.run([str(root / "usr/bin/modinfo"), "-F", "version", "nvidia"], capture_output=True, text=True)
    moved(root / "usr/bin/modinfo", here, str(tmp_path / "gone/site-packages"))
    after = subprocess.run([str(root / "usr/bin/modinfo"), "-F", "version", "nvidia"], capture_output=True, text=True)
    assert (after.returncode, after.stdout, after.stderr) == (before.returncode, before.stdout, before.stderr)
    assert "Traceback" not in after.stderr


def test_a_stand_in_that_cannot_find_p2pkit_says_sim_init_force(sim, tmp_path):
    import subprocess
    from pathlib import Path

    import pytest

    import p2pkit

    other = "/usr/bin/python3"  # an interpreter without this p2pkit: as if it were uninstalled
    if subprocess.run([other, "-c", "import p2pkit"], capture_output=True, cwd=tmp_path).returncode == 0:
        pytest.skip(f"{other} imports a p2pkit of its own here")
    root = sim("healthy")
    standin = root / "usr/bin/modinfo"
    moved(standin, str(Path(p2pkit.__file__).resolve().parent.parent), str(tmp_path / "gone"))
    standin.write_text(f"#!{other} -S\n" + standin.read_text().split("\n", 1)[1])
    r = subprocess.run([str(standin), "-F", "version", "nvidia"], capture_output=True, text=True)
    assert r.returncode == 127 and "Traceback" not in r.stderr  # the runner stops the command with its message
    assert "cannot run its stand-in for modinfo" in r.stderr
    assert f"`p2pkit sim init --force {root} --scenario healthy`" in r.stderr


def test_sim_container_exec_never_exits_a_wrapped_signal(tmp_path):
    """Issue 47 item 9: `sim container exec DIR -- p2pkit --yes up --reboot` exited 241 when the container rebooted
    (the command's -15 passed on, wrapped to 241: in no table). A command the OS going down ended is exit 4 (as
    that `up` on a real box that reboots), with what happened; another signal is 128+N, as a shell says it."""
    import json
    import os
    import subprocess

    from p2pkit.core.errors import Exit
    from p2pkit.sim import container

    assert container.REBOOTED == Exit.REBOOT
    h = container.ContainerHost(tmp_path / "ct")
    h.dir.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (h.dir / "machine.json").write_text(json.dumps({"state": "running", "boots": 2, "leader_pid": gone.pid}))
    code, said = h.ended_by(-15, gone.pid, 2, wait_s=1)
    assert code == 4 and "went down under the command (boot 2 ended: its OS rebooted)" in said and "SIGTERM" in said
    assert f"p2pkit sim container exec {h.dir} -- p2pkit status" in said
    (h.dir / "machine.json").write_text(json.dumps({"state": "running", "boots": 2, "leader_pid": os.getpid()}))
    assert h.ended_by(-9, os.getpid(), 2, wait_s=0.3) == (137, "the command inside was ended by SIGKILL (exit 137, "
                                                                "as a shell says it)")
    assert h.ended_by(3, os.getpid(), 2) == (3, "")


def test_issue_47_item_13_small_things(cli, sim, tmp_path, capsys):
    """Each as an operator met it: `facts record FILE` overwrote FILE silently (report refuses without --force);
    `logs -n -1` and `serve logs -n -1` were taken; `--json --version` printed text; `sim init --scenario healty`
    listed every scenario but guessed none."""
    import json
    import subprocess
    import sys

    root = sim("healthy")
    f = tmp_path / "facts.json"
    f.write_text("mine\n")
    r = cli("--root", str(root), "facts", "record", str(f))
    assert r.code == 2 and "exists" in r.err and "--force" in r.err and f.read_text() == "mine\n", r.err
    assert cli("--root", str(root), "facts", "record", "--force", str(f)).code == 0
    assert json.loads(f.read_text())["kind"] == "p2pkit-facts"
    for args in (["logs", "driver", "-n", "-1"], ["serve", "logs", "-n", "-1"]):
        r = cli("--root", str(root), *args)
        assert r.code == 2 and "-1" in r.err and "no log" not in r.err, (args, r.err)
    for args in (["--json", "--version"], ["--version", "--json"]):
        p = subprocess.run([sys.executable, "-m", "p2pkit", *args], capture_output=True, text=True)
        doc = json.loads(p.stdout)
        assert p.returncode == 0 and doc["kind"] == "p2pkit-version" and doc["version"], (args, p.stdout)
    r = cli("sim", "init", "--scenario", "healty", str(tmp_path / "x"))
    assert r.code == 2 and "did you mean healthy?" in r.err, r.err


def test_status_on_a_host_without_gpus_sends_to_the_simulated_host_not_to_up(cli, tmp_path):
    """On a machine without NVIDIA GPUs status said "next: run `p2pkit up`" beside "this host has no NVIDIA GPU":
    up stops at preflight there; the one next step is the simulated host (issue 47 item 13)."""
    import shutil

    root = tmp_path / "box"
    for d in ("etc", "proc", "sys/bus/pci/devices"):
        (root / d).mkdir(parents=True)
    shutil.copy("/etc/os-release", root / "etc/os-release")
    r = cli("--root", str(root), "--state-dir", str(tmp_path / "state"), "status")
    assert r.code == 1 and "this host has no NVIDIA GPU" in r.err and "next: run" not in r.err, r.err


def test_hints_to_root_carry_no_sudo():
    """Hints said `sudo p2pkit ...` and `sudo apt-get ...` to root on a real box, which may have no sudo (issue 47
    item 13); a user who is not root is still told sudo."""
    from p2pkit.core.output import on_host

    said = "run `sudo p2pkit up --pin`, or `sudo apt-get install -y make`, as `sudo -E x` says; then `p2pkit status`"
    assert on_host(said, [], drop_sudo=True) == ("run `p2pkit up --pin`, or `apt-get install -y make`, as `sudo -E x` "
                                                 "says; then `p2pkit status`")
    assert on_host(said, [], drop_sudo=False) == said
