"""What the simulated hardware does: which module loads, what P2P status the driver reports,
which IOMMU mode is in effect, what NVML answers. Pure functions over the state."""

from __future__ import annotations

from p2pkit.parse.pci import GEN_TO_GTS
from p2pkit.parse.system import iommu_intent
from p2pkit.sim.scenarios import GIB


def iommu_effective(state: dict) -> str:
    """passthrough | translating | off, from the firmware setting and the running command line."""
    if not state["iommu_firmware"]:
        return "off"
    mode = iommu_intent(state["cmdline"], state["cpu_vendor"]).mode
    return {"passthrough": "passthrough", "off": "off"}.get(mode, "translating")


def loaded(state: dict) -> dict | None:
    return state["module"].get("loaded")


def nvml_error(state: dict) -> str | None:
    mod = loaded(state)
    user = state["driver"].get("userspace")
    if user is None:
        return "NVML Shared Library Not Found"
    if mod is None:
        return "Driver Not Loaded"
    if mod["version"] != user:
        return "Driver/library version mismatch"
    return None


def p2p_status(state: dict) -> str:
    mod = loaded(state)
    if mod is None:
        return "U"
    if not mod.get("patched"):
        return "CNS"  # the stock driver refuses GeForce P2P
    if not state["chipset_p2p"]:
        return "CNS"
    if any(g["bar1_bytes"] < g["vram_gib"] * GIB for g in state["gpus"]):
        return "NS"
    return "OK"


def gpu_name(g: dict) -> str:
    return g.get("name", "NVIDIA GeForce RTX 5090")


def link_max(g: dict) -> tuple[int, int]:
    return min(g["gpu_max_gen"], g["slot_gen"]), min(g["gpu_max_width"], g["slot_width"])


def speed_text(gen: int) -> str:
    return f"{GEN_TO_GTS[gen]:.1f} GT/s PCIe"


# Recorded on the reference box (seed 000: 2x RTX 5090, Gen5 x8 each, patched 615.71.09):
# P2P 28.5 GB/s each way (0.90 of 31.5); latency 0.35-0.45 us with the patch, ~14 us without.
REF_P2P_GBPS, REF_HOST_GBPS, REF_LATENCY_US, REF_STAGED_GBPS = 28.5, 27.9, 0.41, 11.8
