"""`p2pkit`: the command-line entry point.

`p2pkit --version` and the top-level `p2pkit --help` are answered here without importing the CLI
framework (typer, click, rich) or the rest of p2pkit: a tenth of the start-up. The help is the text
typer renders, kept in top_help.txt (`python -m p2pkit.cli.top_help` writes it again; a test fails
when it drifts from typer's); it is printed only where typer would print exactly it: not on a
terminal (no colours), 80 columns, none of the variables that change typer's or rich's rendering.
`p2pkit doctor` with global options alone runs without it too (p2pkit.cli.direct: the same options,
output and exit codes). Everything else goes to the typer application (p2pkit.cli.app); all read the
command line with p2pkit.cli.argv (which imports nothing). `doctor` reads every fact of the host: its facts that
wait on a process or a library start here, before the CLI framework is imported, and run while it
is (facts.start_early).
"""

from __future__ import annotations

import os
import sys

from p2pkit.cli.argv import hoist_global_options, named_command, option_value

TOP_HELP = os.path.join(os.path.dirname(__file__), "top_help.txt")
TOP_HELP_WIDTH = 80
# set to anything, each of these can change what typer prints: colours, width, plain click help, completion
RENDERING_ENV = ("TERMINAL_WIDTH", "FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS", "_TYPER_FORCE_DISABLE_TERMINAL",
                 "TTY_COMPATIBLE", "TYPER_USE_RICH", "JUPYTER_COLUMNS", "_P2PKIT_COMPLETE")


def rendered_width() -> int:
    """The width rich lays the help out at: COLUMNS, else the first of stdin/stdout/stderr that is a
    terminal, else 80."""
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns)
    for fd in (0, 1, 2):
        try:
            return os.get_terminal_size(fd).columns or TOP_HELP_WIDTH
        except (OSError, ValueError):
            continue
    return TOP_HELP_WIDTH


def canned_help_applies() -> bool:
    """Whether typer would print top_help.txt byte for byte here."""
    if any(os.environ.get(k) for k in RENDERING_ENV):
        return False
    try:
        if sys.stdout.isatty():  # as rich asks
            return False
    except ValueError:  # closed
        return False
    if not (getattr(sys.stdout, "encoding", None) or "utf-8").lower().startswith("utf"):
        return False  # rich draws ASCII boxes then
    return rendered_width() == TOP_HELP_WIDTH


def main() -> None:
    args = sys.argv[1:]
    if args == ["--version"]:
        from p2pkit import __version__

        sys.stdout.write(f"p2pkit {__version__}\n")
        sys.exit(0)
    if args == ["--help"] and canned_help_applies():
        try:
            with open(TOP_HELP, encoding="utf-8") as fh:
                text = fh.read()
        except OSError:
            text = None
        if text:
            sys.stdout.write(text)
            sys.exit(0)
    argv = hoist_global_options(args)
    start_early_facts(argv)
    if named_command(argv) == "doctor":  # `p2pkit doctor [--json]` needs no CLI framework: run where it exits
        from p2pkit.cli import direct

        direct.doctor(argv)
    from p2pkit.cli.app import run

    run()


def start_early_facts(argv: list[str]) -> None:
    """For `doctor` on the host it runs on: start the facts that wait (nvidia-smi, NVML, modinfo,
    dpkg-query) now, so their wait overlaps the import of the CLI framework and the checks; doctor's
    collect() takes their results. Not with --facts or --from-paste (nothing is read), --help, or --debug
    (which logs every command after the logging is set up)."""
    skip = {"--facts", "--from-paste", "--help", "--debug"}
    if named_command(argv) != "doctor" or skip & {a.split("=", 1)[0] for a in argv}:
        return
    from p2pkit.facts import collect as facts
    from p2pkit.host import Host

    root = option_value(argv, "--root") or os.environ.get("P2PKIT_ROOT") or "/"
    if os.path.isdir(root):
        facts.start_early(Host.at(root))
