"""Pasted outputs judged (`p2pkit doctor --from-paste`): each known kind gives findings with the
pitfall it shows and its fix; a paste too short to tell gives "could not determine", never a pass."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.parse import field as pf
from p2pkit.parse import paste as pp
from p2pkit.rules.findings import FAIL, PASS, SKIP, Check, figure
from p2pkit.stages.engine.checks import NO_CUDA_COMPILER, NO_DEFAULT_ARCH
from p2pkit.stages.rebar.checks import FIX as REBAR_FIX
from p2pkit.stages.topology.checks import acs_redirect

GIB = 1 << 30
P31_FIX = (REBAR_FIX + ". When the kernel cannot fit the window (\"BAR 1 ... can't assign; no space\"), enable Above "
           "4G Decoding and Resizable BAR and disable CSM in the BIOS, then reboot")
MODULE_IN_USE_FIX = ("the installer could not replace the loaded module, so the old one stays (and install.sh carries "
                     "on after rmmod fails): stop what holds the GPU (the display manager, nvidia-persistenced, "
                     "CUDA programs), unload in order nvidia_drm nvidia_modeset nvidia_uvm nvidia (or boot to "
                     "multi-user.target without a display on the GPUs), then install again; `p2pkit up --from "
                     "p2p-module` does this and proves the loaded srcversion is the built one")


def could_not(id_: str, title: str, why: str, expected, pitfall: str) -> Check:
    return Check(id_, title, SKIP, f"could not determine: {why}", expected, "paste the whole output", pitfall)


def check(kind: str, text: str, p: Profile) -> list[Check]:
    return {"lspci": lspci, "nvidia-installer": installer, "cmake": cmake, "nvidia-smi-q": smi_q}[kind](text, p)


def lspci(text: str, p: Profile) -> list[Check]:
    """P31 (and rebar) from `lspci -v`/`-vv`: each NVIDIA GPU's BAR1 and the prefetchable window of
    the bridge above it (the one whose secondary bus is the GPU's) hold the whole VRAM; P29 where the
    paste shows ACS control (`sudo lspci -vvv`, or its ACSCtl lines alone)."""
    acs = _acs(text, p)
    if acs and not pp.lspci(text):
        return acs  # `lspci -vvv | grep ACSCtl`: no device lines, nothing to say of BAR1
    return _bars(text, p) + acs


def _acs(text: str, p: Profile) -> list[Check]:
    """P29 judged by the topology stage's own rule over the ports the paste shows: ACSCtl flags, or
    "Capabilities: <access denied>" (lspci run without root) as a port that could not be read."""
    ports = []
    for x in pf.lspci_acs(text):
        bdf = x["bdf"] or f"(line {len(ports) + 1}, no device in the paste)"
        if x["denied"] and x["flags"] is None:
            ports.append({"bdf": bdf, "error": "lspci ran without root (Capabilities: <access denied>)",
                          "by_hand": "sudo lspci -vvv | grep -E '^[0-9a-f]|ACSCtl'"})
        elif x["flags"] is not None:
            ports.append({"bdf": bdf, "flags": x["flags"]})
    return acs_redirect({"acs": {"ports": ports}}, p) if ports else []


def _bars(text: str, p: Profile) -> list[Check]:
    vram = p.gpus.vram_gib * GIB
    devs = pp.lspci(text)
    gpus = [d for d in devs if d["gpu"]]
    want = f">= {p.gpus.vram_gib} GiB (VRAM, profile {p.name})"
    if not gpus:
        return [could_not("paste.bar1", "BAR1 of each NVIDIA GPU covers VRAM", "no NVIDIA VGA or 3D controller in "
                          "the paste", want, "P31")]
    out = []
    for g in gpus:
        size, where = pp.bar1_size(g)
        title = f"BAR1 of {g['bdf']} covers VRAM"
        if size is None:
            out.append(could_not(f"paste.bar1.{g['bdf']}", title, where, want, "P31"))
            continue
        unit, scale = _unit(size)
        out.append(figure(f"paste.bar1.{g['bdf']}", title, size / scale, ">=", vram / scale, unit, P31_FIX, "P31",
                          context=where, expected_context=f"(VRAM, profile {p.name})"))
        bus = g["bdf"].split(":")[-2].lower()
        for b in (d for d in devs if d["secondary_bus"] == bus and d["bridge_prefetch"] is not None):
            unit, scale = _unit(b["bridge_prefetch"])
            out.append(figure(f"paste.bridge_window.{b['bdf']}", f"bridge {b['bdf']} above {g['bdf']} has room for "
                              "BAR1", b["bridge_prefetch"] / scale, ">=", vram / scale, unit, P31_FIX, "P31",
                              text="prefetchable window {}", expected_context=f"(VRAM, profile {p.name})"))
    return out


def installer(text: str, p: Profile) -> list[Check]:
    """P34 from the installer's log or install.sh's rmmod lines: a module in use was not replaced."""
    r = pp.installer(text)
    held = r["loaded"] + [m["module"] + (f" (used by {', '.join(m['by'])})" if m["by"] else "")
                          for m in r["rmmod_in_use"]]
    title = "the new kernel module replaced the loaded one"
    if held:
        return [Check("paste.module_in_use", title, FAIL, "in use, not replaced: " + "; ".join(held)
                      + ("; installation failed" if r["failed"] else ""), "no module in use during the install",
                      MODULE_IN_USE_FIX, "P34")]
    if r["failed"]:
        return [Check("paste.module_in_use", title, FAIL, "installation failed, for a reason the paste does not "
                      "show", "installed", "paste /var/log/nvidia-installer.log whole", "P34")]
    return [Check("paste.module_in_use", title, PASS, "no module in use, no failure", "no module in use")]


def cmake(text: str, p: Profile) -> list[Check]:
    """P05 from CMake's configure output: no CUDA compiler, no default CUDA architecture."""
    r = pp.cmake(text)
    out = []
    if r["no_cuda_compiler"]:
        out.append(Check("paste.cuda_compiler", "CMake finds the CUDA compiler", FAIL,
                         "No CMAKE_CUDA_COMPILER could be found", "nvcc of CUDA >= " + p.engine.cuda_min,
                         NO_CUDA_COMPILER, "P05"))
    if r["no_default_arch"]:
        out.append(Check("paste.cuda_arch", "CMake compiles for the GPU's architecture", FAIL,
                         "Failed to detect a default CUDA architecture", f"CMAKE_CUDA_ARCHITECTURES="
                         f"{p.engine.cuda_architectures}", NO_DEFAULT_ARCH, "P05"))
    if out:
        return out
    if r["errors"]:
        return [Check("paste.cmake", "CMake configures", FAIL, "; ".join(r["errors"][:3]), "no CMake Error",
                      "read the lines after each CMake Error; `p2pkit up --from engine` keeps the whole log")]
    return [could_not("paste.cmake", "CMake configures", "no CMake Error and no end of configuration in the paste",
                      "-- Configuring done", "P05")] if "Configuring done" not in text else \
        [Check("paste.cmake", "CMake configures", PASS, "Configuring done", "no CMake Error")]


def smi_q(text: str, p: Profile) -> list[Check]:
    """P31 (and rebar) from `nvidia-smi -q`: BAR1 Memory Usage Total holds FB Memory Usage Total."""
    gpus = pp.smi(text)
    if not gpus:
        return [could_not("paste.bar1", "BAR1 of each GPU covers VRAM", "no GPU section in the paste", "BAR1 >= FB",
                          "P31")]
    out = []
    for g in gpus:
        id_, title = f"paste.bar1.{g['bus_id']}", f"BAR1 of {g['bus_id']} covers VRAM"
        if g["bar1_total_mib"] is None or g["fb_total_mib"] is None:
            out.append(could_not(id_, title, "no BAR1 or FB Memory Usage Total in the paste", "BAR1 >= FB", "P31"))
            continue
        out.append(figure(id_, title, g["bar1_total_mib"], ">=", g["fb_total_mib"], "MiB", P31_FIX, "P31",
                          text="BAR1 {}", expected_context="(FB Memory Usage Total)"))
    return out


def _unit(n: int) -> tuple[str, int]:
    """The unit a size is shown in: GiB from one GiB up, MiB below (a 256 MiB BAR1)."""
    return ("GiB", GIB) if n >= GIB else ("MiB", 1 << 20)
