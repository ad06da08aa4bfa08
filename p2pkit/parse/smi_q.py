"""`nvidia-smi -q` read the way a person reads it: what an owner pastes when NVML is not at hand
(`p2pkit doctor --from-paste`), and what the tests hold p2pkit's own readings (NVML, sysfs) against
on the same machine (tests/fixtures/h200-device/smi.txt). p2pkit does not run `nvidia-smi -q` on a
host: what it judges there (utilization, processes, BAR1) comes from NVML."""

from __future__ import annotations

import re

GPU_SECTION = re.compile(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\s*$")


def smi_q(text: str) -> dict:
    """`nvidia-smi -q` as nested dicts by indentation; GPUs under 'GPU <busid>' keys."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.strip().startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        if GPU_SECTION.match(raw):  # "GPU 00000000:00:06.0": a section whose name holds colons
            key, sep, value = raw.strip(), "", ""
        else:
            key, sep, value = raw.strip().partition(":")
            key = key.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if sep and value.strip():
            parent[key] = value.strip()
        else:
            child: dict = {}
            parent[key] = child
            stack.append((indent, child))
    return root


def smi_q_gpus(text: str) -> list[dict]:
    """The few -q facts p2pkit judges, per GPU."""
    doc = smi_q(text)
    out = []
    for key, gpu in doc.items():
        if not GPU_SECTION.match(key) or not isinstance(gpu, dict):
            continue
        pci = gpu.get("PCI", {})
        link = pci.get("GPU Link Info", {})
        gen = link.get("PCIe Generation", {})
        width = link.get("Link Width", {})
        bar1 = gpu.get("BAR1 Memory Usage", {})
        fb = gpu.get("FB Memory Usage", {})
        out.append({
            "bus_id": key[4:],
            "name": gpu.get("Product Name"),
            "bar1_total_mib": _mib(bar1.get("Total")),
            "fb_total_mib": _mib(fb.get("Total")),
            "gen_max": _int(gen.get("Max")),
            "gen_current": _int(gen.get("Current")),
            "width_max": _int(width.get("Max", "").rstrip("x")),
            "width_current": _int(width.get("Current", "").rstrip("x")),
            "replays": _int(pci.get("Replays Since Reset")),
            "util_gpu_pct": _int(str(gpu.get("Utilization", {}).get("GPU", "")).rstrip(" %")),
            "processes": 0 if gpu.get("Processes") == "None" else (None if "Processes" not in gpu else 1),
        })
    return out


def _mib(v: str | None) -> int | None:
    m = re.match(r"^(\d+)\s*MiB$", v or "")
    return int(m.group(1)) if m else None


def _int(v: str | None) -> int | None:
    v = (v or "").strip()
    return int(v) if v.isdigit() else None
