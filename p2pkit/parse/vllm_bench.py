"""vLLM's own benchmark client's result: the JSON `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py,
main: the benchmark's result dict with the run's arguments beside it).

What p2pkit reads of it: how many requests were asked for (num_prompts) and completed or failed, the
concurrency it held (max_concurrency; null when it was not capped), the run's duration in seconds (the first
request sent to the last answer received, its warm-up left out), the tokens it sent and got back
(total_input_tokens: the random prompts after decoding and re-encoding, a few more or fewer than asked;
total_output_tokens: the server's usage where it gives one), and the rates it derives: output_throughput
(total_output_tokens / duration, what a served level's aggregate over its wall time compares with),
request_throughput, and the mean and median time to first token and per output token (ms, from its streamed
answers). With --save-detailed it also lists each request's error (an empty string for one that completed):
read as the distinct errors, so a run whose requests failed says why (vLLM's 400 for a prompt and output over
the model's length, say). Recorded real results: tests/fixtures/vllm/bench-serve-*.json (README.md there)."""

from __future__ import annotations

import json
from dataclasses import dataclass


class VllmBenchError(ValueError):
    """The text is not a result of vLLM's benchmark client: what is wrong with it."""


@dataclass(frozen=True)
class ServeResult:
    num_prompts: int
    completed: int
    failed: int
    max_concurrency: int | None
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    output_throughput: float     # output tokens / duration
    request_throughput: float    # requests / duration
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    mean_tpot_ms: float | None
    model_id: str | None
    errors: tuple[str, ...] = ()  # the distinct errors of its failed requests (--save-detailed), at most MAX_ERRORS
    failed_prompt_max: int | None = None  # the longest prompt (tokens) among its failed requests (--save-detailed)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


MAX_ERRORS = 3
REQUIRED = ("num_prompts", "completed", "duration", "total_input_tokens", "total_output_tokens", "output_throughput",
            "request_throughput")


def _num(d: dict, k: str, kind=float):
    v = d.get(k)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise VllmBenchError(f"{k} is {v!r}, not a number")
    return kind(v)


def read(text: str) -> ServeResult:
    """One result file's text, read; VllmBenchError naming what is missing or malformed."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise VllmBenchError(f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(d, dict):
        raise VllmBenchError(f"a JSON {type(d).__name__}, not the result object vllm bench serve writes")
    missing = [k for k in REQUIRED if d.get(k) is None]
    if missing:
        raise VllmBenchError(f"no {', '.join(missing)} in it: not a result of vllm bench serve --save-result")
    return ServeResult(
        num_prompts=_num(d, "num_prompts", int), completed=_num(d, "completed", int),
        failed=_num(d, "failed", int) or 0, max_concurrency=_num(d, "max_concurrency", int),
        duration_s=_num(d, "duration"), total_input_tokens=_num(d, "total_input_tokens", int),
        total_output_tokens=_num(d, "total_output_tokens", int), output_throughput=_num(d, "output_throughput"),
        request_throughput=_num(d, "request_throughput"), mean_ttft_ms=_num(d, "mean_ttft_ms"),
        median_ttft_ms=_num(d, "median_ttft_ms"), mean_tpot_ms=_num(d, "mean_tpot_ms"),
        model_id=d.get("model_id") if isinstance(d.get("model_id"), str) else None, errors=_errors(d.get("errors")),
        failed_prompt_max=_failed_prompt_max(d.get("errors"), d.get("input_lens")))


def _failed_prompt_max(errors, lens) -> int | None:
    if not isinstance(errors, list) or not isinstance(lens, list) or len(errors) != len(lens):
        return None
    got = [n for e, n in zip(errors, lens) if e and isinstance(n, int) and not isinstance(n, bool)]
    return max(got) if got else None


def _errors(v) -> tuple[str, ...]:
    """The distinct non-empty errors, in order, each's last line (an exception's message after its traceback)."""
    out: list[str] = []
    for e in v if isinstance(v, list) else []:
        lines = str(e or "").strip().splitlines()
        if lines and lines[-1].strip()[:300] not in out:
            out.append(lines[-1].strip()[:300])
    return tuple(out[:MAX_ERRORS])
