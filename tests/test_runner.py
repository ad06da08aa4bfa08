"""The one runner: a timeout on every command, children that cannot outlive p2pkit or escape the
lock, captured output capped (issue 19, items 6, 7 and 14)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from p2pkit.core import children
from p2pkit.core.lock import state_lock
from p2pkit.core.runner import HEAD_CAP, TAIL_CAP, Runner, timeout_for
from p2pkit.host import Host, smi


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait(cond, seconds: float = 20.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_a_hung_nvidia_smi_is_a_finding_within_its_timeout(tmp_path, monkeypatch):
    """A stand-in nvidia-smi that never answers (a wedged driver): an error naming it and the time,
    back within the timeout; the stand-in and its own child are gone afterwards."""
    bin_ = tmp_path / "usr/bin"
    bin_.mkdir(parents=True)
    pidfile = tmp_path / "child.pid"
    (bin_ / "nvidia-smi").write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pidfile}\nwait\n")
    (bin_ / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("P2PKIT_TIMEOUT_NVIDIA_SMI", "1")
    t0 = time.monotonic()
    got = smi.topo_m(Host.at(tmp_path))
    took = time.monotonic() - t0
    assert took < 8, f"nvidia-smi hung p2pkit for {took:.0f} s"
    assert got["error"].startswith("nvidia-smi did not answer within 1 s"), got
    assert _wait(lambda: not _alive(int(pidfile.read_text()))), "the stand-in's child outlived the timeout"


def test_every_command_has_a_default_timeout(monkeypatch):
    monkeypatch.delenv("P2PKIT_TIMEOUT_NVIDIA_SMI", raising=False)
    assert timeout_for("nvidia-smi") == 30 and timeout_for("/usr/bin/systemctl") == 120
    assert timeout_for("something-else") == 600 and timeout_for("git", 7200) == 7200
    monkeypatch.setenv("P2PKIT_TIMEOUT_GIT", "5")
    assert timeout_for("git", 7200) == 5
    monkeypatch.setenv("P2PKIT_TIMEOUT_GIT", "nan")
    assert timeout_for("git") == 600


PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Hang like a long build
      ansible.builtin.shell: "echo $$ > {pidfile}; exec sleep 600"
"""

HOLDER = """\
import sys
from pathlib import Path
from p2pkit.core.lock import state_lock
from p2pkit.core.runner import Runner
with state_lock(Path(sys.argv[1])):
    Runner().run(sys.argv[2:], check=False)
"""


@pytest.mark.parametrize("kind", ["make", "ansible-playbook"])
def test_kill_9_leaves_no_process_and_the_next_run_goes_through(tmp_path, kind):
    """p2pkit killed with SIGKILL during a build (make) and during a playbook, its guard killed
    first (so that only the next run can clean up): its direct child dies with it, the next run kills
    the rest before it takes the lock and says so, and nothing of the killed run is left."""
    state, pidfile = tmp_path / "state", tmp_path / "grandchild.pid"
    if kind == "make":
        (tmp_path / "Makefile").write_text(f"all:\n\tsh -c 'echo $$$$ > {pidfile}; exec sleep 600'\n")
        argv = ["make", "-C", str(tmp_path)]
    else:
        (tmp_path / "hang.yml").write_text(PLAYBOOK.format(pidfile=pidfile))
        exe = str(Path(sys.executable).parent / "ansible-playbook")
        argv = [exe, "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
                str(tmp_path / "hang.yml")]
    env = {**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_HOME": str(tmp_path / "ah")}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(state), *argv], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait(lambda: pidfile.is_file() and pidfile.read_text().strip(), 60), "the command never started"
        grandchild = int(pidfile.read_text())

        def recorded() -> dict | None:  # the command can run before p2pkit has written it (and its guard) down
            try:
                doc = json.loads((state / ".children").read_text())
            except (OSError, ValueError):
                return None
            return doc if doc.get("groups") and doc.get("guard") else None
        assert _wait(recorded), "p2pkit never recorded the command and its guard"
        record = recorded()
        [group] = record["groups"]
        os.kill(record["guard"], signal.SIGKILL)
        assert _wait(lambda: not _alive(record["guard"]))
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert _wait(lambda: not _alive(group["pgid"])), "the direct child outlived p2pkit"
        assert grandchild in children.members(group["pgid"], group["token"])  # only the next run can end it
        said: list[str] = []
        with state_lock(state, say=said.append):
            assert not _alive(grandchild), "the next run took the lock beside the leftovers"
            assert [p for p in children.members(group["pgid"], group["token"]) if _alive(p)] == []
        assert len(said) == 1 and "killed" in said[0] and argv[0].split("/")[-1] in said[0], said
        assert not (state / ".children").exists()
    finally:
        if holder.poll() is None:
            holder.kill()


def test_a_run_that_ends_normally_leaves_no_record(tmp_path):
    with state_lock(tmp_path):
        assert Runner().run(["true"]).returncode == 0
        assert (tmp_path / ".children").is_file()
    assert not (tmp_path / ".children").exists()
    with state_lock(tmp_path, say=pytest.fail):  # nothing to clean up: nothing said
        pass


def test_captured_output_is_capped():
    """A runaway log (20 MiB here) keeps its head and its tail, and says what it dropped."""
    code = textwrap.dedent("""\
        import sys
        sys.stdout.write("FIRST LINE\\n")
        for i in range(20 * 1024):
            sys.stdout.write("x" * 1023 + "\\n")
        sys.stdout.write("LAST LINE\\n")
    """)
    out = Runner().run([sys.executable, "-c", code]).stdout
    assert len(out) <= HEAD_CAP + TAIL_CAP + 200
    assert out.startswith("FIRST LINE") and out.endswith("LAST LINE\n") and "p2pkit dropped" in out


def test_a_sigkilled_p2pkit_takes_its_setsid_grandchild_with_it(sim, cli):
    """The real p2pkit on a simulated host, the first commands its driver stage runs (apt-mark,
    dpkg-query) stand-ins that start a grandchild in a session of its own (setsid) and hang. p2pkit
    killed with SIGKILL: the grandchild is gone at once (its guard killed it, no other p2pkit ran),
    and the next run says what was killed."""
    root = sim("healthy")
    pidfile = root / "grandchild.pid"
    bin_ = root / "usr/local/bin"  # first on the runner's PATH for this host
    bin_.mkdir(parents=True, exist_ok=True)
    names = ("apt-mark", "dpkg-query")
    for name in names:
        (bin_ / name).write_text("#!/bin/sh\nsetsid sh -c 'echo $$ > " + str(pidfile) + "; exec sleep 600' "
                                 "</dev/null >/dev/null 2>&1 &\nexec sleep 600\n")
        (bin_ / name).chmod(0o755)
    exe = Path(sys.executable).parent / "p2pkit"
    run = subprocess.Popen([str(exe), "--root", str(root), "--yes", "up", "--to", "driver"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    grandchild = None
    try:
        assert _wait(lambda: pidfile.is_file() and pidfile.read_text().strip(), 60), "no stand-in ran"
        grandchild = int(pidfile.read_text())
        assert Path(f"/proc/{grandchild}/stat").read_text().split()[5] == str(grandchild)  # its own session

        def recorded() -> dict | None:
            """The record once it lists a stand-in: the runner records a command right after starting it, and
            on a loaded machine the stand-in's grandchild can write its pid first (CI saw only another command
            in the record then). Facts are gathered side by side: other commands may be recorded beside it."""
            doc = json.loads((root / "var/lib/p2pkit/.children").read_text())
            return doc if any(g["argv"][0] in names for g in doc["groups"]) else None

        assert _wait(recorded, 30), json.loads((root / "var/lib/p2pkit/.children").read_text())
        record = recorded()
        groups = [g for g in record["groups"] if g["argv"][0] in names]
        assert _alive(record["guard"]), record
        run.send_signal(signal.SIGKILL)
        run.wait()
        # the guard waits up to 30 s for its p2pkit to be gone before it takes the lock (children.guard_main)
        if not _wait(lambda: not _alive(grandchild), 40):
            note = root / "var/lib/p2pkit/.reaped"
            left = root / "var/lib/p2pkit/.children"
            pytest.fail(f"the setsid grandchild outlived p2pkit: guard {record['guard']} alive "
                        f"{_alive(record['guard'])}; record now {left.read_text() if left.exists() else None}; "
                        f"note {note.read_text() if note.exists() else None}")
        assert _wait(lambda: not _alive(record["guard"]))
    finally:
        if run.poll() is None:
            run.kill()
        if grandchild and _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
    for name in names:
        (bin_ / name).unlink()
    r = cli("--root", str(root), "--yes", "up", "--to", "preflight")
    assert r.code == 0, r.err
    assert "a p2pkit run that was killed left commands running: killed " in r.err, r.err
    for group in groups:  # each grandchild (the stand-ins themselves died with p2pkit), on one line
        said = "process(es) of `" + " ".join(group["argv"]).replace("\n", "\\n") + "` (process group"
        assert said in r.err, r.err
    assert "by the guard of the p2pkit run that was killed" in r.err
    assert not (root / "var/lib/p2pkit/.reaped").exists() and not (root / "var/lib/p2pkit/.children").exists()


def test_the_guard_waits_while_the_killed_run_still_holds_the_lock(tmp_path):
    """A killed p2pkit's main thread can be a zombie while its other threads still exit, holding its
    files and so the state lock: the guard waits that moment out and kills what the record names
    (it gave up at its first try, leaving the command running: CI saw it once under load). Here a
    process that wrote the dead run's pid as the holder keeps the lock for a second."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    leftover = subprocess.Popen(["sleep", "600"], start_new_session=True)
    lock, record = tmp_path / ".lock", tmp_path / ".children"
    record.write_text(json.dumps({"owner": int(dead), "owner_start": None, "guard": None,
                                  "groups": [{"pgid": leftover.pid, "argv": ["sleep", "600"],
                                              "start": children.start_time(leftover.pid), "token": "t.1"}]}))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, b"{dead}\\n", 0)
        print("held", flush=True)
        time.sleep(1)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r, w = os.pipe()
        os.close(w)  # the run is gone: the guard reads end-of-file at once
        guard = subprocess.run([sys.executable, "-c", children.GUARD, str(r), str(record), str(lock)],
                               pass_fds=(r,), timeout=60)
        os.close(r)
        assert guard.returncode == 0
        assert leftover.wait(timeout=10) == -signal.SIGKILL
        assert not record.exists()
        assert "killed 1 process(es) of `sleep 600`" in (tmp_path / children.REAPED).read_text()
    finally:
        for p in (holder, leftover):
            if p.poll() is None:
                p.kill()
