"""The real NVML gathering code (p2pkit/host/nvml.py) against the simulated host's NVML, which
answers at the library boundary with nvidia-ml-py's own structures and error codes."""

from __future__ import annotations

import pynvml
import pytest

from p2pkit.host import Host, nvml
from p2pkit.sim.render import load_state, save
from p2pkit.sim.scenarios import GIB
from tests.conftest import install_userspace


def _driver(root, loaded: str = "615.71.09", userspace: str = "615.71.09"):
    install_userspace(root, userspace)
    state = load_state(root)
    state["module"]["loaded"] = {"version": loaded, "srcversion": "X", "patched": True}
    save(root, state)
    return root


def _errors(doc, path=""):
    if isinstance(doc, dict):
        if set(doc) == {"error"}:
            yield path, doc["error"]
        for k, v in doc.items():
            yield from _errors(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _errors(v, f"{path}[{i}]")


def test_every_reading_gathered_through_the_library(sim):
    root = _driver(sim("healthy"))
    doc = nvml.facts(Host.at(root))
    assert list(_errors(doc)) == []
    assert doc["driver_version"] == "615.71.09" and doc["recorded"].startswith("SIMULATED")
    g0 = doc["gpus"][0]
    assert g0["bus_id"] == "00000000:01:00.0" and g0["memory_total"] == 32 * GIB == g0["bar1_total"]
    assert g0["link"] == {"current_gen": 1, "current_width": 8, "max_gen": 5, "gpu_max_gen": 5, "max_width": 8,
                          "speed_mbps": 2500}
    assert g0["locked_clocks"] == {"applications_clocks_setting": False}
    assert [(p["from"], p["to"], p["read"], p["write"], p["common_ancestor"]) for p in doc["p2p"]] == \
        [(0, 1, "OK", "OK", "HOSTBRIDGE"), (1, 0, "OK", "OK", "HOSTBRIDGE")]


def test_small_bar_reads_ns_and_the_real_bar1(sim):
    root = _driver(sim("small-bar"))
    doc = nvml.facts(Host.at(root))
    assert {p["read"] for p in doc["p2p"]} == {"NS"}
    assert min(g["bar1_total"] for g in doc["gpus"]) < 32 * GIB


@pytest.mark.parametrize(("loaded", "userspace", "words"), [
    ("615.71.09", "580.95.05", "mismatch: the loaded kernel module and the userspace driver differ"),
])
def test_init_failure_is_a_finding(sim, loaded, userspace, words):
    doc = nvml.facts(Host.at(_driver(sim("healthy"), loaded, userspace)))
    assert set(doc) == {"error"} and "NVML did not initialise" in doc["error"] and words in doc["error"]


def test_no_driver_is_a_finding(sim):
    doc = nvml.facts(Host.at(sim("healthy")))
    assert doc == {"error": "NVML did not initialise: NVML Shared Library Not Found"}


def test_unsupported_and_missing_functions_are_readings_not_crashes(sim, monkeypatch):
    """A GPU that answers NOT_SUPPORTED, and a binding or driver without a function, read as their
    error text; the rest of the document is still gathered."""
    from p2pkit.sim import nvml as sim_nvml

    def not_supported(self, h):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(sim_nvml.SimNvml, "nvmlDeviceGetPcieReplayCounter", not_supported)
    monkeypatch.delattr(sim_nvml.SimNvml, "nvmlDeviceGetGpuMaxPcieLinkGeneration")
    doc = nvml.facts(Host.at(_driver(sim("healthy"))))
    g = doc["gpus"][1]
    assert g["replay_counter"] == {"error": "Not Supported"}
    assert "nvmlDeviceGetGpuMaxPcieLinkGeneration" in g["link"]["gpu_max_gen"]["error"]
    assert g["bar1_total"] == 32 * GIB and doc["p2p"][0]["read"] == "OK"


def test_the_real_h200_reading_has_the_shape_the_simulated_host_gives():
    """The same gathering code on a real H200 (tests/fixtures/h200-device/one-path): the keys the checks
    read are the keys the simulated NVML yields."""
    import json
    from pathlib import Path

    real = json.loads((Path(__file__).parent / "fixtures/h200-device/one-path/nvml.json").read_text())
    assert real["driver_version"] == "580.159.04" and real["gpus"][0]["bar1_total"] == 256 * GIB
    assert set(real["gpus"][0]) == {"index", "name", "uuid", "bus_id", "memory_total", "bar1_total", "link",
                                    "replay_counter", "clock_event_reasons", "locked_clocks"}
    assert set(real["gpus"][0]["link"]) == {"current_gen", "current_width", "max_gen", "gpu_max_gen", "max_width",
                                            "speed_mbps"}
