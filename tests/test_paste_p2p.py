"""`doctor --from-paste` on what people post when P2P is broken (issue 38, 8): the CUDA samples' simpleP2P and
p2pBandwidthLatencyTest (their own error names and verification failures) and an NCCL or PyTorch log without
NCCL's version line, judged from what it carries. Every paste is one posted publicly (tests/fixtures/paste/
README.md names each); a paste cut before its end is "could not determine", never a pass."""

from pathlib import Path

import pytest

from p2pkit.app import doctor, paste
from p2pkit.core import config
from p2pkit.parse import p2p_paste
from p2pkit.parse import paste as pp

FIX = Path(__file__).parent / "fixtures/paste"
P = config.load("dual-5090-llamacpp")


def judged(name: str) -> dict:
    text = (FIX / name).read_text()
    return {c.id: c for c in paste.check(pp.kind(text), text, P)}


@pytest.mark.parametrize("name, kind", [
    ("simplep2p_verification_nan_aikitoria8.txt", "simpleP2P"),
    ("simplep2p_peer_mixed_tensorflow2145.txt", "simpleP2P"),
    ("simplep2p_all_yes_cut_tinygrad22.txt", "simpleP2P"),
    ("p2pbw_mapping_failed_tinygrad16.txt", "p2pBandwidthLatencyTest"),
    ("p2pbw_enabled_no_faster_tinygrad44.txt", "p2pBandwidthLatencyTest"),
    ("crash_ipc_peer_unsupported_ray_lightning24.txt", "nccl-log"), ("crash_p2p_ipc_warn_cut_ray17909.txt", "nccl-log"),
    ("crash_peer_unsupported_nemo_rl1683.txt", "nccl-log"), ("crash_watchdog_timeout_basicsr737.txt", "nccl-log")])
def test_each_paste_is_known_by_its_own_lines(name, kind):
    assert pp.kind((FIX / name).read_text()) == kind


def test_simplep2p_reading_back_nan_is_p32():
    c = judged("simplep2p_verification_nan_aikitoria8.txt")
    assert c["paste.p2p_integrity"].status == "fail" and c["paste.p2p_integrity"].pitfall == "P32"
    assert "4 verification error(s)" in c["paste.p2p_integrity"].measured and "nan" in c["paste.p2p_integrity"].measured


def test_simplep2p_peer_access_no_names_the_pairs():
    c = judged("simplep2p_peer_mixed_tensorflow2145.txt")
    assert c["paste.p2p_access"].status == "fail" and c["paste.p2p_access"].pitfall == "P34"
    assert "GPU0 -> GPU2" in c["paste.p2p_access"].measured and "GPU0 -> GPU1" not in c["paste.p2p_access"].measured


def test_a_simplep2p_paste_cut_before_its_end_is_never_a_pass():
    c = judged("simplep2p_all_yes_cut_tinygrad22.txt")
    assert list(c) == ["paste.simplep2p"] and c["paste.simplep2p"].status == "skip"
    assert c["paste.simplep2p"].measured.startswith("could not determine")
    # the same peer lines with the sample's own end is a pass; with its CUDA error, the error's pitfall
    text = (FIX / "simplep2p_all_yes_cut_tinygrad22.txt").read_text()
    ok = {x.id: x for x in paste.check("simpleP2P", text + "cudaMemcpyPeer / cudaMemcpy between GPU0 and GPU1: "
                                       "24.52GB/s\nTest passed\n", P)}
    assert ok["paste.simplep2p"].status == "pass" and "24.52 GB/s" in ok["paste.simplep2p"].measured
    bad = paste.check("simpleP2P", text + 'CUDA error at simpleP2P.cu:155 code=205(cudaErrorMapBufferObjectFailed) '
                      '"cudaDeviceEnablePeerAccess(gpuid[1], 0)"\n', P)
    assert [(x.id, x.pitfall) for x in bad] == [("paste.simplep2p.cudaErrorMapBufferObjectFailed", "P31")]


def test_p2pbandwidth_mapping_failed_is_bar1():
    c = judged("p2pbw_mapping_failed_tinygrad16.txt")
    f = c["paste.p2pbw_failure"]
    assert f.status == "fail" and f.pitfall == "P31" and "p2pBandwidthLatencyTest.cu:189" in f.measured
    r = p2p_paste.p2p_bandwidth((FIX / "p2pbw_mapping_failed_tinygrad16.txt").read_text())
    assert r["matrices"]["directional P2P=Disabled Bandwidth Matrix (GB/s)"][6][6] == 287.68


def test_p2p_on_no_faster_than_off_is_traffic_through_the_root_complex():
    c = judged("p2pbw_enabled_no_faster_tinygrad44.txt")
    b = c["paste.p2p_bandwidth"]
    assert b.status == "fail" and b.pitfall == "P29" and "6.6 GB/s on, 6.34 off" in b.measured
    assert "paste.p2p_access" not in c  # it said CAN both ways


def test_nccl_logs_without_a_version_line_are_judged_from_what_they_carry():
    c = judged("crash_peer_unsupported_nemo_rl1683.txt")
    assert c["paste.nccl_version"].status == "skip" and "no NCCL version line" in c["paste.nccl_version"].measured
    assert c["paste.p2p_access"].status == "fail" and c["paste.p2p_access"].pitfall == "P34"
    c = judged("crash_watchdog_timeout_basicsr737.txt")
    h = c["paste.collective_hang"]
    assert h.status == "fail" and h.pitfall == "P28" and "ALLREDUCE (sequence number 808)" in h.measured
    c = judged("crash_p2p_ipc_warn_cut_ray17909.txt")  # cut inside its warning: nothing to judge, said so
    assert c["paste.nccl_log"].status == "skip" and "NCCL WARN failed to ope" in c["paste.nccl_log"].measured


def test_an_nccl_log_with_its_version_is_held_to_the_profiles_floor():
    c = judged("crash_ipc_peer_unsupported_ray_lightning24.txt")
    v = c["paste.nccl_version"]
    assert v.status == "fail" and v.measured == "2.7.8" and P.engine.nccl_min in v.expected
    assert c["paste.p2p_access"].pitfall == "P34"


def test_doctor_from_paste_names_the_new_kinds_and_fails_the_exit():
    r = doctor.from_paste((FIX / "crash_watchdog_timeout_basicsr737.txt").read_text(), P, "x")
    assert r["paste_kind"] == "nccl-log" and r["failed"] == ["paste.collective_hang"]
    assert r["not_checked"][0]["id"] == "paste.nccl_version"
    assert {"simpleP2P", "p2pBandwidthLatencyTest", "nccl-log"} <= set(pp.KINDS)
