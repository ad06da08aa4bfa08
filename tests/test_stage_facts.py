"""Issue 28: a check declares the facts it reads, a stage collects exactly those, and doctor lists every
pitfall id on every profile ("n/a" with why where no finding names it).

The facts the checks run on are real hosts' (tests/fixtures/h200-device/facts.json and field-run/facts.json,
recorded by `p2pkit facts record` on the H200 machine: their READMEs say how)."""

from __future__ import annotations

import json
import re

import pytest

from p2pkit.core import config
from p2pkit.facts import collect as facts_mod
from p2pkit.rules.findings import reads
from p2pkit.rules.pitfalls import CHECKED_BY, PITFALLS
from p2pkit.stages import registry
from tests.conftest import FIXTURES

RECORDED = [json.loads((FIXTURES / f"h200-device/{name}").read_text())["facts"]
            for name in ("facts.json", "field-run/facts.json")]
PROFILES = config.builtin_names()


class Tracking(dict):
    """A facts dict that records every top-level fact a check reads, present or not."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.read: set[str] = set()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        self.read.add(k)
        return super().get(k, default)

    def __contains__(self, k):
        self.read.add(k)
        return super().__contains__(k)


def undeclared(st, found: dict, profile) -> set[str]:
    f = Tracking(found)
    st.check(f, profile)
    return f.read - set(st.facts) - set(st.given)


def test_the_tracker_catches_a_read_that_was_not_declared():
    @reads("kernel")
    def sneaky(f, p):
        return [f.get("kernel"), f.get("acs")]

    class St:
        check, facts, given = sneaky, ("kernel",), ()

    assert undeclared(St, RECORDED[0], None) == {"acs"}


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("recorded", range(len(RECORDED)))
def test_each_stage_check_reads_only_the_facts_it_declares(name, recorded):
    profile = config.load(name)
    for st in registry():
        if st.check is None:
            continue
        assert undeclared(st, RECORDED[recorded], profile) == set(), st.name


@pytest.mark.parametrize("name", PROFILES)
def test_checks_run_on_only_their_declared_facts(name):
    """What `up` hands a stage's checks: its declared facts, nothing else. No check reaches for a fact
    its stage did not collect (a KeyError here is a fact read but not declared)."""
    profile = config.load(name)
    for st in registry():
        for found in RECORDED:
            only = {k: v for k, v in found.items() if k in st.facts}
            st.check(only, profile)  # raises on an undeclared f[...] read


def test_a_stage_collects_what_its_checks_declare_and_every_one_is_collectable():
    collectable = set(facts_mod.COLLECTORS) | set(facts_mod.PROFILE_COLLECTORS)
    by = {st.name: st for st in registry()}
    for st in registry():
        assert set(st.facts) <= collectable, (st.name, set(st.facts) - collectable)
        assert not set(st.given) & collectable - {"engine_live"}, st.name  # given: measured, never collected
    # the field facts now travel with the stage whose result they break
    assert {"driver_params", "module_sources", "boot_hold"} <= set(by["p2p-module"].facts)
    assert {"acs", "drm", "kernel_log"} <= set(by["topology"].facts)
    assert "kernel_log" in by["rebar"].facts and "roce_gids" in by["link"].facts
    assert "engine_archs" in by["engine"].facts
    assert {"engine_env_file", "engine_nccl", "profile_nccl"} <= set(by["service"].facts)


# ------------------------------------------------------------------------------- doctor: all 39 pitfalls

SCENARIO = {"dual-spark-vllm": "spark-head"}


@pytest.mark.parametrize("name", PROFILES)
def test_doctor_lists_every_pitfall_id_on_every_profile(cli, sim, name):
    root = sim(SCENARIO.get(name, "healthy"), name=name)
    r = cli("--root", str(root), "--profile", name, "--json", "doctor")  # cli validates the JSON schema
    doc = json.loads(r.out)
    assert [x["id"] for x in doc["pitfalls"]] == list(PITFALLS) and len(PITFALLS) == 39
    named = {c["pitfall"] for g in doc["groups"] for c in g["checks"]}
    for x in doc["pitfalls"]:
        if x["status"] == "n/a":
            assert x["why"] and not x["checks"] and x["id"] not in named, x
        else:
            assert x["id"] in named and x["checks"], x
    by = {x["id"]: x for x in doc["pitfalls"]}
    # no host fact shows a benchmark's rules: n/a on every profile, saying where they are judged
    assert all(by[p]["status"] == "n/a" for p in ("P13", "P14", "P15"))
    assert re.search(r"`p2pkit (--root \S+ )?bench`", by["P13"]["why"]), by["P13"]["why"]  # on the host it names
    if name == "dual-spark-vllm":  # one GPU per node: the rebar stage does not apply, so neither does P31
        assert by["P31"]["status"] == "n/a" and "rebar stage does not apply" in by["P31"]["why"]
    else:  # a pair: the field checks are judged in their stages
        assert by["P29"]["status"] != "n/a" and "field.acs" in by["P29"]["checks"]
    assert "field" not in [g["stage"] for g in doc["groups"]]
    text = cli("--root", str(root), "--profile", name, "doctor").out
    assert "P14" in text and "n/a" in text


def test_every_pitfall_says_where_it_is_checked():
    names = {st.name for st in registry()}
    assert list(CHECKED_BY) == list(PITFALLS)
    assert all(stage is None or stage in names for stage, _ in CHECKED_BY.values())
    # the pitfalls no stage checks: P13 and P15 are `p2pkit bench`'s rules, P14 has no check at all
    assert sorted(p for p, (stage, _) in CHECKED_BY.items() if stage is None) == ["P13", "P14", "P15"]


def test_a_fact_that_uses_another_takes_the_collections_reading(sim, monkeypatch):
    """vram_fit uses the nvml fact (Fact.uses): in one collection NVML is read once, and vram_fit's GPUs are that
    reading's; asked alone, vram_fit still gets it (the used fact is read first); read outside a collection, the
    probe opens NVML itself. Before `uses`, vram_fit opened a second NVML session (20 ms on the H200)."""
    from p2pkit.facts import table
    from p2pkit.host import Host
    from p2pkit.host import nvml as host_nvml

    root = sim("p2p-up")  # the patched module loaded: NVML answers
    host, p = Host.at(root), config.load(str(root / ".p2pkit-sim/profile.toml"))
    real, calls = host_nvml.facts, []

    def counting(h):
        calls.append(h)
        return real(h)

    monkeypatch.setattr(host_nvml, "facts", counting)  # the probe's own read (vram_fit alone)
    nvml_fact = table.BY_NAME["nvml"]
    object.__setattr__(nvml_fact, "probe", counting)
    try:
        got = facts_mod.collect(host, ["nvml", "vram_fit"], p)
        assert len(calls) == 1, calls
        assert "error" not in got["nvml"], got["nvml"]
        totals = [g["memory_total"] for g in got["nvml"]["gpus"]]
        assert [g["total"] for g in got["vram_fit"]["gpus"]] == totals and len(totals) == 2
        calls.clear()
        alone = facts_mod.collect(host, ["vram_fit"], p)
        assert list(alone) == ["vram_fit"] and len(calls) == 1
        calls.clear()
        table.read(table.BY_NAME["vram_fit"], host, p)
        assert len(calls) == 1
    finally:
        object.__setattr__(nvml_fact, "probe", real)
