"""Start-up fast paths (issue 20): `--version` and the top-level `--help` answered without typer,
and the same answers typer gives."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2pkit.cli import argv as cli_argv
from p2pkit.cli import main as entry
from p2pkit.cli import top_help

EXE = str(Path(sys.executable).parent / "p2pkit")
HEAVY = ("typer", "click", "rich", "p2pkit.cli.app", "p2pkit.app.pipeline")


def plain_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in entry.RENDERING_ENV}
    return {**env, "COLUMNS": "80", **extra}


def entry_point(*args: str, env: dict | None = None) -> tuple[int, str, list[str]]:
    """The console script's main() in a fresh Python: exit code, stdout, and the heavy modules it imported."""
    code = ("import json, sys\nfrom p2pkit.cli.main import main\nsys.argv = ['p2pkit', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    rc = e.code\n"
            f"sys.stderr.write(json.dumps([m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r}]))")
    r = subprocess.run([sys.executable, "-c", code, *args], env=env or plain_env(), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, check=False)
    mods = json.loads(r.stderr.strip().splitlines()[-1])
    return r.returncode, r.stdout, mods


def test_version_is_the_package_version_without_the_cli():
    rc, out, mods = entry_point("--version")
    assert rc == 0 and out == f"p2pkit {importlib.metadata.version('p2pkit')}\n"
    assert mods == [], f"--version imported {mods}"
    r = subprocess.run([EXE, "--version"], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout == out


def test_fast_help_is_typers_help():
    typer_help = top_help.render()  # typer itself, 80 columns, no terminal
    canned = Path(entry.TOP_HELP).read_text(encoding="utf-8")
    assert canned == typer_help, "the top-level help changed: run `python -m p2pkit.cli.top_help` and commit it"
    rc, out, mods = entry_point("--help")
    assert rc == 0 and out == typer_help
    assert mods == [], f"--help imported {mods}"
    r = subprocess.run([EXE, "--help"], env=plain_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0 and r.stdout == typer_help


def test_help_that_typer_renders_differently_goes_to_typer():
    rc, out, mods = entry_point("--help", env=plain_env(COLUMNS="100"))  # another width: typer lays it out
    assert rc == 0 and "typer" in mods and "Usage: p2pkit [OPTIONS] COMMAND" in out
    assert max(len(ln) for ln in out.splitlines()) == 100
    rc, out, mods = entry_point("status", "--help")  # a command's help: typer's
    assert rc == 0 and "Usage: p2pkit status [OPTIONS]" in out and "typer" in mods
    rc, out, mods = entry_point("--json", "--help")
    assert rc == 0 and "typer" in mods


@pytest.mark.parametrize("env,tty,expect", [
    ({}, False, True),
    ({"FORCE_COLOR": "1"}, False, False),
    ({"TERMINAL_WIDTH": "80"}, False, False),
    ({"COLUMNS": "120"}, False, False),
    ({"TYPER_USE_RICH": "0"}, False, False),
    ({}, True, False),
])
def test_canned_help_only_where_typer_prints_it(monkeypatch, env, tty, expect):
    for k in entry.RENDERING_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    class Out(io.StringIO):
        encoding = "utf-8"

        def isatty(self):
            return tty
    monkeypatch.setattr(sys, "stdout", Out())
    assert entry.canned_help_applies() is expect


def test_uname_m_is_answered_in_process(sim, monkeypatch):
    """The arch fact starts no process: the simulated host's state on a simulated host (x86_64 and
    a Spark's aarch64, as its uname stand-in prints them), the kernel's own answer on a real one."""
    from p2pkit.core.runner import Runner
    from p2pkit.facts import collect as facts
    from p2pkit.host import Host

    def no_process(self, argv, **kw):
        raise AssertionError(f"started {argv}")
    monkeypatch.setattr(Runner, "run", no_process)
    assert facts.collect(Host.at(sim("healthy")), ["arch"]) == {"arch": "x86_64"}
    assert facts.collect(Host.at(sim("spark-head")), ["arch"]) == {"arch": "aarch64"}
    assert facts.collect(Host(), ["arch"]) == {"arch": os.uname().machine}
    monkeypatch.undo()
    spark = sim("spark-worker")
    r = subprocess.run([str(spark / "usr/bin/uname"), "-m"], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == Host.at(spark).machine() == "aarch64"


# ------------------------------------------------------------------ one command, not fifteen

CLI_MODULES = {f"p2pkit.cli.{m}" for _, m, _ in cli_argv.COMMANDS}


def imported_cli_modules(*args: str) -> tuple[int, set[str]]:
    code = ("import json, sys\nfrom p2pkit.cli.main import main\nsys.argv = ['p2pkit', *sys.argv[1:]]\n"
            "rc = 0\ntry:\n    main()\nexcept SystemExit as e:\n    rc = e.code\n"
            "sys.stderr.write('\\n' + json.dumps(sorted(m for m in sys.modules if m.startswith('p2pkit.cli.'))))\n"
            "sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, *args], env=plain_env(), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, check=False)
    return r.returncode, set(json.loads(r.stderr.strip().splitlines()[-1])) & CLI_MODULES


def test_a_named_command_builds_that_command_alone(tmp_path):
    """`p2pkit profile list` imports the module of `profile` only and typer reads one command; a
    command line typer must see whole (a typo, a top-level --help on a terminal) gets every command."""
    rc, mods = imported_cli_modules("profile", "list")
    assert rc == 0 and mods == {"p2pkit.cli.profile_cmd"}, mods
    rc, mods = imported_cli_modules("--json", "--root", str(tmp_path), "sim", "list")
    assert rc == 0 and mods == {"p2pkit.cli.sim_cmd"}, mods
    rc, mods = imported_cli_modules("profle", "list")  # a typo: typer's "No such command" with a suggestion
    assert rc == 2 and mods == CLI_MODULES, mods
    rc, mods = imported_cli_modules("--help", "status")
    assert rc == 0 and mods == CLI_MODULES, mods


def test_every_command_builds_alone_under_its_word():
    """The table of commands is right: each word builds an application whose one command is that word
    (a group with its own commands, or a command), and all of them together are the full application
    (the help's order is typer's: commands, then groups; test_fast_help_is_typers_help holds it)."""
    import typer.main

    from p2pkit.cli import app

    full = typer.main.get_command(app.build())
    assert sorted(full.commands) == sorted(w for w, _, _ in cli_argv.COMMANDS)
    for word, _, _ in cli_argv.COMMANDS:
        one = typer.main.get_command(app.build(word))
        assert list(one.commands) == [word]
        assert type(one.commands[word]) is type(full.commands[word])


@pytest.mark.parametrize("argv,word", [
    (["status"], "status"), (["--json", "--root", "/x", "doctor"], "doctor"), (["--root=/x", "up"], "up"),
    (["--set", "a.b=1", "sim", "init"], "sim"), (["--help", "status"], None), (["--show-completion"], None),
    (["stauts"], None), ([], None), (["--root"], None),
])
def test_named_command(argv, word):
    assert cli_argv.named_command(argv) == word


# ------------------------------------------------------------------ doctor's facts start early

def test_doctor_starts_its_waiting_facts_before_the_cli_and_collect_takes_them(sim, monkeypatch):
    """The facts started early are the ones collect() hands back (no second read), and they equal
    what a plain read gives; only doctor without --facts, --help or --debug starts them."""
    from p2pkit.core.runner import Runner
    from p2pkit.facts import collect as facts
    from p2pkit.host import Host

    root = sim("healthy")
    plain = facts.collect(Host.at(root), list(facts.WAITING), None)
    started: list[list[str]] = []
    real_run = Runner.run

    def recording(self, argv, **kw):
        started.append([str(a) for a in argv])
        return real_run(self, argv, **kw)
    monkeypatch.setattr(Runner, "run", recording)
    entry.start_early_facts(["--root", str(root), "doctor"])
    early_keys = {k for k in facts._EARLY if k[0] == str(root)}
    assert {n for _, n in early_keys} == {n for n in facts.WAITING if n in facts.COLLECTORS}
    for fut in [facts._EARLY[k] for k in early_keys]:
        fut.result(timeout=60)
    n_early = len(started)
    assert n_early >= 5, started  # nvidia-smi three times, modinfo, dpkg-query: begun before any collect()
    again = facts.collect(Host.at(root), list(facts.WAITING), None)
    assert len(started) == n_early, started[n_early:]  # nothing read twice
    assert again == plain
    assert not any(k[0] == str(root) for k in facts._EARLY)
    for argv in (["--root", str(root), "doctor", "--facts", "f.json"], ["--root", str(root), "doctor", "--help"],
                 ["--root", str(root), "doctor", "--from-paste", "p.txt"],
                 ["--debug", "--root", str(root), "doctor"], ["--root", str(root), "status"]):
        entry.start_early_facts(argv)
        # this host's only: another test in this worker may have left its own (a CLI process ends anyway)
        assert not any(k[0] == str(root) for k in facts._EARLY), argv
