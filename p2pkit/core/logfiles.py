"""Log files p2pkit keeps (playbook logs, captured outputs): capped in size, rotated, redacted.

A runaway build log or a looping playbook never fills the disk: a log keeps its head and its tail
(CAP bytes in all) and the previous KEEP runs' logs as <name>.1 ... <name>.KEEP.
"""

from __future__ import annotations

import os
from pathlib import Path

from p2pkit.core import safefs
from p2pkit.core.secrets import redact

CAP = 8 << 20
KEEP = 3


def capped(text: str, cap: int = CAP) -> str:
    data = text.encode(errors="replace")
    if len(data) <= cap:
        return text
    head, tail = data[: cap // 8], data[-(cap - cap // 8):]
    cut = len(data) - len(head) - len(tail)
    return (head.decode(errors="replace") + f"\n[... p2pkit cut {cut} bytes of this log here ...]\n"
            + tail.decode(errors="replace"))


def rotate(path: Path, keep: int = KEEP) -> None:
    """path -> path.1 -> ... -> path.KEEP (the oldest dropped)."""
    path = Path(path)
    for i in range(keep, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        newer = path if i == 1 else path.with_name(f"{path.name}.{i - 1}")
        if newer.exists():
            os.replace(newer, older)


def write(path: Path, text: str, cap: int = CAP, keep: int = KEEP) -> Path:
    """This run's log at `path` (0640), the earlier ones rotated; capped and with secrets redacted."""
    path = Path(path)
    safefs.makedirs(path.parent)
    rotate(path, keep)
    fd = safefs.open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w") as fh:
        fh.write(capped(redact(text), cap))
    return path
