"""What the driver and p2p-module stages do to the host: their playbooks, with the variables the
profile and the host give them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from p2pkit import writers
from p2pkit.ansible import render, share_dir
from p2pkit.backup import DRIVER_PATHS, P2P_PATHS, Backup, module_paths, userspace_paths
from p2pkit.checks.driver import GUARDED_PACKAGES, installer_arch
from p2pkit.config import p2p_src_dir
from p2pkit.errors import P2pkitError, UsageError
from p2pkit.host import arch, boot, system
from p2pkit.parse import boot as pb
from p2pkit.runner import own_executable
from p2pkit.stages import followups, signing, work

# The kernel hook pins the boot default here when the module does not build for a new kernel (P36).
BOOT_HOLD = system.BOOT_HOLD
GRUB_DROPIN = "/etc/default/grub.d/60-p2pkit-iommu.cfg"


def iommu_cmdline(mode: str, cpu_vendor: str, machine: str = "x86_64") -> str:
    """The kernel options for the profile's IOMMU mode on this architecture (arm64: iommu.passthrough)."""
    if mode == "passthrough":
        return arch.of(machine).iommu_passthrough(cpu_vendor)
    if machine == "aarch64":
        return "iommu.passthrough=1"  # the SMMU has no generic off switch: passthrough is what P2P needs
    return f"{'amd_iommu' if 'AMD' in cpu_vendor.upper() else 'intel_iommu'}=off"


def driver(ctx) -> dict:
    d = ctx.profile.driver
    a = arch.host_arch(ctx.host)
    wrong = installer_arch(a.machine, ctx.profile)
    if wrong.status != "pass":
        raise UsageError(f"{wrong.title}: {wrong.measured}, expected {wrong.expected}", hint=wrong.hint)
    packages = system.package_holds(ctx.host)
    held = packages["held"]
    kernel = system.kernel_release(ctx.host)
    backup = Backup(ctx.store.dir, "driver", ctx.host)
    backup.snapshot(  # config files and every driver file the installer may replace: rollback puts them back
        [*DRIVER_PATHS, *userspace_paths(ctx.host)], kernel, d.version,
        extra={"held_before": held, "installer": f"{d.cache_dir}/{d.installer_url.rsplit('/', 1)[-1]}"})
    try:
        return work.run_if_work(ctx, "driver", {
            "p2pkit_driver_version": d.version,
            "p2pkit_driver_installer_url": d.installer_url,
            "p2pkit_driver_installer_sha256": d.installer_sha256,
            "p2pkit_driver_cache_dir": d.cache_dir,
            "p2pkit_driver_libdir": a.libdir,
        }, *driver_work(ctx, a.libdir, packages), files_var="p2pkit_driver_files", todo_var="p2pkit_driver_todo")
    finally:  # what the installer added (even when a later task failed): rollback removes it
        backup.record_added(userspace_paths(ctx.host), kernel, d.version)


def driver_work(ctx, libdir: str, packages: dict) -> tuple[dict, dict]:
    """What each driver task would change, from p2pkit's own read-only probes; and whether the
    initramfs must be generated again (nouveau's blacklist changes now, or an earlier run wrote it
    and never got to update-initramfs)."""
    d, host = ctx.profile.driver, ctx.host
    installer = host.path(f"{d.cache_dir}/{d.installer_url.rsplit('/', 1)[-1]}")
    cached = work.sha256_of(installer) == d.installer_sha256
    version = {"p2pkit_driver_version": d.version, "p2pkit_driver_guarded_packages": list(GUARDED_PACKAGES)}
    blacklist = "/etc/modprobe.d/p2pkit-blacklist-nouveau.conf"
    files = work.pending(host, [
        work.dir_entry(d.cache_dir),
        work.file_entry(blacklist, render("modprobe-p2pkit-blacklist-nouveau.conf.j2")),
        work.file_entry("/etc/apt/preferences.d/p2pkit-nvidia", render("apt-p2pkit-nvidia-pin.j2", **version)),
        work.file_entry("/etc/apt/apt.conf.d/51p2pkit-unattended-upgrades",
                        render("unattended-upgrades-p2pkit.j2", **version))])
    return {
        "files": {"all": files},
        "download": not cached,
        "executable": cached and stat.S_IMODE(installer.stat().st_mode) != 0o755,
        # the installer's effects, both: its libraries and the GSP firmware for exactly this version (an
        # installer killed half-way leaves the one without the other, and only running it again mends it)
        "install": not host.path(f"{libdir}/libnvidia-ml.so.{d.version}").exists()
        or not any(host.path(f"/lib/firmware/nvidia/{d.version}").glob("gsp_*.bin")),
        # installed, not held, and guarded: the holds task's loop (P02)
        "unheld": sorted(p for p in packages["installed"]
                         if p not in packages["held"] and p.startswith(GUARDED_PACKAGES)),
        "initramfs": (["the nouveau blacklist changes in this run"] if any(f["path"] == blacklist for f in files)
                      else followups.initramfs(boot.initramfs(host, system.kernel_release(host)),
                                               {blacklist: boot.mtime_ns(host, blacklist)})),
    }, {}


BUILD_CAUSES = (
    ("kernel headers for", "install the headers for that kernel (linux-headers-<release>), then run again"),
    ("implicit declaration", "the kernel is newer than the fork's branch supports: boot the previous kernel "
                             "(hold linux-image-generic) or pin a newer p2p branch and commit"),
    ("No rule to make target", "the fork checkout is not a kernel-module tree: check p2p_module.repo and commit"),
)


def p2p_module(ctx, kernel: str | None = None) -> dict:
    try:
        done = _p2p_module(ctx, kernel)
        if kernel is None or kernel == system.kernel_release(ctx.host):
            from p2pkit.stages.live_reload import try_live_reload

            done["live_reload"] = try_live_reload(ctx)
            ctx.out.step("p2p-module", ("live reload: " if done["live_reload"]["done"] else "no live reload: ")
                         + done["live_reload"]["why"])
        return done
    except P2pkitError as e:
        for needle, cause in BUILD_CAUSES:
            if needle in e.message:
                e.hint = f"likely cause: {cause}. {e.hint}"
                break
        raise


def _p2p_module(ctx, kernel: str | None = None) -> dict:
    m = ctx.profile.p2p_module
    kernel = kernel or system.kernel_release(ctx.host)
    cmdline = iommu_cmdline(m.iommu, system.cpu_vendor(ctx.host), arch.machine(ctx.host))
    loader = boot.bootloader(ctx.host)
    refuse_unknown_bootloader(loader, cmdline.split(), system.cmdline(ctx.host).split())
    sign = signing.prepare(ctx, kernel)  # Secure Boot: key, enrolment and sign-file settled before any change
    wants = "/etc/systemd/system/timers.target.wants/p2pkit-restore.timer"
    Backup(ctx.store.dir, "p2p-module", ctx.host).snapshot(
        [*P2P_PATHS, wants, *module_paths(ctx.host, kernel), *bootloader_paths(loader)], kernel,
        ctx.profile.driver.version)
    values = {
        "p2pkit_p2p_module_repo": m.repo,
        "p2pkit_p2p_module_branch": m.branch,
        "p2pkit_p2p_module_commit": m.commit,
        "p2pkit_p2p_module_src_dir": p2p_src_dir(ctx.profile),
        "p2pkit_p2p_module_kernel": kernel,
        "p2pkit_p2p_module_cmdline": cmdline,
        **restore_command_vars(ctx),
        # the fork's driver parameters (P28): only for the patched module of a GPU pair
        "p2pkit_p2p_module_registry_dwords": m.registry_dwords if m.patched else "",
        **sign,
    }
    done = work.run_if_work(ctx, "p2p-module", values, *p2p_work(ctx, values, loader),
                            files_var="p2pkit_p2p_module_files", todo_var="p2pkit_p2p_module_todo")
    return {**done, "bootloader": {"name": loader["name"], "why": loader["why"], "options": cmdline.split()}}


def refuse_unknown_bootloader(loader: dict, options: list[str], running: list[str]) -> None:
    """Stop before anything is built or rebooted where p2pkit cannot set the command line it needs."""
    missing = [o for o in options if o not in running]
    if loader["name"] != pb.UNKNOWN or not missing:
        return
    raise P2pkitError(
        f"the kernel command line needs {' '.join(missing)} and p2pkit does not know this host's bootloader "
        f"({loader['why']}): nothing was changed and the host is not rebooted",
        hint=f"add {' '.join(missing)} by hand to the kernel command line of the bootloader that boots this box, "
             "reboot, check /proc/cmdline, then run `p2pkit up` again")


def bootloader_paths(loader: dict) -> list[str]:
    """The bootloader's files the stage may change, kept for rollback."""
    if loader["name"] == pb.SYSTEMD_BOOT:
        return [boot.KERNEL_CMDLINE, *loader["entries"]]
    if loader["name"] == pb.KERNELSTUB:
        return [boot.KERNELSTUB_CONFIG, *loader["entries"]]
    return []


def bootloader_files(host, loader: dict, options: list[str], v: dict) -> list[dict]:
    """Where the IOMMU options go for this bootloader, as files: GRUB's drop-in (update-grub follows);
    systemd-boot's /etc/kernel/cmdline (the entries kernel-install writes for new kernels) and each
    loader entry's options line (the next boot). kernelstub changes its own files (a command)."""
    if loader["name"] == pb.GRUB:
        return [work.file_entry(GRUB_DROPIN, render("grub-p2pkit-iommu.cfg.j2", **v))]
    if loader["name"] != pb.SYSTEMD_BOOT:
        return []
    base = loader["kernel_cmdline"]
    if base is None:
        base = pb.kernel_install_cmdline(system.cmdline(host))
    files = [work.file_entry(boot.KERNEL_CMDLINE, " ".join([*base, *(o for o in options if o not in base)]) + "\n")]
    for path in loader["entries"]:
        text = host.read(path, "a systemd-boot loader entry")
        # the ESP is FAT: its files keep the mode the mount gives them
        files.append(work.file_entry(path, pb.entry_with_options(text, options),
                                     mode=f"0{stat.S_IMODE(host.path(path).stat().st_mode):o}"))
    return files


def p2p_work(ctx, v: dict, loader: dict) -> tuple[dict, dict]:
    """What each p2p-module task would change, from p2pkit's own read-only probes; and which
    handlers that work needs."""
    host, kernel, commit = ctx.host, v["p2pkit_p2p_module_kernel"], v["p2pkit_p2p_module_commit"]
    src = host.path(v["p2pkit_p2p_module_src_dir"])
    head = host.runner.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=False).stdout.strip() \
        if (src / ".git").is_dir() else ""
    checkout = head != commit or bool(host.runner.run(["git", "-C", str(src), "status", "--porcelain",
                                                       "--untracked-files=no"], check=False).stdout.strip())
    build = checkout or not (src / f".p2pkit-built-{kernel}-{commit}").is_file()
    target = host.path(f"/lib/modules/{kernel}/kernel/drivers/video/nvidia.ko")
    ko = work.sha256_of(src / "kernel-open/nvidia.ko")
    stock_dir = f"/lib/modules/{kernel}/updates"
    backup = Backup(ctx.store.dir, "p2p-module", host)
    stock = sorted("/" + str(p.relative_to(host.root)) for p in host.path(stock_dir).rglob("nvidia*.ko*")
                   if p.is_file() or p.is_symlink())
    options = "/etc/modprobe.d/p2pkit-nvidia.conf"
    cmdline = v["p2pkit_p2p_module_cmdline"].split()
    files = work.pending(host, [
        *([work.file_entry(options, render("modprobe-p2pkit-nvidia.conf.j2", **v))]
          if v["p2pkit_p2p_module_registry_dwords"] else []),
        *bootloader_files(host, loader, cmdline, v),
        work.file_entry(system.RESTORE_UNIT, render("p2pkit-restore.service.j2", **v)),
        work.file_entry(system.RESTORE_TIMER, (share_dir() / "systemd/p2pkit-restore.timer").read_text()),
        work.file_entry(system.KERNEL_HOOK, render("p2pkit-kernel-postinst.j2", **v), mode="0755"),
        work.file_entry(system.APT_HOOK, render("apt-p2pkit-restore.j2", **v))])
    written = {f["path"] for f in files}
    enabled = host.runner.run(["systemctl", f"--root={host.root}", "is-enabled", "p2pkit-restore.timer"],
                              check=False).stdout.strip()
    todo = {
        "files": {"all": files},
        "packages": bool(work.missing_packages(host, ["build-essential", "git", f"linux-headers-{kernel}"]))
        and not host.simulated,  # the apt task's own condition: real hosts only
        "checkout": checkout,
        "headers_missing": not host.path(f"/lib/modules/{kernel}/build/Makefile").is_file(),
        "build": build,
        # an earlier build (another kernel or commit) is cleaned first; a fresh checkout has none
        "clean": build and (ko is not None or any(src.glob(".p2pkit-built-*"))),
        "install": ko is None or ko != work.sha256_of(target),
        "stock": [{"path": p, "backed_up": backup.copy_path(p).exists()} for p in stock],
        "enable_timer": enabled != "enabled",
        "sign": unsigned_modules(host, v, src, kernel),
    }
    todo.update(p2p_followups(ctx, v, todo, written, loader))
    return todo, {}


def unsigned_modules(host, v: dict, src, kernel: str) -> list[str]:
    """With Secure Boot on: the built and installed modules sign.yml signs (not signed by the key)."""
    if not v.get("p2pkit_p2p_module_sign_key"):
        return []
    from p2pkit.host import mok
    from p2pkit.parse import mok as pm

    video = host.path(f"/lib/modules/{kernel}/kernel/drivers/video")
    kos = [*src.glob("kernel-open/nvidia*.ko"), *video.glob("nvidia*.ko")]
    cert = {"serial": v["p2pkit_p2p_module_sign_serial"]}
    return [host.host_path(k) for k in sorted(kos)
            if not pm.signed_by(mok.module_signature(host, host.host_path(k))["sig_key"], cert)]


def p2p_followups(ctx, v: dict, todo: dict, written: set[str], loader: dict) -> dict:
    """Which follow-up commands the p2p-module playbook runs, each with its reasons: what this run
    changes, or an effect an earlier run left missing (killed between a file and its follow-up)."""
    host, kernel = ctx.host, v["p2pkit_p2p_module_kernel"]
    options, grub = "/etc/modprobe.d/p2pkit-nvidia.conf", GRUB_DROPIN
    cmdline = v["p2pkit_p2p_module_cmdline"].split()
    ko = boot.mtime_ns(host, f"/lib/modules/{kernel}/{followups.VIDEO_KO}")
    changes = [why for flag, why in ((todo["build"], "the module is built in this run"),
                                     (todo["install"], "the module is installed in this run"),
                                     (bool(todo["stock"]), "stock copies are removed in this run"),
                                     (bool(todo["sign"]), "the modules are signed in this run")) if flag]
    units = sorted({system.RESTORE_UNIT, system.RESTORE_TIMER} & written)
    return {
        "depmod": changes or followups.depmod(boot.modules_dep(host, kernel), ko),
        "initramfs": changes + ([f"{options} changes in this run"] if options in written else [])
        or followups.initramfs(boot.initramfs(host, kernel),
                               {followups.VIDEO_KO: ko,
                                **({options: boot.mtime_ns(host, options)} if v["p2pkit_p2p_module_registry_dwords"]
                                   else {})}, only_patched=True),
        "grub": ([f"{grub} changes in this run"] if grub in written
                 else followups.grub(boot.grub_args(host, kernel), cmdline)) if loader["name"] == pb.GRUB else [],
        # kernelstub --add-options: the options its configuration lacks (it rewrites the loader entry too)
        "kernelstub": [o for o in cmdline if o not in (loader["kernelstub"] or [])]
        if loader["name"] == pb.KERNELSTUB else [],
        "daemon_reload": [f"{u} changes in this run" for u in units]
        or (["systemd runs an older copy of the restore units"]
            if boot.need_daemon_reload(host, [os.path.basename(system.RESTORE_UNIT),
                                              os.path.basename(system.RESTORE_TIMER)]) else []),
    }


def restore_command_vars(ctx) -> dict:
    """The restore service's and the kernel hook's command lines, each written whole by the writer of
    its format (systemd Exec= line, shell words): no path is pasted into a file root runs."""
    root = str(ctx.host.root) if ctx.host.root != Path("/") else "/"
    prefix = "" if root == "/" else root
    exe = own_executable()
    argv = [exe, "--root", root, *ctx.profile.cli_args(), "--state-dir", str(ctx.store.dir), "--yes", "restore"]
    return {
        "p2pkit_p2p_module_unit_exec": writers.unit_exec(argv, "the restore command"),
        "p2pkit_p2p_module_unit_state_dir": writers.unit_path("the state directory", str(ctx.store.dir)),
        "p2pkit_p2p_module_hook_exe": writers.shell_word("the p2pkit executable", exe),
        "p2pkit_p2p_module_hook_command": writers.shell_command(argv, "the restore command"),
        # P36: the boot-default hold the hook writes when the module does not build for a new kernel
        "p2pkit_p2p_module_hook_hold": writers.shell_word("the boot-default hold", prefix + BOOT_HOLD),
        "p2pkit_p2p_module_hook_osrelease": writers.shell_word("the kernel release",
                                                               prefix + "/proc/sys/kernel/osrelease"),
    }
