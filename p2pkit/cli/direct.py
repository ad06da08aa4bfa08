"""`p2pkit doctor` (and `p2pkit doctor --json`) without the CLI framework: issue 38's aim is doctor within 1.5x
`nvidia-smi -q`, and typer with rich is a third of doctor's time on the H200 (0.09 and 0.09 CPU-s of imports
against nvidia-smi's 0.12 s). The command line is read here only when it holds the global options and the
word `doctor`, nothing else (no --facts, --from-paste, --help or --debug: those go to typer); it then runs
what the typer command runs (p2pkit.cli.stages_cmd.doctor's host branch) with the same global options, the
same environment variables (P2PKIT_PROFILE, P2PKIT_ROOT), the same refusals and the same failure output and
exit codes (p2pkit.cli.failure). Imports nothing until it takes the command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from p2pkit.cli.argv import GLOBAL_FLAGS, GLOBAL_VALUES, named_command

VALUE_NAMES = {"-p": "--profile"}


def parse(argv: list[str]) -> dict | None:
    """The global options of a hoisted `[globals] doctor` command line, as typer would read them; None when it
    holds anything else (typer then reads it, and says what is wrong with it)."""
    if named_command(argv) != "doctor" or argv[-1:] != ["doctor"]:
        return None
    got: dict = {"--set": [], "--unset": []}
    i = 0
    while i < len(argv) - 1:
        a = argv[i]
        name, eq, value = a.partition("=")
        name = VALUE_NAMES.get(name, name)
        if a in GLOBAL_FLAGS:
            if a == "--debug":
                return None
            got[{"-y": "--yes"}.get(a, a)] = True
            i += 1
            continue
        if name not in GLOBAL_VALUES and a not in GLOBAL_VALUES:
            return None
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) - 1 else None
            i += 1
        if not value:  # an option without its value, or an empty one: typer's own message
            return None
        if name in ("--set", "--unset"):
            got[name].append(value)
        else:
            got[name] = value
        i += 1
    return got


def doctor(argv: list[str]) -> bool:
    """Run `p2pkit doctor` here when the command line is one this module takes (it exits); False otherwise."""
    opts = parse(argv)
    if opts is None:
        return False
    from p2pkit.cli import failure

    failure.on_signals()
    try:
        code = run(opts)
    except BaseException as e:  # every failure ends as on typer's path
        failure.handle(e)
        raise
    sys.exit(code)


def run(opts: dict) -> int:
    from p2pkit.app import doctor as doctor_mod
    from p2pkit.cli import common
    from p2pkit.core import output
    from p2pkit.core.errors import Exit

    output.COMMAND[:] = ["doctor"]
    o = common.OPTS
    o.profile = opts.get("--profile") or os.environ.get("P2PKIT_PROFILE") or None
    o.overrides, o.unset = tuple(opts["--set"]), tuple(opts["--unset"])
    o.root = Path(opts.get("--root") or os.environ.get("P2PKIT_ROOT") or "/")
    o.state_dir = Path(opts["--state-dir"]) if opts.get("--state-dir") else None
    o.json, o.yes, o.debug = bool(opts.get("--json")), bool(opts.get("--yes")), False
    common.setup_logging(False)
    common.refuse_unsafe_paths()
    report = doctor_mod.run(common.context())
    out = common.output()
    out.simulated = report["simulated"]
    if o.json:
        out.document(report)
    else:
        doctor_mod.render(out, report)
    return int(Exit.CHECK_FAILED if report["failed"] or report["unanswered"] else Exit.OK)
