"""One writer per file format that root reads later: each escapes what it can and refuses what it
cannot write safely, naming the value and the character. Nothing is pasted into such a file by
string formatting anywhere else (DESIGN: "Seams that keep it simple").

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

import json
import math
import re
import shlex
import tomllib
from typing import Any

from p2pkit.core import breaks, tomlwrite
from p2pkit.core.errors import UsageError

CONTROL = breaks.BREAKS  # what no file p2pkit writes may hold (the name it had when it was the C0 controls)
UNIT_PLAIN = re.compile(r"^[A-Za-z0-9_./:=+,@-]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class UnsafeValue(UsageError):
    """A value that cannot be written into the target format without changing its meaning."""


def char_name(ch: str) -> str:
    return breaks.name(ch)


def refuse_controls(what: str, value: str, fmt: str) -> str:
    m = CONTROL.search(value)
    if m:
        raise UnsafeValue(f"{what} holds {char_name(m.group())}, which cannot be written into {fmt}",
                          hint=f"remove it from {what}")
    return value


# systemd units ----------------------------------------------------------------------------------

def unit_value(what: str, value: str) -> str:
    """A free-text setting (Description=, a comment): one line, `%` escaped."""
    return refuse_controls(what, str(value), "a systemd unit").replace("%", "%%")


def unit_path(what: str, path: str) -> str:
    """An absolute path setting (WorkingDirectory=, EnvironmentFile=, ReadWritePaths=, Condition*=)."""
    path = refuse_controls(what, str(path), "a systemd unit")
    if not path.startswith("/"):
        raise UnsafeValue(f"{what} is not an absolute path: {path!r}", hint=f"give {what} as an absolute path")
    bad = re.search(r"[\s\"'\\;]", path)
    if bad:
        raise UnsafeValue(f"{what} holds {char_name(bad.group())} ({path!r}), which a systemd path setting cannot "
                          "hold", hint=f"use a path without it for {what}")
    return path.replace("%", "%%")


def _unit_word(word: str) -> str:
    if UNIT_PLAIN.match(word):
        return word.replace("%", "%%")
    quoted = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{quoted}"'


def unit_exec(argv: list[str], what: str = "the command line") -> str:
    """A command line for a systemd Exec*= setting: each word quoted when it needs it."""
    words = [refuse_controls(what, str(a), "a systemd unit") for a in argv]
    if not words or not words[0] or words[0][0] in "@-:+!|":
        raise UnsafeValue(f"{what} starts with {words[0][:1]!r} if anything, which systemd reads as a prefix",
                          hint="give the program as an absolute path")
    return " ".join(_unit_word(w) for w in words)


# environment files ------------------------------------------------------------------------------

def env_line(name: str, value: str, what: str = "") -> str:
    what = what or name
    if not ENV_NAME.match(name):
        raise UnsafeValue(f"{what}: {name!r} is not an environment variable name",
                          hint="use letters, digits and _ (not starting with a digit)")
    value = refuse_controls(what, str(value), "an environment file")
    escaped = re.sub(r'([\\"$`])', r"\\\1", value)
    return f'{name}="{escaped}"'


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
    out: dict[str, str] = {}
    key: list[str] = []
    value: list[str] = []
    state, key_ws, value_ws = "pre_key", None, None

    def push() -> None:
        k = "".join(key[:key_ws] if key_ws is not None else key)
        v = value[:value_ws] if state == "value" and value_ws is not None else value
        if k:
            out[k] = "".join(v)

    for c in text:
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif c not in _ENV_SPACE:
                state, key, key_ws = "key", [c], None
        elif state == "key":
            if c in _ENV_NEWLINE:
                state = "pre_key"
            elif c == "=":
                state, value, value_ws = "pre_value", [], None
            else:
                key_ws = None if c not in _ENV_SPACE else (len(key) if key_ws is None else key_ws)
                key.append(c)
        elif state == "pre_value":
            if c in _ENV_NEWLINE:
                push()
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in _ENV_SPACE:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in _ENV_NEWLINE:
                push()
                state = "pre_key"
            elif c == "\\":
                state, value_ws = "value_escape", None
            else:
                value_ws = None if c not in _ENV_SPACE else (len(value) if value_ws is None else value_ws)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in _ENV_NEWLINE:  # an escaped newline is eaten up
                value.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value.append(c)
        elif state == "double_escape":
            state = "double"
            if c in _ENV_ESCAPED:
                value.append(c)
            elif c != "\n":  # another character keeps its backslash, as the shell does
                value += ["\\", c]
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in _ENV_NEWLINE:
                state = "pre_key"
        elif state == "comment_escape":
            state = "pre_key" if c in _ENV_NEWLINE else "comment"
    if state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        push()
    return out


def env_file(env: dict[str, str], header: str = "", what: str = "") -> str:
    lines = [f"# {refuse_controls('the header', ln, 'a comment')}" for ln in breaks.lines(header)]
    lines += [env_line(k, v, f"{what}.{k}" if what else k) for k, v in env.items()]
    return "\n".join(lines) + "\n"


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
