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


def link_max(g: dict) -> tuple[int, int]:
    return min(g["gpu_max_gen"], g["slot_gen"]), min(g["gpu_max_width"], g["slot_width"])


def speed_text(gen: int) -> str:
    return f"{GEN_TO_GTS[gen]:.1f} GT/s PCIe"


def nvml_doc(state: dict) -> dict:
    err = nvml_error(state)
    if err:
        return {"error": f"NVML did not initialise: {err}"}
    status = p2p_status(state)
    gpus = []
    for i, g in enumerate(state["gpus"]):
        gen, width = link_max(g)
        gpus.append({
            "index": i, "name": "NVIDIA GeForce RTX 5090", "uuid": f"GPU-sim-{i:04d}",
            "bus_id": "0000" + g["bdf"].upper(), "memory_total": g["vram_gib"] * GIB,
            "bar1_total": g["bar1_bytes"],
            "link": {"current_gen": 1, "current_width": width, "max_gen": gen, "gpu_max_gen": g["gpu_max_gen"],
                     "max_width": width, "speed_mbps": 2500},
            "replay_counter": 0, "clock_event_reasons": 1,
            "locked_clocks": {"applications_clocks_setting": False},
        })
    p2p = []
    for i in range(len(gpus)):
        for j in range(len(gpus)):
            if i != j:
                anc = "HOSTBRIDGE" if not any(g["switch"] for g in state["gpus"]) else "SINGLE"
                p2p.append({"from": i, "to": j, "read": status, "write": status,
                            "common_ancestor": anc if state["gpus"][i]["root_port"] != state["gpus"][j]["root_port"]
                            else "SINGLE"})
    mod = loaded(state)
    return {"driver_version": mod["version"], "cuda_driver_version": 13020, "gpus": gpus, "p2p": p2p,
            "recorded": "SIMULATED from the scenario state"}
