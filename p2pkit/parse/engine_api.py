"""What served engines say about themselves: Prometheus text from /metrics (llama.cpp's
`llamacpp:` counters, vLLM's `vllm:` ones), the flags a binary's --help lists, NInfer's JSONL
request log.

Sources: llama.cpp tools/server/server-task.cpp (server_task_result_metrics::to_metrics: `# HELP
llamacpp:NAME`, `# TYPE llamacpp:NAME counter|gauge`, `llamacpp:NAME VALUE`), common/arg.cpp
(--help: one option per line, its names comma-separated, like `-c,    --ctx-size N`)."""

from __future__ import annotations

import json
import re

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def prometheus(text: str, prefix: str = "") -> dict[str, float]:
    """Sample lines of a Prometheus text exposition: name (prefix removed) -> value; labelled
    samples are summed per name (the per-position spec counters)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m or not m.group(1).startswith(prefix):
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        name = m.group(1)[len(prefix):]
        out[name] = out.get(name, 0.0) + v
    return out


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 6) for k in after}


TYPE_LINE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\w+)", re.M)
SAMPLE_SUFFIXES = ("_total", "_sum", "_count", "_bucket", "_created")


def prometheus_types(text: str, prefix: str = "") -> dict[str, str]:
    """Each family's `# TYPE` (counter, gauge, histogram, summary, untyped), the prefix removed."""
    return {m.group(1)[len(prefix):]: m.group(2) for m in TYPE_LINE.finditer(text) if m.group(1).startswith(prefix)}


def sample_type(name: str, types: dict[str, str]) -> str | None:
    """The type of the family a sample belongs to: its own name (llama.cpp's `llamacpp:tokens_predicted_total`
    is typed under that name) or its name less a sample suffix (a histogram's `_sum` and `_count`)."""
    if name in types:
        return types[name]
    for s in SAMPLE_SUFFIXES:
        if name.endswith(s) and name[: -len(s)] in types:
            return types[name[: -len(s)]]
    return None


def gauges(values: dict[str, float], types: dict[str, str]) -> dict[str, float]:
    """The samples of gauge families: values as read, never differenced."""
    return {k: v for k, v in values.items() if sample_type(k, types) == "gauge"}


def counter_deltas(before: dict[str, float], after: dict[str, float], types: dict[str, str]) -> dict[str, float]:
    """after - before of every sample that only grows (counters, and a histogram's or summary's sums and
    counts; an untyped sample too): a gauge is left out (its difference means nothing: issue 38 found
    n_busy_slots_per_decode reported as a negative delta)."""
    return {k: v for k, v in deltas(before, after).items() if sample_type(k, types) != "gauge"}


def counter_reset(before: dict[str, float], after: dict[str, float], types: dict[str, str]) -> str | None:
    """Why the counters read after cannot be set against those read before: a counter lower than it was
    (the engine restarted, or its counters were reset, in between: a difference would be a made-up figure),
    or one that was there and is gone; None when every counter only grew."""
    for k, b in sorted(before.items()):
        if sample_type(k, types) == "gauge":
            continue
        if k not in after:
            return f"the counter {k} was there before ({b:g}) and is gone after"
        if after[k] < b:
            return f"the counter {k} went down from {b:g} to {after[k]:g}: the engine's counters were reset (it " \
                   "restarted) in between"
    return None


REMOVED = "the argument has been removed"  # llama.cpp common/arg.cpp: arg_removed(), and the option's help text


def help_options(text: str) -> list[tuple[set[str], str]]:
    """Each option an engine's --help lists: its long names (without dashes; `-c,    --ctx-size N` ->
    ctx-size, a negated form like `--no-webui` too) and its description, which common_arg::to_string
    starts after the names (or on the next line when the names fill the column, like `-ctxcp,
    --ctx-checkpoints, --swa-checkpoints N`) and wraps onto indented lines; its "(env: ...)" line is
    left out."""
    out: list[tuple[set[str], str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        # the options column ends at the first run of 2+ spaces not right after a comma
        # ("-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers ...")
        head, *rest = re.split(r"(?<=[^,\s])\s{2,}", line.strip(), maxsplit=1)
        names = {m.group(1) for m in re.finditer(r"(?:^|[ ,])--([a-z0-9][a-z0-9-]*)", head)} \
            if head.startswith("-") else set()
        if not names:
            continue
        desc = rest[:1]
        for nxt in lines[i + 1:]:
            if not nxt.startswith(" ") or not nxt.strip() or nxt.strip().startswith("(env: "):
                break
            desc.append(nxt.strip())
        out.append((names, " ".join(desc)))
    return out


def help_flags(text: str) -> set[str]:
    """Long option names an engine's --help lists and still accepts: an option whose help says "the
    argument has been removed" (llama.cpp keeps the old names only to say what replaced them) is not one."""
    return {n for names, desc in help_options(text) if not desc.startswith(REMOVED) for n in names}


def help_removed(text: str) -> dict[str, str]:
    """The options --help lists as removed -> what it says instead ("the argument has been removed. use
    --spec-draft-n-max or --spec-ngram-mod-n-max")."""
    return {n: desc for names, desc in help_options(text) if desc.startswith(REMOVED) for n in names}


def jsonl(text: str) -> list[dict]:
    """A JSONL log: one object per line; lines that are not JSON objects are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


# Per-request figures from each engine's own accounting, one shape for all three:
# prompt_n, prompt_ms, predicted_n, predicted_ms, prefill_tps, decode_tps, ttft_ms, draft_n, draft_accepted.
# decode tok/s leaves out the first token, which the prefill emits: llama-server's predicted_per_second
# does (REFERENCE.md), NInfer's own summary line computes (gen - 1) / decode seconds
# (src/serve/request_log.cpp, format_request_done), and vLLM's decode time runs from the first token
# to the last (vllm/v1/metrics/stats.py at 28ed1fb87ed5, update_from_finished_request: decode_time =
# last_token_ts - first_token_ts, "Do not count the token generated by the prefill phase").

def _rate(n: float, seconds: float) -> float | None:
    return round(n / seconds, 3) if seconds and seconds > 0 else None


def llamacpp_figures(t: dict) -> dict:
    """A /completion response's `timings` (tools/server: server_slot_stats / timings.to_json)."""
    return {"prompt_n": t.get("prompt_n"), "prompt_ms": t.get("prompt_ms"), "predicted_n": t.get("predicted_n"),
            "predicted_ms": t.get("predicted_ms"), "prefill_tps": t.get("prompt_per_second"),
            "decode_tps": t.get("predicted_per_second"), "ttft_ms": t.get("prompt_ms"), "draft_n": t.get("draft_n"),
            "draft_accepted": t.get("draft_n_accepted")}


def ninfer_figures(rec: dict) -> dict:
    """A `request_done` line of NInfer's JSONL request log (schema 2): result, timings_seconds, speculative.
    TTFT is prepare + vision + prefill, as NInfer's own summary line has it."""
    res, t, sp = rec.get("result") or {}, rec.get("timings_seconds") or {}, rec.get("speculative") or {}
    gen, prompt_n = res.get("completion_tokens") or 0, res.get("prompt_tokens") or 0
    prefill, decode = float(t.get("prefill") or 0), float(t.get("decode") or 0)
    ttft = float(t.get("prepare") or 0) + float(t.get("vision") or 0) + prefill
    return {"prompt_n": prompt_n, "prompt_ms": round(prefill * 1000, 4), "predicted_n": gen,
            "predicted_ms": round(decode * 1000, 4), "prefill_tps": _rate(prompt_n, prefill),
            "decode_tps": _rate(max(0, gen - 1), decode), "ttft_ms": round(ttft * 1000, 4),
            "draft_n": sp.get("drafted_tokens"), "draft_accepted": sp.get("accepted_tokens"),
            "request_id": (rec.get("request") or {}).get("request_id")}


def vllm_figures(d: dict) -> dict:
    """Deltas of vLLM's /metrics (prefix `vllm:` removed) around requests run one at a time:
    tokens from the counters, seconds from the _sum of the phase histograms, one request per
    _count of the decode-time histogram."""
    n = d.get("request_decode_time_seconds_count") or 0
    gen, prompt_n = d.get("generation_tokens_total") or 0, d.get("prompt_tokens_total") or 0
    prefill, decode = d.get("request_prefill_time_seconds_sum") or 0, d.get("request_decode_time_seconds_sum") or 0
    ttft = d.get("time_to_first_token_seconds_sum") or 0
    return {"prompt_n": int(prompt_n), "prompt_ms": round(prefill * 1000, 4), "predicted_n": int(gen),
            "predicted_ms": round(decode * 1000, 4), "prefill_tps": _rate(prompt_n, prefill),
            "decode_tps": _rate(max(0, gen - n), decode),
            "ttft_ms": round(ttft * 1000 / n, 4) if n else None,
            "draft_n": d.get("spec_decode_num_draft_tokens_total"),
            "draft_accepted": d.get("spec_decode_num_accepted_tokens_total"), "requests": int(n)}


def vllm_counted(d: dict) -> dict:
    """What vLLM counted over a span of requests that may have run at once (deltas of its /metrics, prefix
    `vllm:` removed): the requests it finished (request_success_total, every finished_reason), the prompt and
    generated tokens, and the seconds its phase histograms summed over those requests (prefill, decode, time to
    first token: per-request times added up, so overlapping requests count each their own), the prompt tokens its
    prefix cache served (prefix_cache_hits_total) and its preemptions."""
    return {"requests": int(d.get("request_success_total") or 0),
            "prompt_tokens": int(d.get("prompt_tokens_total") or 0),
            "generation_tokens": int(d.get("generation_tokens_total") or 0),
            "prefill_s_sum": round(d.get("request_prefill_time_seconds_sum") or 0, 6),
            "decode_s_sum": round(d.get("request_decode_time_seconds_sum") or 0, 6),
            "ttft_s_sum": round(d.get("time_to_first_token_seconds_sum") or 0, 6),
            "prefix_cache_hits": int(d.get("prefix_cache_hits_total") or 0),
            "preemptions": int(d.get("num_preemptions_total") or 0)}


def ninfer_done(records: list[dict]) -> list[dict]:
    """The `request_done` and `request_error` events of NInfer's request log, in order."""
    return [r for r in records if r.get("artifact_type") == "ninfer_serve_request_log"
            and r.get("event") in ("request_done", "request_error")]


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    """One family's samples of a Prometheus text by one label's value (vLLM's
    `vllm:spec_decode_num_accepted_tokens_per_pos_total{...,position="0"}` -> {"0": value}), summed
    over the other labels."""
    out: dict[str, float] = {}
    want = re.compile(rf'(?:^|[{{,])\s*{re.escape(label)}="([^"]*)"')
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or m.group(1) != name or not m.group(2):
            continue
        lv = want.search(m.group(2))
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        if lv:
            out[lv.group(1)] = out.get(lv.group(1), 0.0) + v
    return out


DRAFT_LINE = re.compile(r"(?:id\s+(?P<slot>\d+) \| task (?P<task>-?\d+) \| )?draft acceptance = (?P<rate>[0-9.]+) "
                        r"\(\s*(?P<accepted>\d+) accepted /\s*(?P<generated>\d+) generated\)"
                        r"(?:, mean len =\s*(?P<mean_len>[0-9.]+))?")


def llamacpp_draft_lines(lines: list[str]) -> list[dict]:
    """llama-server's per-task drafting line (tools/server/server-context.cpp, server_slot::print_timings:
    `slot print_timing: id  7 | task 514 | draft acceptance = 0.00000 (    0 accepted /  1527 generated),
    mean len =  1.00`, printed when a task that drafted finishes), in the log's order: slot, task, the
    counts and the rate it printed."""
    out = []
    for line in lines:
        m = DRAFT_LINE.search(line)
        if m:
            out.append({"slot": int(m["slot"]) if m["slot"] else None, "task": int(m["task"]) if m["task"] else None,
                        "accepted": int(m["accepted"]), "generated": int(m["generated"]), "rate": float(m["rate"]),
                        "mean_len": float(m["mean_len"]) if m["mean_len"] else None})
    return out
