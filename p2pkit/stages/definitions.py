"""The registry, in order: preflight, driver, p2p-module, rebar, topology, link, engine, model, service.

A stage's check is its module's check plus the field pitfalls (P28-P39) that break that stage's result;
the facts a stage collects are the ones its checks declare (p2pkit.rules.findings.reads). Each stage
module is imported as <stage folder>_<module>: preflight_checks, driver_act, link_measure."""

from __future__ import annotations

from p2pkit.rules.findings import combine
from p2pkit.stages.driver import act as driver_act
from p2pkit.stages.driver import checks as driver_checks
from p2pkit.stages.engine import act as engine_act
from p2pkit.stages.engine import checks as engine_checks
from p2pkit.stages.link import checks as link_checks
from p2pkit.stages.link import measure as link_measure
from p2pkit.stages.model import act as model_act
from p2pkit.stages.model import checks as model_checks
from p2pkit.stages.p2p_module import act as p2p_module_act
from p2pkit.stages.p2p_module import checks as p2p_module_checks
from p2pkit.stages.preflight import checks as preflight_checks
from p2pkit.stages.rebar import checks as rebar_checks
from p2pkit.stages.service import act as service_act
from p2pkit.stages.service import checks as service_checks
from p2pkit.stages.stage import Stage
from p2pkit.stages.topology import checks as topology_checks


def one_gpu_per_host(p) -> str | None:
    """BAR1 P2P is between two GPUs of one host; a host with one GPU (a DGX Spark node) has none."""
    if p.gpus.count >= 2:
        return None
    return (f"{p.gpus.count} GPU per host: no GPU-to-GPU P2P over BAR1"
            + (" (the nodes' GPUs meet over RoCE)" if p.network.require_roce else ""))


STAGES: list[Stage] = [
    Stage("preflight", "host matches the profile", inputs=("host", "gpus", "p2p_module.iommu"),
          check=preflight_checks.check),
    Stage("driver", "pinned userspace driver", inputs=("driver",), check=driver_checks.check,
          precheck=driver_checks.precheck,
          act=driver_act.driver),
    Stage("p2p-module", "open kernel modules (the P2P fork for a GPU pair)", inputs=("driver", "p2p_module"),
          check=combine(p2p_module_checks.check, p2p_module_checks.static_bar1, p2p_module_checks.module_sources,
                        p2p_module_checks.boot_default),
          precheck=p2p_module_checks.precheck, act=p2p_module_act.p2p_module,
          reboot=p2p_module_checks.reboot_with_note, unapplied=p2p_module_checks.not_applied,
          notes=("p2p.pending_kernel",)),
    Stage("rebar", "BAR1 covers VRAM", inputs=("gpus", "pcie"),
          check=combine(rebar_checks.check, rebar_checks.bar_assignment), applies=one_gpu_per_host),
    Stage("topology", "root ports, link capability, P2P status", inputs=("gpus", "pcie", "network"),
          check=combine(topology_checks.check, topology_checks.acs_redirect, topology_checks.iommu_translating,
                        topology_checks.displays)),
    Stage("link", "link training and P2P bandwidth under load (and the RoCE fabric ports)",
          inputs=("gpus", "pcie", "link", "network"),
          check=combine(link_checks.check, link_checks.wedged, link_checks.roce),
          measure=link_measure.measure, reprove=(None, link_checks.reproved)),
    Stage("engine", "inference engine built from pinned source", inputs=("engine",),
          check=combine(engine_checks.check, engine_checks.kernel_archs), precheck=engine_checks.precheck,
          act=engine_act.act, measure=engine_act.measure, reprove=("engine_files", engine_checks.reproved)),
    Stage("model", "model converted and verified", inputs=("engine", "model"),
          check=model_checks.check, precheck=model_checks.precheck, act=model_act.act, measure=model_act.measure,
          reprove=("model_file", model_checks.reproved)),
    Stage("service", "engine service healthy, no memory cap", inputs=("serve", "engine", "model"),
          check=combine(service_checks.check, service_checks.nccl_p2p_level, service_checks.nccl_floor,
                        service_checks.files_in_place),
          precheck=service_checks.precheck, act=service_act.act, live=("engine_live", service_checks.alive),
          measure=service_act.measure, reprove=("service_files", service_checks.reproved)),
]
