"""The top-level help as typer renders it where p2pkit.cli.main prints it without typer (80 columns,
not a terminal). `python -m p2pkit.cli.top_help` writes p2pkit/cli/top_help.txt again after a
command, an option or a help string changed; tests/test_startup.py fails until it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from p2pkit.cli.main import RENDERING_ENV, TOP_HELP, TOP_HELP_WIDTH


def render() -> str:
    """typer's own `p2pkit --help`, run in a fresh Python with none of the variables that change its
    rendering and no terminal on any standard stream."""
    env = {k: v for k, v in os.environ.items() if k not in RENDERING_ENV}
    env.update(COLUMNS=str(TOP_HELP_WIDTH), PYTHONIOENCODING="utf-8")
    r = subprocess.run([sys.executable, "-c", "from p2pkit.cli.app import run; run()", "--help"], env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, check=True)
    return r.stdout.decode()


def write() -> Path:
    path = Path(TOP_HELP)
    path.write_text(render(), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(f"wrote {write()}")
