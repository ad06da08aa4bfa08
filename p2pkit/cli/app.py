"""The typer application: every command and the global options. `p2pkit.cli.main` answers
`--version` and the top-level `--help` without it and hands every other command line to run()."""

from __future__ import annotations

import errno
import importlib
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from p2pkit import __version__
from p2pkit.cli import common, failure
from p2pkit.cli.argv import COMMANDS, GLOBAL_VALUES, hoist_global_options, named_command
from p2pkit.core.errors import HostUnusable, P2pkitError, disk_full


def version_text(argv: list[str]) -> str:
    """What --version prints: the version, or under --json the one document every --json output is."""
    if "--json" in argv:
        import json

        return json.dumps({"kind": "p2pkit-version", "schema": 1, "version": __version__})
    return f"p2pkit {__version__}"


def _version(value: bool) -> None:
    if value:
        print(version_text(sys.argv[1:]))
        raise typer.Exit()


def _complete_profile(incomplete: str) -> list[str]:
    """The built-in profiles, then the TOML files in the current directory."""
    from p2pkit.core.config import builtin_names

    files = sorted(str(f) for f in Path().glob(f"{incomplete}*.toml"))
    return [n for n in builtin_names() if n.startswith(incomplete)] + files


def main_options(
    profile: Annotated[str | None, typer.Option("--profile", "-p", help="built-in profile name or a TOML file",
                                                envvar="P2PKIT_PROFILE", autocompletion=_complete_profile)] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", metavar="SECTION.KEY=VALUE",
                                                        help="override one profile key (repeatable), "
                                                        "like --set serve.flags.node-rank=1; `up` records "
                                                        "them: later commands on this host use them")] = None,
    unset: Annotated[list[str] | None, typer.Option("--unset", metavar="SECTION.KEY",
                                                    help="drop an override the host's state recorded (repeatable)")]
    = None,
    root: Annotated[Path, typer.Option("--root", help="host root: / or a simulated host directory",
                                       envvar="P2PKIT_ROOT")] = Path("/"),
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="artifacts directory "
                                                   "(default <root>/var/lib/p2pkit)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print only a JSON document on stdout")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask; act")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="log every command; show tracebacks")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True)] = False,
) -> None:
    common.OPTS.profile = profile
    common.OPTS.overrides = tuple(overrides or ())
    common.OPTS.unset = tuple(unset or ())
    # a relative path is the user's working directory's, resolved here once: every stage, unit and
    # playbook after this gets the absolute path (a relative --state-dir failed at the p2p-module stage)
    common.OPTS.root = common.absolute(root)
    common.OPTS.state_dir = common.absolute(state_dir) if state_dir is not None else None
    common.OPTS.json = json_out
    common.OPTS.yes = yes
    common.OPTS.debug = debug
    common.setup_logging(debug)
    common.refuse_unsafe_paths()
    common.refuse_repeated_sets(common.OPTS.overrides)


def build(only: str | None = None) -> typer.Typer:
    """The typer application with every command, or with the one named `only`."""
    app = typer.Typer(
        name="p2pkit",
        help="Bring a dual-GPU PCIe P2P host up, stage by stage, with a proof at every stage.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=True,
    )
    app.callback()(main_options)
    for word, module, attr in COMMANDS:
        if only in (None, word):
            obj = getattr(importlib.import_module(f"p2pkit.cli.{module}"), attr)
            if isinstance(obj, typer.Typer):
                app.add_typer(obj, name=word)
            else:
                app.command(word)(obj)
    return app


_terminated = failure.terminated


INTERRUPTED: list[int] = []


def _interrupted(signum, frame) -> None:
    """Ctrl-C: noted, then Python's own KeyboardInterrupt (cleanups in `finally` run as before). typer
    turns the KeyboardInterrupt into a silent exit 130; the note lets run() say what happened."""
    INTERRUPTED.append(signum)
    signal.default_int_handler(signum, frame)


_traceback, _internal, _fail = failure.traceback, failure.internal, failure.fail


GROUPS = {"sim", "serve", "net", "profile", "facts"}


def command_path(argv: list[str]) -> list[str]:
    """The command words of a hoisted command line: ["sim", "init"], ["status"]."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 + (argv[i] in GLOBAL_VALUES)
    words = [a for a in argv[i:i + 2] if not a.startswith("-")]
    return words[:2] if words and words[0] in GROUPS else words[:1]


def app(args: list[str], **kw):
    """Run the command line through typer (standalone_mode=False: the exit code is returned)."""
    return build(named_command(args))(args=args, **kw)


def _usage_error(e: Exception) -> bool:
    """An error the CLI framework raised for a bad command line (click's UsageError and kin, in
    whichever click typer runs on): it has an exit code and shows itself."""
    return hasattr(e, "exit_code") and hasattr(e, "show") and hasattr(e, "format_message")


def run() -> None:
    from p2pkit.core import output

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminated)
    INTERRUPTED.clear()
    signal.signal(signal.SIGINT, _interrupted)
    argv = hoist_global_options(sys.argv[1:])
    output.COMMAND[:] = command_path(argv)
    try:
        rc = app(args=argv, prog_name="p2pkit", standalone_mode=False)
    except P2pkitError as e:
        if common.OPTS.debug:
            _traceback()
        on_this_host = output.COMMAND in (["up"], ["status"]) and not any(
            a in ("--inventory", "-i") or a.startswith("--inventory=") for a in argv)
        hint = common.with_sim_hint(e.hint) if on_this_host else e.hint
        _fail(e.code, e.message, hint)
    except HostUnusable as e:  # the host's own commands cannot run: its message and fix, whole, once
        if common.OPTS.debug:
            _traceback()
        _fail(e.code, e.message, e.hint)
    except KeyboardInterrupt:
        _fail(130, "interrupted", "run the same command again: p2pkit resumes where it stopped")
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            _internal(e)
        full = disk_full(e.filename or "a file under the state directory", e)  # wherever it was not caught
        _fail(full.code, full.message, full.hint)
    except Exception as e:
        if _usage_error(e):  # an unknown command or option, a bad choice: typer's message, exit 2
            e.show()
            if "--json" in argv:
                common.OPTS.json = True
                common.output().error_document(e.exit_code, e.format_message(), "see `p2pkit --help`")
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":  # the framework's Ctrl-C at a prompt
            _fail(130, "interrupted", "run the same command again: p2pkit resumes where it stopped")
        _internal(e)
    if INTERRUPTED and rc == 130:  # typer caught the KeyboardInterrupt and returned 130 without a word
        # (a command that ends on Ctrl-C by design, `logs --follow`, catches it and exits 0: not this)
        _fail(130, "interrupted", "run the same command again: p2pkit resumes where it stopped")
    sys.exit(rc if isinstance(rc, int) else 0)
