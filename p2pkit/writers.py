"""One writer per file format that root reads later: each escapes what it can and refuses what it
cannot write safely, naming the value and the character. Nothing is pasted into such a file by
string formatting anywhere else (DESIGN: "Seams that keep it simple").
"""

from __future__ import annotations

import shlex

from p2pkit.errors import UsageError


class UnsafeValue(UsageError):
    """A value that cannot be written into the target format without changing its meaning."""


def _refuse_controls(what: str, value: str, fmt: str) -> None:
    for ch in value:
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise UnsafeValue(f"{what} holds the control character {ch!r}, which cannot be written into {fmt}",
                              hint=f"remove the {ch!r} from {what}")


def unit_exec(argv: list[str], what: str = "the command line") -> str:
    """A command line for a systemd Exec*= setting: each word quoted; % and $ escaped for systemd."""
    for a in argv:
        _refuse_controls(what, str(a), "a systemd unit")
    return " ".join(shlex.quote(str(a)).replace("%", "%%").replace("$", "$$") for a in argv)
