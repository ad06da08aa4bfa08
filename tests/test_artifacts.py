"""The artifact store: atomic writes, corrupt artifacts refused, the lock."""

import json
import multiprocessing as mp
import os

import pytest

from p2pkit.core.artifacts import CorruptArtifact, Store, atomic_write
from p2pkit.core.errors import LockedError, P2pkitError
from p2pkit.core.lock import state_lock


def test_write_read_digest(tmp_path):
    s = Store(tmp_path / "state")
    s.write("preflight", {"schema": 1, "stage": "preflight", "status": "passed"})
    assert s.read("preflight")["status"] == "passed"
    d1 = s.digest("preflight")
    s.write("preflight", {"schema": 1, "stage": "preflight", "status": "failed"})
    assert s.digest("preflight") != d1
    assert s.leftovers() == []


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "a.json"
    target.write_text("old")
    import os

    def boom(*a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(P2pkitError) as e:  # the OSError, named with its path: never a traceback
        atomic_write(target, b"new")
    assert f"cannot write {target}: disk full" == e.value.message
    assert target.read_text() == "old"
    assert list(tmp_path.glob(".*.tmp")) == []


@pytest.mark.parametrize("body", ["{not json", json.dumps({"schema": 99, "stage": "preflight"}),
                                  json.dumps({"schema": 1, "stage": "driver"})])
def test_corrupt_artifact_is_refused_with_a_fix(tmp_path, body):
    s = Store(tmp_path)
    s.path("preflight").write_text(body)
    with pytest.raises(CorruptArtifact) as e:
        s.read("preflight")
    assert "--from preflight --force" in e.value.hint


def _hold(path, ready, release):
    with state_lock(path):
        ready.set()
        release.wait(300)  # released by the test: an event, not a window


def test_lock_refuses_a_second_holder(tmp_path):
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path, ready, release))
    p.start()
    try:
        assert ready.wait(300)
        with pytest.raises(LockedError) as e, state_lock(tmp_path):
            pass
        assert f"pid {p.pid}" in e.value.message
    finally:
        release.set()
        p.join()
    with state_lock(tmp_path):  # released with its holder
        pass


def test_a_stage_not_built_fails_and_never_passes(tmp_path, sim):
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages import Stage

    ctx = pipeline.Ctx(profile=config.load(None), host=Host.at(sim("healthy")), store=Store(tmp_path / "s"),
                       out=Output())
    doc = pipeline.run_stage(ctx, Stage("future", "a stage not built yet", inputs=(), implemented=False), None)
    assert doc["status"] == "failed"
    assert doc["checks"][0]["measured"] == "not implemented yet" and doc["acted"] == {}


def test_unwritable_path_is_a_usage_error_and_leaves_nothing(tmp_path):
    from p2pkit.core.errors import Exit

    missing = tmp_path / "no/such/dir/x.json"
    with pytest.raises(P2pkitError) as e:
        atomic_write(missing, b"{}")
    assert e.value.code == Exit.USAGE and str(missing) in e.value.message and "writable" in e.value.hint
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root writes anyway: nothing to prove here
            return
        with pytest.raises(P2pkitError):
            atomic_write(ro / "x.json", b"{}")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)
