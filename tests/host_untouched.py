"""The machine the tests run on is never changed (the standard: tests and the simulated host work inside
temporary directories). conftest.py takes a snapshot of every path where p2pkit would write on a real host
as the session starts (on the xdist controller) and again as it ends; anything made, changed or removed
there in between fails the session, named.

The places are p2pkit's own on a real host: its state directory and host lock, its caches and /opt/p2pkit,
every file under /etc whose name holds "p2pkit" (units, drop-ins, apt and dpkg hooks, the kernel hook, GRUB
drop-ins, modprobe files) and the engine's account in /etc/passwd and /etc/group, the kernel modules'
updates/ directories (where a DKMS rebuild by the machine's own upgrade during the run would show too: the
message names the paths, and such a run is to be read, not trusted). The test caches (~/.cache/p2pkit-tests)
are not among them: they are the suite's own, kept between runs on purpose."""

from __future__ import annotations

import glob
import os

PLACES = (
    "/var/lib/p2pkit", "/var/lib/p2pkit/**",  # the state directory
    "/var/cache/p2pkit", "/var/cache/p2pkit/**",  # the driver's installer, the fork's checkout
    "/opt/p2pkit", "/opt/p2pkit/**",  # the engine's build directory, an inventory's venv
    "/run/*p2pkit*", "/run/p2pkit*/**",  # the host lock, the engine's runtime directory
    "/etc/**/*p2pkit*", "/etc/**/*p2pkit*/**",  # units, drop-ins, hooks, apt pins, GRUB and modprobe files
    "/lib/modules/*/updates", "/lib/modules/*/updates/**",  # where the patched modules are installed
    "/usr/local/bin/*p2pkit*", "/boot/*p2pkit*",
)


def snapshot(places: tuple[str, ...] = PLACES) -> dict[str, tuple[int, int, int]]:
    """Every path the globs find now, hidden ones too: (mode, size, mtime in ns) of the path itself (a link not
    followed); and each line of /etc/passwd and /etc/group that names p2pkit."""
    out = {}
    for pattern in places:
        for path in glob.glob(pattern, recursive=True, include_hidden=True):  # .lock, .children too
            path = os.path.normpath(path)  # "DIR/**" finds "DIR/" too
            try:
                st = os.lstat(path)
            except OSError:
                continue
            out[path] = (st.st_mode, st.st_size, st.st_mtime_ns)
    for accounts in ACCOUNTS:  # the engine's user and group, made by the service stage
        try:
            with open(accounts, encoding="utf-8", errors="replace") as fh:
                lines = [ln for ln in fh if "p2pkit" in ln]
        except OSError:
            continue
        out |= {f"{accounts}: {ln.strip()}": (0, 0, 0) for ln in lines}
    return out


ACCOUNTS = ("/etc/passwd", "/etc/group")


def changes(before: dict, after: dict) -> list[str]:
    """What differs, one line a path: made, removed or changed."""
    out = [f"made: {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"removed: {p}" for p in sorted(before.keys() - after.keys())]
    out += [f"changed: {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return out
