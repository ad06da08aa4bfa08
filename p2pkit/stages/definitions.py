"""The registry, in order: preflight, driver, p2p-module, rebar, topology, link, engine, model, service.

A stage's check is its module's check plus the field pitfalls (P28-P39) that break that stage's result;
the facts a stage collects are the ones its checks declare (p2pkit.rules.findings.reads). Each stage
module's checks are imported as <stage folder>_<module>: preflight_checks, driver_checks. What a stage does
and measures (its act and measure modules) is imported when first called (later()): doctor and status only
judge, and the act modules' imports (Ansible's runner, the backups, tarfile) were a fifth of doctor's
(issue 38 item 9)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from p2pkit.rules.findings import combine
from p2pkit.stages.driver import checks as driver_checks
from p2pkit.stages.engine import checks as engine_checks
from p2pkit.stages.link import checks as link_checks
from p2pkit.stages.model import checks as model_checks
from p2pkit.stages.p2p_module import checks as p2p_module_checks
from p2pkit.stages.preflight import checks as preflight_checks
from p2pkit.stages.rebar import checks as rebar_checks
from p2pkit.stages.service import checks as service_checks
from p2pkit.stages.stage import Stage
from p2pkit.stages.topology import checks as topology_checks


def later(module: str, name: str) -> Callable:
    """p2pkit.stages.<module>'s function `name`, imported and looked up when called (so a replaced one is the
    one called)."""
    def call(*args, **kwargs):
        return getattr(import_module(f"p2pkit.stages.{module}"), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = f"p2pkit.stages.{module}"
    return call


def one_gpu_per_host(p) -> str | None:
    """BAR1 P2P is between two GPUs of one host; a host with one GPU (a DGX Spark node) has none."""
    if p.gpus.count >= 2:
        return None
    return (f"{p.gpus.count} GPU per host: no GPU-to-GPU P2P over BAR1"
            + (" (the nodes' GPUs meet over RoCE)" if p.network.require_roce else ""))


STAGES: list[Stage] = [
    Stage("preflight", "host matches the profile", inputs=("host", "gpus", "p2p_module.iommu"),
          check=preflight_checks.check),
    Stage("driver", "pinned userspace driver", inputs=("driver",),
          check=combine(driver_checks.check, driver_checks.files_recorded), precheck=driver_checks.precheck,
          act=later("driver.act", "driver"), reprove=("driver_files", driver_checks.reproved)),
    Stage("p2p-module", "open kernel modules (the P2P fork for a GPU pair)", inputs=("driver", "p2p_module"),
          check=combine(p2p_module_checks.check, p2p_module_checks.static_bar1, p2p_module_checks.module_sources,
                        p2p_module_checks.boot_default),
          precheck=p2p_module_checks.precheck, act=later("p2p_module.act", "p2p_module"),
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
          measure=later("link.measure", "measure"), reprove=(None, link_checks.reproved)),
    Stage("engine", "inference engine built from pinned source", inputs=("engine",),
          check=combine(engine_checks.check, engine_checks.kernel_archs), precheck=engine_checks.precheck,
          act=later("engine.act", "act"), measure=later("engine.act", "measure"),
          reprove=("engine_files", engine_checks.reproved)),
    Stage("model", "model converted and verified", inputs=("engine", "model"),
          check=model_checks.check, precheck=model_checks.precheck, act=later("model.act", "act"),
          measure=later("model.act", "measure"), reprove=("model_file", model_checks.reproved)),
    Stage("service", "engine service healthy, no memory cap", inputs=("serve", "engine", "model"),
          check=combine(service_checks.check, service_checks.nccl_p2p_level, service_checks.nccl_floor,
                        service_checks.files_in_place, service_checks.unit_loaded),
          precheck=service_checks.precheck, act=later("service.act", "act"),
          live=("engine_live", service_checks.alive),
          measure=later("service.act", "measure"), reprove=("service_files", service_checks.reproved)),
]
