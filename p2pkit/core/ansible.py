"""Run a stage's playbook with ansible-playbook against the host root (local connection).

Facts gathering is off: the playbooks act on the host root p2pkit was pointed at, and every path
in them is prefixed with p2pkit_root. The full log goes to <state>/logs/<stage>.log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from p2pkit.core import config, logfiles, safefs, writers
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.errors import MissingError, P2pkitError, UsageError
from p2pkit.core.output import follow_cmd
from p2pkit.core.role_defaults import COLLECTION, share_dir
from p2pkit.core.secrets import redact_doc

RECAP = re.compile(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)")


def render(template: str, **values) -> str:
    """One of p2pkit's templates (templates/, or a role's templates/ where a role owns it), rendered as
    Ansible's template module renders it (blocks trimmed, the trailing newline kept); every value in
    it was already written by the writer of its format, and a {{ }} inside a value is printed, never
    evaluated."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    dirs = [share_dir() / "templates", *sorted((share_dir() / COLLECTION / "roles").glob("*/templates"))]
    env = Environment(loader=FileSystemLoader(dirs), undefined=StrictUndefined,
                      trim_blocks=True, keep_trailing_newline=True, autoescape=False)
    return env.get_template(template).render(**values)



def playbook_binary() -> str:
    local = Path(sys.executable).parent / "ansible-playbook"
    found = str(local) if local.exists() else shutil.which("ansible-playbook")
    if not found:
        raise MissingError("ansible-playbook is not installed",
                           hint="install p2pkit with its dependencies (`pip install p2pkit` brings ansible-core)")
    return found


def base_vars(ctx) -> dict:
    root = "" if ctx.host.root == Path("/") else str(ctx.host.root)
    return {
        "p2pkit_root": root,
        "p2pkit_path": ctx.host.runner.path_env(),
        "p2pkit_state_dir": str(ctx.store.dir),
        "ansible_python_interpreter": sys.executable,
        "p2pkit_lent_dirs": list(ctx.host.lent_dirs),  # p2pkit_files walks through them (a simulated host's)
    }


def write_vars(ctx, stage: str, extra: dict) -> dict:
    """What the playbook is given, for the reader (secrets redacted): <state>/logs/<stage>.vars.json."""
    logs = safefs.makedirs(ctx.store.dir / "logs")  # no link on the way (issue 40)
    doc = {**base_vars(ctx), **extra}
    atomic_write(logs / f"{stage}.vars.json", writers.json_text(redact_doc(doc)).encode())
    return doc


def ansible_temp(state_dir: Path) -> Path:
    """This run's temporary directory for Ansible (local and remote temp, the vars file): a new 0700
    directory under <state>/.ansible/tmp with a name of letters and digits. Refused (exit 2) when the
    state directory's path holds a character a shell would interpret (the CLI refuses it at the door)."""
    base = Path(os.path.abspath(state_dir)) / ".ansible/tmp"
    why = config.unsafe_path_char(str(base))
    if why:
        raise UsageError(f"the state directory {str(state_dir)!r} holds {why}: Ansible makes its temporary "
                         "directories under it through a shell, which would interpret it",
                         hint="give --state-dir a path of letters, digits and . _ / + @ , = ~ : -; nothing was done")
    safefs.makedirs(base)  # no link on the way: the new directory is made inside the state directory
    return Path(tempfile.mkdtemp(prefix="run", dir=base))


def module_cache(state_dir: Path) -> Path:
    """Where the stage playbooks share the modules Ansible built (callback p2pkit_module_cache):
    <state>/.ansible/modules/<key>, the key a digest of what a payload is built from (ansible-core's
    version, Python's, p2pkit's own modules); a directory of another key is removed, never reused."""
    import hashlib
    from importlib import metadata

    h = hashlib.sha256()
    try:
        h.update(metadata.version("ansible-core").encode())
    except metadata.PackageNotFoundError:
        h.update(b"ansible-core ?")
    h.update(sys.version.encode())
    for f in sorted((share_dir() / COLLECTION).glob("plugins/**/*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    base = Path(os.path.abspath(state_dir)) / ".ansible/modules"
    key = h.hexdigest()[:16]
    if base.is_dir():
        for old in base.iterdir():
            if old.name != key:
                shutil.rmtree(old, ignore_errors=True)
    return base / key


def run_playbook(ctx, stage: str, extra: dict, check_mode: bool = False, secret_env: dict | None = None) -> dict:
    """`secret_env`: values ansible-playbook reads from its environment (a lookup in the one task that
    needs it: the MOK enrolment password), never a variable, a file or a log line; the stage's playbook
    blanks each in its tasks' own environment."""
    book = share_dir() / "playbooks" / f"{stage}.yml"
    doc = write_vars(ctx, stage, extra)  # makes <state>/logs too
    logs = ctx.store.dir / "logs"
    # Ansible itself reads a 0600 copy whose every string is !unsafe (a {{ ... }} from a profile is
    # never evaluated), removed afterwards.
    tmp = ansible_temp(ctx.store.dir)
    tasks_file = tmp / "tasks.json"
    vars_file = atomic_write(tmp / f"{stage}.vars.yml", writers.ansible_vars(doc).encode(), mode=0o600)
    argv = [playbook_binary(), "-i", "localhost,", "-c", "local", "-e", f"@{vars_file}", str(book)]
    if check_mode:
        argv += ["--check", "--diff"]
    env = {
        "ANSIBLE_HOME": str(ctx.store.dir / ".ansible"),
        # Ansible makes its temporary directories through a shell that expands what they hold: both are
        # this run's own directory, made here, whose path holds no character a shell interprets
        "ANSIBLE_LOCAL_TEMP": str(tmp),
        "ANSIBLE_REMOTE_TEMP": str(tmp),
        "ANSIBLE_RETRY_FILES_ENABLED": "false",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_CONFIG": str(share_dir() / "playbooks" / "ansible.cfg"),
        # a p2pkit run by an inventory run on a local host inherits its results callback: each stage
        # playbook's results stay here, never among the hosts' results on the controller
        "P2PKIT_LAST_RESULT_DIR": str(ctx.store.dir / ".ansible/results"),
        # each task's own result (p2pkit_tasks), read back into the stage's artifact; one cache of built
        # modules for every stage's playbook (p2pkit_module_cache)
        "ANSIBLE_CALLBACKS_ENABLED": ",".join(filter(None, [os.environ.get("ANSIBLE_CALLBACKS_ENABLED"),
                                                            "p2pkit_tasks", "p2pkit_module_cache"])),
        "P2PKIT_TASK_RESULTS": str(tasks_file),
        "P2PKIT_MODULE_CACHE": str(module_cache(ctx.store.dir)),
        # the one inventory p2pkit gives (-i localhost,) is a host list: no other inventory plugin tried;
        # the roles use ansible.builtin and their own modules only: no collections looked for on sys.path
        "ANSIBLE_INVENTORY_ENABLED": "host_list",
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
        **(secret_env or {}),
    }
    if secret_env:
        # a secret reaches one task's module arguments (mokutil's stdin): piped to the module, never written
        # into a module file under the temporary directory (which a kept or killed run would leave behind)
        env |= {"ANSIBLE_PIPELINING": "True", "ANSIBLE_KEEP_REMOTE_FILES": "False"}
    log = logs / f"{stage}.log"
    logfiles.rotate(log)  # the last runs' logs kept as .1 .. .3
    # this run's output only, streamed there as ansible-playbook prints it (capped, redacted); never
    # through a link
    safefs.write_text(log, "")
    try:
        with ctx.out.working(f"[{stage}] ansible-playbook {book.name}", log=str(log), follow=follow_cmd(stage)):
            res = ctx.host.runner.run(argv, check=False, env=env, timeout=3600, output_log=log)
        tasks = read_tasks(tasks_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    m = RECAP.search(res.stdout)
    summary = {"playbook": book.name, "log": str(log), "returncode": res.returncode, "check_mode": check_mode,
               "tasks": tasks}
    if m:
        summary.update(dict(zip(("ok", "changed", "unreachable", "failed", "skipped"), map(int, m.groups()))))
    if res.returncode != 0:
        found = failed_line(res.stdout + res.stderr)
        refused = _result(found[1]).get("p2pkit_refused") if found else None
        if isinstance(refused, dict):  # a link where p2pkit's own module writes (issue 48 item 1): exit 2
            raise safefs.LinkRefused(str(_result(found[1]).get("msg") or refused.get("path")),
                                     hint=f"{refused.get('hint', '')}; the {stage} playbook stopped there (task "
                                          f"'{found[0]}'), the full log is {log}")
        hint = f"nothing after the failed task ran; the full log is {log}"
        if found and argument_spec_refusal(_result(found[1])):
            hint = (f"the role checks its variables before its first task, so nothing on the host was changed; "
                    f"what p2pkit handed it is in {logs / f'{stage}.vars.json'}, the full log is {log}")
        raise PlaybookFailed(f"the {stage} playbook failed: {failed_task(res.stdout + res.stderr)}", hint=hint,
                             task=found[0] if found else "", result=_result(found[1]) if found else {})
    return summary


class PlaybookFailed(P2pkitError):
    """A stage's playbook stopped at a task: its name and Ansible's result of it (rc, stdout, stderr,
    msg), for a stage that reads more of it than the message holds (a build's own error lines)."""

    def __init__(self, message: str, hint: str, task: str, result: dict):
        super().__init__(message, hint=hint)
        self.task = task
        self.result = result


def read_tasks(path: Path) -> dict:
    """The p2pkit_tasks callback's counts per task name; {} when it wrote none (killed, not loaded)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}




def failed_task(text: str) -> str:
    """The task name and message of the failure that stopped an ansible-playbook run: the last task
    that failed (one a rescue caught comes before it), its first failed line (a loop's item)."""
    found = failed_line(text)
    if found:
        return f"task '{found[0]}': {_failure_detail(found[1])}"
    tail = [ln for ln in text.splitlines() if ln.strip()][-3:]
    return " / ".join(tail) or "no output"


def failed_line(text: str) -> tuple[str, str] | None:
    """The failure failed_task names: its task and its 'fatal: [host]: FAILED! => {json}' line."""
    task, found = "", None
    for line in text.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.split("[", 1)[1].split("]")[0]
        if line.startswith(("fatal:", "failed:")) and (found is None or found[0] != task):
            found = (task, line)
    return found


def _result(line: str) -> dict:
    """Ansible's result of a failed task, from its 'fatal: [host]: FAILED! => {json}' line ({} if none)."""
    try:
        res = json.loads(line.partition("=> ")[2])
    except ValueError:
        return {}
    return res if isinstance(res, dict) else {}


def _failure_detail(line: str) -> str:
    """msg, and the last lines of stderr/stdout, from 'fatal: [host]: FAILED! => {json}'."""
    res = _result(line)
    if not res:
        return line
    refused = argument_spec_refusal(res)
    if refused:
        return refused
    parts = [str(res.get("msg", "failed"))]
    for key in ("stderr", "stdout"):
        tail = [ln for ln in str(res.get(key) or "").splitlines() if ln.strip()][-4:]
        if tail and res.get("rc"):
            parts.append(f"{key}: " + " | ".join(tail))
            break
    return "; ".join(parts)


def argument_spec_refusal(res: dict) -> str:
    """A role's refusal of its variables (Ansible's check against the role's meta/argument_specs.yml,
    before its first task) in one line: the role, its spec, each error Ansible gives (the variable and
    what it allows); "" for any other failure. Ansible's msg puts them on lines of their own."""
    context = res.get("validate_args_context")
    errors = res.get("argument_errors")
    if not isinstance(context, dict) or context.get("type") != "role" or not isinstance(errors, list) or not errors:
        return ""
    role = context.get("name", "?")
    spec = f"{COLLECTION}/roles/{role.split('.')[-1]}/meta/argument_specs.yml"
    return f"the {role} role refuses its variables ({spec}): " + "; ".join(" ".join(str(e).split()) for e in errors)
