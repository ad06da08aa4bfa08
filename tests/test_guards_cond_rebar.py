"""Condition guards for the rebar stage (bench/check_guard.py --conditions --only rebar): each condition of
p2pkit.stages.rebar.checks judged on the facts where it decides the finding, the check function called
directly with typed facts (p2pkit.facts.types: PciGpu, Aperture, Nvml, KernelLog) and the built-in profile, so
a condition replaced by True or by False changes a status, a figure, a measured or expected text or a hint
asserted here."""

from __future__ import annotations

import pytest

from p2pkit.core import config
from p2pkit.stages.rebar import checks as rebar

P = config.load(None)  # dual-5090-ninfer: 2 GPUs of 32 GiB VRAM, bar1_min_gib 0 (at least the VRAM)
GIB, MIB = 1 << 30, 1 << 20
BDF = "0000:01:00.0"
NVML_ERR = {"error": "NVML did not initialise: Driver/library version mismatch"}


def gpu(size=32 * GIB, resizable_to=(), index=1, **kw) -> dict:
    """A PciGpu whose BAR1 (a 64-bit prefetchable aperture at resource`index`) is `size` bytes."""
    return {"bdf": BDF, "device_id": "0x2b85", "name": "NVIDIA GeForce RTX 5090",
            "aperture": {"index": index, "size": size, "flags": "0x14220c", "resizable_to": list(resizable_to)},
            **kw}


def nvml(memory_total=32 * GIB, bar1_total=32 * GIB) -> dict:
    return {"driver_version": "615.71.09",
            "gpus": [{"index": 0, "bus_id": "00000000:01:00.0", "memory_total": memory_total,
                      "bar1_total": bar1_total}]}


def by_id(checks) -> dict:
    return {c.id: c for c in checks}


# ------------------------------------------------------------------------------------------ check

def test_rebar_no_gpu_in_sysfs_is_a_failed_count_not_a_pass():
    c = rebar.check({"pci_gpus": [], "nvml": nvml()}, P)
    assert len(c) == 1
    assert (c[0].id, c[0].status, c[0].value, c[0].op, c[0].limit, c[0].unit) == ("rebar.gpus", "fail", 0, "==", 2,
                                                                                  "count")
    assert c[0].measured == "0" and "no NVIDIA GPU in /sys/bus/pci/devices" in c[0].hint


def test_rebar_bar1_floor_is_the_vram_nvml_reports():
    """NVML says 48 GiB of VRAM (more than the profile's 32): a 32 GiB BAR1 falls short of it."""
    c = by_id(rebar.check({"pci_gpus": [gpu(32 * GIB)], "nvml": nvml(48 * GIB, 32 * GIB)}, P))
    bar1 = c[f"rebar.bar1.{BDF}"]
    assert (bar1.status, bar1.value, bar1.op, bar1.limit, bar1.unit) == ("fail", 32, ">=", 48, "GiB")
    assert bar1.measured == "32.0 GiB (at resource1)"
    assert bar1.expected == ">= 48.0 GiB (VRAM from NVML)"
    assert c[f"rebar.nvml.{BDF}"].status == "pass"


def test_rebar_bar1_floor_is_the_profile_vram_without_nvml():
    """NVML did not answer: the profile's 32 GiB is the floor, and the NVML cross-check is a skip."""
    c = by_id(rebar.check({"pci_gpus": [gpu(32 * GIB)], "nvml": NVML_ERR}, P))
    bar1 = c[f"rebar.bar1.{BDF}"]
    assert (bar1.status, bar1.value, bar1.limit) == ("pass", 32, 32)
    assert bar1.expected == ">= 32.0 GiB (VRAM from the profile)"
    nv = c[f"rebar.nvml.{BDF}"]
    assert nv.status == "skip"
    assert nv.measured == "could not determine: NVML did not initialise: Driver/library version mismatch"
    assert nv.expected == "32 GiB"


def test_rebar_nvml_memory_total_unreadable_falls_back_to_the_profile():
    """NVML lists the GPU but could not read its memory total: the profile's VRAM is the floor."""
    f = {"pci_gpus": [gpu(32 * GIB)], "nvml": nvml({"error": "Not Supported"}, 32 * GIB)}
    bar1 = by_id(rebar.check(f, P))[f"rebar.bar1.{BDF}"]
    assert (bar1.status, bar1.value, bar1.op, bar1.limit) == ("pass", 32, ">=", 32)
    assert bar1.expected.startswith(">= 32.0 GiB (")


def test_rebar_nvml_bar1_total_unreadable_is_not_read():
    f = {"pci_gpus": [gpu(32 * GIB)], "nvml": nvml(32 * GIB, {"error": "Not Supported"})}
    nv = by_id(rebar.check(f, P))[f"rebar.nvml.{BDF}"]
    assert (nv.status, nv.value) == ("fail", None)
    assert nv.measured == "not read: {'error': 'Not Supported'}"
    assert nv.expected == "== 32.0 GiB (sysfs)"


@pytest.mark.parametrize("errors, why", [
    (["could not read resource of 0000:01:00.0: permission denied", "no resource file"],
     "could not read resource of 0000:01:00.0: permission denied; no resource file"),
    ([], "no 64-bit prefetchable memory BAR in the resource table"),
])
def test_rebar_no_aperture_says_why(errors, why):
    g = {**gpu(), "aperture": None, "errors": errors}
    c = by_id(rebar.check({"pci_gpus": [g], "nvml": nvml()}, P))
    bar1 = c[f"rebar.bar1.{BDF}"]
    assert (bar1.status, bar1.measured, bar1.expected) == ("fail", f"could not determine: {why}", ">= 32 GiB")
    assert "Resizable BAR" in bar1.hint
    assert f"rebar.nvml.{BDF}" not in c  # nothing to compare NVML's BAR1 with


@pytest.mark.parametrize("resizable_to, offer", [
    ([256 * MIB, 16 * GIB], None),  # no size the card offers reaches VRAM: no offer in the hint
    ([256 * MIB, 32 * GIB, 64 * GIB], "; this card offers 64 GiB (resource1_resize)"),
    ([64 * GIB], "; this card offers 64 GiB (resource1_resize)"),
])
def test_rebar_small_bar1_hint_names_the_largest_size_that_covers_vram(resizable_to, offer):
    c = by_id(rebar.check({"pci_gpus": [gpu(256 * MIB, resizable_to)], "nvml": nvml(32 * GIB, 256 * MIB)}, P))
    bar1 = c[f"rebar.bar1.{BDF}"]
    assert (bar1.status, bar1.value) == ("fail", 0.25)
    if offer is None:
        assert bar1.hint == rebar.FIX
    else:
        assert bar1.hint == rebar.FIX + offer


# ------------------------------------------------------------------------------------- bar_assignment

def test_bar_assignment_figure_is_the_smallest_window_and_each_other_shows_its_size():
    """Two windows short of VRAM: the smaller carries the figure, the other its own size in MiB; a kernel
    line's own braces stay as the kernel wrote them."""
    g = {**gpu(256 * MIB), "bridge_window": {"bdf": "0000:00:01.1", "prefetch_size": 128 * MIB}}
    line = "pci 0000:01:00.0: BAR 1 [mem size 0x800000000 64bit pref]: can't assign; no space {}"
    k = {"bar_no_space": [line], "resize_fatal": [], "wpr2": [], "io_page_fault": []}
    c = rebar.bar_assignment({"kernel_log": k, "pci_gpus": [g]}, P)[0]
    assert (c.id, c.status, c.value, c.unit, c.pitfall) == ("field.bar_assign", "fail", 128, "MiB", "P31")
    assert c.measured == ("0000:01:00.0 BAR1 256 MiB; bridge 0000:00:01.1 above 0000:01:00.0: prefetchable "
                          "window 128 MiB; " + line)
