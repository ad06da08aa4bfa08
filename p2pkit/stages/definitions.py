"""The registry, in order: preflight, driver, p2p-module, rebar, topology, link, engine, model, service.

A stage's check is its module's check plus the field pitfalls (P28-P39) that break that stage's result;
the facts a stage collects are the ones its checks declare (p2pkit.rules.findings.reads)."""

from __future__ import annotations

from p2pkit.rules.findings import combine
from p2pkit.stages.driver import act as driver_act
from p2pkit.stages.driver import checks as driver
from p2pkit.stages.engine import act as engine_stage
from p2pkit.stages.engine import checks as engine
from p2pkit.stages.link import checks as link
from p2pkit.stages.link import measure as link_stage
from p2pkit.stages.model import act as model_stage
from p2pkit.stages.model import checks as model
from p2pkit.stages.p2p_module import act as acting
from p2pkit.stages.p2p_module import checks as p2p_module
from p2pkit.stages.preflight import checks as preflight
from p2pkit.stages.rebar import checks as rebar
from p2pkit.stages.service import act as service_stage
from p2pkit.stages.service import checks as service
from p2pkit.stages.stage import Stage
from p2pkit.stages.topology import checks as topology


def one_gpu_per_host(p) -> str | None:
    """BAR1 P2P is between two GPUs of one host; a host with one GPU (a DGX Spark node) has none."""
    if p.gpus.count >= 2:
        return None
    return (f"{p.gpus.count} GPU per host: no GPU-to-GPU P2P over BAR1"
            + (" (the nodes' GPUs meet over RoCE)" if p.network.require_roce else ""))


STAGES: list[Stage] = [
    Stage("preflight", "host matches the profile", inputs=("host", "gpus", "p2p_module.iommu"),
          check=preflight.check),
    Stage("driver", "pinned userspace driver", inputs=("driver",), check=driver.check,
          precheck=driver.precheck,
          act=driver_act.driver),
    Stage("p2p-module", "open kernel modules (the P2P fork for a GPU pair)", inputs=("driver", "p2p_module"),
          check=combine(p2p_module.check, p2p_module.static_bar1, p2p_module.module_sources,
                        p2p_module.boot_default),
          precheck=p2p_module.precheck, act=acting.p2p_module,
          reboot=p2p_module.reboot_with_note, unapplied=p2p_module.not_applied, notes=("p2p.pending_kernel",)),
    Stage("rebar", "BAR1 covers VRAM", inputs=("gpus", "pcie"), check=combine(rebar.check, rebar.bar_assignment),
          applies=one_gpu_per_host),
    Stage("topology", "root ports, link capability, P2P status", inputs=("gpus", "pcie", "network"),
          check=combine(topology.check, topology.acs_redirect, topology.iommu_translating, topology.displays)),
    Stage("link", "link training and P2P bandwidth under load (and the RoCE fabric ports)",
          inputs=("gpus", "pcie", "link", "network"), check=combine(link.check, link.wedged, link.roce),
          measure=link_stage.measure, reprove=(None, link.reproved)),
    Stage("engine", "inference engine built from pinned source", inputs=("engine",),
          check=combine(engine.check, engine.kernel_archs), precheck=engine.precheck, act=engine_stage.act,
          measure=engine_stage.measure, reprove=("engine_files", engine.reproved)),
    Stage("model", "model converted and verified", inputs=("engine", "model"),
          check=model.check, precheck=model.precheck, act=model_stage.act, measure=model_stage.measure,
          reprove=("model_file", model.reproved)),
    Stage("service", "engine service healthy, no memory cap", inputs=("serve", "engine", "model"),
          check=combine(service.check, service.nccl_p2p_level, service.nccl_floor), precheck=service.precheck,
          act=service_stage.act, live=("engine_live", service.alive), measure=service_stage.measure),
]
