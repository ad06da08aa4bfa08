"""nvidia-smi parsers over the real H200 captures and constructed two-GPU outputs."""

import pytest

from p2pkit.parse import smi
from tests.conftest import FIXTURES

H200 = FIXTURES / "h200-vm"
TWO = FIXTURES / "constructed"


def test_topo_p2p_real_capture_has_ansi_and_leading_space():
    text = (H200 / "topo_p2p_r.txt").read_text()
    assert "\x1b[4m" in text and text.splitlines()[1].startswith(" GPU0")
    assert smi.topo_matrix(text) == {"GPU0": {"GPU0": "X"}}


def test_topo_m_real_capture_drops_affinity_columns():
    assert smi.topo_matrix((H200 / "topo_m.txt").read_text()) == {"GPU0": {"GPU0": "X"}}


def test_topo_p2p_two_gpus_constructed():
    m = smi.topo_matrix((TWO / "topo_p2p_r_2gpu_ok.txt").read_text())
    assert m == {"GPU0": {"GPU0": "X", "GPU1": "OK"}, "GPU1": {"GPU0": "OK", "GPU1": "X"}}
    cns = smi.topo_matrix((TWO / "topo_p2p_r_2gpu_cns.txt").read_text())
    assert cns["GPU0"]["GPU1"] == "CNS" and cns["GPU1"]["GPU0"] == "CNS"


def test_topo_m_two_gpus_constructed():
    m = smi.topo_matrix((TWO / "topo_m_2gpu.txt").read_text())
    assert m["GPU0"]["GPU1"] == "PHB" and m["GPU1"]["GPU1"] == "X"


@pytest.mark.parametrize("text", ["", "garbage\nmore garbage\n", " \tGPU0\t\n"])
def test_topo_rejects_unexpected_output(text):
    with pytest.raises(ValueError):
        smi.topo_matrix(text)


def test_smi_q_real_capture():
    """The test-side reader of `nvidia-smi -q` (p2pkit/parse/smi_q.py) over the real capture."""
    from p2pkit.parse.smi_q import smi_q_gpus

    gpus = smi_q_gpus((H200 / "smi_q.txt").read_text())
    assert gpus == [{"bus_id": "00000000:00:06.0", "name": "NVIDIA H200", "bar1_total_mib": 262144,
                     "fb_total_mib": 143771, "gen_max": 5, "gen_current": 5, "width_max": 16,
                     "width_current": 16, "replays": 0, "util_gpu_pct": 0, "processes": 0}]


TOPO = FIXTURES / "topo_m"


@pytest.mark.parametrize(("name", "a", "b", "want"), [
    ("2x5090_phb.txt", 0, 1, "PHB"),
    ("8x4090_nic_sys.txt", 6, 7, "SYS"),
    ("5gpu_mixed_spaces.txt", 1, 2, "PHB"),
    ("5gpu_mixed_spaces.txt", 1, 3, "NODE"),
    ("5gpu_mixed_spaces.txt", 0, 4, "SYS"),
    ("2gpu_node_spaces.txt", 0, 1, "NODE"),
])
def test_pair_relation_of_real_topo_m(name, a, b, want):
    assert smi.pair_relation((TOPO / name).read_text(), a, b) == want


def test_topo_m_with_nics_keeps_only_gpu_rows_and_columns():
    m = smi.topo_matrix((TOPO / "8x4090_nic_sys.txt").read_text())
    assert sorted(m) == [f"GPU{i}" for i in range(8)] and "NIC0" not in m["GPU6"]


def test_pair_relation_refuses_a_p2p_status_matrix_and_a_missing_gpu():
    with pytest.raises(ValueError, match="not a topology relation"):
        smi.pair_relation((TWO / "topo_p2p_r_2gpu_ok.txt").read_text())
    with pytest.raises(ValueError, match="no GPU0/GPU1 pair"):
        smi.pair_relation((H200 / "topo_m.txt").read_text())


def test_relation_meaning_and_switch():
    assert smi.relation_meaning("NV4") == "Connection traversing a bonded set of 4 NVLinks"
    assert "Host Bridge" in smi.relation_meaning("PHB")
    assert smi.relation_has_switch("PXB") and smi.relation_has_switch("PIX")
    assert not any(smi.relation_has_switch(c) for c in ("PHB", "NODE", "SYS", "NV2"))


def _pair(switch: bool) -> list[dict]:
    above = [{"bdf": "0000:00:01.1", "port_type": "switch downstream"}, {"bdf": "0000:00:01.0", "port_type":
             "root port"}] if switch else [{"bdf": "0000:00:01.1", "port_type": "root port"}]
    return [{"bdf": f"0000:0{i}:00.0", "upstream": above} for i in (1, 2)]


def _topo_fact(name: str) -> dict:
    text = (TOPO / name).read_text()
    return {"matrix": smi.topo_matrix(text), "pair": smi.pair_relation(text)}


def test_topo_m_cross_checks_the_sysfs_root_ports():
    from p2pkit.stages.topology.checks import _topo_m

    phb = _topo_fact("2x5090_phb.txt")  # the real 2x5090 post: they meet at the CPU
    ok = _topo_m(phb, _pair(switch=False))
    assert ok.status == "pass" and ok.measured.startswith("PHB (Connection traversing PCIe as well as a PCIe Host")
    bad = _topo_m(phb, _pair(switch=True))  # sysfs sees a switch, nvidia-smi does not: reported
    assert bad.status == "warn" and "sysfs: a PCIe switch (0000:00:01.1" in bad.measured and "disagree" in bad.hint
    node = _topo_fact("2gpu_node_spaces.txt")
    assert _topo_m(node, _pair(switch=False)).status == "pass"
    pix = {"pair": "PIX"}
    assert _topo_m(pix, _pair(switch=True)).status == "pass"
    assert _topo_m(pix, _pair(switch=False)).status == "warn"
    assert _topo_m({"error": "nvidia-smi failed"}, _pair(False)).status == "skip"


def test_simulated_nvidia_smi_topo_m_reads_as_the_real_one(tmp_path, capsys):
    from p2pkit.sim import scenarios, standins

    for scenario, want in (("healthy", "PHB"), ("behind-switch", "PIX")):
        state = scenarios.build(scenario)
        state["driver"]["userspace"] = "615.71.09"
        state["module"]["loaded"] = {"version": "615.71.09"}
        assert standins.nvidia_smi(tmp_path, state, ["topo", "-m"]) == 0
        assert smi.pair_relation(capsys.readouterr().out) == want
