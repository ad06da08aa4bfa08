"""The bootloader a host boots with (GRUB, systemd-boot, kernelstub) and where each keeps the kernel
command line. The follow-up commands of a change (update-grub, depmod, update-initramfs, systemd's
reload) are decided by the p2p-module role from their effects, not here."""

from __future__ import annotations

from p2pkit.core.errors import P2pkitError, ProbeError
from p2pkit.host import Host
from p2pkit.parse import boot as pb

GRUB_CFG = "/boot/grub/grub.cfg"
ESPS = ("/boot/efi", "/efi", "/boot")  # where systemd-boot's ESP (or XBOOTLDR) is mounted on Ubuntu and elsewhere
KERNEL_CMDLINE = "/etc/kernel/cmdline"  # kernel-install's command line for the entries it writes
KERNELSTUB_CONFIG = "/etc/kernelstub/configuration"
# set by systemd-boot for the boot it started (the Boot Loader Interface); GRUB does not set it
LOADER_INFO = "/sys/firmware/efi/efivars/LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"












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
