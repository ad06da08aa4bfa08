"""p2p-module: the patched open module is installed, preferred by modprobe, and loaded."""

from __future__ import annotations

from dataclasses import replace

from p2pkit.core.config import Profile
from p2pkit.core.role_defaults import role_default
from p2pkit.parse import field as pf
from p2pkit.parse.mok import signed_by
from p2pkit.rules.findings import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    could_not,
    facts_read,
    failed,
    judge,
    pair,
    reads,
    unknown,
    unreadable,
)
from p2pkit.rules.hints import RESTORE_FIX


def precheck(p: Profile) -> list[Check]:
    return [judge("p2p.commit", "fork commit pinned", len(p.p2p_module.commit) >= 7,
                  p.p2p_module.commit or "(empty)", "a commit id",
                  f"set p2p_module.commit to the commit of {p.p2p_module.branch} you reviewed: `sudo p2pkit up "
                  "--pin` or `p2pkit pin --fork DIR|--fork-remote --out PROFILE.toml --yes` writes it; p2pkit never "
                  "builds an unpinned kernel module")]


@reads("module", "built_module", "kernel", "restore_guards", "restore_units", "pending_kernel", "mok")
def install_checks(f: dict, p: Profile) -> list[Check]:
    """What the stage itself must have achieved; a reboot does not change these."""
    m, built = f.get("module", {}), f.get("built_module", {})
    kernel = f.get("kernel", "?")
    want_file = f"/lib/modules/{kernel}/kernel/drivers/video/nvidia.ko"
    if failed(built) or not built.get("srcversion"):
        return [unknown("p2p.built", "patched nvidia.ko built", built or {"error": "no build"}, "a built module")]
    pending = built_for_pending(f)
    return [
        judge("p2p.modinfo_file", "modprobe picks the patched module", m.get("modinfo_filename") == want_file,
              m.get("modinfo_filename") or m.get("modinfo_error", "none"), want_file,
              "another nvidia.ko wins (a stock DKMS copy under updates/dkms?): rerun `p2pkit up --from p2p-module "
              "--force`; `p2pkit restore` does the same after upgrades", pitfall="P02"),
        Check("p2p.installed_srcversion", "installed module is the one built", WARN, m.get("modinfo_srcversion"),
              built["srcversion"], pending) if pending else
        judge("p2p.installed_srcversion", "installed module is the one built", m.get("modinfo_srcversion") ==
              built["srcversion"], m.get("modinfo_srcversion"), built["srcversion"],
              "the installed nvidia.ko is not this build: rerun `p2pkit up --from p2p-module --force`"),
        *([safeguards(f["restore_guards"])] if "restore_guards" in f else []),
        *([restore_timer(f["restore_units"])] if "restore_units" in f else []),
        *([pending_kernel(f["pending_kernel"], built, f.get("mok"))] if "pending_kernel" in f else []),
    ]


def built_for_pending(f: dict) -> str:
    """The fork's tree was last built for the pending kernel (the kernel hook's rebuild before the
    reboot into it): the running kernel's module cannot be held to that build. Returns the note
    that says so, or "" when the tree was built for the running kernel."""
    built, pk, running = f.get("built_module", {}), f.get("pending_kernel"), f.get("kernel")
    if failed(pk) or not isinstance(pk, dict) or not pk.get("kernel") or failed(built):
        return ""
    k = pk["kernel"]
    if built.get("kernel") != k or k == running:
        return ""
    if pk.get("modinfo_filename") == module_file(k) and pk.get("modinfo_srcversion") == built.get("srcversion"):
        return pending_note(k)
    return (f"the fork's tree holds a build for the pending kernel {k} that modprobe does not find for it "
            "(see p2p.pending_kernel); the running kernel's module is not compared with it")


def module_file(kernel: str) -> str:
    return f"/lib/modules/{kernel}/kernel/drivers/video/nvidia.ko"


def pending_note(kernel: str, signed: bool = False) -> str:
    return f"module built{' and signed' if signed else ''} for the pending kernel {kernel}; reboot to load it"


def pending_kernel(pk: dict, built: dict, mok: dict | None = None) -> Check:
    """An upgrade installed a kernel the next boot starts: it must have the patched module before the
    reboot (the kernel hook builds it), or the box boots without P2P (P02); with Secure Boot on, signed
    by p2pkit's key (the hook signs what it builds), or the next boot refuses to load it."""
    title = "the pending kernel has the patched module"
    if failed(pk):
        return unknown("p2p.pending_kernel", title, pk, "no pending kernel, or one with the patched module",
                       needed=False, pitfall="P02")
    k = pk.get("kernel")
    if not k:
        return Check("p2p.pending_kernel", title, PASS, f"none: the next boot starts {pk.get('running')} "
                     + (f"(held back from {pk['held_for']}, P36)" if pk.get("held_for") else "(running now)"),
                     "no pending kernel, or one with the patched module", pitfall="P02")
    want = module_file(k)
    got = pk.get("modinfo_filename")
    same_build = built.get("kernel") != k or pk.get("modinfo_srcversion") == built.get("srcversion")
    signing = isinstance(mok, dict) and mok.get("needed") is True
    if got == want and same_build:
        sig = pk.get("modinfo_sig_key") or ""
        if signing and not signed_by_key(sig, mok):
            return Check("p2p.pending_kernel", title, FAIL,
                         f"{k}: {got} ({pk.get('modinfo_srcversion')}) signed by {sig or 'nobody'}",
                         f"{want} signed by {mok.get('cert')} (serial {key_serial(mok) or 'no key yet'})",
                         f"Secure Boot refuses this module at the next boot into {k}: run `sudo p2pkit restore "
                         f"--kernel {k}` before you reboot (it signs the modules it builds with the key)", "P02")
        return Check("p2p.pending_kernel", title, WARN, f"{k}: {got} ({pk.get('modinfo_srcversion')})", want,
                     pending_note(k, signed=signing), "P02")
    return Check("p2p.pending_kernel", title, FAIL,
                 f"{k} ({pk.get('boot_image')}): modprobe would load {got or pk.get('modinfo_error') or 'nothing'}"
                 + ("" if same_build or got != want else f", srcversion {pk.get('modinfo_srcversion')} is not "
                    f"the build's {built.get('srcversion')}"), want,
                 f"the kernel hook did not build the patched module for {k} (it failed or did not run): run "
                 f"`sudo p2pkit restore --kernel {k}` before you reboot, or the box boots {k} without P2P", "P02")


def key_serial(mok: dict) -> str | None:
    """The serial of p2pkit's signing certificate, as the mok fact read it (None: no key yet)."""
    return (mok.get("cert_id") or {}).get("serial")


def signed_by_key(sig_key: str, mok: dict) -> bool:
    """Whether a module's sig_key (modinfo) is p2pkit's signing key; never with no key."""
    serial = key_serial(mok)
    return bool(serial) and signed_by(sig_key, {"serial": serial})


def safeguards(g: dict) -> Check:
    """P02: the restore service and timer, the kernel postinst hook and the apt hook are in place."""
    title = "upgrade safeguards (restore timer, kernel and apt hooks)"
    if failed(g):
        return unknown("p2p.safeguards", title, g, "all in place", pitfall="P02")
    missing = [k for k, v in g.items() if not v]
    return judge("p2p.safeguards", title, not missing, f"missing: {', '.join(missing)}" if missing else
                 "all in place", ", ".join(g), RESTORE_FIX, pitfall="P02")


def restore_timer(u: dict) -> Check:
    """P02, as systemd itself holds it (`systemctl show`): the restore timer loaded from its file with nothing
    left to reload, enabled and waiting with a next run, triggering the restore service, which is loaded from
    p2pkit's file and runs `p2pkit restore`. Files alone do not say this: a timer whose file is gone still
    fires, one edited and not reloaded runs the settings it had."""
    title = "the restore timer as systemd runs it"
    want = "timer loaded, enabled, active (waiting) with a next run, triggers the restore service; nothing to reload"
    if failed(u):
        return unknown("p2p.restore_timer", title, u, want, pitfall="P02")
    if not u.get("systemd"):
        return Check("p2p.restore_timer", title, SKIP, "systemd is not PID 1 here: no timer runs", want, "", "P02")
    t, s = u.get("timer") or {}, u.get("service") or {}
    problems = []
    for x in (t, s):
        if x.get("LoadState") != "loaded":
            problems.append(f"{x.get('name')} {x.get('LoadState') or 'not read'}")
        elif x.get("FragmentPath") != x.get("path"):
            problems.append(f"{x.get('name')} loaded from {x.get('FragmentPath') or 'no file'}, not {x.get('path')}")
        if x.get("NeedDaemonReload") == "yes":
            problems.append(f"{x.get('name')} changed on disk since systemd read it (NeedDaemonReload=yes)")
    if t.get("UnitFileState") != "enabled":
        problems.append(f"{t.get('name')} is not enabled (UnitFileState={t.get('UnitFileState') or 'none'})")
    if t.get("ActiveState") != "active":
        problems.append(f"{t.get('name')} {t.get('ActiveState')} (it runs from the next boot only)")
    if t.get("Triggers") and t.get("Triggers") != s.get("name"):
        problems.append(f"{t.get('name')} triggers {t['Triggers']}, not {s.get('name')}")
    if s.get("LoadState") == "loaded" and "restore" not in (s.get("ExecStart") or ""):
        problems.append(f"{s.get('name')} runs {s.get('ExecStart') or 'nothing'}")
    nxt = t.get("NextElapseUSecRealtime") or "none"
    measured = "; ".join(problems) or (f"{t.get('name')} {t.get('ActiveState')} ({t.get('SubState')}), next run "
                                       f"{nxt}, triggers {t.get('Triggers')}; {s.get('name')} loaded")
    return judge("p2p.restore_timer", title, not problems, measured, want,
                 f"`sudo systemctl daemon-reload && sudo systemctl enable --now {t.get('name')}` (or rerun `p2pkit up "
                 "--from p2p-module --force`); `systemctl show " + f"{t.get('name')} {s.get('name')}` says what "
                 "systemd holds", pitfall="P02")


def _nvml_fix(error: str) -> str:
    """The fix for NVML's own reason (nvmlErrorString's words): a mismatch, no driver loaded, no library."""
    e = error.lower()
    if "mismatch" in e:
        return ("the loaded module and the userspace driver differ ('Driver/library version mismatch'): reboot after "
                "the p2p-module stage")
    if "not loaded" in e:
        return "no nvidia module is loaded: reboot after the p2p-module stage so the patched one loads"
    if "shared library not found" in e or "library not found" in e:
        return "the userspace driver (libnvidia-ml.so.1) is not installed: run the driver stage (`p2pkit up`)"
    return "reboot after the p2p-module stage; if NVML still fails, `p2pkit doctor` names what is loaded"


@reads("nvidia_version", "module", "built_module", "nvml", "secure_boot", "mok", "iommu", "bootloader")
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
    pending = built_for_pending(f)
    loaded = m.get("loaded_srcversion")
    if pending and loaded is not None and loaded == m.get("modinfo_srcversion"):
        # the running kernel's installed module is the loaded one; the tree now holds the pending kernel's build
        out.append(Check("p2p.loaded_srcversion", "loaded module is the patched build", WARN, loaded,
                         built.get("srcversion"), pending))
    else:
        out.append(judge("p2p.loaded_srcversion", "loaded module is the patched build",
                         loaded is not None and loaded == built.get("srcversion"),
                         loaded or "not loaded", built.get("srcversion"),
                         "no nvidia module is loaded: reboot so the patched one loads" if loaded is None else
                         "a different nvidia module is loaded: reboot so the patched one loads (install.sh's rmmod "
                         "fails silently on a busy module: p2pkit checks what is loaded)"))
    nv = f.get("nvml", {})
    out.append(judge("p2p.nvml", "NVML initialises", not failed(nv), nv.get("error", "ok") if failed(nv) else "ok",
                     "ok", _nvml_fix(nv.get("error", "") if failed(nv) else "")))
    out += _secure_boot(f)
    io = f.get("iommu", {})
    if failed(io):
        out.append(unknown("p2p.iommu", "IOMMU mode on the running command line", io, p.p2p_module.iommu))
    else:
        out.append(judge("p2p.iommu", "IOMMU mode on the running command line", io["intent"] == p.p2p_module.iommu,
                         f"{io['intent']} ({io['detail']})", p.p2p_module.iommu,
                         f"{where_set(f.get('bootloader'))}; the kernel command line changes at the next boot: "
                         "reboot"))
    return out


SET_BY = {
    "grub": "the GRUB drop-in is written and update-grub has run",
    "systemd-boot": "/etc/kernel/cmdline and the systemd-boot loader entries carry the option",
    "kernelstub": "kernelstub --add-options has added the option",
}


def where_set(b) -> str:
    if failed(b) or not isinstance(b, dict):
        return "the bootloader's configuration is written"
    return SET_BY.get(b.get("name"), "the bootloader's configuration is written")


FIX_BY = {
    "grub": "GRUB did not boot with what update-grub wrote: check that GRUB boots this box (not another loader "
            "on the ESP: `efibootmgr -v`), that /boot/grub/grub.cfg's default entry carries the option, and that "
            "GRUB_DEFAULT in /etc/default/grub picks it; or add the option in the firmware's boot entry by hand",
    "systemd-boot": "systemd-boot did not boot an entry carrying it: check `bootctl status` (the entry it "
                    "booted, the default entry) and add the option to that entry's options line, or set "
                    "`default` in loader/loader.conf to an entry p2pkit changed",
    "kernelstub": "kernelstub's options did not reach the boot: check `sudo kernelstub --print-config` and the "
                  "ESP's loader/entries/Pop_OS-current.conf options line, then `sudo kernelstub -a OPTION`",
}


def not_applied(f: dict, c: Check, boot_id: str) -> Check:
    """A check a reboot was asked for, still failing after that reboot: a failure, not another reboot."""
    head = f"the reboot (from boot {boot_id[:8]}) did not apply this"
    if c.id != "p2p.iommu":
        return replace(c, status=FAIL, hint=f"{head}: {c.hint}")
    b = f.get("bootloader") if isinstance(f.get("bootloader"), dict) else {}
    name = b.get("name", "unknown")
    return replace(c, status=FAIL, measured=f"{c.measured}; the bootloader is {name}",
                   hint=f"{head}: /proc/cmdline lacks the option the stage set for {name}. "
                        + FIX_BY.get(name, "set the option by hand in the bootloader that boots this box")
                        + "; reboot, then run `p2pkit up` again (p2pkit does not reboot for it again)")


@reads("persistence_mode")
def persistence_mode(f: dict, p: Profile) -> list[Check]:
    """Persistence mode on every GPU (`nvidia-smi -q`: "Persistence Mode : Enabled", as on the H200): off, the
    driver tears a GPU down when its last client exits, and every NVML or CUDA start brings it up again."""
    pm = f.get("persistence_mode")
    id_, title, want = "p2p.persistence_mode", "GPU persistence mode is on", "Enabled on every GPU"
    if pm is None:  # a recording made before p2pkit read it
        return []
    if failed(pm):  # no driver to ask: p2p.nvml says why
        return [unknown(id_, title, pm, want, needed=False)]
    off = [f"{bus}" + (f" ({mode['error']})" if isinstance(mode, dict) else "")
           for bus, mode in pm.items() if mode != "Enabled"]
    return [judge(id_, title, not off, f"Disabled on {', '.join(off)}" if off else want, want,
                  "turn it on and keep it on: run NVIDIA's daemon `nvidia-persistenced` (its systemd unit, where the "
                  "driver installed one: `sudo systemctl enable --now nvidia-persistenced`), or `sudo nvidia-smi -pm "
                  "1` (until the next boot)", severity=WARN)]


@reads(*facts_read(install_checks, runtime_checks, persistence_mode))
def check(f: dict, p: Profile) -> list[Check]:
    return precheck(p) + install_checks(f, p) + runtime_checks(f, p) + persistence_mode(f, p)


# p2p.mok_enrolled: MokManager enrols a queued key at the next boot (Secure Boot on, issue 29)
REBOOT_FIXES = ("p2p.loaded_version", "p2p.loaded_srcversion", "p2p.nvml", "p2p.iommu", "field.static_bar1",
               "p2p.mok_enrolled")


def reboot_reason(f: dict, p: Profile) -> tuple[str, list[str]] | None:
    """A reboot applies the rest when the install is right and only what a boot changes is not."""
    checks = precheck(p) + install_checks(f, p) + runtime_checks(f, p) + static_bar1(f, p)
    if any(c.status == "fail" and c.id not in REBOOT_FIXES for c in checks):
        return None
    pending = [c.id for c in checks if c.status == "fail" and c.id in REBOOT_FIXES]
    if not pending:
        return None
    return "the patched module is installed; " + ", ".join(pending) + " take effect at the next boot", pending


def reboot_with_note(f: dict, ctx, acted: dict) -> tuple[str, list[str]] | None:
    """The stage's reboot hook: the reason, plus why a live reload did not spare the reboot (from what the act
    did, handed in by the pipeline)."""
    pending = reboot_reason(f, ctx.profile)
    note = (acted or {}).get("live_reload", {}).get("why")
    if pending and note:
        return f"{pending[0]} (no live reload: {note})", pending[1]
    return pending


# ---------------------------------------------------------------- field pitfalls (shared/PITFALLS.md)


@reads("driver_params")
def static_bar1(f: dict, p: Profile) -> list[Check]:
    """P28: the driver's live RegistryDwords hold what the fork needs (RMForceStaticBar1=1)."""
    if not pair(p) or not p.p2p_module.patched or not p.p2p_module.registry_dwords:
        return []
    id_, title = "field.static_bar1", "driver uses the static full-VRAM BAR1 mapping"
    want = pf.registry_dwords(p.p2p_module.registry_dwords)
    d = f.get("driver_params")
    expected = f"RegistryDwords holds {p.p2p_module.registry_dwords}"
    if unreadable(d):
        return [could_not(id_, title, d, expected, "P28")]
    if not d.get("loaded"):
        return [Check(id_, title, SKIP, "no nvidia module loaded", expected, "", "P28")]
    live = d["registry_dwords"]
    missing = [f"{k}={v}" for k, v in want.items() if live.get(k, "").lower() != v.lower()]
    return [judge(id_, title, not missing, f"RegistryDwords: \"{d['params'].get('RegistryDwords', '')}\"", expected,
                  "topo -p2p may say OK while NCCL hangs in ncclCommInitRank: p2pkit writes "
                  f"{_role_path('modprobe_conf')} (options nvidia NVreg_RegistryDwords=\""
                  f"{p.p2p_module.registry_dwords}\") and rebuilds the initramfs: `p2pkit up --from p2p-module "
                  "--force`, then reboot; check with `grep -i registrydwords /proc/driver/nvidia/params` (the sysfs "
                  "parameter reads empty even when live)", pitfall="P28")]


def _role_path(key: str) -> str:
    """A file the p2p-module role writes, as its defaults state it (p2pkit_p2p_module_paths), read when asked."""
    return role_default("p2pkit_p2p_module", "p2pkit_p2p_module_paths")[key]


@reads("module_sources", "module", "built_module")
def module_sources(f: dict, p: Profile) -> list[Check]:
    """P34: only the patched module can load: no updates/ copy, the initramfs holds it and is newer."""
    if not pair(p) or not p.p2p_module.patched:
        return []
    m = f.get("module_sources")
    id_, title = "field.module_sources", "no other nvidia.ko can load (updates/, initramfs)"
    want = "only kernel/drivers/video/nvidia.ko; an initramfs rebuilt after it"
    if unreadable(m):
        return [could_not(id_, title, m, want, "P34")]
    problems = [f"{u} (DKMS wins over kernel/drivers/video)" for u in m["updates"]] + _distro_dkms(m)
    ir = m.get("initramfs")
    out = []
    if unreadable(ir):
        out.append(could_not(id_ + ".initramfs", "initramfs holds the patched module", ir, want, "P34"))
    else:
        problems += _initramfs_problems(ir, m.get("installed_mtime"))
    mod = f.get("module") or {}
    built = (f.get("built_module") or {}).get("srcversion")
    if built and mod.get("loaded_srcversion") and mod["loaded_srcversion"] != built and m.get("holders"):
        problems.append(f"loaded srcversion {mod['loaded_srcversion']} is not the built {built}; "
                        f"{', '.join(m['holders'])} hold nvidia (rmmod nvidia fails until they are "
                        "unloaded)")
    # what lsinitramfs listed, said as it is: an initramfs without any nvidia.ko loads none early (modprobe
    # takes the patched one from /lib/modules); one with the patched module holds it
    fine = "no copy under updates/" + ("" if unreadable(ir) else f", {ir['path']} holds "
                                       + (", ".join(ir["nvidia"]) if ir["nvidia"] else "no nvidia.ko"))
    out.append(judge(id_, title, not problems, "; ".join(problems) or fine, want, "remove the stock copies (p2pkit "
                     "backs them up; a distro's DKMS module: `dkms remove NAME/VERSION --all`), rebuild the initramfs "
                     "(`update-initramfs -u -k $(uname -r)`), unload in order nvidia_drm nvidia_modeset nvidia_uvm "
                     "nvidia, or rerun `p2pkit up --from p2p-module --force` and reboot", pitfall="P34"))
    return out


def _distro_dkms(m: dict) -> list[str]:
    """A distro's module still in DKMS (p2pkit.rules.distro): DKMS's kernel hook builds it again for every new
    kernel."""
    return [f"DKMS builds {d['dkms']} ({d.get('package') or 'no package'}; "
            + (", ".join(f"{k}: {v}" for k, v in sorted((d.get("kernels") or {}).items())) or d.get("state")
               or "added") + ") again for every new kernel" for d in m.get("dkms") or []]


def _initramfs_problems(ir: dict, installed_mtime) -> list[str]:
    """An nvidia module in the initramfs that is not the fork's (a stock nvidia.ko, a distro's renamed one), and an
    initramfs older than the installed patched module."""
    other = [x for x in ir["nvidia"] if "/kernel/drivers/video/" not in f"/{x}"]
    other += [x for x in ir.get("other") or [] if x not in other]
    out = [f"initramfs {ir['path']}: {x}" for x in other]
    if ir["nvidia"] and installed_mtime and ir["mtime"] < installed_mtime:
        out.append(f"{ir['path']} is older than the installed patched module: it still holds the one before it")
    return out


@reads("boot_hold")
def boot_default(f: dict, p: Profile) -> list[Check]:
    """P36: the kernel hook held the boot default at the working kernel when the build for a new one failed.
    Whether the module is there for the new kernel now is modinfo's word (read with the hold), not the hold's:
    a hold whose kernel has its module since is one `restore --kernel` lifts."""
    b = f.get("boot_hold")
    title = "boot default not held back by a failed module build"
    if unreadable(b):  # never a silent pass: the hold could not be read
        return [could_not("field.boot_default", title, b, "no hold", "P36")]
    held = b.get("held")
    if not held:
        return [judge("field.boot_default", title, True, "no hold", "no hold", "", pitfall="P36", severity=WARN)]
    new = held["new_kernel"]
    mod = held.get("module") or {}
    there = mod.get("modinfo_filename")
    if there == module_file(new):
        return [Check("field.boot_default", title, WARN,
                      f"booting {held['kernel']}, held back from {new}, whose module is there now (modinfo -k {new}: "
                      f"{there}, srcversion {mod.get('modinfo_srcversion')}"
                      + (f", signed by {mod['modinfo_sig_key']})" if mod.get("modinfo_sig_key") else ")"),
                      "no hold", f"the hold is no longer needed: `sudo p2pkit restore --kernel {new}` proves the "
                      "module for it, lifts the hold and runs update-grub", "P36")]
    return [Check("field.boot_default", title, WARN,
                  f"booting {held['kernel']}: the P2P module did not build for {new} (modinfo -k {new}: "
                  f"{there or mod.get('modinfo_error') or 'nothing'})", "no hold",
                  f"the new kernel {new} breaks the module build (a kernel API removed, or its headers missing): pin a "
                  f"fork commit that builds for it (or install linux-headers-{new}), then `sudo p2pkit restore "
                  f"--kernel {new}`: it lifts the hold and runs update-grub when the module is there", "P36")]


def _secure_boot(f) -> list[Check]:
    """Secure Boot off; or on, with the installed module signed by p2pkit's key (modinfo's sig_key is
    the key's serial: an install property) and that key enrolled (mokutil --test-key: a queued key is
    enrolled by MokManager at the next boot, so that one a reboot fixes). Issue 29."""
    sb = f.get("secure_boot")
    if sb in ("off", "legacy-bios"):
        return [judge("p2p.secure_boot", "Secure Boot off", True, sb, "off")]
    if failed(sb):
        return [unknown("p2p.secure_boot", "Secure Boot off", sb, "off")]
    m = f.get("mok") or {"error": "not read"}
    title = "the module is signed by p2pkit's key"
    if failed(m):
        return [unknown("p2p.secure_boot", title, m, "the key's serial")]
    sig = m.get("module_sig_key") or ""
    signed = judge("p2p.secure_boot", title, signed_by_key(sig, m),
                   f"on; nvidia.ko signed by {m.get('module_signer') or 'nobody'} (sig_key {sig or 'none'})",
                   f"{m.get('cert')} (serial {key_serial(m) or 'no key yet'})",
                   "Secure Boot refuses a module not signed by an enrolled key: run `p2pkit up --from p2p-module` "
                   "(it signs the modules it builds with the key)")
    state = m.get("enrolment") or "no key"
    enrolled = judge("p2p.mok_enrolled", "the signing key is enrolled", state in ("enrolled", "in-db"),
                     f"{m.get('cert')}: {state}", "enrolled",
                     "a queued key is enrolled at the next boot: reboot and, in MokManager, choose \"Enroll MOK\" "
                     "and type the one-time password given to mokutil; if none is queued (`mokutil --list-new`), "
                     "run `p2pkit up --from p2p-module` again")
    if state not in ("enrolled", "in-db", "queued"):
        enrolled = replace(enrolled, hint="no enrolment is queued: run `p2pkit up --from p2p-module` (it queues "
                           "the key with mokutil --import)")
    return [signed, enrolled]
