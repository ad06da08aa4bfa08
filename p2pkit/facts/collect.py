"""Every fact p2pkit reads, by name, read concurrently. A stage names the facts it needs; `p2pkit facts
record` takes them all; `p2pkit doctor --facts FILE` judges a recorded host anywhere. What each fact is,
its probe and its type, is declared once in the fact table (p2pkit/facts/table.py).

Each probe runs wrapped so that a failure becomes {"error": "could not determine ..."}: the checks decide
whether the stage needed that fact.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from p2pkit import __version__
from p2pkit.core.errors import P2pkitError, UsageError
from p2pkit.core.secrets import REDACTED, is_secret
from p2pkit.facts.table import TABLE, read
from p2pkit.host import Host

log = logging.getLogger("p2pkit.facts.collect")


# views of the fact table: the facts whose probes run without a profile, and those that need one
COLLECTORS: dict[str, Callable[[Host], object]] = {f.name: f.probe for f in TABLE if f.probe and not f.needs}
PROFILE_COLLECTORS: dict[str, Callable[[Host, object], object]] = {f.name: f.probe for f in TABLE
                                                                    if f.probe and f.needs}
_READ = {f.name: f for f in TABLE if f.probe is not None}


def _one(host: Host, name: str, profile, used: dict[str, Future] | None = None) -> object:
    """One fact read, its failure a reading ({"error": ...}). `used`: the futures of the facts it uses (Fact.uses),
    submitted before it, so their workers run before it waits on them."""
    t0 = time.monotonic()
    try:
        fact = _READ[name]
        if fact.needs and profile is None:
            return {"error": f"could not determine {name}: it needs a profile"}
        return read(fact, host, profile, {k: f.result() for k, f in (used or {}).items()})
    except P2pkitError as e:
        return {"error": e.message}
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"error": f"could not determine {name}: {type(e).__name__}: {e}"}
    finally:
        log.debug("fact %s: %.3f s", name, time.monotonic() - t0)


# The facts that wait on a process or a library (nvidia-smi, dpkg-query and apt-mark, modinfo, dmesg,
# NVML's import and init), slowest first: they start before the file reads, so the wait is the
# slowest one's, not their sum (measured on the H200: docs/measurements.md). The engine's /health first: a
# silent engine gives no answer for probes.LIVE_TIMEOUT_S.
WAITING = ("engine_live", "package_holds", "smi_topo_m", "smi_p2p_read", "smi_p2p_write", "module", "kernel_log",
           "nvml", "persistence_mode", "arch", "built_module", "module_sources", "engine_archs", "engine_nccl",
           "kernel", "distro_dkms")


# facts started before they were asked for, by host root and name (start_early)
_EARLY: dict[tuple[str, str], Future] = {}


def start_early(host: Host) -> None:
    """Start the waiting facts that need no profile now, each in a thread of its own; collect() on
    the same host takes their results instead of reading them again. For `doctor`, whose command
    line says early what it will read: the wait on nvidia-smi and NVML then overlaps the import of
    the rest of p2pkit and the CLI framework (p2pkit.cli.main)."""
    names = [n for n in WAITING if n in COLLECTORS]
    pool = ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="p2pkit-early-fact")
    for n in names:
        _EARLY[(str(host.root), n)] = pool.submit(_one, host, n, None)
    pool.shutdown(wait=False)


def collect(host: Host, names: tuple[str, ...] | list[str] | None = None, profile=None) -> dict:
    """The named facts, read concurrently (nvidia-smi and NVML each take a while; none waits for another)."""
    asked = list(names or [*COLLECTORS, *(PROFILE_COLLECTORS if profile else ())])
    # a fact another one uses is read too (and before it: a worker never waits on a fact still queued behind it)
    wanted = list(dict.fromkeys([u for n in asked for u in _READ[n].uses if n in _READ] + asked))
    early = {n: _EARLY.pop((str(host.root), n)) for n in wanted if (str(host.root), n) in _EARLY}
    order = sorted((n for n in wanted if n not in early),
                   key=lambda n: (bool(_READ[n].uses) if n in _READ else False,
                                  WAITING.index(n) if n in WAITING else len(WAITING)))
    with ThreadPoolExecutor(max_workers=min(len(WAITING) + 2, len(order) or 1)) as pool:
        futures = dict(early)
        for n in order:
            used = {u: futures[u] for u in _READ[n].uses} if n in _READ else None
            futures[n] = pool.submit(_one, host, n, profile, used)
        return {n: futures[n].result() for n in asked}


class Snapshot:
    """The facts of one judgement of every stage (one `status`; the pass `up` makes before it acts on any): a
    fact several stages read (the kernel log: rebar's and topology's re-checks) is read once, nothing acting on
    the host between them. A read in which the runner refused a command (p2pkit not run as root) is not kept:
    each stage that needs those facts reads them again and sees the refusal as its own."""

    def __init__(self, host: Host, profile=None):
        self.host, self.profile = host, profile
        self._kept: dict[str, object] = {}

    def collect(self, names: tuple[str, ...] | list[str]) -> dict:
        missing = [n for n in names if n not in self._kept]
        got: dict = {}
        if missing:
            refused = len(self.host.runner.denied)
            got = collect(self.host, missing, self.profile)
            if len(self.host.runner.denied) == refused:
                self._kept.update(got)
        return {n: got[n] if n in got else self._kept[n] for n in names}


def record(host: Host, profile=None) -> dict:
    return {
        "kind": "p2pkit-facts",
        "schema": 1,
        "p2pkit_version": __version__,
        "simulated": host.simulated,
        "recorded_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "root": str(host.root),
        # the profile the facts were recorded under, whole: `doctor --facts` judges with it anywhere
        "profile": None if profile is None else recorded_profile(profile),
        "facts": collect(host, profile=profile),
    }


def recorded_profile(profile) -> dict:
    """The profile whole, secrets (serve.env values named or marked as such) shown as <redacted>."""
    from p2pkit.core import hoststate  # here, not above: `doctor` imports this module to start its facts early

    values = profile.as_dict()
    env = values["serve"]["env"]
    values["serve"]["env"] = {k: REDACTED if is_secret(k, profile.secret_names()) else v for k, v in env.items()}
    return {"name": profile.name, "source": profile.source, "overrides": hoststate.public_overrides(profile),
            "values": values}


def load_recorded(path: Path) -> dict:
    from p2pkit.facts import types as fact_types

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read facts file {path}: {e}",
                         hint="record one with `p2pkit facts record FILE` on the host to judge") from e
    why = fact_types.recording_problem(doc)
    if why:
        raise UsageError(f"{path} is not a p2pkit facts file: {why}",
                         hint="record one with `p2pkit facts record FILE` on the host to judge")
    # a fact not of its declared type is judged as one that could not be read, naming what it is not
    return {**doc, "facts": fact_types.checked(doc["facts"])}
