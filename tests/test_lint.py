"""ruff over the whole tree (ansible-lint runs in test_playbooks)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def test_ruff():
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff not installed (pip install 'p2pkit[test]')")
    r = subprocess.run([str(ruff), "check", "p2pkit", "tests", "bench"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
