"""What the driver and p2p-module stages do to the host: their playbooks, with the variables the
profile and the host give them."""

from __future__ import annotations

import sys
from pathlib import Path

from p2pkit.ansible import run_playbook
from p2pkit.host import system


def p2p_src_dir(profile) -> str:
    return f"{profile.driver.cache_dir}/open-gpu-kernel-modules"


def iommu_cmdline(mode: str, cpu_vendor: str) -> str:
    vendor = "amd_iommu" if "AMD" in cpu_vendor.upper() else "intel_iommu"
    return f"{vendor}=on iommu=pt" if mode == "passthrough" else f"{vendor}=off"


def driver(ctx) -> dict:
    d = ctx.profile.driver
    return run_playbook(ctx, "driver", {
        "p2pkit_driver_version": d.version,
        "p2pkit_driver_installer_url": d.installer_url,
        "p2pkit_driver_installer_sha256": d.installer_sha256,
        "p2pkit_driver_cache_dir": d.cache_dir,
    })


def p2p_module(ctx, kernel: str | None = None) -> dict:
    m = ctx.profile.p2p_module
    return run_playbook(ctx, "p2p-module", {
        "p2pkit_p2p_module_repo": m.repo,
        "p2pkit_p2p_module_branch": m.branch,
        "p2pkit_p2p_module_commit": m.commit,
        "p2pkit_p2p_module_src_dir": p2p_src_dir(ctx.profile),
        "p2pkit_p2p_module_kernel": kernel or system.kernel_release(ctx.host),
        "p2pkit_p2p_module_cmdline": iommu_cmdline(m.iommu, system.cpu_vendor(ctx.host)),
        "p2pkit_p2p_module_p2pkit": str(Path(sys.executable).parent / "p2pkit"),
        "p2pkit_p2p_module_profile": ctx.profile.source,
    })
