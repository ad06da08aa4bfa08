"""p2p-module: the patched open module is installed, preferred by modprobe, and loaded."""

from __future__ import annotations

from p2pkit.checks import Check, failed, judge, unknown
from p2pkit.checks.driver import RESTORE_FIX
from p2pkit.config import Profile


def precheck(p: Profile) -> list[Check]:
    return [judge("p2p.commit", "fork commit pinned", len(p.p2p_module.commit) >= 7,
                  p.p2p_module.commit or "(empty)", "a commit id",
                  f"set p2p_module.commit to the commit of {p.p2p_module.branch} you reviewed: `sudo p2pkit up "
                  "--pin` or `p2pkit pin --fork DIR|--fork-remote --out PROFILE.toml --yes` writes it; p2pkit never "
                  "builds an unpinned kernel module")]


def install_checks(f: dict, p: Profile) -> list[Check]:
    """What the stage itself must have achieved; a reboot does not change these."""
    m, built = f.get("module", {}), f.get("built_module", {})
    kernel = f.get("kernel", "?")
    want_file = f"/lib/modules/{kernel}/kernel/drivers/video/nvidia.ko"
    if failed(built) or not built.get("srcversion"):
        return [unknown("p2p.built", "patched nvidia.ko built", built or {"error": "no build"}, "a built module")]
    return [
        judge("p2p.modinfo_file", "modprobe picks the patched module", m.get("modinfo_filename") == want_file,
              m.get("modinfo_filename") or m.get("modinfo_error", "none"), want_file,
              "another nvidia.ko wins (a stock DKMS copy under updates/dkms?): rerun `p2pkit up --from p2p-module "
              "--force`; `p2pkit restore` does the same after upgrades", pitfall="P02"),
        judge("p2p.installed_srcversion", "installed module is the one built", m.get("modinfo_srcversion") ==
              built["srcversion"], m.get("modinfo_srcversion"), built["srcversion"],
              "the installed nvidia.ko is not this build: rerun `p2pkit up --from p2p-module --force`"),
        *([safeguards(f["restore_guards"])] if "restore_guards" in f else []),
    ]


def safeguards(g: dict) -> Check:
    """P02: the restore service and timer, the kernel postinst hook and the apt hook are in place."""
    title = "upgrade safeguards (restore timer, kernel and apt hooks)"
    if failed(g):
        return unknown("p2p.safeguards", title, g, "all in place", pitfall="P02")
    missing = [k for k, v in g.items() if not v]
    return judge("p2p.safeguards", title, not missing, f"missing: {', '.join(missing)}" if missing else
                 "all in place", ", ".join(g), RESTORE_FIX, pitfall="P02")


def runtime_checks(f: dict, p: Profile) -> list[Check]:
    """What holds only after the module is loaded and the command line applied (after a reboot)."""
    out = []
    v, m, built = f.get("nvidia_version", {}), f.get("module", {}), f.get("built_module", {})
    want = f"{p.driver.version} Open Kernel Module"
    if failed(v):
        out.append(unknown("p2p.loaded_version", "loaded driver version", v, want))
    else:
        got = f"{v['version']} {'Open Kernel Module' if v['open_module'] else 'Kernel Module'}" if v["loaded"] \
            else "no nvidia module loaded"
        out.append(judge("p2p.loaded_version", "loaded driver version", got == want, got, want,
                         "the patched module is not loaded yet: reboot (or see `p2pkit doctor`)"))
    out.append(judge("p2p.loaded_srcversion", "loaded module is the patched build",
                     m.get("loaded_srcversion") is not None and m.get("loaded_srcversion") == built.get("srcversion"),
                     m.get("loaded_srcversion") or "not loaded", built.get("srcversion"),
                     "a different nvidia module is loaded: reboot so the patched one loads (install.sh's rmmod "
                     "fails silently on a busy module: p2pkit checks what is loaded)"))
    nv = f.get("nvml", {})
    out.append(judge("p2p.nvml", "NVML initialises", not failed(nv), nv.get("error", "ok") if failed(nv) else "ok",
                     "ok", "a 'Driver/library version mismatch' means the loaded module and the userspace driver "
                     "differ: reboot after the p2p-module stage"))
    sb = f.get("secure_boot")
    out.append(judge("p2p.secure_boot", "Secure Boot off (or module signed)",
                     sb in ("off", "legacy-bios") or bool(p.p2p_module.signing_key), sb, "off",
                     "Secure Boot refuses the unsigned patched module: turn it off in firmware setup"))
    io = f.get("iommu", {})
    if failed(io):
        out.append(unknown("p2p.iommu", "IOMMU mode on the running command line", io, p.p2p_module.iommu))
    else:
        out.append(judge("p2p.iommu", "IOMMU mode on the running command line", io["intent"] == p.p2p_module.iommu,
                         f"{io['intent']} ({io['detail']})", p.p2p_module.iommu,
                         "the GRUB drop-in is written; the kernel command line changes at the next boot: reboot"))
    return out


def check(f: dict, p: Profile) -> list[Check]:
    return precheck(p) + install_checks(f, p) + runtime_checks(f, p)


REBOOT_FIXES = ("p2p.loaded_version", "p2p.loaded_srcversion", "p2p.nvml", "p2p.iommu")


def reboot_reason(f: dict, p: Profile) -> tuple[str, list[str]] | None:
    """A reboot applies the rest when the install is right and only what a boot changes is not."""
    checks = precheck(p) + install_checks(f, p) + runtime_checks(f, p)
    if any(c.status == "fail" and c.id not in REBOOT_FIXES for c in checks):
        return None
    pending = [c.id for c in checks if c.status == "fail" and c.id in REBOOT_FIXES]
    if not pending:
        return None
    return "the patched module is installed; " + ", ".join(pending) + " take effect at the next boot", pending


def reboot_with_note(f: dict, ctx) -> tuple[str, list[str]] | None:
    """The stage's reboot hook: the reason, plus why a live reload did not spare the reboot."""
    pending = reboot_reason(f, ctx.profile)
    note = (ctx.options.get("acted") or {}).get("live_reload", {}).get("why")
    if pending and note:
        return f"{pending[0]} (no live reload: {note})", pending[1]
    return pending
