"""llama.cpp's recipe: the pinned source archive, the CPU-only build said plainly, the GPU recipe's
real configure (nvcc 13.0 without cuBLAS here), the NCCL root, and what the real server says."""

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from p2pkit.app import pipeline
from p2pkit.core import config
from p2pkit.core.artifacts import Store
from p2pkit.core.output import Output
from p2pkit.host import Host
from p2pkit.rules.engines import llamacpp as llamacpp_rules
from p2pkit.stages.engine import checks as ec
from p2pkit.stages.engine import cmake as engine_stage
from p2pkit.stages.engine import llamacpp

FIX = Path(__file__).parent / "fixtures/llamacpp"


def make_archive(path: Path, files: dict[str, str]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return llamacpp.sha256_file(path)


def ctx_for(tmp_path, overrides=()):
    p = config.load("dual-5090-llamacpp", list(overrides))
    store = Store(tmp_path / "state")
    store.ensure()
    return pipeline.Ctx(profile=p, host=Host.at("/"), store=store, out=Output())


def small(tmp_path, sha=None):
    arc = tmp_path / "src.tar.gz"
    real = make_archive(arc, {"pkg-1.0/vendor/llama.cpp/CMakeLists.txt": "project(x)\n",
                              "pkg-1.0/vendor/llama.cpp/tools/server/server.cpp": "int main(){}\n",
                              "pkg-1.0/README.md": "outside the subdir\n"})
    return arc, real, [f"engine.source_url={arc}", f"engine.source_sha256={sha or real}",
                       "engine.source_subdir=pkg-1.0/vendor/llama.cpp", f"engine.build_dir={tmp_path}/llama.cpp"]


def test_archive_with_the_wrong_sha256_is_refused_before_unpacking(tmp_path):
    _arc, real, sets = small(tmp_path, sha="0" * 64)
    ctx = ctx_for(tmp_path, [*sets, "engine.cuda=false"])
    res = engine_stage.build(ctx)
    assert res["refused"] and "refused before unpacking" in res["source"]["archive"]["error"]
    assert res["source"]["archive"]["sha256"] == real
    assert not (tmp_path / "llama.cpp").exists()  # not a byte unpacked
    assert "cmake_options" not in res and "configure_rc" not in res
    c = {x.id: x for x in ec.check({"engine_build": res}, ctx.profile)}
    assert c["engine.source"].status == "fail" and "0000000000000000" in c["engine.source"].expected


def test_archive_unpacks_its_subdir_once_and_never_over_a_foreign_tree(tmp_path):
    _arc, real, sets = small(tmp_path)
    ctx = ctx_for(tmp_path, sets)
    log = tmp_path / "log"
    first = llamacpp.source(ctx, tmp_path / "llama.cpp", log)
    assert first["unpacked"] is True and first["files"] == 2
    assert (tmp_path / "llama.cpp/tools/server/server.cpp").is_file()
    assert not (tmp_path / "llama.cpp/README.md").exists()  # outside source_subdir
    assert json.loads((tmp_path / "llama.cpp" / llamacpp.MARKER).read_text())["sha256"] == real
    again = llamacpp.source(ctx, tmp_path / "llama.cpp", log)
    assert again["unpacked"] is False and "error" not in again
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("someone's work\n")
    refused = llamacpp.source(ctx, foreign, log)
    assert "will not touch it" in refused["error"] and (foreign / "mine.txt").read_text() == "someone's work\n"
    shutil.rmtree(tmp_path / "llama.cpp")
    ctx = ctx_for(tmp_path, [*sets[:2], "engine.source_subdir=pkg-1.0/nothing", sets[3]])
    assert "nothing under" in llamacpp.source(ctx, tmp_path / "llama.cpp", log)["error"]


def test_cuda_off_is_said_plainly_and_never_silent(tmp_path):
    on = ctx_for(tmp_path)
    off = ctx_for(tmp_path, ["engine.cuda=false"])
    assert "-DGGML_CUDA=ON" in llamacpp.cmake_options(on) and "-DCMAKE_CUDA_ARCHITECTURES=120a" in \
        llamacpp.cmake_options(on)
    opts = llamacpp.cmake_options(off)
    assert "-DGGML_CUDA=OFF" in opts and not any("CUDA_ARCH" in o or "NCCL" in o for o in opts)
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in opts  # no network: never download the web UI
    b = {"source": {"sha256": off.profile.engine.source_sha256}, "cuda": {"off": True, "version": None},
         "pkg_config": {}, "cuda_enabled": False}
    c = {x.id: x for x in ec.check({"engine_build": b}, off.profile)}
    assert c["engine.cuda"].status == "warn" and "CUDA OFF" in c["engine.cuda"].measured
    assert "engine.nccl_root" not in c  # a CPU build links no NCCL
    # the GPU profile as shipped never builds without CUDA: no nvcc is a failure, not a CPU build
    b = {**b, "cuda": {"version": None, "error": "nvcc not found"}, "cuda_enabled": True}
    c = {x.id: x for x in ec.check({"engine_build": b}, on.profile)}
    assert c["engine.cuda"].status == "fail"


def test_nccl_root_from_a_pip_wheel_needs_the_unversioned_link(tmp_path):
    root = tmp_path / "nccl"
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include/nccl.h").write_text("/* nccl */\n")
    (root / "lib/libnccl.so.2").write_bytes(b"\x7fELF")
    p = config.load("dual-5090-llamacpp", [f"engine.nccl_root={root}"])
    b = {"source": {"sha256": p.engine.source_sha256}, "cuda": {"version": "13.0"}, "pkg_config": {},
         "nccl": llamacpp.nccl_layout(root)}
    assert not engine_stage.toolchain_ok(b, p)  # refused before CMake
    c = {x.id: x for x in ec.check({"engine_build": b}, p)}["engine.nccl_layout"]
    assert c.status == "fail" and "libnccl.so.2" in c.measured and "ln -s" in c.hint and c.pitfall == "P16"
    (root / "lib/libnccl.so").symlink_to("libnccl.so.2")
    b["nccl"] = llamacpp.nccl_layout(root)
    assert engine_stage.toolchain_ok(b, p)
    assert {x.id: x for x in ec.check({"engine_build": b}, p)}["engine.nccl_layout"].status == "pass"


def nccl_from_wheel(tmp_path: Path) -> Path:
    """An NCCL root over PyPI's nvidia-nccl-cu13 wheel (a real libnccl), with the libnccl.so link
    CMake's FindNCCL needs (the wheel ships only libnccl.so.2)."""
    nccl = pytest.importorskip("nvidia.nccl")
    wheel = Path(next(iter(nccl.__path__)))
    root = tmp_path / "nccl"
    (root / "lib").mkdir(parents=True)
    (root / "include").symlink_to(wheel / "include")
    (root / "lib/libnccl.so.2").symlink_to(wheel / "lib/libnccl.so.2")
    (root / "lib/libnccl.so").symlink_to("libnccl.so.2")
    return root


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("nvcc"), reason="the GPU recipe's configure needs CUDA's compiler")
def test_gpu_recipe_configures_for_real_and_names_the_missing_cublas(tmp_path):
    """nvcc 13.0 without cuBLAS (the CI machine): the toolkit check, 120a and NCCL from the profile's
    root all pass for real; CMake's generate step fails on CUDA::cublas, reported as the first
    CMake Error with its fix."""
    import llama_real

    archive = llama_real.ensure_archive()
    ctx = ctx_for(tmp_path, [f"engine.source_url={archive}", f"engine.build_dir={tmp_path}/llama.cpp",
                             f"engine.nccl_root={nccl_from_wheel(tmp_path)}"])
    res = engine_stage.build(ctx)
    log = Path(res["log"]).read_text()
    assert res["cuda"]["version"] and res["configure_rc"] != 0 and "build_rc" not in res
    assert "-- Using CMAKE_CUDA_ARCHITECTURES=120a" in log
    assert f"-- Found NCCL: {tmp_path}/nccl/lib/libnccl.so" in log
    assert res["first_error"].startswith("CMake Error at ggml/src/ggml-cuda/CMakeLists.txt")
    assert "CUDA::cublas" in res["first_error"]
    c = {x.id: x for x in ec.check({"engine_build": res}, ctx.profile)}
    assert c["engine.cuda"].status == "pass" and c["engine.nccl_layout"].status == "pass"
    assert c["engine.configure"].status == "fail" and "cuBLAS" in c["engine.configure"].hint
    assert "libcublas-dev" in c["engine.configure"].hint


# ------------------------------------------------------------------ what the real llama-server says
# tests/fixtures/llamacpp: recorded from the real llama-server built by tests/llama_real.py over the
# tiny checkpoint (tests/tiny_checkpoint.py); README.md there says how.

def _first_completion(rec: dict) -> dict:
    from p2pkit.parse import engine_api as pe

    before = pe.prometheus(rec["metrics_before"], "llamacpp:") if rec["metrics_before_status"] == 200 else {}
    after = pe.prometheus(rec["metrics_after"], "llamacpp:") if rec["metrics_after_status"] == 200 else {}
    return {"status": rec["completion_status"], "timings": rec["response"]["timings"], "alive_after": True,
            "metrics_status": rec["metrics_after_status"],
            "metrics_delta": pe.deltas(before, after) if rec["metrics_after_status"] == 200 else {}}


def test_help_of_the_real_llama_server_lists_the_flags_p2pkit_writes():
    from p2pkit.parse import engine_api as pe

    flags = pe.help_flags((FIX / "llama-server-help.txt").read_text())
    assert {"ctx-size", "n-gpu-layers", "split-mode", "tensor-split", "spec-type", "spec-draft-n-max",
            "model-draft", "metrics", "cache-type-k", "flash-attn", "kv-unified", "threads", "no-kv-unified",
            "spec-draft-n-min", "parallel", "host", "port", "gpu-layers", "no-webui"} <= flags
    assert "no-such-flag" not in flags and len(flags) > 150
    assert "removed" not in flags  # words of the descriptions are not options


@pytest.mark.parametrize("name,status", [("spec_on", "pass"), ("md_alone", "fail"), ("no_metrics", "fail")])
def test_spec_running_from_the_real_servers_counters(name, status):
    """P19 the real way: `--spec-type` on gives draft counts in the response and growing spec_decode
    counters; `-md` alone loads the draft and drafts nothing; without --metrics /metrics is 501."""

    rec = json.loads((FIX / f"{name}.json").read_text())
    assert rec["health_codes"][-1][0] == 200
    p = config.load("dual-5090-llamacpp", ["serve.flags.spec-type=draft-simple"])
    s = {"health": {"ok": True}, "first_completion": _first_completion(rec), "log_tail": ["(recorded)"]}
    c = {x.id: x for x in llamacpp_rules.check_llamacpp_requests(s, p)}
    assert c["service.first_completion"].status == "pass"
    assert c["service.spec_running"].status == status, c["service.spec_running"]
    if name == "no_metrics":
        assert rec["metrics_after_status"] == 501 and "--metrics" in c["service.spec_running"].hint
    # the same counters exist without a draft too, at 0: a counter's presence proves nothing
    if name == "md_alone":
        assert "spec_decode_num_draft_tokens_total" in rec["metrics_after"]
        assert "draft_n" not in rec["response"]["timings"]


def test_a_crash_at_the_first_decode_fails_the_service_with_p19():

    p = config.load("dual-5090-llamacpp")
    fc = {"status": None, "error": "RemoteDisconnected: Remote end closed connection without response",
          "alive_after": False, "metrics_status": None}
    s = {"health": {"ok": True}, "first_completion": fc, "log_tail": ["GGML_ASSERT(...) failed"]}
    c = {x.id: x for x in llamacpp_rules.check_llamacpp_requests(s, p)}["service.first_completion"]
    assert c.status == "fail" and c.pitfall == "P19" and "GGML_ASSERT" in c.measured


def test_a_pypi_source_is_named_like_its_sdist_and_found_in_the_cache(tmp_path):
    """pypi:NAME==VERSION: the source distribution through pip (no index host in the profile); an
    archive already in the cache is used as it is, its sha256 still checked."""
    assert llamacpp.archive_name("pypi:llama-cpp-python==0.3.36") == "llama_cpp_python-0.3.36.tar.gz"
    cache = tmp_path / "cache"
    cache.mkdir()
    real = make_archive(cache / "some_pkg-1.0.tar.gz", {"some_pkg-1.0/x": "y\n"})
    ctx = ctx_for(tmp_path, ["engine.source_url=pypi:some-pkg==1.0", f"engine.source_sha256={real}",
                             f"driver.cache_dir={cache}"])
    got = llamacpp.fetch(ctx, tmp_path / "fetch.log")
    assert "error" not in got and got["sha256"] == real and got["archive"] == str(cache / "some_pkg-1.0.tar.gz")


def test_a_pypi_source_that_pip_cannot_find_is_an_error_and_leaves_nothing(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    ctx = ctx_for(tmp_path, ["engine.source_url=pypi:p2pkit-no-such-package-here==0.0.0",
                             f"engine.source_sha256={'0' * 64}", f"driver.cache_dir={cache}"])
    got = llamacpp.fetch(ctx, tmp_path / "fetch.log")
    assert got["error"].startswith("pip download of p2pkit-no-such-package-here==0.0.0 failed")
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize("bad", ["pypi:llama-cpp-python", "pypi:llama cpp==1", "pypi:x==1;rm",
                                 "pypi:-r==1", "pypi:x==-e"])  # never an option to pip
def test_a_malformed_pypi_source_is_refused_by_the_profile(bad):
    from p2pkit.core.errors import ProfileError

    with pytest.raises(ProfileError):
        config.load("dual-5090-llamacpp", [f"engine.source_url={bad}"])
