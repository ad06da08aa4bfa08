"""The NVIDIA kernel module and userspace driver: what is loaded, what modprobe would load,
and which userspace driver version and GSP firmware are installed."""

from __future__ import annotations

import re

from p2pkit.core.errors import P2pkitError, ProbeError
from p2pkit.host import Host
from p2pkit.parse import system as ps


def proc_version(host: Host) -> dict:
    if not host.exists("/proc/driver/nvidia/version"):
        return {"loaded": False}
    v = ps.nvidia_version(host.read("/proc/driver/nvidia/version", "the loaded NVIDIA driver"))
    return {"loaded": True, "version": v.version, "open_module": v.open_module, "builder": v.builder,
            "line": v.raw}


def module(host: Host) -> dict:
    """The loaded module's srcversion, and what modprobe would load for the running kernel."""
    loaded = host.read("/sys/module/nvidia/srcversion").strip() if host.exists("/sys/module/nvidia/srcversion") \
        else None
    kernel = host.read("/proc/sys/kernel/osrelease", "the kernel release").strip()
    return {"loaded_srcversion": loaded, **modinfo(host, kernel)}


# the links linux-base keeps at the newest kernel (linux-update-symlinks(8)): Debian's at /vmlinuz, Ubuntu's
# (link_in_boot = yes in /etc/kernel-img.conf) at /boot/vmlinuz
BOOT_IMAGES = ("/vmlinuz", "/boot/vmlinuz")
GRUB_CFG, GRUBENV = "/boot/grub/grub.cfg", "/boot/grub/grubenv"


def _linked_kernel(host: Host) -> tuple[str | None, str | None]:
    """The release the first of BOOT_IMAGES that is a link names, and how it reads ("/vmlinuz -> ...")."""
    import os

    for link in BOOT_IMAGES:
        try:
            target = os.readlink(host.path(link))
        except OSError:
            continue
        name = target.rsplit("/", 1)[-1]
        if name.startswith("vmlinuz-"):
            return name[len("vmlinuz-"):], f"{link} -> {target}"
    return None, None


def pending_kernel(host: Host) -> dict:
    """The kernel the next boot starts when it is not the running one (an upgrade installed it, the
    reboot has not come yet), and what modprobe would load for it. The bootloader's own default decides
    where p2pkit can read it: GRUB's default entry in grub.cfg (with grubenv's next_entry, saved_entry);
    a kernel newer than every grub.cfg entry (the link linux-base keeps, /vmlinuz or /boot/vmlinuz, names
    it and update-grub has not run since) is the next boot's too, as the update-grub after its install makes
    it. Where GRUB's default stays on the running kernel while grub.cfg has the linked one (p2pkit's kernel
    hook held it, P36, or GRUB_DEFAULT names it), the next boot is the running kernel, held. No grub.cfg:
    the link alone."""
    from p2pkit.host.system import BOOT_HOLD
    from p2pkit.parse import boot as pb

    running = host.read("/proc/sys/kernel/osrelease", "the kernel release").strip()
    linked, how = _linked_kernel(host)
    grub = None
    if host.path(GRUB_CFG).is_file():
        cfg = host.read(GRUB_CFG, "GRUB's configuration")
        env = pb.grubenv(host.read(GRUBENV, "GRUB's environment")) if host.path(GRUBENV).is_file() else {}
        grub = pb.grub_default(cfg, env)
        listed = pb.grub_kernels(cfg)
    if grub is None and linked is None:
        raise ProbeError("the next boot's kernel", f"no GRUB default entry with a kernel in {GRUB_CFG}, and neither "
                         f"{' nor '.join(BOOT_IMAGES)} is a link to a vmlinuz-<release>")
    said = [f"GRUB's default entry '{grub['entry']}' boots {grub['kernel']} ({GRUB_CFG})"] if grub else []
    said += [how] if how else []
    out = {"running": running, "boot_image": "; ".join(said)}
    # p2pkit's kernel hook held the boot default at the running kernel (P36): the update-grub after it keeps it
    held = host.exists(BOOT_HOLD) and f"# p2pkit-kernel={running}" in host.read(BOOT_HOLD, "the boot-default hold")
    if grub and grub["kernel"] != running:
        kernel = grub["kernel"]
    elif linked and linked != running and (grub is None or linked not in listed) and not held:
        kernel = linked  # installed after grub.cfg was written: the update-grub after its install boots it
        if grub:
            out["boot_image"] += f" (no entry in {GRUB_CFG} yet: the next update-grub makes it the default)"
    else:
        kernel = None
    if kernel is None:
        if linked and linked != running:
            return {**out, "kernel": None, "held_for": linked}  # the next boot stays on the running kernel (P36)
        return {**out, "kernel": None}
    return {**out, "kernel": kernel, **modinfo(host, kernel)}


def modinfo(host: Host, kernel: str) -> dict:
    """What modprobe would load for `kernel`: the nvidia module's file, srcversion and signing key
    (one modinfo prints them all)."""
    out: dict = {}
    try:
        r = host.runner.run(["modinfo", "-k", kernel, "nvidia"], check=False)
        if r.returncode == 0:
            fields = ps.modinfo_fields(r.stdout)
            out["modinfo_filename"] = fields.get("filename")
            out["modinfo_srcversion"] = fields.get("srcversion") or None
            out["modinfo_sig_key"] = fields.get("sig_key") or None  # the signing key's serial (Secure Boot)
        else:
            out["modinfo_filename"] = None
            out["modinfo_error"] = (r.stderr or r.stdout).strip()
    except P2pkitError as e:
        out["modinfo_error"] = e.message
    return out


def userspace_driver(host: Host) -> dict:
    """The installed userspace version from libnvidia-ml.so.<version>, and its GSP firmware files."""
    versions = set()
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/aarch64-linux-gnu",
              "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"):
        for name in host.listdir(d):
            m = re.fullmatch(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)", name)
            if m:
                versions.add(m.group(1))
    if not versions:
        raise ProbeError("the userspace driver version", "no libnvidia-ml.so.<version> is installed")
    out = {"versions": sorted(versions)}
    out["gsp_firmware"] = {v: [f for f in host.listdir(f"/lib/firmware/nvidia/{v}") if f.startswith("gsp")]
                           for v in sorted(versions)}
    return out
