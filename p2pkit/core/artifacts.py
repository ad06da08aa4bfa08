"""The artifact store: one JSON document per stage, written atomically, chained by digest.

A stage deletes its own artifact before it acts and writes it last, so a crash never leaves a
stale "passed". Each artifact carries the sha256 of the previous stage's artifact file: a
changed or re-run earlier stage breaks the chain and makes the later ones stale.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from p2pkit.core import safefs, writers
from p2pkit.core.errors import P2pkitError, UsageError, disk_full, immutable_hint, state_dir_unwritable
from p2pkit.core.secrets import redact_doc

SCHEMA = 1


class CorruptArtifact(P2pkitError):
    pass


def atomic_write(final: Path, data: bytes, mode: int = 0o644, under: Path | None = None) -> Path:
    """temp file in the same directory, fsync, rename, fsync the directory: all or nothing. A path
    that cannot be written is a UsageError naming it, never a traceback. The file has `mode` from
    its first byte (a 0600 file is never readable by others, not even for a moment). A link at
    `final` is replaced, never followed; a link on the way below the state directory is refused
    (core.safefs; `under`: a directory to walk from instead, the host's root for a host's path)."""
    try:
        return safefs.atomic_write(Path(final), data, mode, under)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full(final, e) from e
        raise UsageError(f"cannot write {final}: {e.strerror or e}", hint=unwritable_hint(Path(final).parent, e)) from e


def unwritable_hint(d: Path, e: OSError) -> str:
    if e.errno == errno.EPERM and os.geteuid() == 0:  # what root gets from an immutable (chattr +i) directory
        return immutable_hint(d)
    return f"check that {d} exists and is writable, and that its disk is not full; nothing was written there"


def read_json(path: Path, what: str, fix: str) -> Any:
    """A JSON file p2pkit wrote earlier, read defensively: missing is None; unreadable, not UTF-8 or
    not JSON is a CorruptArtifact naming the file and the fix (never a traceback)."""
    try:
        return json.loads(safefs.read_bytes(path).decode("utf-8"))
    except FileNotFoundError:
        return None
    except safefs.LinkRefused as e:  # a link, a FIFO, a device, a directory, a file without end (issue 48 item 4)
        raise CorruptArtifact(f"{what}: {e.message}", hint=fix) from e
    except (OSError, ValueError) as e:
        raise CorruptArtifact(f"{what} {path} cannot be read: {e}", hint=fix) from e


def self_digest(doc: dict[str, Any]) -> str:
    """sha256 of the document without its "digest" key, in canonical JSON."""
    import hashlib  # here: doctor writes no artifact, and hashlib loads OpenSSL (issue 38 item 9)

    body = {k: v for k, v in doc.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Store:
    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir)
        safefs.own(self.dir)  # nothing below it is written through a link

    def ensure(self) -> None:
        try:
            safefs.makedirs(self.dir)  # never through a link at it or on the way (issue 48 item 1)
        except OSError as e:
            raise state_dir_unwritable(self.dir, e) from e

    def path(self, stage: str) -> Path:
        return self.dir / f"{stage}.json"

    def exists(self, stage: str) -> bool:
        return safefs.is_file(self.path(stage))  # a link there is not p2pkit's artifact

    def digest(self, stage: str) -> str | None:
        import hashlib

        try:
            return hashlib.sha256(safefs.read_bytes(self.path(stage))).hexdigest()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, safefs.LinkRefused):
            return "unreadable"  # what no chain holds: the stage after it is stale, never an error here

    def read(self, stage: str) -> dict[str, Any] | None:
        """The stage's artifact, or None where there is none. Read only as p2pkit's own regular file of a
        record's size without waiting (issue 48 item 4): a link, a FIFO, a device, a directory or a file
        without end is a CorruptArtifact that says what is there (the stage is stale with that reason, and
        `up` redoes it), never a hang, a read without end or an internal error."""
        p = self.path(stage)
        try:
            doc = json.loads(safefs.read_bytes(p).decode("utf-8"))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except safefs.LinkRefused as e:
            raise CorruptArtifact(f"artifact {e.message}",
                                  hint=f"run `p2pkit up --from {stage} --force` to redo that stage (it replaces "
                                       "what is there; a directory you remove first)") from e
        except (OSError, ValueError) as e:
            raise CorruptArtifact(f"artifact {p} cannot be read: {e}",
                                  hint=f"run `p2pkit up --from {stage} --force` to redo that stage") from e
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("stage") != stage:
            raise CorruptArtifact(f"artifact {p} is not a p2pkit schema {SCHEMA} artifact for {stage}",
                                  hint=f"run `p2pkit up --from {stage} --force` to redo that stage")
        if doc.get("digest") != self_digest(doc):
            raise CorruptArtifact(f"artifact {p} was edited after p2pkit wrote it: the digest it carries "
                                  f"{'is missing' if 'digest' not in doc else 'does not match its content'}",
                                  hint=f"run `p2pkit up --from {stage} --force` to prove that stage again")
        return doc

    def delete(self, stage: str) -> None:
        """The artifact removed (a link or a FIFO there is removed as a name, nothing behind it touched); a
        directory there is not p2pkit's to remove: a UsageError (exit 2) naming it and the fix."""
        p = self.path(stage)
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except IsADirectoryError as e:
            raise UsageError(f"the artifact {p} is a directory: p2pkit keeps a stage's artifact as one file and "
                             "removes no directory it did not make, so nothing was done",
                             hint=f"remove it (`rm -r {p}`) and run the same command again") from e

    def write(self, stage: str, doc: dict[str, Any]) -> Path:
        """The artifact with its own digest inside (an edit is seen by whoever reads it, the last
        stage's too: no later artifact's chain is needed for that)."""
        self.ensure()
        plain = redact_doc(json.loads(writers.json_text(doc)))  # no NaN, no secret
        plain.pop("digest", None)
        plain["digest"] = self_digest(plain)
        return atomic_write(self.path(stage), writers.json_text(plain).encode())

    def leftovers(self) -> list[Path]:
        """Temp files a killed run left behind (never read as artifacts)."""
        return sorted(self.dir.glob(".*.tmp")) if self.dir.is_dir() else []
