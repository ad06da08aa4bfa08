"""Every fact has a declared type with its units (p2pkit/facts/types.py): what the collectors return on
every simulated scenario and what the H200 recorded is of its type; a recorded fact of the wrong type
is judged as "could not determine: <fact> is not <type>", never a traceback."""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES

from p2pkit.core import config
from p2pkit.facts import collect as facts
from p2pkit.facts import types as fact_types
from p2pkit.host import Host
from p2pkit.sim import lifecycle, scenarios

RECORDINGS = ["h200-device/facts.json", "h200-device/field-run/facts.json"]  # recorded on the H200 (README there)


def test_every_collector_has_a_type():
    names = {*facts.COLLECTORS, *facts.PROFILE_COLLECTORS}
    assert names - set(fact_types.FACTS) == set()


@pytest.mark.parametrize("scenario", list(scenarios.SCENARIOS))
def test_every_collected_fact_is_its_type(sim, scenario):
    h = Host.at(sim(scenario))
    found = facts.collect(h, profile=config.load(h.sim["profile"]))
    try:
        assert set(found) == {*facts.COLLECTORS, *facts.PROFILE_COLLECTORS}
        assert {k: p for k, v in found.items() if (p := fact_types.problem(k, v))} == {}
    finally:
        lifecycle.stop_services(h.root)


@pytest.mark.parametrize("recording", RECORDINGS)
def test_the_h200_recordings_are_their_types_and_load_unchanged(recording):
    doc = json.loads((FIXTURES / recording).read_text())
    assert {k: p for k, v in doc["facts"].items() if (p := fact_types.problem(k, v))} == {}
    assert facts.load_recorded(FIXTURES / recording)["facts"] == doc["facts"]


@pytest.mark.parametrize("fact,value,why", [
    ("disk", {"path": "/var/lib", "free_bytes": "64G"}, "disk.free_bytes is not bytes (an integer)"),
    ("is_root", "yes", "is_root is not true or false"),
    ("pci_gpus", [{"bdf": "0000:01:00.0", "link": {"current_width": 16.0}}],
     "pci_gpus[0].link.current_width is not lanes (an integer) or None"),
    ("nvml", {"gpus": [{"index": 0, "memory_total": -1.5}]},
     'nvml.gpus[0].memory_total is not bytes (an integer) or a failure ({"error": ...})'),
    ("roce", [{"device": "rocep1s0f0", "rate_gbps": True}], "roce[0].rate_gbps is not Gb/s (a number) or None"),
    ("cgroup", {"memory_caps": {"file": "memory.max"}}, "cgroup.memory_caps is not a list of MemoryCap"),
    ("pci_gpus", {"bdf": "0000:01:00.0"}, "pci_gpus is not a list of PciGpu"),
])
def test_a_wrong_type_is_named_with_its_unit(fact, value, why):
    assert fact_types.problem(fact, value) == why


def test_what_is_not_judged():
    assert fact_types.problem("nvml", {"error": "NVML did not initialise"}) is None  # a failed fact
    assert fact_types.problem("acs", {"error": "setpci is not installed", "by_hand": "sudo setpci"}) is None
    assert fact_types.problem("disk", {"free_bytes": 1, "added_later": [1]}) is None  # a key from another version
    assert fact_types.problem("a_fact_from_elsewhere", "anything") is None
    assert fact_types.problem("disk", {"free_bytes": True}) is not None  # JSON's true is no number of bytes


def test_a_wrongly_typed_recorded_fact_is_refused_clearly(cli, tmp_path):
    doc = json.loads((FIXTURES / "h200-device/facts.json").read_text())
    doc["facts"]["disk"]["free_bytes"] = "64 GB"
    f = tmp_path / "facts.json"
    f.write_text(json.dumps(doc))
    r = cli("--json", "doctor", "--facts", str(f))
    assert r.code == 1 and "Traceback" not in r.err
    checks = {c["id"]: c for g in r.json()["groups"] for c in g["checks"]}
    disk = checks["preflight.disk"]
    assert disk["status"] == "fail"
    assert disk["measured"] == "could not determine: disk.free_bytes is not bytes (an integer)"
    assert {"id": "preflight.disk", "why": disk["measured"]} in r.json()["not_checked"]
    assert checks["rebar.bar1.0000:00:06.0"]["status"] == "pass"  # the rest judged as before


@pytest.mark.parametrize("doc,why", [
    ({"kind": "p2pkit-facts", "simulated": False, "facts": ["disk"]}, "facts is not a map of anything"),
    ({"kind": "p2pkit-facts", "facts": {}}, "it has no simulated"),
    ({"kind": "p2pkit-facts", "simulated": "no", "facts": {}}, "simulated is not true or false"),
    ({"kind": "p2pkit-facts", "simulated": False, "profile": "x", "facts": {}}, "profile is not"),
])
def test_a_recording_of_the_wrong_shape_is_refused(cli, tmp_path, doc, why):
    f = tmp_path / "facts.json"
    f.write_text(json.dumps(doc))
    r = cli("doctor", "--facts", str(f))
    assert r.code == 2 and f"is not a p2pkit facts file: {why}" in r.err and "Traceback" not in r.err


@pytest.mark.parametrize("profile", ["dual-5090-ninfer", "dual-5090-llamacpp", "dual-spark-vllm"])
def test_any_fact_refused_for_its_type_is_judged_not_raised(profile):
    """Whichever recorded fact is not its type, every check reads its replacement as a fact that could not
    be read: doctor judges the rest, and nothing raises."""
    from p2pkit.app import doctor

    found = json.loads((FIXTURES / RECORDINGS[1]).read_text())["facts"]
    prof = config.load(profile)
    for name in found:
        report = doctor.judge({**found, name: {"error": f"{name} is not its type"}}, prof, simulated=False)
        assert report["groups"], name


class ReadSections:
    """A profile that records which of its sections (or other top-level attributes) a probe reads."""

    def __init__(self, profile):
        object.__setattr__(self, "_profile", profile)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._profile, name)


@pytest.mark.parametrize("scenario,profile", [("healthy", "dual-5090-ninfer"), ("healthy", "dual-5090-llamacpp"),
                                              ("spark-worker", "dual-spark-vllm"), ("p2p-up", "dual-5090-ninfer"),
                                              ("secure-boot-on", "dual-5090-ninfer")])
def test_each_fact_reads_only_the_profile_sections_the_table_names(sim, scenario, profile):
    """The fact table names the profile sections each probe reads (issue 39): a probe run on a simulated
    host with a profile that records what is read reads those sections and nothing else of it."""
    from p2pkit.facts import table

    h = Host.at(sim(scenario))
    prof = config.load(profile)
    for fact in table.TABLE:
        if not fact.needs:
            continue
        p = ReadSections(prof)
        facts.collect(h, [fact.name], p)
        assert p.read <= set(fact.needs), (fact.name, p.read - set(fact.needs))
