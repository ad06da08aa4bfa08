"""link: run the real load worker on the host's GPUs (torch), or on the devices a simulated host
provides; the same worker code either way."""

from __future__ import annotations

import importlib.util
import json
import sys

from p2pkit.errors import MissingError
from p2pkit.output import follow_cmd


def measure(ctx) -> dict:
    backend = ctx.host.load_backend()
    for mod in ("torch", "pynvml") if backend is None else ():
        if importlib.util.find_spec(mod) is None:
            raise MissingError(f"the link stage needs {mod} to put a real load on the GPUs, and it is not installed",
                               hint="install the load extra: pip install 'p2pkit[load]' (brings torch)")
    lk, pc = ctx.profile.link, ctx.profile.pcie
    cfg = {"load_seconds": lk.load_seconds, "poll_ms": lk.poll_ms, "sample_mib": lk.sample_mib,
           "samples": lk.samples, "min_gen": pc.min_gen, "min_width": pc.min_width, "backend": backend}
    argv = [sys.executable, "-m", "p2pkit.load.worker", json.dumps(cfg)]
    log = ctx.store.dir / "logs/link.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    with ctx.out.working("[link] real load on every GPU (torch matmuls and copies), NVML polled", log=str(log),
                         follow=follow_cmd("link")):
        return {"link_load": ctx.host.runner.json_result(argv, "the load worker", lk.load_seconds + 600,
                                                         output_log=log)}
