#!/usr/bin/python
"""Ansible module: a system user in the given groups, on the host root named (one module run).

ansible.builtin.user reads and changes the users of the machine it runs on; this module decides
"exists" and "in the groups" from <root>/etc/passwd and <root>/etc/group and changes them through
the host's own useradd and usermod (`--root ROOT` where a root is given, found on the task's PATH),
so a run against a host root never reads or changes this machine's users. It returns the user's uid
and gid as the host's files give them (for the owner of the files the role writes next), and
changed only when it ran a tool.

A WANT_JSON module, as p2pkit_files is (its docstring says why): a plain script that reads its
arguments from the JSON file Ansible gives it and prints its result as JSON.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys

DOCUMENTATION = r"""
module: p2pkit_user
short_description: Ensure a system user exists and is in groups, on a host root; return its uid and gid
description:
  - Reads <root>/etc/passwd and <root>/etc/group; runs useradd (missing user) or usermod --append
    (missing groups) with --root when a root is given; supports check mode.
  - <root>/etc and the two files are opened without following a link, the files as regular files without
    waiting; a link there is refused before any tool runs (the result's p2pkit_refused names it).
options:
  root:
    description: Prefix of the host's tree (a simulated host's root); empty on a real host.
    type: str
    default: ""
  name:
    description: The user's name.
    type: str
    required: true
  groups:
    description: Supplementary groups the user must be in (each must exist on the host).
    type: list
    elements: str
    default: []
  shell:
    description: The login shell of a user this module creates.
    type: str
    default: /usr/sbin/nologin
author: p2pkit
"""

RETURN = r"""
uid:
  description: The user's uid from the host's /etc/passwd (null in check mode for a user not made yet).
  type: int
  returned: always
gid:
  description: The user's primary gid from the host's /etc/passwd.
  type: int
  returned: always
"""


class Refused(Exception):
    """A link (or something else that is not a plain file) at the host's /etc or its account files: the tools
    this module runs write there as root, so nothing is run; p2pkit reports it with exit 2 (p2pkit_refused)."""

    def __init__(self, path: str, what: str):
        try:
            what = f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            pass
        super().__init__(f"{path} is {what}: the host's account files are written there as root, and p2pkit "
                         "never has anything written through a link it did not make, so nothing was run")
        self.path = path
        self.hint = f"remove it (`rm {path}`) and run the same command again, or put the real file there"


def _table(root: str, name: str) -> list[list[str]]:
    """The lines of <root>/etc/NAME split on ':': <root>/etc reached and the file opened without following a
    link, as a regular file, never waiting (O_NONBLOCK: a FIFO is refused, never read)."""
    etc = root + "/etc"
    path = f"{etc}/{name}"
    try:
        dfd = os.open(root or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        try:
            efd = os.open("etc", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return []
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(etc, "not a directory") from None
            raise
    finally:
        os.close(dfd)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=efd)
        except FileNotFoundError:
            return []
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Refused(path, "a symbolic link") from None
            raise
    finally:
        os.close(efd)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise Refused(path, "not a regular file")
        text = fh.read().decode("utf-8", "replace")
    return [ln.split(":") for ln in text.splitlines() if ln and not ln.startswith("#")]


def _state(root: str, name: str) -> tuple[tuple[int, int] | None, set[str], set[str]]:
    """(uid, gid) or None; the groups the user is a member of; the groups that exist."""
    ids = next(((int(f[2]), int(f[3])) for f in _table(root, "passwd")
                if len(f) >= 4 and f[0] == name and f[2].isdigit() and f[3].isdigit()), None)
    groups = _table(root, "group")
    member = {f[0] for f in groups if len(f) >= 4 and name in f[3].split(",")}
    return ids, member, {f[0] for f in groups if f}


def _exit(result: dict, rc: int = 0):
    print(json.dumps(result))
    sys.exit(rc)


def fail(msg: str, **result):
    _exit({"failed": True, "msg": msg, **result}, 1)


def arguments(path: str) -> tuple[dict, bool]:
    """root, name, groups and shell from Ansible's arguments file, checked as AnsibleModule would
    (name required, unknown names refused, groups a list of strings); and whether in check mode."""
    try:
        with open(path, encoding="utf-8") as fh:
            given = json.load(fh)
    except (OSError, ValueError) as e:
        fail(f"p2pkit_user: cannot read the module arguments from {path}: {e}")
    if not isinstance(given, dict):
        fail("p2pkit_user: the module arguments are not a mapping")
    options = {"root": "", "name": None, "groups": [], "shell": "/usr/sbin/nologin"}
    unknown = sorted(k for k in given if not k.startswith("_ansible_") and k not in options)
    if unknown:
        fail(f"Unsupported parameters for (p2pkit_user) module: {', '.join(unknown)}. "
             f"Supported parameters include: {', '.join(sorted(options))}.")
    params = {k: default if given.get(k) is None else given[k] for k, default in options.items()}
    if not isinstance(params["name"], str) or not params["name"]:
        fail("missing required arguments: name")
    if not all(isinstance(params[k], str) for k in ("root", "shell")):
        fail("arguments 'root' and 'shell' are strings")
    if not isinstance(params["groups"], list) or not all(isinstance(g, str) for g in params["groups"]):
        fail("argument 'groups' is a list of group names")
    return params, bool(given.get("_ansible_check_mode"))


def tool(name: str) -> str:
    """The tool on the task's PATH, or in the sbin directories (as AnsibleModule.get_bin_path looks)."""
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(["/sbin", "/usr/sbin", "/usr/local/sbin"])
    found = shutil.which(name, path=path)
    if not found:
        fail(f"Failed to find required executable \"{name}\" in paths: {path}")
    return found


def main() -> None:
    if len(sys.argv) != 2:
        fail("p2pkit_user: Ansible runs this module with one argument, its arguments file")
    params, check_mode = arguments(sys.argv[1])
    root, name = params["root"].rstrip("/"), params["name"]
    wanted = list(params["groups"])
    try:
        ids, member, known = _state(root, name)
    except Refused as e:  # p2pkit reads this key: a refusal (exit 2)
        fail(str(e), p2pkit_refused={"path": e.path, "hint": e.hint})
    unknown = [g for g in wanted if g not in known]
    if unknown:
        fail(f"p2pkit_user: the group(s) {', '.join(unknown)} are not in {root}/etc/group, so "
             f"{name} cannot join them: install the package that makes them (video and render "
             "come with udev/systemd on Ubuntu) or create them with groupadd --system")
    missing = [g for g in wanted if g not in member]
    if ids is not None and not missing:
        _exit({"changed": False, "uid": ids[0], "gid": ids[1]})
    rooted = ["--root", root] if root else []
    if ids is None:
        argv = [tool("useradd"), *rooted, "--system", "--no-create-home", "--shell", params["shell"],
                *(["--groups", ",".join(wanted)] if wanted else []), name]
    else:
        argv = [tool("usermod"), *rooted, "--append", "--groups", ",".join(missing), name]
    if check_mode:
        _exit({"changed": True, "uid": ids[0] if ids else None, "gid": ids[1] if ids else None, "would_run": argv})
    r = subprocess.run(argv, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        fail(f"p2pkit_user: {' '.join(argv)} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-400:]}",
             rc=r.returncode, stderr=r.stderr, stdout=r.stdout)
    try:
        ids, member, _ = _state(root, name)
    except Refused as e:
        fail(str(e), p2pkit_refused={"path": e.path, "hint": e.hint})
    if ids is None or not set(wanted) <= member:
        fail(f"p2pkit_user: {argv[0]} exited 0 but {root}/etc/passwd and /etc/group do not show "
             f"{name} in {', '.join(wanted)}")
    _exit({"changed": True, "uid": ids[0], "gid": ids[1], "ran": argv})


if __name__ == "__main__":
    main()
