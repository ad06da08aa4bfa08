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

import glob
import grp
import hashlib
import json
import os
import pwd
import re
import stat
import sys
import tempfile

DOCUMENTATION = r"""
module: p2pkit_files
short_description: Ensure files (content, mode, owner) and directories, many in one run
description:
  - Writes each file whose content, mode or owner differs, atomically (temp file, fsync, rename).
  - Creates each missing directory; its mode is set only when the module creates it.
options:
  root:
    description: Prefix for every path (a simulated host's root); empty on a real host.
    type: str
    default: ""
  files:
    description:
      - Entries with path, and content (a file) or state=directory, mode, owner, group (names or ids); or link
        (a symbolic link to that target, switched atomically; anything there that is not a link is refused).
    type: list
    elements: dict
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


def _directory(path: str, entry: dict, check: bool) -> bool:
    uid, gid = _ids(entry)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not check:
            os.makedirs(path, exist_ok=True)
            if entry.get("mode"):
                os.chmod(path, int(entry["mode"], 8))
            os.chown(path, uid, gid)
        return True
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} exists and is not a directory")
    if _owner_differs(st, uid, gid):
        if not check:
            os.chown(path, uid, gid)
        return True
    return False


def _file(path: str, entry: dict, check: bool) -> bool:
    data = entry.get("content", "").encode()
    mode = int(entry.get("mode") or "0644", 8)
    uid, gid = _ids(entry)
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            same = fh.read() == data
        if same and stat.S_IMODE(st.st_mode) == mode and not _owner_differs(st, uid, gid):
            return False
    except FileNotFoundError:
        pass
    if check:
        return True
    # p2pkit's atomic writer (p2pkit/core/artifacts.py) again, on purpose: a module runs standalone under
    # Ansible's module interpreter; the mode is set before the rename (a 0600 file is never readable
    # by others, as AnsibleModule.atomic_move's chmod afterwards would leave it for a moment)
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".p2pkit-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.chown(tmp, uid, gid)
        os.rename(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def _link(path: str, entry: dict, check: bool) -> bool:
    """A symbolic link at path to entry["link"], made or switched atomically (a new link renamed over the old:
    a reader sees the old target or the new one, never none). Anything at path that is not a link is refused,
    never replaced."""
    target = entry["link"]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISLNK(st.st_mode):
        raise ValueError(f"{path} exists and is not a link: p2pkit replaces only a link it made")
    if st is not None and os.readlink(path) == target:
        return False
    if check:
        return True
    tmp = os.path.join(os.path.dirname(path), f".p2pkit-link-{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


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
OPTIONS = {"root": (str, ""), "files": (list, []), "probe": (list, [])}


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
        if kind is list and any(not isinstance(x, dict) for x in value):
            fail(f"Elements value for option '{name}' is not a dict: give each entry as a mapping")
        params[name] = value
    return params, bool(given.get("_ansible_check_mode"))


def main() -> None:
    if len(sys.argv) != 2:
        fail("p2pkit_files: Ansible runs this module with one argument, its arguments file")
    params, check_mode = arguments(sys.argv[1])
    root = params["root"].rstrip("/")
    changed: list[str] = []
    probed = {}
    for entry in params["probe"]:
        try:
            probed[entry.get("name") or entry.get("path")] = probe(root, entry)
        except (OSError, ValueError, re.error) as e:
            fail(f"p2pkit_files: probe {entry.get('name')}: {e}", changed_paths=changed)
    for entry in params["files"]:
        rel = entry.get("path", "")
        if not rel.startswith("/"):
            fail(f"p2pkit_files: path {rel!r} is not absolute")
        path = root + rel
        try:
            if entry.get("state") == "directory":
                done = _directory(path, entry, check_mode)
            elif "link" in entry:
                done = _link(path, entry, check_mode)
            else:
                done = _file(path, entry, check_mode)
        except (OSError, KeyError, ValueError) as e:
            fail(f"{rel}: {e}", changed_paths=changed, probed=probed)
        if done:
            changed.append(rel)
    _exit({"changed": bool(changed), "changed_paths": changed, "probed": probed})


if __name__ == "__main__":
    main()
