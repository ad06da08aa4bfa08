"""What owners paste, read and judged (`p2pkit doctor --from-paste`): real pastes from public issue
threads (tests/fixtures/paste/README.md names each thread) and the lent H200's real `nvidia-smi -q`."""

from __future__ import annotations

import json

import pytest

from p2pkit.app import paste as pc
from p2pkit.core import config
from p2pkit.parse import build
from p2pkit.parse import paste as pp
from p2pkit.stages.engine import cmake as ec
from tests.conftest import FIXTURES

PASTE = FIXTURES / "paste"
P = config.load(None)  # the 5090 box: 32 GiB VRAM


def text(name: str) -> str:
    return (PASTE / name).read_text()


@pytest.mark.parametrize("name,kind", [
    ("lspci_4090_bar1_256m_geerlingguy504.txt", "lspci"), ("lspci_4090_bar1_32g_tinygrad28.txt", "lspci"),
    ("lspci_3090_rebar_cap_rebaruefi11.txt", "lspci"),
    ("installer_drm_loaded_cuda_samples286.txt", "nvidia-installer"),
    ("installer_drm_loaded_apollo6308.txt", "nvidia-installer"),
    ("install_sh_rmmod_in_use_tinygrad20.txt", "nvidia-installer"),
    ("cmake_no_cuda_compiler_llamacpp13527.txt", "cmake"), ("cmake_no_default_arch_nvbandwidth3.txt", "cmake"),
])
def test_each_real_paste_is_recognised(name, kind):
    assert pp.kind(text(name)) == kind
    assert pp.kind((FIXTURES / "h200-vm/smi_q.txt").read_text()) == "nvidia-smi-q"


# ---------------------------------------------------------------------------------------- lspci

def test_lspci_bar1_256m_fails_p31():
    d = pp.lspci(text("lspci_4090_bar1_256m_geerlingguy504.txt"))[0]
    assert d["gpu"] and d["regions"][1] == {"index": 1, "size": 256 << 20, "bits64": True, "prefetchable": True,
                                            "disabled": True, "unassigned": False}
    c = pc.lspci(text("lspci_4090_bar1_256m_geerlingguy504.txt"), P)[0]
    assert c.status == "fail" and c.pitfall == "P31" and "256 MiB (Region 1)" in c.measured
    assert "Above 4G" in c.hint and "Resizable BAR" in c.hint


def test_lspci_v_bar1_32g_passes():
    c = pc.lspci(text("lspci_4090_bar1_32g_tinygrad28.txt"), P)[0]
    assert c.status == "pass" and c.measured.startswith("32.0 GiB")


def test_lspci_rebar_capability_current_size_where_regions_were_cut():
    c = pc.lspci(text("lspci_3090_rebar_cap_rebaruefi11.txt"), P)[0]
    assert c.status == "fail" and "Resizable BAR capability" in c.measured


def test_lspci_truncated_before_the_regions_is_could_not_determine():
    head = "\n".join(text("lspci_4090_bar1_256m_geerlingguy504.txt").splitlines()[:4])  # cut before Region 0
    c = pc.lspci(head, P)[0]
    assert c.status == "skip" and c.measured.startswith("could not determine")
    assert pc.lspci("", P)[0].measured.startswith("could not determine")


# ---------------------------------------------------------------------------------------- installer

@pytest.mark.parametrize("name,held", [
    ("installer_drm_loaded_cuda_samples286.txt", "nvidia-drm"), ("installer_drm_loaded_apollo6308.txt", "nvidia-drm"),
    ("install_sh_rmmod_in_use_tinygrad20.txt", "nvidia_drm"),
])
def test_installer_module_in_use_is_p34(name, held):
    c = pc.installer(text(name), P)[0]
    assert c.status == "fail" and c.pitfall == "P34" and held in c.measured
    assert "nvidia_drm nvidia_modeset nvidia_uvm nvidia" in c.hint


def test_rmmod_lines_say_who_holds_each_module():
    r = pp.installer(text("install_sh_rmmod_in_use_tinygrad20.txt"))
    assert {"module": "nvidia", "by": ["nvidia_uvm", "nvidia_modeset"]} in r["rmmod_in_use"]


# ---------------------------------------------------------------------------------------- CMake

def test_cmake_no_cuda_compiler_is_p05_in_the_paste_and_in_the_engine_stage():
    t = text("cmake_no_cuda_compiler_llamacpp13527.txt")
    c = pc.cmake(t, P)[0]
    assert c.id == "paste.cuda_compiler" and c.status == "fail" and c.pitfall == "P05" and "CUDACXX" in c.hint
    # the engine stage's own reading of the same configure log names P05 and the fix, not a generic hint
    e = ec._configure({"configure_rc": 1, "first_error": build.first_cmake_error(t), "log": "configure.log"})[0]
    assert e.status == "fail" and e.pitfall == "P05" and ec.NO_CUDA_COMPILER in e.hint


def test_cmake_no_default_architecture_is_p05():
    t = text("cmake_no_default_arch_nvbandwidth3.txt")
    c = pc.cmake(t, P)[0]
    assert c.id == "paste.cuda_arch" and c.status == "fail" and c.pitfall == "P05"
    assert "120a" in c.expected and "CMAKE_CUDA_ARCHITECTURES" in c.hint
    e = ec._configure({"configure_rc": 1, "first_error": build.first_cmake_error(t), "log": "configure.log"})[0]
    assert e.pitfall == "P05" and e.hint.startswith(ec.NO_DEFAULT_ARCH)


# ---------------------------------------------------------------------------------------- nvidia-smi -q

def test_smi_q_of_the_h200_passes_and_a_cut_paste_cannot_tell():
    full = (FIXTURES / "h200-vm/smi_q.txt").read_text()
    c = pc.smi_q(full, P)[0]
    assert c.status == "pass" and c.measured == "BAR1 262144 MiB" and "143771" in c.expected
    cut = full[: full.index("BAR1 Memory Usage")]
    assert pc.smi_q(cut, P)[0].measured.startswith("could not determine")


# ---------------------------------------------------------------------------------------- the command

def test_doctor_from_paste_names_the_pitfall(cli):
    r = cli("--json", "doctor", "--from-paste", str(PASTE / "lspci_4090_bar1_256m_geerlingguy504.txt"))
    doc = json.loads(r.out)
    assert r.code == 1 and doc["paste_kind"] == "lspci" and doc["failed"] == ["paste.bar1.01:00.0"]
    assert doc["groups"][0]["checks"][0]["pitfall_text"]
    ok = cli("doctor", "--from-paste", str(PASTE / "lspci_4090_bar1_32g_tinygrad28.txt"))
    assert ok.code == 0 and "0 check(s) failed" in ok.out


def test_doctor_from_paste_unknown_kind_lists_the_known_ones(cli, tmp_path):
    f = tmp_path / "paste.txt"
    f.write_text("hello, my GPUs do not talk to each other\n")
    r = cli("doctor", "--from-paste", str(f))
    assert r.code == 2 and "Traceback" not in r.err
    for k in pp.KINDS:
        assert k in r.err


def test_doctor_from_a_truncated_paste_is_never_a_pass(cli, tmp_path):
    f = tmp_path / "cut.txt"
    f.write_text("\n".join(text("lspci_4090_bar1_256m_geerlingguy504.txt").splitlines()[:4]) + "\n")
    r = cli("--json", "doctor", "--from-paste", str(f))
    doc = json.loads(r.out)
    assert r.code == 1 and not doc["failed"] and doc["not_checked"][0]["why"].startswith("could not determine")


def test_p29_from_a_pasted_lspci_acsctl_grep_and_an_unprivileged_lspci():
    """`sudo lspci -vvv | grep ACSCtl` as owners paste it (NCCL issues 523 and 1405, tests/fixtures/field)
    judged by the topology stage's own ACS rule; lspci without root is "could not check", never a pass."""
    field = FIXTURES / "field"
    p = config.load(None)
    on = (field / "lspci_acsctl_nccl523.txt").read_text()
    assert pp.kind(on) == "lspci"
    bad = pc.check("lspci", on, p)
    assert [(c.id, c.status, c.pitfall) for c in bad] == [("field.acs", "fail", "P29")], bad
    assert bad[0].measured.count("ReqRedir+ CmpltRedir+") == 2 and "pci=noacs" in bad[0].hint
    off = pc.check("lspci", (field / "lspci_acsctl_off_nccl1405.txt").read_text(), p)
    assert [(c.id, c.status) for c in off] == [("field.acs", "pass")]
    denied = pc.check("lspci", "00:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Device 14ab\n"
                               "\tCapabilities: <access denied>\n", p)
    acs = [c for c in denied if c.id.startswith("field.acs")]
    assert acs and all(c.status == "warn" for c in acs) and "sudo lspci" in acs[-1].hint, acs


# ------------------------------------------------------------ issue 47 item 8: what a new operator pasted

def test_a_cmake_error_from_nvcc_refusing_the_architecture_is_p05(cli):
    """"nvcc fatal : Unsupported gpu architecture 'compute_35'" (gadgetron/gadgetron#6) was a generic paste.cmake
    failure without a pitfall: it is P05, naming the architecture and the toolkit's list."""
    t = text("cmake_nvcc_unsupported_arch_gadgetron6.txt")
    assert pp.kind(t) == "cmake"
    (c,) = [c for c in pc.check("cmake", t, P) if c.status == "fail"]
    assert (c.id, c.pitfall) == ("paste.cuda_arch", "P05") and "compute_35" in c.measured, c
    assert "nvcc --list-gpu-arch" in c.hint and "CMAKE_CUDA_ARCHITECTURES" in c.hint, c.hint
    assert pp.kind("nvcc fatal : Unsupported gpu architecture 'compute_120a'\n") == "cmake"  # the line alone


def test_a_pytorch_crash_of_a_cpu_only_torch_is_read(cli):
    """"Torch not compiled with CUDA enabled" (facebookresearch/detectron2#460) was "no output p2pkit knows how to
    read" though the README lists PyTorch crashes: it is the CPU-only torch, with the fix; no NCCL version asked."""
    t = text("crash_torch_cpu_only_detectron2_460.txt")
    assert pp.kind(t) == "nccl-log"
    checks = pc.check("nccl-log", t, P)
    assert [(c.id, c.status) for c in checks] == [("paste.torch_cuda", "fail")], checks
    assert "CUDA build" in checks[0].hint


def test_an_lspci_paste_without_an_nvidia_gpu_says_why_it_is_not_a_pass(cli):
    """A real `lspci -vv` of a box without NVIDIA devices (geerlingguy/raspberry-pi-pcie-devices#331) printed
    "0 check(s) failed" and exited 1: the exit stays (a paste that shows too little is never a pass), and the
    last line says so, naming what the paste lacks."""
    r = cli("doctor", "--from-paste", str(PASTE / "lspci_radeon_no_nvidia_geerlingguy331.txt"))
    last = " ".join(r.out.strip().splitlines()[-1].split())
    assert r.code == 1 and "could not be judged from the paste" in last and "no NVIDIA VGA or 3D controller" in last, \
        r.out


def test_doctor_help_names_every_paste_kind(cli):
    r = cli("doctor", "--help")
    said = " ".join(r.out.split())
    for k in pp.KINDS:
        assert k in said, (k, said)
