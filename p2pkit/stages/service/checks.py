"""service: the engine's flags (before start) and the proofs that it runs right (after)."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.host import system as system_files
from p2pkit.parse import field as pf
from p2pkit.parse import nccl
from p2pkit.rules import engine_cmd
from p2pkit.rules import engine_env as ee
from p2pkit.rules.findings import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    changed,
    could_not,
    failed,
    figure,
    judge,
    not_measured,
    pair,
    reading,
    reads,
    show,
    unknown,
    unreadable,
)
from p2pkit.stages.service import fit

GIB = 1 << 30


def precheck(p: Profile) -> list[Check]:
    return engine_cmd.validate(p)


def alive(live: dict | None) -> list[Check]:
    """The engine now, asked once within a second or two: its process not stopped (state T: "frozen") and
    /health answering ("not answering" when the process runs but /health gives no answer, such as one that
    accepts the connection and never replies). The one judgement of a live engine: status, doctor and
    `serve status` all make it; a frozen or silent engine is never "done"."""
    id_, title = "service.engine_alive", "the engine's process runs and /health answers"
    if live is None or live.get("installed") is False:
        return []
    if failed(live):
        return [unknown(id_, title, live, "running, /health answering")]
    want, pid, health = "running (not stopped), /health answering", live.get("pid"), live.get("health")
    if not pid:
        why = ("the launcher's record names no running process" if live.get("manager") == "launcher"
               else "the unit has no main PID")
        return [Check(id_, title, FAIL, f"not running: {why}", want,
                      "start it: `p2pkit serve restart`; read why it stopped: `p2pkit serve logs`")]
    if live.get("state") in ("T", "t"):
        return [Check(id_, title, FAIL, f"frozen: pid {pid} is stopped (state {live['state']} in /proc/{pid}/stat)",
                      want, f"something sent it SIGSTOP (a debugger, a job-control stop): `kill -CONT {pid}`, or "
                      "`p2pkit serve restart`")]
    if health is None:  # a headless worker: its process, and its head (a headless worker does not end with it)
        head = live.get("head")
        if head and not head.get("up"):
            return [Check(id_, title, FAIL, f"orphaned: pid {pid} runs, and its head's rendezvous {head['address']} "
                          f"does not answer ({head.get('error')}): the head is down, and vLLM's headless worker does "
                          "not end with it", want, "stop it (`p2pkit serve stop`), then start both, the head first: "
                          "`p2pkit serve restart --inventory FILE`", "P27")]
        return [Check(id_, title, PASS, f"pid {pid} running (state {live.get('state')})"
                      + (f", its head's rendezvous {head['address']} answering" if head else ""), want)]
    if health["code"] is None and starting(live):
        return [Check(id_, title, WARN, f"starting: pid {pid} runs for {live['age_s']:.0f} s and nothing listens "
                      f"on /health's port yet ({health['text']}); the unit's start waits up to "
                      f"{live['starting_window_s']:.0f} s for it", want,
                      "wait for the model to load: `p2pkit serve logs` shows its progress")]
    if health["code"] is None:
        return [Check(id_, title, FAIL, f"not answering: pid {pid} (state {live.get('state')}) runs, and /health "
                      f"gave no answer: {health['text']}", want, "read `p2pkit serve logs`; a hung engine needs "
                      "`p2pkit serve restart`")]
    if health["code"] != 200:
        return [Check(id_, title, WARN, f"pid {pid} answers /health {health['code']} (loading?)", want,
                      "wait for the model to load: `p2pkit verify service` shows its progress")]
    return [Check(id_, title, PASS, f"pid {pid} running, /health 200", want)]


def starting(live: dict) -> bool:
    """An engine still starting, not a silent one: nothing listens on its port yet (the connection refused: an
    engine that accepts and never answers is hung, whenever it started) and its process is younger than the time
    the service stage waits for /health (serve.health_timeout_s): after a boot, status on a loaded machine met the
    engine before it bound its port and called the service stale (issue 47 item 3)."""
    age, window = live.get("age_s"), live.get("starting_window_s")
    refused = "refused" in str((live.get("health") or {}).get("text", "")).lower()
    return refused and isinstance(age, int | float) and isinstance(window, int | float) and age < window


# engine_live: given by doctor and status only (a stage's proof waits on /health instead)
@reads("cgroup", "head_rendezvous", "vram_fit", given=("service", "engine_live"))
def check(f: dict, p: Profile) -> list[Check]:
    """The service's findings in the order a reader asks: may it start (the profile, the head, the fit), is it
    running now; then from the stage's proof: who runs it (its unit or the launcher), does it answer, what caps
    its memory, what its NCCL took and what it reaches, where it listens, and its speculative decoding."""
    out = [*precheck(p), *head_up(f.get("head_rendezvous"), engine_cmd.node(p)["role"]),
           *fit.check(f.get("vram_fit"), p), *alive(f.get("engine_live"))]
    missing = not_measured(f, "service", "service.running", "engine service proven",
                           "doctor does not wait on the service", "a run of `p2pkit verify service`")
    if missing:
        return [*out, missing]
    s = f["service"]
    return [*out, *(launcher_findings(s) if s["analyze"] is None else _unit(s["analyze"], p)), answering(s),
            *memory_cap(s, f.get("cgroup", {})), *running_engine(s, p), *listening(s, p), *_spec(s, p)]


FILES_REDO = ("run `p2pkit up --from service`: the role writes them again (restarting the engine where one "
              "changed) and the stage proves the service again")


def written_files(s: dict) -> tuple[str, ...]:
    """What the service role writes: the environment files always, the unit and its slice where systemd runs the
    engine (the launcher's engine has neither)."""
    env = (system_files.ENGINE_ENV_FILE, system_files.ENGINE_SECRETS_FILE)
    return env if s.get("analyze") is None else system_files.ENGINE_FILES


@reads("service_files", given=("service",))
def files_in_place(f: dict, p: Profile) -> list[Check]:
    """The unit, slice and environment files the role wrote are there as the proof reads them (their digests go
    into the artifact: the gate's re-proof compares them)."""
    if not isinstance(f.get("service"), dict) or failed(f["service"]):
        return []  # nothing proven here (doctor, a failed proof): the service's own finding says so
    id_, title = "service.files", "the unit, slice and environment files the role wrote are in place"
    if "service_files" not in f:
        return []  # an artifact of an earlier p2pkit: the re-proof says the digests are not recorded
    files = f.get("service_files")
    if failed(files) or not isinstance(files, dict):
        return [unknown(id_, title, files, "each file there")]
    want = written_files(f["service"])
    missing = [path for path in want if files.get(path) is None]
    return [judge(id_, title, not missing, f"missing: {', '.join(missing)}" if missing else
                  f"{len(want)} files in place", ", ".join(want), FILES_REDO)]


@reads("engine_unit")
def unit_loaded(f: dict, p: Profile) -> list[Check]:
    """The engine's unit as systemd runs it (issue 49 item 8): loaded from the role's file with nothing left to
    reload and no drop-in of someone else's, in p2pkit's slice, MemoryMax=infinity (P12), as the engine's user;
    what the file says is not what runs until systemd reads it again."""
    u = f.get("engine_unit")
    id_, title = "service.unit_loaded", "the engine's unit as systemd loaded it"
    want = "loaded from the role's file, nothing to reload, no drop-in; p2pkit.slice, MemoryMax=infinity, its user"
    if u is None:
        return []
    if failed(u):
        return [unknown(id_, title, u, want)]
    if not u.get("installed"):
        return []  # no unit here (the launcher's engine, or the stage not run): the stage's own findings say so
    problems = []
    if u.get("LoadState") != "loaded" or u.get("FragmentPath") != u.get("path"):
        problems.append(f"{u.get('LoadState')} from {u.get('FragmentPath') or 'no file'}, not {u.get('path')}")
    if u.get("NeedDaemonReload") == "yes":
        problems.append("its file changed since systemd read it (NeedDaemonReload=yes): it runs the old settings")
    own = [d for d in (u.get("DropInPaths") or "").split() if f"/{u.get('name')}.d/" in d]  # not the OS's service.d
    if own:
        problems.append(f"drop-ins change it: {' '.join(own)}")
    for key, wanted in (("Slice", "p2pkit.slice"), ("MemoryMax", "infinity"), ("User", u.get("user"))):
        if u.get(key) != wanted:
            problems.append(f"{key}={u.get(key) or '(none)'}, not {wanted}")
    path = next((w.removeprefix("path=") for w in (u.get("ExecStart") or "").split() if w.startswith("path=")), "")
    return [judge(id_, title, not problems, "; ".join(problems) or f"loaded from {u.get('path')}, {u.get('Slice')}, "
                  f"MemoryMax={u.get('MemoryMax')}, User={u.get('User')}, runs {path or '?'}", want,
                  f"`sudo systemctl daemon-reload` (a file edited by hand), remove a drop-in that is not p2pkit's "
                  f"(`systemctl cat {u.get('name')}` names it), then `p2pkit up --from service --force`",
                  pitfall="P12" if any(x.startswith("MemoryMax") for x in problems) else "")]


def reproved(recorded: dict, now: dict | None, p: Profile) -> list[Check]:
    """What the service artifact claims of the files the role wrote, against the files now (status and the
    gate): each one the proof read is still there with the same sha256. A file this user may not read now (the
    secrets file, for `status` as non-root) is not judged; the running engine is the live probe's."""
    id_, title = "service.files_unchanged", "the files the service stage wrote are there, unchanged"
    want = "each file the stage proved, the same bytes"
    if failed(now) or not isinstance(now, dict):
        return [unknown(id_, title, now, want)]
    rec = recorded.get("service_files")
    if not isinstance(rec, dict):
        return [Check(id_, title, FAIL, "the artifact records no digests of the unit and environment files (an "
                      "earlier p2pkit's, or not a proof's)", want, FILES_REDO)]
    bad = []
    for path, was in sorted(rec.items()):
        if not isinstance(was, dict) or not ("sha256" in was or isinstance(was.get("identity"), dict)):
            continue  # not there, or not readable, when the stage proved it
        got = now.get(path)
        if got is None:
            bad.append(f"{path} is not there any more")
        elif isinstance(got, dict) and "sha256" in got and got["sha256"] != was.get("sha256"):
            bad.append(f"{path} changed since the stage proved it")
        elif isinstance(got, dict) and isinstance(got.get("identity"), dict) and "identity" in was \
                and (moved := changed(was["identity"], got["identity"])):
            bad.append(f"{path} changed since the stage proved it ({'; '.join(moved)})")
    if bad:
        return [Check(id_, title, FAIL, "; ".join(bad), want, FILES_REDO)]
    return [Check(id_, title, PASS, "unchanged since the stage proved them", want)]


def answering(s: dict) -> Check:
    """A worker joined its head (headless: no API; joined when NCCL formed its communicator with the head); any
    other node's /health answers 200, or why not and what to do."""
    h = s["health"]
    tail = " | ".join(s.get("log_tail", [])[-5:])
    if s.get("role") == "worker":
        why = gone(s.get("log_tail", [])) if h.get("exited") else \
            f"no NCCL channel or rank assignment within {h['seconds']} s"
        return reading("service.joined", "this worker joined the head", PASS if h["ok"] else FAIL,
                       h["seconds"] if h["ok"] else None, "s", "an NCCL channel to the head, or its ranks assigned",
                       "read `p2pkit serve logs`; the head must be up first (P27) and reachable over the fabric "
                       "(master-addr)", "P27", text=f"after {{}}: {h['line']}",
                       missing=f"{why}; last log lines: {tail}")
    if h["ok"]:
        return reading("service.health", "/health answers 200", PASS, h["seconds"], "s", 200,
                       text=f"200 after {{}} (codes seen: {h['codes']})")
    why = gone(s.get("log_tail", [])) if h.get("exited") else h.get("stalled") or h.get("not_waited") \
        or f"no 200 within {h['seconds']} s"
    hint, pit = not_healthy_fix(s)
    return Check("service.health", "/health answers 200", FAIL, f"{why}; last log lines: {tail}", 200, hint, pit)


def not_healthy_fix(s: dict) -> tuple[str, str]:
    """What to do about an engine whose /health never answered 200, and the pitfall behind it."""
    h, cause = s["health"], s.get("likely_cause")
    if h.get("not_waited"):
        return ("not waited for: let the engine's user read what it loads (see service.user_access), then "
                "`p2pkit up --from service`", "")
    if h.get("stalled") and "state T" in h["stalled"]:
        return "something stopped the engine (SIGSTOP): `kill -CONT` its pid, or `p2pkit serve restart`", ""
    if h.get("stalled") and not cause:
        return ("the engine hangs while loading: read `p2pkit serve logs` for its last step, then "
                "`p2pkit serve restart`; a slow load that moves gets longer with serve.stall_timeout_s", "")
    if s.get("role") == "head" and not h.get("exited") and not cause:
        return ("the head answers /health only once every worker node has joined: bring the workers up "
                "(`p2pkit up` on each, or one inventory run for all nodes)", "P27")
    hint = f"likely cause: {cause}" if cause else "read `p2pkit serve logs`"
    return hint, "P18" if cause and "(P18)" in cause else "P11" if cause and "fit" in cause else ""


def memory_cap(s: dict, own: dict) -> list[Check]:
    """P12: no memory cap up from the engine's cgroup (the tightest named first); p2pkit's own cap (`own`: its
    cgroup fact) is not the engine's."""
    pc = s.get("pid_cgroup", {})
    if failed(pc):
        return [unknown("service.memory_cap", "service's cgroup has no memory cap", pc, "no cap", pitfall="P12")]
    fix = LAUNCHER_CAP_FIX if s.get("manager") == "launcher" else (
        "a memory cap will OOM-kill the engine under load: the unit must run in p2pkit.slice "
        "(MemoryMax=infinity), not in a user session")
    caps = sorted(pc["memory_caps"], key=lambda c: c["limit_bytes"])  # the tightest first: it is the one that binds
    shown = [f"{c['file']} = {c['limit_bytes']} bytes ({show(c['limit_bytes'] / GIB, 'GiB')})" for c in caps]
    text = ", ".join([f"{c['file']} = {c['limit_bytes']} bytes ({{}})" for c in caps[:1]] + shown[1:])
    out = [reading("service.memory_cap", "service's cgroup has no memory cap", FAIL if caps else PASS,
                   caps[0]["limit_bytes"] / GIB if caps else None, "GiB", "no cap", fix, "P12", text=text,
                   missing=f"none up from {pc['v2_path'] or pc['v1_memory_path']}")]
    if not failed(own) and own.get("memory_caps") and not caps:
        out.append(Check("service.not_inherited", "p2pkit's own memory cap is not the service's", WARN,
                         f"p2pkit runs capped ({own['memory_caps'][0]['file']}); the service does not",
                         "service uncapped", "fine: p2pkit's launcher started the engine in a memory cgroup of "
                         f"its own ({pc['v2_path'] or pc['v1_memory_path']}), not in the capped one p2pkit runs in"
                         if s.get("manager") == "launcher" else "fine: the service runs in p2pkit.slice and "
                         "does not inherit the cap of the terminal p2pkit was started from", "P12"))
    return out


def running_engine(s: dict, p: Profile) -> list[Check]:
    """What the running engine took and reaches: NCCL's transports across nodes (P23) and between this node's
    GPUs (P30), its user's access to its files, the VRAM it left (P18), the n-gram table's mappings (P26)."""
    out = []
    if "nccl_transports" in s:
        out.append(_nccl(s["nccl_transports"], p))
    if "nccl" in s:
        out.append(nccl_local(s["nccl"]))
    out += _user_access(s.get("user_access"))
    out += fit.headroom(s.get("vram_after"), p)
    if "table_maps" in s:
        out.append(madv_random(s["table_maps"]))
    return out


def listening(s: dict, p: Profile) -> list[Check]:
    """The engine listens where the profile says (a headless worker listens nowhere: none)."""
    if s.get("listen") is None:
        return []
    ln = s["listen"]
    want = f"{p.serve.host}:{p.serve.port}"
    addrs = ln.get("addresses", [])
    ok = ln["connect"] and (not addrs or want in addrs or (p.serve.host == "::" and f":::{p.serve.port}" in addrs))
    return [judge("service.listen_where", "listening where the profile says", ok,
                  ", ".join(addrs) or ("connected" if ln["connect"] else ln.get("connect_error", "no answer")),
                  want, "the engine listens elsewhere: check serve.host and serve.port")]


LAUNCHER_CAP_FIX = (
    "a memory cap will OOM-kill the engine under load, and p2pkit's launcher could not start it in a cgroup "
    "without one: run p2pkit from a root shell outside the capped cgroup (one that may write the root of the "
    "cgroup hierarchy), or give the engine a systemd unit on a host where systemd is PID 1")
NO_RESTART = "no systemd: nothing restarts the engine after a reboot"


def _unit(a: dict, p: Profile) -> list[Check]:
    """The installed unit: systemd-analyze verify and security."""
    out = [judge("service.unit_verify", "systemd-analyze verify is clean", a["verify_rc"] == 0 and
                 not a["verify_issues"], "; ".join(a["verify_issues"]) or f"exit {a['verify_rc']}", "clean",
                 "fix the unit (the p2pkit_service role's templates/p2pkit-engine.service.j2) or the "
                 "profile values it was rendered from")]
    exp = a["exposure"]
    out.append(figure("service.exposure", "systemd-analyze security exposure", exp, "<=",
                      p.serve.security_max_exposure, "exposure", "the unit's hardening was weakened: restore it, or "
                      "raise serve.security_max_exposure knowingly", context=a["exposure_label"] or "",
                      missing="not read"))
    return out


def launcher_findings(s: dict) -> list[Check]:
    """No systemd as PID 1: the engine is p2pkit's launcher's, and nothing starts it after a reboot."""
    la = s.get("launcher", {})
    cg = la.get("cgroup", {})
    where = cg.get("dir") or cg.get("error", "no cgroup")
    out = [Check("service.manager", "something restarts the engine after a reboot", WARN,
                 f"{NO_RESTART} (started by p2pkit's launcher, pid {la.get('pid')}, cgroup {where})",
                 "a systemd unit", "after a reboot run `p2pkit up` (or `p2pkit serve restart`) again; on a host "
                 "where systemd is PID 1 p2pkit installs a unit instead")]
    if la.get("move_error"):
        out.append(Check("service.launcher_cgroup", "the engine runs in the launcher's own cgroup", FAIL,
                         la["move_error"], "moved before it started", LAUNCHER_CAP_FIX, "P12"))
    return out


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
    return figure("service.madv_random", title, len(plain), "==", 0, "count",
                  "the table is mapped without MADV_RANDOM: reads amplify about 30x on hash-scattered lookups; use "
                  "the seed's vLLM tree, whose mmap path advises MADV_RANDOM", "P26",
                  text=f"{{}} of {len(maps)} mapping(s) without rr (pid {t['pid']})", context=", ".join(plain),
                  expected_context="(rr in VmFlags)")


def head_up(h: dict | None, role: str | None = None) -> list[Check]:
    """P27 on a worker node: its head must be up (its rendezvous port answering) before it starts;
    the service stage refuses to start it otherwise. doctor reads the same, without waiting. A fact
    that could not be read carries no role: the profile's (`role`) says whether this node is a worker."""
    if not h or (h.get("role") or role) != "worker":
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


def nccl_local(n: dict) -> Check:
    """P30 from the engine's own NCCL: every connection between GPUs of this node, in the start being
    judged, goes via P2P (not SHM); those across nodes are P23's."""
    id_, title = "service.nccl_p2p", "the engine's NCCL takes P2P between this node's GPUs"
    want = "every local pair via P2P"
    if not n.get("connections"):
        return Check(id_, title, SKIP, "no NCCL connection line in this start's log (the engine formed no "
                     "communicator, or runs without NCCL_DEBUG=INFO)", want, "", "P30")
    about = f"NCCL {n.get('version') or '(version not printed)'}" + "".join(
        f"; {k}={v} (set by environment)" for k, v in n.get("env", {}).items() if k.startswith("NCCL_P2P"))
    bad = n.get("local_not_p2p", [])
    if not n.get("local"):
        return Check(id_, title, SKIP, f"{about}; every connection crosses nodes ({', '.join(n.get('across', []))})",
                     want, "", "P30")
    # the figure: the local connections not via P2P (the number first: the rest is read from the engine's log)
    return figure(id_, title, len(bad), "==", 0, "count",
                  "NCCL took shared memory between GPUs that talk P2P (P30: its default P2P level stops short of "
                  "the pair's relation on this CPU, or NCCL_P2P_DISABLE/LEVEL in the engine's environment): see "
                  "`p2pkit doctor` field.nccl_p2p_level, then `p2pkit up --from service --force`", "P30",
                  text="{} local connection(s) not via P2P" + (f", first {bad[0]}" if bad else "")
                  + f"; {about}; between local GPUs: {', '.join(n['local'])}", expected_context=f"({want})")


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


# ---------------------------------------------------------------- field pitfalls (shared/PITFALLS.md)


def _spec(s: dict, p: Profile) -> list[Check]:
    """P19 from the engine's own counters around the one real request (its engine module judges them)."""
    return engine_cmd.engine(p).request_checks(s, p)


def relation(f: dict) -> str | None:
    t = f.get("smi_topo_m")
    if unreadable(t):
        return None
    return t.get("pair") or t["matrix"].get("GPU0", {}).get("GPU1")


def service_env(f: dict, p: Profile) -> tuple[dict[str, str], str]:
    """The engine's environment as installed (/etc/p2pkit/engine.env), else what p2pkit would render."""
    installed = f.get("engine_env_file")
    if isinstance(installed, dict) and installed.get("env") is not None:
        return installed["env"], installed["path"]
    vendor = (f.get("iommu") or {}).get("cpu_vendor", "")
    rel = relation(f)
    return ee.engine_env(p, ee.p2p_level(rel, vendor, p.gpus.count) if rel else None), "the rendered environment"


@reads("smi_topo_m", "iommu", "engine_env_file")
def nccl_p2p_level(f: dict, p: Profile) -> list[Check]:
    """P30 and P17: NCCL's own rule lets it take P2P across this pair in the engine's environment."""
    if not pair(p):
        return []
    rel = relation(f)
    io = f.get("iommu") or {}
    vendor = io.get("cpu_vendor", "unknown")
    id_, title = "field.nccl_p2p_level", "NCCL's P2P level reaches across the pair"
    if rel is None:
        return [could_not(id_, title, f.get("smi_topo_m") or {"error": "no GPU pair in `nvidia-smi topo -m`",
                                                              "by_hand": "nvidia-smi topo -m"},
                          "NCCL_P2P_LEVEL at or above the pair's relation", "P30")]
    env, where = service_env(f, p)
    need = pf.nccl_level_needed(rel, vendor, p.gpus.count) if rel in pf.SMI_TO_NCCL else None
    default = pf.nccl_default_level(vendor, p.gpus.count)
    level = env.get("NCCL_P2P_LEVEL")
    ok = need is None or (level is not None and level.upper() in pf.P2P_LEVELS and pf.nccl_level_allows(level, rel))
    out = [judge(id_, title, ok, f"{vendor} CPU, GPUs {rel} apart; NCCL default {default}; "
                 f"NCCL_P2P_LEVEL={level or '(unset)'} in {where}", f"NCCL_P2P_LEVEL>={need}" if need else
                 f"default {default} covers {rel}",
                 f"NCCL's default P2P level stops at {default} on this CPU, so it takes SHM across {rel} although P2P "
                 f"works: the service must set NCCL_P2P_LEVEL={need} (`p2pkit up --from service --force` renders it)",
                 pitfall="P30")]
    blockers = ee.p2p_blockers(env, rel)
    out.append(judge("field.engine_nccl_p2p", "the engine's own NCCL may take P2P", not blockers,
                     "; ".join(blockers) or f"nothing in {where} turns NCCL's P2P off", "no NCCL_P2P_DISABLE, level "
                     f">= {pf.SMI_TO_NCCL.get(rel, rel)}", "P2P is proven on the hardware but the engine's NCCL is "
                     "told not to use it: remove it from [serve.env] (keep NCCL_P2P_DISABLE=1 only for an A/B run)",
                     pitfall="P17"))
    return out + engine_cmd.engine(p).p2p_env_checks(env)


def floor_check(id_: str, title: str, found: list[tuple[str, str | None]], p: Profile) -> Check:
    pit, hint = engine_cmd.engine(p).NCCL_FLOOR
    floor = pf.version_tuple(p.engine.nccl_min)
    low = any(v is None or pf.version_tuple(v) < floor for _, v in found)
    measured = "; ".join(f"{path} {v or 'version unknown'}" for path, v in found)
    return judge(id_, title, bool(found) and not low, measured or "no libnccl", f">= {p.engine.nccl_min}", hint,
                 pitfall=pit)


@reads("profile_nccl", "engine_nccl")
def nccl_floor(f: dict, p: Profile) -> list[Check]:
    """P16/P37: the NCCL the profile points at, and the one the running engine has mapped, meet the floor."""
    if not p.engine.nccl_min:
        return []
    if not p.engine.cuda:  # a CPU build (CI, a laptop) links no NCCL: there is no NCCL to judge
        return [Check("field.nccl_floor.engine", "the engine's mapped NCCL meets the floor", SKIP,
                      "a CPU build (engine.cuda = false) maps no NCCL", f">= {p.engine.nccl_min}", "", "P37")]
    out = []
    pn = f.get("profile_nccl")
    if isinstance(pn, dict) and pn.get("path"):
        if unreadable(pn):
            out.append(could_not("field.nccl_floor.profile", "the profile's NCCL meets the floor", pn,
                                 f">= {p.engine.nccl_min}", "P16"))
        else:
            out.append(floor_check("field.nccl_floor.profile", "the profile's NCCL meets the floor",
                                   [(pn["path"], pn["version"])], p))
    e = f.get("engine_nccl")
    if e is None or (isinstance(e, dict) and e.get("running") is False):
        out.append(Check("field.nccl_floor.engine", "the engine's mapped NCCL meets the floor", SKIP,
                         "the engine is not running", f">= {p.engine.nccl_min}", "", "P37"))
    elif unreadable(e):
        out.append(could_not("field.nccl_floor.engine", "the engine's mapped NCCL meets the floor", e,
                             f">= {p.engine.nccl_min}", "P37"))
    else:
        found = [(x["path"], x["version"]) for x in e["libraries"]]
        c = floor_check("field.nccl_floor.engine", f"NCCL mapped by the engine (pid {e['pid']}) meets the floor",
                        found, p)
        if len({v for _, v in found}) > 1 or len(found) > 1:
            c = Check(c.id, c.title, FAIL if c.status == FAIL else WARN, c.measured + " (more than one NCCL mapped)",
                      c.expected, c.hint or "two NCCL builds in one process: keep one (LD_LIBRARY_PATH, RUNPATH)",
                      c.pitfall)
        out.append(c)
    return out
