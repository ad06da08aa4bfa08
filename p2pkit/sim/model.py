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


def nvml_doc(state: dict) -> dict:
    err = nvml_error(state)
    if err:
        return {"error": f"NVML did not initialise: {err}"}
    status = p2p_status(state)
    gpus = []
    for i, g in enumerate(state["gpus"]):
        gen, width = link_max(g)
        gpus.append({
            "index": i, "name": gpu_name(g), "uuid": f"GPU-sim-{i:04d}",
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


# Recorded on the reference box (seed 000: 2x RTX 5090, Gen5 x8 each, patched 615.71.09):
# P2P 28.5 GB/s each way (0.90 of 31.5); latency 0.35-0.45 us with the patch, ~14 us without.
REF_P2P_GBPS, REF_HOST_GBPS, REF_LATENCY_US, REF_STAGED_GBPS = 28.5, 27.9, 0.41, 11.8


def link_results(state: dict, profile) -> dict:
    """SIMULATED link-stage results: what the reference box measured, bent by the scenario."""
    p2p_ok = p2p_status(state) == "OK"
    translating = iommu_effective(state) == "translating"
    gpus = []
    for i, g in enumerate(state["gpus"]):
        gen, width = link_max(g)
        scale = (GEN_TO_GTS[gen] * width) / (32.0 * 8)
        gpus.append({
            "index": i, "name": gpu_name(g), "bus_id": "0000" + g["bdf"],
            "idle": {"gen": 1, "width": width}, "max_gen": gen, "max_width": width,
            "trained_after_s": 0.35 if (gen, width) >= (profile.pcie.min_gen, profile.pcie.min_width) else None,
            "max_seen": {"gen": gen, "width": width}, "replay_before": 0, "replay_after": 0,
            "app_clocks_reason_under_load": False,
            "host": {"h2d_gbps": REF_HOST_GBPS * scale, "d2h_gbps": REF_HOST_GBPS * scale * 0.98,
                     "bytes": profile.link.sample_mib << 20},
        })
    pairs = []
    n = len(gpus)
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            elems = min((profile.link.sample_mib << 20) // 4, 16 << 20)
            bad = elems if (p2p_ok and translating) else 0  # IO_PAGE_FAULT: zero-filled tensors
            pairs.append({
                "from": a, "to": b, "peer_access": p2p_ok,
                "unidir_gbps": REF_P2P_GBPS if p2p_ok else REF_STAGED_GBPS,
                "bidir_gbps": 2 * REF_P2P_GBPS * 0.93 if p2p_ok else REF_STAGED_GBPS,
                "latency_us": REF_LATENCY_US if p2p_ok else 14.2, "staged_gbps": REF_STAGED_GBPS,
                "integrity": {"elements": elems, "equal": bad == 0, "mismatches": bad, "zeros": bad},
            })
    return {"simulated": True, "recorded_from": "seed 000 reference box figures, bent by the scenario",
            "torch": None, "device_count": n, "gpus": gpus, "pairs": pairs, "load_seconds": 3.0,
            "poll_ms": profile.link.poll_ms, "target": {"gen": profile.pcie.min_gen, "width": profile.pcie.min_width},
            "trace": []}
