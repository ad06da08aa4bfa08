"""Pure parsers for the field pitfalls (P28-P39, shared/PITFALLS.md): the driver's live parameters,
ACS control of the bridges, kernel log lines, initramfs listings, mapped libraries, cuobjdump output,
and NCCL's own P2P rule. Each is tested on real outputs quoted from public threads
(tests/fixtures/field/README.md)."""

from __future__ import annotations

import re

# ------------------------------------------------------------------ /proc/driver/nvidia/params (P28)


def driver_params(text: str) -> dict[str, str]:
    """`Key: value` lines of /proc/driver/nvidia/params; string values keep their quotes stripped."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip().strip('"')
    return out


def registry_dwords(value: str) -> dict[str, str]:
    """NVreg_RegistryDwords ("RMForceStaticBar1=1;PeerMappingOverride=1") as {key: value}."""
    out = {}
    for part in value.split(";"):
        k, sep, v = part.strip().partition("=")
        if sep and k:
            out[k.strip()] = v.strip()
    return out


# --------------------------------------------------------------------------- ACS control (P29)

ACS_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
ACS_CAP_ID = 0x000D
REDIRECTS = ("ReqRedir", "CmpltRedir")


def acs_flags(ctl: int) -> dict[str, bool]:
    """The ACS Control register's bits by lspci's names (PCIe base spec, ACS Extended Capability)."""
    return {name: bool(ctl >> i & 1) for i, name in enumerate(ACS_BITS)}


def acs_ctl_from_config(config: bytes) -> int | None:
    """ACS Control from a config space dump (sysfs `config`), walking the extended capabilities from
    0x100; None when the device has no ACS capability. A dump of 256 bytes or less has no extended
    space: the caller must say it could not read it (not root), never that ACS is off."""
    if len(config) <= 0x100:
        raise ValueError(f"the config space dump holds {len(config)} bytes: the extended capabilities "
                         "(from 0x100) are readable by root only")
    ptr, seen = 0x100, set()
    while ptr and ptr not in seen and ptr + 8 <= len(config):
        seen.add(ptr)
        header = int.from_bytes(config[ptr:ptr + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_CAP_ID:
            return int.from_bytes(config[ptr + 6:ptr + 8], "little")
        ptr = (header >> 20) & 0xFFC
    return None


LSPCI_DEV = re.compile(r"^((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")


def lspci_acs(text: str) -> list[dict]:
    """`lspci -vvv` blocks: each device's ACSCtl flags, or `denied` where lspci could not read the
    capabilities (run without root: "Capabilities: <access denied>")."""
    out: list[dict] = []
    cur: dict | None = None
    for line in text.splitlines():
        m = LSPCI_DEV.match(line)
        if m:
            cur = {"bdf": m.group(1), "flags": None, "denied": False}
            out.append(cur)
            continue
        s = line.strip()
        if cur is None and s.startswith("ACSCtl:"):  # `lspci -vvv | grep ACSCtl`: lines without their device
            out.append({"bdf": None, "flags": None, "denied": False})
            cur = out[-1]
        if cur is None:
            continue
        if s.startswith("Capabilities: <access denied>"):
            cur["denied"] = True
        elif s.startswith("ACSCtl:"):
            cur["flags"] = {name: sign == "+" for name, sign in re.findall(r"(\w+)([+-])", s[len("ACSCtl:"):])}
            if LSPCI_DEV.match(line) is None and cur["bdf"] is None:
                cur = None  # the next grep'd line is another device
    return out


def redirects(flags: dict[str, bool] | None) -> list[str]:
    return [n for n in REDIRECTS if flags and flags.get(n)]


# ------------------------------------------------------------------------- kernel log (P31, P35)

BAR_FAIL = re.compile(r"(?:pci|pcieport|nvidia) (?P<bdf>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): "
                      r"(?P<what>BAR \d+|bridge window)\b.*?(?:can't assign; no space|no space for|failed to assign)")
# the NVRM probe's own word for a BAR the firmware left unassigned ("NVRM: BAR1 is 0M @ 0x0 (PCI:...)")
BAR_ZERO = re.compile(r"NVRM: BAR\d is 0M @ 0x0\b")
RESIZE_FATAL = re.compile(r"NVRM: .*Fatal Error while attempting to resize PCIe BARs")
# "NVRM: GPU6 _kgspBootGspRm: ..." (NVIDIA/open-gpu-kernel-modules#1230) and without the GPU, as older drivers
# print it ("NVRM: _kgspBootGspRm: ...", aikitoria#9)
WPR2 = re.compile(r"NVRM: .*unexpected WPR2 already up")
# AMD's "Event logged [IO_PAGE_FAULT ...]"; Intel's "[DMA Read]" and, from kernel 5.13, "[DMA Read NO_PASID]", and
# the "DRHD: handling fault status" line that is all that stays once the kernel suppresses the rest
IO_PAGE_FAULT = re.compile(r"AMD-Vi.*IO_PAGE_FAULT|DMAR:\s*\[DMA (?:Read|Write)[^\]]*\]|"
                           r"DMAR: DRHD: handling fault status")


def kernel_log(text: str) -> dict[str, list[str]]:
    """The kernel lines the field pitfalls are read from, each list in log order."""
    out: dict[str, list[str]] = {"bar_no_space": [], "resize_fatal": [], "wpr2": [], "io_page_fault": []}
    for line in text.splitlines():
        if BAR_FAIL.search(line) or BAR_ZERO.search(line):
            out["bar_no_space"].append(line.strip())
        elif RESIZE_FATAL.search(line):
            out["resize_fatal"].append(line.strip())
        elif WPR2.search(line):
            out["wpr2"].append(line.strip())
        elif IO_PAGE_FAULT.search(line):
            out["io_page_fault"].append(line.strip())
    return out


# ------------------------------------------------------------------------------ modules (P34)

NVIDIA_KO = re.compile(r"(?:^|/)nvidia\.ko(?:\.(?:zst|xz|gz))?$")


# any nvidia kernel module's file: the fork's companions, and a distro's renamed ones (Debian's DKMS installs
# nvidia-current-open.ko, nvidia-current-open-drm.ko, ... under updates/dkms)
NVIDIA_ANY_KO = re.compile(r"(?:^|/)nvidia[-_\w]*\.ko(?:\.(?:zst|xz|gz))?$")


def initramfs_other_nvidia(listing: str) -> list[str]:
    """The nvidia modules in an `lsinitramfs` listing that are not where the fork installs (kernel/drivers/video/):
    a distro's (Debian's nvidia-current-open*.ko, DKMS's under updates/)."""
    return [ln.strip() for ln in listing.splitlines()
            if NVIDIA_ANY_KO.search(ln.strip()) and "/kernel/drivers/video/" not in f"/{ln.strip()}"]


def initramfs_nvidia(listing: str) -> list[str]:
    """The nvidia.ko paths in an `lsinitramfs` listing ("usr/lib/modules/<k>/.../nvidia.ko[.zst]")."""
    return [ln.strip() for ln in listing.splitlines() if NVIDIA_KO.search(ln.strip())]


# ------------------------------------------------------------------------- NCCL (P16, P30, P37)

NCCL_LIB = re.compile(r"\s(/\S*libnccl\.so[.\d]*)\s*$")
VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def maps_nccl(maps: str) -> list[str]:
    """The libnccl files a process has mapped (/proc/PID/maps), each once, in order."""
    seen: list[str] = []
    for line in maps.splitlines():
        m = NCCL_LIB.search(line)
        if m and m.group(1) not in seen:
            seen.append(m.group(1))
    return seen


def nccl_version(text: str) -> tuple[int, int, int] | None:
    """A version from a file name (libnccl.so.2.28.9), an NCCL log line ("NCCL version 2.27.5+cuda12.9")
    or the library's own version string ("2.28.9+cuda13.0")."""
    m = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)", text) or re.search(r"NCCL version (\d+\.\d+\.\d+)", text) \
        or re.search(r"(\d+\.\d+\.\d+)\+cuda\d", text)
    if not m:
        return None
    a, b, c = (int(x) for x in VERSION.match(m.group(1)).groups())
    return a, b, c


CHANNEL = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? : .*? via (?P<via>.+?)\s*(?:comm 0x\w+.*)?$")


def nccl_transports(lines: list[str]) -> list[str]:
    """The transports of NCCL_DEBUG=INFO channel lines ("P2P/direct pointer", "SHM/direct/direct", "direct
    shared memory" in older NCCL, "NET/IB/1/Shared"), each once, sorted."""
    return sorted({m.group("via") for ln in lines if (m := CHANNEL.search(ln))})


def transport_kind(via: str) -> str:
    """p2p | shm | net | other, for one transport name."""
    if via.startswith("P2P"):
        return "p2p"
    if via.startswith("SHM") or "shared memory" in via:
        return "shm"
    return "net" if via.startswith("NET") else "other"


def version_tuple(text: str) -> tuple[int, ...]:
    m = VERSION.match(text.strip())
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(x) for x in m.groups())


# NCCL's path types in order (src/graph/topo.h); nvidia-smi's NODE is NCCL's PHB (same CPU, other host bridge).
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
SMI_TO_NCCL = {"PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}


def nccl_default_level(cpu_vendor: str, gpu_count: int) -> str:
    """NCCL's default P2P level (src/graph/paths.cc, ncclTopoCheckP2p): PXB, except SYS for AMD x86
    hosts with at most two GPUs."""
    return "SYS" if "AMD" in cpu_vendor.upper() and gpu_count <= 2 else "PXB"


def nccl_level_needed(relation: str, cpu_vendor: str, gpu_count: int) -> str | None:
    """The NCCL_P2P_LEVEL the pair needs so NCCL takes P2P, or None where NCCL's default already does
    (NVLink, or a path within the default). Raises ValueError on a relation nvidia-smi does not print."""
    if relation.startswith("NV"):
        return None
    if relation not in SMI_TO_NCCL:
        raise ValueError(f"not an nvidia-smi topo relation: {relation!r}")
    need = SMI_TO_NCCL[relation]
    default = nccl_default_level(cpu_vendor, gpu_count)
    return None if P2P_LEVELS.index(need) <= P2P_LEVELS.index(default) else need


def nccl_level_allows(level: str, relation: str) -> bool:
    """Whether NCCL_P2P_LEVEL=level lets NCCL use P2P across `relation` (names, as NCCL reads them)."""
    if relation.startswith("NV"):
        return True
    return P2P_LEVELS.index(level.upper()) >= P2P_LEVELS.index(SMI_TO_NCCL[relation])


# --------------------------------------------------------------------------- cuobjdump (P39)

ELF_ARCH = re.compile(r"^ELF file\s+\d+:\s+\S*?\.?(sm_\d+[a-z]?)\.cubin\s*$")


def cuobjdump_archs(text: str) -> list[str]:
    """The SM architectures of `cuobjdump --list-elf` ("ELF file 1: x.1.sm_120a.cubin"), sorted, once each."""
    return sorted({m.group(1) for ln in text.splitlines() if (m := ELF_ARCH.match(ln.strip()))})


def arch_covers(built: list[str], want: str) -> bool:
    """Whether SASS for the GPU's own architecture was built ("sm_121" is covered by sm_121, sm_121a or
    sm_121f; sm_120 alone is not: its arch-specific kernels are what vLLM#36835 found dropped)."""
    wm = re.fullmatch(r"sm_(\d+)[a-z]?", want)
    if not wm:
        raise ValueError(f"not an SM architecture: {want!r}")
    return any(re.fullmatch(rf"sm_{wm.group(1)}[a-z]?", b) for b in built)
