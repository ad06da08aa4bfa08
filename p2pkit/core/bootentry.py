"""systemd-boot's kernel options, read from and written into its own files as pure text: a loader
entry's `options` lines and kernel-install's command line. Standard library only, importing nothing of
p2pkit: the p2pkit.host collection's filter plugins use this very file (plugins/module_utils/bootentry.py,
a relative symlink to it), so the role writes the entries p2pkit read them as. p2pkit.parse.boot names
them for p2pkit's own callers.

A loader entry (the Boot Loader Specification, type #1 `.conf`) holds one `key value` per line;
`options` may repeat and its values are joined (systemd's 90-loaderentry.install writes
`options    root=... ro quiet splash`; kernelstub's make_loader_entry writes
`options root=UUID=... ro quiet splash`).
"""

from __future__ import annotations


def entry_options(text: str) -> list[str]:
    """The kernel options of a loader entry: every `options` line's words, in order."""
    out: list[str] = []
    # systemd-boot ends a line at \n only (as p2pkit.core.breaks.lines splits): a U+2028 is no line break to it
    for line in text.split("\n"):
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


def kernel_cmdline_file(base: list[str], options: list[str]) -> str:
    """/etc/kernel/cmdline's text: its words (or, where it is missing, kernel_install_cmdline's) with
    each option they lack appended, one line."""
    return " ".join([*base, *(o for o in options if o not in base)]) + "\n"
