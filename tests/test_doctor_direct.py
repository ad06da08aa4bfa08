"""`p2pkit doctor` without the CLI framework (issue 38, 9: doctor within 1.5x `nvidia-smi -q`; typer and rich
were a third of its time on the H200): the same output, stderr and exit code as the typer application for
every command line it takes, typer for every other, and neither typer nor rich imported on its way.
The speed itself is measured by bench/bench_doctor.py, never asserted here."""

import subprocess
import sys

import pytest

from p2pkit.cli import direct

MAIN = "import sys; from p2pkit.cli.main import main; sys.argv = ['p2pkit', *sys.argv[1:]]; main()"
TYPER = "import sys; from p2pkit.cli.app import run; sys.argv = ['p2pkit', *sys.argv[1:]]; run()"
MODULES = ("import atexit, sys; atexit.register(lambda: print(sorted(m for m in ('typer', 'rich', 'click') "
           "if m in sys.modules), file=sys.stderr)); " + MAIN)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("direct") / "sim"
    r = subprocess.run([sys.executable, "-m", "p2pkit", "sim", "init", "-s", "stock-driver", str(root)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return root


def both(args: list[str], env=None):
    a = subprocess.run([sys.executable, "-c", MAIN, *args], capture_output=True, text=True, env=env, timeout=120)
    b = subprocess.run([sys.executable, "-c", TYPER, *args], capture_output=True, text=True, env=env, timeout=120)
    return a, b


@pytest.mark.parametrize("args", [
    ["--root", "{root}", "doctor", "--json"], ["--root={root}", "doctor"], ["--json", "--root", "{root}", "doctor"],
    ["--root", "{root}", "--set", "serve.flags.bogus=1", "-p", "dual-5090-llamacpp", "doctor", "--json"],
    ["--root", "{root}", "--profile", "no-such-profile", "doctor"], ["--root", "/nonexistent", "--json", "doctor"],
    ["--root", "{root}", "--state-dir", "/proc/version", "doctor", "--json"]])
def test_doctor_direct_says_what_typer_says(sim, args):
    args = [a.replace("{root}", str(sim)) for a in args]
    a, b = both(args)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    assert a.returncode in (0, 1, 2) and "Traceback" not in a.stderr


def test_the_environment_names_root_and_profile_as_for_typer(sim):
    import os

    env = {**os.environ, "P2PKIT_ROOT": str(sim), "P2PKIT_PROFILE": "dual-5090-llamacpp"}
    a, b = both(["doctor", "--json"], env)
    assert a.returncode == b.returncode and a.stdout == b.stdout and '"dual-5090-llamacpp"' in a.stdout


def test_doctor_imports_neither_typer_nor_rich(sim):
    r = subprocess.run([sys.executable, "-c", MODULES, "--root", str(sim), "doctor", "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.stderr.strip().splitlines()[-1] == "[]", r.stderr[-500:]
    # a command line it does not take goes to typer, as before
    r = subprocess.run([sys.executable, "-c", MODULES, "--root", str(sim), "doctor", "--facts", "/nonexistent"],
                       capture_output=True, text=True, timeout=120)
    assert "'typer'" in r.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("argv", [["doctor", "--facts", "f"], ["doctor", "--from-paste", "f"], ["doctor", "--help"],
                                  ["--debug", "doctor"], ["--root", "doctor"], ["--root=", "doctor"], ["status"],
                                  ["doctor", "extra"], ["--frobnicate", "doctor"], ["--set", "doctor"]])
def test_what_the_direct_path_leaves_to_typer(argv):
    assert direct.parse(argv) is None


def test_what_it_reads():
    got = direct.parse(["--json", "-y", "-p", "x", "--set", "a.b=1", "--set=c.d=2", "--unset", "e.f", "--root=/r",
                        "--state-dir", "/s", "doctor"])
    assert got == {"--json": True, "--yes": True, "--profile": "x", "--set": ["a.b=1", "c.d=2"], "--unset": ["e.f"],
                   "--root": "/r", "--state-dir": "/s"}
