"""Bootloaders' own files, read and (for a loader entry) rewritten as pure text: which bootloader a
host boots with, and which kernel options its next boot gets.

Formats:
- systemd-boot loader entries (the Boot Loader Specification, type #1 `.conf`) and /etc/kernel/cmdline
  (kernel-install's command line for the entries it writes, one line): p2pkit.core.bootentry, named here
  (the p2p-module role writes them with that very file, its filter plugins).
- /etc/kernelstub/configuration: kernelstub's JSON (kernelstub/config.py: `default` and `user`
  sections, `kernel_options` a list, a string in configurations before config_rev 3).
"""

from __future__ import annotations

import json

# systemd-boot's options lines, read and written by the p2p-module role's filters too
from p2pkit.core.bootentry import entry_options, entry_with_options, kernel_install_cmdline

__all__ = ["GRUB", "KERNELSTUB", "SYSTEMD_BOOT", "UNKNOWN", "entry_options", "entry_with_options",
           "kernel_install_cmdline", "kernelstub_options", "which"]

GRUB, SYSTEMD_BOOT, KERNELSTUB, UNKNOWN = "grub", "systemd-boot", "kernelstub", "unknown"


def kernelstub_options(text: str) -> list[str]:
    """The options kernelstub passes to the next boot: the `user` section's kernel_options (the
    `default` section's where there is no `user`). Raises ValueError on text that is not its JSON."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    section = doc.get("user") or doc.get("default")
    if not isinstance(section, dict):
        raise ValueError("no user or default section")
    opts = section.get("kernel_options", [])
    if isinstance(opts, str):  # configurations older than config_rev 3
        return opts.split()
    if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
        raise ValueError("kernel_options is not a list of strings")
    return [w for o in opts for w in o.split()]


def which(found: dict) -> tuple[str, str]:
    """The bootloader from what the host has: {"grub": bool (grub.cfg and update-grub), "loader":
    bool (an ESP with loader/loader.conf), "kernelstub": bool (its configuration and command),
    "loader_info": str | None (the LoaderInfo EFI variable systemd-boot sets for the boot it
    started)}. Returns the name and why."""
    if found.get("kernelstub"):  # Pop!_OS: kernelstub writes systemd-boot's entry (or the NVRAM's)
        return KERNELSTUB, "/etc/kernelstub/configuration and the kernelstub command"
    if found.get("loader") and (not found.get("grub") or (found.get("loader_info") or "").startswith("systemd-boot")):
        why = "loader/loader.conf on the ESP" + (f"; this boot's LoaderInfo: {found['loader_info']}"
                                                  if found.get("loader_info") else "")
        return SYSTEMD_BOOT, why
    if found.get("grub"):
        return GRUB, "/boot/grub/grub.cfg and update-grub"
    return UNKNOWN, "no grub.cfg with update-grub, no ESP with loader/loader.conf, no kernelstub"
