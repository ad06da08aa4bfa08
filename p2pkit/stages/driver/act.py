"""driver: the driver role, handed the profile's [driver] values; what it did read back from Ansible."""

from __future__ import annotations

import json
import os

from p2pkit.core import safefs
from p2pkit.core.ansible import run_playbook
from p2pkit.core.artifacts import atomic_write, read_json
from p2pkit.core.errors import UsageError
from p2pkit.core.role_defaults import role_default
from p2pkit.facts.probes import installed_driver_files
from p2pkit.host import arch, dkms, system
from p2pkit.host.backup import Backup, sha256, userspace_paths
from p2pkit.rules import distro
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
    # a distro NVIDIA module package its user holds: refused before this stage adds its own holds (after them, the
    # p2p-module stage tells the user's from p2pkit's by the holds recorded here, held_before)
    refused = distro.held_refusal(distro.user_holds(dkms.nvidia_modules(ctx.host),
                                                    backup.manifest().get("held_before")))
    if refused:
        raise refused
    backup.snapshot(  # config files and every driver file the installer may replace: rollback puts them back
        [*guard_files(), *userspace_paths(ctx.host)], kernel, d.version,
        extra={"held_before": held, "installer": f"{d.cache_dir}/{d.installer_url.rsplit('/', 1)[-1]}"},
        files=guard_files())
    redo = changed_files(ctx)
    if redo:
        ctx.out.warn(f"[driver] {'; '.join(redo[:3])}{f' (and {len(redo) - 3} more)' if len(redo) > 3 else ''}: not "
                     "what the installer wrote (its sha256 recorded at the install): the installer runs again")
    try:
        done = run_playbook(ctx, "driver", {**driver_vars(ctx, a.machine), "p2pkit_driver_reinstall": bool(redo)})
    finally:  # what the installer added (even when a later task failed): rollback removes it
        backup.record_added(userspace_paths(ctx.host), kernel, d.version)
    record_files(ctx)
    return {**done, **({"reinstalled": redo} if redo else {})}


FILES_RECORD = "driver-files.json"  # in the state directory: the installer's files and their sha256 at the install


def changed_files(ctx) -> list[str]:
    """The installer's files (recorded at the last install of this version) that are gone or no longer hold the
    bytes it wrote: hashed again only where the file's identity moved (issue 48 item 3: the GSP firmware and
    nvidia-smi edited with their mtime kept were trusted)."""
    path = ctx.store.dir / FILES_RECORD
    if path.is_symlink():  # a link p2pkit did not make: refused naming it (exit 2), as every write there is
        raise safefs.LinkRefused(f"{path} is a symbolic link (to {os.readlink(path)}): p2pkit reads its own records "
                                 "and never through a link it did not make, so it read nothing through it",
                                 hint=f"remove it (`rm {path}`) and run the same command again: the next install "
                                      "records the driver's files anew")
    rec = read_json(path, "the driver's file record", f"remove {path}: the next install records it anew") or {}
    if not isinstance(rec, dict) or rec.get("version") != ctx.profile.driver.version:
        return []
    out = []
    for path, was in sorted((rec.get("files") or {}).items()):
        p = ctx.host.path(path)
        if not isinstance(was, dict):
            continue
        if not p.is_file():
            out.append(f"{path} is gone")
        elif system.file_identity(p) != was.get("identity") and sha256(p) != was.get("sha256"):
            out.append(f"{path} changed")
    return out


def record_files(ctx) -> None:
    """The installer's files of this version now, with their sha256 and identity (<state>/driver-files.json)."""
    files = {}
    for path in installed_driver_files(ctx.host, ctx.profile):
        p = ctx.host.path(path)
        ident = system.file_identity(p)  # before the hash: a file changed while it is read is not vouched for
        files[path] = {"sha256": sha256(p), "identity": ident}
    atomic_write(ctx.store.dir / FILES_RECORD, (json.dumps({"version": ctx.profile.driver.version, "files": files},
                                                          indent=1, sort_keys=True) + "\n").encode())


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
