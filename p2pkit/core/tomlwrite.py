"""The one TOML writer: profiles p2pkit writes (the simulated host's, `profile show --toml`,
`p2pkit pin`). Every string and key is escaped as TOML 1.0 says; what TOML cannot hold (None,
an object) is refused, never written half right. tomllib reads back exactly what was given."""

from __future__ import annotations

import math
import re

from p2pkit.core.breaks import BREAKS
from p2pkit.core.errors import UsageError

BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def string(s: str) -> str:
    out = []
    for ch in s:
        if ch in ESCAPES:
            out.append(ESCAPES[ch])
        elif 0xD800 <= ord(ch) <= 0xDFFF:  # no TOML escape holds a lone surrogate (not a Unicode scalar value)
            raise UsageError(f"cannot write U+{ord(ch):04X} (a byte that is not UTF-8) into a TOML string",
                             hint="give the value as UTF-8 text")
        elif BREAKS.match(ch):  # controls, U+2028, bidi and zero-width characters: escaped, never raw
            out.append(f"\\u{ord(ch):04X}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def comment(text: str) -> str:
    """A `# ` comment line: newlines and every other break escaped (breaks.BREAKS), so nothing leaves the comment."""
    return "# " + string(text)[1:-1]


def key(k: str) -> str:
    return k if BARE_KEY.match(k) else string(k)


def value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")) if not math.isfinite(v) else repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{key(str(k))} = {value(x)}" for k, x in v.items()) + "}"
    raise UsageError(f"cannot write {v!r} ({type(v).__name__}) as a TOML value",
                     hint="profile values are strings, numbers, booleans, lists and tables")


def dumps(data: dict) -> str:
    """Tables of scalars and lists, their sub-tables as [section.key]; deeper tables inline."""
    lines = [f"{key(k)} = {value(v)}" for k, v in data.items() if not isinstance(v, dict)]  # before any table
    for sec, body in data.items():
        if not isinstance(body, dict):
            continue
        lines.append(f"[{key(sec)}]")
        lines += [f"{key(k)} = {value(v)}" for k, v in body.items() if not isinstance(v, dict)]
        lines.append("")
        for k, v in body.items():
            if isinstance(v, dict):
                lines.append(f"[{key(sec)}.{key(k)}]")
                lines += [f"{key(kk)} = {value(vv)}" for kk, vv in v.items()]
                lines.append("")
    return "\n".join(lines)
