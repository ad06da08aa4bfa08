"""The fixed stage sequence. Each stage names the profile sections it depends on, the facts it
reads, its pure checks, and, for the stages that change the host, what it does (a playbook)."""

from __future__ import annotations

from p2pkit.stages.stage import Stage

__all__ = ["Stage", "get", "names", "registry"]


def registry() -> list[Stage]:
    from p2pkit.stages import definitions

    return definitions.STAGES


def names() -> list[str]:
    return [s.name for s in registry()]


def get(name: str) -> Stage:
    for s in registry():
        if s.name == name:
            return s
    from p2pkit.core.errors import UsageError

    raise UsageError(f"no stage named {name!r}", hint="stages are: " + ", ".join(names()))
