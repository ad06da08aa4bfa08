"""What the driver and p2p-module stages do to the host: their roles, complete on their own, handed
the profile and what p2pkit read of the host as variables; what each task did comes back from
Ansible (p2pkit_tasks), never predicted here."""

from __future__ import annotations

from pathlib import Path

from p2pkit.core import writers
from p2pkit.core.ansible import PlaybookFailed, run_playbook
from p2pkit.core.config import p2p_src_dir
from p2pkit.core.errors import P2pkitError
from p2pkit.core.role_defaults import role_default
from p2pkit.core.runner import own_executable
from p2pkit.host import arch, boot, dkms, system
from p2pkit.host.backup import Backup, module_paths, p2p_paths
from p2pkit.parse import boot as pb
from p2pkit.parse import build as pb_build
from p2pkit.rules import distro
from p2pkit.stages.p2p_module import signing

# The kernel hook pins the boot default here when the module does not build for a new kernel (P36).
BOOT_HOLD = system.BOOT_HOLD


def iommu_cmdline(mode: str, cpu_vendor: str, machine: str = "x86_64") -> str:
    """The kernel options for the profile's IOMMU mode on this architecture and CPU vendor: the role's
    table (p2pkit_p2p_module_iommu_options in its defaults, which the role reads too; arm64:
    iommu.passthrough, whatever the vendor)."""
    by_vendor = role_default("p2pkit_p2p_module", "p2pkit_p2p_module_iommu_options")[machine][mode]
    return by_vendor["any"] if "any" in by_vendor else by_vendor["AMD" if "AMD" in cpu_vendor.upper() else "Intel"]


NEWER_KERNEL = ("the kernel is newer than the fork's branch supports: boot the previous kernel (hold "
                "linux-image-generic) or pin a newer p2p branch and commit")
BUILD_CAUSES = (
    ("kernel headers for", "install the headers for that kernel (linux-headers-<release>), then run again"),
    (": not found", "a tool the fork's build runs is not installed (it compiles C++ with g++ and compresses "
                    "shaders with xz): install build-essential and xz-utils, then run again"),
    ("conftest failed", "the fork's conftest could not compile against the kernel's headers: SYSSRC must be the "
                        "kernel's source tree (Debian: /lib/modules/<release>/source) and SYSOUT its build tree; "
                        "or the headers are incomplete: reinstall linux-headers-<release>, then run again"),
    ("stdarg.h: No such file or directory", "the fork's conftest did not find the kernel's headers: SYSSRC must be "
                                             "the kernel's source tree (Debian: /lib/modules/<release>/source) and "
                                             "SYSOUT its build tree"),
    ("implicit declaration", NEWER_KERNEL),
    ("too few arguments to function", NEWER_KERNEL),  # a kernel function that gained an argument (P36)
    ("too many arguments to function", NEWER_KERNEL),
    ("No rule to make target", "the fork checkout is not a kernel-module tree: check p2p_module.repo and commit"),
)


def p2p_module(ctx, kernel: str | None = None) -> dict:
    try:
        done = _p2p_module(ctx, kernel)
        if "live_reload" in done:
            ctx.out.step("p2p-module", ("live reload: " if done["live_reload"]["done"] else "no live reload: ")
                         + done["live_reload"]["why"])
        if kernel is None and (pending := pending_without_module(ctx)):
            ctx.out.step("p2p-module", f"the next boot starts kernel {pending}, installed before p2pkit's kernel "
                                       "hook was there: building the patched module for it too, as the hook would")
            done["pending_kernel"] = {"kernel": pending, **_p2p_module(ctx, pending)}
        return done
    except P2pkitError as e:
        explain(e)
        raise


def pending_without_module(ctx) -> str | None:
    """A kernel the next boot starts, installed before this bring-up put the kernel hook in place (an upgrade
    waiting for its reboot), whose headers are there and for which modprobe would not load the patched module's
    file: the stage builds for it as the hook does for a kernel installed later (issue 47 item 13: it needed a
    hand-run `restore --kernel`). None otherwise (no headers: the stage's check names that kernel and the fix)."""
    from p2pkit.host import kmod
    from p2pkit.stages.p2p_module.checks import module_file

    try:
        pk = kmod.pending_kernel(ctx.host)
    except P2pkitError:
        return None  # unreadable: the stage's own check says so
    k = pk.get("kernel")
    if not k or pk.get("modinfo_filename") == module_file(k) or not ctx.host.exists(f"/lib/modules/{k}/build"):
        return None
    return k


def explain(e: P2pkitError) -> None:
    """A failed build's message gets the build's own errors (make's last lines name only the target
    that failed: the cause is said earlier), and its hint the likely cause."""
    errors = build_errors(e)
    if errors:
        e.message = f"{e.message}; the build's errors: {' | '.join(errors)}"
    for needle, cause in BUILD_CAUSES:
        if needle in e.message:
            e.hint = f"likely cause: {cause}. {e.hint}"
            break


def build_errors(e: P2pkitError) -> list[str]:
    """What the compiler, the shell and make said went wrong in a failed `make` of the role, from the
    task's own output (the playbook's message holds only its last lines)."""
    if not isinstance(e, PlaybookFailed) or not e.task.endswith(("Build the modules", "Clean an earlier build",
                                                                 "Ensure the built modules are installed")):
        return []
    return pb_build.kbuild_errors(f"{e.result.get('stderr') or ''}\n{e.result.get('stdout') or ''}")


def _p2p_module(ctx, kernel: str | None = None) -> dict:
    from p2pkit.stages.p2p_module import live_reload

    m = ctx.profile.p2p_module
    running = system.kernel_release(ctx.host)
    live = kernel is None or kernel == running  # a live reload only for the running kernel
    kernel = kernel or running
    machine = arch.machine(ctx.host)
    cmdline = iommu_cmdline(m.iommu, system.cpu_vendor(ctx.host), machine)
    loader = boot.bootloader(ctx.host)
    refuse_unknown_bootloader(loader, cmdline.split(), system.cmdline(ctx.host).split())
    # Secure Boot: the key, its enrolment and sign-file proved and decided before any change; the role makes
    # the key and queues the enrolment first thing
    sign = signing.prepare(ctx, kernel)
    # the live reload's decision from what can be read before the build; the role swaps where it may
    reload_refused = live_reload.refusal(ctx) if live else None
    # a distro's NVIDIA module under DKMS (p2pkit.rules.distro): refused where its user holds the package, else
    # what DKMS keeps of it and the modprobe.d file routing nvidia to it are kept before the role takes them out
    found = dkms.nvidia_modules(ctx.host)
    refused = distro.held_refusal(distro.user_holds(found, Backup(ctx.store.dir, "driver", ctx.host).manifest()
                                                    .get("held_before")))
    if refused:
        raise refused
    routes = dkms.modprobe_routes(ctx.host) if found else {}
    if found:
        ctx.out.step("p2p-module", "a distro NVIDIA module: p2pkit " + distro.plan(found, routes))
    Backup(ctx.store.dir, "p2p-module", ctx.host).snapshot(
        [*p2p_paths(), system.TIMER_WANTS, *module_paths(ctx.host, kernel), *bootloader_paths(loader),
         *(x for m in found for x in dkms.tree_paths(ctx.host, m)), *routes], kernel,
        ctx.profile.driver.version, files=p2p_paths())
    values = {
        "p2pkit_arch": machine,
        "p2pkit_p2p_module_repo": m.repo,
        "p2pkit_p2p_module_branch": m.branch,
        "p2pkit_p2p_module_commit": m.commit,
        "p2pkit_p2p_module_src_dir": p2p_src_dir(ctx.profile),
        "p2pkit_p2p_module_kernel": kernel,
        "p2pkit_p2p_module_iommu": m.iommu,
        "p2pkit_p2p_module_cmdline": cmdline,
        "p2pkit_p2p_module_bootloader": loader["name"],
        "p2pkit_p2p_module_loader_entries": loader_entries(loader),
        **restore_command_vars(ctx),
        # the fork's driver parameters (P28): only for the patched module of a GPU pair
        "p2pkit_p2p_module_registry_dwords": m.registry_dwords if m.patched else "",
        **sign.values,
        "p2pkit_p2p_module_live_reload": live and reload_refused is None,
        "p2pkit_p2p_module_distro_dkms": [m["dkms"] for m in found],
        "p2pkit_p2p_module_distro_routes": sorted(routes),
    }
    try:
        done = run_playbook(ctx, "p2p-module", values, secret_env=sign.secret_env)
    except P2pkitError as e:
        refused = signing.refusal(e, sign)
        if refused is None:
            raise
        raise refused from None
    finally:
        signing.said(ctx, sign)
    if live:
        done["live_reload"] = reload_refused or live_reload.reported(done)
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


def loader_entries(loader: dict) -> list[str]:
    """systemd-boot's loader entries, for the role: it reads each (and /etc/kernel/cmdline, or the running
    command line where that is missing) and writes it with the options (p2pkit.core.bootentry, its filter
    plugins). GRUB's drop-in is the role's own template; kernelstub changes its own files (a command)."""
    return list(loader["entries"]) if loader["name"] == pb.SYSTEMD_BOOT else []


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
        "p2pkit_p2p_module_hook_grub_cfg": writers.shell_word("GRUB's configuration", prefix + "/boot/grub/grub.cfg"),
    }
