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

from p2pkit.cli import main as entry
from p2pkit.cli import top_help

EXE = str(Path(sys.executable).parent / "p2pkit")
HEAVY = ("typer", "click", "rich", "p2pkit.cli.app", "p2pkit.pipeline")


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
    from p2pkit import facts
    from p2pkit.host import Host
    from p2pkit.runner import Runner

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
