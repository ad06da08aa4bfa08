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


# ------------------------------------------- issue 47 item 8: every signature each field pitfall's sources give

FIELD = Path(__file__).parent / "fixtures/field"


def field(name: str, profile=P) -> dict:
    text = (FIELD / name).read_text()
    return {c.id: c for c in paste.check(pp.kind(text), text, profile)}


def test_a_hang_on_aarch64_in_ncclLocalOpAppend_is_p37_not_p28():
    """NVIDIA/nccl#2213 (dual DGX Spark, NCCL 2.28.9): the watchdog's timeout came from NCCL's proxy-op pool run dry
    on aarch64 (fixed in 2.29.3); judged P28 (a static BAR1) before, it is P37 with NCCL's floor as the fix."""
    c = field("crash_aarch64_localopappend_nccl2213.txt", config.load("dual-spark-vllm"))
    h = c["paste.collective_hang"]
    assert (h.status, h.pitfall) == ("fail", "P37") and "ALLREDUCE (sequence number 1155874)" in h.measured, h
    assert "2.29.3" in h.hint and "ncclLocalOpAppend" in h.measured, h
    # the same timeout with no sign of the aarch64 proxy bug stays a hang of the P2P path
    plain = judged("crash_watchdog_timeout_basicsr737.txt")["paste.collective_hang"]
    assert plain.pitfall == "P28"


def test_a_watchdog_line_wrapped_by_the_poster_and_the_heartbeat_monitor_are_hangs():
    """vllm#42354 wrapped the watchdog line over three lines; PyTorch's heartbeat monitor ("ProcessGroupNCCL's
    watchdog got stuck for 480 seconds", hiyouga/LlamaFactory#8549) is a hang too: both were "could not determine"."""
    h = field("crash_watchdog_wrapped_vllm42354.txt")["paste.collective_hang"]
    assert (h.status, h.pitfall) == ("fail", "P28") and "_ALLGATHER_BASE (sequence number 12590)" in h.measured, h
    h = field("crash_heartbeat_stuck_llamafactory8549.txt")["paste.collective_hang"]
    assert (h.status, h.pitfall) == ("fail", "P28") and "got stuck for 480 s" in h.measured, h


def test_vllms_own_nccl_version_line_is_held_to_the_floor():
    """vLLM prints "vLLM is using nccl==2.20.5" (vllm#8058), not NCCL's "NCCL version" line."""
    c = field("vllm_using_nccl_vllm8058.txt")
    v = c["paste.nccl_version"]
    assert (v.status, v.measured, v.pitfall) == ("fail", "2.20.5", "P16"), v


@pytest.mark.parametrize("name, said", [("nccl_ib_completion_error12_nccl426.txt", "Got completion with error 12"),
                                        ("nccl_ibv_modify_qp_nccltests185.txt", "ibv_modify_qp failed")])
def test_roce_connection_failures_are_p38(name, said):
    """NCCL's verbs failures between nodes (NVIDIA/nccl#426, fixed there by NCCL_IB_GID_INDEX; nccl-tests#185) name the
    RoCE GID index and MTU (P38), not "could not determine"."""
    c = field(name, config.load("dual-spark-vllm"))
    r = c["paste.roce"]
    assert (r.status, r.pitfall) == ("fail", "P38") and said in r.measured and "GID index" in r.hint, r
    assert "paste.nccl_log" not in c


def test_ncclmaxsharedmem_without_a_version_line_is_p16():
    """NCCL 2.25.1 on a 5090 (NVIDIA/nccl#1637): its "ncclMaxSharedMem ... exceeds" line alone names the floor."""
    line = (FIELD / "nccl_2251_5090_nccl1637.txt").read_text().splitlines()[-1]
    c = {x.id: x for x in paste.check("nccl-log", line + "\n", P)}
    s = c["paste.nccl_shared_mem"]
    assert (s.status, s.pitfall) == ("fail", "P16") and "82240" in s.measured and "2.26.2" in s.hint, s


@pytest.mark.parametrize("name, id_, pitfall", [
    ("dmesg_wpr2_ogkm1230.txt", "paste.gpu_wedged", "P35"), ("dmesg_wpr2_noprefix_aikitoria9.txt", "paste.gpu_wedged",
                                                             "P35"),
    ("dmesg_bar_nospace_rk3588.txt", "paste.bar_assign", "P31"), ("dmesg_bar_old_format_kata4211.txt",
                                                                  "paste.bar_assign", "P31"),
    ("dmesg_bar1_0m_gpuoperator492.txt", "paste.bar_assign", "P31"),
    ("dmesg_dmar_no_pasid_ttumd1814.txt", "paste.iommu_fault", "P32")])
def test_a_pasted_kernel_log_is_judged_by_its_own_lines(name, id_, pitfall):
    """A pasted `dmesg` was "no output p2pkit knows how to read"; each field pitfall's kernel line is judged."""
    c = field(name)
    assert pp.kind((FIELD / name).read_text()) == "kernel-log"
    assert (c[id_].status, c[id_].pitfall) == ("fail", pitfall), c


def test_a_kernel_log_without_those_lines_is_never_a_pass_and_kernel_lines_in_a_crash_log_count():
    c = field("dmesg_bar_ok_aikitoria9.txt")
    assert list(c) == ["paste.kernel_log"] and c["paste.kernel_log"].status == "skip", c
    crash = (FIX / "crash_watchdog_timeout_basicsr737.txt").read_text() + \
        (FIELD / "dmesg_wpr2_ogkm1230.txt").read_text()
    c = {x.id: x for x in paste.check(pp.kind(crash), crash, P)}
    assert c["paste.collective_hang"].pitfall == "P28" and c["paste.gpu_wedged"].pitfall == "P35", c


@pytest.mark.parametrize("name", ["crash_peer_unsupported_dynamo1229.txt", "crash_cuda_error_217_llamacpp3230.txt",
                                  "crash_custom_allreduce_sglang552.txt"])
def test_cudas_peer_refusal_in_each_programs_own_words_is_p34(name):
    """PyTorch's "CUDA error: ..." (ai-dynamo/dynamo#1229), llama.cpp's "CUDA error 217 at ..." (llama.cpp#3230) and
    vLLM's custom all-reduce "Cuda error FILE:LINE '...'" (sglang#552) were "no output p2pkit knows how to read"."""
    text = (FIELD / name).read_text()
    assert pp.kind(text) == "nccl-log"
    c = field(name)
    assert (c["paste.p2p_access"].status, c["paste.p2p_access"].pitfall) == ("fail", "P34"), c


def test_no_kernel_image_for_the_gpu_is_p39():
    """vLLM's "CUDA error: no kernel image is available for execution on the device" (vllm PR #39878's comment): the
    built architectures leave the GPU's out, P39, with the profile's architecture in what is expected."""
    spark = config.load("dual-spark-vllm")
    c = field("crash_no_kernel_image_vllm39878.txt", spark)
    k = c["paste.kernel_image"]
    assert (k.status, k.pitfall) == ("fail", "P39") and "cuobjdump --list-elf" in k.hint, k
    assert spark.engine.cuda_architectures in k.expected


def test_ncclS_bare_version_line_is_an_nccl_log():
    """NCCL prints "NCCL version 2.10.3+cuda11.3" without its "NCCL INFO" prefix on rank 0 (NVIDIA/nccl#857)."""
    text = (FIELD / "nccl_version_bare_nccl857.txt").read_text()
    assert pp.kind(text) == "nccl-log"
    v = field("nccl_version_bare_nccl857.txt")["paste.nccl_version"]
    assert (v.status, v.measured) == ("fail", "2.10.3+cuda11.3"), v


def test_a_timeout_on_aarch64_below_2_29_3_is_p37_and_without_the_version_stays_p28():
    """vllm#41725/#42354's case: a watchdog timeout on an aarch64 host whose NCCL is below the fix. Built from real
    lines: NVIDIA/nccl#2213's aarch64 log without its ncclLocalOpAppend frame, and HAMi-core#261's vLLM version line."""
    lines = [ln for ln in (FIELD / "crash_aarch64_localopappend_nccl2213.txt").read_text().splitlines()
             if "ncclLocalOpAppend" not in ln and "SIGSEGV" not in ln]
    base = "\n".join(lines) + "\n"
    hang = {x.id: x for x in paste.check("nccl-log", base, P)}["paste.collective_hang"]
    assert hang.pitfall == "P28"  # aarch64 but no version: not enough to say P37
    v = ("(Worker pid=820) INFO 08-09 20:55:03 [distributed/device_communicators/pynccl.py:113] vLLM is using "
         "nccl==2.28.9\n")
    hang = {x.id: x for x in paste.check("nccl-log", v + base, P)}["paste.collective_hang"]
    assert hang.pitfall == "P37" and "NCCL 2.28.9 on aarch64" in hang.measured, hang
    fixed = v.replace("2.28.9", "2.30.7")
    assert {x.id: x for x in paste.check("nccl-log", fixed + base, P)}["paste.collective_hang"].pitfall == "P28"
