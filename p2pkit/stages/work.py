"""What the service's and engine's playbooks would change, found before they start by p2pkit's own
read-only probes (files, commands through the host's runner: one code path for real and simulated
hosts). The driver and p2p-module roles decide their own work from the host (one p2pkit_files run
probes what their tasks decide from) and p2pkit reads each task's result back.

Every Ansible module run costs about 0.3 CPU-s in the module interpreter before it does anything,
so a playbook starts only when one of its tasks has work to do, and its tasks get only the work:
the files whose content, mode or owner differ (written by one p2pkit_files module run per
handler), and a flag or a list for each other task. The playbook's task conditions read them;
a playbook that is not started is recorded in the stage's artifact with the probes that said so.
"""

from __future__ import annotations

import os
import pwd
import stat

from p2pkit.ansible import run_playbook, share_dir, write_vars
from p2pkit.host import Host, system


def file_entry(path: str, content: str, mode: str = "0644", owner: str | None = None,
               group: str | None = None) -> dict:
    return {"path": path, "content": content, "mode": mode,
            **({"owner": owner} if owner else {}), **({"group": group} if group else {})}


def dir_entry(path: str, mode: str = "0755", owner: str | None = None, group: str | None = None) -> dict:
    """A directory; its mode is set only when it is created (an existing directory's mode is the
    operator's), its owner whenever one is named."""
    return {"path": path, "state": "directory", "mode": mode,
            **({"owner": owner} if owner else {}), **({"group": group} if group else {})}


def _owner_differs(st: os.stat_result, entry: dict) -> bool:
    for key, field, look in (("owner", "st_uid", _uid), ("group", "st_gid", _gid)):
        if entry.get(key):
            try:
                if getattr(st, field) != look(entry[key]):
                    return True
            except KeyError:  # no such user yet (the role creates it): the task has work
                return True
    return False


def _uid(name: str) -> int:
    """A user name, or a uid as digits (a simulated host's user, unknown to this machine)."""
    return int(name) if name.isdigit() else pwd.getpwnam(name).pw_uid


def _gid(name: str) -> int:
    import grp

    return int(name) if name.isdigit() else grp.getgrnam(name).gr_gid


def differs(host: Host, entry: dict) -> bool:
    """Whether the p2pkit_files module would change this entry on the host (read-only)."""
    p = host.path(entry["path"])
    try:
        st = p.stat()
    except OSError:
        return True
    if entry.get("state") == "directory":
        return not stat.S_ISDIR(st.st_mode) or _owner_differs(st, entry)
    if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != int(entry["mode"], 8) or _owner_differs(st, entry):
        return True
    try:
        return p.read_bytes() != entry["content"].encode()
    except OSError:
        return True


def pending(host: Host, entries: list[dict]) -> list[dict]:
    """The entries that differ on the host: the only ones the playbook gets."""
    return [e for e in entries if differs(host, e)]


def has_work(todo: dict) -> list[str]:
    """The names of the tasks with work: a true flag, a non-empty list (of paths, packages, entries)."""
    out = []
    for name, v in todo.items():
        if isinstance(v, dict):
            out += [f"{name}.{k}" for k in has_work(v)]
        elif v:
            out.append(name)
    return out


def summary(todo: dict) -> dict:
    """The work as recorded in the artifact: paths instead of file contents (secrets stay out)."""
    def short(v):
        if isinstance(v, dict):
            return {k: short(x) for k, x in v.items()}
        if isinstance(v, list):
            return [x["path"] if isinstance(x, dict) and "path" in x else x for x in v]
        return v
    return short(todo)


def run_if_work(ctx, stage: str, extra: dict, todo: dict, known: dict | None = None, *, files_var: str,
                todo_var: str) -> dict:
    """Start the stage's playbook only when a task has work; else record why it was not started.

    `todo` holds "files" (handler group -> pending entries) and the other tasks' flags and lists;
    `known` what the probes found that is no work in itself (the engine is running: restart it)."""
    work = has_work(todo)
    doc = {**extra, files_var: todo.get("files", {}),
           todo_var: {**{k: v for k, v in todo.items() if k != "files"}, **(known or {})}}
    if work:
        res = run_playbook(ctx, stage, doc)
        return {**res, "work": summary(todo)}
    book = share_dir() / "playbooks" / f"{stage}.yml"
    write_vars(ctx, stage, doc)  # what it would have been given, for the reader and for a check-mode run
    ctx.out.step(stage, f"ansible-playbook {book.name} not started: p2pkit's probes found no task with work")
    return {"playbook": book.name, "started": False, "ok": 0, "changed": 0, "failed": 0,
            "why": "every task's probe holds: nothing to change", "work": summary(todo)}


def missing_packages(host: Host, wanted: list[str]) -> list[str]:
    """The packages of `wanted` dpkg does not have installed (one dpkg-query)."""
    installed = set(system.package_holds(host)["installed"])
    return [p for p in wanted if p not in installed]


def role_defaults(role: str) -> dict:
    """A role's defaults/main.yml (the one list of its packages), read as Ansible reads it."""
    import yaml

    return yaml.safe_load((share_dir() / "playbooks/roles" / role / "defaults/main.yml").read_text()) or {}
