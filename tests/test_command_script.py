"""The installed `p2pkit` command is scripts/p2pkit itself (pyproject.toml: the wheel's shared-scripts), not
pip's generated console script: that one imports `re` before p2pkit, which made `p2pkit --help` and
`--version` 1.6-1.8x a bare interpreter (issue 38). Measured by bench/bench_doctor.py (help_vs_python,
version_vs_python), never timed here."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts/p2pkit"


def imported(argv: list[str]) -> set[str]:
    r = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, check=False,
                       stdin=subprocess.DEVNULL)
    return {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", r.stderr, re.M)}


@pytest.mark.parametrize("arg", ["--version", "--help"])
def test_the_command_imports_what_python_does_and_p2pkits_entry_point_alone(arg):
    floor = imported(["-c", "pass"])
    extra = imported([str(SCRIPT), arg]) - floor
    assert "re" not in extra and not any(m.startswith(("typer", "rich", "click")) for m in extra), sorted(extra)
    assert extra <= {"p2pkit", "p2pkit.cli", "p2pkit.cli.main", "p2pkit.cli.argv", "__future__"}, sorted(extra)


def test_the_installed_command_is_the_script():
    installed = Path(sys.executable).parent / "p2pkit"
    body = installed.read_text().split("\n", 1)[1]  # pip rewrote the first line to this environment's Python
    assert body == SCRIPT.read_text().split("\n", 1)[1]
    r = subprocess.run([str(installed), "--version"], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout.startswith("p2pkit ")
