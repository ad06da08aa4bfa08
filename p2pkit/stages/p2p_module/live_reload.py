"""Swap the loaded NVIDIA module for the patched one without a reboot, when that is safe.

Only when the kernel command line need not change (IOMMU already as the profile wants) and no
process holds /dev/nvidia* (a display server counts). Unloads in dependency order, loads, and
checks the loaded srcversion. Anything else is reported and falls back to the reboot path; an
unload that fails is reported with its message, never ignored (install.sh's silent rmmod).
"""

from __future__ import annotations

import re

from p2pkit.facts import collect as facts
from p2pkit.host import Host, system
from p2pkit.parse.system import iommu_intent

UNLOAD_ORDER = ["nvidia_peermem", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]


def holders(host: Host) -> list[dict]:
    devs = [str(host.path(f"/dev/{d}")) for d in host.listdir("/dev") if d.startswith("nvidia")]
    if not devs:
        return []
    r = host.runner.run(["fuser", "-v", *devs], check=False)
    out = []
    for line in r.stderr.splitlines():
        m = re.search(r"\s(\d+)\s+[Ffrcem.]{5}\s+(\S+)\s*$", line)
        if m:
            out.append({"pid": int(m.group(1)), "command": m.group(2)})
    return out


def loaded_modules(host: Host) -> list[str]:
    return [m for m in UNLOAD_ORDER if host.exists(f"/sys/module/{m}")]


def try_live_reload(ctx) -> dict:
    p = ctx.profile.p2p_module
    if not p.live_reload:
        return {"done": False, "why": "p2p_module.live_reload is off"}
    host = ctx.host
    intent = iommu_intent(system.cmdline(host), system.cpu_vendor(host)).mode
    if intent != p.iommu:
        return {"done": False, "why": "the kernel command line changes at the next boot"}
    f = facts.collect(host, ["module", "built_module", "mok"], ctx.profile)
    if f["mok"].get("needed") and f["mok"].get("enrolment") not in ("enrolled", "in-db"):
        # the kernel refuses the signed module until MokManager enrols its key: unloading the one that
        # works now would leave the GPUs without a driver until the reboot
        return {"done": False, "why": "Secure Boot: the signing key is enrolled at the next boot (MokManager)"}
    built, loaded = f["built_module"].get("srcversion"), f["module"].get("loaded_srcversion")
    if built is None or loaded == built:
        return {"done": False, "why": "nothing to swap"}
    held = holders(host)
    if held:
        names = ", ".join(f"{h['command']} (pid {h['pid']})" for h in held)
        return {"done": False, "holders": held,
                "why": f"{names} hold(s) /dev/nvidia*: stop them (a display server counts) or reboot"}
    mods = loaded_modules(host)
    if mods:
        r = host.runner.run(["modprobe", "-r", *mods], check=False)
        if r.returncode != 0:
            return {"done": False, "why": f"unloading {' '.join(mods)} failed: {r.stderr.strip() or r.stdout.strip()}"}
    r = host.runner.run(["modprobe", "nvidia"], check=False)
    if r.returncode != 0:
        return {"done": False, "why": f"loading the patched module failed: {r.stderr.strip()}"}
    now = facts.collect(host, ["module"], ctx.profile)["module"].get("loaded_srcversion")
    if now != built:
        return {"done": False, "why": f"after the reload the loaded srcversion is {now}, not the built {built}"}
    return {"done": True, "why": f"swapped live: {' '.join(mods) or 'no module was loaded'}; loaded {built}"}
