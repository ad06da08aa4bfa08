"""The writers of the two formats the engine's service is written in, and the words its command line is
made of: one module that imports nothing but the standard library, so that p2pkit (p2pkit.core.writers,
rules/engines/flags.py) and the p2pkit.host collection's filter plugins (plugins/module_utils/unitenv.py is a
relative symlink to this file; `ansible-galaxy collection build` copies it in as a file) write the same bytes
and refuse the same values.

- systemd units: setting values (`%` is a specifier: written `%%`), paths, Exec*= command lines (each word
  quoted, `\\` and `"` escaped, `%%` and `$$`), per systemd.unit(5), systemd.service(5); the user of User=
  and Group= and each of SupplementaryGroups= (a user or group name, nothing else); the service's own name;
  the IP filter (IPAddressDeny/Allow) of the engine's unit.
- environment files: NAME="value" with `\\`, `"`, `$` and backquote escaped (systemd's EnvironmentFile=
  parser, src/basic/env-file.c, and a POSIX shell read them the same way).
- an engine's flags as command-line words: `--name value`, a switch (true) bare, false or no value left out.

BREAKS is the one table of the characters no file p2pkit writes may hold (p2pkit.core.breaks explains it and
re-exports it): each writer refuses them, raising Refused (a message naming the value and the character, a
hint naming the fix); p2pkit.core.writers carries it as UnsafeValue (exit 2), a filter plugin as Ansible's
filter error.
"""

from __future__ import annotations

import re
import unicodedata

BREAKS = re.compile(
    "["
    "\x00-\x1f\x7f-\x9f"  # C0 controls, DEL, C1 controls (U+0085 NEXT LINE)
    "\u00a0\u00ad"  # NO-BREAK SPACE, SOFT HYPHEN
    "\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"  # Arabic and Syriac format characters, ARABIC LETTER MARK
    "\u1680\u180e"  # OGHAM SPACE MARK, MONGOLIAN VOWEL SEPARATOR
    "\u2000-\u200f"  # the typographic spaces, ZERO WIDTH SPACE/NON-JOINER/JOINER, LRM, RLM
    "\u2028-\u202f"  # LINE and PARAGRAPH SEPARATOR, bidi embeddings and overrides, NARROW NO-BREAK SPACE
    "\u205f-\u2064\u2066-\u206f"  # MEDIUM MATHEMATICAL SPACE, WORD JOINER, invisible operators, bidi isolates
    "\u3000"  # IDEOGRAPHIC SPACE
    "\ud800-\udfff"  # lone surrogates (bytes that are not UTF-8)
    "\ufeff\ufff9-\ufffb"  # ZERO WIDTH NO-BREAK SPACE (BOM), interlinear annotation
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"  # LANGUAGE TAG, the tag characters
    "]"
)

_SHORT = {"\n": "a newline (\\n)", "\r": "a carriage return (\\r)", "\t": "a tab (\\t)", "\0": "a NUL byte"}
_C1 = {0x85: "NEXT LINE"}  # the C1 control Unicode's database gives no name but is a line break
_KIND = {"Zl": "a line break", "Zp": "a line break", "Zs": "a space other than U+0020",
         "Cf": "an invisible format character", "Cs": "a lone surrogate (a byte that is not UTF-8)"}


def name(ch: str) -> str:
    """How an error message names a character: a newline, a tab, a printable one quoted, the rest by
    code point and Unicode name (U+2028 LINE SEPARATOR, a line break)."""
    if ch in _SHORT:
        return _SHORT[ch]
    cat = unicodedata.category(ch)
    if cat == "Cc":
        extra = f" ({_C1[ord(ch)]}, a line break)" if ord(ch) in _C1 else ""
        return f"the control character U+{ord(ch):04X}{extra}"
    if ch.isprintable() and not BREAKS.match(ch):
        return f"the character {ch!r}"
    uname = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}{' ' + uname if uname else ''} ({_KIND.get(cat, 'an invisible character')})"


class Refused(ValueError):
    """A value that cannot be written into the target format without changing its meaning."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message, self.hint = message, hint


# \Z, not $: `$` also matches before a final newline, so "X\n" passed ENV_NAME and split its line in two
UNIT_PLAIN = re.compile(r"^[A-Za-z0-9_./:=+,@-]+\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# A user (and its group) for User= and Group=, made by useradd: the names systemd's strict check accepts
# (src/basic/user-util.c valid_user_group_name without VALID_USER_RELAX: a letter or _ first, then letters,
# digits, _ and -, at most 31 characters, what fits utmp) in the form useradd(8) recommends (CAVEATS:
# [a-z_][a-z0-9_-]*[$]?, lower case; without the Samba machine account's final $). Anything else changes
# the unit: User= expands specifiers (`%i` is another user at run time), a newline starts a new setting.
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,30}\Z")
USER_RULE = "lowercase letters, digits, _ and -, starting with a letter or _, at most 31 characters"


def refuse_controls(what: str, value: str, fmt: str) -> str:
    m = BREAKS.search(value)
    if m:
        raise Refused(f"{what} holds {name(m.group())}, which cannot be written into {fmt}",
                      hint=f"remove it from {what}")
    return value


# systemd units ----------------------------------------------------------------------------------

def unit_value(what: str, value: str) -> str:
    """A free-text setting (Description=, a comment): one line, `%` escaped. A value ending in `\\` is
    refused: systemd joins a setting's line that ends in a backslash with the next one (systemd.syntax(7);
    systemd 252's verify then reads the next line's ExecStart= as part of this value)."""
    value = refuse_controls(what, str(value), "a systemd unit")
    if value.endswith("\\"):
        raise Refused(f"{what} ends with a backslash ({value!r}), which systemd reads as joining the unit's "
                      "next line to this setting", hint=f"remove the final backslash from {what}")
    return value.replace("%", "%%")


def unit_path(what: str, path: str) -> str:
    """An absolute path setting (WorkingDirectory=, EnvironmentFile=, ReadWritePaths=, Condition*=)."""
    path = refuse_controls(what, str(path), "a systemd unit")
    if not path.startswith("/"):
        raise Refused(f"{what} is not an absolute path: {path!r}", hint=f"give {what} as an absolute path")
    bad = re.search(r"[\s\"'\\;]", path)
    if bad:
        raise Refused(f"{what} holds {name(bad.group())} ({path!r}), which a systemd path setting cannot hold",
                      hint=f"use a path without it for {what}")
    return path.replace("%", "%%")


def unit_user(what: str, user: str) -> str:
    """A user or group name for User= and Group= (the engine's system user): USER_NAME's, or refused naming
    what it holds (a newline, a `%`) and the rule."""
    user = str(user)
    if USER_NAME.match(user):
        return user
    bad = BREAKS.search(user) or re.search(r"[^a-z0-9_-]", user)
    if bad:
        why = f"holds {name(bad.group())}, which a user name cannot hold"
    elif not user:
        why = "is empty"
    elif len(user) > 31:
        why = f"is {len(user)} characters long, more than a user name may be"
    else:
        why = f"starts with {name(user[0])}, which a user name cannot start with"
    raise Refused(f"{what} {why}", hint=f"give {what} a user name: {USER_RULE}, like p2pkit-engine")


# A service unit's name, as systemd accepts one (src/basic/unit-name.c: unit_name_is_valid, VALID_CHARS
# "0-9A-Za-z:-_.\\", one "@" before an instance, a suffix naming the type, at most 255 bytes); no "/", so the
# name is one file under /etc/systemd/system and never a path elsewhere; not "-" first (systemctl and Ansible
# put the name as a bare word after the verb, where "-H..." is an option), and an instance after "@" is not
# empty ("x@.service" is a template, which cannot be started).
SERVICE_NAME = re.compile(r"^[A-Za-z0-9:_.\\][A-Za-z0-9:_.\\-]*(@[A-Za-z0-9:_.\\-]+)?\.service\Z")


def unit_name(what: str, unit: str) -> str:
    """A service's unit name (p2pkit-engine.service): SERVICE_NAME's, or refused naming what it holds."""
    unit = str(unit)
    if SERVICE_NAME.match(unit) and len(unit.encode()) <= 255:
        return unit
    bad = BREAKS.search(unit) or re.search(r"[^A-Za-z0-9:_.\\@-]", unit)
    why = (f"holds {name(bad.group())}, which a unit name cannot hold" if bad else
           "is longer than 255 bytes" if len(unit.encode()) > 255 else
           "starts with '-', which systemctl reads as an option" if unit.startswith("-") else
           "is not NAME.service (NAME@INSTANCE.service with an instance)")
    raise Refused(f"{what} {why} ({unit!r})",
                  hint=f"give {what} a service name: letters, digits, :_.-\\ and one @, ending in .service, "
                       "like p2pkit-engine.service")


def _unit_word(word: str) -> str:
    if UNIT_PLAIN.match(word):
        return word.replace("%", "%%")
    quoted = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{quoted}"'


def unit_exec(argv: list[str], what: str = "the command line") -> str:
    """A command line for a systemd Exec*= setting: each word quoted when it needs it."""
    words = [refuse_controls(what, str(a), "a systemd unit") for a in argv]
    if not words or not words[0] or words[0][0] in "@-:+!|":
        raise Refused(f"{what} starts with {words[0][:1] if words else ''!r} if anything, which systemd reads as "
                      "a prefix", hint="give the program as an absolute path")
    return " ".join(_unit_word(w) for w in words)


def ip_filter(listen_host: str, node_role: str, fabric_cidr: str = "") -> tuple[str, str]:
    """The engine unit's IPAddressDeny= and IPAddressAllow= ("" and "": no filter): loopback only, unless the
    API listens on every address or the engine spans nodes (its rendezvous and NCCL's bootstrap cross the
    fabric: the fabric's CIDR, or no filter when none is given)."""
    if listen_host in ("0.0.0.0", "::"):
        return "", ""
    if node_role != "single":
        return ("any", unit_value("the IP filter", f"localhost {fabric_cidr}")) if fabric_cidr else ("", "")
    return "any", "localhost"


# environment files ------------------------------------------------------------------------------

def env_line(name_: str, value: str, what: str = "") -> str:
    what = what or name_
    if not ENV_NAME.match(str(name_)):
        raise Refused(f"{what}: {name_!r} is not an environment variable name",
                      hint="use letters, digits and _ (not starting with a digit)")
    value = refuse_controls(what, str(value), "an environment file")
    escaped = re.sub(r'([\\"$`])', r"\\\1", value)
    return f'{name_}="{escaped}"'


def env_file(env: dict, header: str = "", what: str = "") -> str:
    """A whole environment file: the header as comment lines, then one env_line per variable. `what`: the
    table the variables come from (an error names `what.NAME`)."""
    lines = [f"# {refuse_controls('the header', ln, 'a comment')}" for ln in _lines(header)]
    lines += [env_line(k, v, f"{what}.{k}" if what else k) for k, v in env.items()]
    return "\n".join(lines) + "\n"


def _lines(text: str) -> list[str]:
    out = text.split("\n")
    if out and out[-1] == "":
        out.pop()
    return out


# command-line words -----------------------------------------------------------------------------

def words(flags: dict) -> list[str]:
    """The flags as command-line words: `--name value`, a switch (true) bare, false or no value left out."""
    out = []
    for k, v in flags.items():
        if v is True:
            out.append(f"--{k}")
        elif v is False or v is None:
            continue
        else:
            out += [f"--{k}", str(v)]
    return out
