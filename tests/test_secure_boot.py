"""Issue 29, item 2 (first step): with Secure Boot on, p2pkit says plainly that nothing signs the
modules; p2p_module.signing_key no longer makes a check pass that the next boot would fail."""

from p2pkit import config
from p2pkit.checks import p2p_module, preflight


def test_a_signing_key_nothing_uses_passes_no_secure_boot_check():
    p = config.load("dual-5090-ninfer", ["p2p_module.signing_key=/var/lib/p2pkit/MOK.priv"])
    c = preflight._secure_boot({"secure_boot": "on"}, p)
    assert c.status == "fail" and "signing_key" in c.measured and "is not used" in c.measured
    assert "set p2p_module.signing_key" not in c.hint and "turn it off in the firmware setup" in c.hint
    # the other runtime facts as a host without the module loaded reads them
    rest = {"nvidia_version": {"loaded": False}, "iommu": {"error": "not read here"}}
    r = {x.id: x for x in p2p_module.runtime_checks({"secure_boot": "on", **rest}, p)}["p2p.secure_boot"]
    assert r.status == "fail" and "does not sign" in r.hint
    off = {x.id: x for x in p2p_module.runtime_checks({"secure_boot": "off", **rest}, p)}["p2p.secure_boot"]
    assert off.status == "pass"
