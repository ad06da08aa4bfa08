"""`verify --junit` and `--prometheus`: the files parse, and count what failed."""

import xml.etree.ElementTree as ET

import pytest
from prometheus_client.parser import text_string_to_metric_families

from p2pkit.sim import lifecycle

pytestmark = pytest.mark.slow


def bring_to_topology(cli, root):
    r = cli("--root", str(root), "up", "--to", "p2p-module")
    if r.code == 4:
        lifecycle.reboot(root)
    return cli("--root", str(root), "up", "--to", "topology")


def test_junit_and_prometheus_from_a_failing_host(cli, sim, tmp_path):
    root = sim("p2p-chipset-not-supported")
    r = bring_to_topology(cli, root)
    assert r.code == 1
    junit, prom = tmp_path / "verify.xml", tmp_path / "p2pkit.prom"
    r = cli("--root", str(root), "--json", "verify", "--junit", str(junit), "--prometheus", str(prom))
    assert r.code == 1
    doc = r.json()
    tree = ET.parse(junit).getroot()
    failed = {(s.get("name"), c.get("name")) for s in tree.iter("testsuite") for c in s.iter("testcase")
              if c.find("failure") is not None}
    expected = {(st["stage"], c["id"]) for st in doc["stages"] for c in st["checks"] if c["status"] == "fail"}
    assert failed == expected and ("topology", "topology.p2p_read") in failed
    total = sum(int(s.get("failures")) for s in tree.iter("testsuite"))
    assert total == len(expected)
    msg = next(c.find("failure") for s in tree.iter("testsuite") for c in s.iter("testcase")
               if c.get("name") == "topology.p2p_read")
    assert "measured GPU0->GPU1 CNS" in msg.get("message") and "chipset not supported" in msg.text
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    ok = {s.labels["stage"]: s.value for s in families["p2pkit_stage_ok"].samples}
    assert ok["topology"] == 0 and ok["rebar"] == 1 and ok["preflight"] == 1
    fails = {s.labels["check"] for s in families["p2pkit_check_failed"].samples}
    assert "topology.p2p_read" in fails
    assert {s.labels["version"] for s in families["p2pkit_driver_info"].samples} == {"615.71.09"}
    assert all(s.labels["simulated"] == "true" for f in families.values() for s in f.samples)


def test_prometheus_carries_link_figures(cli, sim, tmp_path):
    root = sim("healthy")
    assert cli("--root", str(root), "up", "--reboot", "--to", "link").code == 0
    prom = tmp_path / "p.prom"
    r = cli("--root", str(root), "verify", "link", "--prometheus", str(prom))
    assert r.code == 0
    fams = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert {s.value for s in fams["p2pkit_link_gen_under_load"].samples} == {5}
    assert {s.value for s in fams["p2pkit_p2p_gbps"].samples} == {28.5}
    ratios = {s.labels["check"]: s.value for s in fams["p2pkit_bandwidth_ratio"].samples}
    assert ratios["link.p2p_bw.gpu0-gpu1"] == 0.9
