"""Pure checks: facts and profile in, findings out. A finding carries the measured value, the
expected value, a fix hint and, where one applies, the PITFALLS id.

A finding with a figure is typed: `value` (a number), `unit`, and the bound it was held to (`op`
and `limit`, in the same unit); `figure()` judges the number against the bound and writes the
display text from them. Reports (JUnit, Prometheus) read the numbers, never the text."""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass
from typing import Any

from p2pkit.core.runner import UNANSWERED

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
PENDING = "pending"  # fails now, and a reboot is what makes it pass
ERROR = "could-not-run"  # the proof could not run here (a tool or extra missing): neither passed nor failed


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    status: str
    measured: Any = None
    expected: Any = None
    hint: str = ""
    pitfall: str = ""
    value: float | None = None  # the measured figure as a number (a bandwidth ratio), for Prometheus
    unit: str = ""  # of value and limit: one of DIGITS ("ratio", "GB/s", "GiB", "MiB", "lanes", "s", "count", ...)
    op: str = ""  # how value is held against limit: ">=", "<=", "=="
    limit: float | None = None  # the bound, in unit

    def as_dict(self) -> dict:
        return asdict(self)


def judge(id: str, title: str, ok: bool, measured: Any, expected: Any, hint: str = "",
          pitfall: str = "", severity: str = FAIL, value: float | None = None) -> Check:
    return Check(id, title, PASS if ok else severity, measured, expected, "" if ok else hint, pitfall, value)


OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, ">": operator.gt, "<": operator.lt}
# each unit a figure may carry: the digits its display shows, and the word shown after the number
DIGITS = {"ratio": 2, "GB/s": 1, "Gb/s": 0, "GT/s": 1, "us": 2, "ms": 0, "s": 2, "GiB": 1, "MiB": 0, "bytes": 0,
          "lanes": 0, "tokens": 0, "%": 0, "count": 0, "exposure": 1}
SHOWN_UNIT = {"ratio": "of the ceiling", "count": "", "exposure": ""}
GLUED = {"%"}  # shown without a space: 100%


def show(x: float | None, unit: str, missing: str = "not measured") -> str:
    """A figure as the display text shows it: 28.5 GB/s, 0.90 of the ceiling, 3."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return missing
    d = DIGITS.get(unit, 2)
    num = f"{x:.{d}f}" if d or not float(x).is_integer() else f"{int(x)}"
    u = SHOWN_UNIT.get(unit, unit)
    return f"{num}{u}" if unit in GLUED else f"{num} {u}".strip()


def figure(id: str, title: str, value: float | None, op: str, limit: float, unit: str, hint: str = "",
           pitfall: str = "", severity: str = FAIL, context: str = "", expected_context: str = "",
           missing: str = "not measured", text: str = "{}") -> Check:
    """A typed finding: `value` held to `op limit` in `unit`. No value (not measured) never passes;
    nor does NaN. The measured and expected texts are made from the numbers (plus context; `text`
    places the number in a sentence, at its first {})."""
    ok = value is not None and math.isfinite(value) and OPS[op](value, limit)
    shown = show(value, unit, missing)
    measured = (place(text, shown) if shown != missing else shown) + (f" ({context})" if context else "")
    expected = f"{op} {show(limit, unit)}" + (f" {expected_context}" if expected_context else "")
    return Check(id, title, PASS if ok else severity, measured, expected, "" if ok else hint, pitfall,
                 value, unit, op, limit)


def reading(id: str, title: str, status: str, value: float | None, unit: str, expected: Any, hint: str = "",
            pitfall: str = "", text: str = "{}", missing: str = "not measured") -> Check:
    """A typed finding whose number is held to no numeric bound (the expectation is a state, "no memory
    cap", or a code, 200): `value` in `unit` carried for reports, the status given by the check. The
    measured text is `text` with the number shown in place of its first {} (or `missing` alone, with no
    number)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return Check(id, title, status, missing, expected, "" if status == PASS else hint, pitfall, None, unit)
    return Check(id, title, status, place(text, show(value, unit)), expected, "" if status == PASS else hint,
                 pitfall, value, unit)


def place(text: str, shown: str) -> str:
    """`text` with `shown` at its first {}: the rest of the text is taken as it is (a log line's own braces
    stay; str.format would read them as fields). The {} goes before any text read from the host."""
    return text.replace("{}", shown, 1)


def unknown(id: str, title: str, fact: Any, expected: Any, needed: bool = True, pitfall: str = "") -> Check:
    """A fact that could not be read: a failure where the stage needs it, a skip where it does not."""
    why = fact.get("error") if isinstance(fact, dict) else str(fact)
    return Check(id, title, FAIL if needed else SKIP, f"could not determine: {why}", expected,
                 "fix the cause named above, or rerun with --debug" if needed else "", pitfall)


def not_measured(f: dict, key: str, id: str, title: str, why: str, expected: Any) -> Check | None:
    """The finding when a stage's measured fact is absent (doctor measures nothing) or failed."""
    b = f.get(key)
    if b is None:
        return Check(id, title, SKIP, f"not measured here: {why}", expected)
    if failed(b):
        return unknown(id, title, b, expected)
    return None


def unanswered(check: Check | dict) -> bool:
    """A failure that is no finding about the host: a command it needed did not answer within its limit (a
    loaded machine, a wedged tool). "could not check", never stale or failed (issue 47 item 3)."""
    measured = check.get("measured") if isinstance(check, dict) else check.measured
    status = check.get("status") if isinstance(check, dict) else check.status
    return status == FAIL and bool(UNANSWERED.search(str(measured)))


def failed(fact: Any) -> bool:
    return isinstance(fact, dict) and "error" in fact and len(fact) == 1


def worst(checks: list[Check]) -> str:
    if any(c.status == FAIL for c in checks):
        return FAIL
    if any(c.status == ERROR for c in checks):
        return ERROR
    if any(c.status == WARN for c in checks):
        return WARN
    return PASS


# ------------------------------------------------------------------------------ the facts a check reads

def reads(*names: str, given: tuple[str, ...] = ()):
    """Declare the facts a check function reads: `names` are collected (p2pkit.facts.collect names them),
    `given` are handed to it by its stage's measurement or live probe, never collected. A stage
    collects exactly the union of its checks' `names` (p2pkit.stages.stage.Stage.facts)."""
    def mark(fn):
        fn.reads, fn.given = tuple(names), tuple(given)
        return fn
    return mark


def facts_read(*fns) -> tuple[str, ...]:
    """The collected facts the check functions declare, in order, each once."""
    return tuple(dict.fromkeys(n for fn in fns for n in fn.reads))


def combine(*fns):
    """One stage check from several: their findings in order; it reads what they declare."""
    def check(f: dict, p) -> list[Check]:
        return [c for fn in fns for c in fn(f, p)]
    check.reads = facts_read(*fns)
    check.given = tuple(dict.fromkeys(n for fn in fns for n in fn.given))
    check.parts = fns
    return check


def could_not(id: str, title: str, fact: Any, expected: Any, pitfall: str) -> Check:
    """A fact the check needs could not be read (no root, a tool missing): a warning that names what to
    run by hand, never a pass."""
    why = fact.get("error", "not read") if isinstance(fact, dict) else str(fact)
    by_hand = fact.get("by_hand", "") if isinstance(fact, dict) else ""
    return Check(id, title, WARN, f"could not check, because {why}", expected,
                 f"run by hand: {by_hand}" if by_hand else "rerun as root", pitfall)


def unreadable(fact: Any) -> bool:
    return fact is None or failed(fact) or (isinstance(fact, dict) and "error" in fact)


IDENTITY = ("dev", "ino", "size", "mtime_ns", "ctime_ns")  # host/system.file_identity


def changed(recorded: dict, now: dict) -> list[str]:
    """How a file's identity now differs from the one recorded (each field that moved): the engine and model
    gates' one comparison, and the service gate's for its secrets file."""
    return [f"{k} {recorded.get(k)} -> {now.get(k)}" for k in IDENTITY if recorded.get(k) != now.get(k)]


def pair(p) -> bool:
    """The profile's GPUs are a pair on one host (BAR1 P2P between them); a one-GPU node has none."""
    return p.gpus.count >= 2
