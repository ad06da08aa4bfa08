"""driver: the driver role, handed the profile's [driver] values; what it did read back from Ansible."""

from __future__ import annotations

from p2pkit.core.ansible import run_playbook
from p2pkit.core.errors import UsageError
from p2pkit.core.role_defaults import role_default
from p2pkit.host import arch, system
from p2pkit.host.backup import Backup, userspace_paths
from p2pkit.stages.driver.checks import guarded_packages, installer_arch


def driver(ctx) -> dict:
    """The driver role, handed the profile's [driver] values and the host's architecture; what its
    tasks did comes back from Ansible (per task: ok, changed, failed, skipped)."""
    d = ctx.profile.driver
    a = arch.host_arch(ctx.host)
    wrong = installer_arch(a.machine, ctx.profile)
    if wrong.status != "pass":
        raise UsageError(f"{wrong.title}: {wrong.measured}, expected {wrong.expected}", hint=wrong.hint)
    held = system.package_holds(ctx.host)["held"]
    kernel = system.kernel_release(ctx.host)
    backup = Backup(ctx.store.dir, "driver", ctx.host)
    backup.snapshot(  # config files and every driver file the installer may replace: rollback puts them back
        [*guard_files(), *userspace_paths(ctx.host)], kernel, d.version,
        extra={"held_before": held, "installer": f"{d.cache_dir}/{d.installer_url.rsplit('/', 1)[-1]}"})
    try:
        return run_playbook(ctx, "driver", driver_vars(ctx, a.machine))
    finally:  # what the installer added (even when a later task failed): rollback removes it
        backup.record_added(userspace_paths(ctx.host), kernel, d.version)


def driver_vars(ctx, machine: str) -> dict:
    """The driver role's variables: the profile's [driver] section, the host's architecture."""
    d = ctx.profile.driver
    return {
        "p2pkit_arch": machine,
        "p2pkit_driver_version": d.version,
        "p2pkit_driver_installer_url": d.installer_url,
        "p2pkit_driver_installer_sha256": d.installer_sha256,
        "p2pkit_driver_cache_dir": d.cache_dir,
        "p2pkit_driver_guarded_packages": list(guarded_packages()),
    }


def guard_files() -> list[str]:
    """The guards' files the role writes (its defaults/main.yml, p2pkit_driver_guard_files), kept for rollback."""
    return list(role_default("p2pkit_driver", "p2pkit_driver_guard_files").values())
