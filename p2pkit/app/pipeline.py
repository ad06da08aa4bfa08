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
from p2pkit.rules import places
from p2pkit.rules.findings import ERROR, FAIL, PENDING, SKIP, WARN, Check, unanswered, worst
from p2pkit.stages import Stage, registry

DONE, STALE, FAILED, REBOOT, NOT_RUN, RUNNING = "done", "stale", "failed", "reboot-needed", "not run", "running"
UNCHECKED = "could not check"  # a command its re-check needed did not answer in time: nothing said of the stage
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
    seen = facts.Snapshot(ctx.host, ctx.profile)  # one judgement: nothing acts between the stages' re-checks
    for st in registry():
        states.append(_state_of(ctx, st, prev, ident, recheck, live.get(st.name), seen))
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
        doc = json.loads(safefs.read_bytes(store.dir / RUNNING_FILE))  # never a FIFO's wait (issue 48 item 4)
    except (OSError, ValueError, safefs.LinkRefused):
        return None
    return {**doc, "pid": holder} if isinstance(doc, dict) else None


def _when(stamp: str) -> str:
    return stamp[:19].replace("T", " ")


def killed_marker(store: Store) -> dict | None:
    """The marker of the stage a run was acting on, left when that run was killed (its own run removes it
    in any other ending); read only when no run holds the lock (running_now)."""
    try:
        doc = json.loads(safefs.read_bytes(store.dir / RUNNING_FILE))  # never a FIFO's wait (issue 48 item 4)
    except (OSError, ValueError, safefs.LinkRefused):
        return None
    return doc if isinstance(doc, dict) else None


def _state_of(ctx: Ctx, st: Stage, prev: StageState | None, ident: dict, recheck: bool,
              live: Future | None = None, snapshot: facts.Snapshot | None = None) -> StageState:
    """A stage's state, judged in named steps: its artifact (none: not run, running or interrupted), then each
    reason the artifact no longer stands, then (recheck) its proof again on the host as it is now."""
    try:
        doc = ctx.store.read(st.name)
    except CorruptArtifact as e:
        return StageState(st.name, STALE, e.message)
    if doc is None:
        return _no_artifact(ctx, st, prev)
    seen = _Seen(ctx, st, doc, prev, ident, snapshot or facts.Snapshot(ctx.host, ctx.profile))
    for step in (_written_elsewhere, _kernel_changed, _waits_for_reboot, _not_passed, _earlier_not_done,
                 _profile_changed, _chain_broken, _places_untrusted, _not_applicable):
        if (state := step(seen)) is not None:
            return state
    if not recheck:
        return StageState(st.name, DONE, "", doc)
    return _rechecked(seen, live)


@dataclass
class _Seen:
    """What a stage's state is judged from: the context, the stage, its artifact, the state of the stage
    before it, and this host's identity now."""
    ctx: Ctx
    st: Stage
    doc: dict
    prev: StageState | None
    ident: dict
    snapshot: facts.Snapshot  # the facts read in this judgement, each read once

    def stale(self, why: str) -> StageState:
        return StageState(self.st.name, STALE, why, self.doc)


def _no_artifact(ctx: Ctx, st: Stage, prev: StageState | None) -> StageState:
    """No artifact: a run is acting on the stage now, a run was killed while acting on it, or it has not run."""
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


def _written_elsewhere(s: _Seen) -> StageState | None:
    if not s.ctx.host.wrote(s.doc, s.ident["machine_id"]):
        return s.stale("artifact was written on another host (or a simulated one)")
    return None


def _kernel_changed(s: _Seen) -> StageState | None:
    was = s.doc.get("host", {}).get("kernel")
    if was != s.ident["kernel"] and s.doc["status"] != REBOOT:
        return s.stale(f"kernel changed since ({was} -> {s.ident['kernel']}): prove it again")
    return None


def _waits_for_reboot(s: _Seen) -> StageState | None:
    """The stage asked for a reboot: in this boot it still waits for it; after another boot it runs again."""
    if s.doc["status"] != REBOOT:
        return None
    if s.doc.get("reboot", {}).get("boot_id") == s.ident["boot_id"]:
        return StageState(s.st.name, REBOOT, s.doc["reboot"].get("why", "a reboot is needed"), s.doc)
    return s.stale("rebooted since: run the stage again to prove the result")


def _not_passed(s: _Seen) -> StageState | None:
    if s.doc["status"] == "passed":
        return None
    first = next((c for c in s.doc.get("checks", []) if c.get("status") == FAIL), None)
    return StageState(s.st.name, FAILED, f"{first['id']}: {first['measured']}" if first else "failed", s.doc)


def _earlier_not_done(s: _Seen) -> StageState | None:
    if s.prev is not None and s.prev.state == UNCHECKED:  # nothing known of the one before: nothing of this one
        return StageState(s.st.name, UNCHECKED, f"earlier stage {s.prev.stage} could not be checked", s.doc)
    if s.prev is not None and s.prev.state != DONE:
        return s.stale(f"earlier stage {s.prev.stage} is {s.prev.state}")
    return None


def _profile_changed(s: _Seen) -> StageState | None:
    changed = [n for n, d in section_digests(s.ctx.profile, s.st).items() if s.doc.get("inputs", {}).get(n) != d]
    if not changed:
        return None
    why = hoststate.override_change(s.doc.get("overrides"), s.ctx.profile.overrides, [c.split(".")[0] for c in changed])
    return s.stale(f"profile changed: {', '.join(changed)}" + (f" ({why})" if why else ""))


def _chain_broken(s: _Seen) -> StageState | None:
    prev = s.prev
    if prev is None or s.doc.get("previous", {}).get("digest") == s.ctx.store.digest(prev.stage):
        return None
    again, proven = (prev.artifact or {}).get("finished") or "", s.doc.get("finished") or ""
    if again > proven:  # the earlier stage ran again (a rebuild, --force): this proof was on its last artifact
        return s.stale(f"chain broken: {prev.stage} ran again at {_when(again)}, after this stage was proven on its "
                       f"earlier artifact ({_when(proven)}): prove it again (it acts only where its proof fails)")
    return s.stale(f"chain broken: {prev.stage}'s artifact changed since")


def _places(ctx: Ctx, st: Stage) -> list[tuple[places.Place, Path, tuple[int, ...]]]:
    """The stage's places (rules/places.py) as paths on this machine, each with the owners besides root it may
    have (the engine's account for its working directory)."""
    state = ctx.host.host_path(ctx.store.dir)
    out = []
    for pl in places.places(st.name, ctx.profile, state):
        real = ctx.store.dir / pl.path[len(state) + 1:] if pl.path.startswith(state + "/") else \
            ctx.host.path(pl.path)
        out.append((pl, real, _engine_uid(ctx) if pl.engine_owned else ()))
    return out


def _engine_uid(ctx: Ctx) -> tuple[int, ...]:
    """The engine's account's uid on this host (its /etc/passwd), where it has one."""
    from p2pkit.host import system

    try:
        for line in ctx.host.path("/etc/passwd").read_text(errors="replace").split("\n"):
            f = line.split(":")
            if len(f) > 3 and f[0] == system.ENGINE_USER and f[2].isdigit():
                return (int(f[2]),)
    except OSError:
        pass
    return ()


def untrusted_places(ctx: Ctx, st: Stage) -> tuple[list[str], list[str]]:
    """(the stage's places that another user could change now, each with its owner and mode; the directories above
    them that are not p2pkit's and another user could change, as safefs.check_trusted names them)."""
    found = _places(ctx, st)
    ours = {str(real) for _, real, _ in found}
    mine, above, judged = [], [], set()
    for pl, real, owners in found:
        why = safefs.place_untrusted(real, owners)
        if why:
            mine.append(f"{pl.what}: {why}")
        bad = _above(real, judged, ours)
        if bad:
            above.append(safefs.distrusted(bad, f"above {pl.what}").message)
    return mine, above


def _above(real: Path, judged: set[str], ours: set[str]):
    """The first directory above a place (from /) that another user could change and that is not itself one of
    the stage's places (those are repaired, never refused), or None; each directory judged once."""
    parent = str(real.parent)
    if parent in judged or not os.path.lexists(real):
        return None
    judged.add(parent)
    bad = safefs.first_untrusted(parent)
    return None if bad is None or bad[0] in ours else bad


def _places_untrusted(s: _Seen) -> StageState | None:
    """What root later runs, loads or hands to the service, another user could change (issue 48 item 2): not
    proven any more. `up` repairs what the stage wrote and refuses a directory above it that is not p2pkit's."""
    mine, above = untrusted_places(s.ctx, s.st)
    if above:
        return s.stale(f"{above[0]}: fix it, then `p2pkit up` proves the stage again")
    if mine:
        return s.stale(f"{'; '.join(mine[:3])}: `{command(s.ctx, 'up')}` repairs it (p2pkit wrote it) and proves "
                       "the stage again")
    return None


def secure_places(ctx: Ctx, st: Stage) -> list[str]:
    """Before a stage acts: each place it wrote is repaired (owner root, no group or other write; the engine's
    checkout as a whole tree), the shallowest first, each repair said; then a directory above one of them that is
    not p2pkit's and another user could change is refused (exit 2: path, owner, mode and fix). What was
    repaired."""
    found = sorted(_places(ctx, st), key=lambda x: len(x[1].parts))
    ours = {str(real) for _, real, _ in found}
    repaired: list[str] = []
    for pl, real, owners in found:
        done = safefs.repair_place(real, owners)
        if done:
            repaired.append(done)
        if pl.tree and real.is_dir() and not real.is_symlink():
            repaired += safefs.repair_tree(real)
    judged: set[str] = set()
    for pl, real, _ in found:
        bad = _above(real, judged, ours)
        if bad:
            raise safefs.distrusted(bad, f"above {pl.what}", f"p2pkit then repairs {real} itself")
    for r in repaired:
        ctx.out.warn(f"[{st.name}] repaired what another user could change: {r}")
    return repaired


def _not_applicable(s: _Seen) -> StageState | None:
    if s.doc.get("applicable") is False:
        return StageState(s.st.name, DONE, f"not applicable: {s.st.not_applicable(s.ctx.profile)}", s.doc)
    return None


def _rechecked(s: _Seen, live: Future | None) -> StageState:
    """The artifact stands; its proof again, now: a measuring stage's re-proof, a reading stage's checks on fresh
    facts, a live probe. Done (with the warnings status shows beside it), or stale with the first failure."""
    ctx, st = s.ctx, s.st
    if st.reprove is not None and (bad := reproof(ctx, st, s.doc, s.snapshot)) is not None:
        return s.stale(f"re-proof failed: {bad.id}: {bad.measured}: {bad.hint}")
    notes = ""
    if st.check is not None and st.measure is None:
        refused = len(ctx.host.runner.denied)
        checks = st.check(s.snapshot.collect(st.facts), ctx.profile)
        bad = [c for c in checks if c.status == FAIL]
        if bad and len(ctx.host.runner.denied) > refused:  # not a finding about the host: a user p2pkit runs as
            return s.stale("could not re-check: p2pkit may not run "
                           + ", ".join(dict.fromkeys(ctx.host.runner.denied[refused:])) + " as this user (not root)")
        if real := [c for c in bad if not unanswered(c)]:
            why = f" ({real[0].pitfall}): {real[0].hint}" if real[0].pitfall else ""
            return s.stale(f"re-check failed: {real[0].id}: {real[0].measured}{why}")
        if bad:
            return _unchecked(s, bad[0])
        notes = "; ".join(f"{c.id}: {c.hint}" for c in checks if c.status == WARN and c.id in st.notes)
    if st.live is not None:
        name, judge_live = st.live
        found = live.result() if live is not None else s.snapshot.collect((name,))
        bad = [c for c in judge_live(found.get(name)) if c.status == FAIL]
        if real := [c for c in bad if not unanswered(c)]:
            return s.stale(f"re-check failed: {real[0].id}: {real[0].measured}: {real[0].hint}")
        if bad:
            return _unchecked(s, bad[0])
    return StageState(st.name, DONE, notes, s.doc)


def _unchecked(s: _Seen, c: Check) -> StageState:
    """A re-check that could not be made (a command it needed did not answer within its limit, however long the
    machine's load made it): nothing is known of the stage, and nothing on the host needs redoing."""
    why = str(c.measured).removeprefix("could not determine: ")
    return StageState(s.st.name, UNCHECKED, f"could not re-check {c.id}: {why}; run `{command(s.ctx, 'status')}` "
                      "again (a loaded machine answers later), and if it keeps hanging find out why", s.doc)


def reproof(ctx: Ctx, st: Stage, doc: dict, snapshot: facts.Snapshot | None = None) -> Check | None:
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
    fresh = (snapshot or facts.Snapshot(ctx.host, ctx.profile)).collect((name,)).get(name) if name else None
    return next((c for c in judge_reproof(recorded, fresh, ctx.profile) if c.status == FAIL), None)


# ---------------------------------------------------------------------------------------- run

def not_implemented(st: Stage) -> Check:
    return Check(f"{st.name}.implemented", f"{st.title}", FAIL, "not implemented yet", "implemented",
                 f"the {st.name} stage is not built in p2pkit {__version__} yet; nothing was done and nothing "
                 "after it can run. Do this step by hand (see docs/) and follow the p2pkit issues")


def not_applicable(st: Stage, why: str) -> Check:
    return Check(f"{st.name}.applies", st.title, SKIP, f"not applicable: {why}", "-")


def prove(ctx: Ctx, st: Stage, acted: dict | None = None) -> tuple[dict, list[Check]]:
    """Read the stage's facts, take its measurements, judge them: the stage's proof. `acted` is what the stage's
    act did in this run (None where it did not act in this run: verify, restore's re-check, doctor)."""
    found = facts.collect(ctx.host, st.facts, ctx.profile)
    if st.measure is not None:
        found.update(st.measure(ctx, acted))
    return found, st.check(found, ctx.profile) if st.check else []


def run_stage(ctx: Ctx, st: Stage, prev_name: str | None) -> dict:
    """Delete the artifact, act, prove, write the artifact. Returns the artifact.

    A stage that asked for a reboot and runs again after it proves first: when its proof holds, what
    it did before the reboot stands and it does not act again (its artifact keeps that pass)."""
    ctx.store.ensure()
    repaired = secure_places(ctx, st)  # issue 48 item 2: before anything of the stage's is read or used
    try:
        old = ctx.store.read(st.name) if not any(r.startswith(str(ctx.store.path(st.name))) for r in repaired) \
            else None  # an artifact another user could write is not read as proven
    except CorruptArtifact:
        old = None
    resumed = old if old and old.get("status") == REBOOT and \
        old.get("reboot", {}).get("boot_id") != identity(ctx.host)["boot_id"] else None
    marker = ctx.store.dir / RUNNING_FILE
    ctx.options["previous_artifact"] = old  # what the stage's last run recorded (its act compares its outputs)
    gate = gate_applies(ctx, st, old, _killed_acting(marker, st.name))
    if repaired and gate is None:
        gate = f"repaired what another user could change ({repaired[0]}): proved again by acting"
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
        return json.loads(safefs.read_bytes(marker)).get("stage") == stage
    except (OSError, ValueError, AttributeError, safefs.LinkRefused):
        return False


def gate_applies(ctx: Ctx, st: Stage, old: dict | None, killed: bool) -> str | None:
    """Whether the artifact gate may skip this stage's act when its proof already holds, and why not.

    Not with --force (act again, whatever the proof says), not after a run killed while acting on the
    stage (a file written and its follow-up never run: the proof does not look at follow-ups), not
    when the profile inputs changed since the last artifact (a proof need not read every value it sets),
    and not when what the last artifact claims no longer holds (its re-proof: an output removed or edited
    since, which a proof on fresh facts may not read, such as a comment added to the engine's unit)."""
    if st.act is None:
        return "the stage does not act"
    if ctx.options.get("force"):
        return "--force"
    if killed:
        return "a run was killed while acting on this stage"
    if old is not None and old.get("inputs") != section_digests(ctx.profile, st):
        return "the profile inputs changed since the last artifact"
    if old is not None and st.reprove is not None and (bad := reproof(ctx, st, old)) is not None:
        return f"the last artifact's re-proof failed ({bad.id}: {bad.measured})"
    return None


@dataclass
class Outcome:
    """What a stage's run came to, before its artifact is written: the facts, the findings, what its act did,
    why a reboot is needed (None: none), and whether the stage applies to the profile at all."""
    found: dict
    checks: list[Check]
    acted: dict
    reboot_why: str | None = None
    applicable: bool = True


def _run_stage(ctx: Ctx, st: Stage, prev_name: str | None, started: str, resumed: dict | None = None,
               gate: str | None = "not asked") -> dict:
    """A stage's run as named steps, the first that has an outcome ends it: refused (not applicable, not
    built, its precheck), held after the reboot it asked for, gated (its proof held before acting), else
    acted and proved; then written."""
    t0 = time.monotonic()
    outcome = (_refused(ctx, st) or _held_after_reboot(ctx, st, resumed) or _gated(ctx, st, gate)
               or _proved(ctx, st, resumed, _acted(ctx, st)))
    return _written(ctx, st, prev_name, started, t0, resumed, outcome)


def _refused(ctx: Ctx, st: Stage) -> Outcome | None:
    """Not run at all: the stage does not apply to this profile, is not built yet, or its precheck refuses the
    profile before anything is done."""
    why_na = st.not_applicable(ctx.profile)
    if why_na:
        return Outcome({}, [not_applicable(st, why_na)], {}, applicable=False)
    if not st.implemented:
        return Outcome({}, [not_implemented(st)], {})
    if st.precheck is not None and worst(refusals := st.precheck(ctx.profile)) == FAIL:
        return Outcome({}, refusals, {})
    return None


def _held_after_reboot(ctx: Ctx, st: Stage, resumed: dict | None) -> Outcome | None:
    """After the reboot a stage asked for: its proof, if it holds without acting again (what it did before the
    reboot stands)."""
    if resumed is None or st.act is None:
        return None
    before = resumed.get("acted", {})
    found, checks = prove(ctx, st, before)
    if worst(checks) == FAIL or (st.reboot is not None and st.reboot(found, ctx, before)):
        return None
    return Outcome(found, checks, {"before_reboot": before, "after_reboot": "nothing: the proof held without acting "
                                                                            "again"})


def _gated(ctx: Ctx, st: Stage, gate: str | None) -> Outcome | None:
    """The artifact gate (gate None: it applies): the stage's proof on fresh facts before acting. When it holds
    (nothing fails, no reboot pending), the act is skipped and the artifact says why."""
    if gate is not None:
        return None
    found, checks = prove(ctx, st, {})
    if worst(checks) == FAIL or (st.reboot is not None and st.reboot(found, ctx, {})):
        return None
    passed = sum(1 for c in checks if c.status != SKIP)
    ctx.out.step(st.name, f"not acting: its proof holds before acting ({passed} checks)")
    return Outcome(found, checks, {"started": False,
                                   "why": f"the artifact gate: the stage's proof held before acting ({passed} "
                                          "checks); nothing was started"})


def _acted(ctx: Ctx, st: Stage) -> dict:
    """The stage's act: what it did, or the error that stopped it ({"error", "hint", "pitfall"})."""
    if st.act is None:
        return {}
    try:
        return st.act(ctx)
    except safefs.LinkRefused:
        raise  # a link where p2pkit writes: refused (exit 2, naming it), never a failed check
    except P2pkitError as e:
        return {"error": e.message, "hint": e.hint, **({"pitfall": e.pitfall} if e.pitfall else {})}


def _proved(ctx: Ctx, st: Stage, resumed: dict | None, acted: dict) -> Outcome:
    """The proof after the act, handed what the act did. A check only a reboot can pass is pending, with the
    reason; one the reboot before this boot was already asked for fails, naming the fix (no second reboot)."""
    if "error" in acted:
        return Outcome({}, [Check(f"{st.name}.act", f"{st.title}: act", FAIL, acted["error"], "the playbook to succeed",
                                  acted.get("hint", ""), acted.get("pitfall", ""))], acted)
    found, checks = prove(ctx, st, acted)
    pending = st.reboot(found, ctx, acted) if st.reboot is not None else None
    if not pending:
        return Outcome(found, checks, acted)
    again = asked_before(resumed, pending[1])
    if again:  # the reboot did not bring them: a failure that names the fix, never another reboot
        boot_id = resumed["reboot"].get("boot_id", "?")
        return Outcome(found, [(st.unapplied(found, c, boot_id) if st.unapplied else replace(c, status=FAIL))
                               if c.id in again else c for c in checks], acted)
    reboot_why, ids = pending
    return Outcome(found, [replace(c, status=PENDING) if c.id in ids else c for c in checks], acted, reboot_why)


def _written(ctx: Ctx, st: Stage, prev_name: str | None, started: str, t0: float, resumed: dict | None,
             outcome: Outcome) -> dict:
    """The artifact, written last: the outcome with the host, the profile inputs and the link to the artifact
    before it."""
    ident = identity(ctx.host)
    status = REBOOT if outcome.reboot_why else ("failed" if worst(outcome.checks) == FAIL else "passed")
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
        "acted": outcome.acted,
        "facts": outcome.found,
        "checks": [c.as_dict() for c in outcome.checks],
    }
    if not outcome.applicable:
        doc["applicable"] = False
    if resumed is not None:  # the pass before the reboot, whose time is part of this stage's
        doc["before_reboot"] = {"started": resumed.get("started"), "finished": resumed.get("finished"),
                                "seconds": resumed.get("seconds"), "boot_id": resumed["reboot"].get("boot_id")}
    if outcome.reboot_why:
        doc["reboot"] = {"boot_id": ident["boot_id"], "why": outcome.reboot_why}
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
    hint: str = ""  # the next thing to do, where the run stopped short
    going_down: bool = False  # a real host is rebooting: the resume unit carries on after boot


def up(ctx: Ctx, start: str | None = None, stop: str | None = None, force: bool = False) -> UpResult:
    selected = select(start, stop)
    ctx.options["force"] = force  # the artifact gate never skips a forced stage's act
    with state_lock(ctx.store.dir, say=ctx.out.warn, root=ctx.host.root):
        prior = hoststate.record_snapshot(ctx.store.dir)
        hoststate.record_profile(ctx.store.dir, ctx.profile)  # later commands use these values
        started: list[str] = []
        res = None
        try:
            res = _up(ctx, selected, stop, force, started)
        finally:
            # a run in which no stage past preflight started (refused at preflight or at a gate) records nothing:
            # the host keeps the profile it was brought up with, and a command without --profile does not fail
            # the same way
            if (res is None or res.code != Exit.OK) and not set(started) - {registry()[0].name}:
                hoststate.put_back(ctx.store.dir, prior)
        return res


def _up(ctx: Ctx, selected: list[Stage], stop: str | None, force: bool, started: list[str]) -> UpResult:
    """Each selected stage that is not done, in order, behind the gate of the one before it; `started` names
    each stage as it starts."""
    states = {s.stage: s for s in evaluate(ctx)}
    ran: list[str] = []
    for st in selected:
        state = states[st.name]
        if state.state == DONE and not force:
            ctx.out.step(st.name, f"done: {state.reason}" if state.reason else "done: nothing to do")
            continue
        prev_name = _previous(st.name)
        _through_the_gate(ctx, st, prev_name, states, stop)
        if state.state == REBOOT:
            return UpResult(Exit.REBOOT, ran, list(states.values()),
                            f"{st.name}: {state.reason}; reboot, then run p2pkit up again")
        _say_running(ctx, st, state)
        started.append(st.name)
        doc = run_stage(ctx, st, prev_name)
        ran.append(st.name)
        report_checks(ctx.out, st.name, doc["checks"])
        states = {s.stage: s for s in evaluate(ctx, recheck=False)}
        if doc["status"] in ("failed", REBOOT):
            return _stopped_at(st, doc, ran, list(states.values()))
    return UpResult(Exit.OK, ran, list(states.values()), _all_passed(ctx, selected, ran, list(states.values())))


def refused_before_recording(ctx: Ctx, start: str | None) -> UpResult | None:
    """Where nothing is recorded on this host yet (no state directory), preflight is proven before anything is
    written: a run it stops (a machine without GPUs) leaves no state directory, lock or artifact behind, as the
    README says of a run that stops at preflight (issue 47 item 11). None: it passes (or the state directory is
    there): `up` goes on as ever, preflight's own run writing its artifact."""
    first = registry()[0]
    if start not in (None, first.name) or ctx.store.dir.exists() or first.check is None:
        return None
    refused = _refused(ctx, first)
    checks = refused.checks if refused is not None else prove(ctx, first, None)[1]
    if worst(checks) != FAIL:
        return None
    docs = [c.as_dict() for c in checks]
    ctx.out.step(first.name, f"running: {first.title}")
    report_checks(ctx.out, first.name, docs)
    bad = next(c for c in docs if c["status"] == FAIL)
    states = evaluate(ctx, recheck=False)
    states[0] = StageState(first.name, FAILED, f"{bad['id']}: {bad['measured']} (nothing recorded on this host)",
                           {"stage": first.name, "status": "failed", "checks": docs})  # shown, never written
    return _stopped_at(first, {"status": "failed", "checks": docs}, [first.name], states)


def _previous(name: str) -> str | None:
    order = [s.name for s in registry()]
    i = order.index(name)
    return order[i - 1] if i else None


def _through_the_gate(ctx: Ctx, st: Stage, prev_name: str | None, states: dict[str, StageState],
                      stop: str | None) -> None:
    """Stage N runs only when stage N-1 is done: else a GateError naming the command that gets through."""
    if prev_name and states[prev_name].state != DONE:
        p = states[prev_name]
        raise GateError(f"{st.name} needs {prev_name} to have passed; {prev_name} is {p.state}"
                        + (f" ({p.reason})" if p.reason else ""), hint=gate_fix(ctx, list(states.values()), stop))


def _say_running(ctx: Ctx, st: Stage, state: StageState) -> None:
    why_na = st.not_applicable(ctx.profile)
    if why_na:
        ctx.out.step(st.name, f"not applicable: {why_na}")
    else:
        ctx.out.step(st.name, f"running: {st.title}" + (f" (was {state.state}: {state.reason})"
                                                        if state.state != NOT_RUN and state.reason else ""))


def _stopped_at(st: Stage, doc: dict, ran: list[str], states: list[StageState]) -> UpResult:
    """A stage failed or asked for a reboot: the run stops there, saying why and what to do."""
    if doc["status"] == REBOOT:
        return UpResult(Exit.REBOOT, ran, states,
                        f"{st.name}: {doc['reboot']['why']}; reboot, then run p2pkit up again")
    failed = [c for c in doc["checks"] if c["status"] == FAIL]
    first = failed[0]
    # only tools missing (preflight names each with its apt line): exit 6, as for a missing extra
    code = Exit.MISSING if all(c["id"] in MISSING_TOOL_CHECKS and str(c["measured"]).startswith("missing:")
                               for c in failed) else Exit.CHECK_FAILED
    return UpResult(code, ran, states, f"{st.name} failed: {first['id']}: {first['measured']} (expected "
                                       f"{first['expected']}). Fix: {first['hint']}")


MISSING_TOOL_CHECKS = ("preflight.tools",)  # a failure that is a command p2pkit needs and the host lacks


def _all_passed(ctx: Ctx, selected: list[Stage], ran: list[str], final: list[StageState]) -> str:
    if not ran:
        return f"all {len(selected)} selected stage(s) are done: no stage work to do"
    msg = f"ran {', '.join(ran)}; all selected stages passed"
    order = [s.name for s in registry()]
    after = final[order.index(selected[-1].name) + 1:]
    later = [s for s in after if s.artifact is not None and s.state != DONE]
    if later and later[0].reason.startswith("chain broken"):  # said now, not first met in `status`
        msg += (f"; {' and '.join(s.stage for s in later)} {'were' if len(later) > 1 else 'was'} proven on "
                f"{selected[-1].name}'s earlier artifact: `{command(ctx, 'up')}` proves "
                f"{'them' if len(later) > 1 else 'it'} again")
    return msg


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
