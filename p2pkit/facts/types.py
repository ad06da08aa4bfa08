"""Whether a fact is of its type: the type the fact table names for it (p2pkit/facts/table.py; the
shapes are in p2pkit/facts/shapes.py), each number with its unit.

A fact is JSON: what a probe returns, or what `p2pkit facts record` wrote on another host. Keys are
optional (a probe that could not read a part leaves it out or puts {"error": ...} in its place) and keys
not declared are let through (a recording from an earlier or later p2pkit); what is declared must have
its type.

`problem(name, value)` says why a fact is not its type; `checked(facts)` puts {"error": "<fact> is
not <type>"} in place of each fact that is not, so the check that reads it says "could not
determine: ..." as for any fact that could not be read. No traceback, no guess."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal, TypedDict, Union

from p2pkit.facts.shapes import Failed
from p2pkit.facts.table import TABLE

# each fact's type, as the fact table declares it
FACTS: dict[str, Any] = {f.name: f.type for f in TABLE}


class Recording(TypedDict, total=False):
    """What `p2pkit facts record` writes around the facts."""
    kind: Literal["p2pkit-facts"]
    schema: int
    p2pkit_version: str
    simulated: bool
    recorded_at: str
    root: str
    profile: dict[str, Any] | None
    facts: dict[str, Any]


RECORDING_NEEDS = ("kind", "simulated", "facts")


def name(tp: Any) -> str:
    """A type as the message names it: "bytes (an integer)", "a list of PciGpu", "PciLink or None"."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return f"{args[1]} ({name(args[0])})"
    if origin in (Union, types.UnionType):
        return " or ".join(name(a) for a in args)
    if origin is Literal:
        return " or ".join(repr(a) for a in args)
    if origin is list:
        return f"a list of {name(args[0])}"
    if origin is dict:
        return f"a map of {name(args[1])}"
    known = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "None",
             Any: "anything", Failed: 'a failure ({"error": ...})'}
    return known.get(tp, getattr(tp, "__name__", str(tp)))


def _problem(value: Any, tp: Any, where: str) -> str | None:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return None
    if origin is Annotated:
        return None if _problem(value, args[0], where) is None else f"{where} is not {name(tp)}"
    if origin in (Union, types.UnionType):
        return _union_problem(value, tp, where)
    if origin is Literal:
        return None if value in args else f"{where} is not {name(tp)}"
    if origin in (list, dict) or typing.is_typeddict(tp):
        return _container_problem(value, tp, where)
    return _scalar_problem(value, tp, where)


def _union_problem(value: Any, tp: Any, where: str) -> str | None:
    args = typing.get_args(tp)
    if any(_problem(value, a, where) is None for a in args):
        return None
    # the most telling message: the one from the member of the value's own JSON kind
    same = [a for a in args if _kind(a) is not None and isinstance(value, _kind(a))]
    return _problem(value, same[0], where) if len(same) == 1 else f"{where} is not {name(tp)}"


def _container_problem(value: Any, tp: Any, where: str) -> str | None:
    """A list, a map or a TypedDict: of its kind, then the first member that is not its type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if not isinstance(value, list if origin is list else dict):
        return f"{where} is not {name(tp)}"
    if origin is list:
        return next((p for i, x in enumerate(value) if (p := _problem(x, args[0], f"{where}[{i}]"))), None)
    if origin is dict:
        return next((p for k, x in value.items() if (p := _problem(x, args[1], f"{where}.{k}"))), None)
    fields = typing.get_type_hints(tp, include_extras=True)
    return next((p for k, x in value.items() if k in fields and (p := _problem(x, fields[k], f"{where}.{k}"))),
                None)


def _scalar_problem(value: Any, tp: Any, where: str) -> str | None:
    if tp is type(None):
        return None if value is None else f"{where} is not None"
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    return None if ok else f"{where} is not {name(tp)}"


def _kind(tp: Any) -> type | tuple | None:
    """The JSON kind a declared type takes (dict, list, int, ...), to pick a union's member."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _kind(typing.get_args(tp)[0])
    if origin in (list, dict):
        return origin
    if typing.is_typeddict(tp):
        return dict
    return tp if tp in (int, float, str, bool) else None


def problem(fact: str, value: Any) -> str | None:
    """Why a fact's value is not its declared type ("disk.free_bytes is not bytes (an integer)"), or
    None. A fact that failed ({"error": ...}) is its type; a fact not declared here is not judged."""
    if fact not in FACTS or (isinstance(value, dict) and "error" in value and set(value) <= {"error", "by_hand"}):
        return None
    return _problem(value, FACTS[fact], fact)


def recording_problem(doc: Any) -> str | None:
    """Why a recorded document is no facts recording (its envelope: the facts are judged one by one)."""
    if not isinstance(doc, dict):
        return "the file is not a JSON object"
    missing = [k for k in RECORDING_NEEDS if k not in doc]
    if missing:
        return f"it has no {', '.join(missing)}"
    why = _problem(doc, Recording, "")
    return why and why.removeprefix(".")


def checked(facts: dict) -> dict:
    """The facts, each one that is not its type replaced by {"error": "<where> is not <type>"}: the
    check that reads it then says "could not determine: ..." as for a fact that could not be read."""
    return {k: ({"error": p} if (p := problem(k, v)) else v) for k, v in facts.items()}
