"""Global options and the objects every command builds from them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from p2pkit import config
from p2pkit.artifacts import Store
from p2pkit.host import Host
from p2pkit.output import Output
from p2pkit.pipeline import Ctx, state_dir_default


@dataclass
class Options:
    profile: str | None = None
    overrides: tuple[str, ...] = ()
    root: Path = Path("/")
    state_dir: Path | None = None
    json: bool = False
    yes: bool = False
    debug: bool = False


OPTS = Options()


def output() -> Output:
    return Output(json_mode=OPTS.json)


def host() -> Host:
    return Host.at(OPTS.root)


def profile(h: Host | None = None) -> config.Profile:
    return config.load(OPTS.profile or (h.sim.get("profile") if h is not None and h.simulated else None),
                       OPTS.overrides)


def context(h: Host | None = None) -> Ctx:
    h = h or host()
    out = Output(json_mode=OPTS.json, simulated=h.simulated)
    profile_ = profile(h)
    store = Store(OPTS.state_dir or state_dir_default(h.root))
    return Ctx(profile=profile_, host=h, store=store, out=out, debug=OPTS.debug, yes=OPTS.yes)


def setup_logging(debug: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(name)s: %(message)s")
