"""Re-proof by content where content decides (issue 48 item 3): the driver's installed files by the sha256
recorded at the install (the GSP firmware and nvidia-smi edited with their mtime kept were trusted); a
p2pkit-written model or engine binary that no longer matches its recorded digest is moved aside (named,
kept) and made again, whatever the mtimes say (a model edited by a byte stopped `up` at "p2pkit never
overwrites a model"; an engine binary edited with its mtime kept: Ninja rebuilt nothing)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2pkit.sim import lifecycle
from tests.conftest import make_sim

MAIN = "import sys; from p2pkit.cli.main import main; sys.argv[0] = 'p2pkit'; sys.exit(main())"


def p2pkit(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", MAIN, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "1000"})


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def edit_keeping_mtime(p: Path, how: str = "byte") -> bytes:
    """One byte changed (or the file cut short), its mtime set back: what only the content tells."""
    before = p.read_bytes()
    st = p.stat()
    data = before[: len(before) // 2] if how == "truncate" else before[:-1] + bytes([before[-1] ^ 0x01])
    with open(p, "r+b") as fh:
        fh.write(data)
        fh.truncate(len(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    return before


@pytest.fixture(scope="module")
def done_host(tmp_path_factory) -> Path:
    root = make_sim(tmp_path_factory.mktemp("content") / "host")
    r = p2pkit("--root", str(root), "up", "--reboot")
    assert r.returncode == 0, r.stderr[-3000:]
    yield root
    lifecycle.stop_services(root)


def state_of(root: Path, stage: str) -> tuple[str, str]:
    r = p2pkit("--root", str(root), "--json", "status", timeout=120)
    s = next(s for s in json.loads(r.stdout)["stages"] if s["stage"] == stage)
    return s["state"], s["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("rel", ["lib/firmware/nvidia/615.71.09/gsp_ga10x.bin", "usr/bin/nvidia-smi"])
def test_an_installed_driver_file_edited_with_its_mtime_kept_is_stale_and_reinstalled(done_host, rel):
    p = done_host / rel
    before = edit_keeping_mtime(p)
    state, why = state_of(done_host, "driver")
    assert state == "stale" and f"{p.relative_to(done_host).as_posix()} changed since the stage proved it" in why, why
    r = p2pkit("--root", str(done_host), "up")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"/{rel} changed" in r.stderr and "the installer runs again" in r.stderr, r.stderr[-3000:]
    assert p.read_bytes() == before


@pytest.mark.slow
@pytest.mark.parametrize("how", ["byte", "truncate"])
def test_a_model_p2pkit_converted_that_changed_is_moved_aside_and_converted_again(done_host, how):
    out = done_host / "srv/models/qwen38-27b-nvfp4-dflash2.ninfer"
    edit_keeping_mtime(out, how)
    bad = digest(out)
    assert state_of(done_host, "model")[0] == "stale"
    r = p2pkit("--root", str(done_host), "up")
    assert r.returncode == 0, r.stderr[-3000:]
    aside = [x for x in out.parent.iterdir() if x.name.startswith(f"{out.name}.changed-")]
    assert aside and digest(aside[-1]) == bad and f"moved aside to {aside[-1]} (kept)" in r.stderr, r.stderr[-3000:]
    rec = json.loads((done_host / "var/lib/p2pkit/model-output.json").read_text())
    assert digest(out) == rec["sha256"] and digest(out) != bad  # converted again, as recorded
    for x in aside:
        x.unlink()


@pytest.mark.slow
def test_an_engine_binary_edited_with_its_mtime_kept_is_moved_aside_and_built_again(done_host):
    doc = json.loads((done_host / "var/lib/p2pkit/engine.json").read_text())
    exe = Path(doc["facts"]["engine_build"]["binary"]["path"])
    good = digest(exe)
    edit_keeping_mtime(exe)
    r = p2pkit("--root", str(done_host), "up")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{exe} no longer matches the sha256 of the last build" in r.stderr, r.stderr[-3000:]
    assert digest(exe) == good
