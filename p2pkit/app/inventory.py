"""More than one machine: the same stages on every host of an Ansible inventory, in parallel.

Ansible is the engine: `playbooks/inventory.yml` runs `p2pkit up` (or `status`) on each host,
which applies its own gates and keeps its own artifacts; p2pkit gathers the JSON results into one
table of hosts by stages."""

from __future__ import annotations

import configparser
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from p2pkit import __version__
from p2pkit.core import logfiles, safefs, writers
from p2pkit.core.ansible import playbook_binary, share_dir
from p2pkit.core.errors import Exit, UsageError
from p2pkit.core.runner import Runner, own_executable
from p2pkit.host.backup import sha256
from p2pkit.stages import names

# a host var p2pkit_host_timeout overrides
HOST_TIMEOUT_S = {"up": 6 * 3600, "status": 1800, "verify": 3600, "serve-stop": 600, "serve-start": 3600}
CONNECT_TIMEOUT_S = 30  # Ansible's `timeout` (ssh ConnectTimeout, the banner too), where the operator set none
# p2pkit's Ansible settings, each given (as an environment variable) only where the operator's
# configuration has none: [defaults] key -> (environment variable, p2pkit's value). Never host key
# checking: the operator's ssh settings and known_hosts decide.
P2PKIT_SETTINGS = {"retry_files_enabled": ("ANSIBLE_RETRY_FILES_ENABLED", "false"),
                   "timeout": ("ANSIBLE_TIMEOUT", str(CONNECT_TIMEOUT_S)),
                   "nocolor": ("ANSIBLE_NOCOLOR", "1")}
FORKS = 50  # hosts run at once (ansible-playbook -f): the inventory is not read before the run
# p2pkit's callback (playbooks/callback_plugins): each host's last result as JSON, one file per host
# (ansible-core's `tree` callback did this until 2.19 deprecated it; 2.23 removes it)
RESULTS_CALLBACK = "p2pkit_last_result"
RESULTS_DIR_ENV = "P2PKIT_LAST_RESULT_DIR"


def operator_config(env: dict[str, str], cwd: Path) -> Path | None:
    """The ansible.cfg Ansible itself would read, in its order: ANSIBLE_CONFIG (a file, or a directory
    holding ansible.cfg), ./ansible.cfg (not in a world-writable directory: Ansible ignores it there),
    ~/.ansible.cfg, /etc/ansible/ansible.cfg."""
    given = env.get("ANSIBLE_CONFIG")
    home = Path(env.get("HOME", str(Path.home())))
    here = [] if cwd.stat().st_mode & 0o002 else [cwd / "ansible.cfg"]
    for c in ([Path(given).expanduser()] if given else []) + [*here, home / ".ansible.cfg",
                                                            Path("/etc/ansible/ansible.cfg")]:
        c = c / "ansible.cfg" if c.is_dir() else c
        if c.is_file():
            return c
    return None


def ansible_env(env: dict[str, str], cwd: Path, tree: Path) -> dict[str, str]:
    """What p2pkit adds to the operator's environment for an inventory run: its settings where the
    operator's environment and ansible.cfg set none, and p2pkit's results callback (added to the
    operator's own callbacks) that leaves each host's last result as JSON in `tree`."""
    cfg = configparser.ConfigParser(interpolation=None, strict=False)
    path = operator_config(env, cwd)
    if path is not None:
        try:
            cfg.read(path)
        except configparser.Error as e:
            raise UsageError(f"cannot read the Ansible configuration {path}: {e}",
                             hint="fix that file (ansible-config view shows what Ansible reads)") from e
    mine = cfg["defaults"] if cfg.has_section("defaults") else {}
    add = {var: value for key, (var, value) in P2PKIT_SETTINGS.items() if var not in env and key not in mine}
    enabled = env.get("ANSIBLE_CALLBACKS_ENABLED") or mine.get("callbacks_enabled") or \
        mine.get("callback_whitelist") or ""
    names = [n.strip() for n in enabled.split(",") if n.strip()]
    add["ANSIBLE_CALLBACKS_ENABLED"] = ",".join([*names, *([] if RESULTS_CALLBACK in names else [RESULTS_CALLBACK])])
    add[RESULTS_DIR_ENV] = str(tree)
    return add


def per_host_prometheus(path: Path, host: str) -> Path:
    """Where a host of an inventory run writes `verify --prometheus PATH`: PATH's directory, its name with the
    host's inventory name before the suffix (lab.prom -> lab.box-a.prom). Hosts that share a filesystem (local
    connections, simulated hosts) never overwrite each other; node_exporter's textfile collector reads every
    *.prom in its directory. Characters a file name should not carry become _ (the playbook does the same)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)
    return path.with_name(f"{path.stem}.{safe}{path.suffix}")


def run(inventory: Path, action: str, command: list[str], out, logs: Path,
        wheel: Path | None = None, prometheus: Path | None = None) -> tuple[Exit, dict]:
    """`logs`: the controller's <state>/logs, where ansible-playbook's output goes (inventory-<action>.log,
    the earlier runs' rotated like the stage logs); the run's other files live in a temporary
    directory removed after it. `wheel`: this p2pkit as a wheel, installed on the hosts that are not
    reached locally (or that set p2pkit_install), checked there against its sha256; without it such a
    host reports that it needs one.

    ansible-playbook runs through the one runner, with the operator's environment (SSH_AUTH_SOCK,
    proxies, ANSIBLE_*) and Ansible configuration; each host's result is read from structured data:
    the JSON its p2pkit printed, or, for a host that never got that far, the JSON p2pkit's results
    callback wrote for it (unreachable, failed, timed out)."""
    if not inventory.exists():
        raise UsageError(f"no inventory at {inventory}", hint="give an Ansible inventory file (hosts.yml)")
    if wheel is not None and not wheel.is_file():
        raise UsageError(f"no wheel at {wheel}", hint="build one from the source tree: `pip wheel --no-deps . -w dist`")
    log = inventory_log(logs, action)
    with tempfile.TemporaryDirectory(prefix="p2pkit-inventory-") as work:  # the run's files, gone after it
        return _run(inventory, action, command, out, log, Path(work), wheel, prometheus)


def inventory_log(logs: Path, action: str) -> Path:
    """This run's log, <state>/logs/inventory-<action>.log, empty; the last runs' kept as .1 .. .3.
    Refused before anything runs where it cannot be written."""
    log = Path(logs) / f"inventory-{action}.log"
    try:
        safefs.makedirs(log.parent)
        logfiles.rotate(log)
        safefs.write_text(log, "")  # never through a link (issue 40)
    except OSError as e:
        raise UsageError(f"cannot write the inventory run's log {log}: {e.strerror or e}",
                         hint="run as root, or give a state directory you can write with --state-dir DIR") from e
    return log


def _run(inventory: Path, action: str, command: list[str], out, log: Path, work: Path,
         wheel: Path | None, prometheus: Path | None = None) -> tuple[Exit, dict]:
    runner = Runner()
    results, tree = work / "results", work / "tree"
    results.mkdir()
    timeout = HOST_TIMEOUT_S[action]
    vars_file = work / "vars.yml"
    vars_file.write_text(writers.ansible_vars(_play_vars(action, command, results, timeout, wheel, prometheus)))
    argv = [playbook_binary(), "-i", str(inventory), "-f", str(FORKS), "-e", f"@{vars_file}",
            str(share_dir() / "playbooks" / "inventory.yml")]
    env = ansible_env(dict(os.environ), Path.cwd(), tree)
    with out.working(f"{action} on the hosts of {inventory} (ansible-playbook, in parallel)",
                     log=str(log), follow=f"tail -f {log}"):
        run = runner.run(argv, check=False, env=env, timeout=timeout + 3600, output_log=log)
    # the hosts are the ones Ansible ran (no ansible-inventory before it): each left a result
    left = {f.name for f in tree.iterdir() if not f.name.startswith(".")} if tree.is_dir() else set()
    hosts = sorted({f.stem for f in results.glob("*.json")} | left)
    if not hosts:
        tail = [ln for ln in (run.stdout + run.stderr).splitlines() if ln.strip()][-3:]
        raise UsageError(f"the inventory {inventory} names no host that Ansible could run"
                         + (f": {' / '.join(tail)}" if run.returncode else ""),
                         hint="add hosts to it; check it with `ansible-inventory -i FILE --list`")
    report = {"inventory": str(inventory), "action": action, "hosts": {}, "log": str(log)}
    for h in hosts:
        report["hosts"][h], ran = _host_entry(host_result(results / f"{h}.json", tree / h), tree / h, action)
        if ran and prometheus is not None and action == "verify":
            report.setdefault("prometheus", {})[h] = str(per_host_prometheus(prometheus, h))
    codes = [v["exit_code"] for v in report["hosts"].values()]
    code = Exit.OK if all(c == 0 for c in codes) else (
        Exit.REBOOT if all(c in (0, 4) for c in codes) else Exit.CHECK_FAILED)
    report["exit_code"] = int(code)
    return code, report


def _play_vars(action: str, command: list[str], results: Path, timeout: int, wheel: Path | None,
               prometheus: Path | None) -> dict:
    """What inventory.yml is given (written by the Ansible writer: a {{ }} in a value is never evaluated)."""
    extra = {"p2pkit_action": action, "p2pkit_command": command, "p2pkit_results_dir": str(results),
             "p2pkit_bin": own_executable(), "p2pkit_version": __version__,
             "p2pkit_lock": str(Path(__file__).resolve().parent.parent / "requirements.lock"),
             "p2pkit_controller_python": sys.executable, "p2pkit_host_timeout_default": timeout}
    if wheel is not None:
        extra.update(wheel_vars(wheel))
    if prometheus is not None:  # the playbook puts the host's name in: per_host_prometheus
        extra.update(p2pkit_prometheus_dir=str(prometheus.parent), p2pkit_prometheus_stem=prometheus.stem,
                     p2pkit_prometheus_suffix=prometheus.suffix)
    return extra


def _host_entry(res: dict | None, tree_file: Path, action: str) -> tuple[dict, bool]:
    """One host's line of the report, and whether p2pkit ran there and printed its document."""
    if res is None:
        return {"exit_code": None, "error": ansible_failure(tree_file), "stages": {}}, False
    if res["rc"] is None:  # the host did not get as far as running p2pkit
        return {"exit_code": None, "error": res["stderr"], "stages": {}}, False
    try:
        doc = json.loads(res["stdout"])
    except ValueError:
        tail = res["stderr"].strip().splitlines()[-1:] or ["no output"]
        return {"exit_code": res["rc"], "error": tail[0], "stages": {}}, False
    entry = {"exit_code": res["rc"], "message": doc.get("message", ""), "simulated": doc.get("simulated", False),
             "stages": {s["stage"]: shown_state(s) for s in doc.get("stages", [])}}
    if action == "verify":  # each check, for the controller's JUnit file
        entry["results"] = doc.get("stages", [])
        first = next(((r["stage"], c) for r in doc.get("stages", []) for c in r["checks"]
                      if c["status"] == "fail"), None)
        if first:
            entry["message"] = f"{first[0]} failed: {first[1]['id']}: {first[1]['measured']}"
    return entry, True


def wheel_vars(wheel: Path) -> dict:
    """The controller's wheel for the hosts that install p2pkit, with its sha256: the host installs it
    in pip's hash-checking mode, so a wheel changed on the way (or on the host) is refused."""
    return {"p2pkit_wheel": str(wheel.resolve()), "p2pkit_wheel_sha256": sha256(wheel)}


def host_result(rescued: Path, tree_file: Path) -> dict | None:
    """A host's p2pkit run as {rc, stdout, stderr}: what the install's rescue wrote for it, else its
    last result in the results callback's JSON (the run task is each host's last); None when the host
    never ran p2pkit (unreachable, failed, timed out)."""
    if rescued.is_file():
        return json.loads(rescued.read_text())
    try:
        res = json.loads(tree_file.read_text())
    except (OSError, ValueError):
        return None
    if res.get("failed") or res.get("unreachable") or not isinstance(res.get("rc"), int) or "stdout" not in res:
        return None
    return {"rc": res["rc"], "stdout": res["stdout"], "stderr": res.get("stderr", "")}


def shown_state(s: dict) -> str:
    """A stage's state for the table ("status" from verify): "n/a" for a stage that does not apply
    to the host's profile."""
    if "state" not in s:
        na = any(c["id"].endswith(".applies") and c["status"] == "skip" for c in s.get("checks", []))
        return "n/a" if na else s.get("status", "?")
    return "n/a" if s["state"] == "done" and s.get("reason", "").startswith("not applicable") else s["state"]


def ansible_failure(tree_file: Path) -> str:
    """Why a host sent nothing back, from the JSON the results callback left for it: its last result."""
    try:
        res = json.loads(tree_file.read_text())
    except (OSError, ValueError):
        return "no result came back (see the Ansible log)"
    msg = str(res.get("msg") or res.get("stderr") or "no message").removeprefix("Task failed: ")
    what = "unreachable" if res.get("unreachable") else "failed"
    return f"{what}: {msg[:300]}"


def table_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    if report["action"].startswith("serve-"):  # the engine on each host, no stages
        return ["host", "result"], [[h, v.get("message") or v.get("error") or f"exit {v['exit_code']}"]
                                    for h, v in sorted(report["hosts"].items())]
    cols = ["host", *names(), "result"]
    rows = []
    for h, v in sorted(report["hosts"].items()):
        msg = v.get("error") or v.get("message") or f"exit {v['exit_code']}"
        result = "ok" if v["exit_code"] == 0 else ": ".join(msg.split(": ")[:2])  # "topology failed: <check>"
        rows.append([h, *[v["stages"].get(s, "-") for s in names()], result])
    return cols, rows
