"""The process groups of the commands p2pkit is running, recorded where the next p2pkit finds them.

The runner starts every command as the leader of its own process group, with a token of its own
in the environment (P2PKIT_CHILD), and tells this module. The token finds what left the group:
ansible-playbook's workers call setsid(), so only their inherited environment says whose they are.
While a run holds the state lock the groups are listed in <state>/.children (with the owner's pid
and start time). A p2pkit killed with SIGKILL cannot clean up: its direct children die with it
(PR_SET_PDEATHSIG), but their own children (ansible's workers, make's compilers) would run on
outside the lock. So the lock holder starts a guard (arm(), at its first command): a process in its own session
that waits on a pipe only p2pkit holds. When p2pkit is gone, however it died (SIGKILL included), the
pipe reads end-of-file, and the guard takes the lock, kills what the record names at once and leaves
a note (<state>/.reaped) that the next run says. If the guard was killed too, the next p2pkit reads
the record before it takes the lock and kills what is left itself.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from p2pkit.core import breaks, safefs

log = logging.getLogger("p2pkit.core.children")

_mu = threading.Lock()
_live: dict[int, dict] = {}
_file: Path | None = None
_guard_pid: int | None = None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def _pgid(pid: int) -> int | None:
    """The process group of a live process (None for one that is gone or a zombie)."""
    try:
        fields_ = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return None if fields_[0] == "Z" else int(fields_[2])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """A process with this pid exists and is not a zombie."""
    return _pgid(pid) is not None


def running(pid: int, start: int | None) -> bool:
    """The process that had this pid and start time is still running (a zombie is not)."""
    return _pgid(pid) is not None and start_time(pid) == start


def _save() -> None:
    if _file is None:
        return
    doc = {"owner": os.getpid(), "owner_start": start_time(os.getpid()), "guard": _guard_pid,
           "groups": [{"pgid": pgid, **info} for pgid, info in _live.items()]}
    try:  # no fsync: after a power loss no process is left to find; a link there is replaced, not followed
        safefs.atomic_write(_file, json.dumps(doc).encode(), fsync=False)
    except (OSError, safefs.LinkRefused) as e:
        log.debug("could not record running commands in %s: %s", _file, e)


TOKEN = "P2PKIT_CHILD"
_count = 0


def new_token() -> str:
    global _count
    with _mu:
        _count += 1
        return f"{os.getpid()}.{start_time(os.getpid())}.{_count}"


def started(pid: int, argv: list[str], token: str) -> None:
    if _armed is not None and _guarded is None:
        _start_guard()  # the run's first command: from now on something could outlive p2pkit
    with _mu:
        _live[pid] = {"argv": [str(a) for a in argv[:6]], "start": start_time(pid), "token": token}
        _save()


def ended(pid: int) -> None:
    with _mu:
        _live.pop(pid, None)
        _save()


def track(path: Path | None) -> None:
    """Record running groups in `path` (the lock holder), or stop recording (None removes the file)."""
    global _file
    with _mu:
        old, _file = _file, path
        if path is None and old is not None:
            old.unlink(missing_ok=True)
        _save()


def kill_all() -> None:
    """Kill every command still running and what it started (p2pkit is being terminated)."""
    with _mu:
        groups = list(_live.items())
    for pgid, info in groups:
        kill(pgid, info["token"], info["start"])


def _has_token(pid: int, token: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{TOKEN}={token}".encode() in env.split(b"\0")


def members(pgid: int, token: str | None, leader_start: int | None = None) -> list[int]:
    """Processes of one command still alive: those in its process group, and those that left the group
    (setsid) but carry its token. A live process with pid == pgid that started at another time is a
    new group that reused the number: not ours (the kernel does not hand out a pid that is still
    some group's id, so members of a group whose leader is gone are the recorded group's)."""
    reused = leader_start is not None and start_time(pgid) not in (None, leader_start)
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        group = _pgid(int(d))
        if group is not None and ((not reused and group == pgid) or (token and _has_token(int(d), token))):
            out.append(int(d))
    return out


def kill(pgid: int, token: str | None, leader_start: int | None = None) -> list[int]:
    """SIGKILL a command's group and every process that carries its token; the pids it found."""
    pids = members(pgid, token, leader_start)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.monotonic() + 5  # SIGKILL lands asynchronously: return when they are gone
    while pids and time.monotonic() < end and any(_pgid(p) is not None for p in pids):
        time.sleep(0.02)
    return pids


def reap_leftovers(path: Path) -> list[str]:
    """Kill what a dead p2pkit recorded in `path` and left running; say what was killed."""
    try:
        doc = json.loads(safefs.read_bytes(path))  # p2pkit's own record, never a FIFO's wait (issue 48 item 4)
        groups = list(doc["groups"])
        owner, owner_start = int(doc["owner"]), doc.get("owner_start")
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError, safefs.LinkRefused):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
        return []
    if owner == os.getpid() or running(owner, owner_start):
        return []  # that p2pkit is alive (it released the lock without cleaning up: not a leftover)
    said = []
    for g in groups:
        try:
            pgid = int(g["pgid"])
        except (KeyError, TypeError, ValueError):
            continue
        pids = kill(pgid, g.get("token"), g.get("start"))
        if not pids:
            continue
        shown = " ".join(str(a) for a in g.get("argv", [])).replace("\n", "\\n")  # one line, as said and noted
        said.append(f"killed {len(pids)} process(es) of `{shown}` (process group {pgid})")
    path.unlink(missing_ok=True)
    return said


REAPED = ".reaped"  # beside the record: what a guard killed after its p2pkit died, for the next run to say
GUARD = "import sys; from p2pkit.core import children; children.guard_main(*sys.argv[1:])"


_armed: Path | None = None  # the lock file of the run that holds it, while it does
_guarded: tuple[subprocess.Popen, int] | None = None
_guard_mu = threading.Lock()


def arm(lock: Path | None) -> None:
    """While a run holds `lock`, the first command it starts starts its guard; arm(None) at the end of
    the run (its record already removed) lets the guard go: it wakes, finds nothing, exits."""
    global _armed, _guarded, _guard_pid
    with _guard_mu:
        _armed = lock
        if lock is not None or _guarded is None:
            return
        proc, w = _guarded
        _guarded = _guard_pid = None
    os.close(w)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _start_guard() -> None:
    """The guard of this run's commands (a run that starts none needs none); if it cannot start, the
    next run still cleans up."""
    global _guarded, _guard_pid
    with _guard_mu:
        if _armed is None or _guarded is not None or _file is None:
            return
        r, w = os.pipe()  # both ends close-on-exec: no command p2pkit runs holds the write end
        env = {k: v for k, v in os.environ.items() if k != TOKEN}
        try:
            proc = subprocess.Popen([sys.executable, "-c", GUARD, str(r), str(_file), str(_armed)], pass_fds=(r,),
                                    start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=env)
        except OSError as e:
            log.debug("could not start the guard of the running commands: %s", e)
            os.close(w)
            return
        finally:
            os.close(r)
        _guarded = (proc, w)
        with _mu:
            _guard_pid = proc.pid
            _save()


def guard_main(fd: str, record: str, lock: str) -> None:
    """The guard: wait for the pipe's end (p2pkit is gone), then, holding the lock so that no new run
    starts meanwhile, kill what the record names and note it. A new run that already holds the lock
    has cleaned up itself."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while os.read(int(fd), 64):
        pass
    os.close(int(fd))
    try:  # its files close before it is a zombie: wait until it is no longer running
        doc = json.loads(safefs.read_bytes(record))
        owner, owner_start = int(doc["owner"]), doc.get("owner_start")
    except (OSError, ValueError, KeyError, TypeError, safefs.LinkRefused):
        return  # no record: the run ended normally
    end = time.monotonic() + 30
    while running(owner, owner_start) and time.monotonic() < end:
        time.sleep(0.01)
    try:
        lfd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return
    if not _take_dead_runs_lock(lfd, owner, time.monotonic() + 15):
        os.close(lfd)
        return
    said = reap_leftovers(Path(record))
    if said:
        note = Path(record).with_name(REAPED)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with safefs.open_file(note, "a") as fh:
            fh.writelines(f"{line} (at {stamp}, by the guard of the p2pkit run that was killed)\n" for line in said)
    os.close(lfd)


def _take_dead_runs_lock(lfd: int, owner: int, end: float) -> bool:
    """The state lock, once the killed run no longer holds it: its main thread can be a zombie while
    its other threads still exit and hold its files (the lock among them) for a moment, so one try
    is not enough. False when another run holds it (that run cleans up itself) or by `end`."""
    while True:
        try:
            fcntl.flock(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            holder = os.pread(lfd, 64, 0).decode(errors="replace").strip()
            if (holder.isdigit() and int(holder) != owner) or time.monotonic() > end:
                return False
            time.sleep(0.02)
        except OSError:
            return False


def reaped(record: Path) -> list[str]:
    """What a guard killed since the last run (and forget it)."""
    note = record.with_name(REAPED)
    try:
        lines = breaks.lines(note.read_text(errors="replace"))
    except OSError:
        return []
    note.unlink(missing_ok=True)
    return [ln for ln in lines if ln.strip()]
