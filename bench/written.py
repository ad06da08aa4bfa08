"""The files a p2pkit command writes, recorded from the kernel's side: the command runs under strace
(-f, every process it starts), and every open for writing, rename, mkdir, truncate, chmod and chown is
attributed to the program that made it (the argv of the process's last execve, inherited over fork).
p2pkit's own processes (the CLI, its load workers, its guard, its launcher) are told from Ansible's and
from the host's tools (the simulated host's stand-ins) by that argv, never by a list of paths.
A relative name given without a directory fd (a tool that changed its working directory, as `mkdir -p`
does) cannot be placed and is left out; p2pkit names every file it writes by an absolute path or
through a directory fd (-y shows the fd's path).

Used by bench/bench_trust.py (the trust campaign) and tests/test_safefs.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SYSCALLS = ("execve,execveat,clone,clone3,fork,vfork,openat,open,creat,rename,renameat,renameat2,mkdir,mkdirat,"
            "truncate,chmod,fchmodat,chown,lchown,fchownat,link,linkat,symlink,symlinkat")
WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")
_LINE = re.compile(r"^(\d+) +(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")
_STR = r'"((?:[^"\\]|\\.)*)"'
_FD = r"(AT_FDCWD|\d+)(?:<([^>]*)>)?"


def strace_argv(out: Path) -> list[str]:
    return ["strace", "-f", "-q", "-y", "-s", "300", "-e", "signal=none", "-e", f"trace={SYSCALLS}", "-o",
            str(out)]


def available() -> bool:
    return shutil.which("strace") is not None


@dataclass
class Write:
    path: str
    by: dict[str, set[str]] = field(default_factory=dict)  # program -> how it wrote: open, open-new
    # (O_CREAT|O_EXCL), rename (onto the path), mkdir, mkdir-private (made new, 0700: mkdtemp),
    # truncate, chmod, chown, link (a new name)
    first: dict[str, str] = field(default_factory=dict)  # program -> how it wrote the path first

    @property
    def how(self) -> set[str]:
        return set().union(*self.by.values()) if self.by else set()

    def plantable(self, program: str = "p2pkit") -> bool:
        """Whether `program` wrote a name that could already have been there as a link: an open that
        was not O_EXCL, a rename onto it, a truncate, or a chmod/chown of a name it did not just make."""
        how = self.by.get(program, set())
        if self.first.get(program) in ("open-new", "link"):
            return False  # made new by this run (O_EXCL): what follows is written to the run's own file
        if how & {"open", "rename", "truncate"}:
            return True
        return bool(how & {"chmod", "chown"}) and "open-new" not in how


def _unescape(s: str) -> str:
    return bytes(s, "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")


def program(argv: list[str]) -> str:
    """"p2pkit" for p2pkit's own processes; else a short name of the program (ansible-playbook,
    ansible module, the simulated host's stand-in, git, ...)."""
    if not argv:
        return "?"
    text = " ".join(argv)
    if "p2pkit.sim" in text or "/.p2pkit-sim/" in text:
        return "simulated host"
    for a in argv[:3]:  # p2pkit's own Ansible modules apart from Ansible's (issue 48)
        base = os.path.basename(a)
        if base.startswith("AnsiballZ_p2pkit_"):
            return "p2pkit module"
        if base.startswith("AnsiballZ_"):
            return "ansible " + base.removeprefix("AnsiballZ_").removesuffix(".py")
    if any(os.path.basename(a).startswith("ansible") for a in argv[:3]):
        return "ansible"
    if os.path.basename(argv[0]) == "p2pkit":
        return "p2pkit"
    if "python" in os.path.basename(argv[0]):
        for opt in ("-c", "-m"):
            if opt in argv[:3] and argv.index(opt) + 1 < len(argv):
                arg = argv[argv.index(opt) + 1]
                if arg.startswith("p2pkit") or (opt == "-c" and "p2pkit" in arg):
                    return "p2pkit"
    return os.path.basename(argv[0])


@dataclass
class Trace:
    writes: dict[str, Write]  # path -> every write to it
    events: list[tuple[str, str, str]]  # (program, how, path) in the order they happened


def parse(text: str) -> dict[str, Write]:
    """path -> Write for every write attempt in an strace -f -y log (failed attempts included: a path
    p2pkit tried to write is a path it writes)."""
    return parse_trace(text).writes


def parse_trace(text: str) -> Trace:
    """Every write attempt in an strace -f -y log, by path and in order."""
    parent: dict[int, int] = {}
    execs: dict[int, list[str]] = {}
    pending_exec: dict[int, list[str]] = {}
    pending_clone: set[int] = set()
    events: list[tuple[int, str, str, str]] = []  # pid, how, path
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        pid, resumed, call, rest = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        name = resumed or call
        if name in ("execve", "execveat"):
            if call:
                m = re.search(r'\[((?:"(?:[^"\\]|\\.)*"(?:\.\.\.)?(?:, )?)*)\]', rest)
                argv = re.findall(_STR, m.group(1)) if m else []
                pending_exec[pid] = [_unescape(a) for a in argv]
            if (re.search(r"\) += 0\b", rest) or rest.rstrip().endswith("= 0")) and pid in pending_exec:
                execs[pid] = pending_exec.pop(pid)
            continue
        if name in ("clone", "clone3", "fork", "vfork"):
            r = re.search(r"= (\d+)\s*$", rest)
            if r:
                parent[int(r.group(1))] = pid
            elif call:
                pending_clone.add(pid)
            continue
        if not call:
            continue
        for how, path in _writes(call, rest):
            events.append((pid, how, path))
    out: dict[str, Write] = {}
    prog_cache: dict[int, str] = {}

    def prog(pid: int, depth: int = 0) -> str:
        if pid in prog_cache:
            return prog_cache[pid]
        if pid in execs:
            got = program(execs[pid])
        elif pid in parent and depth < 100:
            got = prog(parent[pid], depth + 1)
        else:
            got = "?"
        prog_cache[pid] = got
        return got
    ordered = []
    for pid, how, path in events:
        path = os.path.normpath(path)
        w = out.setdefault(path, Write(path))
        w.first.setdefault(prog(pid), how)
        w.by.setdefault(prog(pid), set()).add(how)
        ordered.append((prog(pid), how, path))
    return Trace(out, ordered)


def _join(fd_path: str | None, path: str) -> str | None:
    if path.startswith("/"):
        return path
    return os.path.join(fd_path, path) if fd_path else None


def _writes(call: str, rest: str) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []
    if call in ("openat", "open", "creat"):
        m = re.match(rf"{_FD}, {_STR}, ([A-Z_|0-9]+)", rest) if call == "openat" else \
            re.match(rf"{_STR}(?:, ([A-Z_|0-9]+))?", rest)
        if not m:
            return got
        if call == "openat":
            fd_path, path, flags = m.group(2), _unescape(m.group(3)), m.group(4)
        else:
            fd_path, path, flags = None, _unescape(m.group(1)), (m.group(2) or "O_WRONLY|O_CREAT|O_TRUNC")
        if call == "creat":
            flags = "O_WRONLY|O_CREAT|O_TRUNC"
        if not any(f in flags.split("|") for f in WRITE_FLAGS):
            return got
        full = _join(fd_path, path)
        if full:
            got.append(("open-new" if "O_EXCL" in flags.split("|") and "O_CREAT" in flags.split("|") else "open",
                        full))
    elif call in ("rename", "renameat", "renameat2"):
        if call == "rename":
            m = re.match(rf"{_STR}, {_STR}", rest)
            dst = m and _unescape(m.group(2))
        else:
            m = re.match(rf"{_FD}, {_STR}, {_FD}, {_STR}", rest)
            dst = m and _join(m.group(5), _unescape(m.group(6)))
        if dst:
            got.append(("rename", dst))
    elif call in ("mkdir", "mkdirat"):
        m = re.match(rf"{_STR}, (0\d+)", rest) if call == "mkdir" else re.match(rf"{_FD}, {_STR}, (0\d+)", rest)
        if m:
            full = _unescape(m.group(1)) if call == "mkdir" else _join(m.group(2), _unescape(m.group(3)))
            made = re.search(r"\) += 0$", rest)
            private = m.group(m.lastindex) == "0700" and made
            if full:  # a private directory made new (mkdtemp): a place only this run knows; one that was there
                # already (EEXIST) is "mkdir-there"
                got.append(("mkdir-private" if private else "mkdir" if made else "mkdir-there", full))
    elif call in ("truncate", "chmod", "chown", "lchown"):
        m = re.match(rf"{_STR}", rest)
        if m and m.group(1).startswith("/") and call != "lchown":
            got.append(({"truncate": "truncate", "chmod": "chmod"}.get(call, "chown"), _unescape(m.group(1))))
    elif call in ("fchmodat", "fchownat"):
        m = re.match(rf"{_FD}, {_STR}", rest)
        if m and "AT_SYMLINK_NOFOLLOW" not in rest and m.group(3):
            full = _join(m.group(2), _unescape(m.group(3)))
            if full:
                got.append(("chmod" if call == "fchmodat" else "chown", full))
    elif call in ("link", "linkat", "symlink", "symlinkat"):
        strs = re.findall(_STR, rest)
        if strs:
            fds = re.findall(r"(?:AT_FDCWD|\d+)<([^>]*)>", rest)
            dst = _unescape(strs[-1])
            full = dst if dst.startswith("/") else (os.path.join(fds[-1], dst) if fds else None)
            if full:
                got.append(("link", full))
    return got


def record(argv: list[str], trace: Path, after=None, timeout: float = 1800, settle: float = 20,
           **kw) -> tuple[int, Trace]:
    """Run argv under strace: its exit status and what it wrote. A service it leaves running (the
    simulated engine) would keep strace waiting: once argv's own process has exited, `after()` runs
    (stop that service) and strace is given `settle` seconds before it is told to detach (a service
    left running goes on, untraced)."""
    with open(trace.with_suffix(".err"), "wb") as err:  # the command's own output, beside its trace
        proc = subprocess.Popen([*strace_argv(trace), *argv], stdout=err, stderr=subprocess.STDOUT, **kw)
    end = time.monotonic() + timeout
    code = None
    while proc.poll() is None and time.monotonic() < end:
        time.sleep(0.5)
        code = _top_exit(trace)
        if code is not None:
            break
    if after is not None:
        after()
    try:
        proc.wait(timeout=settle)
    except subprocess.TimeoutExpired:
        proc.terminate()  # strace detaches from what it still traces and exits
        proc.wait()
    if code is None:
        code = _top_exit(trace)
    return (proc.returncode if code is None else code), parse_trace(trace.read_text(errors="replace"))


def _top_exit(trace: Path) -> int | None:
    """The exit status of the traced command's own process, once the trace says it exited."""
    try:
        with open(trace, errors="replace") as fh:
            first = fh.readline()
            top = first.split(" ", 1)[0]
            if not top.isdigit():
                return None
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            tail = fh.read()
    except OSError:
        return None
    m = re.search(rf"^{top} +\+\+\+ exited with (\d+) \+\+\+", tail, re.M)
    if m:
        return int(m.group(1))
    m = re.search(rf"^{top} +\+\+\+ killed by SIG\w+", tail, re.M)
    return 128 + 9 if m else None


def by_program(trace: Trace, program: str, under: Path, skip: tuple[str, ...] = ()) -> dict[str, Write]:
    """The paths `program` wrote inside `under` (a simulated host's root), less the subtrees in `skip`
    (relative to it)."""
    top = str(under)
    skips = [os.path.join(top, s) for s in skip]
    inside = top.rstrip("/") + "/"  # "/" itself: every absolute path (a container's root, seen from inside)
    return {p: w for p, w in trace.writes.items() if program in w.by
            and (p == top or p.startswith(inside))
            and not any(p == s or p.startswith(s + "/") for s in skips)}


def private_dirs(trace: Trace, program: str = "p2pkit") -> list[str]:
    """The directories `program` made new and private (0700, as mkdtemp does) in the run."""
    return sorted(p for p, w in trace.writes.items() if "mkdir-private" in w.by.get(program, set()))


def by_stage(trace: Trace, state: Path, stages: list[str]) -> dict[str, list[tuple[str, str, str]]]:
    """The events of a run grouped by the stage that was running: a write belongs to the first stage
    whose artifact (<state>/<stage>.json) is renamed into place after it."""
    marks = {str(state / f"{s}.json"): s for s in stages}
    out: dict[str, list] = {s: [] for s in stages}
    pending: list = []
    for ev in trace.events:
        pending.append(ev)
        if ev[1] == "rename" and ev[2] in marks:
            out[marks[ev[2]]].extend(pending)
            pending = []
    return out


def main() -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="Record what a command writes (strace -f) and list it by program.")
    ap.add_argument("--under", type=Path, default=Path("/"), help="only paths inside this directory")
    ap.add_argument("--program", default=None, help="only what this program wrote (p2pkit, ansible, ...)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    a = ap.parse_args()
    argv = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not argv:
        ap.error("give the command to record after --")
    if not available():
        ap.error("strace is not installed (apt-get install strace)")
    with tempfile.TemporaryDirectory(prefix="written-") as tmp:
        code, trace = record(argv, Path(tmp) / "trace")
    for path, w in sorted(trace.writes.items()):
        if (path == str(a.under) or path.startswith(str(a.under).rstrip("/") + "/")) and \
                (a.program is None or a.program in w.by):
            print(path, "; ".join(f"{p}: {','.join(sorted(h))}" for p, h in sorted(w.by.items())))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
