"""`p2pkit doctor`: every stage's read-only checks, grouped by stage, over facts read once (the union of
what the stages' checks declare, plus the live facts); then every pitfall id (p2pkit.rules.pitfalls), each with
the findings that name it, or "n/a" and why none does on this profile."""

from __future__ import annotations

from p2pkit.app.pipeline import not_applicable
from p2pkit.core.config import Profile
from p2pkit.core.errors import UsageError
from p2pkit.core.output import Output
from p2pkit.facts import collect as facts_mod
from p2pkit.rules.findings import ERROR, FAIL, PASS, PENDING, SKIP, WARN, unanswered
from p2pkit.rules.pitfalls import CHECKED_BY, PITFALLS
from p2pkit.stages import registry


def run(ctx) -> dict:
    needed = sorted({n for st in registry() for n in st.facts} | {st.live[0] for st in registry() if st.live})
    found = facts_mod.collect(ctx.host, needed, ctx.profile)
    return judge(found, ctx.profile, simulated=ctx.host.simulated)


def judge(found: dict, profile: Profile, simulated: bool, recorded: str | None = None) -> dict:
    """`recorded`: the facts file judged (`doctor --facts`): a fact it could not read is that host's, so its fix
    is to record the facts again there, never --debug (nothing runs here to show)."""
    groups = []
    for st in registry():
        if not st.implemented or st.check is None:
            groups.append({"stage": st.name, "checks": [], "note": "not implemented yet: nothing to check"})
            continue
        why_na = st.not_applicable(profile)  # as up and verify: a stage that does not apply is not judged
        checks = [c.as_dict() for c in ([not_applicable(st, why_na)] if why_na else st.check(found, profile))]
        for c in checks:
            if c["pitfall"]:
                c["pitfall_text"] = PITFALLS.get(c["pitfall"], "")
            if recorded is not None:
                c["hint"] = recorded_fix(c, recorded)
        groups.append({"stage": st.name, "checks": checks})
    # a command that did not answer in time (a loaded machine, a wedged tool) says nothing of the host: such a
    # check is listed as not checked, never counted failed (issue 47 item 3)
    failed = [c["id"] for g in groups for c in g["checks"] if c["status"] == FAIL and not unanswered(c)]
    not_checked = [{"id": c["id"], "why": c["measured"]} for g in groups for c in g["checks"]
                   if c["status"] == SKIP or str(c["measured"]).startswith(("could not determine", "could not check"))]
    return {"kind": "p2pkit-doctor", "profile": profile.name, "simulated": simulated, "groups": groups,
            "failed": failed, "not_checked": not_checked,
            "unanswered": [c["id"] for g in groups for c in g["checks"] if unanswered(c)],
            "pitfalls": pitfalls(groups, profile)}


def recorded_fix(c: dict, source: str) -> str:
    """A check's fix where it judged a facts file: a fact that could not be read, or a command that did not answer
    in time, when the file was recorded is fixed on that host and recorded again (issue 47 item 4)."""
    measured = str(c["measured"])
    again = f"record the facts again there (`p2pkit facts record {source}`)"
    if unanswered(c):
        return (f"a command did not answer in time on the host when {source} was recorded (a loaded machine, or a "
                f"hung tool): {again}, and if it keeps hanging find out why")
    if c["status"] == FAIL and measured.startswith("could not determine"):
        return (f"this fact could not be read on the host when {source} was recorded: fix the cause named there, "
                f"then {again}")
    return c["hint"]


RANK = (FAIL, ERROR, PENDING, WARN, PASS, SKIP)  # a pitfall's status: the worst of the findings naming it


def pitfalls(groups: list[dict], profile: Profile) -> list[dict]:
    """Every pitfall id, in order: the status and ids of the findings that name it, or "n/a" with why no
    finding does on this profile (its check does not apply, its stage does not, or it is no host's fact)."""
    out = []
    for pid, text in PITFALLS.items():
        named = [c for g in groups for c in g["checks"] if c["pitfall"] == pid]
        if named:
            status = min((c["status"] for c in named), key=lambda s: RANK.index(s) if s in RANK else len(RANK))
            out.append({"id": pid, "text": text, "status": status, "checks": [c["id"] for c in named]})
        else:
            out.append({"id": pid, "text": text, "status": "n/a", "checks": [],
                        "why": why_none(pid, profile)})
    return out


def why_none(pid: str, profile: Profile) -> str:
    """Why no finding names the pitfall on this profile: its stage does not apply, or where it is checked."""
    stage, where = CHECKED_BY[pid]
    st = next((s for s in registry() if s.name == stage), None)
    why_na = st.not_applicable(profile) if st is not None else None
    if why_na:
        return f"the {stage} stage does not apply to {profile.name}: {why_na}"
    return f"no finding on {profile.name}: checked by {where}" if stage else where


def from_paste(text: str, profile: Profile, source: str) -> dict:
    """A pasted output of a known kind judged like a host's facts: one group, "paste", whose findings
    name the pitfall and its fix. A paste of no known kind is refused, naming the kinds. Its readers are imported
    here: a host's doctor never uses them (issue 38 item 9: doctor's imports)."""
    from p2pkit.app import paste as paste_checks
    from p2pkit.parse import paste

    kind = paste.kind(text)
    if kind is None:
        known = "; ".join(f"{k}: {v}" for k, v in paste.KINDS.items())
        raise UsageError(f"{source} is no output p2pkit knows how to read (known kinds: {known})",
                         hint="paste the whole output of one of those commands into the file, as it printed it")
    checks = [c.as_dict() for c in paste_checks.check(kind, text, profile)]
    for c in checks:
        c["pitfall_text"] = PITFALLS.get(c["pitfall"], "")
    return {"kind": "p2pkit-doctor", "profile": profile.name, "simulated": False,
            "groups": [{"stage": "paste", "checks": checks}], "source": source, "paste_kind": kind,
            "failed": [c["id"] for c in checks if c["status"] == FAIL],
            "not_checked": [{"id": c["id"], "why": c["measured"]} for c in checks
                            if c["status"] == SKIP or str(c["measured"]).startswith("could not determine")]}


def _paste_unsure(report: dict) -> str:
    """Beside "0 check(s) failed" for a paste that showed too little: why doctor still exits 1."""
    if "paste_kind" not in report or report["failed"] or not report["not_checked"]:
        return ""
    why = "; ".join(str(n["why"]).removeprefix("could not determine: ") for n in report["not_checked"][:2])
    return (f", but {len(report['not_checked'])} could not be judged from the paste ({why}): a paste that shows too "
            "little is never a pass (exit 1); paste the whole output, from the box with the GPUs")


def render(out: Output, report: dict) -> None:
    for g in report["groups"]:
        if not g["checks"]:
            out.line(f"{g['stage']}: {g.get('note', '')}", style="dim")
            continue
        rows = []
        for c in g["checks"]:
            fix = c["hint"] if c["status"] in ("fail", "warn") else ""
            rows.append([c["status"], c["id"], c["pitfall"], c["measured"], c["expected"], fix])
        out.table(g["stage"], ["", "check", "pitfall", "measured", "expected", "fix"], rows, status_col=0)
    if report["not_checked"]:
        out.line("could not check: " + "; ".join(f"{n['id']} ({n['why']})" for n in report["not_checked"]),
                 style="yellow")
    if report.get("pitfalls"):
        na = [x for x in report["pitfalls"] if x["status"] == "n/a"]
        out.table("pitfalls", ["", "pitfall", "what it is", "checks", "why"],
                  [[x["status"], x["id"], x["text"], ", ".join(x["checks"]), x.get("why", "")]
                   for x in report["pitfalls"]], status_col=0)
        out.line(f"{len(report['pitfalls']) - len(na)} of {len(report['pitfalls'])} pitfalls named by a finding on "
                 f"this profile, {len(na)} n/a", style="dim")
    out.line(f"{len(report['failed'])} check(s) failed" + (": " + ", ".join(report["failed"]) if report["failed"]
                                                           else "") + _paste_unsure(report))
    if report.get("unanswered"):
        out.line(f"{len(report['unanswered'])} could not be checked, a command they need having not answered in "
                 f"time: {', '.join(report['unanswered'])}; run doctor again (a loaded machine answers later), and if "
                 "one keeps hanging find out why", style="yellow")
    # no GPU (or not the count the profile needs) explains most of the failures above: said last, where the eye
    # lands, with its fix
    gpus = next((c for g in report["groups"] for c in g["checks"]
                 if c["id"] == "preflight.gpu_count" and c["status"] == "fail"), None)
    if gpus is not None:
        out.line(f"preflight.gpu_count: {gpus['measured']} (expected {gpus['expected']}); {gpus['hint']}",
                 style="yellow")
