"""Typed findings: a check with a figure keeps its number, unit and bound; it is judged from the
number, its display text is made from it, and reports read the number, not the text."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from p2pkit.app import reports
from p2pkit.core import config
from p2pkit.rules.findings import FAIL, PASS, figure
from p2pkit.stages.link import checks as link
from p2pkit.stages.preflight import checks as preflight
from p2pkit.stages.rebar import checks as rebar
from tests.test_checks_recorded import FACTS


def test_a_figure_is_judged_from_its_number():
    ok = figure("x.bw", "bandwidth", 0.9, ">=", 0.8, "ratio", "fix it", context="28.5 GB/s of 31.5 GB/s")
    assert (ok.status, ok.value, ok.unit, ok.op, ok.limit) == (PASS, 0.9, "ratio", ">=", 0.8)
    assert ok.measured == "0.90 of the ceiling (28.5 GB/s of 31.5 GB/s)" and ok.expected == ">= 0.80 of the ceiling"
    assert ok.hint == ""
    low = figure("x.bw", "bandwidth", 0.5, ">=", 0.8, "ratio", "fix it")
    assert low.status == FAIL and low.hint == "fix it"


@pytest.mark.parametrize("value", [None, math.nan, math.inf * 0])
def test_no_number_or_nan_never_passes(value):
    assert figure("x.lat", "latency", value, "<=", 5.0, "us").status == FAIL


def test_link_checks_carry_their_figures():
    p = config.load(None)
    r = {"device_count": 2, "load_seconds": 3.0, "gpus": [], "pairs": [
        {"from": 0, "to": 1, "peer_access": True, "unidir_gbps": 28.5, "bidir_gbps": 53.0, "latency_us": 0.41,
         "staged_gbps": 11.8, "integrity": {"elements": 100, "equal": False, "mismatches": 0, "zeros": 100}}]}
    c = {x.id: x for x in link.check({"link_load": r}, p)}
    bw = c["link.p2p_bw.gpu0-gpu1"]
    assert (bw.unit, bw.op, bw.limit) == ("ratio", ">=", p.link.p2p_min_ratio)
    assert bw.value == pytest.approx(28.5 / link.ceiling_gbps(p.pcie.min_gen, p.pcie.min_width), abs=1e-4)
    assert (c["link.p2p_latency.gpu0-gpu1"].value, c["link.p2p_latency.gpu0-gpu1"].unit) == (0.41, "us")
    integ = c["link.p2p_integrity.gpu0-gpu1"]  # unequal data is a failure even if the counter said 0
    assert integ.status == FAIL and integ.value >= 1 and (integ.op, integ.limit) == ("==", 0)


def test_recorded_h200_figures_are_typed():
    p = config.load(None)
    checks = {c.id: c for c in rebar.check(FACTS, p) + preflight.check(FACTS, p)}
    bar1 = checks["rebar.bar1.0000:00:06.0"]
    assert (bar1.value, bar1.unit) == (256, "GiB") and bar1.status == PASS
    assert checks["preflight.gpu_count"].value == 1 and checks["preflight.gpu_count"].unit == "count"


def test_junit_carries_the_figure_as_properties():
    c = figure("link.p2p_bw.gpu0-gpu1", "P2P bandwidth", 0.62, ">=", 0.8, "ratio", "slow").as_dict()
    xml = ET.fromstring(reports.junit([{"stage": "link", "status": "failed", "checks": [c]}], False))
    props = {p.get("name"): p.get("value") for p in xml.iter("property")}
    key = "link.p2p_bw.gpu0-gpu1"  # suite properties (junit-10.xsd has none in a testcase), named by check
    assert props == {f"{key}.value": "0.62", f"{key}.unit": "ratio", f"{key}.op": ">=", f"{key}.limit": "0.8"}
