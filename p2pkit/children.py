"""The process groups of the commands p2pkit is running, recorded where the next p2pkit finds them.

The runner starts every command as the leader of its own process group, with a token of its own
in the environment (P2PKIT_CHILD), and tells this module. The token finds what left the group:
ansible-playbook's workers call setsid(), so only their inherited environment says whose they are.
While a run holds the state lock the groups are listed in <state>/.children (with the owner's pid
and start time). A p2pkit killed with SIGKILL cannot clean up: its direct children die with it
(PR_SET_PDEATHSIG), but their own children (ansible's workers, make's compilers) would run on
outside the lock. The next p2pkit reads the file before it takes the lock and kills what is left.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger("p2pkit.children")

_mu = threading.Lock()
_live: dict[int, dict] = {}
_file: Path | None = None


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


def _save() -> None:
    if _file is None:
        return
    doc = {"owner": os.getpid(), "owner_start": start_time(os.getpid()),
           "groups": [{"pgid": pgid, **info} for pgid, info in _live.items()]}
    tmp = _file.with_name(f".{_file.name}.{os.getpid()}.tmp")
    try:  # no fsync: after a power loss no process is left to find
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, _file)
    except OSError as e:
        log.debug("could not record running commands in %s: %s", _file, e)


TOKEN = "P2PKIT_CHILD"
_count = 0


def new_token() -> str:
    global _count
    with _mu:
        _count += 1
        return f"{os.getpid()}.{start_time(os.getpid())}.{_count}"


def started(pid: int, argv: list[str], token: str) -> None:
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
        doc = json.loads(path.read_text())
        groups = list(doc["groups"])
        owner, owner_start = int(doc["owner"]), doc.get("owner_start")
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return []
    if owner == os.getpid() or (start_time(owner) is not None and start_time(owner) == owner_start):
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
        said.append(f"killed {len(pids)} process(es) of `{' '.join(g.get('argv', []))}` (process group {pgid})")
    path.unlink(missing_ok=True)
    return said
