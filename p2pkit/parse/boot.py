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
import re

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


# ------------------------------------------------------------------------------------------ GRUB's default

def grubenv(text: str) -> dict[str, str]:
    """/boot/grub/grubenv: GRUB's environment block (`# GRUB Environment Block`, then NAME=value lines padded
    with '#' to 1024 bytes: grub-editenv(1))."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        k, _, v = line.partition("=")
        out[k.strip()] = v
    return out


def grub_menu(cfg: str) -> list[dict]:
    """The menu grub-mkconfig wrote: top-level entries and submenus in order, each {"title", "id", "kernel"
    (the release of its `linux .../vmlinuz-K` line, or None), "children" (a submenu's entries)}. Titles and ids
    as 10_linux quotes them (`menuentry 'TITLE' ... $menuentry_id_option 'ID' {`)."""
    top: list[dict] = []
    stack: list[tuple[list[dict], int]] = [(top, -1)]  # (list, brace depth of the submenu that holds it)
    entry, entry_depth, depth = None, -1, 0
    for raw in cfg.splitlines():
        line = raw.strip()
        m = re.match(r"(menuentry|submenu)\s+'([^']*)'(.*)\{$", line)
        if m:
            ident = re.search(r"\$menuentry_id_option\s+'([^']*)'", m.group(3))
            node = {"title": m.group(2), "id": ident.group(1) if ident else "", "kernel": None, "children": []}
            stack[-1][0].append(node)
            if m.group(1) == "submenu":
                stack.append((node["children"], depth))
            else:
                entry, entry_depth = node, depth
        elif entry is not None and entry["kernel"] is None and re.match(r"linux(16|efi)?\s", line):
            k = re.search(r"vmlinuz-(\S+)", line.split()[1]) if len(line.split()) > 1 else None
            entry["kernel"] = k.group(1) if k else None
        depth += line.count("{") - line.count("}")
        if entry is not None and depth <= entry_depth:
            entry = None
        while len(stack) > 1 and depth <= stack[-1][1]:
            stack.pop()
    return top


def grub_default(cfg: str, env: dict[str, str] | None = None) -> dict | None:
    """The entry GRUB boots without anyone at the keyboard: 00_header's `set default="..."` (grub-reboot's
    next_entry from grubenv first; `${saved_entry}` for GRUB_DEFAULT=saved), a position, title or id, or a
    "submenu>entry" path of them (GRUB's manual, "default"); an entry that is not there falls back to the
    first. Returns {"entry": its path of titles, "kernel": its release, "set_default": the value GRUB used}
    or None where the menu has no entry with a kernel."""
    env = env or {}
    values = re.findall(r'^\s*set default="([^"]*)"', cfg, re.M)
    plain = [v for v in values if v != "${next_entry}"]
    want = env.get("next_entry") or (plain[-1] if plain else "0")
    if want == "${saved_entry}":
        want = env.get("saved_entry") or "0"
    menu = grub_menu(cfg)

    def pick(nodes: list[dict], part: str) -> dict | None:
        if part.isdigit():
            return nodes[int(part)] if int(part) < len(nodes) else None
        return next((n for n in nodes if part in (n["title"], n["id"])), None)

    nodes, path, chosen = menu, [], None
    for part in want.split(">"):
        chosen = pick(nodes, part)
        if chosen is None:
            break
        path.append(chosen["title"])
        nodes = chosen["children"]
    if chosen is None or chosen["children"] or not chosen["kernel"]:
        chosen, path = (menu[0], [menu[0]["title"]]) if menu else (None, [])
    if chosen is None or not chosen["kernel"]:
        return None
    return {"entry": ">".join(path), "kernel": chosen["kernel"], "set_default": want}


def grub_kernels(cfg: str) -> list[str]:
    """Every kernel release grub.cfg has an entry for."""
    out: list[str] = []

    def walk(nodes):
        for n in nodes:
            if n["kernel"] and n["kernel"] not in out:
                out.append(n["kernel"])
            walk(n["children"])
    walk(grub_menu(cfg))
    return out
