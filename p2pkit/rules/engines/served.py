"""What the engines share in judging the service's one real request after /health 200 (P19): answered with
generated tokens and the server still running; each engine module judges its own counters beside it."""

from __future__ import annotations

from p2pkit.rules.findings import FAIL, PASS, Check, reading

SPEC_TITLE = "speculative decoding is really running"


def first_completion(fc: dict, s: dict, generated: int, shown: str, hint: str) -> tuple[bool, Check]:
    """The one real request after /health 200 (P19): answered with generated tokens, the server still
    running; `shown` says what it generated (the count at its first {}), a failure says the answer and
    the log's last lines."""
    ok = fc.get("status") == 200 and generated > 0 and fc.get("alive_after", True)
    tail = " | ".join(s.get("log_tail", [])[-5:])
    failed_text = (f"HTTP {fc.get('status')}: {str(fc.get('error', ''))[:160]}; alive after: "
                   f"{fc.get('alive_after')}; last log lines: {tail}")
    # the figure: the tokens generated (a failure's text is the server's answer, with no number of its own)
    return ok, reading("service.first_completion", "one real completion after /health 200", PASS if ok else FAIL,
                       generated if ok else None, "count", "HTTP 200 with generated tokens, the server still running",
                       hint, "P19", text=shown, missing=failed_text)


def openai_first(fc: dict, s: dict, engine: str) -> Check:
    """vLLM and NInfer: the one real request answered with generated tokens, the server still running."""
    u = fc.get("usage") or {}
    return first_completion(fc, s, u.get("completion_tokens") or 0,
                            f"{{}} tokens (usage), {fc.get('client_seconds')} s at the client",
                            f"{engine} said healthy but failed its first decode: read `p2pkit serve logs`")[1]


