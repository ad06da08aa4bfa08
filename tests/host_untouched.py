"""The machine the tests run on is never changed (the standard: tests and the simulated host work inside
temporary directories). conftest.py takes a snapshot of every path where p2pkit would write on a real host
as the session starts (on the xdist controller) and again as it ends; anything made, changed or removed
there in between fails the session, named.

The places are p2pkit's own on a real host: its state directory and host lock, and every file under /etc
whose name holds "p2pkit" (units, drop-ins, apt and dpkg hooks, the kernel hook, GRUB drop-ins, modprobe
files), the kernel modules' updates/ directories. The test caches (~/.cache/p2pkit-tests) are not among
them: they are the suite's own, kept between runs on purpose."""

from __future__ import annotations

import glob
import os

PLACES = (
    "/var/lib/p2pkit", "/var/lib/p2pkit/**",  # the state directory
    "/run/*p2pkit*", "/run/p2pkit*/**",  # the host lock, the engine's runtime directory
    "/etc/**/*p2pkit*", "/etc/**/*p2pkit*/**",  # units, drop-ins, hooks, apt pins, GRUB and modprobe files
    "/lib/modules/*/updates", "/lib/modules/*/updates/**",  # where the patched modules are installed
    "/usr/local/bin/*p2pkit*", "/boot/*p2pkit*",
)


def snapshot(places: tuple[str, ...] = PLACES) -> dict[str, tuple[int, int, int]]:
    """Every path the globs find now: (mode, size, mtime in ns) of the path itself (a link not followed)."""
    out = {}
    for pattern in places:
        for path in glob.glob(pattern, recursive=True):
            path = os.path.normpath(path)  # "DIR/**" finds "DIR/" too
            try:
                st = os.lstat(path)
            except OSError:
                continue
            out[path] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def changes(before: dict, after: dict) -> list[str]:
    """What differs, one line a path: made, removed or changed."""
    out = [f"made: {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"removed: {p}" for p in sorted(before.keys() - after.keys())]
    out += [f"changed: {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return out
