"""What a stage is: the profile sections it depends on, its pure checks (and the facts they read), and,
for the stages that change the host, what it does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from p2pkit.rules.findings import Check


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    inputs: tuple[str, ...]
    # facts, profile -> findings; it declares the facts it reads (p2pkit.rules.findings.reads)
    check: Callable[[dict, object], list[Check]] | None = None
    precheck: Callable[[object], list[Check]] | None = None  # profile -> refusals before acting
    act: Callable[[object], dict] | None = None  # ctx -> what was done
    # ctx, what the act did in this run (None: it did not act in this run) -> extra facts from a real load (link)
    measure: Callable[[object, dict | None], dict] | None = None
    # facts, ctx, what the act did -> (why a reboot is needed, ids of the checks only a reboot can pass)
    reboot: Callable[[dict, object, dict], tuple[str, list[str]] | None] | None = None
    # facts, a check a reboot was asked for and that still fails after it, the boot id that asked ->
    # that check as a failure (named what to do by hand): no second reboot for the same thing
    unapplied: Callable[[dict, Check, str], Check] | None = None
    implemented: bool = True
    # profile -> why the stage does not apply to it (one GPU per host: no BAR1 P2P), or None
    applies: Callable[[object], str | None] | None = None
    # for a stage that measures (status cannot re-run its proof): the one fact status re-reads each time,
    # within a second or two, and its check (the service: a frozen engine is not "done")
    live: tuple[str, Callable[[object], list[Check]]] | None = None
    # checks whose warning `status` shows beside a done stage (a module waiting for the reboot into a new kernel)
    notes: tuple[str, ...] = ()
    # for a stage that measures: what `status` and the gate re-prove of what its artifact claims, without
    # measuring again (the engine's built files, the model's output, the link's figures against their own
    # samples): the fresh fact it reads (None: the artifact alone) and its judge (the artifact's facts, that
    # fresh fact, profile) -> findings. A failure makes the stage stale with the reason; `up` redoes it.
    reprove: tuple[str | None, Callable[[dict, object, object], list[Check]]] | None = None

    @property
    def facts(self) -> tuple[str, ...]:
        """The facts the stage collects: exactly those its checks declare they read."""
        return tuple(getattr(self.check, "reads", ())) if self.check is not None else ()

    @property
    def given(self) -> tuple[str, ...]:
        """The facts its checks read that its measurement or live probe hands them, never collected."""
        return tuple(getattr(self.check, "given", ())) if self.check is not None else ()

    def not_applicable(self, profile) -> str | None:
        return self.applies(profile) if self.applies is not None else None
