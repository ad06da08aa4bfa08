"""sysfs PCI files: link speed, resource table, resize bitmap, the path to the root complex."""

from __future__ import annotations

import re
from dataclasses import dataclass

GTS_TO_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
GEN_TO_GTS = {v: float(k) for k, v in GTS_TO_GEN.items()}
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def link_gen(speed: str) -> int | None:
    """'32.0 GT/s PCIe' -> 5; 'Unknown' -> None; kernels <= 5.6 omit ' PCIe'."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", speed)
    if not m:
        return None
    value = m.group(1) if "." in m.group(1) else m.group(1) + ".0"
    return GTS_TO_GEN.get(value)


def link_width(text: str) -> int | None:
    t = text.strip()
    return int(t) if t.isdigit() and int(t) > 0 else None


@dataclass(frozen=True)
class Resource:
    index: int
    start: int
    end: int
    flags: int

    @property
    def size(self) -> int:
        return self.end - self.start + 1 if self.end > self.start else 0

    @property
    def is_prefetchable_mem64(self) -> bool:
        need = IORESOURCE_MEM | IORESOURCE_PREFETCH | IORESOURCE_MEM_64
        return self.flags & need == need


def resources(text: str) -> list[Resource]:
    out = []
    for i, line in enumerate(text.splitlines()):
        parts = line.split()
        if len(parts) != 3:
            raise ValueError(f"resource line {i} is not 'start end flags': {line!r}")
        start, end, flags = (int(p, 16) for p in parts)
        out.append(Resource(i, start, end, flags))
    return out


def vram_aperture(res: list[Resource]) -> Resource | None:
    """The largest 64-bit prefetchable memory BAR (BAR1 on GeForce is index 1; index 2 on the H200 VM)."""
    cands = [r for r in res[:6] if r.size and r.is_prefetchable_mem64]
    return max(cands, key=lambda r: r.size, default=None)


def bridge_prefetch_window(res: list[Resource]) -> Resource | None:
    """A bridge's prefetchable memory window from its sysfs resource table: the kernel lists a bridge's
    windows after its own BARs, ROM and the SR-IOV slots (index 7 on, PCI_BRIDGE_RESOURCES: I/O,
    memory, prefetchable memory); the largest prefetchable memory one is where the GPU's BAR1 must fit."""
    cands = [r for r in res[7:] if r.size and r.flags & (IORESOURCE_MEM | IORESOURCE_PREFETCH)
             == IORESOURCE_MEM | IORESOURCE_PREFETCH]
    return max(cands, key=lambda r: r.size, default=None)


def resize_sizes(bitmap_hex: str) -> list[int]:
    """resourceN_resize: bit n set means 2^(n+20) bytes is supported."""
    v = int(bitmap_hex.strip(), 16)
    return [1 << (n + 20) for n in range(64) if v >> n & 1]


def upstream_chain(realpath: str) -> list[str]:
    """BDFs from the root complex down to the device, from the device's sysfs realpath."""
    return [p for p in realpath.split("/") if BDF.match(p)]


PORT_TYPES = {0: "endpoint", 1: "legacy endpoint", 4: "root port", 5: "switch upstream",
              6: "switch downstream", 7: "pcie-to-pci bridge", 8: "pci-to-pcie bridge", 9: "rc endpoint",
              10: "rc event collector"}


def pcie_port_type(config: bytes) -> int | None:
    """Walk the capability list of a config space dump to the PCIe capability (id 0x10)."""
    if len(config) < 0x40 or not config[0x06] & 0x10:
        return None
    ptr = config[0x34] & 0xFC
    seen = set()
    while ptr and ptr not in seen and ptr + 3 < len(config):
        seen.add(ptr)
        if config[ptr] == 0x10:
            return (config[ptr + 2] >> 4) & 0xF
        ptr = config[ptr + 1] & 0xFC
    return None
