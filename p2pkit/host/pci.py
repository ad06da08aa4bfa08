"""NVIDIA GPUs from sysfs: ids, link, the resource table, resize bitmaps, the path up to the root."""

from __future__ import annotations

from pathlib import Path

from p2pkit.core.errors import ProbeError
from p2pkit.host import Host
from p2pkit.parse import pci as pp
from p2pkit.parse import system as ps

NVIDIA = "0x10de"
DEVICES = "/sys/bus/pci/devices"
# A few device ids worth naming; NVML gives the authoritative name when the driver is up.
NAMES = {
    "0x2b85": "NVIDIA GeForce RTX 5090",
    "0x2b87": "NVIDIA GeForce RTX 5090 D",
    "0x2684": "NVIDIA GeForce RTX 4090",
    "0x2335": "NVIDIA H200",
    "0x2330": "NVIDIA H100 80GB HBM3",
}


def _get(host: Host, bdf: str, name: str, errors: list[str]) -> str | None:
    try:
        return host.read(f"{DEVICES}/{bdf}/{name}", f"{name} of {bdf}").strip()
    except ProbeError as e:
        errors.append(e.message)
        return None


def _udev_bdfs() -> list[str] | None:
    """On the real root, udev's view of the PCI bus (None where pyudev or libudev is missing)."""
    try:
        import pyudev

        ctx = pyudev.Context()
        return sorted(d.sys_name for d in ctx.list_devices(subsystem="pci"))
    except Exception:  # ImportError, or libudev not loadable
        return None


def gpu_bdfs(host: Host) -> list[str]:
    """Display-class (0x03xxxx) functions with NVIDIA's vendor id, in bus order: the kernel's own list
    (/sys/bus/pci/devices, what lspci's sysfs method reads), with udev's view on the real root beside it.
    udev alone is not enough: libudev (systemd 251 and later) opens only paths that are on sysfs itself,
    so a function it cannot open (an overlaid /sys in a container) is missing from its list, not the bus."""
    out = []
    udev = _udev_bdfs() if host.root == Path("/") else None
    for bdf in sorted(set(host.listdir(DEVICES)) | set(udev or ())):
        try:
            vendor = host.read(f"{DEVICES}/{bdf}/vendor").strip()
            cls = host.read(f"{DEVICES}/{bdf}/class").strip()
        except ProbeError:
            continue
        if vendor == NVIDIA and cls.startswith("0x03"):
            out.append(bdf)
    return out


def port_type(host: Host, bdf: str) -> str | None:
    try:
        cfg = host.read_bytes(f"{DEVICES}/{bdf}/config")
    except ProbeError:
        return None
    t = pp.pcie_port_type(cfg)
    return pp.PORT_TYPES.get(t, f"type {t}") if t is not None else None


def bridge_window(host: Host, bdf: str) -> dict:
    """The upstream bridge's prefetchable window (P31: a window smaller than VRAM leaves BAR1 no room)."""
    try:
        w = pp.bridge_prefetch_window(pp.resources(host.read(f"{DEVICES}/{bdf}/resource", f"resource of {bdf}")))
    except (ProbeError, ValueError) as e:
        return {"error": getattr(e, "message", str(e))}
    return {"bdf": bdf, "prefetch_size": w.size if w else None}


def gpu(host: Host, bdf: str) -> dict:
    errors: list[str] = []
    device = _get(host, bdf, "device", errors)
    cur_speed = _get(host, bdf, "current_link_speed", errors)
    max_speed = _get(host, bdf, "max_link_speed", errors)
    cur_width = _get(host, bdf, "current_link_width", errors)
    max_width = _get(host, bdf, "max_link_width", errors)
    fact: dict = {
        "bdf": bdf,
        "device_id": device,
        "name": NAMES.get(device or "", f"NVIDIA device {device}"),
        "link": {
            "current_gen": pp.link_gen(cur_speed) if cur_speed else None,
            "current_width": pp.link_width(cur_width) if cur_width else None,
            "max_gen": pp.link_gen(max_speed) if max_speed else None,
            "max_width": pp.link_width(max_width) if max_width else None,
            "current_speed": cur_speed,
            "max_speed": max_speed,
        },
    }
    res_text = _get(host, bdf, "resource", errors)
    fact["aperture"] = None
    if res_text is not None:
        try:
            res = pp.resources(res_text)
            ap = pp.vram_aperture(res)
            if ap is not None:
                fact["aperture"] = {"index": ap.index, "size": ap.size, "flags": hex(ap.flags)}
                resize = f"resource{ap.index}_resize"
                if host.exists(f"{DEVICES}/{bdf}/{resize}"):
                    sizes = pp.resize_sizes(host.read(f"{DEVICES}/{bdf}/{resize}"))
                    fact["aperture"]["resizable_to"] = sizes
        except ValueError as e:
            errors.append(f"could not determine the BAR table of {bdf}: {e}")
    real = host.realpath(f"{DEVICES}/{bdf}")
    chain = pp.upstream_chain(real)
    fact["sysfs_path"] = real
    fact["upstream"] = [{"bdf": b, "port_type": port_type(host, b)} for b in chain[:-1]]
    if fact["upstream"]:
        parent = fact["upstream"][-1]["bdf"]
        pe: list[str] = []
        ps_, pw = _get(host, parent, "max_link_speed", pe), _get(host, parent, "max_link_width", pe)
        fact["parent_link"] = {"bdf": parent, "max_gen": pp.link_gen(ps_) if ps_ else None,
                               "max_width": pp.link_width(pw) if pw else None}
        fact["bridge_window"] = bridge_window(host, parent)
    group = f"{DEVICES}/{bdf}/iommu_group"
    if host.exists(group):
        gtype = host.path(group) / "type"
        fact["iommu_group"] = ps.iommu_group_type(gtype.read_text()) if gtype.exists() else "unknown"
    else:
        fact["iommu_group"] = "none"  # no IOMMU translation for this device
    fact["errors"] = errors
    return fact


def gpus(host: Host) -> list[dict]:
    return [gpu(host, b) for b in gpu_bdfs(host)]
