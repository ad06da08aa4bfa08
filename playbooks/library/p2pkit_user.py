#!/usr/bin/python
"""Ansible module: a system user in the given groups, on the host root named (one module run).

ansible.builtin.user reads and changes the users of the machine it runs on; this module decides
"exists" and "in the groups" from <root>/etc/passwd and <root>/etc/group and changes them through
the host's own useradd and usermod (`--root ROOT` where a root is given, found on the task's PATH),
so a run against a host root never reads or changes this machine's users. It returns the user's uid
and gid as the host's files give them (for the owner of the files the role writes next), and
changed only when it ran a tool.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: p2pkit_user
short_description: Ensure a system user exists and is in groups, on a host root; return its uid and gid
description:
  - Reads <root>/etc/passwd and <root>/etc/group; runs useradd (missing user) or usermod --append
    (missing groups) with --root when a root is given; supports check mode.
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


def _table(path: str) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return [ln.split(":") for ln in fh.read().splitlines() if ln and not ln.startswith("#")]
    except FileNotFoundError:
        return []


def _state(root: str, name: str) -> tuple[tuple[int, int] | None, set[str], set[str]]:
    """(uid, gid) or None; the groups the user is a member of; the groups that exist."""
    ids = next(((int(f[2]), int(f[3])) for f in _table(root + "/etc/passwd")
                if len(f) >= 4 and f[0] == name and f[2].isdigit() and f[3].isdigit()), None)
    groups = _table(root + "/etc/group")
    member = {f[0] for f in groups if len(f) >= 4 and name in f[3].split(",")}
    return ids, member, {f[0] for f in groups if f}


def main() -> None:
    module = AnsibleModule(argument_spec={
        "root": {"type": "str", "default": ""},
        "name": {"type": "str", "required": True},
        "groups": {"type": "list", "elements": "str", "default": []},
        "shell": {"type": "str", "default": "/usr/sbin/nologin"},
    }, supports_check_mode=True)
    root, name = module.params["root"].rstrip("/"), module.params["name"]
    wanted = list(module.params["groups"])
    ids, member, known = _state(root, name)
    unknown = [g for g in wanted if g not in known]
    if unknown:
        module.fail_json(msg=f"p2pkit_user: the group(s) {', '.join(unknown)} are not in {root}/etc/group, so "
                             f"{name} cannot join them: install the package that makes them (video and render "
                             "come with udev/systemd on Ubuntu) or create them with groupadd --system")
    missing = [g for g in wanted if g not in member]
    if ids is not None and not missing:
        module.exit_json(changed=False, uid=ids[0], gid=ids[1])
    rooted = ["--root", root] if root else []
    if ids is None:
        argv = [module.get_bin_path("useradd", required=True), *rooted, "--system", "--no-create-home",
                "--shell", module.params["shell"], *(["--groups", ",".join(wanted)] if wanted else []), name]
    else:
        argv = [module.get_bin_path("usermod", required=True), *rooted, "--append", "--groups", ",".join(missing),
                name]
    if module.check_mode:
        module.exit_json(changed=True, uid=ids[0] if ids else None, gid=ids[1] if ids else None, would_run=argv)
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"p2pkit_user: {' '.join(argv)} failed (exit {rc}): {(err or out).strip()[-400:]}",
                         rc=rc, stderr=err, stdout=out)
    ids, member, _ = _state(root, name)
    if ids is None or not set(wanted) <= member:
        module.fail_json(msg=f"p2pkit_user: {argv[0]} exited 0 but {root}/etc/passwd and /etc/group do not show "
                             f"{name} in {', '.join(wanted)}")
    module.exit_json(changed=True, uid=ids[0], gid=ids[1], ran=argv)


if __name__ == "__main__":
    main()
