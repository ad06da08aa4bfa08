"""Gates, plan, up, verify: the stage sequence run over artifacts.

Gate rule: stage N runs only when stage N-1's artifact passed and its chain is intact. A stage is
done when its artifact passed, its inputs digest matches the profile, the chain to the previous
artifact holds, every earlier stage is done, and its quick re-check still holds.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from p2pkit import __version__
from p2pkit.core import hoststate, safefs
from p2pkit.core.artifacts import SCHEMA, CorruptArtifact, Store, atomic_write
from p2pkit.core.config import Profile
from p2pkit.core.errors import Exit, GateError, P2pkitError
from p2pkit.core.lock import lock_holder, state_lock
from p2pkit.core.output import Output
from p2pkit.facts import collect as facts
from p2pkit.host import Host
from p2pkit.host.system import identity
from p2pkit.rules.findings import ERROR, FAIL, PENDING, SKIP, WARN, Check, worst
from p2pkit.stages import Stage, registry

DONE, STALE, FAILED, REBOOT, NOT_RUN, RUNNING = "done", "stale", "failed", "reboot-needed", "not run", "running"
INTERRUPTED = "interrupted"  # a run was killed while acting on the stage (its marker is left, no run holds the lock)
RUNNING_FILE = "running.json"  # the stage a run is acting on now (its artifact is deleted meanwhile)
_ACTING: set[str] = set()  # the stages this process is acting on now (its marker is this run's, not a killed one's)


@dataclass
class Ctx:
    profile: Profile
    host: Host
    store: Store
    out: Output
    debug: bool = False
    yes: bool = False
    reboot: bool = False
    options: dict = field(default_factory=dict)


@dataclass
class StageState:
    stage: str
    state: str
    reason: str = ""
    artifact: dict | None = None

    def as_dict(self) -> dict:
        doc = self.artifact or {}
        return {"stage": self.stage, "state": self.state, "reason": self.reason,
                "finished": doc.get("finished"), "status": doc.get("status"), "checks": doc.get("checks", [])}


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def section_digests(profile: Profile, stage: Stage) -> dict[str, str]:
    return {s: profile.digest((s,)) for s in stage.inputs}


# ---------------------------------------------------------------------------------------- evaluate

STATUS_COMMAND_S = 3.0  # the longest `status` waits on any one command it runs (each has its own, longer, limit)


def evaluate(ctx: Ctx, recheck: bool = True) -> list[StageState]:
    states: list[StageState] = []
    prev: StageState | None = None
    live = _live_early(ctx) if recheck else {}
    ident = identity(ctx.host)
    for st in registry():
        states.append(_state_of(ctx, st, prev, ident, recheck, live.get(st.name)))
        prev = states[-1]
    return states


def _live_early(ctx: Ctx) -> dict[str, Future]:
    """Each stage's live probe (the engine asked once: its /health may take LIVE_TIMEOUT_S to give no answer),
    started before the stages are judged, so that its wait overlaps their re-checks instead of adding to them."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="p2pkit-live")
    out = {st.name: pool.submit(facts.collect, ctx.host, (st.live[0],), ctx.profile)
           for st in registry() if st.live is not None}
    pool.shutdown(wait=False)
    return out


def running_now(store: Store) -> dict | None:
    """The stage a live run is acting on: its marker counts only while that run holds the lock."""
    holder = lock_holder(store.dir)
    if holder is None or (holder == str(os.getpid()) and not _ACTING):  # this run's lock, no stage acted on yet:
        return None  # a marker there is a killed run's
    try:
        doc = json.loads((store.dir / RUNNING_FILE).read_text())
    except (OSError, ValueError):
        return None
    return {**doc, "pid": holder} if isinstance(doc, dict) else None


def _when(stamp: str) -> str:
    return stamp[:19].replace("T", " ")


def killed_marker(store: Store) -> dict | None:
    """The marker of the stage a run was acting on, left when that run was killed (its own run removes it
    in any other ending); read only when no run holds the lock (running_now)."""
    try:
        doc = json.loads((store.dir / RUNNING_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _state_of(ctx: Ctx, st: Stage, prev: StageState | None, ident: dict, recheck: bool,
              live: Future | None = None) -> StageState:
    try:
        doc = ctx.store.read(st.name)
    except CorruptArtifact as e:
        return StageState(st.name, STALE, e.message)
    if doc is None:
        running = running_now(ctx.store)
        if running and running.get("stage") == st.name:
            return StageState(st.name, RUNNING, f"a p2pkit run (pid {running['pid']}) is acting on it since "
                                                f"{running.get('started', '?')[:19].replace('T', ' ')}")
        left = killed_marker(ctx.store)
        if running is None and left and left.get("stage") == st.name:
            return StageState(st.name, INTERRUPTED, "a p2pkit run was killed while acting on it (started "
                                                    f"{str(left.get('started', '?'))[:19].replace('T', ' ')}); "
                                                    "`up` runs it again")
        return StageState(st.name, NOT_RUN, f"blocked by {prev.stage}" if prev and prev.state != DONE else "")
    if not ctx.host.wrote(doc, ident["machine_id"]):
        return StageState(st.name, STALE, "artifact was written on another host (or a simulated one)", doc)
    if doc.get("host", {}).get("kernel") != ident["kernel"] and doc["status"] != REBOOT:
        return StageState(st.name, STALE, f"kernel changed since ({doc.get('host', {}).get('kernel')} -> "
                                          f"{ident['kernel']}): prove it again", doc)
    if doc["status"] == REBOOT:
        if doc.get("reboot", {}).get("boot_id") == ident["boot_id"]:
            return StageState(st.name, REBOOT, doc["reboot"].get("why", "a reboot is needed"), doc)
        return StageState(st.name, STALE, "rebooted since: run the stage again to prove the result", doc)
    if doc["status"] != "passed":
        first = next((c for c in doc.get("checks", []) if c.get("status") == FAIL), None)
        return StageState(st.name, FAILED, f"{first['id']}: {first['measured']}" if first else "failed", doc)
    if prev is not None and prev.state != DONE:
        return StageState(st.name, STALE, f"earlier stage {prev.stage} is {prev.state}", doc)
    changed = [s for s, d in section_digests(ctx.profile, st).items() if doc.get("inputs", {}).get(s) != d]
    if changed:
        why = hoststate.override_change(doc.get("overrides"), ctx.profile.overrides, [c.split(".")[0] for c in changed])
        return StageState(st.name, STALE, f"profile changed: {', '.join(changed)}" + (f" ({why})" if why else ""),
                          doc)
    if prev is not None and doc.get("previous", {}).get("digest") != ctx.store.digest(prev.stage):
        again, proven = (prev.artifact or {}).get("finished") or "", doc.get("finished") or ""
        if again > proven:  # the earlier stage ran again (a rebuild, --force): this proof was on its last artifact
            return StageState(st.name, STALE, f"chain broken: {prev.stage} ran again at {_when(again)}, after this "
                                              f"stage was proven on its earlier artifact ({_when(proven)}): prove it "
                                              "again (it acts only where its proof fails)", doc)
        return StageState(st.name, STALE, f"chain broken: {prev.stage}'s artifact changed since", doc)
    if doc.get("applicable") is False:
        return StageState(st.name, DONE, f"not applicable: {st.not_applicable(ctx.profile)}", doc)
    if recheck and st.reprove is not None and (bad := reproof(ctx, st, doc)) is not None:
        return StageState(st.name, STALE, f"re-proof failed: {bad.id}: {bad.measured}: {bad.hint}", doc)
    notes = ""
    if recheck and st.check is not None and st.measure is None:
        refused = len(ctx.host.runner.denied)
        f = facts.collect(ctx.host, st.facts, ctx.profile)
        checks = st.check(f, ctx.profile)
        bad = [c for c in checks if c.status == FAIL]
        if bad and len(ctx.host.runner.denied) > refused:  # not a finding about the host: a user p2pkit runs as
            return StageState(st.name, STALE, "could not re-check: p2pkit may not run "
                              + ", ".join(dict.fromkeys(ctx.host.runner.denied[refused:]))
                              + " as this user (not root)", doc)
        if bad:
            why = f" ({bad[0].pitfall}): {bad[0].hint}" if bad[0].pitfall else ""
            return StageState(st.name, STALE, f"re-check failed: {bad[0].id}: {bad[0].measured}{why}", doc)
        notes = "; ".join(f"{c.id}: {c.hint}" for c in checks if c.status == WARN and c.id in st.notes)
    if recheck and st.live is not None:
        name, judge_live = st.live
        found = live.result() if live is not None else facts.collect(ctx.host, (name,), ctx.profile)
        bad = [c for c in judge_live(found.get(name)) if c.status == FAIL]
        if bad:
            return StageState(st.name, STALE, f"re-check failed: {bad[0].id}: {bad[0].measured}: {bad[0].hint}", doc)
    return StageState(st.name, DONE, notes, doc)


def reproof(ctx: Ctx, st: Stage, doc: dict) -> Check | None:
    """What a measuring stage's artifact claims, proven again before it is trusted (as a stage that does not
    measure re-runs its checks on fresh facts): the facts it recorded still pass the stage's own checks (a
    status or figure edited by hand is caught), and the stage's re-proof holds (its files are there and the
    same, its figures are what their samples give). The first failure, or None."""
    recorded = doc.get("facts") if isinstance(doc.get("facts"), dict) else {}
    try:
        bad = next((c for c in (st.check(recorded, ctx.profile) if st.check else []) if c.status == FAIL), None)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # facts no run of this stage writes
        return Check(f"{st.name}.artifact", f"{st.title}: the artifact's facts", FAIL,
                     f"not facts this stage records ({type(e).__name__}: {e})", "the facts of a run",
                     f"run `{command(ctx, 'up', '--from', st.name)}` to prove it again")
    if bad is not None:
        return replace(bad, measured=f"the artifact's own facts fail it: {bad.measured}")
    name, judge_reproof = st.reprove
    fresh = facts.collect(ctx.host, (name,), ctx.profile).get(name) if name else None
    return next((c for c in judge_reproof(recorded, fresh, ctx.profile) if c.status == FAIL), None)


# ---------------------------------------------------------------------------------------- run

def not_implemented(st: Stage) -> Check:
    return Check(f"{st.name}.implemented", f"{st.title}", FAIL, "not implemented yet", "implemented",
                 f"the {st.name} stage is not built in p2pkit {__version__} yet; nothing was done and nothing "
                 "after it can run. Do this step by hand (see docs/) and follow the p2pkit issues")


def not_applicable(st: Stage, why: str) -> Check:
    return Check(f"{st.name}.applies", st.title, SKIP, f"not applicable: {why}", "-")


def prove(ctx: Ctx, st: Stage) -> tuple[dict, list[Check]]:
    """Read the stage's facts, take its measurements, judge them: the stage's proof."""
    found = facts.collect(ctx.host, st.facts, ctx.profile)
    if st.measure is not None:
        found.update(st.measure(ctx))
    return found, st.check(found, ctx.profile) if st.check else []


def run_stage(ctx: Ctx, st: Stage, prev_name: str | None) -> dict:
    """Delete the artifact, act, prove, write the artifact. Returns the artifact.

    A stage that asked for a reboot and runs again after it proves first: when its proof holds, what
    it did before the reboot stands and it does not act again (its artifact keeps that pass)."""
    ctx.store.ensure()
    try:
        old = ctx.store.read(st.name)
    except CorruptArtifact:
        old = None
    resumed = old if old and old.get("status") == REBOOT and \
        old.get("reboot", {}).get("boot_id") != identity(ctx.host)["boot_id"] else None
    marker = ctx.store.dir / RUNNING_FILE
    gate = gate_applies(ctx, st, old, _killed_acting(marker, st.name))
    ctx.store.delete(st.name)
    started = now()
    _ACTING.add(st.name)
    atomic_write(marker, json.dumps({"stage": st.name, "started": started}).encode())
    try:
        return _run_stage(ctx, st, prev_name, started, resumed, gate)
    finally:
        marker.unlink(missing_ok=True)
        _ACTING.discard(st.name)


def _killed_acting(marker: Path, stage: str) -> bool:
    """A run was killed while acting on this stage: its marker is still there (the lock is ours now)."""
    try:
        return json.loads(marker.read_text()).get("stage") == stage
    except (OSError, ValueError, AttributeError):
        return False


def gate_applies(ctx: Ctx, st: Stage, old: dict | None, killed: bool) -> str | None:
    """Whether the artifact gate may skip this stage's act when its proof already holds, and why not.

    Not with --force (act again, whatever the proof says), not after a run killed while acting on the
    stage (a file written and its follow-up never run: the proof does not look at follow-ups), and not
    when the profile inputs changed since the last artifact (a proof need not read every value it sets)."""
    if st.act is None:
        return "the stage does not act"
    if ctx.options.get("force"):
        return "--force"
    if killed:
        return "a run was killed while acting on this stage"
    if old is not None and old.get("inputs") != section_digests(ctx.profile, st):
        return "the profile inputs changed since the last artifact"
    return None


def _gated(ctx: Ctx, st: Stage) -> tuple[dict, list[Check], dict] | None:
    """The artifact gate: the stage's proof on fresh facts before acting. When it holds (nothing fails,
    no reboot pending), the act is skipped and the artifact says why."""
    ctx.options["acted"] = {}
    found, checks = prove(ctx, st)
    if worst(checks) == FAIL or (st.reboot is not None and st.reboot(found, ctx)):
        return None
    passed = sum(1 for c in checks if c.status != SKIP)
    ctx.out.step(st.name, f"not acting: its proof holds before acting ({passed} checks)")
    return found, checks, {"started": False,
                           "why": f"the artifact gate: the stage's proof held before acting ({passed} checks); "
                                  "nothing was started"}


def _proved_after_reboot(ctx: Ctx, st: Stage, resumed: dict | None) -> tuple[dict, list[Check]] | None:
    """After the reboot a stage asked for: its proof, if it holds without acting again."""
    if resumed is None or st.act is None:
        return None
    ctx.options["acted"] = resumed.get("acted", {})
    found, checks = prove(ctx, st)
    pending = st.reboot(found, ctx) if st.reboot is not None else None
    return (found, checks) if worst(checks) != FAIL and not pending else None


def _run_stage(ctx: Ctx, st: Stage, prev_name: str | None, started: str, resumed: dict | None = None,
               gate: str | None = "not asked") -> dict:
    t0 = time.monotonic()
    acted: dict = {}
    reboot_why = None
    held = _proved_after_reboot(ctx, st, resumed)
    why_na = st.not_applicable(ctx.profile)
    if why_na:
        found, checks = {}, [not_applicable(st, why_na)]
    elif not st.implemented:
        found: dict = {}
        checks = [not_implemented(st)]
    elif st.precheck is not None and worst(refusals := st.precheck(ctx.profile)) == FAIL:
        found, checks = {}, refusals  # refused before acting: nothing was done
    elif held is not None:
        found, checks = held
        acted = {"before_reboot": resumed.get("acted", {}),
                 "after_reboot": "nothing: the proof held without acting again"}
    elif gate is None and (gated := _gated(ctx, st)) is not None:
        found, checks, acted = gated
    else:
        if st.act is not None:
            try:
                acted = st.act(ctx)
            except safefs.LinkRefused:
                raise  # a link where p2pkit writes: refused (exit 2, naming it), never a failed check
            except P2pkitError as e:
                acted = {"error": e.message, "hint": e.hint, **({"pitfall": e.pitfall} if e.pitfall else {})}
        ctx.options["acted"] = acted  # this stage's, never an earlier stage's
        if "error" in acted:
            found = {}
            checks = [Check(f"{st.name}.act", f"{st.title}: act", FAIL, acted["error"], "the playbook to succeed",
                            acted.get("hint", ""), acted.get("pitfall", ""))]
        else:
            found, checks = prove(ctx, st)
            pending = st.reboot(found, ctx) if st.reboot is not None else None
            again = asked_before(resumed, pending[1]) if pending else set()
            if again:  # the reboot did not bring them: a failure that names the fix, never another reboot
                boot_id = resumed["reboot"].get("boot_id", "?")
                checks = [(st.unapplied(found, c, boot_id) if st.unapplied else replace(c, status=FAIL))
                          if c.id in again else c for c in checks]
            elif pending:
                reboot_why, ids = pending
                checks = [replace(c, status=PENDING) if c.id in ids else c for c in checks]
    ident = identity(ctx.host)
    status = REBOOT if reboot_why else ("failed" if worst(checks) == FAIL else "passed")
    doc = {
        "schema": SCHEMA,
        "stage": st.name,
        "status": status,
        "simulated": ctx.host.simulated,
        "p2pkit_version": __version__,
        "profile": ctx.profile.name,
        "overrides": hoststate.public_overrides(ctx.profile),
        "started": started,
        "finished": now(),
        "seconds": round(time.monotonic() - t0, 3),
        "host": ident,
        "inputs": section_digests(ctx.profile, st),
        "previous": {"stage": prev_name, "digest": ctx.store.digest(prev_name)} if prev_name else None,
        "acted": acted,
        "facts": found,
        "checks": [c.as_dict() for c in checks],
    }
    if why_na:
        doc["applicable"] = False
    if resumed is not None:  # the pass before the reboot, whose time is part of this stage's
        doc["before_reboot"] = {"started": resumed.get("started"), "finished": resumed.get("finished"),
                                "seconds": resumed.get("seconds"), "boot_id": resumed["reboot"].get("boot_id")}
    if reboot_why:
        doc["reboot"] = {"boot_id": ident["boot_id"], "why": reboot_why}
    ctx.store.write(st.name, doc)
    return doc


def asked_before(resumed: dict | None, ids: list[str]) -> set[str]:
    """Of the checks a stage asks a reboot for now, those it asked the reboot before this boot for."""
    if resumed is None:
        return set()
    return set(ids) & {c.get("id") for c in resumed.get("checks", []) if c.get("status") == PENDING}


def select(start: str | None, stop: str | None) -> list[Stage]:
    stages = registry()
    names = [s.name for s in stages]
    for n in (start, stop):
        if n is not None and n not in names:
            raise P2pkitError(f"no stage named {n!r}", hint="stages are: " + ", ".join(names), code=Exit.USAGE)
    i = names.index(start) if start else 0
    j = names.index(stop) if stop else len(names) - 1
    if i > j:
        raise P2pkitError(f"--from {start} comes after --to {stop}", hint="stages run in order: " + ", ".join(names),
                          code=Exit.USAGE)
    return stages[i:j + 1]


@dataclass
class UpResult:
    code: Exit
    ran: list[str]
    states: list[StageState]
    message: str


def up(ctx: Ctx, start: str | None = None, stop: str | None = None, force: bool = False) -> UpResult:
    selected = select(start, stop)
    ctx.options["force"] = force  # the artifact gate never skips a forced stage's act
    with state_lock(ctx.store.dir, say=ctx.out.warn, root=ctx.host.root):
        prior = hoststate.record_snapshot(ctx.store.dir)
        hoststate.record_profile(ctx.store.dir, ctx.profile)  # later commands use these values
        ctx.options["acted"] = False
        res = None
        try:
            res = _up(ctx, selected, stop, force)
        finally:
            # a run that changed nothing (refused at preflight or at a gate) records nothing: the host keeps
            # the profile it was brought up with, and a command without --profile does not fail the same way
            if (res is None or res.code != Exit.OK) and not ctx.options["acted"]:
                hoststate.put_back(ctx.store.dir, prior)
        return res


def _up(ctx: Ctx, selected: list[Stage], stop: str | None, force: bool) -> UpResult:
    order = [s.name for s in registry()]
    states = {s.stage: s for s in evaluate(ctx)}
    ran: list[str] = []
    for st in selected:
        state = states[st.name]
        if state.state == DONE and not force:
            ctx.out.step(st.name, f"done: {state.reason}" if state.reason else "done: nothing to do")
            continue
        i = order.index(st.name)
        prev_name = order[i - 1] if i else None
        if prev_name and states[prev_name].state != DONE:
            p = states[prev_name]
            raise GateError(
                f"{st.name} needs {prev_name} to have passed; {prev_name} is {p.state}"
                + (f" ({p.reason})" if p.reason else ""), hint=gate_fix(ctx, list(states.values()), stop))
        if state.state == REBOOT:
            return UpResult(Exit.REBOOT, ran, list(states.values()),
                            f"{st.name}: {state.reason}; reboot, then run p2pkit up again")
        why_na = st.not_applicable(ctx.profile)
        if why_na:
            ctx.out.step(st.name, f"not applicable: {why_na}")
        else:
            ctx.out.step(st.name, f"running: {st.title}" + (f" (was {state.state}: {state.reason})"
                                                            if state.state != NOT_RUN and state.reason else ""))
        ctx.options["acted"] = ctx.options["acted"] or st.name != order[0]  # preflight changes nothing
        doc = run_stage(ctx, st, prev_name)
        ran.append(st.name)
        report_checks(ctx.out, st.name, doc["checks"])
        states = {s.stage: s for s in evaluate(ctx, recheck=False)}
        if doc["status"] == "failed":
            first = next(c for c in doc["checks"] if c["status"] == FAIL)
            return UpResult(Exit.CHECK_FAILED, ran, list(states.values()),
                            f"{st.name} failed: {first['id']}: {first['measured']} (expected {first['expected']})."
                            f" Fix: {first['hint']}")
        if doc["status"] == REBOOT:
            return UpResult(Exit.REBOOT, ran, list(states.values()),
                            f"{st.name}: {doc['reboot']['why']}; reboot, then run p2pkit up again")
    final = list(states.values())
    if not ran:
        msg = f"all {len(selected)} selected stage(s) are done: no stage work to do"
    else:
        msg = f"ran {', '.join(ran)}; all selected stages passed"
        after = final[order.index(selected[-1].name) + 1:]
        later = [s for s in after if s.artifact is not None and s.state != DONE]
        if later and later[0].reason.startswith("chain broken"):  # said now, not first met in `status`
            msg += (f"; {' and '.join(s.stage for s in later)} {'were' if len(later) > 1 else 'was'} proven on "
                    f"{selected[-1].name}'s earlier artifact: `{command(ctx, 'up')}` proves "
                    f"{'them' if len(later) > 1 else 'it'} again")
    return UpResult(Exit.OK, ran, final, msg)


def command(ctx: Ctx, *args: str) -> str:
    """A p2pkit command line to print: the output it is printed through adds this host's --root and
    --state-dir (p2pkit.core.output.on_host, the one place that does)."""
    import shlex

    return shlex.join(["p2pkit", *args])


def gate_fix(ctx: Ctx, states: list[StageState], stop: str | None) -> str:
    """A command that the gate lets through: `up` from the first stage that is not done."""
    first = next(s for s in states if s.state != DONE)
    if first.state == REBOOT:
        how = f"`{cmd}`" if (cmd := ctx.host.reboot_command()) else "reboot"
        return f"{first.stage} waits for a reboot ({first.reason}): {how}, then run `{command(ctx, 'up')}`"
    args = ["up"] + (["--from", first.stage] if first is not states[0] else []) + (["--to", stop] if stop else [])
    return f"run `{command(ctx, *args)}`: {first.stage} is the first stage that is not done"


def report_checks(out: Output, stage: str, checks: list[dict]) -> None:
    for c in checks:
        if c["status"] == SKIP and not out.err.is_terminal:
            continue
        line = f"[{stage}]   {c['status'].upper():7} {c['id']}: {c['measured']}"
        if c["status"] != "pass":
            line += f" (expected {c['expected']})"
        style = {"pass": None, "warn": "yellow", "fail": "red", "pending": "cyan", ERROR: "red"}.get(c["status"])
        out.log(line, style=style)
        if c["status"] in ("fail", "warn", "pending", ERROR) and c.get("hint"):
            out.log(f"[{stage}]        fix: {c['hint']}", style=style)


def verify(ctx: Ctx, names: list[str], collected: dict | None = None) -> tuple[list[dict], Exit]:
    """Re-run the named stages' read-only proofs; writes nothing. `collected` gathers the facts."""
    from p2pkit.stages import get

    results = []
    code = Exit.OK
    errors: list[Exit] = []
    collected = {} if collected is None else collected
    ctx.options["full_hash"] = True  # verify proves the model's bytes again (status and up trust its identity)
    for name in names:
        st = get(name)
        started = time.monotonic()
        why_na = st.not_applicable(ctx.profile)
        if why_na:
            checks = [not_applicable(st, why_na)]
        elif not st.implemented:
            checks = [not_implemented(st)]
        else:
            try:
                f, checks = prove(ctx, st)
                collected.update(f)
            except P2pkitError as e:  # this stage could not run here; the others still report
                checks = [could_not_run(st, e)]
                errors.append(e.code)
        status = worst(checks)
        if status == FAIL:
            code = Exit.CHECK_FAILED
        results.append({"stage": name, "status": status, "checks": [c.as_dict() for c in checks],
                        "seconds": round(time.monotonic() - started, 3)})  # the proof's time (JUnit's time)
    if code == Exit.OK and errors:
        code = errors[0]  # nothing failed, but a proof could not run: its own code (a missing tool: 6)
    return results, code


def could_not_run(st: Stage, e: P2pkitError) -> Check:
    return Check(f"{st.name}.ran", f"{st.title}: could not run", ERROR, e.message, "the stage's proof to run",
                 e.hint)


def state_dir_default(root: Path) -> Path:
    return root / "var/lib/p2pkit"
