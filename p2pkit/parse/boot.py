"""Bootloaders' own files, read and (for a loader entry) rewritten as pure text: which bootloader a
host boots with, and which kernel options its next boot gets.

Formats:
- systemd-boot loader entries (the Boot Loader Specification, type #1 `.conf`): one `key value`
  per line, `options` may repeat and its values are joined (systemd's 90-loaderentry.install
  writes `options    root=... ro quiet splash`; kernelstub's make_loader_entry writes
  `options root=UUID=... ro quiet splash`).
- /etc/kernel/cmdline: kernel-install's command line for the entries it writes, one line.
- /etc/kernelstub/configuration: kernelstub's JSON (kernelstub/config.py: `default` and `user`
  sections, `kernel_options` a list, a string in configurations before config_rev 3).
"""

from __future__ import annotations

import json

from p2pkit.core.breaks import lines

GRUB, SYSTEMD_BOOT, KERNELSTUB, UNKNOWN = "grub", "systemd-boot", "kernelstub", "unknown"


def entry_options(text: str) -> list[str]:
    """The kernel options of a loader entry: every `options` line's words, in order."""
    out: list[str] = []
    for line in lines(text):  # systemd-boot ends a line at \n: a U+2028 is no line break to it
        key, _, value = line.strip().partition(" ")
        if key == "options":
            out += value.split()
    return out


def entry_with_options(text: str, options: list[str]) -> str:
    """The entry with each option it lacks appended to its first `options` line (a new one where it
    has none); every other line as it was. An entry that has them all comes back unchanged."""
    missing = [o for o in options if o not in entry_options(text)]
    if not missing:
        return text
    parts = text.split("\n")
    for i, line in enumerate(parts):
        if line.strip().partition(" ")[0] == "options":
            body = line.rstrip("\r")
            parts[i] = body + " " + " ".join(missing) + line[len(body):]
            return "\n".join(parts)
    sep = "" if not text or text.endswith("\n") else "\n"
    return text + sep + "options " + " ".join(missing) + "\n"


def kernel_install_cmdline(proc_cmdline: str) -> list[str]:
    """What kernel-install puts on a new entry where /etc/kernel/cmdline is missing: the running
    command line without the bootloader's own BOOT_IMAGE= and initrd= words."""
    return [w for w in proc_cmdline.split() if not w.startswith(("BOOT_IMAGE=", "initrd="))]


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
