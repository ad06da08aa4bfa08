"""The engine where systemd is not PID 1 (a container, a rented GPU box): p2pkit starts it itself,
the way seed 000 did by hand (`setsid nohup`), and keeps what systemd would have kept for it.

- In a session of its own (setsid), stdin /dev/null, stdout and stderr appended to a log file.
- In a memory cgroup without a cap where p2pkit can make one (P12): <mount>/p2pkit-engine under the
  highest cgroup p2pkit may write (the hierarchy's root first), cgroup v2 or v1's memory controller.
  The process is moved there BEFORE it execs the engine: a small /bin/sh stub waits on a pipe for
  "go", which p2pkit writes only after the move and after the record is on disk. A p2pkit killed
  before that leaves nothing running (the stub reads end-of-file and exits without exec); killed
  after it, it leaves an engine its record names (stop works by the record).
- A record (JSON, written atomically): pid, start time (/proc/PID/stat field 22, so that a reused
  pid is never taken for the engine), argv, log, the cgroup and the caps seen up its chain.

The processes are this machine's own (a simulated host's engine is a real process too), so liveness
is read from this machine's /proc; the cgroup files go through the host root. A simulated host's
/proc is a directory: there p2pkit writes the line the kernel would show after the move.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from p2pkit.core import children, safefs
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.breaks import lines
from p2pkit.core.errors import Exit, P2pkitError, ProbeError
from p2pkit.host import Host, system
from p2pkit.parse import system as ps

RECORD = "/run/p2pkit/engine-launcher.json"  # tmpfs on a real host: gone after a reboot, as the engine is
CGROUP_NAME = "p2pkit-engine"
# the stub: its stdin is the pipe; "go" execs the engine with stdin /dev/null, end-of-file exits
STUB = 'read -r go && [ "$go" = go ] && exec "$@" </dev/null'


START_LINE = "-- p2pkit launcher"  # the line the launcher writes into the log before each start

def systemd_booted(host: Host) -> bool:
    """sd_booted(3): /run/systemd/system is a directory; and PID 1 is systemd itself (a container
    can carry the directory from its image while its PID 1 is a shell or tini)."""
    if not host.path("/run/systemd/system").is_dir():
        return False
    try:
        return host.read("/proc/1/comm", "PID 1's name").strip() == "systemd"
    except ProbeError:
        return True  # /proc mounted with hidepid: the directory is sd_booted()'s whole test


def on_this_machine(host: Host, word: str) -> str:
    """A host path as this machine names it, for a process this machine runs for the host (the
    engine, systemd-analyze's ExecStart): under a host root other than / an absolute path that exists
    in that root points into it (as the simulated host's systemctl does for ExecStart), and so does a
    file still to be written in a directory that exists there (the engine's request log); anything
    else as it is."""
    if host.root != Path("/") and word.startswith("/") and (host.path(word).exists()
                                                            or host.path(word).parent.is_dir()):
        return str(host.path(word))
    return word


def process_env(host: Host, env: dict[str, str]) -> dict[str, str]:
    """The engine's environment as this machine's process gets it: its path values mapped as
    on_this_machine maps them, and the host's own additions for its engine (a simulated host's
    state names them; a real host has none)."""
    extra = (host.sim or {}).get("engine_env", {})
    return {k: on_this_machine(host, v) for k, v in env.items()} | {k: str(v) for k, v in extra.items()}


def run_as(host: Host, user: str) -> str | None:
    """The user the engine runs as: the unit's user where this machine is the host (root /), p2pkit
    runs as root and the host's /etc/passwd has the user; else None (p2pkit's own user). Under
    another root the name is that tree's, not this machine's."""
    from p2pkit.host import access

    if host.root != Path("/") or os.geteuid() != 0:
        return None
    return user if access.user_ids(host, user) is not None else None


def record_path(host: Host) -> Path:
    return host.path(RECORD)


def read_record(path: Path) -> dict | None:
    """The launcher's record, or None (none written, or one that cannot be read: no engine to name)."""
    try:
        doc = json.loads(safefs.read_bytes(path))  # a regular file of a record's size, never waited on
    except (OSError, ValueError, safefs.LinkRefused):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("pid"), int) else None


def is_running(rec: dict | None) -> bool:
    """The recorded process runs: same pid and same start time (a reused pid is another process)."""
    return bool(rec) and children.running(rec["pid"], rec.get("start"))


def engine_process(host: Host, timeout: float | None = None) -> dict:
    """The engine's main process, found the one way every fact that needs it (its liveness, its NCCL, its
    memory fit) finds it: through the launcher's record where p2pkit's launcher started it (systemd not
    PID 1; the record's pid only while its start time matches), else systemd's MainPID of the installed
    unit. {"manager": "launcher" | "systemd" | None (no engine installed here), "pid": int | None,
    "state": the process's state letter (T: stopped) | None}. A launcher's engine is this machine's own
    process, so its state is read from this machine's /proc, as its liveness is. systemctl is asked only where
    systemd is PID 1 or p2pkit's unit is installed."""
    rec_path = record_path(host)
    if rec_path.is_file():
        rec = read_record(rec_path)
        pid = rec["pid"] if is_running(rec) else None
        try:
            state = ps.proc_stat_state(Path(f"/proc/{pid}/stat").read_text()) if pid else None
        except (OSError, ValueError, IndexError):
            state = None
        return {"manager": "launcher", "pid": pid, "state": state}
    installed = host.path(system.ENGINE_UNIT_FILE).is_file()
    if installed or systemd_booted(host):  # where systemd is not PID 1 there is no systemctl to ask
        pid = system.service_main_pid(host, timeout=timeout)
        if installed or pid:  # a running unit p2pkit did not write there is the engine too
            return {"manager": "systemd", "pid": pid, "state": system.process_state(host, pid) if pid else None}
    return {"manager": None, "pid": None, "state": None}


# ---------------------------------------------------------------------------------------- cgroups

def _hierarchy(host: Host) -> tuple[str, str, str] | None:
    """(version, mount, p2pkit's own path in it) of the memory hierarchy."""
    try:
        own = system.self_cgroup(host)
    except ProbeError:
        return None
    if own.v2_path is not None and host.exists("/sys/fs/cgroup/cgroup.controllers"):
        return "v2", "/sys/fs/cgroup", own.v2_path
    if "memory" in own.v1 and host.exists("/sys/fs/cgroup/memory"):
        return "v1", "/sys/fs/cgroup/memory", own.v1["memory"]
    return None


def engine_cgroup(host: Host, name: str = CGROUP_NAME) -> dict:
    """Make (or reuse) <mount>/<parent>/p2pkit-engine under the highest cgroup p2pkit can write: the
    root of the hierarchy, else each cgroup down p2pkit's own path. Returns the cgroup (its host path
    and its path inside the hierarchy) with the caps up its chain, or why none could be made."""
    h = _hierarchy(host)
    if h is None:
        return {"error": "no memory cgroup hierarchy found (neither cgroup v2 at /sys/fs/cgroup nor v1's memory "
                         "controller at /sys/fs/cgroup/memory)"}
    version, mount, own = h
    parts = [p for p in own.split("/") if p]
    tried = []
    for i in range(len(parts) + 1):
        parent = "/" + "/".join(parts[:i])
        rel = parent.rstrip("/") + "/" + name
        d = host.path(mount + rel)
        try:
            d.mkdir(exist_ok=True)
        except OSError as e:
            tried.append(f"{mount}{rel}: {e.strerror or e}")
            continue
        chain = ps.ProcCgroup(rel, {}) if version == "v2" else ps.ProcCgroup(None, {"memory": rel})
        caps = system.memory_caps(host, chain)
        return {"version": version, "dir": mount + rel, "path": rel,
                "caps": [{"file": f, "limit_bytes": n} for f, n in caps], **({"tried": tried} if tried else {})}
    return {"version": version, "error": "no cgroup could be made: " + "; ".join(tried)}


def _move(host: Host, cg: dict, pid: int) -> str | None:
    """Write pid into the cgroup's cgroup.procs; None when it moved, else why not."""
    try:
        with safefs.open_file(host.path(cg["dir"] + "/cgroup.procs"), "a") as fh:  # never through a link
            fh.write(f"{pid}\n")
    except OSError as e:
        return f"could not move pid {pid} into {cg['dir']}: {e.strerror or e}"
    if host.tree:  # the simulated host's /proc is a directory: what the kernel would show now
        line = f"0::{cg['path']}\n" if cg["version"] == "v2" else f"4:memory:{cg['path']}\n"
        d = host.path(f"/proc/{pid}")
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup").write_text(line)
    return None


# ---------------------------------------------------------------------------------------- start, stop

def log_tail(path: str | Path, n: int = 30) -> list[str]:
    try:
        return lines(Path(path).read_text(errors="replace"))[-n:]  # the engine's lines: split at \n only
    except OSError:
        return []


def start(host: Host, *, record: Path, log: Path, argv: list[str], env: dict[str, str], cwd: Path | None = None,
          user: str | None = None, shown_argv: list[str] | None = None, settle_s: float = 2.0,
          cgroup_name: str = CGROUP_NAME) -> dict:
    """Start the engine (argv as this machine runs it; shown_argv as the host names it) and return
    its record. Refused while the recorded engine runs; a process that exits within settle_s
    seconds is a failure with the last lines of its log."""
    cur = read_record(record)
    if is_running(cur):
        raise P2pkitError(
            f"the engine already runs (pid {cur['pid']}, started by p2pkit's launcher, recorded in {record}): a "
            "second start was refused", hint="`p2pkit serve restart` restarts it, `p2pkit serve stop` stops it",
            code=Exit.LOCKED)
    cg = engine_cgroup(host, cgroup_name)
    safefs.makedirs(record.parent, under=host.root)  # no link below the host's root (issue 48 item 1)
    r, w = os.pipe()  # close-on-exec both: only p2pkit holds the write end
    with safefs.open_file(log, "ab") as fh:  # never through a link (issue 40)
        fh.write(f"{START_LINE} {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(shown_argv or argv)}\n"
                 .encode())
        fh.flush()
        ids = {}
        if user:
            import pwd

            pw = pwd.getpwnam(user)
            ids = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(user, pw.pw_gid)}
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", STUB, "p2pkit-launcher", *argv], stdin=r, stdout=fh,
                                    stderr=subprocess.STDOUT, env={k: v for k, v in env.items()
                                                                   if k != children.TOKEN},
                                    cwd=cwd if cwd and cwd.is_dir() else None, start_new_session=True, **ids)
        except OSError as e:
            os.close(w)
            raise P2pkitError(f"the launcher could not start /bin/sh for the engine: {e.strerror or e}",
                              hint="check that /bin/sh exists and the engine's working directory is reachable") from e
        finally:
            os.close(r)
    try:
        moved = _move(host, cg, proc.pid) if "dir" in cg else cg["error"]
        rec = {"pid": proc.pid, "start": children.start_time(proc.pid), "started_at": time.time(),
               "argv": list(shown_argv or argv), "log": str(log), "user": user,
               "cgroup": cg, **({"move_error": moved} if moved else {})}
        rec["caps"] = system.pid_caps(host, proc.pid)
        atomic_write(record, (json.dumps(rec, indent=1) + "\n").encode(), under=host.root)  # no link below /
        os.write(w, b"go\n")  # the record is on disk: from here the engine is p2pkit's to stop by it
    finally:
        os.close(w)
    try:
        code = proc.wait(timeout=settle_s)
    except subprocess.TimeoutExpired:
        return rec
    tail = log_tail(log, 12)
    raise P2pkitError(
        f"the engine exited within {settle_s:g} s of its start (exit {code}); the last lines of {log}: "
        + " | ".join(tail[1:] if tail and tail[0].startswith(START_LINE) else tail),
        hint="fix what the log names (`p2pkit serve logs`), then `p2pkit up --from service`")


def session_members(sid: int) -> list[int]:
    """The live processes of a session (the engine and everything it started, unless they left it)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            f = Path(f"/proc/{d}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(f) > 3 and f[0] != "Z" and f[3] == str(sid):
            out.append(int(d))
    return out


def stop(record: Path, timeout_s: float = 30.0) -> dict:
    """SIGTERM the recorded engine's session, wait up to timeout_s, then SIGKILL what is left of it;
    the record stays, marked stopped (its log is still the engine's). Says what it did."""
    rec = read_record(record)
    if not is_running(rec):
        return {"stopped": False, "why": "not running" if rec else "no engine recorded"}
    pid = rec["pid"]
    killed: list[int] = []
    stop_session(pid, timeout_s, killed)
    atomic_write(record, (json.dumps({**rec, "stopped_at": time.time()}, indent=1) + "\n").encode())
    return {"stopped": True, "pid": pid, "killed": killed}


def stop_session(pid: int, timeout_s: float, killed: list[int] | None = None) -> list[int]:
    """SIGTERM (and SIGCONT) every live process of the session `pid` leads, wait up to timeout_s, then SIGKILL what
    is left (noted in `killed`) and wait for it. Returns the processes still alive after that (none,
    unless one cannot be killed)."""
    for p in session_members(pid):
        for sig in (signal.SIGTERM, signal.SIGCONT):  # as systemd does: a stopped process gets to die too
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and session_members(pid):
        _reap(pid)
        time.sleep(0.05)
    left = session_members(pid)
    if killed is not None:
        killed.extend(left)
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.monotonic() + 5
    while time.monotonic() < end and session_members(pid):
        _reap(pid)
        time.sleep(0.02)
    return session_members(pid)


def _reap(pid: int) -> None:
    """The engine is this process's child when this p2pkit started it: collect it, or it stays a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def state(record: Path) -> dict:
    """What `serve status` says: the record, and whether its engine runs."""
    rec = read_record(record)
    return {"recorded": rec is not None, "running": is_running(rec), **({"record": rec} if rec else {})}
