"""GPU persistence mode must be on (issue 39: the cost of a new check with a new fact). On the H200
(tests/fixtures/h200-vm) `nvidia-smi -q` says "Persistence Mode : Enabled" and NVML's
nvmlDeviceGetPersistenceMode answers 1; p2pkit reads NVML, as it does for every other GPU fact, and
says it in nvidia-smi's words. Off, the driver tears each GPU down when its last client exits and every
NVML or CUDA start initialises it again: a warning with the fix, no pitfall id (neither the seeds nor the
field name one)."""

from __future__ import annotations

import json
import re

from p2pkit.core import config
from p2pkit.facts import collect
from p2pkit.host import Host
from p2pkit.parse import nvml as pnvml
from p2pkit.parse.smi_q import smi_q
from p2pkit.sim.render import load_state, save
from p2pkit.stages import get
from p2pkit.stages.p2p_module import checks
from tests.conftest import FIXTURES

ID = "p2p.persistence_mode"


def judged(found: dict) -> list[dict]:
    """The p2p-module stage's persistence finding over these facts (none where the fact is absent)."""
    assert "persistence_mode" in get("p2p-module").facts  # the stage collects it for its check
    return [c.as_dict() for c in checks.persistence_mode(found, config.load("dual-5090-ninfer"))]


def test_the_h200s_nvml_answer_reads_as_its_nvidia_smi_q_line():
    smi = smi_q((FIXTURES / "h200-vm/smi_q.txt").read_text())["GPU 00000000:00:06.0"]
    nvml_said = int(re.search(r"nvmlDeviceGetPersistenceMode (\d)", (FIXTURES / "h200-vm/nvml.txt").read_text())[1])
    assert smi["Persistence Mode"] == "Enabled" and nvml_said == 1
    assert pnvml.persistence_modes({"00000000:00:06.0": nvml_said}) == {"00000000:00:06.0": "Enabled"}
    assert pnvml.persistence_modes({"a": 0, "b": {"error": "Not Supported"}, "c": 7}) == {
        "a": "Disabled", "b": {"error": "Not Supported"}, "c": {"error": "NVML answered 7, not a known state"}}


def test_on_with_every_gpu_then_a_warning_naming_the_gpu_that_is_off(sim):
    root = sim("p2p-up")  # the patched module loaded: NVML answers
    h = Host.at(root)
    found = collect.collect(h, ["persistence_mode"])
    assert found == {"persistence_mode": {"00000000:01:00.0": "Enabled", "00000000:41:00.0": "Enabled"}}
    [c] = judged(found)
    assert c["status"] == "pass" and c["measured"] == "Enabled on every GPU" and c["pitfall"] == ""

    state = load_state(root)
    state["gpus"][1]["persistence"] = False  # nobody ran nvidia-persistenced or `nvidia-smi -pm 1` on this boot
    save(root, state)
    found = collect.collect(h, ["persistence_mode"])
    assert found["persistence_mode"]["00000000:41:00.0"] == "Disabled"
    [c] = judged(found)
    assert c["status"] == "warn" and c["measured"] == "Disabled on 00000000:41:00.0"
    assert "nvidia-smi -pm 1" in c["hint"] and "nvidia-persistenced" in c["hint"] and c["pitfall"] == ""


def test_no_driver_is_no_finding_of_its_own_and_an_old_recording_has_none(sim):
    found = collect.collect(Host.at(sim("healthy")), ["persistence_mode"])  # no module loaded: NVML cannot start
    assert "error" in found["persistence_mode"]
    [c] = judged(found)
    assert c["status"] == "skip" and c["measured"].startswith("could not determine")  # p2p.nvml says why
    recorded = json.loads((FIXTURES / "h200-device/facts.json").read_text())["facts"]  # before p2pkit read it
    assert "persistence_mode" not in recorded and judged(recorded) == []


def test_doctor_shows_it_in_the_p2p_module_stage(cli, sim):
    doc = json.loads(cli("--root", str(sim("p2p-up")), "--json", "doctor").out)
    [c] = [c for g in doc["groups"] if g["stage"] == "p2p-module" for c in g["checks"] if c["id"] == ID]
    assert c["status"] == "pass"
