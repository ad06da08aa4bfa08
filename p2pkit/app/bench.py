"""`p2pkit bench`: measure the served engine the way the seeds did, and gate nothing.

Fixed prompt and output lengths (P13), warm-up requests left out, N timed requests one at a time;
throughput from the server's own accounting (P15): llama.cpp's per-response `timings` and its
/metrics counters, vLLM's /metrics counters, NInfer's per-request JSONL log line. The client's
wall time is reported beside them, never instead (seed 000: client SSE timing read 4.5x low).

Seed 000's whole method ("Benchmark" section): the same requests in every arm at temperature 0,
two workload shapes (decode-heavy: a short prompt, a long output; production: a long prompt, a
short output), and concurrency levels with per-stream and aggregate figures. A level runs C
streams at once, each sending its requests one after another; per-stream tok/s is each request's
own server figure, aggregate tok/s is the output tokens the server counted over the level's wall
time. The lengths the server really ran (its prompt_n and predicted_n) are checked against the
lengths asked for (P13). `--reference` (llama.cpp) runs llama-bench on the same GPU, model and
lengths, decode at the same depth (a served request decodes after its prompt; llama-bench's plain
tg decodes from an empty context), read by p2pkit.parse.llama_bench, and gives the served figures
as ratios of it.

`--ab KEY=VALUE` runs a second arm with one profile setting changed (the P2P-off arm is
`serve.env.NCCL_P2P_DISABLE=1`, P17): the service is re-rendered and restarted with it, the same
requests run, and the files the service stage writes are put back byte for byte and the service
restarted as it was, also after a failure or Ctrl-C."""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from p2pkit.core import config
from p2pkit.core.errors import GateError, P2pkitError, UsageError
from p2pkit.host import engine_api
from p2pkit.parse import engine_api as pe
from p2pkit.rules import engine_cmd

SCHEMA = 1
UNIT_FILES = ("/etc/systemd/system/p2pkit-engine.service", "/etc/p2pkit/engine.env",
              "/etc/systemd/system/p2pkit.slice")
PROMPT_WORD = " gpu"  # one token per repeat in the tiny tokenizer and in most BPE vocabularies
# seed 000's two workload shapes: (prompt tokens, output tokens)
SHAPES = {"decode": (128, 512), "production": (2048, 128)}
PER_REQUEST_UNDER_CONCURRENCY = ("llamacpp",)  # each response carries its own server figures


def gate(ctx) -> None:
    """bench runs only on a host whose service stage is done (exit 3 otherwise)."""
    from p2pkit.app import pipeline

    states = {s.stage: s for s in pipeline.evaluate(ctx, recheck=False)}
    svc = states.get("service")
    if svc is None or svc.state != pipeline.DONE:
        why = f"{svc.state}{': ' + svc.reason if svc and svc.reason else ''}" if svc else "not run"
        raise GateError(f"the service stage is not done ({why}), so there is no proven engine to benchmark",
                        hint="run `p2pkit up` first (bench measures the service the service stage proved)")


def prompt(n_tokens: int) -> str:
    return "The" + PROMPT_WORD * max(0, n_tokens - 2)


class Reader:
    """One engine's own accounting, read around each timed request of an arm (P15): never the
    client's clock, which is kept beside it (client_s, client_tps)."""

    def __init__(self, ctx, p):
        self.ctx, self.p, self.base = ctx, p, engine_cmd.base_url(p)

    def start(self) -> None:
        """Before the first timed request (after the warm-up)."""

    def request(self, n_prompt: int, n_out: int) -> dict:
        raise NotImplementedError

    def finish(self, arm: dict) -> None:
        """After the last one: the arm's totals from the same accounting."""

    @staticmethod
    def with_client(figures: dict, client_s: float) -> dict:
        n = figures.get("predicted_n") or 0
        return {"ok": True, **figures, "client_s": client_s,
                "client_tps": round(n / client_s, 3) if client_s else None}


class Llamacpp(Reader):
    """llama-server: each /completion response's `timings`, /metrics llamacpp:* around the arm. The
    prompt is one token of the model's own vocabulary repeated: exactly the asked length (P13)."""

    token: int | None = None

    def start(self) -> None:
        self.before = engine_api.metrics(self.base, "llamacpp:")

    def request(self, n_prompt: int, n_out: int) -> dict:
        if self.token is None:
            self.token = engine_api.llamacpp_token(self.base)
        text = [self.token] * n_prompt if self.token is not None else prompt(n_prompt)
        r = engine_api.llamacpp_completion(self.base, n_out, text)
        if r.get("status") != 200:
            return {"ok": False, "error": r.get("error"), "status": r.get("status")}
        return self.with_client(pe.llamacpp_figures(r.get("timings") or {}), r["client_seconds"])

    def finish(self, arm: dict) -> None:
        after = engine_api.metrics(self.base, "llamacpp:")  # arm: the level it closes
        arm["metrics_status"] = after["status"]
        if self.before["status"] == 200 and after["status"] == 200:
            arm["metrics_delta"] = pe.deltas(self.before["values"], after["values"])


class Vllm(Reader):
    """vLLM: its /metrics read before and after each request (one at a time, so each delta is that
    request's), the response's `usage` kept beside them."""

    def __init__(self, ctx, p):
        super().__init__(ctx, p)
        self.model = engine_cmd.served_model(p)
        self.first = self.last = None

    def _metrics(self) -> dict:
        return engine_api.metrics(self.base, "vllm:")

    def start(self) -> None:
        self.first = self.last = self._metrics()

    def request(self, n_prompt: int, n_out: int) -> dict:
        before = self.last or self._metrics()
        r = engine_api.openai_request(self.base, "/v1/completions", {
            "model": self.model, "prompt": prompt(n_prompt), "max_tokens": n_out, "temperature": 0,
            "ignore_eos": True})
        after = self.last = self._metrics()
        if r.get("status") != 200:
            return {"ok": False, "error": r.get("error"), "status": r.get("status")}
        if before["status"] != 200 or after["status"] != 200:
            return {"ok": False, "status": after["status"],
                    "error": f"vLLM's /metrics answered {after['status']}: no server-side figures for this request"}
        f = pe.vllm_figures(pe.deltas(before["values"], after["values"]))
        if f.pop("requests") != 1:
            return {"ok": False, "status": 200, "error": "the /metrics deltas around this request cover other "
                    "requests too: bench needs the server to itself"}
        return self.with_client({**f, "usage": r.get("usage")}, r["client_seconds"])

    def finish(self, arm: dict) -> None:
        last = self.last or self._metrics()
        arm["metrics_status"] = last["status"]
        if self.first["status"] == 200 and last["status"] == 200:
            arm["metrics_delta"] = pe.deltas(self.first["values"], last["values"])


class Ninfer(Reader):
    """NInfer: the `request_done` line its JSONL request log (--request-log-jsonl) gains per request."""

    def __init__(self, ctx, p):
        super().__init__(ctx, p)
        self.log = request_log(ctx, p)
        self.model = engine_cmd.served_model(p)
        self.offset = engine_api.log_size(self.log)
        self.done: list[dict] = []

    def start(self) -> None:
        self.offset = engine_api.log_size(self.log)
        self.done = []

    def request(self, n_prompt: int, n_out: int) -> dict:
        r = engine_api.openai_request(self.base, "/v1/chat/completions", {
            "model": self.model, "messages": [{"role": "user", "content": prompt(n_prompt)}], "max_tokens": n_out,
            "temperature": 0, "stream": False})
        recs, self.offset = engine_api.log_since(self.log, self.offset)
        events = pe.ninfer_done(recs)
        if r.get("status") != 200:
            return {"ok": False, "error": r.get("error"), "status": r.get("status")}
        if len(events) != 1 or events[0]["event"] != "request_done":
            why = (events[-1].get("error") or {}).get("message") if events else None
            return {"ok": False, "status": 200, "error": why or f"{len(events)} request_done line(s) in {self.log} "
                    "for this one request: bench needs the server to itself and its request log on"}
        self.done.append(events[0])
        return self.with_client({**pe.ninfer_figures(events[0]), "usage": r.get("usage")}, r["client_seconds"])

    def finish(self, arm: dict) -> None:
        t = [pe.ninfer_figures(e) for e in self.done]
        arm["log_totals"] = {"requests": len(t), "prompt_tokens": sum(x["prompt_n"] for x in t),
                             "completion_tokens": sum(x["predicted_n"] for x in t),
                             "prefill_seconds": round(sum(x["prompt_ms"] for x in t) / 1000, 6),
                             "decode_seconds": round(sum(x["predicted_ms"] for x in t) / 1000, 6)}


def request_log(ctx, p):
    """Where NInfer's JSONL request log is on this host (engine_cmd.request_log); refused when it keeps none."""
    path = engine_cmd.request_log(p, ctx.host, ctx.store.dir)
    if path is None:
        raise P2pkitError("NInfer keeps its own per-request figures only in its JSONL request log, and "
                          "serve.flags.request-log-jsonl is not set, so bench has no server-side accounting to read "
                          "(client timing alone is not a measurement, P15)",
                          hint='set serve.flags.request-log-jsonl = "requests.jsonl" (the built-in profile does) and '
                               "run `p2pkit up --from service` to restart the engine with it")
    return path


READERS = {"llamacpp": Llamacpp, "vllm": Vllm, "ninfer": Ninfer}


def one_request(reader: Reader, n_prompt: int, n_out: int) -> dict:
    """One timed request and the server's own accounting of it."""
    return reader.request(n_prompt, n_out)


def _stats(values: list) -> dict | None:
    v = [x for x in values if isinstance(x, int | float)]
    if not v:
        return None
    return {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3), "n": len(v)}


def run_arm(ctx, p, name: str, n_prompt: int, n_out: int, warmup: int, requests: int,
            levels: list[tuple[str, int, int, int]] | None = None) -> dict:
    """Warm-up requests (left out), then each level (shape, prompt, output, concurrency): C streams at
    once, N timed requests each, the engine's accounting read around the level. A request that fails
    stops the arm: what was done so far is kept, with the error. The arm's own `requests` and
    `summary` are its first level's (the headline, as before levels existed)."""
    levels = levels or [("profile", n_prompt, n_out, 1)]
    reader = READERS[p.engine.recipe](ctx, p)
    arm: dict = {"arm": name, "overrides": list(p.overrides), "requests": [], "warmup": warmup, "levels": []}
    for _ in range(warmup):
        w = one_request(reader, levels[0][1], levels[0][2])
        if not w.get("ok"):
            arm["error"] = f"warm-up request failed: {w.get('error')}"
            return arm
    for shape, lp, lo, conc in levels:
        level = run_level(ctx, reader, name, shape, lp, lo, conc, requests)
        arm["levels"].append(level)
        if "error" in level:
            arm["error"] = level["error"]
            break
    first = arm["levels"][0] if arm["levels"] else {"requests": []}
    arm["requests"] = first["requests"]
    for k in ("metrics_status", "metrics_delta", "log_totals"):
        if k in first:
            arm[k] = first[k]
    arm["summary"] = first.get("summary") or summarize(arm)
    return arm


def run_level(ctx, reader: Reader, arm_name: str, shape: str, n_prompt: int, n_out: int, conc: int,
              requests: int) -> dict:
    """C streams at once, each sending `requests` timed requests one after another."""
    level: dict = {"shape": shape, "prompt_tokens": n_prompt, "output_tokens": n_out, "concurrency": conc,
                   "requests": []}
    reader.start()
    stop = threading.Event()  # the first failed request ends every stream of the level

    def stream(i: int) -> list[dict]:
        out = []
        for _ in range(requests):
            if stop.is_set():
                break
            r = one_request(reader, n_prompt, n_out)
            r["stream"] = i
            out.append(r)
            if not r.get("ok"):
                stop.set()
                break
        return out

    with ctx.out.working(f"[bench] {arm_name}: {shape} {n_prompt}/{n_out} tokens, {conc} stream(s) x {requests}"):
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=conc) as pool:
            results = [r for rs in pool.map(stream, range(conc)) for r in rs]
        wall = time.monotonic() - t0
    bad = next((r for r in results if not r.get("ok")), None)
    level["requests"] = [r for r in results if r.get("ok")]
    level["wall_s"] = round(wall, 4)
    if bad is not None:
        level["error"] = f"a request failed: HTTP {bad.get('status')}: {bad.get('error')}"
    reader.finish(level)
    level["summary"] = summarize(level)
    out_tokens = sum(r.get("predicted_n") or 0 for r in level["requests"])
    if level["requests"] and wall > 0:
        level["summary"]["aggregate_decode_tps"] = round(out_tokens / wall, 3)
        level["summary"]["aggregate_note"] = "output tokens the server counted, over the level's wall time"
    level["summary"]["lengths"] = lengths_ran(level["requests"], n_prompt, n_out)
    return level


def lengths_ran(reqs: list[dict], n_prompt: int, n_out: int) -> dict:
    """P13: the prompt and output lengths the server says it ran, against the lengths asked for."""
    prompts = sorted({r.get("prompt_n") for r in reqs if r.get("prompt_n") is not None})
    outs = sorted({r.get("predicted_n") for r in reqs if r.get("predicted_n") is not None})
    return {"asked": [n_prompt, n_out], "prompt_n": prompts, "predicted_n": outs,
            "match": bool(reqs) and prompts == [n_prompt] and outs == [n_out]}


def levels_of(shapes: list[str] | None, concurrency: list[int] | None, n_prompt: int,
              n_out: int) -> list[tuple[str, int, int, int]]:
    """The (shape, prompt, output, concurrency) levels: each shape at each concurrency, in order."""
    named = [(s, *SHAPES[s]) for s in shapes] if shapes else [("profile", n_prompt, n_out)]
    return [(s, lp, lo, c) for s, lp, lo in named for c in (concurrency or [1])]


def summarize(arm: dict) -> dict:
    reqs = arm["requests"]
    out = {k: _stats([r.get(k) for r in reqs]) for k in ("decode_tps", "prefill_tps", "ttft_ms", "client_tps")}
    drafted = sum(r.get("draft_n") or 0 for r in reqs)
    if drafted:
        out["draft_acceptance"] = round(sum(r.get("draft_accepted") or 0 for r in reqs) / drafted, 4)
    d = arm.get("metrics_delta")
    if d and d.get("tokens_predicted_seconds_total"):  # llama-server's counters
        out["metrics_decode_tps"] = round(d["tokens_predicted_total"] / d["tokens_predicted_seconds_total"], 3)
    if d and d.get("prompt_seconds_total"):
        out["metrics_prefill_tps"] = round(d["prompt_tokens_total"] / d["prompt_seconds_total"], 3)
    if d and "generation_tokens_total" in d:  # vLLM's
        v = pe.vllm_figures(d)
        out["metrics_decode_tps"], out["metrics_prefill_tps"] = v["decode_tps"], v["prefill_tps"]
    t = arm.get("log_totals")
    if t and t["decode_seconds"]:  # NInfer's request log, summed over the arm
        out["log_decode_tps"] = round((t["completion_tokens"] - t["requests"]) / t["decode_seconds"], 3)
        out["log_prefill_tps"] = round(t["prompt_tokens"] / t["prefill_seconds"], 3) if t["prefill_seconds"] else None
    return out


def snapshot(host) -> dict[str, bytes | None]:
    return {f: (host.path(f).read_bytes() if host.path(f).is_file() else None) for f in UNIT_FILES}


def restore(ctx, saved: dict[str, bytes | None]) -> dict:
    """Put the service stage's files back byte for byte and restart the service as it was."""
    from p2pkit.core.artifacts import atomic_write
    from p2pkit.stages.service import act as service

    host = ctx.host
    for f, data in saved.items():
        path = host.path(f)
        if data is None:
            path.unlink(missing_ok=True)
        elif not path.is_file() or path.read_bytes() != data:
            atomic_write(path, data)
    from p2pkit.stages.service import launcher as service_launcher

    if service_launcher.in_use(ctx):  # no systemd as PID 1: the engine is the launcher's
        service_launcher.restart(ctx, service.SERVICE_USER)
    else:
        host.runner.run(["systemctl", "daemon-reload"], check=False)
        host.runner.run(["systemctl", "restart", service.UNIT], check=False)
    h = service.wait_health(ctx, engine_cmd.health_url(ctx.profile), ctx.profile.serve.health_timeout_s)
    same = snapshot(host) == saved
    return {"files_identical": same, "health": h["ok"]}


def switch(ctx, override: str):
    """The profile with one more override, and the service re-rendered and restarted with it."""
    from p2pkit.stages.service import act as service

    p = ctx.profile
    config.parse_override(override)  # a malformed KEY=VALUE is a usage error before anything changes
    q = config.load(p.source, (*p.overrides, override))
    actx = replace(ctx, profile=q, options={})
    service.act(actx)
    h = service.wait_health(actx, engine_cmd.health_url(q), q.serve.health_timeout_s)
    if not h["ok"]:
        raise P2pkitError(f"with {override} the service did not become healthy",
                          hint="read `p2pkit serve logs`; the unit was put back as it was")
    return q


def refuse(p, concurrency: list[int] | None, reference: bool) -> None:
    """What bench cannot do for this profile's engine, refused as usage (exit 2) before the gate, the lock
    or any request: nothing is measured or changed."""
    if p.engine.recipe not in READERS:
        raise UsageError(f"bench does not read {p.engine.recipe}'s own accounting, and client timing alone is not a "
                         "measurement (P15)", hint=f"bench measures {', '.join(sorted(READERS))}")
    if any(c > 1 for c in concurrency or []) and p.engine.recipe not in PER_REQUEST_UNDER_CONCURRENCY:
        raise UsageError(f"{p.engine.recipe}'s own accounting cannot be told apart per request when requests run at "
                         "once (vLLM's /metrics are read around each request; NInfer's log lines are read in order), "
                         "so bench runs it one request at a time",
                         hint="leave --concurrency at 1 for this engine (llama.cpp's responses carry their own "
                              "figures: it runs at any concurrency); nothing was run")
    if reference and p.engine.recipe != "llamacpp":
        raise UsageError(f"--reference runs llama-bench, which measures llama.cpp; this engine is {p.engine.recipe}",
                         hint="drop --reference for this profile; nothing was run")


def run(ctx, n_prompt: int, n_out: int, warmup: int, requests: int, ab: str | None,
        shapes: list[str] | None = None, concurrency: list[int] | None = None, reference: bool = False) -> dict:
    p = ctx.profile
    refuse(p, concurrency, reference)
    levels = levels_of(shapes, concurrency, n_prompt, n_out)
    if p.engine.recipe == "llamacpp":  # a shape the server's slots cannot hold is refused before any request
        n_ctx = engine_api.slot_context(engine_cmd.base_url(p))
        big = [(s, lp, lo) for s, lp, lo, _ in levels if n_ctx and lp + lo > n_ctx]
        if big:
            s, lp, lo = big[0]
            raise P2pkitError(f"the {s} shape needs {lp + lo} tokens a request ({lp} prompt + {lo} output) and the "
                              f"server's slots hold {n_ctx} (its /props n_ctx: the context per slot, capped by the "
                              "model's training context)",
                              hint="raise serve.flags.ctx-size (with kv-unified the slots share it) and run `p2pkit "
                                   "up --from service`, or bench a shape that fits (--prompt-tokens/--output-tokens)")
    if p.engine.recipe == "ninfer":
        request_log(ctx, p)  # refused before any request when the engine keeps no request log
    doc: dict = {"schema": SCHEMA, "kind": "p2pkit-bench", "simulated": ctx.host.simulated, "profile": p.name,
                 "engine": p.engine.recipe, "shape": {"prompt_tokens": levels[0][1], "output_tokens": levels[0][2],
                                                      "warmup": warmup, "requests": requests},
                 "levels": [{"shape": s, "prompt_tokens": lp, "output_tokens": lo, "concurrency": c}
                            for s, lp, lo, c in levels],
                 "accounting": ACCOUNTING[p.engine.recipe], "arms": []}
    doc["arms"].append(run_arm(ctx, p, "baseline", n_prompt, n_out, warmup, requests, levels))
    if ab and "error" not in doc["arms"][0]:
        saved = snapshot(ctx.host)
        try:
            q = switch(ctx, ab)
            doc["arms"].append(run_arm(ctx, q, ab, n_prompt, n_out, warmup, requests, levels))
        except P2pkitError as e:
            doc["arms"].append({"arm": ab, "requests": [], "error": e.message})
        finally:  # also on Ctrl-C: the unit goes back as it was
            doc["restored"] = restore(ctx, saved)
        base, other = (a["summary"].get("decode_tps") if a.get("summary") else None for a in doc["arms"][:2])
        if base and other:
            doc["ab_ratio_decode"] = round(other["median"] / base["median"], 4)
    if reference:
        doc["reference"] = reference_arm(ctx, p, sorted({(s, lp, lo) for s, lp, lo, _ in levels},
                                                        key=lambda x: [lv[0] for lv in levels].index(x[0])))
        doc["reference_ratios"] = reference_ratios(doc)
    return doc


def llama_bench_path(p) -> str:
    """llama-bench beside the built llama-server (the engine stage builds both: engine.targets)."""
    from pathlib import PurePosixPath

    return str(PurePosixPath(engine_cmd.binary(p)).with_name("llama-bench"))


def llama_bench_argv(ctx, p, n_prompt: int, n_out: int, reps: int = 3) -> list[str]:
    """llama-bench on the served model with the server's offload and flash-attention settings: prefill of
    the prompt from an empty context (pp at depth 0) and decode after the prompt (tg at depth n_prompt)."""
    f = p.serve.flags
    fa = f.get("flash-attn")
    argv = [str(ctx.host.path(llama_bench_path(p))), "-m", str(ctx.host.path(engine_cmd.model_path(p))),
            "-p", str(n_prompt), "-n", str(n_out), "-d", f"0,{n_prompt}", "-r", str(reps), "-o", "json"]
    if f.get("n-gpu-layers") is not None:
        argv += ["-ngl", str(f["n-gpu-layers"])]
    if fa is not None:
        argv += ["-fa", {True: "on", False: "off"}.get(fa, str(fa))]
    return argv


def reference_arm(ctx, p, shapes: list[tuple[str, int, int]]) -> dict:
    """llama-bench at each shape's lengths, read by the package's llama-bench reader. A llama-bench that
    fails or prints nothing leaves the served arms as they are and says why here."""
    from p2pkit.parse import llama_bench

    out: dict = {"tool": "llama-bench", "shapes": []}
    for shape, lp, lo in shapes:
        argv = llama_bench_argv(ctx, p, lp, lo)
        entry: dict = {"shape": shape, "prompt_tokens": lp, "output_tokens": lo, "argv": argv}
        try:
            with ctx.out.working(f"[bench] reference: llama-bench {shape} {lp}/{lo} tokens"):
                r = ctx.host.runner.run(argv, check=False, timeout=1800)
            rows = llama_bench.read(r.stdout + ("" if r.returncode == 0 else "\n" + r.stderr))
            if r.returncode != 0:
                raise llama_bench.LlamaBenchError(f"llama-bench exited {r.returncode}: "
                                                  + " | ".join(r.stderr.strip().splitlines()[-3:]))
        except (llama_bench.LlamaBenchError, P2pkitError) as e:
            entry["error"] = getattr(e, "message", None) or str(e)
            out["shapes"].append(entry)
            continue
        pp = next((x for x in rows if x.n_prompt == lp and x.n_gen == 0 and x.n_depth == 0), None)
        tg = next((x for x in rows if x.n_gen == lo and x.n_prompt == 0 and x.n_depth == lp), None)
        entry["prefill_tps"] = {"test": pp.test, "avg": pp.avg_ts, "stddev": pp.stddev_ts} if pp else None
        entry["decode_tps"] = {"test": tg.test, "avg": tg.avg_ts, "stddev": tg.stddev_ts} if tg else None
        entry["rows"] = [{"test": x.test, "avg_ts": x.avg_ts, "stddev_ts": x.stddev_ts} for x in rows]
        if pp is None or tg is None:
            entry["error"] = f"llama-bench printed no {'pp' if pp is None else 'tg'} row for these lengths"
        out["shapes"].append(entry)
    return out


def reference_ratios(doc: dict) -> list[dict]:
    """The baseline arm at concurrency 1, each shape, as a ratio of llama-bench at the same lengths."""
    base = doc["arms"][0] if doc["arms"] else {}
    out = []
    for ref in doc.get("reference", {}).get("shapes", []):
        lv = next((x for x in base.get("levels", []) if x["shape"] == ref["shape"] and x["concurrency"] == 1), None)
        if lv is None or "error" in ref:
            continue
        s = lv.get("summary") or {}
        row = {"shape": ref["shape"], "prompt_tokens": ref["prompt_tokens"], "output_tokens": ref["output_tokens"]}
        for k in ("decode_tps", "prefill_tps"):
            served, r = (s.get(k) or {}).get("median"), (ref.get(k) or {}).get("avg")
            row[k] = {"served_median": served, "llama_bench": r,
                      "ratio": round(served / r, 4) if served and r else None}
        out.append(row)
    return out


ACCOUNTING = {
    "llamacpp": "llama-server's own: each /completion response's `timings` (tools/server/server-common.cpp, "
                "server_slot_stats::to_json) and /metrics llamacpp:* counters (server-task.cpp, to_metrics)",
    "vllm": "vLLM's own: /metrics read around each request (vllm:prompt_tokens_total, vllm:generation_tokens_total, "
            "the _sum and _count of vllm:request_prefill_time_seconds, vllm:request_decode_time_seconds and "
            "vllm:time_to_first_token_seconds, vllm:spec_decode_num_draft_tokens_total and "
            "..._accepted_tokens_total; vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py), the response's "
            "`usage` beside them",
    "ninfer": "NInfer's own: the `request_done` line of its JSONL request log (--request-log-jsonl; result, "
              "timings_seconds, speculative; Neroued/ninfer src/serve/request_log.cpp), the response's `usage` "
              "beside it",
}
