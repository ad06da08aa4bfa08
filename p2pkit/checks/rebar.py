"""rebar: the VRAM aperture (BAR1) covers the whole VRAM on every GPU; NVML agrees with sysfs."""

from __future__ import annotations

from p2pkit.checks import FAIL, PASS, SKIP, Check, failed, figure, unknown
from p2pkit.config import Profile

GIB = 1 << 30
MIB = 1 << 20
FIX = ("enable Resizable BAR and Above 4G Decoding in the BIOS/UEFI setup; keep the GPU off a PLX switch; "
       "do not attach a monitor to a P2P GPU. The patched module resizes BAR1 to its largest size at load")


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n % GIB else f"{n // GIB} GiB"


def nvml_by_bus(nvml: dict) -> dict[str, dict]:
    if failed(nvml) or "gpus" not in nvml:
        return {}
    return {str(g.get("bus_id", "")).lower()[-12:]: g for g in nvml["gpus"]}


def check(f: dict, p: Profile) -> list[Check]:
    gpus = f.get("pci_gpus")
    if failed(gpus):
        return [unknown("rebar.gpus", "GPUs in sysfs", gpus, "NVIDIA GPUs")]
    if not gpus:
        return [figure("rebar.gpus", "GPUs in sysfs", 0, "==", p.gpus.count, "count",
                       "no NVIDIA GPU in /sys/bus/pci/devices: see preflight")]
    by_bus = nvml_by_bus(f.get("nvml", {}))
    out = []
    for g in gpus:
        bdf = g["bdf"]
        nv = by_bus.get(bdf.lower()[-12:])
        vram = nv["memory_total"] if nv and isinstance(nv.get("memory_total"), int) else p.gpus.vram_gib * GIB
        floor = max(vram, p.pcie.bar1_min_gib * GIB)
        ap = g.get("aperture")
        title = f"BAR1 of {bdf} covers VRAM"
        if ap is None:
            why = "; ".join(g.get("errors", [])) or "no 64-bit prefetchable memory BAR in the resource table"
            out.append(Check(f"rebar.bar1.{bdf}", title, FAIL, f"could not determine: {why}", f">= {_gib(floor)}",
                             FIX))
            continue
        hint = FIX
        bigger = [s for s in ap.get("resizable_to", []) if s >= floor]
        if bigger:
            hint += f"; this card offers {_gib(max(bigger))} (resource{ap['index']}_resize)"
        out.append(figure(f"rebar.bar1.{bdf}", title, ap["size"] / GIB, ">=", floor / GIB, "GiB", hint,
                          context=f"at resource{ap['index']}",
                          expected_context=f"({'VRAM from NVML' if nv else 'VRAM from the profile'})"))
        if nv is None:
            out.append(Check(f"rebar.nvml.{bdf}", f"NVML bar1Total of {bdf} agrees with sysfs", SKIP,
                             f"could not determine: {f.get('nvml', {}).get('error', 'GPU not in NVML')}",
                             _gib(ap["size"])))
        else:
            b1 = nv.get("bar1_total")
            out.append(figure(f"rebar.nvml.{bdf}", f"NVML bar1Total of {bdf} agrees with sysfs",
                              b1 / GIB if isinstance(b1, int) else None, "==", ap["size"] / GIB, "GiB",
                              "NVML and sysfs disagree on BAR1: reload the driver (or reboot) after changing BIOS "
                              "settings", missing=f"not read: {b1}", expected_context="(sysfs)"))
    return out or [Check("rebar.gpus", "GPUs", PASS, 0, 0)]
