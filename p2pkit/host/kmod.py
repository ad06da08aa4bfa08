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


BOOT_IMAGE = "/boot/vmlinuz"  # linux-base keeps it at the newest kernel, the one GRUB's default entry boots


def pending_kernel(host: Host) -> dict:
    """The kernel the next boot starts when it is not the running one (an upgrade installed it, the
    reboot has not come yet), and what modprobe would load for it. The /boot/vmlinuz symlink names
    it, unless p2pkit's kernel hook held the boot default at the running kernel (P36)."""
    import os

    from p2pkit.host.system import BOOT_HOLD

    running = host.read("/proc/sys/kernel/osrelease", "the kernel release").strip()
    try:
        target = os.readlink(host.path(BOOT_IMAGE))
    except OSError as e:
        raise ProbeError("the next boot's kernel", f"{BOOT_IMAGE} is not a symlink ({e.strerror or e})") from None
    name = target.rsplit("/", 1)[-1]
    if not name.startswith("vmlinuz-"):
        raise ProbeError("the next boot's kernel", f"{BOOT_IMAGE} points at {target}, not a vmlinuz-<release>")
    kernel = name[len("vmlinuz-"):]
    out = {"running": running, "boot_image": f"{BOOT_IMAGE} -> {target}"}
    if kernel == running:
        return {**out, "kernel": None}
    if host.exists(BOOT_HOLD) and f"# p2pkit-kernel={running}" in host.read(BOOT_HOLD, "the boot-default hold"):
        return {**out, "kernel": None, "held_for": kernel}  # the next boot stays on the running kernel (P36)
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
