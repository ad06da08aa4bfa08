"""Issue 29, item 2: Secure Boot signing's pure parts: what mokutil, openssl and modinfo print
(parse/mok.py), and the checks preflight and the p2p-module stage make of the signing facts."""

from pathlib import Path

import pytest

from p2pkit.core import config
from p2pkit.parse import mok as pm
from p2pkit.stages.p2p_module import checks as p2p_module
from p2pkit.stages.preflight import checks as preflight

FIX = Path(__file__).parent / "fixtures/mok"
P = config.load("dual-5090-ninfer")
REST = {"nvidia_version": {"loaded": False}, "iommu": {"error": "not read here"}}


def test_openssl_serial_and_modinfo_sig_key_name_the_same_key():
    cert = pm.cert_identity((FIX / "x509-serial-subject.txt").read_text())
    assert cert == {"serial": "8A3F00112233445566778899AABBCCDDEEFF0011",
                    "cn": "p2pkit module signing key for sim-dual5090"}
    # kmod prints the DER integer's bytes colon-separated, with the 00 a set top bit needs
    assert pm.signed_by("00:8A:3F:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11", cert)
    assert pm.signed_by("8a:3f:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff:00:11", cert)
    assert not pm.signed_by("", cert)  # unsigned
    assert not pm.signed_by("8A:3F:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:12", cert)  # another key


@pytest.mark.parametrize("text,state", [
    ("/var/lib/p2pkit/mok/p2pkit-mok.der is already enrolled\n", pm.ENROLLED),
    ("/var/lib/p2pkit/mok/p2pkit-mok.der is already in the enrollment request\n", pm.QUEUED),
    ("/var/lib/p2pkit/mok/p2pkit-mok.der is not enrolled\n", pm.NOT_ENROLLED),
    ("/var/lib/p2pkit/mok/p2pkit-mok.der is already in db\n", pm.IN_DB),
])
def test_mokutil_test_key(text, state):
    assert pm.test_key(text) == state


def test_mokutil_outputs_it_does_not_know_are_errors():
    with pytest.raises(ValueError, match="neither"):
        pm.test_key("Not a valid x509 certificate\n")
    with pytest.raises(ValueError):
        pm.cert_identity("unable to load certificate\n")


def _mok(**kw):
    return {"needed": True, "key": "/var/lib/p2pkit/mok/p2pkit-mok.priv", "cert": "/var/lib/p2pkit/mok/p2pkit-mok.der",
            "key_exists": False, "cert_exists": False, "kernel": "6.8.0-88-generic",
            "sign_file": "/lib/modules/6.8.0-88-generic/build/scripts/sign-file", "mokutil": True,
            "password_given": False, **kw}


def test_preflight_with_secure_boot_on_says_the_signing_path():
    c = preflight._secure_boot({"secure_boot": "on", "mok": _mok()}, P)
    assert c.status == "fail" and "no enrolment password" in c.measured
    for words in ("makes a key at /var/lib/p2pkit/mok/p2pkit-mok.priv", "mokutil --import", "P2PKIT_MOK_PASSWORD",
                  "sign-file", "MokManager", "turn Secure Boot off"):
        assert words in c.hint, words
    assert preflight._secure_boot({"secure_boot": "on", "mok": _mok(password_given=True)}, P).status == "warn"
    queued = preflight._secure_boot({"secure_boot": "on", "mok": _mok(cert_exists=True, enrolment="queued")}, P)
    assert queued.status == "warn" and "Enroll MOK" in queued.hint
    ok = preflight._secure_boot({"secure_boot": "on", "mok": _mok(cert_exists=True, enrolment="enrolled")}, P)
    assert ok.status == "pass"
    no_tool = preflight._secure_boot({"secure_boot": "on", "mok": _mok(sign_file=None, password_given=True)}, P)
    assert no_tool.status == "fail" and "install linux-headers-6.8.0-88-generic" in no_tool.hint
    assert preflight._secure_boot({"secure_boot": "off"}, P).status == "pass"


def test_p2p_checks_prove_the_signer_and_the_enrolment():
    cert = {"serial": "8A3F00112233445566778899AABBCCDDEEFF0011", "cn": "p2pkit"}
    sig = "00:8A:3F:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11"

    def checks(**kw):
        f = {"secure_boot": "on", "mok": _mok(cert_exists=True, cert_id=cert, **kw), **REST}
        return {x.id: x for x in p2p_module.runtime_checks(f, P)}

    good = checks(enrolment="enrolled", module_sig_key=sig, module_signer="p2pkit")
    assert good["p2p.secure_boot"].status == "pass" and good["p2p.mok_enrolled"].status == "pass"
    unsigned = checks(enrolment="enrolled", module_sig_key="")
    assert unsigned["p2p.secure_boot"].status == "fail" and "up --from p2p-module" in unsigned["p2p.secure_boot"].hint
    queued = checks(enrolment="queued", module_sig_key=sig)
    assert queued["p2p.mok_enrolled"].status == "fail" and "Enroll MOK" in queued["p2p.mok_enrolled"].hint
    # a queued key is what the next boot enrols; an unsigned module is not
    assert "p2p.mok_enrolled" in p2p_module.REBOOT_FIXES and "p2p.secure_boot" not in p2p_module.REBOOT_FIXES
    off = {x.id: x for x in p2p_module.runtime_checks({"secure_boot": "off", **REST}, P)}
    assert off["p2p.secure_boot"].status == "pass" and "p2p.mok_enrolled" not in off


def test_the_enrolment_password_goes_to_stdin_and_into_no_child_environment(monkeypatch):
    from p2pkit.core.runner import Runner

    monkeypatch.setenv("P2PKIT_MOK_PASSWORD", "one-time-pw")
    r = Runner().run(["sh", "-c", 'read a; read b; echo "$a|$b|${P2PKIT_MOK_PASSWORD:-unset}"'],
                     input_text="one-time-pw\none-time-pw\n")
    assert r.stdout.strip() == "one-time-pw|one-time-pw|unset"
    assert Runner().run(["sh", "-c", "cat; echo end"]).stdout.strip() == "end"  # stdin stays /dev/null
