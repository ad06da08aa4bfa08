"""link: run the real load worker on the host's GPUs (torch), or on the devices a simulated host
provides; then a short NCCL all-reduce across the pair in the engine's own environment (P28, P30),
in a child process that drives the real NCCL or the simulated host's stand-in the same way."""

from __future__ import annotations

import importlib.util
import json
import sys

from p2pkit.core import safefs
from p2pkit.core.errors import CommandError, MissingError, P2pkitError
from p2pkit.core.output import follow_cmd
from p2pkit.core.runner import CommandTimeout
from p2pkit.parse import field as pf
from p2pkit.rules import engine_env

SHOWN = ("NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "GGML_CUDA_P2P", "LD_LIBRARY_PATH")


def measure(ctx, acted: dict | None = None) -> dict:
    backend = ctx.host.load_backend()
    for mod in ("torch", "pynvml") if backend is None else ():
        if importlib.util.find_spec(mod) is None:
            raise MissingError(f"the link stage needs {mod} to put a real load on the GPUs, and it is not installed",
                               hint="install the load extra: pip install 'p2pkit[load]' (brings torch)")
    lk, pc = ctx.profile.link, ctx.profile.pcie
    cfg = {"load_seconds": lk.load_seconds, "poll_ms": lk.poll_ms, "sample_mib": lk.sample_mib,
           "samples": lk.samples, "min_gen": pc.min_gen, "min_width": pc.min_width, "backend": backend}
    argv = [sys.executable, "-m", "p2pkit.load.worker", json.dumps(cfg)]
    log = safefs.write_text(ctx.store.dir / "logs/link.log", "")  # never through a link (issue 40)
    what = ("real load on every GPU (torch matmuls and copies), NVML polled" if backend is None else
            "load on the simulated GPUs (its stand-in devices; the figures are the reference box's recorded ones)")
    with ctx.out.working(f"[link] {what}", log=str(log), follow=follow_cmd("link")):
        load = ctx.host.runner.json_result(argv, "the load worker", lk.load_seconds + 600, output_log=log)
    return {"link_load": load, **nccl_allreduce(ctx)}


def probe_env(ctx) -> dict[str, str]:
    """The engine's environment (the service's variables, the profile's NCCL), NCCL's channel lines on,
    NVLink multicast off."""
    env = engine_env.engine_env(ctx.profile, engine_env.pair_level(ctx.host, ctx.profile))
    return {**env, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P", **engine_env.NO_MULTICAST}


def nccl_allreduce(ctx) -> dict:
    """{"nccl_allreduce": ...} for a GPU pair: its channel transports, whether it hung, its own result."""
    p = ctx.profile
    if p.gpus.count < 2:
        return {}
    try:
        env = probe_env(ctx)
    except P2pkitError as e:
        return {"nccl_allreduce": {"error": e.message}}
    shown = {k: env[k] for k in SHOWN if k in env}
    lib = f"{p.engine.nccl_root}/lib/libnccl.so.2" if p.engine.nccl_root else ""
    cfg = {"lib": lib, "bytes": 8 << 20, "backend": ctx.host.load_backend()}
    argv = [sys.executable, "-m", "p2pkit.load.nccl_allreduce", json.dumps(cfg)]
    with ctx.out.working(f"[link] NCCL all-reduce across the pair (at most {p.link.nccl_timeout_s:g} s)"):
        try:
            r = ctx.host.runner.run(argv, check=False, timeout=p.link.nccl_timeout_s, env=env)
            run = {"timed_out": False, "exit": r.returncode, "lines": (r.stdout + "\n" + r.stderr).splitlines()}
        except CommandError as e:  # CommandTimeout: it hung, and was killed
            run = {"timed_out": isinstance(e, CommandTimeout), "exit": e.returncode,
                   "lines": (e.stdout + "\n" + e.stderr).splitlines()}
    return {"nccl_allreduce": judged_run(run, shown, p.link.nccl_timeout_s)}


def judged_run(run: dict, env: dict, timeout: float) -> dict:
    """What the checks need from a run: transports from the channel lines, its JSON result, the tail."""
    lines = run["lines"]
    results = [ln for ln in lines if ln.startswith("{")]
    try:
        result = json.loads(results[-1]) if results else None
    except ValueError:
        result = None
    return {"timed_out": run["timed_out"], "timeout_s": timeout, "exit": run["exit"], "env": env,
            "transports": pf.nccl_transports(lines), "result": result,
            "tail": [ln for ln in lines if ln.strip() and not ln.startswith("{")][-6:]}
