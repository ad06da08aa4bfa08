"""`p2pkit bench`: measure the served engine the way the seeds did, and gate nothing.

Fixed prompt and output lengths (P13), warm-up requests left out, N timed requests one at a time;
throughput from the server's own accounting (P15): llama.cpp's per-response `timings` and its
/metrics counters, vLLM's /metrics counters, NInfer's per-request JSONL log line. The client's
wall time is reported beside them, never instead (seed 000: client SSE timing read 4.5x low).

`--ab KEY=VALUE` runs a second arm with one profile setting changed (the P2P-off arm is
`serve.env.NCCL_P2P_DISABLE=1`, P17): the service is re-rendered and restarted with it, the same
requests run, and the files the service stage writes are put back byte for byte and the service
restarted as it was, also after a failure or Ctrl-C."""

from __future__ import annotations

import statistics
from dataclasses import replace

from p2pkit import config, engine_cmd
from p2pkit.errors import GateError, P2pkitError
from p2pkit.host import engine_api
from p2pkit.parse import engine_api as pe

SCHEMA = 1
UNIT_FILES = ("/etc/systemd/system/p2pkit-engine.service", "/etc/p2pkit/engine.env",
              "/etc/systemd/system/p2pkit.slice")
PROMPT_WORD = " gpu"  # one token per repeat in the tiny tokenizer and in most BPE vocabularies


def gate(ctx) -> None:
    """bench runs only on a host whose service stage is done (exit 3 otherwise)."""
    from p2pkit import pipeline

    states = {s.stage: s for s in pipeline.evaluate(ctx, recheck=False)}
    svc = states.get("service")
    if svc is None or svc.state != pipeline.DONE:
        why = f"{svc.state}{': ' + svc.reason if svc and svc.reason else ''}" if svc else "not run"
        raise GateError(f"the service stage is not done ({why}), so there is no proven engine to benchmark",
                        hint="run `p2pkit up` first (bench measures the service the service stage proved)")


def prompt(n_tokens: int) -> str:
    return "The" + PROMPT_WORD * max(0, n_tokens - 2)


def one_request(p, n_prompt: int, n_out: int) -> dict:
    """One timed request and the server's own accounting of it."""
    base = engine_cmd.base_url(p)
    if p.engine.recipe == "llamacpp":
        r = engine_api.llamacpp_completion(base, n_out, prompt(n_prompt))
        t = r.get("timings") or {}
        if r.get("status") != 200:
            return {"ok": False, "error": r.get("error"), "status": r.get("status")}
        return {"ok": True, "prompt_n": t.get("prompt_n"), "prompt_ms": t.get("prompt_ms"),
                "predicted_n": t.get("predicted_n"), "predicted_ms": t.get("predicted_ms"),
                "prefill_tps": t.get("prompt_per_second"), "decode_tps": t.get("predicted_per_second"),
                "ttft_ms": t.get("prompt_ms"), "draft_n": t.get("draft_n"), "draft_accepted": t.get("draft_n_accepted"),
                "client_s": r["client_seconds"],
                "client_tps": round(t.get("predicted_n", 0) / r["client_seconds"], 3) if r["client_seconds"] else None}
    raise P2pkitError(f"bench does not read {p.engine.recipe}'s accounting yet", hint="bench measures llama.cpp")


def _stats(values: list) -> dict | None:
    v = [x for x in values if isinstance(x, int | float)]
    if not v:
        return None
    return {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3), "n": len(v)}


def run_arm(ctx, p, name: str, n_prompt: int, n_out: int, warmup: int, requests: int) -> dict:
    """Warm-up requests (left out), then N timed ones with /metrics read around them. A request that
    fails stops the arm: what was done so far is kept, with the error."""
    prefix = "llamacpp:" if p.engine.recipe == "llamacpp" else None
    base = engine_cmd.base_url(p)
    arm: dict = {"arm": name, "overrides": list(p.overrides), "requests": [], "warmup": warmup}
    for _ in range(warmup):
        w = one_request(p, n_prompt, n_out)
        if not w.get("ok"):
            arm["error"] = f"warm-up request failed: {w.get('error')}"
            return arm
    before = engine_api.metrics(base, prefix) if prefix else None
    for i in range(requests):
        with ctx.out.working(f"[bench] {name}: request {i + 1}/{requests}"):
            r = one_request(p, n_prompt, n_out)
        if not r.get("ok"):
            arm["error"] = f"request {i + 1} failed: HTTP {r.get('status')}: {r.get('error')}"
            break
        arm["requests"].append(r)
    if before is not None:
        after = engine_api.metrics(base, prefix)
        arm["metrics_status"] = after["status"]
        if before["status"] == 200 and after["status"] == 200:
            arm["metrics_delta"] = pe.deltas(before["values"], after["values"])
    arm["summary"] = summarize(arm)
    return arm


def summarize(arm: dict) -> dict:
    reqs = arm["requests"]
    out = {k: _stats([r.get(k) for r in reqs]) for k in ("decode_tps", "prefill_tps", "ttft_ms", "client_tps")}
    drafted = sum(r.get("draft_n") or 0 for r in reqs)
    if drafted:
        out["draft_acceptance"] = round(sum(r.get("draft_accepted") or 0 for r in reqs) / drafted, 4)
    d = arm.get("metrics_delta")
    if d and d.get("tokens_predicted_seconds_total"):
        out["metrics_decode_tps"] = round(d["tokens_predicted_total"] / d["tokens_predicted_seconds_total"], 3)
    if d and d.get("prompt_seconds_total"):
        out["metrics_prefill_tps"] = round(d["prompt_tokens_total"] / d["prompt_seconds_total"], 3)
    return out


def snapshot(host) -> dict[str, bytes | None]:
    return {f: (host.path(f).read_bytes() if host.path(f).is_file() else None) for f in UNIT_FILES}


def restore(ctx, saved: dict[str, bytes | None]) -> dict:
    """Put the service stage's files back byte for byte and restart the service as it was."""
    from p2pkit.artifacts import atomic_write
    from p2pkit.stages import service

    host = ctx.host
    for f, data in saved.items():
        path = host.path(f)
        if data is None:
            path.unlink(missing_ok=True)
        elif not path.is_file() or path.read_bytes() != data:
            atomic_write(path, data)
    host.runner.run(["systemctl", "daemon-reload"], check=False)
    host.runner.run(["systemctl", "restart", service.UNIT], check=False)
    h = service.wait_health(ctx, engine_cmd.health_url(ctx.profile), ctx.profile.serve.health_timeout_s)
    same = snapshot(host) == saved
    return {"files_identical": same, "health": h["ok"]}


def switch(ctx, override: str):
    """The profile with one more override, and the service re-rendered and restarted with it."""
    from p2pkit.stages import service

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


def run(ctx, n_prompt: int, n_out: int, warmup: int, requests: int, ab: str | None) -> dict:
    p = ctx.profile
    if p.engine.recipe not in ACCOUNTING:
        raise P2pkitError(f"bench does not read {p.engine.recipe}'s own accounting yet, and client timing alone "
                          "is not a measurement (P15)", hint="bench measures llama.cpp's service today")
    doc: dict = {"schema": SCHEMA, "kind": "p2pkit-bench", "simulated": ctx.host.simulated, "profile": p.name,
                 "engine": p.engine.recipe, "shape": {"prompt_tokens": n_prompt, "output_tokens": n_out,
                                                      "warmup": warmup, "requests": requests},
                 "accounting": ACCOUNTING[p.engine.recipe], "arms": []}
    doc["arms"].append(run_arm(ctx, p, "baseline", n_prompt, n_out, warmup, requests))
    if ab and "error" not in doc["arms"][0]:
        saved = snapshot(ctx.host)
        try:
            q = switch(ctx, ab)
            doc["arms"].append(run_arm(ctx, q, ab, n_prompt, n_out, warmup, requests))
        except P2pkitError as e:
            doc["arms"].append({"arm": ab, "requests": [], "error": e.message})
        finally:  # also on Ctrl-C: the unit goes back as it was
            doc["restored"] = restore(ctx, saved)
        base, other = (a["summary"].get("decode_tps") if a.get("summary") else None for a in doc["arms"][:2])
        if base and other:
            doc["ab_ratio_decode"] = round(other["median"] / base["median"], 4)
    return doc


ACCOUNTING = {
    "llamacpp": "llama-server's own: each /completion response's `timings` (tools/server/server-common.cpp, "
                "server_slot_stats::to_json) and /metrics llamacpp:* counters (server-task.cpp, to_metrics)",
}
