"""Issue 29, item 2: with Secure Boot on, the p2p-module stage signs the modules it builds with a
machine owner key it makes (0600), queues the key's enrolment with mokutil, and proves after the
simulated reboot (MokManager enrols the queued key) that the loaded module's signer is that key."""

import json
import stat

import pytest

from p2pkit.artifacts import Store

pytestmark = pytest.mark.slow


def _state(root):
    return json.loads((root / ".p2pkit-sim/state.json").read_text())


def test_secure_boot_on_signs_enrols_and_proves_after_the_reboot(cli, sim, monkeypatch):
    monkeypatch.setenv("P2PKIT_MOK_PASSWORD", "one-time-pw")
    root = sim("secure-boot-on")
    r = cli("--root", str(root), "up", "--reboot", "--to", "p2p-module")
    assert r.code == 0, r.err
    assert "MokManager" in r.err and "Enroll MOK" in r.err  # said before the reboot
    key = root / "var/lib/p2pkit/mok/p2pkit-mok.priv"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    s = _state(root)
    assert s["boots"] == 2 and len(s["mok"]["enrolled"]) == 1 and s["mok"]["new"] == []
    assert s["module"]["loaded"] and s["module"]["load_error"] is None
    doc = Store(root / "var/lib/p2pkit").read("p2p-module")
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["p2p.secure_boot"]["status"] == "pass", checks["p2p.secure_boot"]
    assert checks["p2p.mok_enrolled"]["status"] == "pass" and ": enrolled" in checks["p2p.mok_enrolled"]["measured"]
    serial = s["mok"]["enrolled"][0]["serial"]
    for ko in (root / "lib/modules/6.8.0-88-generic/kernel/drivers/video").glob("nvidia*.ko"):
        assert f"sig_key={serial[:2]}:" in ko.read_text(), ko
