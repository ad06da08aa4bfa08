"""More than one machine: the same stages on every host of an Ansible inventory, in parallel.

Ansible is the engine: `playbooks/inventory.yml` runs `p2pkit up` (or `status`) on each host,
which applies its own gates and keeps its own artifacts; p2pkit gathers the JSON results into one
table of hosts by stages."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from p2pkit import __version__
from p2pkit.ansible import playbook_binary, share_dir
from p2pkit.errors import Exit, MissingError, UsageError
from p2pkit.runner import own_executable
from p2pkit.stages import names


def host_names(inventory: Path) -> list[str]:
    exe = Path(playbook_binary()).with_name("ansible-inventory")
    if not exe.exists():
        raise MissingError("ansible-inventory is not installed", hint="install ansible-core")
    r = subprocess.run([str(exe), "-i", str(inventory), "--list"], capture_output=True, text=True)
    if r.returncode != 0:
        raise UsageError(f"cannot read the inventory {inventory}: {r.stderr.strip()[-300:]}",
                         hint="check it with `ansible-inventory -i FILE --list`")
    hosts = sorted(json.loads(r.stdout).get("_meta", {}).get("hostvars", {}))
    if not hosts:
        raise UsageError(f"the inventory {inventory} names no host", hint="add hosts to it")
    return hosts


def run(inventory: Path, action: str, command: list[str], out, wheel: Path | None = None) -> tuple[Exit, dict]:
    """`wheel`: this p2pkit as a wheel, installed on the hosts that are not reached locally (or that
    set p2pkit_install); without it they install this version from the package index."""
    hosts = host_names(inventory)
    if wheel is not None and not wheel.is_file():
        raise UsageError(f"no wheel at {wheel}", hint="build one from the source tree: `pip wheel --no-deps . -w dist`")
    work = Path(tempfile.mkdtemp(prefix="p2pkit-inventory-"))
    results = work / "results"
    results.mkdir()
    extra = {"p2pkit_action": action, "p2pkit_command": command, "p2pkit_results_dir": str(results),
             "p2pkit_bin": own_executable(), "p2pkit_version": __version__,
             "ansible_python_interpreter": sys.executable}
    if wheel is not None:
        extra["p2pkit_wheel"] = str(wheel.resolve())
    vars_file = work / "vars.json"
    vars_file.write_text(json.dumps(extra))
    argv = [playbook_binary(), "-i", str(inventory), "-f", str(max(5, len(hosts))), "-e", f"@{vars_file}",
            str(share_dir() / "playbooks" / "inventory.yml")]
    env = {"ANSIBLE_CONFIG": str(share_dir() / "playbooks" / "ansible.cfg"), "ANSIBLE_HOME": str(work / ".ansible"),
           "ANSIBLE_LOCAL_TEMP": str(work / ".ansible/tmp"), "ANSIBLE_NOCOLOR": "1", "PATH": "/usr/bin:/bin"}
    with out.working(f"{action} on {len(hosts)} host(s) of {inventory} (ansible-playbook, in parallel)"):
        r = subprocess.run(argv, capture_output=True, text=True, env=env)
    (work / "ansible.log").write_text(r.stdout + r.stderr)
    report = {"inventory": str(inventory), "action": action, "hosts": {}, "log": str(work / "ansible.log")}
    for h in hosts:
        f = results / f"{h}.json"
        if not f.is_file():
            report["hosts"][h] = {"exit_code": None, "error": ansible_failure(r.stdout, h), "stages": {}}
            continue
        res = json.loads(f.read_text())
        if res["rc"] is None:  # the host did not get as far as running p2pkit
            report["hosts"][h] = {"exit_code": None, "error": res["stderr"], "stages": {}}
            continue
        try:
            doc = json.loads(res["stdout"])
        except ValueError:
            tail = res["stderr"].strip().splitlines()[-1:] or ["no output"]
            report["hosts"][h] = {"exit_code": res["rc"], "error": tail[0], "stages": {}}
            continue
        report["hosts"][h] = {"exit_code": res["rc"], "message": doc.get("message", ""),
                              "simulated": doc.get("simulated", False),
                              "stages": {s["stage"]: shown_state(s) for s in doc.get("stages", [])}}
        if action == "verify":  # each check, for the controller's JUnit file
            report["hosts"][h]["results"] = doc.get("stages", [])
            first = next(((r["stage"], c) for r in doc.get("stages", []) for c in r["checks"]
                          if c["status"] == "fail"), None)
            if first:
                report["hosts"][h]["message"] = f"{first[0]} failed: {first[1]['id']}: {first[1]['measured']}"
    codes = [v["exit_code"] for v in report["hosts"].values()]
    code = Exit.OK if all(c == 0 for c in codes) else (
        Exit.REBOOT if all(c in (0, 4) for c in codes) else Exit.CHECK_FAILED)
    report["exit_code"] = int(code)
    return code, report


def shown_state(s: dict) -> str:
    """A stage's state for the table ("status" from verify): "n/a" for a stage that does not apply
    to the host's profile."""
    if "state" not in s:
        na = any(c["id"].endswith(".applies") and c["status"] == "skip" for c in s.get("checks", []))
        return "n/a" if na else s.get("status", "?")
    return "n/a" if s["state"] == "done" and s.get("reason", "").startswith("not applicable") else s["state"]


def ansible_failure(log: str, host: str) -> str:
    """Why a host sent nothing back, from ansible-playbook's `fatal: [host]: UNREACHABLE! => {...}`."""
    import re

    for m in re.finditer(r"^fatal: \[(.+?)\]: (UNREACHABLE|FAILED)! => (\{.*\})$", log, re.M):
        if m.group(1) == host:
            try:
                msg = json.loads(m.group(3)).get("msg", "")
            except ValueError:
                msg = m.group(3)
            what = "unreachable" if m.group(2) == "UNREACHABLE" else "failed"
            return f"{what}: {str(msg).removeprefix('Task failed: ')[:300]}"
    return "no result came back (see the Ansible log)"


def table_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    cols = ["host", *names(), "result"]
    rows = []
    for h, v in sorted(report["hosts"].items()):
        msg = v.get("error") or v.get("message") or f"exit {v['exit_code']}"
        result = "ok" if v["exit_code"] == 0 else ": ".join(msg.split(": ")[:2])  # "topology failed: <check>"
        rows.append([h, *[v["stages"].get(s, "-") for s in names()], result])
    return cols, rows
