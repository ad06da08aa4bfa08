"""link: run the real load (a torch worker process), or on a simulated host give recorded results."""

from __future__ import annotations

import importlib.util
import json
import sys

from p2pkit.errors import MissingError
from p2pkit.sim import model as sim_model


def measure(ctx) -> dict:
    if ctx.host.simulated:
        return {"link_load": sim_model.link_results(ctx.host.sim, ctx.profile)}
    for mod in ("torch", "pynvml"):
        if importlib.util.find_spec(mod) is None:
            raise MissingError(f"the link stage needs {mod} to put a real load on the GPUs, and it is not installed",
                               hint="install the load extra: pip install 'p2pkit[load]' (brings torch)")
    lk, pc = ctx.profile.link, ctx.profile.pcie
    cfg = {"load_seconds": lk.load_seconds, "poll_ms": lk.poll_ms, "sample_mib": lk.sample_mib,
           "samples": lk.samples, "min_gen": pc.min_gen, "min_width": pc.min_width}
    argv = [sys.executable, "-m", "p2pkit.load.worker", json.dumps(cfg)]
    with ctx.out.working("[link] real load on every GPU (torch matmuls and copies), NVML polled"):
        return {"link_load": ctx.host.runner.json_result(argv, "the load worker", lk.load_seconds + 600)}
