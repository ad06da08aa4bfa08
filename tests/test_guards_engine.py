"""Condition guards for the engine stage's vLLM environment check (P21, P25): every condition of
p2pkit.stages.engine.checks._vllm, judged through the engine stage's check on the engine_build fact (see
tests/test_guards_conditions.py for the others)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

from p2pkit.core import config
from p2pkit.stages import registry
from p2pkit.stages.engine.vllm import VLLM_PROBE

SPARK = config.load("dual-spark-vllm")
PINNED = replace(SPARK, engine=replace(SPARK.engine, commit="3f2a9c1d4b5e6f708192a3b4c5d6e7f8091a2b3c"))


def engine_checks(env, p=PINNED) -> dict:
    (st,) = [s for s in registry() if s.name == "engine"]
    return {c.id: c for c in st.check({"engine_build": {"vllm_env": env, "vllm_tree": None}}, p)}


def probe_here() -> dict:
    """The stage's own probe run by this interpreter (no vLLM here, flashinfer-python not installed):
    the fact a host without vLLM gives."""
    r = subprocess.run([sys.executable, "-c", VLLM_PROBE, "flashinfer-python"], capture_output=True, text=True,
                       check=True, timeout=120)
    return json.loads(r.stdout)


def test_vllm_not_importable_is_named_from_the_real_probe():
    env = probe_here()
    assert env["vllm"]["error"].startswith("ModuleNotFoundError") and env["pins"] == {"flashinfer-python": None}
    c = engine_checks(env)
    assert c["engine.vllm"].status == "fail" and c["engine.vllm"].measured == env["vllm"]["error"]
    assert c["engine.vllm"].pitfall == "P21" and "engine.vllm_tree" not in c and "engine.pin.flashinfer-python" not in c
    for missing in ({}, {"error": "/opt/vllm/bin/python: not found"}):
        u = engine_checks(missing)["engine.vllm"]
        assert u.status == "fail" and u.measured.startswith("could not determine"), missing
    assert engine_checks({})["engine.vllm"].measured == "could not determine: not probed"
    assert engine_checks(missing)["engine.vllm"].measured == "could not determine: /opt/vllm/bin/python: not found"


def test_vllm_tree_and_pins_judged_from_the_environment():
    """An environment with vLLM at the pinned tree (a dev version names its commit, gXXXXXXX) and the
    pinned flashinfer passes; another commit, an empty engine.commit, another or no flashinfer fail
    with flashinfer's own crash named (P25)."""
    good = {"vllm": {"version": "0.11.1.dev215+g3f2a9c1.d20260115", "file": "/opt/vllm-src/vllm/__init__.py"},
            "pins": {"flashinfer-python": "0.6.18"}}
    c = engine_checks(good)
    assert c["engine.vllm"].status == "pass"
    assert c["engine.vllm"].measured == "vllm 0.11.1.dev215+g3f2a9c1.d20260115 (/opt/vllm-src/vllm/__init__.py)"
    assert c["engine.vllm_tree"].status == "pass" and c["engine.pin.flashinfer-python"].status == "pass"
    other = {**good, "vllm": {**good["vllm"], "version": "0.11.1.dev9+g0000000"}}
    assert engine_checks(other)["engine.vllm_tree"].status == "fail"
    bare = engine_checks(good, SPARK)["engine.vllm_tree"]
    assert bare.status == "fail" and bare.measured == "cannot be proven: engine.commit is empty"
    old = engine_checks({**good, "pins": {"flashinfer-python": "0.6.17"}})["engine.pin.flashinfer-python"]
    assert old.status == "fail" and old.pitfall == "P25" and "crashes the NVFP4 MoE" in old.hint
    assert old.measured == "0.6.17"
    none = engine_checks({**good, "pins": {}})["engine.pin.flashinfer-python"]
    assert none.status == "fail" and none.measured == "not installed"
    p = replace(PINNED, engine=replace(PINNED.engine, python_pins={"torch": "2.9.0"}))
    t = engine_checks({**good, "pins": {"torch": "2.8.0"}}, p)["engine.pin.torch"]
    assert t.status == "fail" and t.pitfall == "" and "crashes" not in t.hint
