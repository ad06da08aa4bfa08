"""The served engine's HTTP API, as a client on this host sees it: /metrics and one completion.
Probes only: what the server's own accounting says (P15), never a figure made up here."""

from __future__ import annotations

import json
import time

from p2pkit.parse import engine_api as pe

PROMPT = "The two GPUs talk to each other over the PCIe bus, and the"


def get(url: str, timeout: float = 10) -> tuple[int | None, str]:
    """(HTTP status, body) of a GET; status None when nothing answers."""
    import urllib.error  # here: a read-only command (status) does not pay for urllib
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, ValueError) as e:
        return None, str(e)


def post_json(url: str, body: dict, timeout: float = 600,
              times: dict | None = None) -> tuple[int | None, dict | str, float]:
    """(HTTP status, parsed JSON or the error text, seconds the client waited). `times`, when given, gets
    the client's own clock: `sent` (monotonic, as the request left), `first_byte_s` (the status line and
    headers back: for a whole, unstreamed answer, the server has finished) and `done_s`."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    times = {} if times is None else times
    times["sent"] = t0
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            times["first_byte_s"] = time.monotonic() - t0
            text = r.read().decode(errors="replace")
            status = r.status
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), time.monotonic() - t0
    except (OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}", time.monotonic() - t0
    times["done_s"] = time.monotonic() - t0
    try:
        return status, json.loads(text), times["done_s"]
    except ValueError:
        return status, text, times["done_s"]


def metrics(base: str, prefix: str) -> dict:
    """/metrics parsed ({"status", "values", "types"}: each family's `# TYPE`); llama-server answers 501
    unless started with --metrics."""
    status, text = get(f"{base}/metrics")
    return {"status": status, "values": pe.prometheus(text, prefix) if status == 200 else {},
            "types": pe.prometheus_types(text, prefix) if status == 200 else {},
            **({} if status == 200 else {"error": text.strip()[:200]})}


def llamacpp_token(base: str, word: str = "gpu") -> int | None:
    """One token id of the served model's vocabulary (the last of `word`'s tokens, from its /tokenize):
    repeated N times it is a prompt of exactly N tokens, which llama-server uses as given (a token
    array gets no BOS added: tools/server/server-common.cpp, tokenize_input_subprompt)."""
    status, body, _ = post_json(f"{base}/tokenize", {"content": word}, 30)
    toks = body.get("tokens") if status == 200 and isinstance(body, dict) else None
    return toks[-1] if toks and isinstance(toks[-1], int) else None


def vllm_token(base: str, model: str, word: str = "gpu") -> int | None:
    """One token id of the served model's vocabulary (the last of `word`'s tokens, from vLLM's /tokenize without
    special tokens): repeated N times it is a prompt of exactly N tokens, which vLLM's /v1/completions takes as
    given (a prompt of token ids gets no BOS added)."""
    status, body, _ = post_json(f"{base}/tokenize", {"model": model, "prompt": word, "add_special_tokens": False}, 30)
    toks = body.get("tokens") if status == 200 and isinstance(body, dict) else None
    return toks[-1] if toks and isinstance(toks[-1], int) else None


def llamacpp_completion(base: str, n_predict: int, prompt: str | list[int] = PROMPT, timeout: float = 600,
                        times: dict | None = None) -> dict:
    """One /completion at temperature 0: the server's own `timings` and draft counts (`times`: the client's
    clock, post_json's). Greedy as temperature 0 is, with the sampler chain cut to top_k 1: the same tokens,
    without the per-token work of the default chain (penalties, DRY, top-p, min-p, ...), which llama-bench
    does not do either (on the H200: served decode 0.896 of llama-bench tg with the default chain, 0.938
    with this one; docs/measurements.md)."""
    status, body, waited = post_json(f"{base}/completion", {"prompt": prompt, "n_predict": n_predict,
                                                             "temperature": 0, "samplers": ["top_k"], "top_k": 1,
                                                             "cache_prompt": False, "ignore_eos": True},
                                     timeout, times)
    out: dict = {"status": status, "client_seconds": round(waited, 4)}
    if status == 200 and isinstance(body, dict):
        out["timings"] = body.get("timings", {})
        out["tokens_predicted"] = body.get("tokens_predicted")
        out["tokens_evaluated"] = body.get("tokens_evaluated")
    else:
        out["error"] = (body if isinstance(body, str) else json.dumps(body))[:300]
    return out


def first_completion(base: str, n_predict: int = 16) -> dict:
    """The service proof's one real request (P19: MTP under tensor split can crash at the first
    decode while /health is already 200), with /metrics read before and after it."""
    before = metrics(base, "llamacpp:")
    done = llamacpp_completion(base, n_predict)
    after = metrics(base, "llamacpp:")
    return {**done, "metrics_status": after["status"],
            "metrics_delta": pe.deltas(before["values"], after["values"]) if after["status"] == 200 else {},
            "total_slots": total_slots(base)}


def slot_context(base: str) -> int | None:
    """The running llama-server's context per slot: /props' default_generation_settings.n_ctx
    (server-context.cpp get_res_props: slot_n_ctx, capped by the model's training context); None
    when it does not say."""
    status, text = get(f"{base}/props")
    try:
        n = (json.loads(text).get("default_generation_settings") or {}).get("n_ctx") if status == 200 else None
    except (ValueError, AttributeError):
        return None
    return n if isinstance(n, int) and n > 0 else None


def total_slots(base: str) -> int | dict:
    """The running llama-server's slots: /props' total_slots (tools/server/server-context.cpp
    get_res_props: params.n_parallel after -np's auto default was resolved)."""
    status, text = get(f"{base}/props")
    if status != 200:
        return {"error": f"/props answered {status}: {text.strip()[:160]}"}
    try:
        n = json.loads(text).get("total_slots")
    except (ValueError, AttributeError):
        return {"error": "/props is not a JSON object"}
    return n if isinstance(n, int) else {"error": f"/props has no total_slots ({n!r})"}


PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def port_answers(addr: str | None, port: int | None, timeout: float) -> dict:
    """Whether addr:port accepts a TCP connection now (a head's rendezvous): {address, up, error}."""
    import socket

    shown = f"{addr}:{port}"
    if not addr or port is None:
        return {"address": shown, "up": False, "error": "no master-addr or master-port"}
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return {"address": shown, "up": True}
    except OSError as e:
        return {"address": shown, "up": False, "error": str(e)}


def served_name(base: str, model: str) -> str:
    """The model name an OpenAI request must give, as the server lists it (/v1/models): `model` where it is one of
    them, else the only one it serves (vLLM names a model by the path it was given: on a host reached through a
    root, that root's path); `model` when the list cannot be read (the request then says why)."""
    status, text = get(f"{base}/v1/models")
    try:
        ids = [m["id"] for m in json.loads(text)["data"]] if status == 200 else []
    except (ValueError, KeyError, TypeError):
        ids = []
    return model if model in ids or len(ids) != 1 else ids[0]


def vllm_first_completion(base: str, model: str, n_predict: int = 16) -> dict:
    """The service proof's one real request on vLLM, with its /metrics read before and after it: the
    deltas of the `vllm:` counters (the spec-decode ones among them: vllm/v1/spec_decode/metrics.py)
    and of the accepted tokens per draft position."""
    model = served_name(base, model)
    b_status, b_text = get(f"{base}/metrics")
    done = openai_request(base, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": n_predict,
                                                     "temperature": 0, "ignore_eos": True})
    a_status, a_text = get(f"{base}/metrics")
    out = {**done, "metrics_status": a_status if b_status == 200 else b_status, "metrics_delta": {},
           "accepted_per_pos_delta": {}}
    if b_status == 200 and a_status == 200:
        out["metrics_delta"] = pe.deltas(pe.prometheus(b_text, "vllm:"), pe.prometheus(a_text, "vllm:"))
        out["accepted_per_pos_delta"] = pe.deltas(pe.by_label(b_text, PER_POS, "position"),
                                                  pe.by_label(a_text, PER_POS, "position"))
    return out


def ninfer_first_completion(base: str, model: str, log_path, n_predict: int = 16) -> dict:
    """The service proof's one real request on NInfer, with the `request_done` / `request_error` lines
    its JSONL request log gained meanwhile (log_path None: the engine keeps no request log)."""
    offset = log_size(log_path) if log_path is not None else 0
    done = openai_request(base, "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": n_predict,
        "temperature": 0, "stream": False})
    out = {**done, "request_log": str(log_path) if log_path is not None else None, "log_events": []}
    if log_path is not None:
        out["log_events"] = pe.ninfer_done(log_since(log_path, offset)[0])
    return out


def openai_request(base: str, path: str, body: dict, timeout: float = 600, times: dict | None = None) -> dict:
    """One OpenAI-compatible request (vLLM's /v1/completions, NInfer's /v1/chat/completions): its
    `usage` and the seconds the client waited (beside the server's figures, never instead)."""
    status, doc, waited = post_json(f"{base}{path}", body, timeout, times)
    out: dict = {"status": status, "client_seconds": round(waited, 4)}
    if status == 200 and isinstance(doc, dict):
        out["usage"] = doc.get("usage") or {}
    else:
        out["error"] = (doc if isinstance(doc, str) else json.dumps(doc))[:300]
    return out


def log_size(path) -> int:
    """Where a server's append-only log ends now (0 when it does not exist yet)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log_since(path, offset: int) -> tuple[list[dict], int]:
    """The JSON lines a server appended to its log after `offset`, and the new end (a line still
    being written waits for the next read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    whole = data[: data.rfind(b"\n") + 1]
    return pe.jsonl(whole.decode(errors="replace")), offset + len(whole)
