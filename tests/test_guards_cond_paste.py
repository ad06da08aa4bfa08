"""Condition guards for the reader of pasted outputs (bench/check_guard.py --conditions --only paste): each
condition of p2pkit.app.paste judged on a small paste where it decides the findings (lspci -v/-vvv blocks,
the installer's and install.sh's lines, CMake's configure output, `nvidia-smi -q`), the check function called
directly with the built-in profile, so a condition replaced by True or by False changes a finding's id, status,
pitfall, measured or expected text asserted here."""

from __future__ import annotations

import pytest

from p2pkit.app import paste as pc
from p2pkit.core import config

P = config.load(None)  # dual-5090-ninfer: a pair of GPUs with 32 GiB VRAM each

GPU_32G = """\
01:00.0 VGA compatible controller: NVIDIA Corporation AD102 [GeForce RTX 4090] (rev a1) (prog-if 00 [VGA controller])
\tFlags: bus master, fast devsel, latency 0, IRQ 377
\tMemory at b2000000 (32-bit, non-prefetchable) [size=16M]
\tMemory at 28800000000 (64-bit, prefetchable) [size=32G]
\tMemory at 28400000000 (64-bit, prefetchable) [size=32M]
\tKernel driver in use: nvidia
"""


def bridge(bdf: str, secondary: str, window: str | None, acs: str | None = None, denied: bool = False) -> str:
    """An `lspci -v(vv)` block of a PCI bridge: its secondary bus, its prefetchable window (None: no window
    line), its ACSCtl line, "Capabilities: <access denied>" (lspci without root)."""
    lines = [f"{bdf} PCI bridge: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge (prog-if 00 [Normal "
             "decode])", "\tFlags: bus master, fast devsel, latency 0, IRQ 28",
             f"\tBus: primary=00, secondary={secondary}, subordinate={secondary}, sec-latency=0",
             "\tMemory behind bridge: fc000000-fd0fffff [size=17M]"]
    if window:
        lines.append(f"\tPrefetchable memory behind bridge: {window}")
    if denied:
        lines.append("\tCapabilities: <access denied>")
    if acs:
        lines.append(f"\t\tACSCtl:\t{acs}")
    return "\n".join(lines) + "\n"


ACS_ON = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
ACS_OFF = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
WIN_32G = "0000007000000000-00000077ffffffff [size=32G]"
WIN_256M = "0000007000000000-000000700fffffff [size=256M]"


def rows(checks) -> list[tuple]:
    return [(c.id, c.status, c.pitfall) for c in checks]


# ------------------------------------------------------------------------------------------ _acs

def test_acs_names_the_bridge_whose_acsctl_redirects():
    """The bridge's address, not a "(line N, no device in the paste)" stand-in, names the redirect."""
    c = pc._acs(bridge("00:01.1", "01", None, ACS_ON), P)
    assert rows(c) == [("field.acs", "fail", "P29")]
    assert c[0].measured == "00:01.1 ReqRedir+ CmpltRedir+"
    assert "pci=noacs" in c[0].hint


def test_acs_grep_lines_without_devices_are_named_by_line():
    c = pc.lspci("\t\tACSCtl:\t" + ACS_ON + "\n", P)
    assert rows(c) == [("field.acs", "fail", "P29")]
    assert c[0].measured == "(line 1, no device in the paste) ReqRedir+ CmpltRedir+"


def test_acs_a_device_without_acsctl_is_no_port():
    """`lspci -v` as a user shows it (no ACSCtl line, capabilities not denied): BAR1 judged, nothing of ACS."""
    c = pc.lspci(GPU_32G, P)
    assert rows(c) == [("paste.bar1.01:00.0", "pass", "P31")]


def test_acs_only_the_ports_with_acsctl_are_checked():
    """A bridge with ACS off and a GPU without an ACSCtl line: the bridge alone is named as checked."""
    c = {x.id: x for x in pc.lspci(bridge("00:01.1", "01", WIN_32G, ACS_OFF) + GPU_32G, P)}
    assert c["field.acs"].status == "pass" and c["field.acs"].measured == "no redirect on 00:01.1"
    assert "field.acs.unread" not in c


def test_acs_flags_shown_are_judged_even_where_some_capabilities_were_denied():
    """A block that says "<access denied>" and still shows ACSCtl (pastes put together): the flags shown are
    judged (a fail), not reported as unreadable."""
    c = pc._acs(bridge("00:01.1", "01", None, ACS_ON, denied=True), P)
    assert rows(c) == [("field.acs", "fail", "P29")]
    assert c[0].measured == "00:01.1 ReqRedir+ CmpltRedir+"


def test_acs_denied_without_flags_is_could_not_check():
    c = pc._acs(bridge("00:01.1", "01", None, denied=True), P)
    assert rows(c) == [("field.acs.unread", "warn", "P29")]
    assert "lspci ran without root" in c[0].measured and "sudo lspci -vvv" in c[0].hint


# ------------------------------------------------------------------------------------------ _bars

def test_bars_only_nvidia_gpus_have_a_bar1_and_their_bridge_a_window():
    c = pc.lspci(bridge("00:01.1", "01", WIN_32G) + GPU_32G, P)
    assert rows(c) == [("paste.bar1.01:00.0", "pass", "P31"), ("paste.bridge_window.00:01.1", "pass", "P31")]
    w = c[1]
    assert (w.value, w.op, w.limit, w.unit) == (32, ">=", 32, "GiB")
    assert w.measured == "prefetchable window 32.0 GiB"
    assert w.title == "bridge 00:01.1 above 01:00.0 has room for BAR1"


def test_bars_a_small_bridge_window_fails_p31():
    c = pc.lspci(bridge("00:01.1", "01", WIN_256M) + GPU_32G, P)
    w = {x.id: x for x in c}["paste.bridge_window.00:01.1"]
    assert (w.status, w.pitfall, w.value, w.unit, w.limit) == ("fail", "P31", 256, "MiB", 32768)
    assert "Above 4G" in w.hint


def test_bars_a_bridge_on_another_bus_is_not_above_the_gpu():
    c = pc.lspci(bridge("00:03.1", "02", WIN_256M) + bridge("00:01.1", "01", WIN_32G) + GPU_32G, P)
    assert [x.id for x in c] == ["paste.bar1.01:00.0", "paste.bridge_window.00:01.1"]
    assert all(x.status == "pass" for x in c)


def test_bars_a_bridge_above_without_a_prefetchable_window_is_not_judged():
    c = pc.lspci(bridge("00:01.1", "01", None) + GPU_32G, P)
    assert rows(c) == [("paste.bar1.01:00.0", "pass", "P31")]


# ------------------------------------------------------------------------------------------ installer

def test_installer_rmmod_in_use_names_the_holders_only_where_given():
    t = ("rmmod: ERROR: Module nvidia_drm is in use\n"
         "rmmod: ERROR: Module nvidia is in use by: nvidia_uvm nvidia_modeset\n")
    c = pc.installer(t, P)
    assert rows(c) == [("paste.module_in_use", "fail", "P34")]
    assert c[0].measured == "in use, not replaced: nvidia_drm; nvidia (used by nvidia_uvm, nvidia_modeset)"


def test_installer_module_in_use_and_failed_says_both():
    t = ("ERROR: An NVIDIA kernel module 'nvidia-drm' appears to already be loaded in your kernel.\n"
         "ERROR: Installation has failed.  Please see the file '/var/log/nvidia-installer.log' for details.\n")
    c = pc.installer(t, P)
    assert rows(c) == [("paste.module_in_use", "fail", "P34")]
    assert c[0].measured == "in use, not replaced: nvidia-drm; installation failed"


def test_installer_module_in_use_without_failure_says_so_alone():
    t = "ERROR: An NVIDIA kernel module 'nvidia-drm' appears to already be loaded in your kernel.\n"
    assert pc.installer(t, P)[0].measured == "in use, not replaced: nvidia-drm"


def test_installer_failed_for_another_reason():
    t = "nvidia-installer log file '/var/log/nvidia-installer.log'\nERROR: Installation has failed.\n"
    c = pc.installer(t, P)
    assert rows(c) == [("paste.module_in_use", "fail", "P34")]
    assert c[0].measured == "installation failed, for a reason the paste does not show"
    assert c[0].hint == "paste /var/log/nvidia-installer.log whole"


def test_installer_clean_log_passes():
    t = ("nvidia-installer log file '/var/log/nvidia-installer.log'\n"
         "Installation of the kernel module for the NVIDIA Accelerated Graphics Driver for Linux-x86_64 "
         "is now complete.\n")
    c = pc.installer(t, P)
    assert [(x.id, x.status) for x in c] == [("paste.module_in_use", "pass")]
    assert c[0].measured == "no module in use, no failure"


# ------------------------------------------------------------------------------------------ cmake

NO_NVCC = ("-- The CXX compiler identification is GNU 13.2.0\n"
           "CMake Error at CMakeLists.txt:12 (enable_language):\n  No CMAKE_CUDA_COMPILER could be found.\n"
           "-- Configuring incomplete, errors occurred!\n")


def test_cmake_no_cuda_compiler_alone_is_one_finding():
    c = pc.cmake(NO_NVCC, P)
    assert rows(c) == [("paste.cuda_compiler", "fail", "P05")]
    assert c[0].expected == "nvcc of CUDA >= " + P.engine.cuda_min


def test_cmake_other_errors_are_named():
    t = ("CMake Error at CMakeLists.txt:5 (find_package):\n  Could not find a package configuration file\n"
         "CMake Error: The source directory does not exist.\n-- Configuring incomplete, errors occurred!\n")
    c = pc.cmake(t, P)
    assert [(x.id, x.status) for x in c] == [("paste.cmake", "fail")]
    assert c[0].measured == ("CMake Error at CMakeLists.txt:5 (find_package):; "
                             "CMake Error: The source directory does not exist.")


def test_cmake_configuring_done_passes():
    t = "-- The CUDA compiler identification is NVIDIA 13.1.80\n-- Configuring done (2.1s)\n-- Generating done\n"
    c = pc.cmake(t, P)
    assert [(x.id, x.status, x.measured) for x in c] == [("paste.cmake", "pass", "Configuring done")]


def test_cmake_cut_before_the_end_cannot_tell():
    c = pc.cmake("-- The CUDA compiler identification is NVIDIA 13.1.80\n", P)
    assert rows(c) == [("paste.cmake", "skip", "P05")]
    assert c[0].measured.startswith("could not determine: no CMake Error and no end of configuration")


# ------------------------------------------------------------------------------------------ smi_q

def smi(fb: bool = True, bar1: bool = True) -> str:
    t = "==============NVSMI LOG==============\n\nAttached GPUs : 1\nGPU 00000000:01:00.0\n" \
        "    Product Name : NVIDIA GeForce RTX 5090\n"
    if fb:
        t += "    FB Memory Usage\n        Total : 32607 MiB\n        Used : 1 MiB\n"
    if bar1:
        t += "    BAR1 Memory Usage\n        Total : 32768 MiB\n        Used : 1 MiB\n"
    return t


def test_smi_q_without_a_gpu_section_cannot_tell():
    c = pc.smi_q("==============NVSMI LOG==============\nDriver Version : 615.71.09\n", P)
    assert rows(c) == [("paste.bar1", "skip", "P31")]
    assert c[0].measured == "could not determine: no GPU section in the paste"


@pytest.mark.parametrize("fb,bar1", [(False, True), (True, False)])
def test_smi_q_without_fb_or_bar1_total_cannot_tell(fb, bar1):
    c = pc.smi_q(smi(fb, bar1), P)
    assert rows(c) == [("paste.bar1.00000000:01:00.0", "skip", "P31")]
    assert c[0].measured == "could not determine: no BAR1 or FB Memory Usage Total in the paste"


def test_smi_q_bar1_held_against_fb():
    c = pc.smi_q(smi(), P)
    assert rows(c) == [("paste.bar1.00000000:01:00.0", "pass", "P31")]
    assert (c[0].value, c[0].op, c[0].limit, c[0].unit) == (32768, ">=", 32607, "MiB")
