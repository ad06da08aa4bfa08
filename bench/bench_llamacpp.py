"""The overhead of `p2pkit bench`: its server-side decode tok/s on the real llama-server against
llama.cpp's own `llama-bench` (tg) on the same tiny model and the same lengths, one run, as a ratio.

Uses the real build the tests cache (tests/llama_real.py: built if missing), converts the tiny
checkpoint the tests make with llama.cpp's converter, starts llama-server on a free port, runs
p2pkit's bench arm against it (warm-up left out), then `llama-bench -p P -n N -r R -o json`.
A ratio near 1 says the served path and bench's accounting add little; the server's
`predicted_per_second` leaves the first token out, llama-bench's tg does not prefill at all.
Run by hand: `python3 bench/bench_llamacpp.py [--tokens 64] [--requests 5]`."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # p2pkit and the tests' helpers from this checkout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64, help="prompt and output length")
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import llama_real
    import tiny_checkpoint

    from p2pkit.app import bench, pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages.service import act as service

    llama_real.wait()
    build = llama_real.build_dir()
    tmp = Path(tempfile.mkdtemp(prefix="p2pkit-bench-"))
    ckpt = tiny_checkpoint.make(tmp / "tiny")
    gguf = tmp / "tiny.gguf"
    subprocess.run([sys.executable, "-m", "convert_hf_to_gguf", str(ckpt), "--outfile", str(gguf), "--outtype",
                    "f16"], cwd=build, check=True, capture_output=True)
    port = free_port()
    server = subprocess.Popen([str(build / "build/bin/llama-server"), "-m", str(gguf), "--host", "127.0.0.1",
                               "--port", str(port), "--metrics", "--threads", str(a.threads), "--parallel", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p = config.load("dual-5090-llamacpp", ["engine.cuda=false", f"serve.port={port}"])
        ctx = pipeline.Ctx(profile=p, host=Host.at("/"), store=Store(tmp / "state"), out=Output())
        h = service.wait_health(ctx, f"http://127.0.0.1:{port}/health", 120, alive=lambda: server.poll() is None)
        assert h["ok"], "llama-server did not become healthy"
        arm = bench.run_arm(ctx, p, "baseline", a.tokens, a.tokens, 1, a.requests)
    finally:
        server.terminate()
        server.wait(30)
    t0 = time.monotonic()
    r = subprocess.run([str(build / "build/bin/llama-bench"), "-m", str(gguf), "-p", str(a.tokens), "-n",
                        str(a.tokens), "-t", str(a.threads), "-r", "3", "-o", "json"],
                       check=True, capture_output=True, text=True)
    rows = json.loads(r.stdout)
    tg = next(x for x in rows if x.get("n_gen") and not x.get("n_prompt"))
    pp = next(x for x in rows if x.get("n_prompt") and not x.get("n_gen"))
    ours = arm["summary"]["decode_tps"]["median"]
    print(json.dumps({
        "tokens": a.tokens, "requests": a.requests, "threads": a.threads,
        "p2pkit_bench_decode_tps_median": ours, "p2pkit_bench_metrics_decode_tps": arm["summary"].get(
            "metrics_decode_tps"), "p2pkit_bench_prefill_tps_median": arm["summary"]["prefill_tps"]["median"],
        "llama_bench_tg_tps": round(tg["avg_ts"], 3), "llama_bench_pp_tps": round(pp["avg_ts"], 3),
        "decode_ratio": round(ours / tg["avg_ts"], 3),
        "prefill_ratio": round(arm["summary"]["prefill_tps"]["median"] / pp["avg_ts"], 3),
        "llama_bench_s": round(time.monotonic() - t0, 1)}, indent=2))


if __name__ == "__main__":
    main()
