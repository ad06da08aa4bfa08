"""What an operator still tripped on (issue 41, items 13, 16 and 17), each from the operator's side: the
command as typed, the output as read, the exit code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import make_sim


@pytest.mark.slow
def test_status_as_a_user_that_is_not_root_says_so_and_exits_2(cli):
    """`status` run by a user who may not run one of the host's commands (here a stand-in whose #! names an
    interpreter in a directory only root may enter; on a real host a tool with a root-only mode): no raw
    PermissionError, the stage it could not re-check says so, an error names the fix, exit 2 (as `up`
    refuses a user that is not root)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv (util-linux) to run p2pkit as another user")
    top = Path(tempfile.mkdtemp(prefix="p2pkit-not-root-"))
    try:
        top.chmod(0o755)
        root = make_sim(top / "host")
        assert cli("--root", str(root), "up", "--reboot", "--to", "p2p-module").code == 0
        private = top / "root-only"
        private.mkdir(mode=0o700)
        (private / "python").symlink_to(sys.executable)
        modinfo = root / "usr/bin/modinfo"
        modinfo.write_text(f"#!{private}/python -S\n" + modinfo.read_text().split("\n", 1)[1])
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                            "p2pkit", "--root", str(root), "status"], capture_output=True, text=True, cwd=top,
                           env={**os.environ, "HOME": str(top), "COLUMNS": "300"})
        said = r.stdout + r.stderr
        assert r.returncode == 2, said
        assert "PermissionError" not in said and "Errno" not in said and "Traceback" not in said, said
        row = next(ln for ln in r.stdout.splitlines() if ln.startswith("p2p-module"))
        assert "could not re-check: p2pkit may not run" in row and f"{modinfo}" in row, row
        assert "status could not re-check every stage: p2pkit runs as uid 65534" in r.stderr, r.stderr
        assert f"fix: run it as root: `sudo p2pkit --root {root} status`" in r.stderr, r.stderr
        s = cli("--root", str(root), "status")  # root may run it: every stage it reached is done
        assert "could not re-check" not in s.out and "p2p-module  done" in s.out, s.out
    finally:
        shutil.rmtree(top, ignore_errors=True)
