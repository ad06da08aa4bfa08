"""P19 on every engine, from its own counters around one real request: vLLM's spec-decode counters
(vllm/v1/spec_decode/metrics.py, served by the simulated vLLM with vLLM's names through
prometheus_client, as vLLM exposes them), NInfer's request log (the `speculative` block of
`request_done`, src/serve/request_log.cpp). llama.cpp's real counters: tests/test_llamacpp.py.
Zero drafts with speculative decoding configured fails on each."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from p2pkit.core import config
from p2pkit.host import engine_api
from p2pkit.rules.engines import ninfer as ninfer_rules
from p2pkit.rules.engines import vllm as vllm_rules
from p2pkit.sim import serving

FIX = Path(__file__).parent / "fixtures"
SPEC = '{"method":"mtp","num_speculative_tokens":3}'


@pytest.fixture
def vllm_server():
    """The simulated vLLM's /v1/completions and /metrics on a loopback port, in this process."""
    servers = []

    def start(window: int, drafting: bool = True):
        metrics = serving.VllmMetrics("m", 4096, window)
        # not drafting: the counters of a speculative config are served and stay where they are; the
        # request is accounted elsewhere
        handle = serving.vllm_completions(metrics if drafting else serving.VllmMetrics("m", 4096, 0), "m",
                                          window if drafting else 0)

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, ctype, body: bytes):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, "text/plain; version=0.0.4", metrics.text())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                code, doc = handle(body)
                self._send(code, "application/json", json.dumps(doc).encode())

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _vllm(fc: dict) -> dict:
    p = config.load("dual-spark-vllm", [f"serve.flags.speculative-config={SPEC}"])
    s = {"health": {"ok": True}, "first_completion": {**fc, "alive_after": True}, "log_tail": []}
    return {c.id: c for c in vllm_rules.check_vllm_requests(s, p)}


def test_vllm_drafting_is_proven_by_its_spec_decode_counters(vllm_server):
    fc = engine_api.vllm_first_completion(vllm_server(3), "m")
    c = _vllm(fc)
    assert c["service.first_completion"].status == "pass"
    r = c["service.spec_running"]
    assert r.status == "pass" and r.pitfall == "P19", r
    d = fc["metrics_delta"]
    assert d["spec_decode_num_drafts_total"] > 0 and d["spec_decode_num_draft_tokens_total"] == \
        3 * d["spec_decode_num_drafts_total"]
    # acceptance per position = accepted at that position / drafts, per label, not summed
    assert set(fc["accepted_per_pos_delta"]) == {"0", "1", "2"}
    assert "acceptance per position" in r.measured


def test_vllm_zero_drafts_with_a_speculative_config_fails(vllm_server):
    fc = engine_api.vllm_first_completion(vllm_server(3, drafting=False), "m")
    assert "spec_decode_num_drafts_total" in fc["metrics_delta"]  # the counters exist, at +0
    r = _vllm(fc)["service.spec_running"]
    assert r.status == "fail" and "drafts +0" in r.measured and "nothing was drafted" in r.hint


def test_vllm_without_spec_counters_fails_naming_the_config(vllm_server):
    fc = engine_api.vllm_first_completion(vllm_server(0), "m")
    r = _vllm(fc)["service.spec_running"]
    assert r.status == "fail" and "no vllm:spec_decode_* counters" in r.measured and SPEC in r.hint


def test_vllm_without_speculative_config_has_no_spec_check(vllm_server):
    fc = engine_api.vllm_first_completion(vllm_server(0), "m")
    base = config.load("dual-spark-vllm")
    flags = {k: v for k, v in base.serve.flags.items() if k != "speculative-config"}
    from dataclasses import replace

    p = replace(base, serve=replace(base.serve, flags=flags))
    ids = [c.id for c in vllm_rules.check_vllm_requests({"first_completion": {**fc, "alive_after": True}}, p)]
    assert ids == ["service.first_completion"]


# ---------------------------------------------------------------------------------------- NInfer

def _ninfer(fc: dict, spec: str = "dflash2") -> dict:
    p = config.load("dual-5090-ninfer", [f"serve.flags.spec={spec}"])
    s = {"health": {"ok": True}, "first_completion": {"status": 200, "usage": {"completion_tokens": 24},
                                                      "alive_after": True, **fc}, "log_tail": []}
    return {c.id: c for c in ninfer_rules.check_ninfer_requests(s, p)}


def _log_events(text: str) -> list[dict]:
    from p2pkit.parse import engine_api as pe

    return pe.ninfer_done(pe.jsonl(text))


def test_ninfer_drafting_is_proven_by_its_request_log():
    events = _log_events((FIX / "ninfer/request_log.jsonl").read_text())
    c = _ninfer({"request_log": "requests.jsonl", "log_events": events})
    r = c["service.spec_running"]
    assert c["service.first_completion"].status == "pass"
    assert r.status == "pass" and "drafted 35, accepted 18" in r.measured, r


def test_ninfer_zero_drafts_with_spec_fails(tmp_path):
    """The simulated NInfer's log (NInfer's keys) of a request that drafted nothing: backend none."""
    log = serving.NinferLog(str(tmp_path / "r.jsonl"), [], "a")
    req = log.request("m", 8, 0.0)
    log.done(req, serving.generate(4, 8, 0), "none")
    r = _ninfer({"request_log": "r.jsonl", "log_events": _log_events((tmp_path / "r.jsonl").read_text())})
    r = r["service.spec_running"]
    assert r.status == "fail" and "backend none" in r.measured and "drafted 0" in r.measured


def test_ninfer_without_a_request_log_cannot_prove_drafting():
    r = _ninfer({"request_log": None, "log_events": []})["service.spec_running"]
    assert r.status == "fail" and "request-log-jsonl" in r.hint and r.pitfall == "P19"


def test_ninfer_request_error_fails_the_first_completion():
    c = _ninfer({"status": 500, "error": "engine threw", "usage": {}, "request_log": "r.jsonl",
                 "log_events": [{"event": "request_error", "error": {"message": "engine threw"}}]})
    assert c["service.first_completion"].status == "fail"
    assert c["service.spec_running"].status == "fail"
