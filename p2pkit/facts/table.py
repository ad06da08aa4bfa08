"""The fact table: every fact p2pkit reads, declared once. A line names the fact, its probe (the only
code that touches the host for it), its type (p2pkit/facts/shapes.py, or written in the line), the
profile sections its probe reads, and, where the probe hands back a raw reading (a command's text, an
NVML value), the pure parser that makes the fact of it.

collect.py runs the probes this table names (COLLECTORS, PROFILE_COLLECTORS are views of it); types.py
judges a fact against the type this table names (FACTS is a view of it). A check declares the facts it
reads by these names (p2pkit.rules.findings.reads); a stage collects exactly those."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from p2pkit.facts import probes as pr
from p2pkit.facts import shapes as t
from p2pkit.host import Host, arch, boot, kmod, mok, nvml, pci, roce, smi, storage, system
from p2pkit.host import field_facts as hfield
from p2pkit.parse import nvml as pnvml


@dataclass(frozen=True)
class Fact:
    name: str
    # host -> reading; (host, profile) -> reading where `needs` names profile sections. None: no probe reads
    # it now (an earlier p2pkit recorded it; its type still judges an old recording)
    probe: Callable[..., Any] | None
    type: Any
    needs: tuple[str, ...] = ()  # the profile sections the probe reads; empty: it runs without a profile
    parse: Callable[[Any], Any] | None = None  # raw reading -> fact; None: the probe parses (host/ calls parse/)
    # facts of the same collection the probe is handed (as keyword arguments, by name) instead of reading them
    # again: vram_fit takes the nvml fact rather than opening a second NVML session (20 ms on the H200)
    uses: tuple[str, ...] = ()


TABLE: tuple[Fact, ...] = (
    Fact("driver_guards", pr._guards, t.Guards),
    Fact("arch", arch.machine, str),
    Fact("package_holds", system.package_holds, t.PackageHolds),
    Fact("restore_guards", system.restore_guards, dict[str, bool]),
    Fact("restore_units", pr._restore_units, t.RestoreUnits),
    Fact("engine_unit", pr._engine_unit, dict[str, str | bool]),
    Fact("identity", system.identity, t.Identity),
    Fact("os", pr._os, dict[str, str]),
    Fact("kernel", system.kernel_release, str),
    Fact("is_root", system.is_root, bool),
    Fact("tools", system.tools, dict[str, str | None]),
    Fact("secure_boot", system.secure_boot, Literal["on", "off", "legacy-bios"] | str),
    Fact("iommu", pr._iommu, t.Iommu),
    Fact("bootloader", boot.bootloader, t.Bootloader),
    Fact("disk", pr._disk, t.Disk),
    Fact("dpkg_nvidia", pr._dpkg, list[t.DpkgProblem] | None),
    Fact("distro_dkms", pr._distro_dkms, t.DistroDkms),
    Fact("cgroup", pr._cgroup, t.Cgroup),
    Fact("pci_gpus", pci.gpus, list[t.PciGpu]),
    Fact("nvidia_version", kmod.proc_version, t.KernelModuleVersion),
    Fact("module", kmod.module, t.Module),
    Fact("pending_kernel", kmod.pending_kernel, t.PendingKernel),
    Fact("userspace_driver", kmod.userspace_driver, t.UserspaceDriver),
    Fact("nvml", nvml.facts, t.Nvml),
    Fact("persistence_mode", lambda h: nvml.per_gpu(h, "nvmlDeviceGetPersistenceMode"),
         dict[str, Literal["Enabled", "Disabled"] | t.Failed], parse=pnvml.persistence_modes),
    Fact("smi_p2p_read", lambda h: smi.topo_p2p(h, "r"), t.SmiMatrix),
    Fact("smi_p2p_write", lambda h: smi.topo_p2p(h, "w"), t.SmiMatrix),
    Fact("smi_topo_m", smi.topo_m, t.SmiMatrix),
    Fact("roce", roce.ports, list[t.RocePort]),
    Fact("driver_params", hfield.driver_params, t.DriverParams),
    Fact("acs", hfield.acs, t.Acs),
    Fact("kernel_log", hfield.kernel_log, t.KernelLog),
    Fact("drm", hfield.drm_connectors, t.Drm),
    Fact("module_sources", hfield.module_sources, t.ModuleSources),
    Fact("roce_gids", hfield.roce_gids, t.RoceGids),
    Fact("engine_env_file", pr._engine_env_file, t.EngineEnvFile),
    Fact("boot_hold", pr._boot_hold, t.BootHold),
    Fact("engine_nccl", pr._engine_nccl, t.EngineNccl),
    # the facts that need a profile
    Fact("engine_live", pr._engine_live, t.EngineLive, needs=("serve",)),
    Fact("vram_fit", pr._vram_fit, t.VramFit, needs=("engine", "model", "serve"), uses=("nvml",)),
    Fact("head_rendezvous", pr._head, t.HeadRendezvous, needs=("engine", "serve")),
    Fact("built_module", pr._built_module, t.BuiltModule, needs=("driver", "p2p_module")),
    Fact("storage", storage.nvme_paths, dict[str, t.Storage], needs=("model",)),
    Fact("engine_archs", pr._engine_archs, t.EngineArchs, needs=("engine",)),
    Fact("profile_nccl", pr._profile_nccl, t.ProfileNccl | None, needs=("engine",)),
    Fact("engine_files", pr._engine_files, t.EngineFiles, needs=("engine",)),
    Fact("service_files", pr._service_files, dict[str, t.WrittenFile | None]),
    Fact("driver_files", pr._driver_files, dict[str, t.WrittenFile], needs=("driver",)),
    Fact("model_file", pr._model_file, t.ModelFile, needs=("model",)),
    # the machine's module signing key: where the profile says, else /var/lib/p2pkit/mok/ (host/mok.py)
    Fact("mok", lambda h, p: mok.facts(h, p, mok.KEY_STATE_DIR), t.Mok, needs=("p2p_module",)),
    # recorded by earlier versions, read by none now: still typed, so an old recording loads as it was
    Fact("smi_q", None, t.SmiQ),
)

BY_NAME: dict[str, Fact] = {f.name: f for f in TABLE}


def read(fact: Fact, host: Host, profile, used: dict | None = None) -> Any:
    """The fact from its probe (and its parser, where it has one): a reading that failed ({"error": ...}) is
    handed on as it is. `used`: the facts it uses (Fact.uses) as this collection read them; a probe read alone
    reads them itself."""
    kw = used or {}
    raw = fact.probe(host, profile, **kw) if fact.needs else fact.probe(host, **kw)
    if fact.parse is None or (isinstance(raw, dict) and "error" in raw and set(raw) <= {"error", "by_hand"}):
        return raw
    return fact.parse(raw)
