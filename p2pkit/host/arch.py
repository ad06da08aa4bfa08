"""The host's CPU architecture and what follows from it: NVIDIA's installer name, the multiarch
library directory, Debian's architecture name and the kernel option that puts the IOMMU in
passthrough. x86_64 (the 5090 hosts) and aarch64 (DGX Spark, GB10)."""

from __future__ import annotations

from dataclasses import dataclass

from p2pkit.core.errors import P2pkitError
from p2pkit.host import Host


@dataclass(frozen=True)
class Arch:
    machine: str  # `uname -m`
    libdir: str  # Debian/Ubuntu multiarch directory, where the .run installer puts libnvidia-ml.so.<v>
    dpkg: str  # `dpkg --print-architecture`

    def installer(self, version: str) -> str:
        """NVIDIA's installer for this architecture (download.nvidia.com/XFree86/Linux-<machine>/<v>/...)."""
        return f"NVIDIA-Linux-{self.machine}-{version}.run"


ARCHES = {
    "x86_64": Arch("x86_64", "/usr/lib/x86_64-linux-gnu", "amd64"),
    "aarch64": Arch("aarch64", "/usr/lib/aarch64-linux-gnu", "arm64"),
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
