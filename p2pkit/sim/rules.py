"""The rules the simulated host imitates, stated here from their sources and never imported from the
product (issue 28): the kernel's IOMMU mode, NCCL's P2P level, PCIe's rates, nvidia-smi's legend,
the multiarch layout. Were the simulator to borrow the product's own rule, a bug in that rule would
pass end to end; stated twice, the two are compared (tests/test_sim_rules.py) and a difference
fails. Pure data and functions: stand-ins import this module in a Python of their own."""

from __future__ import annotations

# ------------------------------------------------------------------------------------------- PCIe

# The PCI Express Base Specification's signalling rate per generation, in GT/s; sysfs prints it as
# "<rate with one decimal> GT/s PCIe" in current_link_speed / max_link_speed (REFERENCE.md, "PCIe and
# sysfs": "2.5 GT/s PCIe" ... "32.0 GT/s PCIe" for Gen5, "64.0 GT/s PCIe").
PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def link_speed_text(gen: int) -> str:
    return f"{PCIE_GTS[gen]:.1f} GT/s PCIe"


def below_bridge(port: str, depth: int) -> str:
    """The address `depth` bridges below a bridge, each device the first on its bus: firmware numbers
    the buses depth first, each bridge's secondary bus the next number (PCI-to-PCI Bridge Architecture
    Specification, bus enumeration; a switch is an upstream port whose internal bus holds its
    downstream ports). Under root port 0000:00:01.1: 0000:01:00.0 (the device in the slot, or a
    switch's upstream port), 0000:02:00.0 (that switch's downstream port), 0000:03:00.0 (behind it)."""
    domain, bus = port[:4], int(port[5:7], 16)
    return f"{domain}:{bus + depth:02x}:00.0"


# ------------------------------------------------------------------------------------------ IOMMU

def iommu_mode(cmdline: str, cpu_vendor: str, firmware_on: bool) -> str:
    """passthrough | translating | off: the DMA domain the kernel gives the GPUs, as Linux decides it
    (Documentation/admin-guide/kernel-parameters.txt): no IOMMU without the firmware's (DMAR/IVRS);
    `iommu=off` or the vendor driver's `intel_iommu=off` / `amd_iommu=off` turn it off; `iommu=pt`
    and `iommu.passthrough=1` ask for identity domains, `iommu.passthrough=0` for translated ones,
    the later option winning (early parameters are applied in command-line order); with neither,
    the build default, which Ubuntu 24.04's kernel sets to translated (CONFIG_IOMMU_DEFAULT_DMA_LAZY).
    `intel_iommu=on` / `amd_iommu=on` only enable the driver. Boolean values as kstrtobool reads them."""
    if not firmware_on:
        return "off"
    vendor_off = "amd_iommu=off" if "AMD" in cpu_vendor.upper() else "intel_iommu=off"
    mode = "translating"
    for token in cmdline.split():
        key, _, value = token.partition("=")
        if token in ("iommu=off", vendor_off):
            return "off"
        if token == "iommu=pt" or (key == "iommu.passthrough" and value.lower() in ("1", "y", "on")):
            mode = "passthrough"
        elif key == "iommu.passthrough" and value.lower() in ("0", "n", "off"):
            mode = "translating"
    return mode


# ------------------------------------------------------------------------------------------- NCCL

# NCCL's path types, nearest first (src/graph/topo.h, PATH_LOC .. PATH_SYS); NCCL_P2P_LEVEL names one
# of them exactly (ncclGetLevel compares with strcmp: upper case only; an unknown name leaves the
# default).
NCCL_PATHS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
# nvidia-smi topo -m's relation between two GPUs, as the NCCL path between them: NODE (host bridges
# within one NUMA node) is a path through the CPU, NCCL's PHB; NV# is NVLink.
SMI_RELATION_PATH = {"X": "LOC", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}


def nccl_default_level(arch: str, cpu_vendor: str) -> str:
    """NCCL's own P2P level when NCCL_P2P_LEVEL is not set (src/graph/paths.cc, ncclTopoCheckP2p):
    PATH_SYS ("use P2P whenever we can"), but PXB through ARM CPUs and through Intel's (and Zhaoxin's)."""
    if arch == "aarch64":
        return "PXB"
    if "INTEL" in cpu_vendor.upper() or "ZHAOXIN" in cpu_vendor.upper() or "SHANGHAI" in cpu_vendor.upper():
        return "PXB"
    return "SYS"


def nccl_uses_p2p(env: dict[str, str], relation: str, arch: str, cpu_vendor: str) -> bool:
    """Whether NCCL takes P2P between two local GPUs `relation` apart (nvidia-smi's code): NCCL_P2P_DISABLE=1
    makes the level LOC; else NCCL_P2P_LEVEL when it names a path, else the default; P2P when the
    path is no farther than the level."""
    path = "NVL" if relation.startswith("NV") else SMI_RELATION_PATH[relation]
    try:
        disabled = int(env.get("NCCL_P2P_DISABLE", "0") or "0", 0) == 1
    except ValueError:
        disabled = False
    given = env.get("NCCL_P2P_LEVEL", "")
    level = "LOC" if disabled else (given if given in NCCL_PATHS else nccl_default_level(arch, cpu_vendor))
    return NCCL_PATHS.index(path) <= NCCL_PATHS.index(level)


# ------------------------------------------------------------------------------------- nvidia-smi

# The legend `nvidia-smi topo -m` prints under its matrix (driver 615.71.09; REFERENCE.md, "nvidia-smi
# text": X, SYS, NODE, PHB, PXB, PIX, NV#).
SMI_TOPO_LEGEND = (
    ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
    ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
    ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
    ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
    ("NV#", "Connection traversing a bonded set of # NVLinks"),
)

# -------------------------------------------------------------------------------- the host's layout

# Debian's multiarch library directory and architecture name per `uname -m` (wiki.debian.org/Multiarch/
# Tuples), where NVIDIA's installer puts libnvidia-ml.so.<version>; its installer's name per
# architecture (download.nvidia.com/XFree86/Linux-<machine>/<version>/NVIDIA-Linux-<machine>-<version>.run).
MULTIARCH_LIBDIR = {"x86_64": "/usr/lib/x86_64-linux-gnu", "aarch64": "/usr/lib/aarch64-linux-gnu"}


def nvidia_installer(machine: str, version: str) -> str:
    return f"NVIDIA-Linux-{machine}-{version}.run"


# Where each engine's build leaves its server, under the build directory (REFERENCE.md, "Engines":
# NInfer's `cmake --build build` outputs build/apps/ninfer-serve; llama.cpp's build/bin/llama-server).
ENGINE_SERVER = {"ninfer": "build/apps/ninfer-serve", "llamacpp": "build/bin/llama-server"}
