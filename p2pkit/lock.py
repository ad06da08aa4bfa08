"""One run at a time: an flock on the state directory's lock file.

Before it takes the lock, a run kills what a dead run left behind (p2pkit.children) and says so, or
says what that run's guard already killed; while it holds the lock, the commands it runs are
recorded in <state>/.children and its guard waits to clean up if it dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path

from p2pkit import children
from p2pkit.errors import LockedError, state_dir_unwritable

log = logging.getLogger("p2pkit.lock")


@contextmanager
def state_lock(state_dir: Path, say=None):
    path = state_dir / ".lock"
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
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
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
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
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # closing drops a shared lock taken here
    return None
