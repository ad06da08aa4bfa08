"""service: the engine's flags (before start) and the proofs that it runs right (after)."""

from __future__ import annotations

from p2pkit import engine_cmd
from p2pkit.checks import FAIL, PASS, WARN, Check, failed, figure, fit, judge, not_measured, unknown
from p2pkit.config import Profile
from p2pkit.parse import nccl

GIB = 1 << 30


def precheck(p: Profile) -> list[Check]:
    return engine_cmd.validate(p)


def check(f: dict, p: Profile) -> list[Check]:
    out = precheck(p) + head_up(f.get("head_rendezvous")) + fit.check(f.get("vram_fit"), p)
    missing = not_measured(f, "service", "service.running", "engine service proven",
                           "doctor does not wait on the service", "a run of `p2pkit verify service`")
    if missing:
        return [*out, missing]
    s = f["service"]
    a = s["analyze"]
    out.append(judge("service.unit_verify", "systemd-analyze verify is clean", a["verify_rc"] == 0 and
                     not a["verify_issues"], "; ".join(a["verify_issues"]) or f"exit {a['verify_rc']}", "clean",
                     "fix the unit (templates/p2pkit-engine.service.j2) or the profile values it was rendered from"))
    exp = a["exposure"]
    out.append(figure("service.exposure", "systemd-analyze security exposure", exp, "<=",
                      p.serve.security_max_exposure, "exposure", "the unit's hardening was weakened: restore it, or "
                      "raise serve.security_max_exposure knowingly", context=a["exposure_label"] or "",
                      missing="not read"))
    h = s["health"]
    cause = s.get("likely_cause")
    tail = " | ".join(s.get("log_tail", [])[-5:])
    if s.get("role") == "worker":  # headless: no API; joined when NCCL formed its communicator with the head
        why = gone(s.get("log_tail", [])) if h.get("exited") else f"no NCCL channel within {h['seconds']} s"
        out.append(judge("service.joined", "this worker joined the head", h["ok"],
                         f"after {h['seconds']} s: {h['line']}" if h["ok"] else f"{why}; last log lines: {tail}",
                         "an NCCL channel to the head", "read `p2pkit serve logs`; the head must be up first (P27) "
                         "and reachable over the fabric (master-addr)", pitfall="P27"))
    elif h["ok"]:
        out.append(Check("service.health", "/health answers 200", PASS, f"200 after {h['seconds']} s "
                         f"(codes seen: {h['codes']})", 200))
    else:
        why = gone(s.get("log_tail", [])) if h.get("exited") else f"no 200 within {h['seconds']} s"
        if s.get("role") == "head" and not h.get("exited") and not cause:
            hint, pit = ("the head answers /health only once every worker node has joined: bring the workers up "
                         "(`p2pkit up` on each, or one inventory run for all nodes)", "P27")
        else:
            hint = f"likely cause: {cause}" if cause else "read `p2pkit serve logs`"
            pit = "P18" if cause and "(P18)" in cause else "P11" if cause and "fit" in cause else ""
        out.append(Check("service.health", "/health answers 200", FAIL, f"{why}; last log lines: {tail}", 200,
                         hint, pit))
    pc = s.get("pid_cgroup", {})
    if failed(pc):
        out.append(unknown("service.memory_cap", "service's cgroup has no memory cap", pc, "no cap", pitfall="P12"))
    else:
        caps = pc["memory_caps"]
        out.append(judge("service.memory_cap", "service's cgroup has no memory cap", not caps,
                         ", ".join(f"{c['file']} = {c['limit_bytes'] / GIB:.1f} GiB" for c in caps) or
                         f"none up from {pc['v2_path'] or pc['v1_memory_path']}", "no cap",
                         "a memory cap will OOM-kill the engine under load: the unit must run in p2pkit.slice "
                         "(MemoryMax=infinity), not in a user session", pitfall="P12"))
        own = f.get("cgroup", {})
        if not failed(own) and own.get("memory_caps") and not caps:
            out.append(Check("service.not_inherited", "p2pkit's own memory cap is not the service's", WARN,
                             f"p2pkit runs capped ({own['memory_caps'][0]['file']}); the service does not",
                             "service uncapped", "fine: the service runs in p2pkit.slice and does not inherit "
                             "the cap of the terminal p2pkit was started from", "P12"))
    if "nccl_transports" in s:
        out.append(_nccl(s["nccl_transports"], p))
    out += _user_access(s.get("user_access"))
    out += fit.headroom(s.get("vram_after"), p)
    if "table_maps" in s:
        out.append(madv_random(s["table_maps"]))
    if s.get("listen") is None:
        return out + _spec(s, p)
    ln = s["listen"]
    want = f"{p.serve.host}:{p.serve.port}"
    addrs = ln.get("addresses", [])
    ok = ln["connect"] and (not addrs or want in addrs or (p.serve.host == "::" and f":::{p.serve.port}" in addrs))
    out.append(judge("service.listen_where", "listening where the profile says", ok,
                     ", ".join(addrs) or ("connected" if ln["connect"] else ln.get("connect_error", "no answer")),
                     want, "the engine listens elsewhere: check serve.host and serve.port"))
    return out + _spec(s, p)


# What an engine prints once it serves: llama.cpp's "main: server is listening on http://...", vLLM's
# (uvicorn's) "Application startup complete.", NInfer's "listening on HOST:PORT".
SERVING_LINES = ("server is listening on", "Application startup complete", "listening on ")


def gone(tail: list[str]) -> str:
    """Why the engine is not there, from its last log lines: it never came up (exited at start), or
    it had served and was stopped since (by hand, `systemctl stop`, a crash after start)."""
    if any(n in ln for ln in tail for n in SERVING_LINES):
        last = tail[-1].strip() if tail else ""
        return f"the engine is not running (stopped after it had started: last log line {last!r})"
    return "the engine exited at start"


def madv_random(t: dict) -> Check:
    """P26 on the running engine: every mapping of the n-gram table carries MADV_RANDOM (`rr` in its
    VmFlags); an environment variable alone proves nothing (the tree may ignore it, or map it plainly)."""
    title = "the n-gram table is mapped with MADV_RANDOM"
    maps = t.get("mappings", [])
    plain = sorted({m["path"] for m in maps if "rr" not in m["flags"]})
    if not maps:
        why = "; ".join(t.get("unread", [])) or f"no process of the engine maps a file under {t['directory']}"
        return Check("service.madv_random", title, FAIL, why, "rr in VmFlags", "the engine does not mmap the table: "
                     "set serve.env.VLLM_PLE_MMAP = \"1\" and VLLM_PLE_MMAP_DIR to the local copy, on a vLLM tree "
                     "that has the mmap path (seed 004)", "P26")
    return judge("service.madv_random", title, not plain, f"without rr: {', '.join(plain)}" if plain else
                 f"{len(maps)} mapping(s), all rr (pid {t['pid']})", "rr in VmFlags",
                 "the table is mapped without MADV_RANDOM: reads amplify about 30x on hash-scattered lookups; use "
                 "the seed's vLLM tree, whose mmap path advises MADV_RANDOM", pitfall="P26")


def head_up(h: dict | None) -> list[Check]:
    """P27 on a worker node: its head must be up (its rendezvous port answering) before it starts;
    the service stage refuses to start it otherwise. doctor reads the same, without waiting."""
    if not h or h.get("role") != "worker":
        return []
    if failed(h):
        return [unknown("service.head_up", "the head node is up before this worker", h, "answering", pitfall="P27")]
    return [judge("service.head_up", "the head node is up before this worker", h["up"],
                  f"{h['address']} answers" if h["up"] else f"{h['address']}: {h.get('why')}", "answering",
                  "start the head node first (its `p2pkit up`), then this worker, about 30 s later: a worker started "
                  "before its head fails; an inventory run waits for the head by itself", pitfall="P27")]


def _nccl(seen: list[str], p: Profile) -> Check:
    """NCCL across hosts must say NET/IB (RoCE); NET/Socket is the silent TCP fallback (P23)."""
    want = "NET/IB" if p.network.require_roce else "a network transport"
    if not seen:
        return Check("service.nccl_transport", "NCCL runs over RoCE", FAIL, "no NCCL channel line in the log", want,
                     "the engine's environment must have NCCL_DEBUG=INFO (p2pkit's env file sets it); without the "
                     "line nobody can tell IB from sockets", "P23")
    socket_ = [t for t in seen if nccl.is_socket(t)]
    ib = [t for t in seen if nccl.is_rdma(t)]  # NET/IB, or an external IB plugin's NET/IBext_v8
    ok = not socket_ and (not p.network.require_roce or bool(ib))
    return judge("service.nccl_transport", "NCCL runs over RoCE", ok, ", ".join(seen), want,
                 "NCCL fell back to TCP sockets (about 40% of the prefill speed): run natively, not in a default "
                 "container; NCCL_IB_HCA must name this boot's ACTIVE port (`p2pkit net hca`)", pitfall="P23")


def _spec(s: dict, p: Profile) -> list[Check]:
    spec = p.serve.flags.get("spec") or p.serve.flags.get("spec-type")
    if p.engine.recipe == "llamacpp":
        return check_llamacpp_requests(s, p)
    out: list[Check] = []
    if spec:  # NInfer and vLLM: their start-up line (no per-request proof is read for them yet)
        text = "\n".join(s.get("log_tail", [])).lower()
        seen = f"spec {str(spec).lower()}" in text or "draft acceptance" in text
        out.append(judge("service.spec_running", "speculative decoding is really running", seen,
                         "a start-up line shows it" if seen else "no start-up line shows it",
                         f"spec {spec} running", "the engine ignored the speculative method: check its log and "
                         "that the artifact carries the draft components", pitfall="P19"))
    return out


def check_llamacpp_requests(s: dict, p: Profile) -> list[Check]:
    """llama-server: one real completion once /health is 200 (MTP under tensor split can crash at the
    first decode with /health already 200), and with a speculative type the draft counts of that
    response and of /metrics' spec_decode counters must have grown (P19). `-md` alone leaves
    drafting off and the start-up log does not say either way: only the counters tell."""
    spec = p.serve.flags.get("spec-type")
    fc = s.get("first_completion")
    if fc is None:
        return []  # /health never answered 200: the health check already failed
    t = fc.get("timings") or {}
    tail = " | ".join(s.get("log_tail", [])[-5:])
    ok = fc.get("status") == 200 and (t.get("predicted_n") or 0) > 0 and fc.get("alive_after", True)
    got = (f"{t.get('predicted_n')} tokens in {t.get('predicted_ms', 0):.1f} ms (server timings)" if ok else
           f"HTTP {fc.get('status')}: {fc.get('error', '')[:160]}; alive after: {fc.get('alive_after')}; "
           f"last log lines: {tail}")
    out = [judge("service.first_completion", "one real completion after /health 200", ok, got,
                 "HTTP 200 with generated tokens, the server still running",
                 "the server said healthy but failed its first decode: read `p2pkit serve logs` (with MTP under "
                 "--split-mode tensor this is the known crash; try --split-mode layer or another KV type)",
                 pitfall="P19")]
    if not spec:
        return out
    if fc.get("metrics_status") != 200:
        out.append(Check("service.spec_running", "speculative decoding is really running", FAIL,
                         f"/metrics answered {fc.get('metrics_status')}", "spec_decode counters growing",
                         "start llama-server with --metrics (serve.flags.metrics = true): without it /metrics "
                         "answers 501 and nothing proves drafting", "P19"))
        return out
    d = fc.get("metrics_delta", {})
    drafted = d.get("spec_decode_num_draft_tokens_total", 0)
    accepted = d.get("spec_decode_num_accepted_tokens_total", 0)
    ok = ok and (t.get("draft_n") or 0) > 0 and drafted > 0
    out.append(judge("service.spec_running", "speculative decoding is really running", ok,
                     f"response draft_n {t.get('draft_n', 0)}, accepted {t.get('draft_n_accepted', 0)}; /metrics "
                     f"spec_decode_num_draft_tokens_total +{drafted:g}, accepted_tokens_total +{accepted:g}",
                     "draft tokens in the response and in /metrics",
                     f"--spec-type {spec} is set but nothing was drafted: the draft model or the MTP layers are "
                     "missing (`-md` alone leaves drafting off; the model stage checks the nextn layers)",
                     pitfall="P19"))
    return out


def _user_access(u: dict | None) -> list[Check]:
    if not u:
        return []
    if "error" in u:
        return [unknown("service.user_access", "the engine's user reaches what the engine reads", u,
                        "the unit's User= exists", needed=False)]
    blocked = u["blocked"]
    return [judge("service.user_access", "the engine's user reaches what the engine reads", not blocked,
                  "; ".join(blocked.values()) or f"{u['user']} reaches all", "working directory, engine and model "
                  f"reachable by {u['user']}", f"give {u['user']} search (x) on each directory named and read on the "
                  "model (chown/chmod that path, never the whole tree); re-run `p2pkit up --from service`")]
