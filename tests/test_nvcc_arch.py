"""P05 before CMake: an architecture in engine.cuda_architectures that the CUDA toolkit cannot build
is refused before configuring, with the list `nvcc --list-gpu-arch` gives (real nvcc 13.0.88 output
in tests/fixtures/nvcc; the real nvcc here when there is one; the simulated one on the sim host)."""

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from p2pkit.app import pipeline
from p2pkit.core import config
from p2pkit.core.artifacts import Store
from p2pkit.core.output import Output
from p2pkit.host import Host
from p2pkit.parse import build as pb
from p2pkit.stages.engine import checks as ec
from p2pkit.stages.engine import cmake as es

FIX = Path(__file__).parent / "fixtures"
NVCC_13_0 = ["75", "80", "86", "87", "88", "89", "90", "100", "103", "110", "120", "121"]


def test_the_list_of_the_real_nvcc_13_0():
    text = (FIX / "nvcc/nvcc-13.0.88-list-gpu-arch.txt").read_text()
    assert pb.nvcc_arch_list(text) == NVCC_13_0
    assert pb.nvcc_arch_list((FIX / "nvcc/nvcc-13.0.88-list-gpu-code.txt").read_text()) == NVCC_13_0
    assert pb.nvcc_arch_list("-gencode arch=compute_90a,code=sm_90a") == ["90"]  # --list-gpu-arch --list-gpu-code
    assert pb.nvcc_arch_list("nvcc fatal   : Unknown option '--list-gpu-arch'") == []


@pytest.mark.parametrize("value,bad", [
    ("120a", []), ("90", []), ("90;120a", []), ("120f", []), ("86-real", []), ("native", []), ("all-major", []),
    ("52", ["52"]), ("90;61", ["61"]), ("130a", ["130a"]), ("sm90", ["sm90"]),
])
def test_each_entry_of_cuda_architectures_judged_against_the_list(value, bad):
    archs = pb.nvcc_arch_list((FIX / "nvcc/nvcc-13.0.88-list-gpu-arch.txt").read_text())
    assert pb.archs_unbuildable(value, archs) == bad
    assert pb.archs_unbuildable(value, None) == []  # no list (an nvcc before 11): CMake judges


def _judged(p, cuda):
    return {c.id: c for c in ec.check({"engine_build": {"source": {}, "cuda": cuda, "pkg_config": {},
                                                        "refused": True}}, p)}


def test_an_architecture_the_toolkit_lacks_is_a_p05_failure_with_the_list():
    p = config.load("dual-5090-llamacpp", ["engine.cuda_architectures=90;61"])
    archs = pb.nvcc_arch_list((FIX / "nvcc/nvcc-13.0.88-list-gpu-arch.txt").read_text())
    c = _judged(p, {"version": "13.0", "archs": archs})["engine.cuda_arch_supported"]
    assert c.status == "fail" and c.pitfall == "P05"
    assert "61 not in nvcc --list-gpu-arch" in c.measured and "75, 80, 86" in c.expected and "120, 121" in c.expected
    assert "engine.cuda_architectures" in c.hint
    ok = _judged(config.load("dual-5090-llamacpp"), {"version": "13.0", "archs": archs})
    assert ok["engine.cuda_arch_supported"].status == "pass"
    assert "engine.cuda_arch_supported" not in _judged(p, {"version": "13.0", "archs": None})


H200_LIST = FIX / "h200-device/engine-build/nvcc-list-gpu-arch.txt"  # recorded on the lent H200 (nvcc 13.0.88)


def test_the_gpu_machines_nvcc_builds_its_h200():
    """The real list there (compute_110 printed before compute_103, as nvcc 13.0.88 does) read in order,
    90 buildable, 120a (the 5090's) too, 61 not."""
    archs = pb.nvcc_arch_list(H200_LIST.read_text())
    assert "90" in archs and pb.archs_unbuildable("90", archs) == []
    assert all(a.isdigit() for a in archs) and archs == sorted(archs, key=int)
    assert pb.archs_unbuildable("120a", archs) == [] and pb.archs_unbuildable("61;90", archs) == ["61"]


def _ctx(root: Path, *sets: str):
    h = Host.at(root)
    return pipeline.Ctx(profile=config.load(h.sim["profile"] if h.simulated else "dual-5090-llamacpp", list(sets)),
                        host=h, store=Store(root / "var/lib/p2pkit"), out=Output())


@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs a CUDA toolkit's nvcc")
def test_the_real_nvcc_refuses_an_architecture_before_cmake(tmp_path):
    """The real `nvcc --list-gpu-arch` of this machine: 52 (Maxwell, dropped in CUDA 13) is refused by
    the toolchain check, so the engine stage never configures; 120a is built."""
    ctx = _ctx(Path("/"), "engine.nccl_root=")
    ctx.profile = replace(ctx.profile, engine=replace(ctx.profile.engine, cuda_architectures="52"))
    tc = es.toolchain(ctx)
    assert tc["cuda"]["archs"] and "120" in tc["cuda"]["archs"]
    if "52" in tc["cuda"]["archs"]:
        pytest.skip("this nvcc still builds sm_52")
    assert not es.toolchain_ok(tc, ctx.profile)
    c = _judged(ctx.profile, tc["cuda"])["engine.cuda_arch_supported"]
    assert c.status == "fail" and "52" in c.measured
    good = replace(ctx.profile, engine=replace(ctx.profile.engine, cuda_architectures="120a"))
    assert es.toolchain_ok(tc, good)


@pytest.mark.slow
def test_the_engine_stage_stops_before_cmake_on_the_simulated_host(sim):
    from p2pkit.sim.render import load_state, render

    root = sim("healthy")
    st = load_state(root)
    st["cuda_archs"] = ["90", "100"]  # a toolkit without Blackwell consumer parts
    render(root, st)
    ctx = _ctx(root)
    doc = pipeline.run_stage(ctx, __import__("p2pkit.stages", fromlist=["get"]).get("engine"), "link")
    c = {x["id"]: x for x in doc["checks"]}
    assert c["engine.cuda_arch_supported"]["status"] == "fail" and "120a" in c["engine.cuda_arch_supported"]["measured"]
    assert "engine.configure" not in c and "engine.build_log" not in c  # CMake never ran
