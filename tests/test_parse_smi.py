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
    gpus = smi.smi_q_gpus((H200 / "smi_q.txt").read_text())
    assert gpus == [{"bus_id": "00000000:00:06.0", "name": "NVIDIA H200", "bar1_total_mib": 262144,
                     "fb_total_mib": 143771, "gen_max": 5, "gen_current": 5, "width_max": 16,
                     "width_current": 16, "replays": 0}]


def test_query_csv_real_capture_na_is_none():
    rows = smi.query_csv((H200 / "query.csv").read_text())
    assert rows[0]["name"] == "NVIDIA H200"
    assert rows[0]["pcie.link.gen.hostmax"] is None
    assert rows[0]["pcie.link.width.current"] == "16"


def test_query_csv_rejects_ragged_rows():
    with pytest.raises(ValueError, match="fields"):
        smi.query_csv("a, b\n1, 2, 3\n")


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
