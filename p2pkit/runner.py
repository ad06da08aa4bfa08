"""The one way p2pkit runs a command.

List arguments only, LANG=C.UTF-8, stdin from /dev/null, the command logged under --debug.
Against a host root other than /, that root's usr/bin and usr/sbin come first on PATH, so the
simulated host's stand-in commands answer in place of the real ones.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from p2pkit.errors import CommandError, MissingError, P2pkitError

log = logging.getLogger("p2pkit.runner")


def own_executable() -> str:
    """This p2pkit's console script (beside the running Python): what units, hooks and remote runs call."""
    return str(Path(sys.executable).parent / "p2pkit")


def unit_command(argv: list[str]) -> str:
    """A command line for a systemd Exec*= setting: one list, quoted; % and $ escaped for systemd."""
    return " ".join(shlex.quote(a).replace("%", "%%").replace("$", "$$") for a in argv)


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Runner:
    root: Path = Path("/")
    extra_env: dict[str, str] = field(default_factory=dict)

    def path_env(self) -> str:
        base = os.environ.get("PATH", "/usr/bin:/bin")
        if self.root == Path("/"):
            return base
        prefix = [str(self.root / d) for d in ("usr/local/bin", "usr/bin", "usr/sbin", "sbin", "bin")]
        return ":".join([*prefix, base])

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PATH": self.path_env()})
        env.update(self.extra_env)
        return env

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.path_env())

    def run(
        self,
        argv: list[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        capture: bool = True,
    ) -> Result:
        exe = self.which(argv[0]) if "/" not in argv[0] else argv[0]
        if exe is not None and "/" in exe and not os.access(exe, os.X_OK):  # a path that is not there
            raise MissingError(f"{exe} does not exist or is not executable",
                               hint=f"install what provides {exe}, or fix the path that names it")
        if exe is None:
            raise MissingError(
                f"the command `{argv[0]}` is not installed (looked in {self.path_env()})",
                hint=f"install the package that provides {argv[0]}, or check PATH",
            )
        full_env = self.env()
        if env:
            full_env.update(env)
        log.debug("run: %s", " ".join(argv))
        try:
            proc = subprocess.run(
                [exe, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if capture else None,
                stderr=subprocess.PIPE if capture else None,
                text=True,
                errors="replace",
                env=full_env,
                cwd=cwd,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise CommandError(argv, -1, str(e.stdout or ""), f"timed out after {timeout} s") from e
        result = Result(argv, proc.returncode, proc.stdout or "", proc.stderr or "")
        log.debug("exit %s: %s", proc.returncode, " ".join(argv))
        if check and proc.returncode != 0:
            raise CommandError(argv, proc.returncode, result.stdout, result.stderr)
        return result

    def json_result(self, argv: list[str], what: str, timeout: float) -> dict:
        """Run a helper that prints its result as a JSON line last (the load worker, a probe run in
        another Python): that document, or {"error": ...} naming `what`, its exit and its last lines."""
        try:
            r = self.run(argv, check=False, timeout=timeout)
        except P2pkitError as e:
            return {"error": e.message}
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
            return {"error": f"{what} exited {r.returncode} without a result: {tail}"}
        return json.loads(lines[-1])
