"""Error types and the exit codes of every p2pkit command, in one place."""

from __future__ import annotations

import errno
import os
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    CHECK_FAILED = 1  # a stage ran and a check failed (or the stage is not implemented yet)
    USAGE = 2  # bad command line, broken profile, unusable input file
    GATE = 3  # the stage before has not passed: run the earlier stage first
    REBOOT = 4  # a stage changed what only a reboot applies
    LOCKED = 5  # another p2pkit run holds the state lock
    MISSING = 6  # a tool or optional extra p2pkit needs is not installed
    INTERNAL = 70  # a bug in p2pkit: rerun with --debug and report it


class P2pkitError(Exception):
    """A known failure: one paragraph that says what happened, a hint that names the fix."""

    code: Exit = Exit.CHECK_FAILED

    def __init__(self, message: str, hint: str = "", code: Exit | None = None, pitfall: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.pitfall = pitfall  # the PITFALLS id a refusal guards against, carried into its finding
        if code is not None:
            self.code = code


class UsageError(P2pkitError):
    code = Exit.USAGE


class ProfileError(P2pkitError):
    """A profile that does not validate; `problems` are (key path, message) pairs."""

    code = Exit.USAGE

    def __init__(self, source: str, problems: list[tuple[str, str]], check: str = "", file: str = "",
                 given: tuple[str, ...] = ()):
        """`check`: the command that validates it again, where `profile validate {source}` would not
        (a profile with --set overrides: the overrides go before the command). `file`: the profile
        itself, where `source` adds the --set keys; `given`: those keys, so that a problem in a value
        given with --set is blamed on the --set, not on the file."""
        lines = "; ".join(f"{path}: {msg}" for path, msg in problems)
        file = file or source
        check = check or f"p2pkit profile validate {source}"

        def from_set_key(k: str, path: str) -> bool:
            return path == k or path.startswith(k + ".") or k.startswith(path + ".")

        def from_set(path: str) -> bool:
            return any(from_set_key(k, path) for k in given)

        mine = [path for path, _ in problems if from_set(path)]
        unknown = [path for path, msg in problems
                   if from_set(path) and msg.startswith(("unknown key", "unknown section"))]
        if unknown and len(unknown) == len(problems):
            named = [k for k in given if any(from_set_key(k, path) for path in unknown)]
            hint = (f"--set {', '.join(named)} names no key of a profile: correct the key (`p2pkit profile show` "
                    "lists every key) and run the command again; a key an earlier run kept for this host goes with "
                    f"`p2pkit --unset {named[0] if named else unknown[0]} ...`")
        elif mine and len(mine) == len(problems):
            keys = ", ".join(dict.fromkeys(mine))
            hint = (f"the value given with --set for {keys} is what is wrong, not {file}: give a valid one (a value "
                    f"an earlier run kept for this host goes with `p2pkit --unset {mine[0]} ...`), then check it "
                    f"with `{check}`")
        elif mine:
            hint = (f"fix the keys named above: {', '.join(dict.fromkeys(mine))} in your --set, the others in {file}; "
                    f"then check it with `{check}`")
        else:
            hint = f"fix the keys named above in {file}, then check it with `{check}`"
        super().__init__(f"profile {source} is not valid ({len(problems)} problem(s)): {lines}", hint=hint)
        self.source = source
        self.file = file
        self.problems = problems


class NotPermitted(UsageError):
    """Something p2pkit may not do as the user it runs as (a command of the host it may not run)."""


class GateError(P2pkitError):
    code = Exit.GATE


class LockedError(P2pkitError):
    code = Exit.LOCKED


class MissingError(P2pkitError):
    code = Exit.MISSING


class CommandError(P2pkitError):
    """A command run through the runner exited non-zero."""

    def __init__(self, argv: list[str], returncode: int, stdout: str, stderr: str):
        tail = (stderr or stdout).strip().splitlines()[-12:]
        super().__init__(
            f"`{' '.join(argv)}` exited with status {returncode}" + (":\n  " + "\n  ".join(tail) if tail else ""),
            hint="read the output above; rerun with --debug to see every command p2pkit runs",
        )
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


# What a simulated host's stand-in prints (its first line on stderr, then "fix: COMMAND", exit 127) when it
# cannot run at all (the p2pkit that laid it out is gone from its Python): every reading of that host would
# be wrong, so the runner stops the command with HostUnusable instead of handing the failure on as a fact.
STANDIN_CANNOT_RUN = "SIMULATED stand-in cannot run: "
STANDIN_EXIT = 127


class HostUnusable(Exception):
    """The host's own commands cannot run at all (a simulated host whose stand-ins lost their p2pkit): the
    command stops, saying so once. Not a P2pkitError on purpose: no probe may turn it into a fact that
    "could not be determined" (their handlers catch P2pkitError); the CLI reports it like one."""

    code = Exit.MISSING

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint


class ProbeError(P2pkitError):
    """A fact that could not be read: 'could not determine X: Y'."""

    def __init__(self, what: str, why: str):
        super().__init__(f"could not determine {what}: {why}")
        self.what = what
        self.why = why


def state_dir_unwritable(state_dir, e: OSError) -> UsageError:
    """The state directory cannot be written: a user that is not root, most often."""
    if os.geteuid() == 0 and e.errno == errno.EPERM:
        return UsageError(f"cannot write the state directory {state_dir}: {e.strerror or e} (it refuses even root)",
                          hint=immutable_hint(state_dir))
    why = "p2pkit is not running as root" if os.geteuid() != 0 else "it is read-only or its disk is full"
    return UsageError(f"cannot write the state directory {state_dir}: {e.strerror or e} ({why})",
                      hint="run it as root (`sudo p2pkit ...`), or pass --state-dir DIR naming a directory you "
                           "can write; nothing was changed")


def immutable_hint(d) -> str:
    """EPERM for root: an immutable (chattr +i) or append-only (+a) file or directory."""
    return (f"{d} is probably immutable (`lsattr -d {d}` shows an i): if you did not mean that, run "
            f"`chattr -i {d}`, else give p2pkit another --state-dir; nothing was written there")


def disk_full(path, e: OSError) -> UsageError:
    """ENOSPC (or a quota, EDQUOT) writing under `path`: the disk, not p2pkit, is what to fix."""
    what = "its quota is used up" if e.errno == errno.EDQUOT else "the disk it is on is full"
    return UsageError(f"cannot write {path}: {e.strerror or e} ({what})",
                      hint=f"free space on the disk that holds {path} (`df -h {path}` shows it), or give "
                           "--state-dir a directory on another disk; then run the same command again. What was "
                           "not written was left as it was")
