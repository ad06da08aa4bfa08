"""What the simulated hardware does: which module loads, what P2P status the driver reports,
which IOMMU mode is in effect, what NVML answers. Pure functions over the state."""

from __future__ import annotations

from p2pkit.sim import rules
from p2pkit.sim.scenarios import GIB


def iommu_effective(state: dict) -> str:
    """passthrough | translating | off, from the firmware setting and the running command line, as the
    kernel decides it (the simulator's own statement: sim/rules.py)."""
    return rules.iommu_mode(state["cmdline"], state["cpu_vendor"], state["iommu_firmware"])


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
    return rules.link_speed_text(gen)


# Recorded on the reference box (seed 000: 2x RTX 5090, Gen5 x8 each, patched 615.71.09):
# P2P 28.5 GB/s each way (0.90 of 31.5); latency 0.35-0.45 us with the patch, ~14 us without.
REF_P2P_GBPS, REF_HOST_GBPS, REF_LATENCY_US, REF_STAGED_GBPS = 28.5, 27.9, 0.41, 11.8


def nccl_lines(state: dict, env: dict[str, str]) -> tuple[list[str], bool]:
    """SIMULATED: the lines NCCL_DEBUG=INFO prints for the link stage's all-reduce, and whether it hangs,
    as the real NCCL decides (src/graph/paths.cc): no P2P from the driver, NCCL_P2P_DISABLE or a level
    below the pair's relation take SHM; the patched module without its static BAR1 mapping advertises
    peer access but moves no bytes, so init never ends (P28)."""
    host = "sim-dual5090:4242:4243"
    lines = [f"{host} [0] NCCL INFO cudaDriverVersion 13020", f"{host} [0] NCCL INFO NCCL version 2.27.7+cuda13.0",
             f"{host} [0] NCCL INFO ncclCommInitAll comm 0x55d0c0a0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init START"]
    mod = loaded(state) or {}
    static_bar1 = "RMForceStaticBar1=1" in mod.get("registry_dwords", "").replace(" ", "")
    rel = "PIX" if state["gpus"] and all(g["switch"] for g in state["gpus"]) else state.get("topo_relation", "PHB")
    p2p = p2p_status(state) == "OK" and rules.nccl_uses_p2p(env, rel, state.get("arch", "x86_64"),
                                                             state["cpu_vendor"])
    if p2p and mod.get("patched") and not static_bar1:
        return lines, True
    via = "P2P/direct pointer" if p2p else "SHM/direct/direct"
    for ch in (0, 1):
        lines.append(f"{host} [0] NCCL INFO Channel {ch:02d}/0 : 0[1000] -> 1[41000] via {via}")
        lines.append(f"{host} [1] NCCL INFO Channel {ch:02d}/0 : 1[41000] -> 0[1000] via {via}")
    lines.append(f"{host} [0] NCCL INFO ncclCommInitAll comm 0x55d0c0a0 rank 0 nranks 2 cudaDev 0 busId 1000 - "
                 "Init COMPLETE")
    return lines, False
