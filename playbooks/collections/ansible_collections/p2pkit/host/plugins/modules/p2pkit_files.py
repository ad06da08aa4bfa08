#!/usr/bin/python
"""Ansible module: many files and directories in one module run.

Each ansible.builtin.copy or template task is two module runs (a stat, then the copy), about
0.3 CPU-s each in the module interpreter alone; a role that writes six files spent four seconds
on them. This module takes the whole list (contents rendered by p2pkit, every value already
written by the writer of its format) and writes only what differs, each file atomically, in one
run. It supports check mode and reports the paths it changed.

It also reads, in the same run and before it writes, what the role's other tasks decide their work
from (`probe`): whether a path exists, its mtime, mode and sha256, the files a glob matches, a small
file's content, the matches of a regular expression in a file. A role reads its host once and its
tasks run only where the host differs from what they ensure.

It is a WANT_JSON module (Ansible's "non-native want JSON" modules: the module gets a file of its
arguments as JSON and prints its result as JSON; docs.ansible.com, "Ansible module architecture"):
it runs as a plain script, without AnsiballZ. A module built on AnsibleModule spends about 0.3 CPU-s
importing Ansible's module_utils, compiled from a zip on every run; this module runs seven times in
a first `up`. The arguments are checked here as AnsibleModule would (names, types, list elements).
"""

from __future__ import annotations

import errno
import glob
import grp
import hashlib
import json
import os
import pwd
import re
import stat
import sys

DOCUMENTATION = r"""
module: p2pkit_files
short_description: Ensure files (content, mode, owner) and directories, many in one run
description:
  - Writes each file whose content, mode or owner differs, atomically (temp file, fsync, rename).
  - Creates each missing directory; its mode is set only when the module creates it.
  - Every directory below the root is reached one component at a time without following a link (openat with
    O_NOFOLLOW from the root's descriptor); a link at a path it writes or on the way is refused, nothing
    written through it (the result's p2pkit_refused names it). state=checked writes nothing and refuses a
    link at the path (where a later task writes, such as a checkout or a build tree).
options:
  root:
    description: Prefix for every path (a simulated host's root); empty on a real host.
    type: str
    default: ""
  files:
    description:
      - Entries with path, and content (a file) or state=directory (or checked), mode, owner, group (names or ids);
        or link (a symbolic link to that target, switched atomically; anything there that is not a link is
        refused, as a link on the way to it is).
    type: list
    elements: dict
    default: []
  lent:
    description:
      - Paths under root that are links to directories of this machine a simulated host lends (its test cache):
        walked through as the host's own layout. Empty on a real host (root empty: never honoured).
    type: list
    elements: str
    default: []
  probe:
    description:
      - Entries with name and path (under root), read before anything is written. With glob, the paths
        under path that match it (each probed). sha256 adds the checksum, content the text (small
        files), findall a regular expression (multiline) whose matches are returned; absolute, a
        path taken as it is, without root; type, what the path itself is (a link not followed);
        realpath, the path on this machine (root included) with its links resolved, as `realpath -m`.
    type: list
    elements: dict
    default: []
author: p2pkit
"""

RETURN = r"""
p2pkit_refused:
  description: On a refusal, the path found and the fix (hint); p2pkit reports it with exit 2.
  type: dict
  returned: on a link where the module writes
changed_paths:
  description: The paths (without the root prefix) that were written or created.
  type: list
  returned: always
probed:
  description: Per probe name, exists, mtime_ns, mode (octal text), sha256, content, found, type (file,
    directory, link, other; null when nothing is there), realpath; a glob's
    probe has matches, a list of those for each path it matched (paths without the root prefix).
  type: dict
  returned: always
"""


def _ids(entry: dict) -> tuple[int, int]:
    def look(key, by_name):
        name = str(entry.get(key) or "")
        return -1 if not name else int(name) if name.isdigit() else by_name(name)
    return look("owner", lambda n: pwd.getpwnam(n).pw_uid), look("group", lambda n: grp.getgrnam(n).gr_gid)


def _owner_differs(st: os.stat_result, uid: int, gid: int) -> bool:
    return (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid)


class Refused(Exception):
    """A link (or something else that is not a plain directory or file) where this module writes: nothing is
    written through it, and p2pkit reports it as a refusal (exit 2) naming the path, its target and the fix."""

    def __init__(self, path: str, what: str):
        try:
            target = os.readlink(path)
        except OSError:
            target = None
        shown = f"a symbolic link (to {target})" if target is not None else what
        where = os.path.dirname(path) or "/"
        super().__init__(f"{path} is {shown}: p2pkit writes there as root and never through a link it did not "
                         "make, so it wrote nothing through it")
        self.path = path
        self.hint = (f"remove it (`rm {path}`) and run the same command again; if you did not make it, find out "
                     f"who could write to {where} (`ls -ld {where}`)")


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _down(fd: int, name: str, shown: str, create: bool) -> int | None:
    """openat(fd, name) as a directory, never through a link; made (0755) when missing and `create`; None
    when missing and not. A link, or anything that is not a directory, is Refused."""
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            return None
        try:
            os.mkdir(name, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        return _down(fd, name, shown, False)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.lstat(name, dir_fd=fd)
            raise Refused(shown, "a symbolic link" if stat.S_ISLNK(st.st_mode) else
                          f"not a directory ({_what(st.st_mode)})") from None
        raise


def _what(mode: int) -> str:
    return "a link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device" if \
        stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else \
        "a directory" if stat.S_ISDIR(mode) else "a file"


def parent_fd(root: str, rel: str, create: bool) -> tuple[int | None, str]:
    """(an fd of the directory that holds root+rel, its last component): the root opened as it is named (the
    host's root p2pkit checked; / on a real host), every directory below it reached one at a time without
    following a link (issue 48 item 1), made 0755 where missing and `create`; None where one is missing."""
    parts = [x for x in rel.split("/") if x]
    if not parts or ".." in parts:
        raise ValueError(f"path {rel!r} names no file under the root")
    try:
        fd = os.open(root or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return None, parts[-1]
        raise
    shown, rel_here = root, ""
    try:
        for part in parts[:-1]:
            shown, rel_here = f"{shown}/{part}", f"{rel_here}/{part}"
            if rel_here in LENT:  # the host's own layout: a directory of this machine it lends (a simulated host)
                nxt = os.open(shown, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            else:
                nxt = _down(fd, part, shown, create)
            os.close(fd)
            fd = nxt
            if fd is None:
                return None, parts[-1]
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return fd, parts[-1]


def _directory(root: str, rel: str, entry: dict, check: bool) -> bool:
    uid, gid = _ids(entry)
    path = root + rel
    dfd, name = parent_fd(root, rel, create=not check)
    if dfd is None:
        return True  # check mode: a directory above it is missing, so it would be made
    try:
        try:
            st = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            if not check:
                os.mkdir(name, 0o755, dir_fd=dfd)
                fd = _down(dfd, name, path, False)
                try:
                    if entry.get("mode"):
                        os.fchmod(fd, int(entry["mode"], 8))
                    os.fchown(fd, uid, gid)
                finally:
                    os.close(fd)
            return True
        if stat.S_ISLNK(st.st_mode) and rel.rstrip("/") in LENT:
            return False  # a directory the simulated host lends: its own, in place
        if stat.S_ISLNK(st.st_mode):
            raise Refused(path, "a symbolic link")
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{path} exists and is not a directory")
        if _owner_differs(st, uid, gid):
            if not check:
                fd = _down(dfd, name, path, False)
                try:
                    os.fchown(fd, uid, gid)
                finally:
                    os.close(fd)
            return True
        return False
    finally:
        os.close(dfd)


def _checked(root: str, rel: str, state: str = "checked") -> bool:
    """Nothing is written: the path's directories (those there) reached without a link, and the path itself,
    when it is there, no link, and for a file a regular file (no FIFO, device or directory). Every entry is
    judged so before the first write (a refusal leaves everything as it was); state=checked is only that
    (where a later task writes: a checkout, a build tree)."""
    dfd, name = parent_fd(root, rel, create=False)
    if dfd is None:
        return False
    try:
        try:
            st = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(st.st_mode) and state != "link" and rel.rstrip("/") not in LENT:  # a link p2pkit switches is one it made: _link judges it
            raise Refused(root + rel, "a symbolic link")
        if state == "file" and not stat.S_ISREG(st.st_mode):
            raise Refused(root + rel, f"not a regular file ({_what(st.st_mode)})")
        return False
    finally:
        os.close(dfd)


def _same(dfd: int, name: str, path: str, data: bytes, mode: int, uid: int, gid: int) -> bool:
    """Whether the file there is a plain file already holding `data` with this mode and owner; a link there is
    Refused, anything else that is not a plain file is never opened (O_NONBLOCK: a FIFO never waits)."""
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise Refused(path, "a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise Refused(path, f"not a regular file ({_what(st.st_mode)})")
    if st.st_size != len(data) or stat.S_IMODE(st.st_mode) != mode or _owner_differs(st, uid, gid):
        return False
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(len(data) + 1) == data


def _file(root: str, rel: str, entry: dict, check: bool) -> bool:
    data = entry.get("content", "").encode()
    mode = int(entry.get("mode") or "0644", 8)
    uid, gid = _ids(entry)
    path = root + rel
    dfd, name = parent_fd(root, rel, create=False)
    if dfd is None:
        if check:
            return True
        raise FileNotFoundError(f"{os.path.dirname(path)} does not exist")
    try:
        if _same(dfd, name, path, data, mode, uid, gid):
            return False
        if check:
            return True
        # p2pkit's atomic writer (p2pkit/core/safefs.py) again, on purpose: a module runs standalone under
        # Ansible's module interpreter. A new name (O_EXCL) in the directory reached without a link, the mode
        # and owner set before the rename (a 0600 file is never readable by others, as
        # AnsibleModule.atomic_move's chmod afterwards would leave it for a moment), renamed over the name.
        for _ in range(100):
            tmp = f".p2pkit-{os.urandom(6).hex()}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dfd)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free temporary name in {os.path.dirname(path)}")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
                os.fchmod(fh.fileno(), mode)
                os.fchown(fh.fileno(), uid, gid)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        return True
    finally:
        os.close(dfd)


def _link(root: str, rel: str, entry: dict, check: bool) -> bool:
    """A symbolic link at root+rel to entry["link"], made or switched atomically (a new link renamed over the old,
    inside the directory reached without a link: a reader sees the old target or the new one, never none).
    Anything there that is not a link is refused, never replaced."""
    target = entry["link"]
    path = root + rel
    dfd, name = parent_fd(root, rel, create=False)
    if dfd is None:
        if check:
            return True
        raise FileNotFoundError(f"{os.path.dirname(path)} does not exist")
    try:
        try:
            st = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISLNK(st.st_mode):
            raise Refused(path, f"not a link p2pkit made ({_what(st.st_mode)}): p2pkit replaces only a link")
        if st is not None and os.readlink(name, dir_fd=dfd) == target:
            return False
        if check:
            return True
        tmp = f".p2pkit-link-{os.urandom(6).hex()}"
        os.symlink(target, tmp, dir_fd=dfd)
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
        return True
    finally:
        os.close(dfd)


def _kind(path: str) -> str | None:
    """What the path itself is, a link not followed: file, directory, link, other; None when nothing is there."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return "link" if stat.S_ISLNK(mode) else "directory" if stat.S_ISDIR(mode) else \
        "file" if stat.S_ISREG(mode) else "other"


def _probe_path(root: str, rel: str, entry: dict) -> dict:
    path = root + rel
    more = {}
    if entry.get("type"):
        more["type"] = _kind(path)
    if entry.get("realpath"):
        more["realpath"] = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError:
        return {"path": rel, "exists": os.path.lexists(path), "mtime_ns": None, "mode": None, **more}
    out = {"path": rel, "exists": True, "mtime_ns": st.st_mtime_ns, "mode": f"0{stat.S_IMODE(st.st_mode):o}", **more}
    if not stat.S_ISREG(st.st_mode):
        return out
    if entry.get("sha256"):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        out["sha256"] = h.hexdigest()
    if entry.get("content") or entry.get("findall"):
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if entry.get("content"):
            out["content"] = text
        if entry.get("findall"):
            out["found"] = [list(m) if isinstance(m, tuple) else m for m in re.findall(entry["findall"], text, re.M)]
    return out


def probe(root: str, entry: dict) -> dict:
    """What one probe entry reads from the host (nothing is changed); `absolute` paths (p2pkit's own
    state directory, given whole) take no root prefix."""
    rel = entry.get("path", "")
    root = "" if entry.get("absolute") else root
    if not rel.startswith("/"):
        raise ValueError(f"probe path {rel!r} is not absolute")
    if not entry.get("glob"):
        return _probe_path(root, rel, entry)
    found = sorted(glob.glob(os.path.join(glob.escape(root + rel), entry["glob"]), recursive=True))
    return {"path": rel, "matches": [_probe_path(root, p[len(root):], entry) for p in found]}


# option -> (type, default); each list's elements are dicts
OPTIONS = {"root": (str, ""), "files": (list, []), "probe": (list, []), "lent": (list, [])}
# directories (paths under root) a simulated host lends from this machine as links: walked through as its own
LENT: set[str] = set()


def _exit(result: dict, rc: int = 0):
    print(json.dumps(result))
    sys.exit(rc)


def fail(msg: str, **result):
    _exit({"failed": True, "msg": msg, **result}, 1)


def arguments(path: str) -> tuple[dict, bool]:
    """The task's arguments from Ansible's JSON file, checked as AnsibleModule checks them (unknown
    names, types, list elements), and whether the run is in check mode."""
    try:
        with open(path, encoding="utf-8") as fh:
            given = json.load(fh)
    except (OSError, ValueError) as e:
        fail(f"p2pkit_files: cannot read the module arguments from {path}: {e}")
    if not isinstance(given, dict):
        fail("p2pkit_files: the module arguments are not a mapping")
    unknown = sorted(k for k in given if not k.startswith("_ansible_") and k not in OPTIONS)
    if unknown:
        fail(f"Unsupported parameters for (p2pkit_files) module: {', '.join(unknown)}. "
             f"Supported parameters include: {', '.join(sorted(OPTIONS))}.")
    params = {}
    for name, (kind, default) in OPTIONS.items():
        value = given.get(name)
        value = default if value is None else value
        if not isinstance(value, kind):
            fail(f"argument '{name}' is of type {type(value).__name__} and we were unable to convert to "
                 f"{kind.__name__}")
        if kind is list and name != "lent" and any(not isinstance(x, dict) for x in value):
            fail(f"Elements value for option '{name}' is not a dict: give each entry as a mapping")
        params[name] = value
    return params, bool(given.get("_ansible_check_mode"))


def main() -> None:
    if len(sys.argv) != 2:
        fail("p2pkit_files: Ansible runs this module with one argument, its arguments file")
    params, check_mode = arguments(sys.argv[1])
    root = params["root"].rstrip("/")
    LENT.update(str(x).rstrip("/") for x in params["lent"] if root and str(x).startswith("/"))
    changed: list[str] = []
    probed = {}
    for entry in params["probe"]:
        try:
            probed[entry.get("name") or entry.get("path")] = probe(root, entry)
        except (OSError, ValueError, re.error) as e:
            fail(f"p2pkit_files: probe {entry.get('name')}: {e}", changed_paths=changed)
    refused: list[Refused] = []
    for entry in params["files"]:  # every link refused before the first write, all of them named at once
        rel = entry.get("path", "")
        if not rel.startswith("/"):
            fail(f"p2pkit_files: path {rel!r} is not absolute")
        try:
            _checked(root, rel, "link" if "link" in entry else entry.get("state") or "file")
        except Refused as e:
            if all(e.path != r.path for r in refused):
                refused.append(e)
        except (OSError, ValueError) as e:
            fail(f"{rel}: {e}", changed_paths=changed, probed=probed)
    if refused:
        hint = refused[0].hint if len(refused) == 1 else (
            f"remove them (`rm {' '.join(r.path for r in refused)}`) and run the same command again")
        fail("; ".join(str(r) for r in refused), changed_paths=changed, probed=probed,
             p2pkit_refused={"path": refused[0].path, "paths": [r.path for r in refused], "hint": hint})
    for entry in params["files"]:
        rel = entry.get("path", "")
        try:
            if entry.get("state") == "directory":
                done = _directory(root, rel, entry, check_mode)
            elif entry.get("state") == "checked":
                done = _checked(root, rel)
            elif "link" in entry:
                done = _link(root, rel, entry, check_mode)
            else:
                done = _file(root, rel, entry, check_mode)
        except Refused as e:  # p2pkit reads this key: a refusal (exit 2), never a failed stage
            fail(str(e), changed_paths=changed, probed=probed, p2pkit_refused={"path": e.path, "hint": e.hint})
        except (OSError, KeyError, ValueError) as e:
            fail(f"{rel}: {e}", changed_paths=changed, probed=probed)
        if done:
            changed.append(rel)
    _exit({"changed": bool(changed), "changed_paths": changed, "probed": probed})


if __name__ == "__main__":
    main()
