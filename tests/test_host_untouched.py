"""The suite's own guard of the machine it runs on (tests/host_untouched.py, run by conftest.py at the
session's start and end): it sees a path made, changed or removed in the places it watches."""

from __future__ import annotations

import os

import host_untouched


def test_the_guard_sees_a_file_made_changed_and_removed(tmp_path):
    places = (str(tmp_path / "var/lib/p2pkit"), str(tmp_path / "var/lib/p2pkit/**"), str(tmp_path / "etc/**/*p2pkit*"))
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    (tmp_path / "etc/systemd/system/other.service").write_text("x")  # not p2pkit's: not watched
    keep = tmp_path / "etc/systemd/system/p2pkit.slice"
    keep.write_text("a")
    gone = tmp_path / "etc/modprobe.d/p2pkit-nvidia.conf"
    gone.parent.mkdir(parents=True)
    gone.write_text("b")
    before = host_untouched.snapshot(places)
    assert host_untouched.changes(before, host_untouched.snapshot(places)) == []
    assert str(tmp_path / "etc/systemd/system/other.service") not in before

    (tmp_path / "var/lib/p2pkit/logs").mkdir(parents=True)
    keep.write_text("ab")
    os.utime(keep, ns=(1, 1))
    gone.unlink()
    assert host_untouched.changes(before, host_untouched.snapshot(places)) == [
        f"made: {tmp_path}/var/lib/p2pkit", f"made: {tmp_path}/var/lib/p2pkit/logs",
        f"removed: {gone}", f"changed: {keep}"]


def test_the_places_it_watches_are_where_p2pkit_writes_on_a_real_host(tmp_path):
    """The state directory, the host lock and the service stage's files, laid out under a directory of the
    test's own: the guard's places, taken under that directory, find each of them."""
    from p2pkit.core.lock import HOST_LOCK
    from p2pkit.host import system

    paths = ["/var/lib/p2pkit/preflight.json", f"/{HOST_LOCK}", *system.ENGINE_FILES]
    for p in paths:
        (tmp_path / p.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p.lstrip("/")).write_text("x")
    found = host_untouched.snapshot(tuple(f"{tmp_path}{place}" for place in host_untouched.PLACES))
    assert [p for p in paths if f"{tmp_path}{p}" not in found] == []
