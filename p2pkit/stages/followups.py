"""Which follow-up commands a stage still owes the host, judged from their effects (p2pkit/host/boot.py),
not from whether the change that asks for them happened in this run: a run killed after a file was
written and before its handler ran leaves a file that no longer differs and an effect that is
missing, and the next run (or `--force`) must find that as work.

Each function takes what the probes read and returns the reasons the follow-up is owed ([] when
its effect is in place)."""

from __future__ import annotations

VIDEO_KO = "kernel/drivers/video/nvidia.ko"


def grub(args: list[list[str]] | None, options: list[str]) -> list[str]:
    """update-grub: every default entry of grub.cfg carries every option the drop-in sets."""
    if args is None:  # no grub.cfg: nothing update-grub would regenerate
        return []
    if not args:
        return ["grub.cfg has no linux entry"]
    missing = sorted({o for entry in args for o in options if o not in entry})
    return [f"grub.cfg lacks {' '.join(missing)}, which the drop-in sets"] if missing else []


def depmod(dep: dict | None, ko_mtime_ns: int | None) -> list[str]:
    """depmod: its map lists the patched module, no updates/ copy of nvidia, and is newer than the module."""
    if ko_mtime_ns is None:  # no patched module installed yet: the install task has the work
        return []
    if dep is None:
        return ["modules.dep is missing"]
    why = []
    if VIDEO_KO not in dep["paths"]:
        why.append(f"modules.dep does not list {VIDEO_KO}")
    stale = [p for p in dep["paths"] if p.startswith("updates/") and "/nvidia" in "/" + p]
    if stale:
        why.append(f"modules.dep still lists {', '.join(stale)}")
    if dep["mtime_ns"] is not None and dep["mtime_ns"] < ko_mtime_ns:
        why.append(f"modules.dep is older than {VIDEO_KO}")
    return why


def initramfs(image: dict | None, inputs: dict[str, int | None], only_patched: bool = False) -> list[str]:
    """update-initramfs: the image is newer than each of its inputs (path -> mtime: the modprobe.d files,
    the patched module under the key VIDEO_KO) and holds each modprobe.d file, where this image holds
    modprobe.d at all (initramfs-tools copies it); with `only_patched`, no nvidia.ko in it but the
    patched one."""
    if image is None:
        return ["the initramfs is missing or cannot be listed"]
    why = []
    copies_conf = any(f.startswith("etc/modprobe.d/") for f in image["files"])
    for path, mtime in inputs.items():
        if mtime is None:
            continue
        if path != VIDEO_KO and copies_conf and path.lstrip("/") not in image["files"]:
            why.append(f"the initramfs lacks {path}")
        elif image["mtime_ns"] is not None and image["mtime_ns"] < mtime:
            why.append(f"the initramfs is older than {path}")
    other = [p for p in image["nvidia"] if not p.endswith((VIDEO_KO, VIDEO_KO + ".zst"))]
    if only_patched and other:
        why.append(f"the initramfs holds another nvidia.ko: {', '.join(other)}")
    return why
