"""Checks and doctor over facts recorded on a real H200 (tests/fixtures/h200-device)."""

import json

from p2pkit.core import config
from p2pkit.stages.link import checks as link
from p2pkit.stages.rebar import checks as rebar
from p2pkit.stages.topology import checks as topology
from tests.conftest import FIXTURES

FACTS = json.loads((FIXTURES / "h200-device/facts.json").read_text())["facts"]
PROFILE = config.load(None)


def by_id(checks):
    return {c.id: c for c in checks}


def test_recorded_facts_agree_with_nvidia_smi_on_the_same_machine():
    smi = (FIXTURES / "h200-device/smi.txt").read_text()
    from p2pkit.parse.smi_q import smi_q_gpus

    q = smi_q_gpus(smi.split("== topo -m")[0])[0]
    g = FACTS["pci_gpus"][0]
    assert g["aperture"]["index"] == 2 and g["aperture"]["size"] == q["bar1_total_mib"] << 20 == 256 << 30
    assert (g["link"]["max_gen"], g["link"]["max_width"]) == (q["gen_max"], q["width_max"]) == (5, 16)
    assert FACTS["nvml"]["driver_version"] == FACTS["nvidia_version"]["version"] == "580.159.04"
    assert FACTS["nvml"]["gpus"][0]["bar1_total"] == g["aperture"]["size"]


def test_rebar_passes_on_the_h200():
    c = by_id(rebar.check(FACTS, PROFILE))
    assert c["rebar.bar1.0000:00:06.0"].status == "pass"
    bar1 = c["rebar.bar1.0000:00:06.0"]
    assert (bar1.value, bar1.unit, bar1.op) == (256, "GiB", ">=") and "resource2" in bar1.measured
    assert c["rebar.nvml.0000:00:06.0"].status == "pass"


def test_rebar_fails_when_bar1_is_small():
    import copy

    f = copy.deepcopy(FACTS)
    f["pci_gpus"][0]["aperture"]["size"] = 256 << 20
    c = by_id(rebar.check(f, PROFILE))["rebar.bar1.0000:00:06.0"]
    assert c.status == "fail" and "Resizable BAR" in c.hint


def test_topology_on_one_gpu_says_p2p_needs_two():
    c = by_id(topology.check(FACTS, PROFILE))
    assert c["topology.gpu_pair"].status == "fail"
    assert "P2P needs two GPUs; this host has 1" in c["topology.gpu_pair"].hint
    assert c["topology.capability.0000:00:06.0"].status == "pass"
    assert c["topology.root_port.0000:00:06.0"].status == "warn"  # a VM: no bridge above the GPU


def test_unreadable_facts_become_findings():
    f = {"pci_gpus": {"error": "could not determine resource of 0000:01:00.0: permission denied"},
         "nvml": {"error": "NVML did not initialise: Driver/library version mismatch"}}
    c = rebar.check(f, PROFILE)[0]
    assert c.status == "fail" and c.measured.startswith("could not determine")
    t = topology.check(f, PROFILE)[0]
    assert t.status == "fail" and "could not determine" in t.measured


def test_link_checks_skip_in_doctor():
    c = link.check(FACTS, PROFILE)[0]
    assert c.status == "skip" and "p2pkit verify link" in c.expected


def test_ceilings():
    assert round(link.ceiling_gbps(5, 8), 1) == 31.5
    assert round(link.ceiling_gbps(5, 16), 1) == 63.0
    assert round(link.ceiling_gbps(1, 8), 1) == 2.0  # 2.5 GT/s x 8b/10b x 8 lanes


def test_doctor_over_recorded_facts_file(cli):
    r = cli("--json", "doctor", "--facts", str(FIXTURES / "h200-device/facts.json"))
    assert r.code == 1  # an H200 VM is not the dual-5090 box the default profile describes
    doc = r.json()
    groups = {g["stage"]: {c["id"]: c for c in g["checks"]} for g in doc["groups"]}
    assert groups["rebar"]["rebar.bar1.0000:00:06.0"]["status"] == "pass"
    assert groups["preflight"]["preflight.gpu_count"]["status"] == "fail"
    assert "topology.gpu_pair" in doc["failed"]
    assert groups["preflight"]["preflight.cgroup"]["pitfall_text"].startswith("a server started in a memory-capped")


def test_doctor_facts_file_broken(cli, tmp_path):
    f = tmp_path / "f.json"
    f.write_text("{}")
    r = cli("doctor", "--facts", str(f))
    assert r.code == 2 and "is not a p2pkit facts file" in r.err and "p2pkit facts record" in r.err


def test_doctor_on_a_host_without_gpus_says_what_it_could_not_check(cli, sim):
    r = cli("--root", str(sim("no-gpu")), "--json", "doctor")
    doc = r.json()
    assert r.code == 1 and doc["simulated"] is True
    ids = {n["id"] for n in doc["not_checked"]}
    assert "link.load" in ids and "driver.userspace_version" in ids


def test_facts_record_then_doctor_elsewhere(cli, sim, tmp_path):
    root = sim("healthy")
    out = tmp_path / "facts.json"
    r = cli("--root", str(root), "facts", "record", str(out))
    assert r.code == 0 and "SIMULATED" in r.err
    doc = json.loads(out.read_text())
    assert doc["simulated"] is True and len(doc["facts"]["pci_gpus"]) == 2
    r = cli("--json", "doctor", "--facts", str(out))
    assert r.json()["simulated"] is True


def test_a_facts_file_recorded_while_a_command_hung_is_not_judged_and_never_sends_to_debug(cli, sim, tmp_path):
    """Issue 47 item 4: `doctor --facts F` judged a systemctl that timed out while F was recorded as the engine
    being dead, and its fix said `--debug`, which shows no command line when nothing runs (the facts are read
    from the file). A timeout recorded is "could not check", not failed; a fact that could not be read says to
    record the facts again on that host."""
    root = sim("healthy")
    out = tmp_path / "facts.json"
    assert cli("--root", str(root), "facts", "record", str(out)).code == 0
    doc = json.loads(out.read_text())
    doc["facts"]["engine_live"] = {"error": "systemctl did not answer within 2 s (`systemctl show -p MainPID --value "
                                            "p2pkit-engine.service` was killed after 2.1 s)"}
    doc["facts"]["smi_topo_m"] = {"error": "could not determine smi_topo_m: OSError: [Errno 5] Input/output error"}
    out.write_text(json.dumps(doc))
    r = cli("--json", "doctor", "--facts", str(out))
    report = r.json()
    checks = {c["id"]: c for g in report["groups"] for c in g["checks"]}
    assert "service.engine_alive" not in report["failed"] and "service.engine_alive" in report["unanswered"]
    for id_ in ("service.engine_alive", *[c for c in report["failed"] if "could not determine" in
                                          str(checks[c]["measured"])]):
        assert "--debug" not in checks[id_]["hint"] and "facts record" in checks[id_]["hint"], checks[id_]
