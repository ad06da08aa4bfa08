"""The command line as p2pkit reads it before the CLI framework does: which command it names, and
the global options moved in front (they may stand after the command too). Imports nothing, so the
entry point (p2pkit.cli.main) can use it before typer is loaded."""

from __future__ import annotations

# Every command: its word, then the module and attribute that define it (a function, or a typer
# group), in the order the help lists them. A command line that names one of them builds an
# application with that one alone (p2pkit.cli.app.build): typer reads one command's signature and
# imports one module, not all sixteen (issue 20); the help, completion and a typo get every command.
COMMANDS = (
    ("up", "stages_cmd", "up"), ("plan", "stages_cmd", "plan"), ("status", "stages_cmd", "status"),
    ("verify", "stages_cmd", "verify"), ("doctor", "stages_cmd", "doctor"), ("restore", "stages_cmd", "restore"),
    ("rollback", "stages_cmd", "rollback"), ("logs", "stages_cmd", "logs"), ("facts", "stages_cmd", "facts_app"),
    ("report", "report_cmd", "report"), ("pin", "pin_cmd", "pin"), ("bench", "bench_cmd", "bench"),
    ("profile", "profile_cmd", "app"), ("sim", "sim_cmd", "app"), ("serve", "serve_cmd", "app"),
    ("net", "net_cmd", "app"),
)


GLOBAL_FLAGS = {"--json", "--yes", "-y", "--debug"}
GLOBAL_VALUES = {"--profile", "-p", "--set", "--unset", "--root", "--state-dir"}


def hoist_global_options(argv: list[str]) -> list[str]:
    """Let global options stand after the command too (`p2pkit doctor --json`): move them first."""
    front, rest, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest += argv[i:]
            break
        name = a.split("=", 1)[0]
        if a in GLOBAL_FLAGS or (name in GLOBAL_VALUES and "=" in a):
            front.append(a)
        elif a in GLOBAL_VALUES and i + 1 < len(argv):
            front += [a, argv[i + 1]]
            i += 1
        else:
            rest.append(a)
        i += 1
    return front + rest


def named_command(argv: list[str]) -> str | None:
    """The command a hoisted command line runs, when only global options stand before it (where
    anything else does, `--help`, `--show-completion`, a typo, typer gets every command)."""
    i = 0
    while i < len(argv) and (argv[i] in GLOBAL_FLAGS or argv[i] in GLOBAL_VALUES
                             or argv[i].split("=", 1)[0] in GLOBAL_VALUES):
        i += 1 + (argv[i] in GLOBAL_VALUES)
    word = argv[i] if i < len(argv) else None
    return word if any(word == w for w, _, _ in COMMANDS) else None


def option_value(argv: list[str], name: str) -> str | None:
    """The last value of a global option in a hoisted command line (`--root X` or `--root=X`)."""
    value, i = None, 0
    while i < len(argv):
        if argv[i] == name and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        elif argv[i].startswith(name + "="):
            value = argv[i].split("=", 1)[1]
        i += 1
    return value
