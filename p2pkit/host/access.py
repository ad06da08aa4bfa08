"""Can the engine's user reach what the engine reads? The kernel's permission rule, read from stat:
search (x) on every directory above a path, then what the engine needs on the path itself. (ACLs
and capabilities are not read: they only ever grant more.) The unit runs as its own User=, not
root; a working directory it cannot enter fails the start with CHDIR on a real systemd.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from p2pkit.core.breaks import lines
from p2pkit.host import Host

BITS = {"r": 4, "w": 2, "x": 1}


def user_ids(host: Host, name: str) -> tuple[int, set[int]] | None:
    """uid and group ids of `name` from the host's /etc/passwd and /etc/group, or None."""
    try:
        passwd = host.path("/etc/passwd").read_text(errors="replace")
    except OSError:
        return None
    for line in lines(passwd):  # glibc ends a passwd line at \n only
        f = line.split(":")
        if len(f) >= 4 and f[0] == name and f[2].isdigit() and f[3].isdigit():
            uid, gids = int(f[2]), {int(f[3])}
            try:
                for g in lines(host.path("/etc/group").read_text(errors="replace")):
                    gf = g.split(":")
                    if len(gf) >= 4 and name in gf[3].split(",") and gf[2].isdigit():
                        gids.add(int(gf[2]))
            except OSError:
                pass
            return uid, gids
    return None


def _allows(st: os.stat_result, uid: int, gids: set[int], want: str) -> bool:
    if uid == 0:
        return "x" not in want or stat.S_ISDIR(st.st_mode) or bool(st.st_mode & 0o111)
    shift = 6 if st.st_uid == uid else 3 if st.st_gid in gids else 0
    need = sum(BITS[c] for c in want)
    return (st.st_mode >> shift) & need == need


def blocked(host: Host, path: str, uid: int, gids: set[int], want: str) -> str | None:
    """None when the user reaches `path` with `want` ("x" to enter a directory or run a file, "r" to
    read); else the first component that stops it and why."""
    parts = [p for p in Path(path).parts if p != "/"]
    here = "/"
    for i in range(len(parts)):
        try:
            st = os.stat(host.path(here))
        except OSError as e:
            return f"{here}: {e.strerror}"
        if not _allows(st, uid, gids, "x"):
            return f"{here} ({stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid}) cannot be entered"
        here = "/" + "/".join(parts[: i + 1])
    try:
        st = os.stat(host.path(here))
    except OSError as e:
        return f"{here}: {e.strerror}"
    if not _allows(st, uid, gids, want):
        verb = {"x": "entered" if stat.S_ISDIR(st.st_mode) else "run", "r": "read", "rx": "read"}.get(want, want)
        return f"{here} ({stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid}) cannot be {verb}"
    return None


def engine_reach(host: Host, user: str, wants: dict[str, str]) -> dict:
    """{path: why} for each path the user cannot reach, or {"error": ...} when the user is unknown."""
    ids = user_ids(host, user)
    if ids is None:
        return {"error": f"the user {user} is not in the host's /etc/passwd"}
    uid, gids = ids
    return {"user": user, "uid": uid, "blocked": {p: why for p, want in wants.items()
                                                  if (why := blocked(host, p, uid, gids, want))}}
