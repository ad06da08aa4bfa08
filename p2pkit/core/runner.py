"""The one way p2pkit runs a command.

List arguments only, LANG=C.UTF-8, stdin from /dev/null, the command logged under --debug.
Against a host root other than /, a command is looked up only in that host's own directories
(HOST_DIRS under the root: a simulated host's stand-in commands are there), never on this
machine's PATH: a tool the host lacks is missing ("<tool> is not in the host at <root>"), not this
machine's own run in its place. The one exception is what the host lends by name (`lent`: a
simulated host builds with this machine's compilers). Those directories also come first on the
PATH the command runs with.

Every command has a timeout (a default per command, P2PKIT_TIMEOUT_<NAME> overrides it, e.g.
P2PKIT_TIMEOUT_NVIDIA_SMI=10): a hung nvidia-smi is an error that says it did not answer, never
a hang while p2pkit holds the lock. Every command runs in a process group p2pkit owns, recorded
in the state directory while it runs (p2pkit.core.children): on a timeout, an error, Ctrl-C or
SIGTERM the whole group is killed; the direct child dies with p2pkit (PR_SET_PDEATHSIG), and
what a p2pkit killed with SIGKILL left behind is found and killed by the next one before it
takes the lock (p2pkit.core.lock). Captured output is capped (its head and its tail are kept).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from p2pkit.core import children, safefs
from p2pkit.core.errors import (
    STANDIN_CANNOT_RUN,
    STANDIN_EXIT,
    CommandError,
    HostUnusable,
    MissingError,
    NotPermitted,
    P2pkitError,
)
from p2pkit.core.secrets import redact

log = logging.getLogger("p2pkit.core.runner")

DEFAULT_TIMEOUT_S = 600.0
TIMEOUTS_S = {  # how long each command may take before p2pkit calls it hung
    "nvidia-smi": 30.0, "modinfo": 30.0, "fuser": 30.0, "ldd": 60.0, "pkg-config": 60.0, "nvcc": 60.0,
    "journalctl": 60.0, "modprobe": 120.0, "rmmod": 120.0, "systemctl": 120.0, "systemd-analyze": 120.0,
    "apt-mark": 120.0, "git": 600.0, "ansible-playbook": 3600.0, "ansible-inventory": 120.0,
    # reads one status file: a few seconds, or dpkg's lock or a hung disk holds it (status must not wait)
    "dpkg-query": 10.0, "lsinitramfs": 120.0, "update-grub": 300.0, "update-initramfs": 600.0, "depmod": 300.0,
}
HEAD_CAP = 256 << 10  # captured output keeps its first 256 KiB ...
TAIL_CAP = 4 << 20  # ... and its last 4 MiB; what lies between is dropped and counted
LOG_CAP = 64 << 20  # a streamed log (output_log) stops growing here
PR_SET_PDEATHSIG = 1
HOST_DIRS = ("usr/local/bin", "usr/bin", "usr/sbin", "sbin", "bin")  # a host's own commands, under its root


def own_executable() -> str:
    """This p2pkit's console script (beside the running Python): what units, hooks and remote runs call."""
    return str(Path(sys.executable).parent / "p2pkit")


def timeout_for(name: str, given: float | None = None) -> float:
    """P2PKIT_TIMEOUT_<NAME> if set, else the caller's, else the command's default, else 600 s."""
    base = os.path.basename(name)
    env = os.environ.get("P2PKIT_TIMEOUT_" + re.sub(r"[^A-Za-z0-9]", "_", base).upper())
    if env:
        try:
            v = float(env)
            if 0 < v < float("inf"):
                return v
        except ValueError:
            pass
        log.warning("ignoring P2PKIT_TIMEOUT_%s=%r: expected a number of seconds", base, env)
    if given is not None:
        return float(given)
    return TIMEOUTS_S.get(base, DEFAULT_TIMEOUT_S)


def load_per_cpu() -> float:
    """This machine's load: the 1-minute load average over its CPUs (how many processes each CPU has to run);
    0 where the kernel does not say."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def under_load(seconds: float) -> float:
    """A short time limit that decides a stage's state (status's bound on a command, the live engine's answer),
    scaled with this machine's load: `seconds` where each CPU has at most one process to run, that many times the
    load per CPU above it. A command waiting for a CPU is slow, not hung (issue 47 item 3)."""
    return seconds * max(1.0, load_per_cpu())


# what a CommandTimeout's message says, found again in a finding built from it: a command that did not answer
# says nothing about the host ("could not check"), never that a stage is stale or failed
UNANSWERED = re.compile(r"\b\S+ did not answer within [0-9.]+ s \(`")


class CommandTimeout(CommandError):
    """A command that did not finish within its timeout; its process group was killed."""

    def __init__(self, argv: list[str], timeout: float, elapsed: float, stdout: str, stderr: str):
        super().__init__(argv, -1, stdout, stderr)
        name = os.path.basename(argv[0])
        self.message = (f"{name} did not answer within {round(timeout, 1):g} s (`{shlex.join(argv)}` was killed after "
                        f"{elapsed:.1f} s; this machine's load: {load_per_cpu():.1f} a CPU)")
        self.args = (self.message,)
        self.hint = (f"find out why {name} hangs (a wedged driver makes nvidia-smi hang for minutes); if it is "
                     f"only slow, give it longer with P2PKIT_TIMEOUT_{re.sub(r'[^A-Za-z0-9]', '_', name).upper()}"
                     "=SECONDS")
        self.timeout = timeout
        self.elapsed = elapsed


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


class _Capped(threading.Thread):
    """Reads one pipe to its end, keeping the first HEAD_CAP and the last TAIL_CAP bytes; with a
    sink, every chunk is also written there as it arrives (a stage's log that a user can follow)."""

    def __init__(self, pipe, sink=None):
        super().__init__(daemon=True)
        self.pipe, self.head, self.tail, self.dropped = pipe, bytearray(), bytearray(), 0
        self.sink = sink

    def run(self) -> None:
        while chunk := self.pipe.read1(65536) if hasattr(self.pipe, "read1") else self.pipe.read(65536):
            if self.sink is not None:
                self.sink(chunk)
            room = HEAD_CAP - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            self.tail += chunk
            if len(self.tail) > TAIL_CAP:
                cut = len(self.tail) - TAIL_CAP
                self.dropped += cut
                del self.tail[:cut]

    def text(self) -> str:
        mid = f"\n[... p2pkit dropped {self.dropped} bytes of output here ...]\n".encode() if self.dropped else b""
        text = bytes(self.head + mid + self.tail).decode(errors="replace")
        return text.replace("\r\n", "\n").replace("\r", "\n")  # as text mode's universal newlines


def _die_with_parent() -> None:
    """In the child before exec: its own process group, and SIGKILL when p2pkit dies."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def not_permitted(exe: str) -> NotPermitted:
    """The kernel refused to start `exe` for this user (EACCES: the file, or the interpreter its #! line
    names, is not theirs to run): what it was, and the fix."""
    interp = ""
    try:
        with open(exe, "rb") as fh:
            first = fh.readline(200)
        if first.startswith(b"#!"):
            interp = f" (a script its #! line hands to {first[2:].split()[0].decode(errors='replace')})"
    except OSError:
        pass
    uid = os.geteuid()
    if uid != 0:
        return NotPermitted(f"cannot run {exe}{interp}: permission denied for uid {uid} (p2pkit is not running as "
                            "root)", hint="run it as root (`sudo p2pkit ...`); nothing was changed")
    return NotPermitted(f"cannot run {exe}{interp}: permission denied",
                        hint=f"check the modes of {exe} and of what it runs (a noexec mount refuses even root)")


def interpreter_of(exe: str) -> str:
    """The interpreter a script's #! line names ("" for none, or a file that cannot be read)."""
    try:
        with open(exe, "rb") as fh:
            first = fh.readline(200)
    except OSError:
        return ""
    words = first[2:].split() if first.startswith(b"#!") else []
    return words[0].decode(errors="replace") if words else ""


def refuse_lost_interpreter(exe: str, root: Path) -> None:
    """At the door of a command on a simulated host: its stand-in `exe` names an interpreter that is gone (the
    venv that laid the host out was removed): the command stops at once, saying so, rather than each fact
    failing and a stage being blamed (issue 47 item 2)."""
    interp = interpreter_of(exe)
    if not interp.startswith("/"):
        return
    try:
        os.stat(interp)
    except FileNotFoundError:  # gone; one this user may not reach (EACCES) is the runner's `denied` to say
        raise interpreter_missing(exe, root) from None
    except OSError:
        pass


def interpreter_missing(exe: str, root: Path) -> P2pkitError | HostUnusable:
    """The kernel found no file to start for `exe`, which is there: the interpreter its #! line names is gone (a
    simulated host's stand-ins name the Python of the venv that laid the host out, which was removed since). On
    a simulated host nothing of it can run: HostUnusable, with the command that lays it out again (issue 47
    item 2); elsewhere a missing tool."""
    interp = interpreter_of(exe)
    why = f"the interpreter its #! line names ({interp}) does not exist" if interp else "it cannot be started"
    state = root / ".p2pkit-sim/state.json"  # p2pkit.host.SIM_MARKER: a simulated host's stand-ins
    if root != Path("/") and state.is_file():
        try:
            scenario = json.loads(state.read_text()).get("scenario") or "healthy"
        except (OSError, ValueError, AttributeError):
            scenario = "healthy"
        return HostUnusable(f"the simulated host at {root} cannot run its stand-in {exe}: {why} (the Python it was "
                            "laid out with is gone, its venv removed or moved)",
                            f"lay the simulated host out again with the p2pkit you have now (its stages start anew): "
                            f"`p2pkit sim init --force {root} --scenario {scenario}`")
    return MissingError(f"cannot run {exe}: {why}",
                        hint=f"reinstall what provides {os.path.basename(exe)}, or the interpreter it names")


class _LogSink:
    """Appends to a log file from both pipes' reader threads, flushed at once so `tail -f` and
    `p2pkit logs STAGE --follow` see each line as the command prints it."""

    def __init__(self, path: Path, argv: list[str]):
        self.fh = safefs.open_file(path, "ab")  # never through a link; closed by close() when the command ends
        self.lock = threading.Lock()
        self.written = self.dropped = 0
        self(f"$ {shlex.join(argv)}\n".encode())

    def __call__(self, chunk: bytes) -> None:
        with self.lock:
            if self.written >= LOG_CAP:  # a runaway log never fills the disk (captured output keeps the tail)
                self.dropped += len(chunk)
                return
            chunk = redact(chunk.decode(errors="replace")).encode()
            self.written += len(chunk)
            self.fh.write(chunk)
            self.fh.flush()

    def close(self) -> None:
        with self.lock:
            if self.dropped:
                self.fh.write(f"\n[... p2pkit logged the first {LOG_CAP >> 20} MiB: {self.dropped} more bytes not "
                              "logged ...]\n".encode())
            self.fh.close()


def standin_cannot_run(err: str) -> HostUnusable:
    """A simulated host's stand-in that cannot run: its own message and fix, whole."""
    lines = err.strip().splitlines()
    fix = next((ln.removeprefix("fix: ") for ln in lines if ln.startswith("fix: ")), "")
    message = " ".join(ln for ln in lines if not ln.startswith("fix: ")).removeprefix(STANDIN_CANNOT_RUN)
    return HostUnusable(message, fix)


@dataclass
class Runner:
    root: Path = Path("/")
    extra_env: dict[str, str] = field(default_factory=dict)
    # a bound over every command's own limit: a read-only report (status) waits on no command longer (times this
    # machine's load per CPU, where it is over 1: under_load)
    cap_s: float | None = None
    # with a host root other than /: the commands of this machine the host lends by name (its
    # Host says which); every other command is the host's own, or missing
    lent: tuple[str, ...] = ()
    # the commands the kernel refused to start for the user p2pkit runs as (EACCES at exec): a read-only
    # report says why it could not check, instead of marking a stage stale
    denied: list[str] = field(default_factory=list)

    def host_dirs(self) -> list[str]:
        """Where this host's commands lie: this machine's PATH for the root /, else HOST_DIRS under the root."""
        if self.root == Path("/"):
            return os.environ.get("PATH", "/usr/bin:/bin").split(":")
        return [str(self.root / d) for d in HOST_DIRS]

    def path_env(self) -> str:
        """The PATH a command runs with: the host's directories first, then this machine's (what a
        lent tool and the host's own scripts run on)."""
        base = os.environ.get("PATH", "/usr/bin:/bin")
        if self.root == Path("/"):
            return base
        return ":".join([*self.host_dirs(), base])

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("P2PKIT_MOK_PASSWORD", None)  # the MOK enrolment password reaches mokutil's stdin, no child's env
        env.update({"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PATH": self.path_env()})
        env.update(self.extra_env)
        return env

    def which(self, name: str) -> str | None:
        """The host's command `name`: found in host_dirs() only (a lent one also on this machine's PATH)."""
        found = shutil.which(name, path=":".join(self.host_dirs()))
        if found is None and name in self.lent and self.root != Path("/"):
            found = shutil.which(name, path=os.environ.get("PATH", "/usr/bin:/bin"))
        return found

    def run(
        self,
        argv: list[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        capture: bool = True,
        output_log: Path | None = None,
        input_text: str | None = None,
    ) -> Result:
        """`output_log`: a file the command line and then its output (stdout and stderr, as they come) are
        appended to while it runs; the output is still captured and returned. `input_text`: the command's
        stdin (a password mokutil reads), else /dev/null; never logged."""
        exe = self._executable(argv[0])
        full_env = self.env()
        if env:
            full_env.update(env)
        token = full_env[children.TOKEN] = children.new_token()
        limit = timeout_for(argv[0], timeout)
        if self.cap_s is not None:
            limit = min(limit, under_load(self.cap_s))
        log.debug("run (timeout %g s): %s", limit, redact(shlex.join(argv)))
        start = time.monotonic()
        pipe = subprocess.PIPE if capture else None
        stdin = subprocess.DEVNULL if input_text is None else subprocess.PIPE
        try:
            proc = subprocess.Popen([exe, *argv[1:]], stdin=stdin, stdout=pipe, stderr=pipe, env=full_env,
                                    cwd=cwd, preexec_fn=_die_with_parent)
        except PermissionError:
            self.denied.append(exe)
            raise not_permitted(exe) from None
        except FileNotFoundError:
            raise interpreter_missing(exe, self.root) from None
        children.started(proc.pid, argv, token)
        sink = _LogSink(output_log, argv) if output_log is not None and capture else None
        readers = [_Capped(p, sink) for p in (proc.stdout, proc.stderr) if p is not None]
        for r in readers:
            r.start()
        _feed(proc, input_text)
        _wait(proc, readers, argv, token, limit, start)
        for r in readers:
            r.join(timeout=10)  # a daemon the command left behind may hold the pipe: do not wait on it
        out, err = (r.text() for r in readers) if readers else ("", "")
        for p in (proc.stdout, proc.stderr):
            if p is not None:
                p.close()
        if sink is not None:
            sink.close()
        result = Result(argv, proc.returncode, out, err)
        if proc.returncode == STANDIN_EXIT and err.startswith(STANDIN_CANNOT_RUN):
            raise standin_cannot_run(err)
        log.debug("exit %s after %.1f s: %s", proc.returncode, time.monotonic() - start, redact(shlex.join(argv)))
        if check and proc.returncode != 0:
            raise CommandError(argv, proc.returncode, result.stdout, result.stderr)
        return result

    def _executable(self, name: str) -> str:
        """The host's executable for `name` (a path as it is), or why there is none (MissingError)."""
        exe = self.which(name) if "/" not in name else name
        if exe is not None and "/" in exe and not os.access(exe, os.X_OK):  # a path that is not there
            raise MissingError(f"{exe} does not exist or is not executable",
                               hint=f"install what provides {exe}, or fix the path that names it")
        if exe is None and self.root != Path("/"):  # never this machine's own in the host's place
            raise MissingError(
                f"{name} is not in the host at {self.root} (looked in {':'.join(self.host_dirs())})",
                hint=f"install {name} in that host, or run p2pkit on the host itself (--root /)",
            )
        if exe is None:
            raise MissingError(
                f"the command `{name}` is not installed (looked in {self.path_env()})",
                hint=f"install the package that provides {name}, or check PATH",
            )
        return exe

    def json_result(self, argv: list[str], what: str, timeout: float, output_log: Path | None = None) -> dict:
        """Run a helper that prints its result as a JSON line last (the load worker, a probe run in
        another Python): that document, or {"error": ...} naming `what`, its exit and its last lines."""
        try:
            r = self.run(argv, check=False, timeout=timeout, output_log=output_log)
        except P2pkitError as e:
            return {"error": e.message}
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
            return {"error": f"{what} exited {r.returncode} without a result: {tail}"}
        return json.loads(lines[-1])


def _feed(proc: subprocess.Popen, input_text: str | None) -> None:
    """The command's stdin, where it reads one (a password mokutil reads); a command that left already: none."""
    if proc.stdin is None:
        return
    try:
        proc.stdin.write(input_text.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass


def _ended_within(pid: int, limit: float) -> bool | None:
    """Whether process `pid` ended within `limit` seconds, woken the moment it does (poll on a pidfd); None where
    the kernel or Python has no pidfd. Popen.wait(timeout) polls instead, sleeping up to 50 ms between looks: a
    command of 70 ms read as 113 ms, on doctor's longest path (nvidia-smi) among others (issue 38 item 9)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or the process is already gone (waited for)
        return None
    try:
        waiter = select.poll()
        waiter.register(fd, select.POLLIN)
        return bool(waiter.poll(max(limit, 0.0) * 1000))
    finally:
        os.close(fd)


def _wait(proc: subprocess.Popen, readers: list, argv: list[str], token: str, limit: float, start: float) -> None:
    """The command's end within `limit`; past it, the command and its children are killed (CommandTimeout, with
    what it printed). A timeout, Ctrl-C, SIGTERM: nothing of this command outlives the wait."""
    finished = False
    try:
        try:
            if _ended_within(proc.pid, limit) is False:
                raise subprocess.TimeoutExpired(argv, limit)
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            children.kill(proc.pid, token)
            proc.wait()
            for r in readers:
                r.join(timeout=5)
            out, err = (r.text() for r in readers) if readers else ("", "")
            raise CommandTimeout(argv, limit, time.monotonic() - start, out, err) from None
        finished = True
    finally:
        if not finished:
            children.kill(proc.pid, token)
            proc.wait()
        children.ended(proc.pid)
