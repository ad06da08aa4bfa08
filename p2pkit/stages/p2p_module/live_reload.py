"""Swap the loaded NVIDIA module for the patched one without a reboot, when that is safe.

Decided here from what p2pkit reads before the build: p2p_module.live_reload on, the kernel command
line need not change (IOMMU already as the profile wants), and with Secure Boot the signing key is
enrolled. Where all hold, the role swaps it (tasks/reload.yml, p2pkit_p2p_module_live_reload): it
compares the installed and the loaded srcversion, refuses while a process holds /dev/nvidia* (a
display server counts), unloads in dependency order (the role's p2pkit_p2p_module_reload_modules),
loads, and checks the loaded srcversion. Its report (done, why, holders) comes back through the
p2pkit_tasks callback. Anything else is reported and falls back to the reboot path; an unload that
fails is reported with its message, never ignored (install.sh's silent rmmod).
"""

from __future__ import annotations

from p2pkit.facts import collect as facts
from p2pkit.host import system
from p2pkit.parse.system import iommu_intent

REPORT = "p2pkit_p2p_module_live_reload_report"  # the role's fact, kept by the p2pkit_tasks callback


def refusal(ctx) -> dict | None:
    """Why the role must not try a live reload, from facts read before the build; None: it may."""
    p = ctx.profile.p2p_module
    if not p.live_reload:
        return {"done": False, "why": "p2p_module.live_reload is off"}
    host = ctx.host
    intent = iommu_intent(system.cmdline(host), system.cpu_vendor(host)).mode
    if intent != p.iommu:
        return {"done": False, "why": "the kernel command line changes at the next boot"}
    f = facts.collect(host, ["mok"], ctx.profile)
    if f["mok"].get("needed") and f["mok"].get("enrolment") not in ("enrolled", "in-db"):
        # the kernel refuses the signed module until MokManager enrols its key: unloading the one that
        # works now would leave the GPUs without a driver until the reboot
        return {"done": False, "why": "Secure Boot: the signing key is enrolled at the next boot (MokManager)"}
    return None


def reported(ran: dict) -> dict:
    """The role's live reload as it reported it: done, why, and the holders where some held the GPUs."""
    found = [t["report"][REPORT] for t in ran.get("tasks", {}).values()
             if isinstance(t, dict) and REPORT in (t.get("report") or {})]
    if not found:
        return {"done": False, "why": f"the role reported no live reload (its log: {ran.get('log')})"}
    r = found[-1]
    out = {"done": r.get("done") is True, "why": str(r.get("why", ""))}
    if r.get("holders"):
        out["holders"] = [{"pid": int(h["pid"]), "command": str(h["command"])} for h in r["holders"]]
    return out
