"""Artifacts and state files that are not files (issue 48 item 4): every artifact and record p2pkit reads back
is opened as its own regular file of a record's size without waiting (O_NONBLOCK, then fstat): a FIFO, a
device, a directory or a file without end is stale with that reason (or, for a record no stage owns, exit 2
naming it), never a hang, never a read without end, never exit 70. Each command runs in its own process
with a timeout, so a hang fails the test instead of stopping the session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_sim

MAIN = "import sys; from p2pkit.cli.main import main; sys.argv[0] = 'p2pkit'; sys.exit(main())"


def p2pkit(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", MAIN, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "1000"})


@pytest.fixture(scope="module")
def preflight_done(tmp_path_factory) -> Path:
    """A simulated host brought up to preflight, copied by each test (one `up` for the module)."""
    root = make_sim(tmp_path_factory.mktemp("records") / "host")
    r = p2pkit("--root", str(root), "--yes", "up", "--to", "preflight")
    assert r.returncode == 0, r.stderr
    return root


def _copy(src: Path, dest: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    return dest


def _plant(path: Path, kind: str) -> str:
    """Replace path with a FIFO, a link to /dev/zero, a directory or a file larger than any record; what
    status must name."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO"
    if kind == "zero":
        path.symlink_to("/dev/zero")
        return "a symbolic link (to /dev/zero)"
    if kind == "directory":
        path.mkdir()
        (path / "x").write_text("not p2pkit's\n")
        return "a directory"
    with open(path, "wb") as fh:
        fh.truncate((16 << 20) + 1)
    return "larger than the 16777216 bytes a record of p2pkit's may be"


@pytest.mark.parametrize("kind", ["fifo", "zero", "directory", "huge"])
def test_an_artifact_that_is_not_a_file_is_stale_with_the_reason_and_up_redoes_or_refuses(preflight_done, tmp_path,
                                                                                         kind):
    """The issue: preflight.json as a FIFO hung status and up (killed at 60 and 120 s), as a link to /dev/zero
    up grew to 7 GB in 15 s, as a directory `up --to preflight` exited 70 (IsADirectoryError)."""
    root = _copy(preflight_done, tmp_path / "host")
    art = root / "var/lib/p2pkit/preflight.json"
    said = _plant(art, kind)
    r = p2pkit("--root", str(root), "--json", "status", timeout=60)
    assert r.returncode in (0, 1) and r.returncode != 70, r.stderr
    pre = next(s for s in json.loads(r.stdout)["stages"] if s["stage"] == "preflight")
    assert pre["state"] == "stale" and said in pre["reason"] and str(art) in pre["reason"], pre
    r = p2pkit("--root", str(root), "--yes", "up", "--to", "preflight", timeout=120)
    if kind == "directory":  # not p2pkit's to remove: named, with the fix, nothing else done
        assert r.returncode == 2 and f"{art} is a directory" in r.stderr and f"rm -r {art}" in r.stderr, r.stderr
        assert (art / "x").read_text() == "not p2pkit's\n"
    else:  # the stage redone: its artifact a plain file again, the link's target untouched
        assert r.returncode == 0, r.stderr[-2000:]
        assert art.is_file() and not art.is_symlink() and json.loads(art.read_text())["stage"] == "preflight"


def test_a_run_marker_that_is_a_fifo_is_never_waited_on(preflight_done, tmp_path):
    root = _copy(preflight_done, tmp_path / "host")
    os.mkfifo(root / "var/lib/p2pkit/running.json")
    r = p2pkit("--root", str(root), "status", timeout=60)
    assert r.returncode in (0, 1), r.stderr
    r = p2pkit("--root", str(root), "--yes", "up", "--to", "preflight", timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_recorded_profile_that_is_not_a_file_is_refused_naming_it(preflight_done, tmp_path, kind):
    root = _copy(preflight_done, tmp_path / "host")
    rec = root / "var/lib/p2pkit/profile.json"
    said = _plant(rec, kind)
    r = p2pkit("--root", str(root), "status", timeout=60)
    assert r.returncode == 2 and f"{rec} is " in r.stderr and said in r.stderr and "Traceback" not in r.stderr, \
        r.stderr
