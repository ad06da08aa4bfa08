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


def post_json(url: str, body: dict, timeout: float = 600) -> tuple[int | None, dict | str, float]:
    """(HTTP status, parsed JSON or the error text, seconds the client waited)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode(errors="replace")
            status = r.status
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), time.monotonic() - t0
    except (OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}", time.monotonic() - t0
    try:
        return status, json.loads(text), time.monotonic() - t0
    except ValueError:
        return status, text, time.monotonic() - t0


def metrics(base: str, prefix: str) -> dict:
    """/metrics parsed ({"status", "values"}); llama-server answers 501 unless started with --metrics."""
    status, text = get(f"{base}/metrics")
    return {"status": status, "values": pe.prometheus(text, prefix) if status == 200 else {},
            **({} if status == 200 else {"error": text.strip()[:200]})}


def llamacpp_completion(base: str, n_predict: int, prompt: str = PROMPT, timeout: float = 600) -> dict:
    """One /completion at temperature 0: the server's own `timings` and draft counts."""
    status, body, waited = post_json(f"{base}/completion", {"prompt": prompt, "n_predict": n_predict,
                                                             "temperature": 0, "cache_prompt": False,
                                                             "ignore_eos": True}, timeout)
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
            "metrics_delta": pe.deltas(before["values"], after["values"]) if after["status"] == 200 else {}}
