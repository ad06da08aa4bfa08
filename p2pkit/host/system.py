"""OS, kernel, identity, Secure Boot, disk, dpkg, user, cgroup: read through the host root."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from p2pkit.errors import ProbeError
from p2pkit.host import Host
from p2pkit.parse import system as ps

SECUREBOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def os_release(host: Host) -> dict[str, str]:
    for p in ("/etc/os-release", "/usr/lib/os-release"):
        if host.exists(p):
            return ps.os_release(host.read(p, "the OS release"))
    raise ProbeError("the OS release", "neither /etc/os-release nor /usr/lib/os-release exists")


def kernel_release(host: Host) -> str:
    return host.read("/proc/sys/kernel/osrelease", "the kernel release").strip()


def identity(host: Host) -> dict[str, str]:
    def get(p, what):
        try:
            return host.read(p, what).strip()
        except ProbeError as e:
            return f"unknown ({e.why})"
    return {
        "machine_id": get("/etc/machine-id", "the machine id"),
        "boot_id": get("/proc/sys/kernel/random/boot_id", "the boot id"),
        "kernel": get("/proc/sys/kernel/osrelease", "the kernel release"),
        "hostname": get("/proc/sys/kernel/hostname", "the hostname"),
    }


def boot_id(host: Host) -> str:
    return host.read("/proc/sys/kernel/random/boot_id", "the boot id").strip()


def cmdline(host: Host) -> str:
    return host.read("/proc/cmdline", "the kernel command line").strip()


def cpu_vendor(host: Host) -> str:
    for line in host.read("/proc/cpuinfo", "the CPU vendor").splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def secure_boot(host: Host) -> str:
    """'on', 'off', or 'legacy-bios' (no EFI: Secure Boot cannot be on)."""
    if not host.exists("/sys/firmware/efi"):
        return "legacy-bios"
    if not host.exists(SECUREBOOT_VAR):
        return "off"
    data = host.read_bytes(SECUREBOOT_VAR, "the Secure Boot state")
    if len(data) < 5:
        raise ProbeError("the Secure Boot state", f"{SECUREBOOT_VAR} holds {len(data)} bytes, expected 5")
    return "on" if data[4] == 1 else "off"


TOOLS = ("make", "cc", "c++", "systemd-analyze", "cmake", "ninja", "pkg-config", "git")


def tools(host: Host) -> dict[str, str | None]:
    """Where each command a later stage runs is found on the PATH p2pkit runs commands with."""
    return {t: host.runner.which(t) for t in TOOLS}


def is_root(host: Host) -> bool:
    if host.simulated:
        return host.sim_fact("euid", 0) == 0
    return os.geteuid() == 0


def free_bytes(host: Host, path: str) -> int:
    if host.simulated:
        return int(host.sim_fact("disk_free_bytes", 0))
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def dpkg_status(host: Host) -> str | None:
    p = "/var/lib/dpkg/status"
    return host.read(p, "the dpkg database") if host.exists(p) else None


def self_cgroup(host: Host) -> ps.ProcCgroup:
    return ps.proc_cgroup(host.read("/proc/self/cgroup", "p2pkit's own cgroup"))


def memory_caps(host: Host, cg: ps.ProcCgroup) -> list[tuple[str, int]]:
    """Every memory limit on the path from the cgroup up to the root, v2 and v1."""
    caps = []
    if cg.v2_path is not None and host.exists("/sys/fs/cgroup/cgroup.controllers"):
        caps += _walk(host, "/sys/fs/cgroup", cg.v2_path, "memory.max")
    if "memory" in cg.v1 and host.exists("/sys/fs/cgroup/memory"):
        caps += _walk(host, "/sys/fs/cgroup/memory", cg.v1["memory"], "memory.limit_in_bytes")
    return caps


def _walk(host: Host, mount: str, path: str, fname: str) -> list[tuple[str, int]]:
    caps = []
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts), -1, -1):
        d = "/".join([mount, *parts[:i]])
        f = f"{d}/{fname}"
        if host.exists(f):
            try:
                limit = ps.memory_limit(host.read(f))
            except (ValueError, ProbeError):
                continue
            if limit is not None:
                caps.append((f, limit))
    return caps
