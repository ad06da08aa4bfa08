"""Where served decode loses against llama-bench (issue 38, 4): the same model served by llama-server with the
flags p2pkit writes for the profile, then with one thing changed at a time (the slots, unified KV, the context
size, the prompt cache in RAM and its saving of idle slots, the sampler chain), one stream of each workload
shape at a time, beside llama-bench's tg at the same depth (taken with enough repetitions to judge its spread)
and its pp. Each request keeps the server's own decode and prefill figures and the client's time around them
(time to the answer's first byte against the server's prompt plus decode time): what the HTTP path and the
client add shows there, not in the server's figure.

    python3 bench/gpu_decode_probe.py --profile bench/h200-llamacpp.toml --state-dir DIR [--set K=V ...] \\
        --out probe.json [--variants p2pkit,parallel-1,...] [--requests 4] [--reps 10] [--log-dir DIR]

Every server is this build's llama-server (beside engine.binary), on a free loopback port, stopped after its
requests; its log is kept in --log-dir. Prints one line per variant and shape, and writes the JSON."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # p2pkit from this checkout, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parent))

# each variant: serve.flags changed from the profile's (None drops a flag), and the request's extra fields
VARIANTS: dict[str, tuple[dict, dict]] = {
    "p2pkit": ({}, {}),
    "parallel-1": ({"parallel": 1, "kv-unified": None}, {}),
    "no-kv-unified": ({"kv-unified": None}, {}),
    "ctx-4096": ({"ctx-size": 4096}, {}),
    "cache-ram-0": ({"cache-ram": 0}, {}),
    "no-cache-idle-slots": ({"no-cache-idle-slots": True}, {}),
    "greedy-sampler": ({}, {"samplers": ["top_k"], "top_k": 1}),
    "parallel-1-ctx-4096-cache-ram-0": ({"parallel": 1, "kv-unified": None, "ctx-size": 4096, "cache-ram": 0}, {}),
    # the greedy chain sampled on the GPU (llama-server's --backend-sampling, "experimental" in 0c1e570's help)
    "backend-sampling": ({"backend-sampling": True}, {"samplers": ["top_k"], "top_k": 1}),
    # one CPU thread: with every layer offloaded the CPU's part of a step is the token's embedding row
    "threads-1": ({"threads": 1}, {}),
}
SHAPES = {"decode": (128, 512), "production": (2048, 128)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_argv(p, flags: dict, port: int) -> list[str]:
    from dataclasses import replace

    from p2pkit.rules import engine_cmd

    merged = {k: v for k, v in {**p.serve.flags, **flags}.items() if v is not None}
    q = replace(p, serve=replace(p.serve, flags=merged, port=port, host="127.0.0.1"))
    return engine_cmd.argv(q)


def stats(xs: list[float]) -> dict | None:
    xs = [x for x in xs if isinstance(x, int | float)]
    if not xs:
        return None
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "n": len(xs)}


def one_variant(p, name: str, requests: int, log_dir: Path) -> dict:
    from p2pkit.host import engine_api
    from p2pkit.parse import engine_api as pe

    flags, extra = VARIANTS[name]
    log = log_dir / f"server-{name}.log"
    out: dict = {"variant": name, "flags": flags, "request_extra": extra, "shapes": {}}
    t0 = time.monotonic()
    try:
        proc, base, out["argv"] = start_server(p, flags, log)
    except RuntimeError as e:
        out["error"] = str(e)
        return out
    try:
        out["ready_s"] = round(time.monotonic() - t0, 2)
        token = engine_api.llamacpp_token(base)
        for shape, (n_prompt, n_out) in SHAPES.items():
            body_prompt = [token] * n_prompt
            reqs = []
            for i in range(requests + 1):  # the first is the warm-up, left out
                times: dict = {}
                status, body, waited = engine_api.post_json(f"{base}/completion", {
                    "prompt": body_prompt, "n_predict": n_out, "temperature": 0, "cache_prompt": False,
                    "ignore_eos": True, **extra}, 600, times)
                if status != 200 or not isinstance(body, dict):
                    out["shapes"][shape] = {"error": f"HTTP {status}: {str(body)[:200]}"}
                    break
                t = body.get("timings") or {}
                server_s = (t.get("prompt_ms", 0) + t.get("predicted_ms", 0)) / 1000
                if i:
                    reqs.append({"decode_tps": t.get("predicted_per_second"), "prefill_tps": t.get("prompt_per_second"),
                                 "prompt_n": t.get("prompt_n"), "predicted_n": t.get("predicted_n"),
                                 "server_s": round(server_s, 4), "client_s": round(waited, 4),
                                 "first_byte_s": round(times.get("first_byte_s", 0), 4),
                                 "outside_s": round(times.get("first_byte_s", 0) - server_s, 4)})
            else:
                out["shapes"][shape] = {"decode_tps": stats([r["decode_tps"] for r in reqs]),
                                        "prefill_tps": stats([r["prefill_tps"] for r in reqs]),
                                        "outside_s": stats([r["outside_s"] for r in reqs]),
                                        "client_tps": stats([r["predicted_n"] / r["client_s"] for r in reqs]),
                                        "requests": reqs}
        m = engine_api.metrics(base, "llamacpp:")
        out["metrics"] = m["values"]
        out["metrics_types"] = m.get("types", {})
        out["props"] = engine_api.get(f"{base}/props")[1][:4000]
        out["gauges"] = pe.gauges(m["values"], m.get("types", {}))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return out


def start_server(p, flags: dict, log: Path):
    from p2pkit.host import engine_api

    port = free_port()
    argv = server_argv(p, flags, port)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 180 and proc.poll() is None:
        if engine_api.get(f"{base}/health", 2)[0] == 200:
            return proc, base, argv
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"llama-server did not come up (exit {proc.poll()}; log {log})")


def timed(base: str, token: int, n_prompt: int, n_out: int) -> dict:
    from p2pkit.host import engine_api

    times: dict = {}
    status, body, waited = engine_api.post_json(f"{base}/completion", {
        "prompt": [token] * n_prompt, "n_predict": n_out, "temperature": 0, "cache_prompt": False,
        "ignore_eos": True}, 600, times)
    t = (body.get("timings") or {}) if isinstance(body, dict) else {}
    server_s = (t.get("prompt_ms", 0) + t.get("predicted_ms", 0)) / 1000
    return {"status": status, "client_s": round(waited, 4), "first_byte_s": round(times.get("first_byte_s", 0), 4),
            "server_s": round(server_s, 4), "outside_s": round(times.get("first_byte_s", 0) - server_s, 4),
            "wall_start": time.time() - waited}


def stall_probe(p, log_dir: Path) -> dict:
    """issue 38's first production request: 8 decode-shape requests at once fill every slot, then one
    production request alone, then another; with the profile's flags and trace logging (the prompt cache's
    own timing lines), and again with the prompt cache off (--cache-ram 0)."""
    from concurrent.futures import ThreadPoolExecutor

    from p2pkit.host import engine_api

    out = {}
    for name, flags in (("p2pkit", {}), ("cache-ram-0", {"cache-ram": 0})):
        log = log_dir / f"stall-{name}.log"
        proc, base, argv = start_server(p, {**flags, "log-verbosity": 4, "log-timestamps": True, "log-prefix": True},
                                        log)
        try:
            token = engine_api.llamacpp_token(base)
            (dp, do), (pp_, po) = SHAPES["decode"], SHAPES["production"]
            timed(base, token, dp, do)
            with ThreadPoolExecutor(8) as pool:
                fill = list(pool.map(timed, [base] * 8, [token] * 8, [dp] * 8, [do] * 8))
            first = timed(base, token, pp_, po)
            second = timed(base, token, pp_, po)
        finally:
            proc.terminate()
            proc.wait(30)
        lines = [ln for ln in log.read_text(errors="replace").splitlines()
                 if "prompt cache" in ln or "saving" in ln or "update took" in ln or "prompt_save" in ln]
        out[name] = {"argv": argv, "fill_outside_s": [x["outside_s"] for x in fill], "first": first,
                     "second": second, "cache_lines": lines[-40:]}
        print(f"stall {name}: first production request {first['first_byte_s']} s at the client, "
              f"{first['server_s']} s server; second {second['first_byte_s']} / {second['server_s']}", flush=True)
    return out


def llama_bench(p, reps: int) -> dict:
    """llama-bench's pp and tg at each shape's lengths and depth, `reps` repetitions, read by p2pkit's reader."""
    from types import SimpleNamespace

    from p2pkit.app import bench
    from p2pkit.host import Host
    from p2pkit.parse import llama_bench as lb

    ctx = SimpleNamespace(host=Host.at("/"))
    out = {}
    for shape, (n_prompt, n_out) in SHAPES.items():
        argv = bench.llama_bench_argv(ctx, p, n_prompt, n_out, reps)
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            rows = lb.read(r.stdout + ("" if r.returncode == 0 else "\n" + r.stderr))
        except (lb.LlamaBenchError, OSError, subprocess.TimeoutExpired) as e:
            out[shape] = {"argv": argv, "error": str(e)}
            continue
        out[shape] = {"argv": argv, "rows": [{"test": x.test, "avg_ts": x.avg_ts, "stddev_ts": x.stddev_ts,
                                              "spread": round(x.stddev_ts / x.avg_ts, 4) if x.avg_ts else None,
                                              "samples_ts": list(x.samples_ts)} for x in rows]}
    return out


def main(argv: list[str]) -> int:
    from gpu_stages import parser  # beside this script: the options of the GPU run

    import p2pkit.rules.engines  # noqa: F401  (the engines' rules on [serve.flags], as the CLI reads a profile)
    from p2pkit.core import config

    ap = parser(__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10, help="llama-bench repetitions (0: no llama-bench)")
    ap.add_argument("--log-dir", type=Path)
    ap.add_argument("--stall", action="store_true", help="also the first-request stall probe (trace logging)")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=PROMPT,OUTPUT",
                    help="a shape's lengths instead of the seed's (decode=128,512 production=2048,128): a model "
                         "with a short context, like the CPU build's tiny one")
    a = ap.parse_args(argv)
    names = [x for x in a.variants.split(",") if x]
    bad = [x for x in names if x not in VARIANTS]
    if bad:
        print(f"error: unknown variant(s) {', '.join(bad)}; known: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    for s in a.shape:
        name, _, lengths = s.partition("=")
        try:
            SHAPES[name] = tuple(int(x) for x in lengths.split(","))  # type: ignore[assignment]
        except ValueError:
            print(f"error: --shape {s!r}: expected NAME=PROMPT,OUTPUT", file=sys.stderr)
            return 2
    p = config.load(a.profile, a.overrides)
    log_dir = a.log_dir or a.out.parent
    log_dir.mkdir(parents=True, exist_ok=True)
    doc: dict = {"kind": "p2pkit-decode-probe", "profile": p.name, "overrides": a.overrides, "variants": []}
    if a.reps:
        doc["llama_bench"] = llama_bench(p, a.reps)
    ref = {}
    for shape, (n_prompt, n_out) in SHAPES.items():
        rows = (doc.get("llama_bench", {}).get(shape) or {}).get("rows", [])
        ref[shape] = next((x for x in rows if x["test"] == f"tg{n_out} @ d{n_prompt}"), None)
        pp = next((x for x in rows if x["test"] == f"pp{n_prompt}"), None)
        if ref[shape]:
            print(f"llama-bench {shape}: {ref[shape]['test']} {ref[shape]['avg_ts']:.1f} tok/s (spread "
                  f"{ref[shape]['spread']:.1%}), {pp['test'] if pp else 'pp'} "
                  f"{pp['avg_ts'] if pp else float('nan'):.1f}", flush=True)
    if a.stall:
        try:
            doc["stall"] = stall_probe(p, log_dir)
        except RuntimeError as e:
            doc["stall"] = {"error": str(e)}
        a.out.write_text(json.dumps(doc, indent=1))
    for name in names:
        v = one_variant(p, name, a.requests, log_dir)
        for shape, s in v.get("shapes", {}).items():
            d = (s.get("decode_tps") or {}).get("median")
            if d and ref.get(shape):
                s["ratio_to_llama_bench_tg"] = round(d / ref[shape]["avg_ts"], 4)
            print(f"{name:32s} {shape:10s} decode {d} ({s.get('ratio_to_llama_bench_tg')}) prefill "
                  f"{(s.get('prefill_tps') or {}).get('median')} outside {(s.get('outside_s') or {}).get('median')} s"
                  f"{' ' + s['error'] if 'error' in s else ''}", flush=True)
        if "error" in v:
            print(f"{name}: {v['error']}", flush=True)
        doc["variants"].append(v)
        a.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
