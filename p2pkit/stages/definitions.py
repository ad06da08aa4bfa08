"""The registry, in order: preflight, driver, p2p-module, rebar, topology, link, engine, model, service."""

from __future__ import annotations

from p2pkit.checks import driver, engine, link, model, p2p_module, preflight, rebar, service, topology
from p2pkit.stages import acting
from p2pkit.stages import engine as engine_stage
from p2pkit.stages import link as link_stage
from p2pkit.stages import model as model_stage
from p2pkit.stages import service as service_stage
from p2pkit.stages.stage import Stage

PREFLIGHT_FACTS = ("os", "kernel", "is_root", "disk", "secure_boot", "pci_gpus", "iommu", "bootloader",
                   "dpkg_nvidia", "cgroup", "tools", "mok")
P2P_FACTS = ("kernel", "nvidia_version", "module", "built_module", "nvml", "secure_boot", "iommu", "bootloader",
             "restore_guards", "pending_kernel", "mok")

def one_gpu_per_host(p) -> str | None:
    """BAR1 P2P is between two GPUs of one host; a host with one GPU (a DGX Spark node) has none."""
    if p.gpus.count >= 2:
        return None
    return (f"{p.gpus.count} GPU per host: no GPU-to-GPU P2P over BAR1"
            + (" (the nodes' GPUs meet over RoCE)" if p.network.require_roce else ""))


STAGES: list[Stage] = [
    Stage("preflight", "host matches the profile", inputs=("host", "gpus", "p2p_module.iommu"),
          facts=PREFLIGHT_FACTS, check=preflight.check),
    Stage("driver", "pinned userspace driver", inputs=("driver",),
          facts=("userspace_driver", "driver_guards", "arch", "package_holds"), check=driver.check,
          precheck=driver.precheck,
          act=acting.driver),
    Stage("p2p-module", "open kernel modules (the P2P fork for a GPU pair)", inputs=("driver", "p2p_module"),
          facts=P2P_FACTS, check=p2p_module.check, precheck=p2p_module.precheck, act=acting.p2p_module,
          reboot=p2p_module.reboot_with_note, unapplied=p2p_module.not_applied, notes=("p2p.pending_kernel",)),
    Stage("rebar", "BAR1 covers VRAM", inputs=("gpus", "pcie"), facts=("pci_gpus", "nvml"), check=rebar.check,
          applies=one_gpu_per_host),
    Stage("topology", "root ports, link capability, P2P status", inputs=("gpus", "pcie", "network"),
          facts=("pci_gpus", "nvml", "smi_p2p_read", "smi_p2p_write", "smi_topo_m", "roce"),
          check=topology.check),
    Stage("link", "link training and P2P bandwidth under load (and the RoCE fabric ports)",
          inputs=("gpus", "pcie", "link", "network"), facts=("roce", "nvml"), check=link.check,
          measure=link_stage.measure),
    Stage("engine", "inference engine built from pinned source", inputs=("engine",),
          check=engine.check, precheck=engine.precheck, act=engine_stage.act, measure=engine_stage.measure),
    Stage("model", "model converted and verified", inputs=("engine", "model"), facts=("storage",),
          check=model.check, precheck=model.precheck, act=model_stage.act, measure=model_stage.measure),
    Stage("service", "systemd service healthy, no memory cap", inputs=("serve", "engine", "model"),
          facts=("cgroup", "head_rendezvous", "vram_fit"), check=service.check,
          precheck=service.precheck, act=service_stage.act, live=("engine_live", service.alive),
          measure=service_stage.measure),
]
