"""How a command that failed ends, the same on every path (the typer application, p2pkit.cli.app, and the
direct doctor, p2pkit.cli.direct): one paragraph and a fix on stderr, a p2pkit-error document under --json,
the error's exit code; a traceback only with --debug. Imports neither typer nor rich."""

from __future__ import annotations

import errno
import signal
import sys

from p2pkit.cli import common
from p2pkit.core import children
from p2pkit.core.errors import Exit, HostUnusable, P2pkitError, disk_full

AGAIN = "run the same command again: p2pkit resumes where it stopped"


def terminated(signum, _frame) -> None:
    """SIGTERM/SIGHUP: end the commands p2pkit runs with it, then exit like Ctrl-C does."""
    children.kill_all()
    raise SystemExit(128 + signum)


def on_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, terminated)


def traceback() -> None:
    import traceback as tb  # only with --debug: not every run pays its import

    tb.print_exc()


def internal(e: BaseException) -> None:
    """A bug: one paragraph, traceback only with --debug."""
    if common.OPTS.debug:
        traceback()
    fail(Exit.INTERNAL, f"internal error: {type(e).__name__}: {e}",
         "rerun with --debug for the traceback and report it")


def fail(code: int, message: str, hint: str) -> None:
    out = common.output()
    out.error(message, hint)
    out.error_document(code, message, hint)
    sys.exit(int(code))


def handle(e: BaseException) -> None:
    """A failure of a command run outside the CLI framework, ended as the typer path ends it (SystemExit, the
    command's own exit, passes)."""
    if isinstance(e, SystemExit):
        return
    if isinstance(e, P2pkitError | HostUnusable):  # HostUnusable: the host's own commands cannot run
        if common.OPTS.debug:
            traceback()
        fail(e.code, e.message, e.hint)
    if isinstance(e, KeyboardInterrupt):
        fail(130, "interrupted", AGAIN)
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        full = disk_full(e.filename or "a file under the state directory", e)
        fail(full.code, full.message, full.hint)
    internal(e)
