"""The registry, in order: preflight, driver, p2p-module, rebar, topology, link, engine, model, service."""

from __future__ import annotations

from p2pkit.checks import preflight
from p2pkit.stages import Stage

STAGES: list[Stage] = [
    Stage("preflight", "host matches the profile", inputs=("host", "gpus", "p2p_module"),
          facts=("os", "kernel", "is_root", "disk", "secure_boot", "pci_gpus", "iommu", "dpkg_nvidia", "cgroup"),
          check=preflight.check),
    Stage("driver", "pinned userspace driver", inputs=("driver",), implemented=False),
    Stage("p2p-module", "P2P-patched open kernel modules", inputs=("driver", "p2p_module"), implemented=False),
    Stage("rebar", "BAR1 covers VRAM", inputs=("gpus", "pcie"), implemented=False),
    Stage("topology", "root ports, link capability, P2P status", inputs=("gpus", "pcie"), implemented=False),
    Stage("link", "link training and P2P bandwidth under load", inputs=("gpus", "pcie", "link"),
          implemented=False),
    Stage("engine", "inference engine built from pinned source", inputs=("engine",), implemented=False),
    Stage("model", "model converted and verified", inputs=("engine", "model"), implemented=False),
    Stage("service", "systemd service healthy, no memory cap", inputs=("serve", "engine", "model"),
          implemented=False),
]
