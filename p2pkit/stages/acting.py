"""What the driver and p2p-module stages do to the host: their playbooks, with the variables the
profile and the host give them."""

from __future__ import annotations

from pathlib import Path

from p2pkit import writers
from p2pkit.ansible import run_playbook
from p2pkit.backup import DRIVER_PATHS, P2P_PATHS, Backup, module_paths, userspace_paths
from p2pkit.checks.driver import installer_arch
from p2pkit.config import p2p_src_dir
from p2pkit.errors import P2pkitError, UsageError
from p2pkit.host import arch, system
from p2pkit.runner import own_executable

# The kernel hook pins the boot default here when the module does not build for a new kernel (P36).
BOOT_HOLD = system.BOOT_HOLD


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
    held = ctx.host.runner.run(["apt-mark", "showhold"], check=False)
    kernel = system.kernel_release(ctx.host)
    backup = Backup(ctx.store.dir, "driver", ctx.host)
    backup.snapshot(  # config files and every driver file the installer may replace: rollback puts them back
        [*DRIVER_PATHS, *userspace_paths(ctx.host)], kernel, d.version,
        extra={"held_before": held.stdout.split() if held.returncode == 0 else [],
               "installer": f"{d.cache_dir}/{d.installer_url.rsplit('/', 1)[-1]}"})
    try:
        return run_playbook(ctx, "driver", {
            "p2pkit_driver_version": d.version,
            "p2pkit_driver_installer_url": d.installer_url,
            "p2pkit_driver_installer_sha256": d.installer_sha256,
            "p2pkit_driver_cache_dir": d.cache_dir,
            "p2pkit_driver_libdir": a.libdir,
        })
    finally:  # what the installer added (even when a later task failed): rollback removes it
        backup.record_added(userspace_paths(ctx.host), kernel, d.version)


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
    wants = "/etc/systemd/system/timers.target.wants/p2pkit-restore.timer"
    Backup(ctx.store.dir, "p2p-module", ctx.host).snapshot(
        [*P2P_PATHS, wants, *module_paths(ctx.host, kernel)], kernel, ctx.profile.driver.version)
    return run_playbook(ctx, "p2p-module", {
        "p2pkit_p2p_module_repo": m.repo,
        "p2pkit_p2p_module_branch": m.branch,
        "p2pkit_p2p_module_commit": m.commit,
        "p2pkit_p2p_module_src_dir": p2p_src_dir(ctx.profile),
        "p2pkit_p2p_module_kernel": kernel,
        "p2pkit_p2p_module_cmdline": iommu_cmdline(m.iommu, system.cpu_vendor(ctx.host), arch.machine(ctx.host)),
        **restore_command_vars(ctx),
        # the fork's driver parameters (P28): only for the patched module of a GPU pair
        "p2pkit_p2p_module_registry_dwords": m.registry_dwords if m.patched else "",
    })


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
