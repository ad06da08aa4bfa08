"""One writer per file format that root reads later: each escapes what it can and refuses what it
cannot write safely, naming the value and the character. Nothing is pasted into such a file by
string formatting anywhere else (DESIGN: "Seams that keep it simple").

- systemd units and environment files: p2pkit.core.unitenv (stdlib only, shared with the p2pkit.host
  collection's filter plugins), re-exported here with its refusal carried as UnsafeValue.
- systemd units: setting values (`%` is a specifier: written `%%`), paths, Exec*= command lines
  (each word quoted, `\\` and `"` escaped, `%%` and `$$`), per systemd.unit(5), systemd.service(5).
- environment files: NAME="value" with `\\`, `"`, `$` and backquote escaped (systemd's
  EnvironmentFile= parser, src/basic/env-file.c, and a POSIX shell read them the same way).
- shell words: shlex.quote.
- Ansible variables: a YAML document whose every string that holds a `{` is tagged `!unsafe`, so
  Jinja never evaluates a `{{ ... }}` that came from a user (JSON extra-vars are templated).
- TOML: p2pkit.core.tomlwrite writes values and documents; `toml_set` here changes one key of a
  user's file in place and keeps its comments (what `p2pkit pin` needs).
- JSON: no NaN or infinity (not JSON): such a number is written as null.
Control characters (a newline above all), and every other character a reader could take as a line or
word break or that changes how text reads (U+2028, U+0085, bidi overrides, zero-width characters: the one
table, p2pkit.core.breaks.BREAKS), fit none of them: refused everywhere.
"""

from __future__ import annotations

import functools
import json
import math
import re
import shlex
import tomllib
from typing import Any

from p2pkit.core import breaks, tomlwrite, unitenv
from p2pkit.core.errors import UsageError

CONTROL = breaks.BREAKS  # what no file p2pkit writes may hold (the name it had when it was the C0 controls)
UNIT_PLAIN, ENV_NAME = unitenv.UNIT_PLAIN, unitenv.ENV_NAME


class UnsafeValue(UsageError):
    """A value that cannot be written into the target format without changing its meaning."""


def _carried(write):
    """One of p2pkit.core.unitenv's writers (the one writer of its format, shared with the p2pkit.host
    collection's filter plugins), its refusal carried as p2pkit's own UnsafeValue: the same message and hint,
    exit 2."""

    @functools.wraps(write)
    def carried(*args, **kwargs):
        try:
            return write(*args, **kwargs)
        except unitenv.Refused as e:
            raise UnsafeValue(e.message, hint=e.hint) from None

    return carried


def char_name(ch: str) -> str:
    return breaks.name(ch)


# systemd units (unit_value, unit_path, unit_exec) and environment files (env_line, env_file): p2pkit.core.unitenv
refuse_controls = _carried(unitenv.refuse_controls)
unit_value = _carried(unitenv.unit_value)
unit_path = _carried(unitenv.unit_path)
unit_exec = _carried(unitenv.unit_exec)
env_line = _carried(unitenv.env_line)
env_file = _carried(unitenv.env_file)
ip_filter = _carried(unitenv.ip_filter)  # the engine unit's IPAddressDeny=, IPAddressAllow=


def env_value(raw: str) -> str:
    """Read back one value as systemd's EnvironmentFile= parser does (src/basic/env-file.c): inside
    double quotes a backslash escapes \\ " $ and backquote; outside, any one character."""
    out, quoted, i = [], False, 0
    while i < len(raw):
        ch = raw[i]
        if ch == '"':
            quoted = not quoted
        elif ch == "\\" and i + 1 < len(raw) and (not quoted or raw[i + 1] in '\\"$`'):
            i += 1
            out.append(raw[i])
        else:
            out.append(ch)
        i += 1
    return "".join(out)


_ENV_NEWLINE, _ENV_SPACE, _ENV_ESCAPED = "\n\r", " \t\n\r", '"\\`$'  # systemd's NEWLINE, WHITESPACE, SHELL_NEED_ESCAPE


def read_env_file(text: str) -> dict[str, str]:
    """An environment file read as systemd's EnvironmentFile= reads it (src/basic/env-file.c,
    parse_env_file_internal): a line ends at \\n or \\r and nowhere else (never at U+2028 or U+0085); `#`
    and `;` start a comment; a value is bare (a backslash escapes one character, trailing blanks dropped),
    'single-quoted' or "double-quoted" (a backslash escapes " \\ ` $ and a newline); a later name replaces
    an earlier one. The one reader of the files env_file writes, and of the ones people write by hand."""
    r = _EnvFileReader()
    step = {name: getattr(r, name) for name in _EnvFileReader.STATES}
    for c in text:
        step[r.state](c)
    if r.state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        r.push()
    return r.out


class _EnvFileReader:
    """parse_env_file_internal's states, one method each: the method of the state the reader is in takes the
    next character."""

    STATES = ("pre_key", "key", "pre_value", "value", "value_escape", "single", "double", "double_escape", "comment",
              "comment_escape")

    def __init__(self) -> None:
        self.out: dict[str, str] = {}
        self.name_chars: list[str] = []
        self.value_chars: list[str] = []
        self.state, self.key_ws, self.value_ws = "pre_key", None, None

    def push(self) -> None:
        k = "".join(self.name_chars[:self.key_ws] if self.key_ws is not None else self.name_chars)
        v = self.value_chars
        if self.state == "value" and self.value_ws is not None:
            v = v[:self.value_ws]
        if k:
            self.out[k] = "".join(v)

    def pre_key(self, c: str) -> None:
        if c in "#;":
            self.state = "comment"
        elif c not in _ENV_SPACE:
            self.state, self.name_chars, self.key_ws = "key", [c], None

    def key(self, c: str) -> None:
        if c in _ENV_NEWLINE:
            self.state = "pre_key"
        elif c == "=":
            self.state, self.value_chars, self.value_ws = "pre_value", [], None
        else:
            self.key_ws = None if c not in _ENV_SPACE else (len(self.name_chars) if self.key_ws is None
                                                            else self.key_ws)
            self.name_chars.append(c)

    def pre_value(self, c: str) -> None:
        if c in _ENV_NEWLINE:
            self.push()
            self.state = "pre_key"
        elif c == "'":
            self.state = "single"
        elif c == '"':
            self.state = "double"
        elif c == "\\":
            self.state = "value_escape"
        elif c not in _ENV_SPACE:
            self.state = "value"
            self.value_chars.append(c)

    def value(self, c: str) -> None:
        if c in _ENV_NEWLINE:
            self.push()
            self.state = "pre_key"
        elif c == "\\":
            self.state, self.value_ws = "value_escape", None
        else:
            self.value_ws = None if c not in _ENV_SPACE else (len(self.value_chars) if self.value_ws is None
                                                              else self.value_ws)
            self.value_chars.append(c)

    def value_escape(self, c: str) -> None:
        self.state = "value"
        if c not in _ENV_NEWLINE:  # an escaped newline is eaten up
            self.value_chars.append(c)

    def single(self, c: str) -> None:
        if c == "'":
            self.state = "pre_value"
        else:
            self.value_chars.append(c)

    def double(self, c: str) -> None:
        if c == '"':
            self.state = "pre_value"
        elif c == "\\":
            self.state = "double_escape"
        else:
            self.value_chars.append(c)

    def double_escape(self, c: str) -> None:
        self.state = "double"
        if c in _ENV_ESCAPED:
            self.value_chars.append(c)
        elif c != "\n":  # another character keeps its backslash, as the shell does
            self.value_chars += ["\\", c]

    def comment(self, c: str) -> None:
        if c == "\\":
            self.state = "comment_escape"
        elif c in _ENV_NEWLINE:
            self.state = "pre_key"

    def comment_escape(self, c: str) -> None:
        self.state = "pre_key" if c in _ENV_NEWLINE else "comment"


# shell ------------------------------------------------------------------------------------------

def shell_word(what: str, value: str) -> str:
    return shlex.quote(refuse_controls(what, str(value), "a shell script"))


def shell_command(argv: list[str], what: str = "the command line") -> str:
    return " ".join(shell_word(what, a) for a in argv)


# Ansible variables ------------------------------------------------------------------------------

def _yaml(v: Any, where: str) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, int | float):
        if isinstance(v, float) and not math.isfinite(v):
            raise UnsafeValue(f"{where} is {v}, not a number Ansible can be given", hint=f"give {where} a finite value")
        return json.dumps(v)
    if isinstance(v, str):
        # Jinja needs a {: a string without one is never templated and stays a plain quoted string.
        # (ansible-core 2.19 re-resolves a !unsafe scalar: "000" would turn into the integer 0.)
        return ("!unsafe " if "{" in v else "") + json.dumps(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_yaml(str(k), where)}: {_yaml(x, f'{where}.{k}')}" for k, x in v.items()) + "}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_yaml(x, where) for x in v) + "]"
    return _yaml(str(v), where)


def ansible_vars(doc: dict[str, Any]) -> str:
    """Extra vars for `ansible-playbook -e @FILE`: every string `!unsafe` (never templated)."""
    return "---\n" + "\n".join(f"{k}: {_yaml(v, k)}" for k, v in doc.items()) + "\n"


# TOML -------------------------------------------------------------------------------------------
# Values and whole documents: p2pkit.core.tomlwrite (the one TOML writer); here, one key of a user's file.

_HEADER = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")


def _get(doc: dict, keys: list[str]):
    for k in keys:
        if not isinstance(doc, dict) or k not in doc:
            return KeyError
        doc = doc[k]
    return doc


def toml_set(text: str, keys: list[str], value: Any, comment: str = "") -> str:
    """Set one key (keys = table path + key, like ["p2p_module", "commit"]) in a TOML document's
    text, keeping every other line and comment; the key's line is replaced (or added to its table,
    or the table is added). With a comment, the key's line carries it (`key = value  # comment`).
    The result is parsed back and must hold exactly the new value."""
    *table, key = keys
    line = f"{tomlwrite.key(key)} = {tomlwrite.value(value)}"
    if comment:
        line += "  " + tomlwrite.comment(comment)
    lines = breaks.lines(text)  # TOML breaks a line on \n only: a U+2028 inside a string is part of it
    want = ".".join(table)
    start = None if table else 0
    end = len(lines)
    for i, ln in enumerate(lines):
        m = _HEADER.match(ln)
        if not m:
            continue
        name = ".".join(p.strip().strip('"') for p in m.group(1).split("."))
        if start is not None and i >= start and (table or i > 0) and name != want:
            end = i
            break
        if name == want and start is None:
            start = i + 1
    if start is None:
        lines += ["", f"[{'.'.join(tomlwrite.key(t) for t in table)}]", line]
    else:
        pat = re.compile(rf"^\s*{re.escape(tomlwrite.key(key))}\s*=")
        hit = next((i for i in range(start, end) if pat.match(lines[i])), None)
        if hit is not None:
            lines[hit] = line
        else:
            last = max((i for i in range(start, end) if lines[i].strip() and not lines[i].lstrip().startswith("#")),
                       default=start - 1)
            lines.insert(last + 1, line)
    new = "\n".join(lines) + "\n"
    try:
        got = _get(tomllib.loads(new), keys)
    except tomllib.TOMLDecodeError as e:
        raise UnsafeValue(f"setting {'.'.join(keys)} would leave the file unreadable: {e}",
                          hint="edit that key by hand (a value spread over several lines is not replaced)") from e
    if got != value:
        raise UnsafeValue(f"setting {'.'.join(keys)} did not take (the file holds {got!r})",
                          hint="edit that key by hand (a value spread over several lines is not replaced)")
    return new


# JSON -------------------------------------------------------------------------------------------

def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


def json_text(doc: Any, indent: int | None = 2, **kw) -> str:
    """JSON that every reader accepts: NaN and infinities (not JSON) written as null."""
    return json.dumps(_finite(doc), indent=indent, default=str, allow_nan=False, **kw) + "\n"
