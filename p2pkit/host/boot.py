"""What the follow-up commands of a change leave on the host, read back from the effect itself:
the GRUB configuration update-grub wrote, depmod's map, the initramfs image, systemd's view of
unit files changed on disk. A stage proves each from here, so a follow-up a kill skipped is redone
on the next run whether or not the change that asked for it happens again."""

from __future__ import annotations

from p2pkit.errors import P2pkitError
from p2pkit.host import Host
from p2pkit.parse import field as pf
from p2pkit.parse import system as ps

GRUB_CFG = "/boot/grub/grub.cfg"


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
