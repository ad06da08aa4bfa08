"""What root later executes, loads or hands to a service, stage by stage (issue 48 item 2): the places a stage
writes that root or the engine's service uses afterwards (the installer cache and the installer, the driver's
guard files, the kernel hooks and restore units, the engine's checkout and binary, the model and its directory,
the unit, slice and environment files, the engine's working directory, the logs, the stage's own artifact).

Each place is p2pkit's: a stage wrote it. `status` calls a stage stale where one of them (or a directory above
it) is writable by another user or owned by someone else than root (the engine's own account where it must own
its directory); `up` refuses a directory above it that is not p2pkit's (exit 2: path, owner, mode and the fix)
and repairs the place itself (owner root, no group or other write), says so, and has the stage act again (what
another user could write is not trusted as proven)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from p2pkit.core.role_defaults import role_default


@dataclass(frozen=True)
class Place:
    path: str  # as the host names it
    what: str  # what it is, for the message
    engine_owned: bool = False  # the engine's account owns it (its working directory)
    tree: bool = False  # a directory whose whole tree `up` repairs (status judges the directory alone)


def places(stage: str, profile, state: str) -> list[Place]:
    """The places `stage` writes that root or the service uses later; `state`: the state directory as the host
    names it. Each stage's artifact and the stages' logs directory are among them."""
    out = [Place(f"{state}/{stage}.json", f"the {stage} stage's artifact")]
    p = profile
    if stage == "driver":
        cache = p.driver.cache_dir
        out += [Place(cache, "the installer cache"),
                Place(f"{cache}/{p.driver.installer_url.rstrip('/').rpartition('/')[2]}", "the NVIDIA installer")]
        out += [Place(f, "a file the driver role writes")
                for f in role_default("p2pkit_driver", "p2pkit_driver_guard_files").values()]
        out.append(Place(f"{state}/logs", "the stages' logs"))
    elif stage == "p2p-module":
        paths = role_default("p2pkit_p2p_module", "p2pkit_p2p_module_paths")
        out += [Place(f, "a file the p2p-module role writes (root reads or runs it)") for f in paths.values()]
        out += [Place(posixpath.dirname(paths["headers_hook"]), "the headers' postinst hook directory"),
                Place(f"{p.driver.cache_dir}/open-gpu-kernel-modules", "the fork's checkout (built and installed "
                      "into the kernel)", tree=True)]
    elif stage == "engine" and p.engine.build_dir:
        from p2pkit.rules import engine_cmd

        out += [Place(posixpath.dirname(p.engine.build_dir), "the engine's parent directory"),
                Place(p.engine.build_dir, "the engine's checkout and build", tree=True)]
        try:
            out.append(Place(engine_cmd.binary(p), "the engine's binary"))
        except (KeyError, AttributeError, ValueError):
            pass
    elif stage == "model" and p.model.format != "hf" and p.model.output:
        out += [Place(posixpath.dirname(p.model.output), "the model's directory"),
                Place(p.model.output, "the model the engine loads")]
    elif stage == "service":
        from p2pkit.host import system

        out += [Place(f, "a file the service role writes (systemd reads it, the engine gets it)")
                for f in system.ENGINE_FILES]
        out += [Place(posixpath.dirname(system.ENGINE_ENV_FILE), "the engine's environment directory"),
                Place(f"{state}/engine", "the engine's working directory", engine_owned=True)]
    return out
