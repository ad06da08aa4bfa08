"""What the follow-up commands of a change leave on the host, read back from the effect itself:
the GRUB configuration update-grub wrote, depmod's map, the initramfs image, systemd's view of
unit files changed on disk. A stage proves each from here, so a follow-up a kill skipped is redone
on the next run whether or not the change that asked for it happens again."""

from __future__ import annotations

from p2pkit.core.errors import P2pkitError, ProbeError
from p2pkit.host import Host
from p2pkit.parse import boot as pb
from p2pkit.parse import field as pf
from p2pkit.parse import system as ps

GRUB_CFG = "/boot/grub/grub.cfg"
ESPS = ("/boot/efi", "/efi", "/boot")  # where systemd-boot's ESP (or XBOOTLDR) is mounted on Ubuntu and elsewhere
KERNEL_CMDLINE = "/etc/kernel/cmdline"  # kernel-install's command line for the entries it writes
KERNELSTUB_CONFIG = "/etc/kernelstub/configuration"
# set by systemd-boot for the boot it started (the Boot Loader Interface); GRUB does not set it
LOADER_INFO = "/sys/firmware/efi/efivars/LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"


def mtime_ns(host: Host, path: str) -> int | None:
    try:
        return host.path(path).stat().st_mtime_ns
    except OSError:
        return None


def grub_args(host: Host, kernel: str) -> list[list[str]] | None:
    """The default entries' kernel arguments in grub.cfg; None where there is no grub.cfg (another
    bootloader, or GRUB not installed: nothing for update-grub to regenerate)."""
    if not host.path(GRUB_CFG).is_file():
        return None
    return ps.grub_default_args(host.read(GRUB_CFG, "the GRUB configuration"), kernel)


def modules_dep(host: Host, kernel: str) -> dict | None:
    """depmod's map for `kernel`: the module paths it lists and when it was written."""
    dep = f"/lib/modules/{kernel}/modules.dep"
    if not host.path(dep).is_file():
        return None
    return {"paths": ps.modules_dep_paths(host.read(dep, "depmod's map")), "mtime_ns": mtime_ns(host, dep)}


def initramfs(host: Host, kernel: str) -> dict | None:
    """The initramfs image of `kernel`: the files lsinitramfs lists (the nvidia.ko copies among them)
    and when it was written; None when there is none or it cannot be listed."""
    img = f"/boot/initrd.img-{kernel}"
    if not host.path(img).is_file():
        return None
    try:
        r = host.runner.run(["lsinitramfs", str(host.path(img))], check=False)
    except P2pkitError:
        return None
    if r.returncode != 0:
        return None
    files = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
    return {"files": files, "nvidia": pf.initramfs_nvidia(r.stdout), "mtime_ns": mtime_ns(host, img)}


def need_daemon_reload(host: Host, units: list[str]) -> bool:
    """Whether systemd still runs an older copy of one of these unit files than the one on disk
    (`systemctl show -p NeedDaemonReload`)."""
    try:
        r = host.runner.run(["systemctl", "show", "-p", "NeedDaemonReload", "--value", *units], check=False)
    except P2pkitError:
        return False
    return r.returncode == 0 and "yes" in r.stdout.split()


def _loader_info(host: Host) -> str | None:
    """The LoaderInfo EFI variable's text (4 attribute bytes, then UTF-16LE), or None."""
    if not host.exists(LOADER_INFO):
        return None
    try:
        return host.read_bytes(LOADER_INFO, "the LoaderInfo EFI variable")[4:].decode("utf-16-le").rstrip("\0")
    except (P2pkitError, UnicodeDecodeError):
        return None


def _esp(host: Host) -> str | None:
    return next((d for d in ESPS if host.path(f"{d}/loader/loader.conf").is_file()), None)


def bootloader(host: Host) -> dict:
    """Which bootloader boots this host, and what each place it takes the kernel options from holds
    now: {"name", "why", "esp", "entries": {path: options}, "kernel_cmdline": options or None,
    "kernelstub": options or None, "grub": the default entries' options or None}."""
    esp = _esp(host)
    found = {
        "grub": host.path(GRUB_CFG).is_file() and host.runner.which("update-grub") is not None,
        "loader": esp is not None,
        "kernelstub": host.path(KERNELSTUB_CONFIG).is_file() and host.runner.which("kernelstub") is not None,
        "loader_info": _loader_info(host),
    }
    name, why = pb.which(found)
    entries = {}
    if esp is not None:
        for p in sorted(host.path(f"{esp}/loader/entries").glob("*.conf")):
            rel = f"{esp}/loader/entries/{p.name}"
            entries[rel] = pb.entry_options(host.read(rel, "a systemd-boot loader entry"))
    kernelstub = None
    if host.path(KERNELSTUB_CONFIG).is_file():
        try:
            kernelstub = pb.kernelstub_options(host.read(KERNELSTUB_CONFIG, "kernelstub's configuration"))
        except ValueError as e:
            raise ProbeError("kernelstub's configuration", f"{KERNELSTUB_CONFIG} cannot be read as kernelstub's "
                             f"JSON: {e}") from None
    cmdline_file = host.read(KERNEL_CMDLINE, "kernel-install's command line").split() \
        if host.path(KERNEL_CMDLINE).is_file() else None
    return {"name": name, "why": why, "esp": esp, "entries": entries, "kernel_cmdline": cmdline_file,
            "kernelstub": kernelstub, "loader_info": found["loader_info"]}
