"""Pure checks: facts and profile in, findings out. A finding carries the measured value, the
expected value, a fix hint and, where one applies, the PITFALLS id."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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

    def as_dict(self) -> dict:
        return asdict(self)


def judge(id: str, title: str, ok: bool, measured: Any, expected: Any, hint: str = "",
          pitfall: str = "", severity: str = FAIL) -> Check:
    return Check(id, title, PASS if ok else severity, measured, expected, "" if ok else hint, pitfall)


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
