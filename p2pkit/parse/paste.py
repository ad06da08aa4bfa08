"""What owners paste when they ask for help: `lspci -v`/`-vv`, the NVIDIA installer's log (and the
fork's install.sh `rmmod` lines), CMake's configure output, `nvidia-smi -q`. Each reader keeps what
a check needs and says when the paste holds too little to tell (a truncated paste is never a pass).
Sources of the recorded pastes: tests/fixtures/paste/README.md."""

from __future__ import annotations

import re

from p2pkit.parse import field, smi_q

KINDS = {
    "lspci": "`lspci -v` / `lspci -vv` (BAR regions and sizes, the Resizable BAR capability, bridge windows); "
             "`sudo lspci -vvv` (or its ACSCtl lines) for ACS redirect",
    "nvidia-installer": "the NVIDIA installer's output or /var/log/nvidia-installer.log, or install.sh's rmmod lines",
    "cmake": "CMake's configure or build output (the engine build; nvcc's \"Unsupported gpu architecture\")",
    "nvidia-smi-q": "`nvidia-smi -q`",
    "simpleP2P": "the CUDA samples' simpleP2P (peer access, its copies read back, CUDA's error names)",
    "p2pBandwidthLatencyTest": "the CUDA samples' p2pBandwidthLatencyTest (peer access, bandwidth with P2P off and "
                               "on, its Cuda failure line)",
    "nccl-log": "an NCCL, PyTorch, vLLM or llama.cpp log or crash (NCCL INFO/WARN lines, ProcessGroupNCCL's "
                "watchdog, NCCL and CUDA errors, a CPU-only torch's \"Torch not compiled with CUDA enabled\"), with "
                "or without NCCL's version line",
    "kernel-log": "the kernel log (`sudo dmesg`, `journalctl -k`): BAR assignment and resize, \"unexpected WPR2 "
                  "already up\", IOMMU faults (AMD-Vi IO_PAGE_FAULT, Intel DMAR)",
}

LSPCI_HEAD = re.compile(r"^((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+([^:]+):\s*(.*)$")
REGION = re.compile(r"^\s*(?:Region (\d+): )?Memory at (\S+) \(([^)]*)\)(.*?)\[size=(\d+)([KMGT]?)\]")
REBAR = re.compile(r"^\s*BAR (\d+): current size: (\d+)([KMGT]B)")
SECONDARY = re.compile(r"^\s*Bus: primary=([0-9a-f]{2}), secondary=([0-9a-f]{2})")
BEHIND = re.compile(r"^\s*Prefetchable memory behind bridge: (\S+)-(\S+)(?:.*\[size=(\d+)([KMGT]?)\])?")
UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
        "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def kind(text: str) -> str | None:
    """Which known output a paste is, by the lines only that tool prints."""
    if re.search(r"simpleP2P\] - Starting|^> Peer access from .+ : (?:Yes|No)|Verification error @ element|"
                 r"cudaMemcpyPeer / cudaMemcpy between", text, re.M):
        return "simpleP2P"
    if re.search(r"P2P \(Peer-to-Peer\) GPU Bandwidth Latency Test|P2P Connectivity Matrix|P2P=(?:Enabled|Disabled)"
                 r".*Matrix \((?:GB/s|us)\)|p2pBandwidthLatencyTest\.cu", text):
        return "p2pBandwidthLatencyTest"
    # CUDA's own errors as each program words them: PyTorch "CUDA error: MSG", llama.cpp "CUDA error 217 at FILE:LINE:",
    # vLLM's custom all-reduce "Cuda error FILE:LINE 'MSG'", a cudaError name; NCCL's bare version line on rank 0
    if re.search(r"NCCL (?:INFO|WARN)|ProcessGroupNCCL|WorkNCCL|\bnccl[A-Z]\w+Error\b|DistBackendError|NCCL error in:|"
                 r"Cuda failure (?:\d+ )?'|Torch not compiled with CUDA enabled|CUDA error(?: \d+ at \S+:|:) |"
                 r"Cuda error \S+:\d+ '|\bcudaError[A-Z]\w+|^NCCL version \d", text, re.M):
        return "nccl-log"
    if re.search(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\s*$", text, re.M) and \
            "Product Name" in text:
        return "nvidia-smi-q"
    if re.search(r"An NVIDIA kernel module '[^']+' appears to", text) or "nvidia-installer" in text or \
            re.search(r"^rmmod: ERROR: Module nvidia", text, re.M):
        return "nvidia-installer"
    if re.search(r"^CMake (Error|Warning)|^-- (The CUDA compiler identification|Configuring)|nvcc fatal\s*:", text,
                 re.M):
        return "cmake"
    if any(field.kernel_log(text).values()) or re.search(r"^\s*\[\s*\d+\.\d+\] |^\w{3} [ \d]\d [\d:]{8} \S+ kernel: ",
                                                          text, re.M):
        return "kernel-log"  # a line the field pitfalls read, or dmesg's timestamps / journalctl's "kernel:"
    if any(LSPCI_HEAD.match(ln) for ln in text.splitlines()) or re.search(r"^\s*ACSCtl:", text, re.M):
        return "lspci"
    return None


def lspci(text: str) -> list[dict]:
    """Devices of an `lspci -v`/`-vv` paste: address, class, description, whether NVIDIA's GPU, the
    memory regions (size in bytes, 64-bit, prefetchable, disabled), the Resizable BAR capability's
    current sizes, a bridge's prefetchable window."""
    out: list[dict] = []
    dev: dict | None = None
    for line in text.splitlines():
        m = LSPCI_HEAD.match(line)
        if m:
            cls, desc = m.group(2).strip(), m.group(3)
            dev = {"bdf": m.group(1), "class": cls, "description": desc,
                   "gpu": "NVIDIA" in desc and ("VGA" in cls or "3D" in cls),
                   "regions": [], "rebar_current": {}, "bridge_prefetch": None, "secondary_bus": None}
            out.append(dev)
            continue
        if dev is None:
            continue
        r = REGION.match(line)
        if r:
            attrs = r.group(3)
            dev["regions"].append({"index": int(r.group(1)) if r.group(1) else None,
                                   "size": int(r.group(5)) * UNIT[r.group(6)], "bits64": "64-bit" in attrs,
                                   "prefetchable": "non-prefetchable" not in attrs and "prefetchable" in attrs,
                                   "disabled": "[disabled]" in r.group(4), "unassigned": r.group(2) == "<unassigned>"})
            continue
        b = REBAR.match(line)
        if b:
            dev["rebar_current"][int(b.group(1))] = int(b.group(2)) * UNIT[b.group(3)]
            continue
        sb = SECONDARY.match(line)
        if sb:
            dev["secondary_bus"] = sb.group(2)
            continue
        w = BEHIND.match(line)
        if w:
            if w.group(3):
                dev["bridge_prefetch"] = int(w.group(3)) * UNIT[w.group(4)]
            else:
                dev["bridge_prefetch"] = int(w.group(2), 16) - int(w.group(1), 16) + 1
    return out


def bar1_size(dev: dict) -> tuple[int | None, str]:
    """A GPU's BAR1 from a paste: the largest 64-bit prefetchable region, else the Resizable BAR
    capability's current size of BAR 1; (None, why) when the paste shows neither."""
    pref = [r for r in dev["regions"] if r["bits64"] and r["prefetchable"]]
    if pref:
        r = max(pref, key=lambda x: x["size"])
        return r["size"], f"Region {r['index']}" if r["index"] is not None else "the largest prefetchable region"
    if 1 in dev["rebar_current"]:
        return dev["rebar_current"][1], "Resizable BAR capability, BAR 1 current size"
    return None, "no memory region and no Resizable BAR capability in the paste (cut short, or lspci without -v)"


def installer(text: str) -> dict:
    """The NVIDIA installer's (or install.sh's) words about modules that could not be replaced."""
    loaded = re.findall(r"An NVIDIA kernel module '([^']+)' appears to (?:already be|be already) loaded", text)
    in_use = re.findall(r"^rmmod: ERROR: Module (\S+) is in use(?: by: (.*))?$", text, re.M)
    return {"loaded": sorted(set(loaded)), "rmmod_in_use": [{"module": m, "by": b.split()} for m, b in in_use],
            "failed": "Installation has failed" in text}


def cmake(text: str) -> dict:
    """CMake's configure errors: the CUDA compiler not found, no default CUDA architecture, and the
    other `CMake Error` headlines."""
    return {"no_cuda_compiler": "No CMAKE_CUDA_COMPILER could be found" in text
            or "CMAKE_CUDA_COMPILER-NOTFOUND" in text,
            "no_default_arch": "Failed to detect a default CUDA architecture" in text,
            "errors": re.findall(r"^CMake Error.*$", text, re.M),
            # nvcc refusing an architecture it does not build (too old for this toolkit, or too new)
            "unsupported_arch": sorted(set(re.findall(r"nvcc fatal\s*:\s*Unsupported gpu architecture '([^']*)'",
                                                      text))),
            "incomplete": "Configuring incomplete" in text}


def smi(text: str) -> list[dict]:
    return smi_q.smi_q_gpus(text)
