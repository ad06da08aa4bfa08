"""Condition guards for the service stage's checks (p2pkit.stages.service.checks): each test gives a check
function the facts where one of its conditions decides the outcome, and asserts the finding's status,
id, pitfall and measured text (bench/check_guard.py --conditions --only service)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pkit.core import config
from p2pkit.rules.engines import llamacpp as llamacpp_rules
from p2pkit.rules.engines import ninfer as ninfer_rules
from p2pkit.rules.engines import served
from p2pkit.rules.engines import vllm as vllm_rules
from p2pkit.rules.findings import FAIL, PASS, SKIP, WARN
from p2pkit.stages.service import checks

LLAMA = config.load("dual-5090-llamacpp")  # 127.0.0.1:8080, no RoCE required, NCCL floor 2.26.2 (P16)
NINFER = config.load("dual-5090-ninfer")  # --spec dflash2, no NCCL floor
SPARK = config.load("dual-spark-vllm")  # one GPU per node, RoCE required, NCCL floor 2.29.3 (P37)
PORT = LLAMA.serve.port
V2 = "/p2pkit.slice/p2pkit-engine.service"
OOM = "out of GPU memory at start: lower ctx-size or the KV type (P18)"
FIT = "the KV cache does not fit the free VRAM: lower max-context (P11)"
SERVING = "main: server is listening on http://127.0.0.1:8080"


def by_id(cs) -> dict:
    return {c.id: c for c in cs}


def serve(p, **kw):
    return replace(p, serve=replace(p.serve, **kw))


def svc(**kw) -> dict:
    """The service fact of a good llama.cpp start under systemd, with the keys given replaced."""
    s = {"role": "single", "analyze": {"verify_rc": 0, "verify_issues": [], "exposure": 1.9, "exposure_label": "OK"},
         "health": {"ok": True, "seconds": 2.0, "codes": [503, 200], "exited": False},
         "pid_cgroup": {"v2_path": V2, "v1_memory_path": None, "memory_caps": []},
         "listen": {"connect": True, "addresses": [f"127.0.0.1:{PORT}"]}, "log_tail": ["a", "b"],
         "likely_cause": None}
    s.update(kw)
    return {k: v for k, v in s.items() if v is not ...}


def run(p=LLAMA, f: dict | None = None, **kw) -> dict:
    return by_id(checks.check({"service": svc(**kw), **(f or {})}, p))


# ------------------------------------------------------------------------------------------ alive

REFUSED = "<urlopen error [Errno 111] Connection refused>"


@pytest.mark.parametrize("live,status,measured", [
    ({"error": "systemctl: timed out"}, FAIL, "could not determine: systemctl: timed out"),
    ({"pid": None, "state": None, "health": None}, FAIL, "not running: the unit has no main PID"),
    ({"pid": None, "manager": "launcher"}, FAIL, "not running: the launcher's record names no running process"),
    ({"pid": 42, "state": "T", "health": {"code": 200, "text": ""}}, FAIL,
     "frozen: pid 42 is stopped (state T in /proc/42/stat)"),
    ({"pid": 42, "state": "t", "health": None}, FAIL, "frozen: pid 42 is stopped (state t in /proc/42/stat)"),
    ({"pid": 42, "state": "S", "health": None}, PASS, "pid 42 running (state S)"),
    ({"pid": 42, "state": "S", "health": {"code": None, "text": "timed out"}}, FAIL,
     "not answering: pid 42 (state S) runs, and /health gave no answer: timed out"),
    ({"pid": 42, "state": "S", "health": {"code": 503, "text": "loading"}}, WARN,
     "pid 42 answers /health 503 (loading?)"),
    ({"pid": 42, "state": "S", "health": {"code": 200, "text": "ok"}}, PASS, "pid 42 running, /health 200"),
    # issue 47 item 3: just after a boot nothing listens yet; refused within the unit's wait is "starting"
    ({"pid": 42, "state": "S", "health": {"code": None, "text": REFUSED}, "age_s": 6.4, "starting_window_s": 900.0},
     WARN, f"starting: pid 42 runs for 6 s and nothing listens on /health's port yet ({REFUSED}); the unit's start "
           "waits up to 900 s for it"),
    ({"pid": 42, "state": "S", "health": {"code": None, "text": REFUSED}, "age_s": 901.0, "starting_window_s": 900.0},
     FAIL, f"not answering: pid 42 (state S) runs, and /health gave no answer: {REFUSED}"),
    ({"pid": 42, "state": "S", "health": {"code": None, "text": "timed out"}, "age_s": 3.0,
      "starting_window_s": 900.0}, FAIL, "not answering: pid 42 (state S) runs, and /health gave no answer: timed out"),
    ({"pid": 42, "state": "S", "health": {"code": None, "text": REFUSED}, "age_s": None, "starting_window_s": 900.0},
     FAIL, f"not answering: pid 42 (state S) runs, and /health gave no answer: {REFUSED}"),
], ids=["unread", "no-pid", "launcher-no-pid", "stopped-T", "stopped-t", "headless", "silent", "loading", "healthy",
        "starting", "refused-past-the-wait", "accepts-never-answers-young", "refused-age-unread"])
def test_alive_judges_the_engine_now(live, status, measured):
    (c,) = checks.alive(live)
    assert (c.id, c.status, c.measured) == ("service.engine_alive", status, measured)
    assert bool(c.hint) == (status != PASS)


def test_alive_has_nothing_to_say_without_an_installed_engine():
    assert checks.alive(None) == [] and checks.alive({"installed": False}) == []


# ------------------------------------------------------------------------------ check: what is there


def test_doctor_without_the_service_fact_says_it_was_not_measured():
    out = checks.check({}, LLAMA)
    c = out[-1]
    assert (c.id, c.status) == ("service.running", SKIP)
    assert c.measured == "not measured here: doctor does not wait on the service"


def test_launcher_started_engine_is_judged_without_a_unit():
    la = {"pid": 77, "cgroup": {"dir": "/sys/fs/cgroup/p2pkit-engine"}}
    c = run(analyze=None, manager="launcher", launcher=la)
    assert "service.unit_verify" not in c
    m = c["service.manager"]
    assert m.status == WARN and m.measured == (f"{checks.NO_RESTART} (started by p2pkit's launcher, pid 77, "
                                               "cgroup /sys/fs/cgroup/p2pkit-engine)")


@pytest.mark.parametrize("key,value,id_", [
    ("nccl_transports", ["NET/IB/0"], "service.nccl_transport"),
    ("nccl", {"connections": ["0 -> 1"], "local": ["0 -> 1"], "local_not_p2p": []}, "service.nccl_p2p"),
    ("table_maps", {"pid": 9, "directory": "/t", "mappings": [{"path": "/t/a", "flags": "rd rr"}]},
     "service.madv_random"),
])
def test_each_optional_service_proof_is_judged_when_measured(key, value, id_):
    assert id_ not in run()
    c = run(**{key: value})[id_]
    assert c.status == PASS


# ------------------------------------------------------------------------------ check: a worker joins


def test_worker_that_joined_passes_with_its_seconds():
    line = "NCCL INFO Channel 00/0 : 0[0] -> 1[0] via NET/IB/0"
    c = run(SPARK, role="worker", health={"ok": True, "seconds": 12.0, "line": line, "exited": False})
    j = c["service.joined"]
    assert (j.status, j.value, j.pitfall) == (PASS, 12.0, "P27")
    assert j.measured == f"after 12.00 s: {line}" and "service.health" not in c


@pytest.mark.parametrize("exited,tail,why", [
    (False, ["a", "b"], "no NCCL channel or rank assignment within 30 s"),
    (True, ["a", "b"], "the engine exited at start"),
    (True, [SERVING, "bye"], "the engine is not running (stopped after it had started: last log line 'bye')"),
])
def test_worker_that_did_not_join_fails_saying_why(exited, tail, why):
    c = run(SPARK, role="worker", log_tail=tail,
            health={"ok": False, "seconds": 30, "line": "", "exited": exited})["service.joined"]
    assert (c.status, c.value, c.pitfall) == (FAIL, None, "P27")
    assert c.measured == f"{why}; last log lines: {' | '.join(tail)}"


# ---------------------------------------------------------------------------- check: /health failed


def _health(role="single", cause=None, tail=("a", "b"), **h):
    return run(role=role, likely_cause=cause, log_tail=list(tail),
               health={"ok": False, "seconds": 60, "codes": [503], **h})["service.health"]


def test_health_of_an_engine_that_exited_says_so():
    c = _health(exited=True)
    assert (c.status, c.pitfall, c.hint) == (FAIL, "", "read `p2pkit serve logs`")
    assert c.measured == "the engine exited at start; last log lines: a | b"
    c = _health(exited=True, tail=[SERVING, "bye"])
    assert c.measured.startswith("the engine is not running (stopped after it had started")


def test_health_that_never_came_names_no_cause_it_does_not_have():
    c = _health(exited=False)
    assert c.measured == "no 200 within 60 s; last log lines: a | b"
    assert (c.status, c.pitfall, c.hint) == (FAIL, "", "read `p2pkit serve logs`")


def test_health_of_a_stopped_or_hung_load():
    c = _health(stalled="pid 9 in state T")
    assert c.measured.startswith("pid 9 in state T;") and "SIGSTOP" in c.hint and c.pitfall == ""
    c = _health(stalled="no progress for 60 s")
    assert c.hint.startswith("the engine hangs while loading") and c.pitfall == ""
    # a stall with a cause read from the log: the cause is the hint
    c = _health(stalled="no progress for 60 s", cause=OOM)
    assert (c.hint, c.pitfall) == (f"likely cause: {OOM}", "P18")


@pytest.mark.parametrize("exited,cause,hint,pit", [
    (False, None, "the head answers /health only once every worker node has joined", "P27"),
    (True, None, "read `p2pkit serve logs`", ""),
    (False, OOM, f"likely cause: {OOM}", "P18"),
], ids=["waiting-for-workers", "exited", "with-cause"])
def test_head_whose_health_fails_waits_for_its_workers_only_when_nothing_else_explains_it(exited, cause, hint, pit):
    c = _health(role="head", exited=exited, cause=cause)
    assert c.status == FAIL and c.hint.startswith(hint) and c.pitfall == pit


@pytest.mark.parametrize("cause,pit", [(OOM, "P18"), (FIT, "P11"), ("a flag the engine does not know", "")])
def test_health_failure_pitfall_follows_the_likely_cause(cause, pit):
    c = _health(exited=True, cause=cause)
    assert (c.status, c.hint, c.pitfall) == (FAIL, f"likely cause: {cause}", pit)


# ------------------------------------------------------------------------------ check: memory cap


CAP = {"file": "memory.max", "limit_bytes": 8 << 30}


@pytest.mark.parametrize("manager,fix", [("launcher", checks.LAUNCHER_CAP_FIX), ("systemd", "p2pkit.slice")])
def test_memory_cap_is_the_tightest_with_the_fix_for_who_started_the_engine(manager, fix):
    big = {"file": "memory.high", "limit_bytes": 64 << 30}
    c = run(manager=manager, pid_cgroup={"v2_path": V2, "v1_memory_path": None, "memory_caps": [big, CAP]})[
        "service.memory_cap"]
    assert (c.status, c.value, c.unit, c.pitfall) == (FAIL, 8.0, "GiB", "P12")
    assert c.measured == f"memory.max = {8 << 30} bytes (8.0 GiB), memory.high = {64 << 30} bytes (64.0 GiB)"
    assert fix in c.hint


V1 = "/sys/fs/cgroup/memory/p2pkit"


@pytest.mark.parametrize("v2,v1,where", [(V2, None, V2), (None, V1, V1)])
def test_no_memory_cap_says_where_it_looked(v2, v1, where):
    c = run(pid_cgroup={"v2_path": v2, "v1_memory_path": v1, "memory_caps": []})["service.memory_cap"]
    assert (c.status, c.value, c.measured) == (PASS, None, f"none up from {where}")


@pytest.mark.parametrize("manager,hint", [("launcher", "fine: p2pkit's launcher started the engine in a memory "
                                                      f"cgroup of its own ({V2}), not in the capped one p2pkit runs"),
                                          ("systemd", "fine: the service runs in p2pkit.slice")])
def test_p2pkits_own_cap_not_inherited_by_the_service_is_a_warning(manager, hint):
    own = {"memory_caps": [{"file": "memory.max", "limit_bytes": 4 << 30}]}
    c = run(f={"cgroup": own}, manager=manager)["service.not_inherited"]
    assert (c.status, c.pitfall) == (WARN, "P12") and c.hint.startswith(hint)
    assert c.measured == "p2pkit runs capped (memory.max); the service does not"


def test_no_not_inherited_finding_when_the_service_is_capped_too_or_p2pkit_is_not():
    own = {"memory_caps": [{"file": "memory.max", "limit_bytes": 4 << 30}]}
    capped = {"v2_path": V2, "v1_memory_path": None, "memory_caps": [CAP]}
    assert "service.not_inherited" not in run(f={"cgroup": own}, pid_cgroup=capped)
    assert "service.not_inherited" not in run(f={"cgroup": {"memory_caps": []}})
    assert "service.not_inherited" not in run(f={"cgroup": {"error": "no /proc/self/cgroup"}})


# ---------------------------------------------------------------------------- check: listening where


@pytest.mark.parametrize("p,listen,status,measured", [
    (LLAMA, {"connect": True, "addresses": [f"127.0.0.1:{PORT}"]}, PASS, f"127.0.0.1:{PORT}"),
    (LLAMA, {"connect": True, "addresses": [f"127.0.0.1:{PORT}", "127.0.0.1:9090"]}, PASS,
     f"127.0.0.1:{PORT}, 127.0.0.1:9090"),
    (LLAMA, {"connect": True, "addresses": []}, PASS, "connected"),  # psutil could not list them
    (LLAMA, {"connect": True, "addresses": ["0.0.0.0:9999"]}, FAIL, "0.0.0.0:9999"),
    (LLAMA, {"connect": True, "addresses": [f":::{PORT}"]}, FAIL, f":::{PORT}"),
    (LLAMA, {"connect": False, "addresses": [], "connect_error": "Connection refused"}, FAIL, "Connection refused"),
    (LLAMA, {"connect": False, "addresses": []}, FAIL, "no answer"),
    (serve(LLAMA, host="::"), {"connect": True, "addresses": [f":::{PORT}"]}, PASS, f":::{PORT}"),
    (serve(LLAMA, host="::"), {"connect": True, "addresses": [f"0.0.0.0:{PORT}"]}, FAIL, f"0.0.0.0:{PORT}"),
], ids=["there", "there-and-more", "connected-unlisted", "elsewhere", "v6-any-for-loopback", "refused",
        "no-answer", "v6-any", "v4-any-for-v6"])
def test_listening_where_the_profile_says(p, listen, status, measured):
    c = run(p, listen=listen)["service.listen_where"]
    assert (c.status, c.measured, c.expected) == (status, measured, f"{p.serve.host}:{PORT}")


# ------------------------------------------------------------------------------------------- _unit


@pytest.mark.parametrize("rc,issues,label,status,measured", [
    (0, [], "OK", PASS, "exit 0"),
    (1, [], "OK", FAIL, "exit 1"),
    (0, ["Unknown key X", "Bad path"], "OK", FAIL, "Unknown key X; Bad path"),
])
def test_unit_verify_is_clean_only_with_exit_0_and_no_issue(rc, issues, label, status, measured):
    c = by_id(checks._unit({"verify_rc": rc, "verify_issues": issues, "exposure": 1.9, "exposure_label": label},
                           LLAMA))["service.unit_verify"]
    assert (c.status, c.measured) == (status, measured)


@pytest.mark.parametrize("label,measured", [("OK", "1.9 (OK)"), ("", "1.9")])
def test_unit_exposure_carries_its_label(label, measured):
    c = by_id(checks._unit({"verify_rc": 0, "verify_issues": [], "exposure": 1.9, "exposure_label": label},
                           LLAMA))["service.exposure"]
    assert (c.status, c.value, c.measured) == (PASS, 1.9, measured)


# ------------------------------------------------------------------------------------- launcher


@pytest.mark.parametrize("cg,where", [({"dir": "/sys/fs/cgroup/p2pkit-engine"}, "/sys/fs/cgroup/p2pkit-engine"),
                                      ({"error": "cgroup2 not mounted"}, "cgroup2 not mounted"),
                                      ({}, "no cgroup")])
def test_launcher_findings_name_the_engines_cgroup(cg, where):
    out = checks.launcher_findings({"launcher": {"pid": 5, "cgroup": cg}})
    assert [c.id for c in out] == ["service.manager"]
    assert out[0].status == WARN and out[0].measured.endswith(f"pid 5, cgroup {where})")


def test_launcher_that_could_not_move_the_engine_fails_p12():
    out = by_id(checks.launcher_findings({"launcher": {"pid": 5, "cgroup": {}, "move_error": "EACCES"}}))
    c = out["service.launcher_cgroup"]
    assert (c.status, c.measured, c.pitfall, c.hint) == (FAIL, "EACCES", "P12", checks.LAUNCHER_CAP_FIX)


# ----------------------------------------------------------------------------------- madv_random


@pytest.mark.parametrize("unread,measured", [
    (["pid 9: Permission denied"], "pid 9: Permission denied"),
    ([], "no process of the engine maps a file under /var/lib/ngram"),
])
def test_madv_random_without_mappings_says_why(unread, measured):
    c = checks.madv_random({"pid": 9, "directory": "/var/lib/ngram", "mappings": [], "unread": unread})
    assert (c.id, c.status, c.measured, c.pitfall) == ("service.madv_random", FAIL, measured, "P26")


# --------------------------------------------------------------------------------------- head_up


@pytest.mark.parametrize("h,status,measured", [
    ({"role": "worker", "address": "10.0.0.1:29511", "up": True}, PASS, "10.0.0.1:29511 answers"),
    ({"role": "worker", "address": "10.0.0.1:29511", "up": False, "why": "Connection refused"}, FAIL,
     "10.0.0.1:29511: Connection refused"),
])
def test_head_up_says_whether_the_head_answers(h, status, measured):
    (c,) = checks.head_up(h)
    assert (c.id, c.status, c.measured, c.pitfall) == ("service.head_up", status, measured, "P27")
    assert checks.head_up({"role": "head"}) == []


WORKER = replace(SPARK, serve=replace(SPARK.serve, flags={**SPARK.serve.flags, "node-rank": 1,
                                                           "master-addr": "10.0.0.1"}))


@pytest.mark.parametrize("p,ids", [(WORKER, ["service.head_up"]), (SPARK, [])], ids=["worker", "head"])
def test_head_up_that_could_not_be_read_is_a_finding_on_a_worker_only(p, ids):
    """A fact that failed to read ({"error": ...}, facts.collect) carries no role: the profile says
    whether this node is a worker, whose P27 must then not vanish."""
    h = {"error": "could not determine head_rendezvous: RuntimeError: boom"}
    c = by_id(checks.check({"head_rendezvous": h}, p))
    assert [k for k in c if k == "service.head_up"] == ids
    if ids:
        u = c["service.head_up"]
        assert (u.status, u.pitfall) == (FAIL, "P27")
        assert u.measured == "could not determine: could not determine head_rendezvous: RuntimeError: boom"
    assert checks.head_up(h) == [] and checks.head_up(h, "head") == []


# ------------------------------------------------------------------------------------------- _nccl


@pytest.mark.parametrize("p,seen,status,expected", [
    (SPARK, ["NET/IB/0"], PASS, "NET/IB"),
    (SPARK, ["P2P/CUMEM"], FAIL, "NET/IB"),  # RoCE required and none taken
    (SPARK, ["NET/IB/0", "NET/Socket"], FAIL, "NET/IB"),
    (LLAMA, ["P2P/CUMEM"], PASS, "a network transport"),
    (LLAMA, ["NET/Socket"], FAIL, "a network transport"),
])
def test_nccl_transport_over_roce_where_the_profile_requires_it(p, seen, status, expected):
    c = checks._nccl(seen, p)
    assert (c.id, c.status, c.expected, c.measured, c.pitfall) == ("service.nccl_transport", status, expected,
                                                                   ", ".join(seen), "P23")


def test_nccl_transport_without_a_channel_line_fails():
    c = checks._nccl([], LLAMA)
    assert (c.status, c.measured, c.pitfall) == (FAIL, "no NCCL channel line in the log", "P23")


# -------------------------------------------------------------------------------------- nccl_local


def test_nccl_local_without_connections_is_skipped_saying_so():
    c = checks.nccl_local({"connections": [], "local": [], "across": []})
    assert (c.id, c.status, c.pitfall) == ("service.nccl_p2p", SKIP, "P30")
    assert c.measured.startswith("no NCCL connection line in this start's log")


def test_nccl_local_names_only_the_p2p_variables_of_the_environment():
    n = {"connections": ["0 -> 1"], "local": ["0 -> 1"], "local_not_p2p": [], "version": "2.27.3",
         "env": {"NCCL_P2P_LEVEL": "SYS", "NCCL_DEBUG": "INFO"}}
    c = checks.nccl_local(n)
    assert (c.status, c.value) == (PASS, 0)
    assert c.measured == "0 local connection(s) not via P2P; NCCL 2.27.3; NCCL_P2P_LEVEL=SYS (set by environment); " \
                         "between local GPUs: 0 -> 1"


# -------------------------------------------------------------------------- the real request (P19)


def test_spec_judges_the_request_of_each_engine():
    fc = {"status": 200, "usage": {"completion_tokens": 8}, "client_seconds": 0.4, "request_log": None}
    out = checks._spec({"first_completion": fc, "log_tail": []}, NINFER)
    assert [c.id for c in out] == ["service.first_completion", "service.spec_running"]
    assert out[0].status == PASS and out[0].value == 8


def test_first_completion_fails_when_the_server_died_after_answering():
    fc = {"status": 200, "alive_after": False}
    ok, c = served.first_completion(fc, {"log_tail": ["boom"]}, 8, "{} tokens", "hint")
    assert not ok and (c.id, c.status, c.value, c.pitfall) == ("service.first_completion", FAIL, None, "P19")
    assert c.measured == "HTTP 200: ; alive after: False; last log lines: boom"


def test_vllm_and_ninfer_with_no_request_have_nothing_to_judge():
    assert vllm_rules.check_vllm_requests({}, SPARK) == [] and ninfer_rules.check_ninfer_requests({}, NINFER) == []


def test_ninfer_without_spec_judges_the_completion_only():
    p = replace(NINFER, serve=replace(NINFER.serve, flags={k: v for k, v in NINFER.serve.flags.items()
                                                           if k != "spec"}))
    fc = {"status": 200, "usage": {"completion_tokens": 8}, "request_log": None}
    got = ninfer_rules.check_ninfer_requests({"first_completion": fc}, p)
    assert [c.id for c in got] == ["service.first_completion"]


@pytest.mark.parametrize("flag,context", [(1, "--parallel 1"), (None, "--parallel omitted (auto)")])
def test_running_slots_say_how_parallel_was_given(flag, context):
    c = llamacpp_rules.running_slots(4, flag)
    assert (c.id, c.status, c.value, c.pitfall) == ("service.spec_slots_running", WARN, 4, "P20")
    assert c.measured == f"4 (/props total_slots, {context})"


# ------------------------------------------------------------------------------------- _user_access


@pytest.mark.parametrize("u,status,measured", [
    ({"user": "p2pkit-engine", "blocked": {}}, PASS, "p2pkit-engine reaches all"),
    ({"user": "p2pkit-engine", "blocked": {"/m": "/srv: no search (x)", "/e": "/opt/e: no exec"}}, FAIL,
     "/srv: no search (x); /opt/e: no exec"),
    ({"error": "no such user p2pkit-engine"}, SKIP, "could not determine: no such user p2pkit-engine"),
])
def test_user_access_names_what_the_engines_user_cannot_reach(u, status, measured):
    (c,) = checks._user_access(u)
    assert (c.id, c.status, c.measured) == ("service.user_access", status, measured)
    assert checks._user_access(None) == []


# ------------------------------------------------------------------------- nccl_p2p_level (P30, P17)


def topo(rel: str) -> dict:
    return {"matrix": {"GPU0": {"GPU0": "X", "GPU1": rel}, "GPU1": {"GPU0": rel, "GPU1": "X"}}}


def env_file(**env) -> dict:
    return {"path": "/etc/p2pkit/engine.env", "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **env}}


@pytest.mark.parametrize("vendor,rel,env,status,measured,expected", [
    ("GenuineIntel", "SYS", {}, FAIL, "GenuineIntel CPU, GPUs SYS apart; NCCL default PXB; NCCL_P2P_LEVEL=(unset) in "
     "/etc/p2pkit/engine.env", "NCCL_P2P_LEVEL>=SYS"),
    ("GenuineIntel", "SYS", {"NCCL_P2P_LEVEL": "SYS"}, PASS, "GenuineIntel CPU, GPUs SYS apart; NCCL default PXB; "
     "NCCL_P2P_LEVEL=SYS in /etc/p2pkit/engine.env", "NCCL_P2P_LEVEL>=SYS"),
    ("GenuineIntel", "SYS", {"NCCL_P2P_LEVEL": "PXB"}, FAIL, None, "NCCL_P2P_LEVEL>=SYS"),
    ("GenuineIntel", "SYS", {"NCCL_P2P_LEVEL": "bogus"}, FAIL, None, "NCCL_P2P_LEVEL>=SYS"),
    ("AuthenticAMD", "SYS", {}, PASS, "AuthenticAMD CPU, GPUs SYS apart; NCCL default SYS; NCCL_P2P_LEVEL=(unset) in "
     "/etc/p2pkit/engine.env", "default SYS covers SYS"),
    ("GenuineIntel", "SOC", {}, PASS, None, "default PXB covers SOC"),  # a relation NCCL's table has no name for
])
def test_nccl_p2p_level_needed_for_the_pair(vendor, rel, env, status, measured, expected):
    f = {"smi_topo_m": topo(rel), "iommu": {"cpu_vendor": vendor}, "engine_env_file": env_file(**env)}
    c = by_id(checks.nccl_p2p_level(f, NINFER))["field.nccl_p2p_level"]
    assert (c.status, c.expected, c.pitfall) == (status, expected, "P30")
    if measured:
        assert c.measured == measured


@pytest.mark.parametrize("topo_m,why", [(None, "no GPU pair in `nvidia-smi topo -m`"),
                                        ({"error": "nvidia-smi: not found"}, "nvidia-smi: not found")])
def test_nccl_p2p_level_without_the_pairs_relation_could_not_check(topo_m, why):
    f = {"iommu": {"cpu_vendor": "GenuineIntel"}, **({"smi_topo_m": topo_m} if topo_m else {})}
    (c,) = checks.nccl_p2p_level(f, NINFER)
    assert (c.id, c.status, c.measured, c.pitfall) == ("field.nccl_p2p_level", WARN, f"could not check, because {why}",
                                                       "P30")


def test_nccl_p2p_level_has_nothing_to_judge_on_one_gpu_and_ggml_only_for_llamacpp():
    f = {"smi_topo_m": topo("NODE"), "iommu": {"cpu_vendor": "AuthenticAMD"}, "engine_env_file": {"env": None}}
    assert SPARK.gpus.count == 1 and checks.nccl_p2p_level(f, SPARK) == []
    assert [c.id for c in checks.nccl_p2p_level(f, NINFER)] == ["field.nccl_p2p_level", "field.engine_nccl_p2p"]
    assert "field.ggml_cuda_p2p" in by_id(checks.nccl_p2p_level(f, LLAMA))


# -------------------------------------------------------------------------- nccl_floor (P16, P37)


LIB = "/opt/nccl/lib/libnccl.so.2"


@pytest.mark.parametrize("p,version,status,hint", [
    (LLAMA, "2.25.1", FAIL, "NCCL 2.25.1 fails on the 5090"),
    (SPARK, "2.28.9", FAIL, "NCCL before 2.29.3 leaks proxy slots on aarch64"),
    (LLAMA, None, FAIL, "NCCL 2.25.1 fails on the 5090"),
    (LLAMA, "2.27.3", PASS, ""),
])
def test_floor_check_holds_each_library_to_the_profiles_floor(p, version, status, hint):
    c = checks.floor_check("field.nccl_floor.engine", "t", [(LIB, version)], p)
    assert (c.status, c.measured, c.pitfall) == (status, f"{LIB} {version or 'version unknown'}",
                                                 "P16" if p is LLAMA else "P37")
    assert c.hint.startswith(hint)


def test_floor_check_of_no_library_fails():
    c = checks.floor_check("field.nccl_floor.engine", "t", [], LLAMA)
    assert (c.status, c.measured) == (FAIL, "no libnccl")


def test_nccl_floor_has_nothing_to_judge_without_a_floor():
    assert not NINFER.engine.nccl_min and checks.nccl_floor({"engine_nccl": {"pid": 1, "libraries": []}}, NINFER) == []


@pytest.mark.parametrize("pn", [None, {}, {"path": ""}])
def test_nccl_floor_without_a_profile_nccl_judges_the_engine_only(pn):
    f = {"engine_nccl": None, **({"profile_nccl": pn} if pn is not None else {})}
    assert [c.id for c in checks.nccl_floor(f, LLAMA)] == ["field.nccl_floor.engine"]


def test_nccl_floor_of_an_unreadable_profile_nccl_could_not_check():
    c = checks.nccl_floor({"profile_nccl": {"path": LIB, "error": "Permission denied"}}, LLAMA)[0]
    assert (c.id, c.status, c.measured, c.pitfall) == ("field.nccl_floor.profile", WARN,
                                                       "could not check, because Permission denied", "P16")


@pytest.mark.parametrize("e", [None, {"running": False}])
def test_nccl_floor_of_an_engine_not_running_is_skipped(e):
    (c,) = checks.nccl_floor({"engine_nccl": e}, SPARK)
    assert (c.id, c.status, c.measured, c.pitfall) == ("field.nccl_floor.engine", SKIP, "the engine is not running",
                                                       "P37")


def test_nccl_floor_of_an_unreadable_engine_could_not_check():
    (c,) = checks.nccl_floor({"engine_nccl": {"error": "no /proc/4242/maps"}}, SPARK)
    assert (c.status, c.measured) == (WARN, "could not check, because no /proc/4242/maps")


def test_nccl_floor_of_a_cpu_build_is_not_judged():
    """engine.cuda = false: the build links no NCCL, so none mapped is no finding (the GPU build's "no
    libnccl" stays a failure)."""
    cpu = replace(SPARK, engine=replace(SPARK.engine, cuda=False))
    (c,) = checks.nccl_floor({"engine_nccl": {"pid": 4242, "libraries": []}, "profile_nccl": {"path": "/x"}}, cpu)
    assert (c.id, c.status, c.measured) == ("field.nccl_floor.engine", SKIP, "a CPU build (engine.cuda = false) "
                                                                            "maps no NCCL")


def test_nccl_floor_engine_mapping_no_nccl_fails():
    (c,) = checks.nccl_floor({"engine_nccl": {"pid": 4242, "libraries": []}}, SPARK)
    assert (c.status, c.measured) == (FAIL, "no libnccl")


@pytest.mark.parametrize("versions,status,hint", [
    (["2.29.3", "2.29.3"], WARN, "two NCCL builds in one process"),
    (["2.29.3", "2.30.1"], WARN, "two NCCL builds in one process"),
    (["2.28.9", "2.29.3"], FAIL, "NCCL before 2.29.3 leaks proxy slots"),
])
def test_nccl_floor_two_nccls_mapped_by_one_engine(versions, status, hint):
    libs = [{"path": f"/lib{i}/libnccl.so.2", "version": v} for i, v in enumerate(versions)]
    (c,) = checks.nccl_floor({"engine_nccl": {"pid": 4242, "libraries": libs}}, SPARK)
    assert (c.status, c.pitfall) == (status, "P37") and c.hint.startswith(hint)
    assert c.measured.endswith(" (more than one NCCL mapped)")


# ---------------------------------------------------------- the unit as systemd loaded it (issue 49 item 8)

LOADED = {"systemd": True, "installed": True, "name": "p2pkit-engine.service",
          "path": "/etc/systemd/system/p2pkit-engine.service", "user": "p2pkit-engine", "LoadState": "loaded",
          "ActiveState": "active", "NeedDaemonReload": "no",
          "FragmentPath": "/etc/systemd/system/p2pkit-engine.service",
          "DropInPaths": "", "Slice": "p2pkit.slice", "MemoryMax": "infinity", "User": "p2pkit-engine",
          "ExecStart": "{ path=/opt/ninfer/ninfer-serve ; argv[]=/opt/ninfer/ninfer-serve /m --port 8000 ; ... }"}


@pytest.mark.parametrize("change, said, pitfall", [
    ({}, "loaded from /etc/systemd/system/p2pkit-engine.service, p2pkit.slice, MemoryMax=infinity, "
         "User=p2pkit-engine, runs /opt/ninfer/ninfer-serve", ""),
    ({"NeedDaemonReload": "yes"}, "its file changed since systemd read it (NeedDaemonReload=yes)", ""),
    ({"DropInPaths": "/usr/lib/systemd/system/service.d/10-timeout-abort.conf "
                     "/etc/systemd/system/p2pkit-engine.service.d/mem.conf"},
     "drop-ins change it: /etc/systemd/system/p2pkit-engine.service.d/mem.conf", ""),
    ({"MemoryMax": "17179869184"}, "MemoryMax=17179869184, not infinity", "P12"),
    ({"Slice": "system.slice", "User": ""}, "Slice=system.slice, not p2pkit.slice; User=(none), not p2pkit-engine", ""),
    ({"FragmentPath": "/run/systemd/system/p2pkit-engine.service"}, "loaded from /run/systemd/system/", ""),
])
def test_the_engine_unit_is_judged_as_systemd_loaded_it(change, said, pitfall):
    c = checks.unit_loaded({"engine_unit": {**LOADED, **change}}, NINFER)
    assert [(x.id, x.status, x.pitfall) for x in c] == [("service.unit_loaded", FAIL if change else PASS, pitfall)]
    assert said in c[0].measured, c[0].measured


def test_no_unit_is_no_finding_and_an_unread_one_is_could_not_determine():
    assert checks.unit_loaded({"engine_unit": {"systemd": False, "installed": False}}, NINFER) == []
    assert checks.unit_loaded({}, NINFER) == []
    c = checks.unit_loaded({"engine_unit": {"error": "systemctl show: timed out"}}, NINFER)
    assert c[0].status == FAIL and "could not determine" in c[0].measured


def test_a_process_age_is_read_from_the_kernel_and_unknown_where_it_cannot_be(tmp_path):
    """The age the "starting" judgement uses: this test's own process on this machine (started before the call,
    within its run), and None on a root without /proc/uptime (a simulated host's own /proc)."""
    import os
    import time

    from p2pkit.host import Host, system

    t0 = time.monotonic()
    age = system.process_age_s(Host(), os.getpid())
    assert age is not None and 0 <= age <= time.monotonic() - t0 + 24 * 3600, age
    (tmp_path / f"proc/{os.getpid()}").mkdir(parents=True)
    assert system.process_age_s(Host(root=tmp_path), os.getpid()) is None
