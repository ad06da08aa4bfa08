"""The host's CPU architecture and what follows from it: NVIDIA's installer name and Debian's
architecture name. x86_64 (the 5090 hosts) and aarch64 (DGX Spark, GB10). The multiarch library
directory the installer fills is the driver role's (vars/<machine>.yml, p2pkit_driver_arch_libdir), the
IOMMU options the p2p-module role's (p2pkit_p2p_module_iommu_options): each stated once, there."""

from __future__ import annotations

from dataclasses import dataclass

from p2pkit.core.errors import P2pkitError
from p2pkit.host import Host


@dataclass(frozen=True)
class Arch:
    machine: str  # `uname -m`
    dpkg: str  # `dpkg --print-architecture`

    def installer(self, version: str) -> str:
        """NVIDIA's installer for this architecture (download.nvidia.com/XFree86/Linux-<machine>/<v>/...)."""
        return f"NVIDIA-Linux-{self.machine}-{version}.run"


ARCHES = {
    "x86_64": Arch("x86_64", "amd64"),
    "aarch64": Arch("aarch64", "arm64"),
}


def of(machine: str) -> Arch:
    if machine not in ARCHES:
        raise P2pkitError(f"this host's architecture is {machine}: p2pkit knows {', '.join(ARCHES)}",
                          hint="run p2pkit on an x86_64 or aarch64 host")
    return ARCHES[machine]


def machine(host: Host) -> str:
    """`uname -m`, answered by the host object (no process: it is known in-process)."""
    return host.machine()


def host_arch(host: Host) -> Arch:
    return of(machine(host))
