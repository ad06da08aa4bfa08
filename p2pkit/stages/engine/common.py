"""What every engine recipe's build shares: the engine role's name and its first run (the build directory's
parent, the build dependencies, the checkout), the per-run build logs, and which recipe module builds the
profile's engine (stages/engine/<recipe>.py, named as rules/engines names it: one list of recipes, there)."""

from __future__ import annotations

import importlib
import re
import shutil
import time
from pathlib import Path

from p2pkit.core import safefs
from p2pkit.core.ansible import run_playbook
from p2pkit.core.role_defaults import role_default
from p2pkit.rules import engine_cmd

ROLE = "p2pkit_engine"
COMMON_ROLE = "p2pkit_common"
KEEP_LOGS = 20  # build logs kept in <state>/logs, one per run, the oldest deleted first


def recipe(p):
    """The engine stage's module for the profile's recipe: stages/engine/<NAME>.py, where NAME is the engine
    module's (rules/engines). It owns the recipe's build, its record and the checks of that record."""
    return importlib.import_module(f"{__package__}.{engine_cmd.engine(p).NAME}")


def build_logs(ctx) -> list[Path]:
    """This engine's build logs, oldest first (engine-build-NNNN-<UTC time>.log: one per run)."""
    d = ctx.store.dir / "logs"
    found = [x for x in d.glob("engine-build-*.log") if re.match(r"engine-build-\d+-", x.name)] if d.is_dir() else []
    return sorted(found, key=lambda x: int(x.name.split("-")[2]))


def new_log(ctx, title: str) -> Path:
    """A new log for this run, its first line `title`; earlier runs' logs are kept (the last KEEP_LOGS)."""
    logs = safefs.makedirs(ctx.store.dir / "logs")  # no link on the way (issue 40)
    old = build_logs(ctx)
    n = int(old[-1].name.split("-")[2]) + 1 if old else 1
    for x in old[:max(0, len(old) - KEEP_LOGS + 1)]:
        x.unlink()
    log = logs / f"engine-build-{n:04d}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"
    safefs.write_text(log, f"# p2pkit engine build: {title}{' (SIMULATED host)' if ctx.host.simulated else ''}\n",
                      new=True)  # this run's own
    return log


def last_log(ctx, *marks: str) -> Path | None:
    """The log of the last run holding one of `marks` (a run refused before it built proves nothing about
    what is built); before logs were kept per run, the one engine-build.log."""
    for x in reversed(build_logs(ctx)):
        text = x.read_text(errors="replace")
        if any(m in text for m in marks):
            return x
    legacy = ctx.store.dir / "logs/engine-build.log"
    return legacy if legacy.is_file() else None


def head_of(ctx, src: Path) -> dict:
    """Read-only: the git checkout in src and its HEAD (None when there is none)."""
    head = ctx.host.runner.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=False).stdout.strip() \
        if (src / ".git").is_dir() else None
    return {"path": str(src), "head": head or None}


def dpkg_installed_pattern() -> str:
    """How dpkg's database says a package is installed, as the engine role (and the driver and p2p-module roles)
    read it: the common role's p2pkit_dpkg_installed (defaults/main.yml), each match (package, selection)."""
    return role_default(COMMON_ROLE, "p2pkit_dpkg_installed")


def missing_dependencies(ctx) -> list[str]:
    """Read-only: the recipe's build dependencies (the engine role's defaults) that the engine role would install,
    decided as the role decides: dpkg's database (/var/lib/dpkg/status under the host root) says the package is
    installed, or else each of the package's tools (p2pkit_engine_tools) is an executable on the host's PATH."""
    pkgs = role_default(ROLE, "p2pkit_engine_packages").get(ctx.profile.engine.recipe) or []
    tools = role_default(ROLE, "p2pkit_engine_tools")
    try:
        text = ctx.host.path("/var/lib/dpkg/status").read_text(errors="replace")
        installed = {name for name, _selection in re.findall(dpkg_installed_pattern(), text, re.M)}
    except OSError:
        installed = set()
    path = ":".join(d for d in ctx.host.runner.path_env().split(":") if d.startswith("/"))
    return [pkg for pkg in pkgs if pkg not in installed
            and not (tools.get(pkg) and all(shutil.which(t, path=path) for t in tools[pkg]))]


def base_vars(ctx) -> dict:
    """What the engine role is given for every recipe: the recipe, the build directory, and the repository and
    pinned commit to check out (none where the recipe's source is not a git checkout)."""
    e = ctx.profile.engine
    git = recipe(ctx.profile).checks_out(ctx.profile)
    return {"p2pkit_engine_recipe": e.recipe, "p2pkit_engine_build_dir": e.build_dir,
            "p2pkit_engine_repo": e.repo if git else "", "p2pkit_engine_commit": e.commit if git else "",
            "p2pkit_engine_build": False}


def dependencies(ctx) -> dict:
    """The engine role's first run: the build directory's parent (a mode only when it makes it), the
    build dependencies dpkg does not have and whose tools are not on PATH (through apt-get), and the
    checkout at the pinned commit (a tree of empty directories where it belongs is removed, one holding
    a file refused). The role decides each from the host; p2pkit hands it the profile's values and
    keeps Ansible's own count. The build follows: in the same run when nothing is to be installed first,
    else in a second run after the recipe's own checks."""
    return run_playbook(ctx, "engine", base_vars(ctx))
