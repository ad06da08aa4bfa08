"""One run at a time on a host: an flock on the host's lock file (<root>/run/p2pkit.core.lock, whatever
the state directory), then one on the state directory's lock file.

Before it takes the lock, a run kills what a dead run left behind (p2pkit.core.children) and says so, or
says what that run's guard already killed; while it holds the lock, the commands it runs are
recorded in <state>/.children and its guard waits to clean up if it dies.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from p2pkit.core import children, safefs
from p2pkit.core.errors import LockedError, UsageError, disk_full, state_dir_unwritable

log = logging.getLogger("p2pkit.core.lock")

# Under the host root: /run on a real host (root's own, emptied at boot), <root>/run on a simulated one.
HOST_LOCK = "run/p2pkit.core.lock"


def host_lock_path(root: Path) -> Path:
    return Path(root) / HOST_LOCK


@contextmanager
def state_lock(state_dir: Path, say=None, root: Path | None = None):
    """The run's locks: the host's at `root` first (every command that changes the host or its
    service takes it), then the state directory's."""
    with host_lock(root, state_dir) if root is not None else nullcontext(), _state_lock(state_dir, say):
        yield


@contextmanager
def host_lock(root: Path, state_dir: Path):
    """One run per host: two runs with different state directories must not act on one host at once.
    Exit 5 naming the run that holds it (its pid and state directory)."""
    path = host_lock_path(root)
    try:  # <root>/run reached from the host's root without a link, the lock itself never one
        fd = safefs.open_fd(path, os.O_RDWR | os.O_CREAT, 0o644, under=root)
    except OSError as e:
        raise _host_lock_unwritable(path, e) from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "pid unknown"
            raise LockedError(
                f"another p2pkit run ({holder}) is acting on this host ({root}): one run at a time per host, "
                "whatever its state directory",
                hint="wait for it to finish (`p2pkit status` with that run's --state-dir shows progress); the lock "
                     f"({path}) is released when that run ends: run again then",
            ) from None
        _record_holder(fd, path, f"pid {os.getpid()}, state directory {state_dir}")
        yield
    finally:
        os.close(fd)


def _record_holder(fd: int, path: Path, text: str) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{text}\n".encode(), 0)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full(path, e) from e
        raise UsageError(f"cannot write the lock file {path}: {e.strerror or e}",
                         hint=f"check that {path.parent} is writable; nothing was done") from e


def _host_lock_unwritable(path: Path, e: OSError) -> UsageError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return disk_full(path, e)
    if e.errno == errno.ELOOP:
        return UsageError(f"the host lock {path} is a symlink: p2pkit never opens its lock through one",
                          hint=f"remove it (`rm {path}`); nothing was done")
    why = "p2pkit is not running as root" if os.geteuid() != 0 else "it is read-only"
    return UsageError(f"cannot write the host lock {path}: {e.strerror or e} ({why})",
                      hint="run it as root (`sudo p2pkit ...`); nothing was changed")


@contextmanager
def _state_lock(state_dir: Path, say=None):
    path = state_dir / ".lock"
    try:
        safefs.own(state_dir)
        safefs.makedirs(state_dir)  # no link at it or on the way from its base (issue 48 item 1)
        fd = safefs.open_fd(path, os.O_RDWR | os.O_CREAT, 0o644)  # never through a link (issue 40)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full(state_dir, e) from e
        raise state_dir_unwritable(state_dir, e) from e
    try:
        try:
            _flock(fd)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise LockedError(
                f"another p2pkit run (pid {holder}) holds the lock on {state_dir}",
                hint="wait for it to finish (`p2pkit status` shows progress); if no p2pkit process is "
                     "running, the lock is released automatically: run again",
            ) from None
        record = state_dir / ".children"
        for line in children.reaped(record):
            (say or log.warning)(f"a p2pkit run that was killed left commands running: {line}")
        for line in children.reap_leftovers(record):
            (say or log.warning)(f"a p2pkit run that was killed left commands running: {line}, before this run "
                                 "took the lock")
        _record_holder(fd, path, str(os.getpid()))
        children.track(record)
        children.arm(path)
        try:
            yield
        finally:
            children.track(None)
            children.arm(None)
    finally:
        os.close(fd)


def _flock(fd: int) -> None:
    """The lock, or BlockingIOError while a live run holds it. A holder that is no longer running is
    the guard of a killed run, cleaning up what it left (children.guard_main): wait for it (seconds)."""
    end = time.monotonic() + 15
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            if not holder.isdigit() or children.alive(int(holder)) or time.monotonic() > end:
                raise
            time.sleep(0.05)


def lock_holder(state_dir: Path) -> str | None:
    """The pid that holds the lock on state_dir now, or None when no run holds it."""
    path = state_dir / ".lock"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # closing drops a shared lock taken here
    return None
