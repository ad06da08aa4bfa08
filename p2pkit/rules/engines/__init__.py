"""The engines p2pkit serves with, one module each (ninfer, llamacpp, vllm). Each owns its flags (FLAGS:
which it knows, which are switches, which take values within what bounds, which name a file it reads or
writes), its command line (argv), its refusals before a start (flag_problems when a profile is read, checks
before a start, and where it has one the built binary's --help: refuse_unaccepted) and what the VRAM fit
reads of its flags (fit_plan, fit_checks).

core/config.py knows no engine: importing this package plugs each engine's rules on [serve.flags] into the
profile's validation (config.plug_engines), as the CLI does before it reads a profile.
"""

from __future__ import annotations

from p2pkit.core import config
from p2pkit.rules.engines import llamacpp, ninfer, vllm

ENGINES = {m.NAME: m for m in (ninfer, llamacpp, vllm)}
config.plug_engines(ENGINES)


def of(p):
    """The engine module of a profile's recipe."""
    return ENGINES[p.engine.recipe]

