"""rebar: the VRAM aperture (BAR1) covers the whole VRAM on every GPU; NVML agrees with sysfs."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.rules.findings import (
    FAIL,
    PASS,
    SKIP,
    Check,
    could_not,
    failed,
    figure,
    place,
    reading,
    reads,
    show,
    unknown,
    unreadable,
)

GIB = 1 << 30
FIX = ("enable Resizable BAR and Above 4G Decoding in the BIOS/UEFI setup; keep the GPU off a PLX switch; "
       "do not attach a monitor to a P2P GPU. The patched module resizes BAR1 to its largest size at load")


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n % GIB else f"{n // GIB} GiB"


def nvml_by_bus(nvml: dict) -> dict[str, dict]:
    if failed(nvml) or "gpus" not in nvml:
        return {}
    return {str(g.get("bus_id", "")).lower()[-12:]: g for g in nvml["gpus"]}


@reads("pci_gpus", "nvml")
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
        from_nvml = bool(nv) and isinstance(nv.get("memory_total"), int)
        vram = nv["memory_total"] if from_nvml else p.gpus.vram_gib * GIB
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
                          expected_context=f"({'VRAM from NVML' if from_nvml else 'VRAM from the profile'})"))
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


# ---------------------------------------------------------------- field pitfalls (shared/PITFALLS.md)


@reads("kernel_log", "pci_gpus")
def bar_assignment(f: dict, p: Profile) -> list[Check]:
    """P31: no BAR that could not be assigned, no failed resize at probe."""
    k = f.get("kernel_log")
    id_, title = "field.bar_assign", "kernel assigned every GPU BAR (no failed resize)"
    want = "no \"can't assign; no space\" / \"Fatal Error while attempting to resize PCIe BARs\""
    if unreadable(k):
        return [could_not(id_, title, k, want, "P31")]
    lines = k["bar_no_space"] + k["resize_fatal"]
    small = small_windows(f.get("pci_gpus"), p.gpus.vram_gib << 30)
    # the figure: the smallest BAR1 or bridge window short of VRAM (a kernel line alone carries no number)
    least = min(small, key=lambda x: x[1]) if small else None
    text = "; ".join([place(w, "{}" if (w, n) == least else show(n >> 20, "MiB")) for w, n in small] + lines[:3])
    return [reading(id_, title, FAIL if lines or small else PASS, least[1] >> 20 if least else None, "MiB",
                    want + f"; BAR1 and bridge window >= {p.gpus.vram_gib} GiB",
                    "the firmware left too little address space for BAR1 (it boots at 256 MiB and the resize fails; "
                  "a failed resize at probe leaves the GPU unbound): enable Above 4G Decoding and Resizable BAR "
                    "in the BIOS, disable CSM, then reboot", "P31",
                    text=text,
                    missing="; ".join(lines[:3]) or "no such kernel line, BAR1 and the bridge windows cover VRAM")]


def small_windows(gpus, vram: int) -> list[tuple[str, int]]:
    """P31 from sysfs: each GPU BAR1 or upstream bridge prefetchable window smaller than VRAM, as (what,
    with {} where its size goes; the size in bytes)."""
    out = []
    for g in gpus if isinstance(gpus, list) else []:
        if not isinstance(g, dict):
            continue
        if g.get("aperture") and g["aperture"]["size"] < vram:
            out.append((f"{g['bdf']} BAR1 {{}}", g["aperture"]["size"]))
        w = g.get("bridge_window") or {}
        if isinstance(w.get("prefetch_size"), int) and w["prefetch_size"] < vram:
            out.append((f"bridge {w['bdf']} above {g['bdf']}: prefetchable window {{}}", w["prefetch_size"]))
    return out
