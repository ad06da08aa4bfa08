"""What the SIMULATED engines answer besides /health: completions whose server-side timings are real
(the server sleeps through a prefill and a decode and times them with its own clock), and each
engine's own accounting of them in the format its real counterpart writes:

- NInfer: POST /v1/chat/completions with the OpenAI `usage` (Neroued/ninfer src/serve/openai_schema.cpp,
  make_chat_completion_response), and per request a `request_start` and a `request_done` line in the
  JSONL request log that `--request-log-jsonl FILE` names (src/serve/request_log.cpp,
  format_request_done_json: artifact_type "ninfer_serve_request_log", schema_version 2, `result`,
  `timings_seconds` and `speculative`), plus the rounded stderr summary line (format_request_done).
  Read from Neroued/ninfer at commit 5ea3242a206cdb0c4c1beaeb9d8a3048e6248423; docs/serving.md
  ("Structured request log") says the JSONL log, not the stderr line, is the aggregation source.
- vLLM: POST /v1/completions with `usage` (vllm/entrypoints/openai/protocol.py UsageInfo, commit
  0052bed36509c7a5a2d8e48265334e40cf2f5a0e), and GET /metrics: the Prometheus families, labels and
  buckets of vllm/v1/metrics/loggers.py PrometheusStatLogger (commit a6f0308cfe806b7731ad4979c9bea6e470c35efd)
  and the spec-decoding counters of vllm/v1/spec_decode/metrics.py SpecDecodingProm (commit
  ee4ceaae5953d367d8edd2132fd86d6c42506e1e), exposed by prometheus_client as vLLM does (in vLLM's
  multiprocess mode there are no `_created` samples, so none here either).

The reply reaches the client later than the server's own clock says the request finished
(DELIVERY_FACTOR times the accounted time): seed 000 found client SSE timing 4.5x below the
server's per-request log (P15), and a bench that timed the client would read that here too."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

PREFILL_S_PER_TOKEN = float(os.environ.get("P2PKIT_SIM_PREFILL_S_PER_TOKEN", "0.0002"))
STEP_S = float(os.environ.get("P2PKIT_SIM_DECODE_STEP_S", "0.003"))  # one forward: a decode step or a verify round
DELIVERY_FACTOR = float(os.environ.get("P2PKIT_SIM_DELIVERY_FACTOR", "3.5"))
ACCEPT = 0.6  # the share of each draft window the target accepts
_LOCK = threading.Lock()  # one resident sequence: requests run one at a time (NInfer serialises them too)


def host_view(path: str) -> str:
    """A path as the simulated host names it (the simulated systemctl points the engine's arguments
    into the host's directory): vLLM's default served model name is its --model argument as given."""
    from pathlib import Path

    p = Path(path)
    for d in p.parents:
        if (d / ".p2pkit-sim/state.json").is_file():
            return "/" + str(p.relative_to(d))
    return path


def count_tokens(text: str) -> int:
    """The simulated tokenizer: a BOS and one token per word (bench's prompt is made to be N tokens
    this way and in the tiny BPE vocabulary the real llama.cpp test uses)."""
    return 1 + len(text.split())


def generate(n_prompt: int, n_out: int, window: int) -> dict:
    """Prefill (which emits the first token), then decode rounds of one target forward each; with a
    draft window each round also accepts part of the draft. Times are this process's own clock."""
    with _LOCK:
        t0 = time.perf_counter()
        time.sleep(n_prompt * PREFILL_S_PER_TOKEN)
        t_first = time.perf_counter()
        left, rounds, accepted, per_pos = max(0, n_out - 1), 0, 0, [0] * window
        take = int(window * ACCEPT)
        while left > 0:
            time.sleep(STEP_S)
            rounds += 1
            got = min(take, left - 1)
            for i in range(got):
                per_pos[i] += 1
            accepted += got
            left -= 1 + got
        t_end = time.perf_counter()
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "prefill_s": t_first - t0,
            "decode_s": t_end - t_first, "total_s": t_end - t0, "window": window, "rounds": rounds,
            "drafted": rounds * window, "accepted": accepted, "per_pos": per_pos}


def deliver(g: dict) -> None:
    """What lies between the server's accounting and the client's clock (P15)."""
    time.sleep(DELIVERY_FACTOR * g["total_s"])


# ---------------------------------------------------------------------------------------- NInfer

class NinferLog:
    """--request-log-jsonl: opened for append at start (startup fails when it cannot be), one JSON
    object a line, flushed after each."""

    def __init__(self, path: str | None, argv: list[str], artifact: str):
        self.fh = None
        self.instance = f"serve-{os.getpid()}-{int(time.time() * 1e6)}"
        self.seq = 0
        if not path:
            return
        try:
            self.fh = open(path, "a")  # noqa: SIM115 - the server's log, open for its life
        except OSError as e:
            raise SystemExit(f"failed to open request JSONL log for append: {path} ({e.strerror})") from e
        self._write("server_start", {"server": {"request_log_jsonl": path}, "artifact": {"path": artifact},
                                     "argv": argv, "simulated": True})

    def _write(self, event: str, body: dict) -> None:
        if self.fh is None:
            return
        rec = {"artifact_type": "ninfer_serve_request_log", "schema_version": 2, "event": event,
               "timestamp_unix_ms": int(time.time() * 1000), "server_instance_id": self.instance, **body}
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()

    def request(self, model: str, max_tokens: int, temperature: float) -> dict:
        self.seq += 1
        req = {"request_id": self.seq, "protocol": "openai_chat_completions", "model": model, "stream": False,
               "message_count": 1, "requested_output_tokens": max_tokens, "requested_output_tokens_source": "client",
               "tool_count": 0, "tool_choice": "auto", "has_tool_history": False, "enable_thinking": True,
               "sampling": {"temperature": temperature, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                            "presence_penalty": 1.0, "frequency_penalty": 0.0, "seed": 0}}
        self._write("request_start", {"request": req})
        return req

    def done(self, req: dict, g: dict, backend: str) -> None:
        self._write("request_done", {
            "request": req,
            "result": {"finish_reason": "output_limit", "prompt_tokens": g["prompt_tokens"],
                       "completion_tokens": g["completion_tokens"], "prefix_cache_hit_tokens": 0, "tool_call_count": 0},
            "timings_seconds": {"prepare": 0.0, "vision": 0.0, "prefill": g["prefill_s"], "decode": g["decode_s"],
                                "total": g["total_s"]},
            "speculative": {"backend": backend, "draft_window": g["window"], "rounds": g["rounds"],
                            "drafted_tokens": g["drafted"], "accepted_tokens": g["accepted"], "fallback_steps": 0,
                            "accepted_per_position": g["per_pos"]}})
        # the operators' rounded summary on stderr (format_request_done)
        dec = (g["completion_tokens"] - 1) / g["decode_s"] if g["decode_s"] > 0 else 0
        spec = "off" if backend == "none" else (
            f"{backend} {1 + g['accepted'] / g['rounds'] if g['rounds'] else 0:.2f}tok/round"
            + (f" ({100 * g['accepted'] / g['drafted']:.1f}%)" if g["drafted"] else ""))
        print(f"[req {req['request_id']}] done finish=output_limit prompt={g['prompt_tokens']} "
              f"gen={g['completion_tokens']} cache=0 ttft={g['prefill_s'] * 1000:.0f}ms "
              f"prefill={g['prompt_tokens'] / g['prefill_s']:.1f}tok/s decode={dec:.1f}tok/s "
              f"wall={g['total_s']:.2f}s speculative={spec}", file=sys.stderr, flush=True)


def ninfer_chat(log: NinferLog, model_id: str, backend: str, window: int):
    """POST /v1/chat/completions (non-streaming) as ninfer-serve answers it."""
    def handle(body: dict) -> tuple[int, dict]:
        if body.get("model") != model_id:
            return 404, {"error": {"message": f"model '{body.get('model')}' not found",
                                   "type": "invalid_request_error", "code": "model_not_found"}}
        msgs = body.get("messages") or []
        if not msgs:
            return 400, {"error": {"message": "missing required field: messages", "type": "invalid_request_error"}}
        text = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        max_tokens = int(body.get("max_tokens") or 16384)
        req = log.request(model_id, max_tokens, float(body.get("temperature", 0.6)))
        g = generate(count_tokens(text), max_tokens, window)
        log.done(req, g, backend)
        deliver(g)
        usage = {"prompt_tokens": g["prompt_tokens"], "completion_tokens": g["completion_tokens"],
                 "total_tokens": g["prompt_tokens"] + g["completion_tokens"]}
        message = {"role": "assistant", "content": " gpu" * g["completion_tokens"]}
        return 200, {"id": f"chatcmpl-sim{req['request_id']}", "object": "chat.completion",
                     "created": int(time.time()), "model": model_id,
                     "choices": [{"index": 0, "message": message, "finish_reason": "length"}], "usage": usage}
    return handle


# ---------------------------------------------------------------------------------------- vLLM

def _buckets_1_2_5(max_value: int) -> list[int]:
    """vllm/v1/metrics/loggers.py build_1_2_5_buckets."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > max_value:
                return out
            out.append(v)
        exp += 1


class VllmMetrics:
    """The PrometheusStatLogger families this server's requests move, in a registry of its own."""

    def __init__(self, model_name: str, max_model_len: int, num_spec_tokens: int):
        import prometheus_client as pc

        self.reg = pc.CollectorRegistry()
        lab, val = ["model_name", "engine"], [model_name, "0"]

        def counter(name, doc, extra=()):
            return pc.Counter(name, doc, labelnames=[*lab, *extra], registry=self.reg)

        def hist(name, doc, buckets):
            return pc.Histogram(name, doc, labelnames=lab, buckets=buckets, registry=self.reg).labels(*val)

        self.running = pc.Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                                 labelnames=lab, registry=self.reg).labels(*val)
        pc.Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labelnames=lab,
                 registry=self.reg).labels(*val)
        self.prompt = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.").labels(*val)
        self.generation = counter("vllm:generation_tokens_total", "Number of generation tokens processed.").labels(*val)
        self.success = counter("vllm:request_success_total", "Count of successfully processed requests.",
                               ["finished_reason"])
        for reason in ("stop", "length", "abort"):
            self.success.labels(*val, reason)
        lens = _buckets_1_2_5(max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lens)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", lens)
        self.max_tokens = hist("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
                               lens)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                          20.0, 40.0, 80.0, 160.0, 640.0, 2560.0])
        self.tpot = hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                         [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                          20.0, 40.0, 80.0])
        lat = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0]
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lat)
        self.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                          lat)
        self.inference = hist("vllm:request_inference_time_seconds",
                              "Histogram of time spent in RUNNING phase for request.", lat)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Histogram of time spent in PREFILL phase for request.", lat)
        self.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                           lat)
        self.spec = None
        if num_spec_tokens:
            per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                              ["position"])
            self.spec = {
                "drafts": counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").labels(*val),
                "draft_tokens": counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.").labels(*val),
                "accepted": counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.").labels(*val),
                "per_pos": [per_pos.labels(*val, str(i)) for i in range(num_spec_tokens)]}
        self.labels = val
        self.lock = threading.Lock()

    def finished(self, g: dict, max_tokens: int) -> None:
        """What PrometheusStatLogger.record() adds for one finished request (and its spec stats)."""
        with self.lock:
            self.prompt.inc(g["prompt_tokens"])
            self.generation.inc(g["completion_tokens"])
            self.success.labels(*self.labels, "length").inc()
            self.req_prompt.observe(g["prompt_tokens"])
            self.req_gen.observe(g["completion_tokens"])
            self.max_tokens.observe(max_tokens)
            self.ttft.observe(g["prefill_s"])
            if g["completion_tokens"] > 1:
                self.tpot.observe(g["decode_s"] / (g["completion_tokens"] - 1))
            self.e2e.observe(g["total_s"])
            self.queue.observe(0.0)
            self.inference.observe(g["prefill_s"] + g["decode_s"])
            self.prefill.observe(g["prefill_s"])
            self.decode.observe(g["decode_s"])
            if self.spec:
                self.spec["drafts"].inc(g["rounds"])
                self.spec["draft_tokens"].inc(g["drafted"])
                self.spec["accepted"].inc(g["accepted"])
                for c, n in zip(self.spec["per_pos"], g["per_pos"]):
                    c.inc(n)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.reg)


def vllm_completions(metrics: VllmMetrics, model_name: str, window: int):
    """POST /v1/completions (non-streaming) as vLLM's OpenAI server answers it."""
    def handle(body: dict) -> tuple[int, dict]:
        if body.get("model") not in (None, model_name):
            return 404, {"object": "error", "message": f"The model `{body.get('model')}` does not exist.",
                         "type": "NotFoundError", "param": None, "code": 404}
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return 400, {"object": "error", "message": "prompt must be a string", "type": "BadRequestError",
                         "param": None, "code": 400}
        max_tokens = int(body.get("max_tokens") or 16)
        g = generate(count_tokens(prompt), max_tokens, window)
        metrics.finished(g, max_tokens)
        deliver(g)
        usage = {"prompt_tokens": g["prompt_tokens"], "total_tokens": g["prompt_tokens"] + g["completion_tokens"],
                 "completion_tokens": g["completion_tokens"], "prompt_tokens_details": None}
        choice = {"index": 0, "text": " gpu" * g["completion_tokens"], "logprobs": None, "finish_reason": "length",
                  "stop_reason": None, "prompt_logprobs": None}
        return 200, {"id": f"cmpl-sim{int(time.time() * 1e6)}", "object": "text_completion",
                     "created": int(time.time()), "model": model_name, "choices": [choice], "usage": usage}
    return handle
