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

Numbers that hold up (issue 38): each level (arm, shape, concurrency) has its own warm-up, left out. The
engine's /metrics are judged as counters: a counter lower after a level than before it, a changed engine
PID or process start time, or a /metrics that stopped answering, spoils the level; it is run once more,
and a level spoiled again is reported with the reason, never turned into a figure; gauges are read as
values, never differenced. Each request keeps the client's own clock beside the server's (time to the
answer's first byte against the server's prompt and decode time), so time spent outside the server's
timings (a stall before the slot started, HTTP, the client) shows as itself: the aggregate is given over
the level's wall time and over the time the server's own timings cover, and each stall is named.
`--reference` also runs llama-batched-bench (tools/batched-bench of the same source, read by
p2pkit.parse.batched_bench) at each shape's lengths and the levels' stream counts, against which each
level's aggregate is a ratio; llama-bench is taken with enough repetitions to judge its spread (a
reference whose spread is over 5 percent of its mean makes its ratio unreliable, and says so). With
drafting on, llama-server's own log lines ("draft acceptance = ...") are read beside the responses' and
/metrics' counts, and the three are compared.

vLLM (issue 46): at one stream its /metrics are read around each request (that request's own figures); at
several, a request keeps only its answer's `usage` and the client's clock, and the level's figures are vLLM's
counters around the whole level: its aggregate is the generated tokens vLLM counted over the level's wall time,
its per-stream decode rate the tokens after the first over the decode time vLLM summed over the level's
requests, and the counted requests and tokens must equal the answers' usage (else the level is spoiled:
something else used the server). `--reference` runs vLLM's own benchmark client (`vllm bench serve` of the
installed version, with the engine's Python) at each level's lengths and stream count, read by
p2pkit.parse.vllm_bench, against which each level's aggregate is a ratio. Which reference an engine has is its
engine module's word (BENCH["reference"], dispatched through REFERENCES), never a branch on the recipe.

`--ab KEY=VALUE` runs a second arm with one profile setting changed (the P2P-off arm is
`serve.env.NCCL_P2P_DISABLE=1`, P17): the service is re-rendered and restarted with it, the same
requests run, and the files the service stage writes are put back byte for byte and the service
restarted as it was, also after a failure or Ctrl-C."""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from p2pkit.core import config
from p2pkit.core.errors import GateError, P2pkitError, UsageError
from p2pkit.host import engine_api, system
from p2pkit.parse import engine_api as pe
from p2pkit.rules import engine_cmd
from p2pkit.rules.engines import llamacpp

SCHEMA = 1
PROMPT_WORD = " gpu"  # one token per repeat in the tiny tokenizer and in most BPE vocabularies
# seed 000's two workload shapes: (prompt tokens, output tokens)
SHAPES = {"decode": (128, 512), "production": (2048, 128)}


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
    client's clock, which is kept beside it (client_s, client_tps, client_first_byte_s)."""

    concurrency = 1  # the streams of the level being run (run_level sets it before the level's warm-up)

    def __init__(self, ctx, p):
        self.ctx, self.p, self.base = ctx, p, engine_cmd.base_url(p)
        self.identity: dict | None = None

    def start(self) -> None:
        """Before the first timed request of a level (after its warm-up)."""
        self.identity = engine_identity(self.ctx)

    def request(self, n_prompt: int, n_out: int) -> dict:
        raise NotImplementedError

    def finish(self, level: dict) -> None:
        """After the last one: the level's totals from the same accounting, and whether they hold."""

    def aggregate(self, level: dict, wall: float) -> dict:
        """The level's aggregate over its wall time (aggregate(): the output tokens of its requests' own figures)."""
        return aggregate(level["requests"], wall)

    def restarted(self) -> str | None:
        """Why the engine that ran the level is not the one that started it (its PID or its process start time
        changed, or it is gone); None when it is the same or cannot be told."""
        return restarted(self.identity, engine_identity(self.ctx))

    def judge_metrics(self, level: dict, before: dict, after: dict) -> None:
        """/metrics around a level, judged as counters: the counters' deltas and the gauges' values after it
        when they hold; a reset or a /metrics gone mid-level spoils the level with the reason."""
        level["metrics_status"] = after["status"]
        why = [w for w in (self.restarted(),) if w]
        if before["status"] == 200 and after["status"] != 200:
            why.append(f"/metrics answered {after['status']} after the level and 200 before it: the engine's "
                       "counters cannot be set against each other")
        elif before["status"] == 200:
            types = {**before.get("types", {}), **after.get("types", {})}
            reset = pe.counter_reset(before["values"], after["values"], types)
            if reset:
                why.append(reset)
            elif not why:
                level["metrics_delta"] = pe.counter_deltas(before["values"], after["values"], types)
                level["metrics_gauges"] = pe.gauges(after["values"], types)
        if why:
            level["spoiled"] = "; ".join(why)

    @staticmethod
    def with_client(figures: dict, client_s: float, times: dict | None = None) -> dict:
        """The server's figures for one request with the client's clock beside them: the seconds it waited,
        to the answer's first byte, and the part of that outside the server's own prompt and decode time."""
        n = figures.get("predicted_n") or 0
        out = {"ok": True, **figures, "client_s": client_s,
               "client_tps": round(n / client_s, 3) if client_s else None}
        times = times or {}
        if "sent" in times:
            out["sent"] = times["sent"]
        fb = times.get("first_byte_s")
        server = [figures.get(k) for k in ("prompt_ms", "predicted_ms")]
        if fb is not None:
            out["client_first_byte_s"] = round(fb, 4)
            if all(isinstance(x, int | float) for x in server):
                out["server_s"] = round(sum(server) / 1000, 4)
                out["outside_server_s"] = round(fb - out["server_s"], 4)
        return out


def engine_identity(ctx) -> dict | None:
    """The engine process as the service knows it: its main PID (systemd's, or the launcher's record) and that
    process's start time; None when it cannot be read here."""
    from p2pkit.host import system
    from p2pkit.stages.service import act as service

    try:
        pid = service.main_pid(ctx.host)
    except (P2pkitError, OSError, AttributeError):
        return None
    return {"pid": pid, "start_ticks": system.process_start(ctx.host, pid) if pid else None}


def restarted(before: dict | None, after: dict | None) -> str | None:
    if not before or not after or not before.get("pid"):
        return None
    if not after.get("pid"):
        return f"the engine (pid {before['pid']}) was not running at the end of the level"
    if after["pid"] != before["pid"]:
        return f"the engine restarted during the level: pid {before['pid']} before it, {after['pid']} after"
    if None not in (before.get("start_ticks"), after.get("start_ticks")) and \
            after["start_ticks"] != before["start_ticks"]:
        return (f"the engine restarted during the level: pid {after['pid']} is another process after it (start "
                f"time {before['start_ticks']} -> {after['start_ticks']} clock ticks after boot)")
    return None


class Llamacpp(Reader):
    """llama-server: each /completion response's `timings`, /metrics llamacpp:* around each level, and its log's
    drafting lines over the level. The prompt is one token of the model's own vocabulary repeated: exactly
    the asked length (P13)."""

    token: int | None = None

    def start(self) -> None:
        super().start()
        self.before = engine_api.metrics(self.base, "llamacpp:")
        self.mark = log_mark(self.ctx)

    def request(self, n_prompt: int, n_out: int) -> dict:
        if self.token is None:
            self.token = engine_api.llamacpp_token(self.base)
        text = [self.token] * n_prompt if self.token is not None else prompt(n_prompt)
        times: dict = {}
        r = engine_api.llamacpp_completion(self.base, n_out, text, times=times)
        if r.get("status") != 200:
            return {"ok": False, "error": r.get("error"), "status": r.get("status")}
        return self.with_client(pe.llamacpp_figures(r.get("timings") or {}), r["client_seconds"], times)

    def finish(self, level: dict) -> None:
        self.judge_metrics(level, self.before, engine_api.metrics(self.base, "llamacpp:"))
        drafted = pe.llamacpp_draft_lines(log_since(self.ctx, self.mark))
        if drafted:
            level["draft_log"] = {"tasks": len(drafted), "accepted": sum(x["accepted"] for x in drafted),
                                  "generated": sum(x["generated"] for x in drafted)}


def log_mark(ctx) -> dict | None:
    """Where the engine's log ends now (the service stage's mark), None where it cannot be read."""
    from p2pkit.stages.service import act as service

    try:
        return service.log_mark(ctx)
    except (P2pkitError, OSError, AttributeError):
        return None


def log_since(ctx, mark: dict | None) -> list[str]:
    """The engine's log lines after `mark` (none without one: a tail could hold another level's lines)."""
    from p2pkit.stages.service import act as service

    if not mark:
        return []
    try:
        return service.start_lines(ctx.host, mark)
    except (P2pkitError, OSError, AttributeError):
        return []


class Vllm(Reader):
    """vLLM: at one stream its /metrics read before and after each request (each delta is that request's own
    figures); at several, each request keeps only the response's `usage` and the client's clock (the counters'
    deltas around one request would hold the others in flight), and the level's figures are the counters' deltas
    around the whole level (vllm:generation_tokens_total, prompt_tokens_total, request_success_total, the phase
    histograms' _sum), its aggregate their tokens over the level's wall time. The deltas must count the requests
    bench sent, token for token with their usage: a level they do not is spoiled (something else used the
    server). The prompt is one token of the model's own vocabulary repeated (its /tokenize): exactly the asked
    length (P13; the text prompt() is, in a small vocabulary, a few tokens more). Each request carries its own
    cache_salt, so vLLM's prefix cache (on by default, whole 128-token blocks on the CPU build) does not serve the
    repeated prompt from the request before: every prompt is computed, as the reference's random prompts are."""

    def __init__(self, ctx, p):
        super().__init__(ctx, p)
        self.model = engine_api.served_name(self.base, engine_cmd.served_model(p))
        self.first = self.last = None
        self.salt = itertools.count()
        self.run_id = f"p2pkit-bench-{os.getpid()}-{time.monotonic_ns()}"

    def _metrics(self) -> dict:
        return engine_api.metrics(self.base, "vllm:")

    def start(self) -> None:
        super().start()
        self.first = self.last = self._metrics()

    token: int | None = None
    asked = False  # /tokenize asked once: a server without it gets the text prompt

    def _complete(self, n_prompt: int, n_out: int, times: dict) -> dict:
        if not self.asked:
            self.token, self.asked = engine_api.vllm_token(self.base, self.model), True
        text = [self.token] * n_prompt if self.token is not None else prompt(n_prompt)
        return engine_api.openai_request(self.base, "/v1/completions", {
            "model": self.model, "prompt": text, "max_tokens": n_out, "temperature": 0,
            "ignore_eos": True, "cache_salt": f"{self.run_id}-{next(self.salt)}"}, times=times)

    def request(self, n_prompt: int, n_out: int) -> dict:
        if self.concurrency > 1:
            return self._usage_only(n_prompt, n_out)
        before = self.last or self._metrics()
        times: dict = {}
        r = self._complete(n_prompt, n_out, times)
        after = self.last = self._metrics()
        if r.get("status") != 200:
            return {"ok": False, "error": r.get("error"), "status": r.get("status")}
        if before["status"] != 200 or after["status"] != 200:
            return {"ok": False, "status": after["status"],
                    "error": f"vLLM's /metrics answered {after['status']}: no server-side figures for this request"}
        types = {**before.get("types", {}), **after.get("types", {})}
        reset = pe.counter_reset(before["values"], after["values"], types)
        if reset:
            return {"ok": False, "status": 200, "spoiled": True, "error": reset}
        f = pe.vllm_figures(pe.counter_deltas(before["values"], after["values"], types))
        if f.pop("requests") != 1:
            return {"ok": False, "status": 200, "error": "the /metrics deltas around this request cover other "
                    "requests too: bench needs the server to itself"}
        return self.with_client({**f, "usage": r.get("usage")}, r["client_seconds"], times)

    def _usage_only(self, n_prompt: int, n_out: int) -> dict:
        """One of several requests in flight: the server's `usage` of it (its lengths) and the client's clock."""
        times: dict = {}
        r = self._complete(n_prompt, n_out, times)
        if r.get("status") != 200:
            return {"ok": False, "error": r.get("error"), "status": r.get("status")}
        u = r.get("usage") or {}
        if not all(isinstance(u.get(k), int) for k in ("prompt_tokens", "completion_tokens")):
            return {"ok": False, "status": 200, "error": f"vLLM's answer carries no usage ({u!r}): bench cannot "
                    "tell the lengths it ran"}
        return self.with_client({"prompt_n": u["prompt_tokens"], "predicted_n": u["completion_tokens"], "usage": u},
                                r["client_seconds"], times)

    def finish(self, level: dict) -> None:
        self.judge_metrics(level, self.first, self._metrics())
        self.last = None  # the next request at one stream reads its own "before"
        d = level.get("metrics_delta")
        if d is None:
            return
        got, reqs = pe.vllm_counted(d), level["requests"]
        sent = {"requests": len(reqs), "prompt_tokens": sum((r.get("usage") or {}).get("prompt_tokens") or 0
                                                            for r in reqs),
                "completion_tokens": sum((r.get("usage") or {}).get("completion_tokens") or 0 for r in reqs)}
        agree = (got["requests"], got["prompt_tokens"], got["generation_tokens"]) == \
            (sent["requests"], sent["prompt_tokens"], sent["completion_tokens"])
        level["counted"] = {**got, "usage": sent, "agree": agree}
        if not agree and "error" not in level and not level.get("spoiled"):
            level["spoiled"] = (f"vLLM counted {got['requests']} requests, {got['prompt_tokens']} prompt and "
                                f"{got['generation_tokens']} generated tokens over the level, and its answers' usage "
                                f"says {sent['requests']}, {sent['prompt_tokens']} and {sent['completion_tokens']}: "
                                "other requests shared the server (bench needs it to itself)")

    def aggregate(self, level: dict, wall: float) -> dict:
        """The level's aggregate from vLLM's own counters: the tokens it counted over the level's wall time (and at
        one stream over the time its per-request figures cover, as aggregate() places them)."""
        out = aggregate(level["requests"], wall)
        c = level.get("counted")
        if not c or wall <= 0:
            return out
        out.update(aggregate_decode_tps=round(c["generation_tokens"] / wall, 3),
                   aggregate_prefill_tps=round(c["prompt_tokens"] / wall, 3),
                   requests_per_s=round(c["requests"] / wall, 3), wall_s=round(wall, 4),
                   aggregate_note="output tokens vLLM counted over the level (the delta of "
                                  "vllm:generation_tokens_total), over the level's wall time")
        if out.get("server_span_s"):
            out["aggregate_server_decode_tps"] = round(c["generation_tokens"] / out["server_span_s"], 3)
        return out


class Ninfer(Reader):
    """NInfer: the `request_done` line its JSONL request log (--request-log-jsonl) gains per request."""

    def __init__(self, ctx, p):
        super().__init__(ctx, p)
        self.log = request_log(ctx, p)
        self.model = engine_cmd.served_model(p)
        self.offset = engine_api.log_size(self.log)
        self.done: list[dict] = []

    def start(self) -> None:
        super().start()
        self.offset = engine_api.log_size(self.log)
        self.done = []

    def request(self, n_prompt: int, n_out: int) -> dict:
        times: dict = {}
        r = engine_api.openai_request(self.base, "/v1/chat/completions", {
            "model": self.model, "messages": [{"role": "user", "content": prompt(n_prompt)}], "max_tokens": n_out,
            "temperature": 0, "stream": False}, times=times)
        recs, self.offset = engine_api.log_since(self.log, self.offset)
        events = pe.ninfer_done(recs)
        if r.get("status") != 200:
            return {"ok": False, "error": r.get("error"), "status": r.get("status")}
        if len(events) != 1 or events[0]["event"] != "request_done":
            why = (events[-1].get("error") or {}).get("message") if events else None
            return {"ok": False, "status": 200, "error": why or f"{len(events)} request_done line(s) in {self.log} "
                    "for this one request: bench needs the server to itself and its request log on"}
        self.done.append(events[0])
        return self.with_client({**pe.ninfer_figures(events[0]), "usage": r.get("usage")}, r["client_seconds"], times)

    def finish(self, arm: dict) -> None:
        why = self.restarted()
        if why:
            arm["spoiled"] = why
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


# how bench reads an engine's own accounting, by the way its engine module says it keeps it (rules/engines: BENCH)
READERS = {"timings": Llamacpp, "metrics": Vllm, "request_log": Ninfer}


def bench_of(p) -> dict:
    """What the profile's engine module says of its own accounting: how bench reads it (accounting), whether
    requests may run at once (concurrent), the reference tool, and what it is (says); nothing for an engine
    p2pkit has no module for."""
    from p2pkit.rules.engines import ENGINES

    engine = ENGINES.get(p.engine.recipe)
    return engine.BENCH if engine is not None else {"accounting": None, "concurrent": False, "reference": None}


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
    """Each level (shape, prompt, output, concurrency): its own warm-up (left out), then C streams at once, N
    timed requests each, the engine's accounting read around the level. A level whose accounting does not hold
    (spoiled: the engine restarted, its counters went down, /metrics went away) runs once more; spoiled again,
    it is kept with the reason and no figure. A request that fails stops the arm: what was done so far is
    kept, with the error. The arm's own `requests` and `summary` are its first level's (the headline, as
    before levels existed)."""
    levels = levels or [("profile", n_prompt, n_out, 1)]
    reader = READERS[bench_of(p)["accounting"]](ctx, p)
    arm: dict = {"arm": name, "overrides": list(p.overrides), "requests": [], "warmup": warmup,
                 "warmup_note": "warm-up requests before each level, at its shape and concurrency, left out",
                 "levels": []}
    for shape, lp, lo, conc in levels:
        level = run_level(ctx, reader, name, shape, lp, lo, conc, requests, warmup)
        if level.get("spoiled") and "error" not in level:
            again = run_level(ctx, reader, name, shape, lp, lo, conc, requests, warmup)
            again["spoiled_runs"] = [level["spoiled"], *([again["spoiled"]] if again.get("spoiled") else [])]
            level = again
        arm["levels"].append(level)
        if "error" in level:
            arm["error"] = level["error"]
            break
    first = arm["levels"][0] if arm["levels"] else {"requests": []}
    arm["requests"] = first["requests"]
    for k in ("metrics_status", "metrics_delta", "metrics_gauges", "log_totals", "spoiled", "draft_log"):
        if k in first:
            arm[k] = first[k]
    arm["summary"] = first.get("summary") or summarize(arm)
    return arm


def warm(reader: Reader, n_prompt: int, n_out: int, conc: int, rounds: int) -> dict | None:
    """`rounds` rounds of `conc` requests at once at this shape, left out; the first failure, or None."""
    for _ in range(rounds):
        with ThreadPoolExecutor(max_workers=conc) as pool:
            got = list(pool.map(lambda _i: one_request(reader, n_prompt, n_out), range(conc)))
        bad = next((w for w in got if not w.get("ok")), None)
        if bad:
            return bad
    return None


def run_level(ctx, reader: Reader, arm_name: str, shape: str, n_prompt: int, n_out: int, conc: int,
              requests: int, warmup: int = 0) -> dict:
    """The level's warm-up, then C streams at once, each sending `requests` timed requests one after another."""
    level: dict = {"shape": shape, "prompt_tokens": n_prompt, "output_tokens": n_out, "concurrency": conc,
                   "warmup": warmup, "requests": []}
    reader.concurrency = conc
    with ctx.out.working(f"[bench] {arm_name}: {shape} {n_prompt}/{n_out} tokens, {conc} stream(s): warm-up"):
        bad = warm(reader, n_prompt, n_out, conc, warmup)
    if bad is not None:
        level["error"] = f"warm-up request failed: HTTP {bad.get('status')}: {bad.get('error')}"
        level["summary"] = {"lengths": lengths_ran([], n_prompt, n_out)}
        return level
    reader.start()
    stop = threading.Event()  # the first failed request ends every stream of the level

    def stream(i: int) -> list[dict]:
        out = []
        for j in range(requests):
            if stop.is_set():
                break
            r = one_request(reader, n_prompt, n_out)
            r["stream"], r["index"] = i, j
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
    for r in results:  # the client's clock, from the level's start
        if "sent" in r:
            r["at_s"] = round(r.pop("sent") - t0, 4)
    bad = next((r for r in results if not r.get("ok")), None)
    level["requests"] = [r for r in results if r.get("ok")]
    level["wall_s"] = round(wall, 4)
    if bad is not None and bad.get("spoiled"):
        level["spoiled"] = bad["error"]
    elif bad is not None:
        level["error"] = f"a request failed: HTTP {bad.get('status')}: {bad.get('error')}"
    reader.finish(level)
    level["summary"] = summarize(level)
    if not level.get("spoiled"):
        level["summary"].update(reader.aggregate(level, wall))
    level["summary"]["lengths"] = lengths_ran(level["requests"], n_prompt, n_out)
    return level


STALL_S = 0.1       # a request whose time outside the server's timings is over this
STALL_SHARE = 0.2   # and over this share of its server time is named as a stall


def aggregate(reqs: list[dict], wall: float) -> dict:
    """A level's aggregate decode throughput, defined so a stall outside the server shows as itself: output
    tokens over the level's wall time (what a client got), and over the time the server's own timings cover
    (each request's prompt and decode time, placed to end at its answer's first byte at the client; their
    union); the difference is time no request was in the server's hands, and each request whose time
    outside the server is large is named."""
    out_tokens = sum(r.get("predicted_n") or 0 for r in reqs)
    if not reqs or wall <= 0:
        return {}
    out: dict = {"aggregate_decode_tps": round(out_tokens / wall, 3), "wall_s": round(wall, 4),
                 "aggregate_note": "output tokens the server counted, over the level's wall time"}
    spans = sorted((r["at_s"] + r["client_first_byte_s"] - r["server_s"], r["at_s"] + r["client_first_byte_s"])
                   for r in reqs if None not in (r.get("at_s"), r.get("client_first_byte_s"), r.get("server_s")))
    if len(spans) == len(reqs):
        covered, end = 0.0, float("-inf")
        for a, b in spans:
            covered += max(0.0, b - max(a, end))
            end = max(end, b)
        out["server_span_s"] = round(covered, 4)
        out["outside_server_s"] = round(wall - covered, 4)
        out["aggregate_server_decode_tps"] = round(out_tokens / covered, 3) if covered > 0 else None
        out["outside_per_request_s"] = _stats([r.get("outside_server_s") for r in reqs])
        out["stalls"] = [{"stream": r.get("stream"), "index": r.get("index"), "client_first_byte_s":
                          r["client_first_byte_s"], "server_s": r["server_s"], "outside_s": r["outside_server_s"]}
                         for r in reqs if r["outside_server_s"] > max(STALL_S, STALL_SHARE * r["server_s"])]
    return out


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
    """The figures of a level (or an arm's headline level) from the server's own accounting; none for a
    spoiled one, which keeps only its reason."""
    if arm.get("spoiled"):
        return {"spoiled": arm["spoiled"]}
    reqs = arm["requests"]
    out = {k: _stats([r.get(k) for r in reqs]) for k in ("decode_tps", "prefill_tps", "ttft_ms", "client_tps")}
    d = arm.get("metrics_delta")
    drafted = sum(r.get("draft_n") or 0 for r in reqs)
    if drafted:
        out["draft_acceptance"] = round(sum(r.get("draft_accepted") or 0 for r in reqs) / drafted, 4)
    draft = draft_sources(reqs, d, arm.get("draft_log"))
    if draft:
        out["draft_sources"] = draft
    if d and d.get("tokens_predicted_seconds_total"):  # llama-server's counters
        out["metrics_decode_tps"] = round(d["tokens_predicted_total"] / d["tokens_predicted_seconds_total"], 3)
    if d and d.get("prompt_seconds_total"):
        out["metrics_prefill_tps"] = round(d["prompt_tokens_total"] / d["prompt_seconds_total"], 3)
    if d and "generation_tokens_total" in d:  # vLLM's
        v = pe.vllm_figures(d)
        out["metrics_decode_tps"], out["metrics_prefill_tps"] = v["decode_tps"], v["prefill_tps"]
        out["metrics_ttft_ms"] = v["ttft_ms"]
    t = arm.get("log_totals")
    if t and t["decode_seconds"]:  # NInfer's request log, summed over the arm
        out["log_decode_tps"] = round((t["completion_tokens"] - t["requests"]) / t["decode_seconds"], 3)
        out["log_prefill_tps"] = round(t["prompt_tokens"] / t["prefill_seconds"], 3) if t["prefill_seconds"] else None
    return out


def draft_sources(reqs: list[dict], delta: dict | None, log: dict | None) -> dict | None:
    """Drafting's accepted and drafted counts over a level from each source that has them: the responses'
    timings (draft_n, draft_n_accepted), /metrics' counters (spec_decode_num_accepted_tokens_total,
    spec_decode_num_draft_tokens_total) and llama-server's own log lines; whether they agree."""
    src: dict = {}
    if any(r.get("draft_n") is not None for r in reqs):
        src["responses"] = {"accepted": sum(r.get("draft_accepted") or 0 for r in reqs),
                            "drafted": sum(r.get("draft_n") or 0 for r in reqs)}
    if delta and "spec_decode_num_draft_tokens_total" in delta:
        src["metrics"] = {"accepted": int(delta.get("spec_decode_num_accepted_tokens_total") or 0),
                          "drafted": int(delta["spec_decode_num_draft_tokens_total"])}
    if log:
        src["log"] = {"accepted": log["accepted"], "drafted": log["generated"], "tasks": log["tasks"]}
    if not any(s["drafted"] for s in src.values()):
        return None
    for s in src.values():
        s["acceptance"] = round(s["accepted"] / s["drafted"], 4) if s["drafted"] else None
    counts = {(s["accepted"], s["drafted"]) for s in src.values()}
    return {**src, "agree": len(counts) == 1 if len(src) > 1 else None}


def snapshot(host) -> dict[str, bytes | None]:
    return {f: (host.path(f).read_bytes() if host.path(f).is_file() else None) for f in unit_files()}


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
        service_launcher.restart(ctx, system.ENGINE_USER)
    else:
        host.runner.run(["systemctl", "daemon-reload"], check=False)
        host.runner.run(["systemctl", "restart", system.ENGINE_UNIT], check=False)
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
    b = bench_of(p)
    if b["accounting"] not in READERS:
        raise UsageError(f"bench does not read {p.engine.recipe}'s own accounting, and client timing alone is not a "
                         "measurement (P15)", hint=f"bench reads an engine's {', '.join(sorted(READERS))}")
    if any(c > 1 for c in concurrency or []) and not b["concurrent"]:
        raise UsageError(f"{p.engine.recipe}'s own accounting cannot be told apart per request when requests run at "
                         "once (NInfer's log lines are read in order, each for the request just answered), so bench "
                         "runs it one request at a time",
                         hint="leave --concurrency at 1 for this engine (llama.cpp's responses carry their own "
                              "figures and vLLM's counters are read around a whole level: they run at any "
                              "concurrency); nothing was run")
    if reference and b["reference"] not in REFERENCES:
        raise UsageError(f"--reference runs an engine's own benchmark beside the served figures (llama.cpp's "
                         f"llama-bench, vLLM's vllm bench serve), and p2pkit has none for {p.engine.recipe}",
                         hint="drop --reference for this profile; nothing was run")


def refuse_ab(p, ab: str | None) -> None:
    """--ab's one change, refused as usage (exit 2) before the gate, the lock or any request, as `up` refuses it
    with --set: not KEY=VALUE, a profile that does not load with it, or a value the engine's start refuses where
    the profile without it passes (--tp 3 on two GPUs: issue 47 item 6). Nothing is run or written."""
    if ab is None:
        return
    try:
        config.parse_override(ab)
        q = config.load(p.source, (*p.overrides, ab), p.stored_secrets)
    except P2pkitError as e:
        key = ab.partition("=")[0].strip()
        message = e.message.replace(f"--set {ab!r}", f"--ab {ab!r}").replace(f"--set {key}", f"--ab {key}")
        raise UsageError(message, hint="give --ab one SECTION.KEY=VALUE the profile takes, like "
                                       "serve.env.NCCL_P2P_DISABLE=1; nothing was run") from e
    refused = engine_cmd.refused_by(q, p)
    if refused:
        raise UsageError(f"--ab {ab} gives the engine a start it refuses: " + "; ".join(
            f"{c.id} ({c.title}): {c.measured} (expected {c.expected}); {c.hint}" for c in refused),
            hint="give --ab a value the engine starts with; nothing was run")


def run(ctx, n_prompt: int, n_out: int, warmup: int, requests: int, ab: str | None,
        shapes: list[str] | None = None, concurrency: list[int] | None = None, reference: bool = False) -> dict:
    p = ctx.profile
    refuse(p, concurrency, reference)
    refuse_ab(p, ab)
    levels = levels_of(shapes, concurrency, n_prompt, n_out)
    if bench_of(p)["accounting"] == "timings":  # a shape llama-server's slots cannot hold is refused before any request
        n_ctx = engine_api.slot_context(engine_cmd.base_url(p))
        big = [(s, lp, lo) for s, lp, lo, _ in levels if n_ctx and lp + lo > n_ctx]
        if big:
            s, lp, lo = big[0]
            raise P2pkitError(f"the {s} shape needs {lp + lo} tokens a request ({lp} prompt + {lo} output) and the "
                              f"server's slots hold {n_ctx} (its /props n_ctx: the context per slot, capped by the "
                              "model's training context)",
                              hint="raise serve.flags.ctx-size (with kv-unified the slots share it) and run `p2pkit "
                                   "up --from service`, or bench a shape that fits (--prompt-tokens/--output-tokens)")
    if bench_of(p)["accounting"] == "request_log":
        request_log(ctx, p)  # refused before any request when the engine keeps no request log
    doc: dict = {"schema": SCHEMA, "kind": "p2pkit-bench", "simulated": ctx.host.simulated, "profile": p.name,
                 "engine": p.engine.recipe, "shape": {"prompt_tokens": levels[0][1], "output_tokens": levels[0][2],
                                                      "warmup": warmup, "requests": requests},
                 "levels": [{"shape": s, "prompt_tokens": lp, "output_tokens": lo, "concurrency": c}
                            for s, lp, lo, c in levels],
                 "accounting": bench_of(p)["says"], "arms": []}
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
        REFERENCES[bench_of(p)["reference"]](ctx, p, doc, levels, warmup, requests)
    return doc


def shapes_of(levels: list[tuple[str, int, int, int]]) -> list[tuple[str, int, int, list[int]]]:
    """Each shape the levels ran, in their order, with its lengths and its levels' stream counts."""
    order = [lv[0] for lv in levels]
    shapes = sorted({(s, lp, lo) for s, lp, lo, _ in levels}, key=lambda x: order.index(x[0]))
    return [(s, lp, lo, sorted({c for s2, _, _, c in levels if s2 == s})) for s, lp, lo in shapes]


def llama_references(ctx, p, doc: dict, levels: list, warmup: int, requests: int) -> None:
    """llama.cpp's: llama-bench at each shape (one stream), llama-batched-bench at the levels' stream counts."""
    shapes = shapes_of(levels)
    doc["reference"] = reference_arm(ctx, p, [(s, lp, lo) for s, lp, lo, _ in shapes])
    doc["reference_ratios"] = reference_ratios(doc)
    doc["batched_reference"] = batched_arm(ctx, p, shapes)
    doc["batched_ratios"] = batched_ratios(doc)


def serve_references(ctx, p, doc: dict, levels: list, warmup: int, requests: int) -> None:
    """vLLM's: its own benchmark client at each level's lengths and concurrency."""
    doc["serve_reference"] = serve_arm(ctx, p, shapes_of(levels), warmup, requests)
    doc["serve_ratios"] = serve_ratios(doc)


REFERENCE_REPS = 10   # llama-bench's repetitions: enough to judge its spread
SPREAD_MAX = 0.05     # a reference whose spread (stddev / mean) is over this makes its ratio unreliable
BATCHED_REPS = 3      # llama-batched-bench runs per shape (it has no repetitions of its own)


def llama_bench_path(p) -> str:
    """llama-bench beside the built llama-server (the engine stage builds both: engine.targets)."""
    return tool_path(p, "llama-bench")


def tool_path(p, name: str) -> str:
    """A llama.cpp tool beside the built llama-server."""
    from pathlib import PurePosixPath

    return str(PurePosixPath(engine_cmd.binary(p)).with_name(name))


def llama_bench_argv(ctx, p, n_prompt: int, n_out: int, reps: int = REFERENCE_REPS) -> list[str]:
    """llama-bench on the served model with the server's offload and flash-attention settings: prefill of
    the prompt from an empty context (pp at depth 0) and decode after the prompt (tg at depth n_prompt)."""
    return [str(ctx.host.path(llama_bench_path(p))), "-m", str(ctx.host.path(engine_cmd.model_path(p))),
            "-p", str(n_prompt), "-n", str(n_out), "-d", f"0,{n_prompt}", "-r", str(reps), "-o", "json",
            *llamacpp.bench_flags(p.serve.flags)]


def spread(avg: float | None, stddev: float | None) -> dict:
    """A reference figure's spread as a share of its mean, and whether a ratio to it can be trusted."""
    if not avg or stddev is None:
        return {"spread": None, "reliable": False}
    s = round(stddev / avg, 4)
    return {"spread": s, "reliable": s <= SPREAD_MAX}


def reference_arm(ctx, p, shapes: list[tuple[str, int, int]]) -> dict:
    """llama-bench at each shape's lengths, read by the package's llama-bench reader, with REFERENCE_REPS
    repetitions and each figure's spread. A llama-bench that fails or prints nothing leaves the served arms
    as they are and says why here."""
    from p2pkit.parse import llama_bench

    out: dict = {"tool": "llama-bench", "reps": REFERENCE_REPS, "spread_max": SPREAD_MAX, "shapes": []}
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
        entry["prefill_tps"] = {"test": pp.test, "avg": pp.avg_ts, "stddev": pp.stddev_ts,
                                **spread(pp.avg_ts, pp.stddev_ts)} if pp else None
        entry["decode_tps"] = {"test": tg.test, "avg": tg.avg_ts, "stddev": tg.stddev_ts,
                               **spread(tg.avg_ts, tg.stddev_ts)} if tg else None
        entry["rows"] = [{"test": x.test, "avg_ts": x.avg_ts, "stddev_ts": x.stddev_ts,
                          "samples_ts": list(x.samples_ts)} for x in rows]
        if pp is None or tg is None:
            entry["error"] = f"llama-bench printed no {'pp' if pp is None else 'tg'} row for these lengths"
        out["shapes"].append(entry)
    return out


def reference_ratios(doc: dict) -> list[dict]:
    """The baseline arm at concurrency 1, each shape, as a ratio of llama-bench at the same lengths; a ratio
    whose reference spread is over SPREAD_MAX is marked unreliable, with the spread."""
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
                      "ratio": round(served / r, 4) if served and r else None,
                      "reference_spread": (ref.get(k) or {}).get("spread")}
            if row[k]["ratio"] is not None and not (ref.get(k) or {}).get("reliable", True):
                row[k]["unreliable"] = (f"llama-bench's spread is {row[k]['reference_spread']:.1%} of its mean over "
                                        f"{doc['reference'].get('reps', '?')} repetitions (over {SPREAD_MAX:.0%})")
        if s.get("spoiled"):
            row["spoiled"] = s["spoiled"]
        out.append(row)
    return out


def batched_argv(ctx, p, n_prompt: int, n_out: int, streams: list[int]) -> list[str]:
    """llama-batched-bench on the served model with the server's model and context settings (the same common
    flags: offload, flash attention, unified KV, batch sizes, KV types, threads), C sequences of the shape at
    once for each level's C, JSONL out. Its -c holds the largest level (it skips one that does not fit
    without a word)."""
    from p2pkit.parse.batched_bench import kv_needed

    f = p.serve.flags
    need = max(kv_needed(n_prompt, n_out, c) for c in streams)
    c = llamacpp.batched_context(f, need)
    return [str(ctx.host.path(tool_path(p, "llama-batched-bench"))), "-m", str(ctx.host.path(engine_cmd.model_path(p))),
            "-c", str(c), "-npp", str(n_prompt), "-ntg", str(n_out), "-npl", ",".join(str(x) for x in streams),
            "--output-format", "jsonl", *llamacpp.batched_flags(f)]


def batched_arm(ctx, p, shapes: list[tuple[str, int, int, list[int]]]) -> dict:
    """llama-batched-bench at each shape and the levels' stream counts, BATCHED_REPS runs, read by the package's
    reader: per level, generated tokens over its whole time (pl*tg / T, the prompts' time included, as a
    served level's aggregate is over its wall time), the median and spread of the runs. A tool that is not
    built, fails or prints nothing leaves the other arms as they are and says so here."""
    from p2pkit.parse import batched_bench as bb

    out: dict = {"tool": "llama-batched-bench", "runs": BATCHED_REPS, "spread_max": SPREAD_MAX, "shapes": []}
    exe = tool_path(p, "llama-batched-bench")
    for shape, lp, lo, streams in shapes:
        entry: dict = {"shape": shape, "prompt_tokens": lp, "output_tokens": lo, "streams": streams}
        out["shapes"].append(entry)
        if not ctx.host.path(exe).is_file():
            entry["error"] = (f"llama-batched-bench is not in the build ({exe}): add it to engine.targets and run "
                              "`p2pkit up --from engine` (the served arms are measured without it)")
            continue
        argv = entry["argv"] = batched_argv(ctx, p, lp, lo, streams)
        runs = []
        try:
            for i in range(BATCHED_REPS):
                with ctx.out.working(f"[bench] reference: llama-batched-bench {shape} {lp}/{lo} tokens, "
                                     f"{','.join(map(str, streams))} sequences ({i + 1}/{BATCHED_REPS})"):
                    r = ctx.host.runner.run(argv, check=False, timeout=1800)
                run = bb.read(r.stdout + "\n" + r.stderr)
                if r.returncode != 0:
                    raise bb.BatchedBenchError(f"llama-batched-bench exited {r.returncode}: "
                                               + " | ".join(r.stderr.strip().splitlines()[-3:]))
                runs.append(run)
        except (bb.BatchedBenchError, P2pkitError) as e:
            entry["error"] = getattr(e, "message", None) or str(e)
            continue
        entry["settings"] = runs[0].settings
        # a row can be missing from one run: llama.cpp's logger is not flushed at exit (common/log.cpp,
        # common_log_main: "logs may be lost"), seen on the CPU build about one run in five
        entry["rows_missing"] = sum(len(bb.missing(run, [lp], [lo], streams)) for run in runs)
        never = [c for c in streams if not any(x.pl == c for run in runs for x in run.rows)]
        if never:
            entry["error"] = (f"llama-batched-bench printed no row for {len(never)} level(s) ({never}) in any of "
                              f"{len(runs)} runs: a KV need over its -c, or lines its logger lost at exit")
            continue
        entry["levels"] = []
        for c in streams:
            rows = [x for run in runs for x in run.rows if x.pl == c]
            o = [x.output_tps for x in rows]
            mean = statistics.fmean(o)
            sd = statistics.stdev(o) if len(o) > 1 else 0.0
            entry["levels"].append({"streams": c, "output_tps": _stats(o), **spread(mean, sd),
                                    "decode_tps": _stats([x.speed_tg for x in rows]),
                                    "prefill_tps": _stats([x.speed_pp for x in rows]),
                                    "seconds": _stats([x.t for x in rows])})
    return out


def batched_ratios(doc: dict) -> list[dict]:
    """Each baseline level's aggregate as a ratio of llama-batched-bench at the same shape and stream count:
    over the level's wall time (what a client got) and over the time the server's timings cover."""
    base = doc["arms"][0] if doc["arms"] else {}
    out = []
    for ref in doc.get("batched_reference", {}).get("shapes", []):
        for rl in ref.get("levels", []):
            lv = next((x for x in base.get("levels", []) if x["shape"] == ref["shape"]
                       and x["concurrency"] == rl["streams"]), None)
            if lv is None:
                continue
            s, r = lv.get("summary") or {}, rl["output_tps"]["median"]
            row = {"shape": ref["shape"], "streams": rl["streams"], "batched_bench_tps": r,
                   "reference_spread": rl["spread"]}
            if s.get("spoiled"):
                row["spoiled"] = s["spoiled"]
            for k in ("aggregate_decode_tps", "aggregate_server_decode_tps"):
                row[k] = s.get(k)
                row[k.replace("_tps", "_ratio")] = round(s[k] / r, 4) if s.get(k) and r else None
            if not rl["reliable"]:
                row["unreliable"] = (f"llama-batched-bench's spread is {rl['spread']:.1%} of its mean over "
                                     f"{rl['output_tps']['n']} runs (over {SPREAD_MAX:.0%})")
            out.append(row)
    return out


def unit_files() -> tuple[str, ...]:
    """What an --ab arm changes and puts back (the secrets stay): the service role's unit, slice and env file."""
    return system.ENGINE_FILES[:3]


SERVE_REPS = 3  # vLLM's benchmark client's runs per level (one run has no spread of its own)


def serve_arm(ctx, p, shapes: list[tuple[str, int, int, list[int]]], warmup: int, requests: int) -> dict:
    """vLLM's own benchmark client (`vllm bench serve` of the installed vLLM, run by the engine's Python: the engine
    module's bench_serve_args and bench_reference_argv) at each level's lengths and stream count: as many requests
    as the level sent (streams x requests), as many warm-up requests as its warm-up, SERVE_REPS runs a level (each
    with its own seed: its random prompts never repeat, so the prefix cache serves none of them), all in one
    process; each run's result JSON read by p2pkit.parse.vllm_bench. Per level: the output tok/s (output tokens
    over its duration, as a served level's aggregate is over its wall time), median and spread of the runs, and
    its time to first token. A client that fails or writes no result leaves the served arms as they are and says
    why here."""
    from p2pkit.parse import vllm_bench

    engine = engine_cmd.engine(p)
    base = engine_cmd.base_url(p)
    model = engine_api.served_name(base, engine_cmd.served_model(p))
    tokenizer = str(ctx.host.path(engine_cmd.model_path(p)))
    out: dict = {"tool": bench_of(p)["reference"], "runs": SERVE_REPS, "spread_max": SPREAD_MAX, "shapes": []}
    ctx.store.dir.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-reference-", dir=ctx.store.dir)
    try:
        runs, plan = [], []
        for shape, lp, lo, streams in shapes:
            entry: dict = {"shape": shape, "prompt_tokens": lp, "output_tokens": lo, "streams": streams, "levels": []}
            out["shapes"].append(entry)
            for c in streams:
                lv = {"streams": c, "num_prompts": c * requests, "warmups": c * warmup, "results": []}
                entry["levels"].append(lv)
                for i in range(SERVE_REPS):
                    name = f"{shape}-c{c}-r{i}.json"
                    runs.append(engine.bench_serve_args(
                        base_url=base, model=model, tokenizer=tokenizer, prompt_tokens=lp, output_tokens=lo,
                        streams=c, requests=c * requests, warmups=c * warmup, result_dir=tmp, filename=name,
                        seed=len(runs)))
                    plan.append((lv, name))
        argv = engine.bench_reference_argv(str(ctx.host.path(engine.binary(p))), runs)
        out["argv"] = argv
        before = engine_api.metrics(base, "vllm:")
        try:
            with ctx.out.working(f"[bench] reference: {out['tool']}, {len(runs)} runs"):
                r = ctx.host.runner.run(argv, check=False, timeout=3600,
                                        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        except P2pkitError as e:  # the engine's Python is gone, or the client ran past its time
            r = None
            failed = f"{out['tool']} did not run: {e.message}" + (f" ({e.hint})" if e.hint else "")
        if r is not None:
            out["exit"] = r.returncode
            failed = (f"{out['tool']} exited {r.returncode}: "
                      + " | ".join(r.stderr.strip().splitlines()[-3:])[-600:]) if r.returncode != 0 else None
        out["counted"] = serve_counted(before, engine_api.metrics(base, "vllm:"))
        for lv, name in plan:
            path = os.path.join(tmp, name)
            try:
                with open(path, encoding="utf-8") as fh:
                    got = vllm_bench.read(fh.read())
            except OSError:
                lv.setdefault("errors", []).append(f"{name}: no result written" + (f" ({failed})" if failed else ""))
                continue
            except vllm_bench.VllmBenchError as e:
                lv.setdefault("errors", []).append(f"{name}: {e}")
                continue
            lv["results"].append(got.as_dict())
            if got.completed != got.num_prompts or got.failed:
                why = f": {' | '.join(got.errors)}" if got.errors else ""
                if got.failed_prompt_max is not None:
                    lo = next(e["output_tokens"] for e in out["shapes"] if lv in e["levels"])
                    why += (f" (its failed requests' prompts were up to {got.failed_prompt_max} tokens, with {lo} to "
                            f"generate: against the server's context, {engine.context_setting(p)})")
                lv.setdefault("errors", []).append(f"{name}: {got.completed} of {got.num_prompts} requests completed "
                                                   f"({got.failed} failed){why}")
        for entry in out["shapes"]:
            for lv in entry["levels"]:
                _serve_level(lv, entry["prompt_tokens"])
        done = [(x, lv["warmups"], e["output_tokens"]) for e in out["shapes"] for lv in e["levels"]
                for x in lv["results"]]
        out["sent"] = {"requests": sum(x["completed"] + w for x, w, _ in done),
                       "generation_tokens": sum(x["total_output_tokens"] + w * lo for x, w, lo in done)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def serve_counted(before: dict, after: dict) -> dict | None:
    """What vLLM counted while its benchmark client ran (its /metrics around the client's process): the requests,
    prompt and generated tokens it served (the warm-ups' among them), and the prompt tokens a request; None when
    its /metrics could not be read or were reset in between."""
    if before["status"] != 200 or after["status"] != 200:
        return None
    types = {**before.get("types", {}), **after.get("types", {})}
    if pe.counter_reset(before["values"], after["values"], types):
        return None
    got = pe.vllm_counted(pe.counter_deltas(before["values"], after["values"], types))
    return {**got, "prompt_tokens_per_request": round(got["prompt_tokens"] / got["requests"], 2) if got["requests"]
            else None}


LENGTH_TOLERANCE = 0.1  # a reference whose prompts are further than this share from the asked length says so


def _serve_level(lv: dict, n_prompt: int) -> None:
    """A level's reference figures from its runs' results (only the runs whose every request completed), and
    whether its prompts were the asked length (P13): its random prompts are random token ids decoded to text
    and encoded again, which in a small or byte-level vocabulary comes to more tokens than asked."""
    ok = [x for x in lv["results"] if x["completed"] == x["num_prompts"] and not x["failed"]]
    if not ok:
        lv["error"] = "; ".join(lv.get("errors") or ["no run completed"])
        return
    o = [x["output_throughput"] for x in ok]
    mean = statistics.fmean(o)
    sd = statistics.stdev(o) if len(o) > 1 else 0.0
    lv.update(output_tps=_stats(o), **spread(mean, sd), request_tps=_stats([x["request_throughput"] for x in ok]),
              mean_ttft_ms=_stats([x["mean_ttft_ms"] for x in ok]),
              mean_tpot_ms=_stats([x["mean_tpot_ms"] for x in ok]),
              prompt_tokens_per_request=_stats([x["total_input_tokens"] / x["num_prompts"] for x in ok]))
    got = lv["prompt_tokens_per_request"]["median"]
    if abs(got - n_prompt) > LENGTH_TOLERANCE * n_prompt:
        lv["lengths"] = (f"its prompts came to {got:g} tokens a request (the median of its runs), where {n_prompt} "
                         "were asked (random token ids decoded and encoded again by the model's tokenizer): the ratio "
                         "sets prompts of other lengths against each other; the output lengths are the asked ones")


def serve_ratios(doc: dict) -> list[dict]:
    """Each baseline level's aggregate (vLLM's counted output tokens over the level's wall) as a ratio of vLLM's
    own benchmark client at the same lengths and stream count (its output tokens over its duration)."""
    base = doc["arms"][0] if doc["arms"] else {}
    out = []
    for ref in doc.get("serve_reference", {}).get("shapes", []):
        for rl in ref.get("levels", []):
            lv = next((x for x in base.get("levels", []) if x["shape"] == ref["shape"]
                       and x["concurrency"] == rl["streams"]), None)
            if lv is None or "output_tps" not in rl:
                continue
            s, r = lv.get("summary") or {}, rl["output_tps"]["median"]
            agg = s.get("aggregate_decode_tps")
            row = {"shape": ref["shape"], "streams": rl["streams"], "reference_tps": r,
                   "reference_spread": rl["spread"], "aggregate_decode_tps": agg,
                   "aggregate_decode_ratio": round(agg / r, 4) if agg and r else None,
                   "reference_mean_ttft_ms": (rl.get("mean_ttft_ms") or {}).get("median"),
                   "metrics_ttft_ms": s.get("metrics_ttft_ms")}
            if s.get("spoiled"):
                row["spoiled"] = s["spoiled"]
            if not rl["reliable"]:
                row["unreliable"] = (f"{doc['serve_reference']['tool']}'s spread is {rl['spread']:.1%} of its mean "
                                     f"over {rl['output_tps']['n']} runs (over {SPREAD_MAX:.0%})")
            out.append(row)
    return out


# an engine's own benchmark, by the name its engine module gives it (rules/engines: BENCH["reference"])
REFERENCES = {"llama-bench": llama_references, "vllm bench serve": serve_references}
