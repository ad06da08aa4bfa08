"""Engine and model stages on the simulated host: real git, pkg-config, CMake and Ninja over the
simulated NInfer tree; real safetensors and GGUF files written by their packages."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from p2pkit.app import pipeline
from p2pkit.core import config
from p2pkit.core.artifacts import Store
from p2pkit.core.output import Output
from p2pkit.host import Host
from p2pkit.parse import artifact as pa
from p2pkit.sim.render import load_state, render
from p2pkit.stages import get
from p2pkit.stages.model import act as model_stage
from p2pkit.stages.model.checks import check as check_model

pytestmark = pytest.mark.slow


def ctx_for(root, profile=None):
    h = Host.at(root)
    return pipeline.Ctx(profile=profile or config.load(h.sim["profile"]), host=h,
                        store=Store(root / "var/lib/p2pkit"), out=Output())


def run(ctx, stage):
    doc = pipeline.run_stage(ctx, get(stage), "link" if stage == "engine" else "engine")
    return doc, {c["id"]: c for c in doc["checks"]}


def set_state(root, **kw):
    st = load_state(root)
    st.update(kw)
    render(root, st)


def test_engine_builds_and_proves_it(sim):
    ctx = ctx_for(sim("healthy"))
    doc, c = run(ctx, "engine")
    assert doc["status"] == "passed", [x for x in c.values() if x["status"] == "fail"]
    b = doc["facts"]["engine_build"]
    assert b["criteria"] == {"found CUDAToolkit 13.1 or newer": "13.1 (build log)",
                             "found libavformat": "60.16.100 (build log)", "no CMake Error": "none in the log",
                             "linked apps/ninfer-serve": "linked in this build"}
    assert "-DCMAKE_CUDA_ARCHITECTURES=120a" in b["cmake_options"] and b["cuda"]["version"] == "13.1"
    assert len(b["binary"]["sha256"]) == 64 and b["libraries"]
    assert b["source"]["head"] == ctx.profile.engine.commit
    first = b["log"]
    assert "Linking CXX executable apps/ninfer-serve" in Path(first).read_text()
    # P07 on a rebuild (`up --from engine --force`): CMake re-configures from its cache and Ninja has
    # nothing to do, as real CMake and Ninja do (tests/fixtures/cmake); proven from the cache and Ninja.
    # --force: without it the artifact gate skips a stage whose proof already holds
    ctx.options["force"] = True
    doc2, c2 = run(ctx, "engine")
    assert doc2["status"] == "passed", [x for x in c2.values() if x["status"] == "fail"]
    b2 = doc2["facts"]["engine_build"]
    second = Path(b2["log"]).read_text()
    assert b2["log"] != first and Path(first).read_text().count("Linking CXX") == 1  # the first run's log is kept
    assert "Found CUDAToolkit" not in second and "Found libavformat" not in second
    assert "ninja: no work to do." in second and "Linking CXX" not in second
    assert b2["criteria"] == {"found CUDAToolkit 13.1 or newer": "13.1 (CMakeCache.txt)",
                              "found libavformat": "60.16.100 (CMakeCache.txt)", "no CMake Error": "none in the log",
                              "linked apps/ninfer-serve": "up to date (ninja -n: no work to do)"}
    assert b2["binary"]["sha256"] == b["binary"]["sha256"]


def test_old_cuda_refused_before_configure(sim):
    _doc, c = run(ctx_for(sim("cuda-13.0")), "engine")
    assert c["engine.cuda"]["status"] == "fail" and c["engine.cuda"]["pitfall"] == "P05"
    assert "engine.configure" not in c  # CMake never ran
    assert "engine.build_log" not in c  # and no build log is judged: the refusal is the one failure


def test_ffmpeg_not_reached_by_pkg_config_refused_before_configure(sim):
    root = sim("healthy")
    (root / "opt/ffmpeg/lib/pkgconfig/libavformat.pc").unlink()
    _doc, c = run(ctx_for(root), "engine")
    bad = c["engine.pkg_config.libavformat"]
    assert bad["status"] == "fail" and bad["pitfall"] == "P06" and "PKG_CONFIG_PATH" in bad["hint"]
    assert "engine.configure" not in c


def test_wrong_architecture_refused_by_precheck(sim):
    root = sim("healthy")
    ctx = ctx_for(root)
    ctx.profile = replace(ctx.profile, engine=replace(ctx.profile.engine, cuda_architectures="90"))
    doc, c = run(ctx, "engine")
    assert c["engine.cuda_arch"]["status"] == "fail" and doc["acted"] == {}


@pytest.mark.parametrize("setup,needle,pitfall", [
    ("arch", "NInfer supports only CMAKE_CUDA_ARCHITECTURES=120a", "P05"),
    ("cuda", "NInfer requires CUDA 13.1 or newer", "P05"),
    ("avformat", "libavformat", "P06"),
])
def test_real_cmake_failures_are_named(sim, setup, needle, pitfall):
    """The same failures CMake itself reports, when p2pkit's own pre-checks are out of the way."""
    root = sim("healthy")
    ctx = ctx_for(root)
    e = ctx.profile.engine
    if setup == "arch":
        ctx.profile = replace(ctx.profile, engine=replace(e, cuda_architectures="90"))
    elif setup == "cuda":
        set_state(root, cuda_version="13.0")
        ctx.profile = replace(ctx.profile, engine=replace(e, cuda_min="12.0"))
    else:
        pc = root / "opt/ffmpeg/lib/pkgconfig/libavformat.pc"
        pc.write_text(pc.read_text().replace("Version: 60.16.100", "Version: 59.27.100"))
    from p2pkit.stages.engine import checks as ec
    from p2pkit.stages.engine import cmake as es

    b = es.build(ctx)
    assert b["configure_rc"] != 0 and needle in b["first_error"]
    c = {x.id: x for x in ec.check({"engine_build": b}, ctx.profile)}
    assert c["engine.configure"].status == "fail" and c["engine.configure"].pitfall == pitfall


@pytest.fixture
def built(sim):
    def make(scenario="healthy", **state):
        root = sim(scenario)
        if state:
            set_state(root, **state)
        ctx = ctx_for(root)
        doc, _ = run(ctx, "engine")
        assert doc["status"] == "passed"
        return ctx
    return make


def test_model_converts_verifies_and_records(built):
    ctx = built()
    doc, c = run(ctx, "model")
    assert doc["status"] == "passed", [x for x in c.values() if x["status"] == "fail"]
    out = ctx.host.path(ctx.profile.model.output)
    assert pa.ninfer_container(out.read_bytes())["version"] == 3
    assert (out.parent / f"{out.name}.conversion.json").is_file()
    assert not list(out.parent.glob(".*.partial*"))
    rec = json.loads((ctx.store.dir / "model-output.json").read_text())
    import hashlib

    assert rec["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    doc2, _c2 = run(ctx, "model")  # a second run keeps the recorded artifact
    assert doc2["status"] == "passed" and doc2["facts"]["model_build"]["kept"] is True


def test_existing_output_is_never_overwritten(built):
    ctx = built()
    out = ctx.host.path(ctx.profile.model.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"the user's own model")
    _doc, c = run(ctx, "model")
    assert c["model.output_free"]["status"] == "fail" and "never overwrites" in c["model.output_free"]["measured"]
    assert out.read_bytes() == b"the user's own model"


@pytest.mark.parametrize("breakage,fragment", [
    ("truncate", "truncated"),
    ("missing", "missing (listed in the index)"),
    ("noconfig", "config.json missing"),
])
def test_broken_sources(built, breakage, fragment):
    ctx = built()
    src = ctx.host.path(ctx.profile.model.source)
    shard = sorted(src.glob("*.safetensors"))[0]
    if breakage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-100])
    elif breakage == "missing":
        shard.unlink()
    else:
        (src / "config.json").unlink()
    _doc, c = run(ctx, "model")
    assert c["model.source"]["status"] == "fail" and fragment in c["model.source"]["measured"]
    assert not ctx.host.path(ctx.profile.model.output).exists()


def test_disk_too_small(built):
    ctx = built()
    st = load_state(ctx.host.root)
    st["facts"]["disk_free_bytes"] = 1000
    render(ctx.host.root, st)
    _doc, c = run(ctx, "model")
    assert c["model.disk"]["status"] == "fail" and not ctx.host.path(ctx.profile.model.output).exists()


def test_convert_tool_failing_leaves_nothing(built):
    ctx = built()
    ctx.profile = replace(ctx.profile, model=replace(ctx.profile.model, draft_source=""))  # dflash2 without its source
    _doc, c = run(ctx, "model")
    assert c["model.convert"]["status"] == "fail" and "needs --source dflash2" in c["model.convert"]["measured"]
    out = ctx.host.path(ctx.profile.model.output)
    assert not out.exists() and not list(out.parent.glob(".*.partial*"))


def test_convert_run_as_a_script_fails_which_is_why_p2pkit_runs_a_module(built):
    ctx = built()
    src = ctx.host.path(ctx.profile.engine.build_dir)
    r = subprocess.run([sys.executable, "tools/convert.py", "--help"], cwd=src, capture_output=True, text=True)
    assert r.returncode != 0 and "ModuleNotFoundError: No module named 'tools'" in r.stderr
    argv = model_stage.convert_argv(ctx, "/src", "/out")
    assert argv[1:3] == ["-m", "tools.convert"]


def test_engine_without_tp2_dflash2_refuses_the_artifact(built):
    ctx = built("old-engine")
    _doc, c = run(ctx, "model")
    assert c["model.dflash2_tp2"]["status"] == "fail" and c["model.dflash2_tp2"]["pitfall"] == "P09"
    assert "no dflash2 branch in src/shard_mapping.cpp" in c["model.dflash2_tp2"]["measured"]


@pytest.mark.parametrize("blob,fragment", [
    (b"GGUF\x03\x00\x00\x00" + bytes(16), "not a NInfer container"),
    (b"NINFER\x00\x09" + bytes(16), "unknown NInfer container version 9"),
    (b"NINFER\x00\x03" + (100).to_bytes(8, "little") + b"{}", "truncated"),
])
def test_container_parser_refuses(blob, fragment):
    with pytest.raises(ValueError, match=fragment):
        pa.ninfer_container(blob)


def test_hf_source_over_files_written_by_the_safetensors_package(tmp_path):
    from safetensors.numpy import save_file

    from p2pkit.host.model import hf_source

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    save_file({"a": np.zeros(16, np.float16), "b": np.ones(8, np.float32)}, str(d / "s1.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "s1.safetensors",
                                                                               "b": "s1.safetensors"}}))
    s = hf_source(Host.at(tmp_path), "/m")
    assert model_stage.source_ok(s)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "s1.safetensors",
                                                                               "c": "s1.safetensors"}}))
    s = hf_source(Host.at(tmp_path), "/m")
    assert not model_stage.source_ok(s) and s["shards"]["s1.safetensors"]["missing_keys"] == ["c"]


def test_gguf_written_by_the_gguf_package_is_verified(tmp_path):
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 4), np.float32))
    w.add_tensor("blk.64.nextn.eh_proj.weight", np.zeros((4, 4), np.float16))
    w.add_uint32("qwen3.nextn_predict_layers", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    p = config.load("dual-5090-llamacpp")
    ctx = pipeline.Ctx(profile=p, host=Host.at("/"), store=Store(tmp_path / "s"), out=Output())
    v = model_stage.verify_file(ctx, path)
    assert v["tensor_count"] == 2 and v["mtp_tensors"] == 1 and "F16" in v["formats"]
    assert v["architecture"] == "qwen3" and v["nextn_predict_layers"] == 1
    b = {"source": {"config": True, "shards": {}}, "convert_rc": 0, "verify": v, "sha256": "0" * 64}
    c = {x.id: x for x in check_model({"model_build": b}, p)}
    assert c["model.architecture"].status == "pass" and c["model.mtp"].status == "pass"
    c = {x.id: x for x in check_model({"model_build": {**b, "verify": {**v, "nextn_predict_layers": None}}}, p)}
    assert c["model.mtp"].status == "fail" and c["model.mtp"].pitfall == "P19"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTGGUF" + bytes(64))
    assert "not a readable GGUF" in model_stage.verify_file(ctx, bad)["error"]


@pytest.mark.parametrize("nccl_path,status", [("/opt/nccl/lib/libnccl.so.2", "pass"),
                                              ("/usr/lib/x86_64-linux-gnu/libnccl.so.2", "fail")])
def test_llamacpp_must_link_the_profiles_nccl(nccl_path, status):
    """P16 over ldd output: llama-server and libggml-cuda.so must resolve libnccl in engine.nccl_root."""
    from p2pkit.parse.build import ldd
    from p2pkit.stages.engine import checks as ec

    p = config.load("dual-5090-llamacpp")
    out = (f"\tlinux-vdso.so.1 (0x00007ffd)\n\tlibnccl.so.2 => {nccl_path} (0x00007f01)\n"
           "\tlibcudart.so.13 => /usr/local/cuda/lib64/libcudart.so.13 (0x00007f02)\n")
    libs = ldd(out)
    b = {"source": {"head": p.engine.commit or "x"}, "cuda": {"version": "13.1"}, "pkg_config": {},
         "binary": {"runs": True, "version": "llama-server"}, "libraries": libs,
         "nccl_links": {"llama-server": libs, "libggml-cuda.so": libs}}
    c = {x.id: x for x in ec.check({"engine_build": b}, p)}
    assert c["engine.nccl.llama-server"].status == status
    assert c["engine.nccl.libggml-cuda.so"].status == status
    if status == "fail":
        assert c["engine.nccl.libggml-cuda.so"].pitfall == "P16" and "2.18.3" in c["engine.nccl.libggml-cuda.so"].hint


def test_engine_source_needs_a_pinned_commit_and_a_checkout():
    """Found on the lent H200: with no commit and no checkout, the source check must not pass."""
    from dataclasses import replace

    from p2pkit.stages.engine import checks as ec

    p = config.load("dual-5090-ninfer")
    unpinned = replace(p, engine=replace(p.engine, commit=""))
    b = {"source": {"path": "/opt/p2pkit/ninfer", "head": None}, "cuda": {"version": "13.1"}, "pkg_config": {}}
    c = {c.id: c for c in ec.check({"engine_build": b}, unpinned)}["engine.source"]
    assert c.status == "fail" and c.measured == "no checkout"
    pinned = replace(p, engine=replace(p.engine, commit="abc1234"))
    b["source"]["head"] = "abc1234" + "0" * 33
    assert {c.id: c for c in ec.check({"engine_build": b}, pinned)}["engine.source"].status == "pass"
