"""Condition guards for the engine stage's checks (p2pkit.stages.engine.checks): each test gives a check
function the facts where one of its conditions decides the outcome, and asserts the finding's status,
id, pitfall and measured text (bench/check_guard.py --conditions --only engine)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pkit.core import config
from p2pkit.rules.findings import FAIL, PASS, SKIP, WARN
from p2pkit.stages.engine import checks, cmake
from p2pkit.stages.engine import llamacpp as llamacpp_stage
from p2pkit.stages.engine import ninfer as ninfer_stage
from p2pkit.stages.engine import vllm as vllm_stage

COMMIT = "3f2a9c1d4b5e6f708192a3b4c5d6e7f8091a2b3c"
_NINFER = config.load("dual-5090-ninfer")
NINFER = replace(_NINFER, engine=replace(_NINFER.engine, commit=COMMIT))  # repo set by the profile
LLAMA = config.load("dual-5090-llamacpp")  # a pinned archive (source_url, source_sha256), NCCL at /opt/nccl
LLAMA_GIT = replace(LLAMA, engine=replace(LLAMA.engine, source_url="", source_sha256="", commit=COMMIT,
                                          repo="https://github.com/ggml-org/llama.cpp.git"))
_SPARK = config.load("dual-spark-vllm")
SPARK = replace(_SPARK, engine=replace(_SPARK.engine, commit=COMMIT))  # branch release/qwen38next, arch 121a
LOG = "/var/lib/p2pkit/logs/engine-build-0001.log"


def eng(p, **kw):
    return replace(p, engine=replace(p.engine, **kw))


def by_id(cs) -> dict:
    return {c.id: c for c in cs}


def build(**kw) -> dict:
    """NInfer built at the pinned commit with CUDA 13.1: the engine_build fact of a good run, with the keys
    given replaced (a key given as ... is left out: a refused run has no configure_rc, no binary)."""
    b = {"log": LOG, "source": {"path": "/opt/p2pkit/ninfer", "head": COMMIT}, "cuda_enabled": True,
         "cuda": {"version": "13.1", "archs": ["90", "100", "120"]}, "pkg_config": {},
         "configure_rc": 0, "build_rc": 0, "build_tail": None, "first_error": None,
         "binary": {"path": "/opt/p2pkit/ninfer/build/apps/ninfer-serve", "runs": True,
                    "version": "ninfer-serve 0.3.1"},
         "libraries": [{"name": "libc.so.6", "path": "/lib/x86_64-linux-gnu/libc.so.6"}]}
    b.update(kw)
    return {k: v for k, v in b.items() if v is not ...}


# ------------------------------------------------------------------------------------------ precheck


@pytest.mark.parametrize("recipe,status", [("ninfer", PASS), ("llamacpp", PASS), ("vllm", PASS),
                                           ("tensorrt-llm", FAIL)])
def test_engine_recipe_must_be_one_p2pkit_has(recipe, status):
    c = by_id(checks.precheck(eng(NINFER, recipe=recipe)))["engine.recipe"]
    assert (c.status, c.measured, c.expected) == (status, recipe, "ninfer or llamacpp or vllm")
    assert (c.hint == "use one of the recipes p2pkit has") == (status == FAIL)


@pytest.mark.parametrize("p,ids", [
    # vLLM: a source tree at a commit, or a pinned wheel; either way engine.python's prefix p2pkit builds beside
    (SPARK, ["engine.recipe", "engine.vllm_source_pin", "engine.commit", "engine.python_prefix"]),
    (config.load("vllm-cpu"), ["engine.recipe", "engine.vllm_source_pin", "engine.python_prefix"]),
    (LLAMA, ["engine.recipe", "engine.source_pin", "engine.nccl_root"]),
    (eng(LLAMA, cuda=False), ["engine.recipe", "engine.source_pin"]),
    (LLAMA_GIT, ["engine.recipe", "engine.commit", "engine.nccl_root"]),
    (NINFER, ["engine.recipe", "engine.commit", "engine.cuda_arch"]),
    # an archive is llama.cpp's way only: NInfer is still pinned by its commit
    (eng(NINFER, source_url="https://example.org/ninfer.tar.gz"),
     ["engine.recipe", "engine.commit", "engine.cuda_arch"]),
], ids=["vllm", "vllm-wheel", "llamacpp-archive", "llamacpp-cpu", "llamacpp-git", "ninfer", "ninfer-with-source-url"])
def test_precheck_judges_what_each_recipe_needs(p, ids):
    assert [c.id for c in checks.precheck(p)] == ids


@pytest.mark.parametrize("sha,status,measured", [
    (LLAMA.engine.source_sha256, PASS, LLAMA.engine.source_sha256),
    ("", FAIL, "(no sha256)"),
])
def test_engine_source_archive_must_be_pinned_by_sha256(sha, status, measured):
    c = by_id(checks.precheck(eng(LLAMA, source_sha256=sha)))["engine.source_pin"]
    assert (c.status, c.measured, c.expected) == (status, measured, "a sha256")
    assert ("never unpacks an unpinned archive" in c.hint) == (status == FAIL)


@pytest.mark.parametrize("commit,repo,status,measured", [
    (COMMIT, NINFER.engine.repo, PASS, COMMIT),
    ("", NINFER.engine.repo, FAIL, "(empty)"),
    (COMMIT, "", FAIL, COMMIT),  # a commit of no repository is no pin
    ("3f2a9c", NINFER.engine.repo, FAIL, "3f2a9c"),  # too short to name one commit
])
def test_engine_commit_pins_a_repository_and_a_commit(commit, repo, status, measured):
    c = by_id(checks.precheck(eng(NINFER, commit=commit, repo=repo)))["engine.commit"]
    assert (c.status, c.measured, c.pitfall) == (status, measured, "P09")


@pytest.mark.parametrize("root,status,measured", [("/opt/nccl", PASS, "/opt/nccl"), ("", FAIL, "(empty)")])
def test_nccl_root_is_named_or_said_empty(root, status, measured):
    c = by_id(checks.precheck(eng(LLAMA, nccl_root=root)))["engine.nccl_root"]
    assert (c.status, c.measured, c.expected, c.pitfall) == (status, measured, "a directory", "P16")


# ---------------------------------------------------------------------------------------------- CUDA


@pytest.mark.parametrize("b", [
    {"cuda": {"off": True, "version": None}},  # the toolchain's own marker (an artifact without cuda_enabled)
    {"cuda": {"version": None}, "cuda_enabled": False},  # the build's marker alone
], ids=["cuda-off", "cuda-enabled-false"])
def test_a_cpu_build_is_a_warning_from_either_marker(b):
    (c,) = cmake._cuda(b, eng(NINFER, cuda=False))
    assert (c.id, c.status, c.measured, c.pitfall) == ("engine.cuda", WARN, "CUDA OFF (engine.cuda = false)", "P05")


@pytest.mark.parametrize("version,status", [("12.8", FAIL), ("13.0", FAIL), ("13.1", PASS), ("13.2", PASS),
                                            ("14.0", PASS)])
def test_cuda_version_held_to_engine_cuda_min(version, status):
    c = by_id(cmake._cuda({"cuda": {"version": version}}, NINFER))["engine.cuda"]
    assert (c.status, c.measured, c.expected, c.pitfall) == (status, version, ">= 13.1", "P05")
    assert ("NInfer requires CUDA 13.1 or newer" in c.hint) == (status == FAIL)


@pytest.mark.parametrize("header,library,versioned,status,measured", [
    (True, "/opt/nccl/lib/libnccl.so", ["/opt/nccl/lib/libnccl.so.2"], PASS, "header found, /opt/nccl/lib/libnccl.so"),
    (False, "/opt/nccl/lib/libnccl.so", [], FAIL, "header missing, /opt/nccl/lib/libnccl.so"),
    (True, None, [], FAIL, "header found, no libnccl.so"),
    (True, None, ["/opt/nccl/lib/libnccl.so.2"], FAIL,
     "header found, no libnccl.so (only /opt/nccl/lib/libnccl.so.2)"),  # a pip wheel's layout
])
def test_nccl_layout_needs_the_header_and_the_unversioned_library(header, library, versioned, status, measured):
    n = {"root": "/opt/nccl", "header": header, "library": library, "versioned": versioned}
    c = by_id(cmake._cuda({"cuda": {"version": "13.0"}, "nccl": n}, LLAMA))["engine.nccl_layout"]
    assert (c.status, c.measured, c.pitfall) == (status, measured, "P16")
    assert c.expected == "/opt/nccl/include/nccl.h and lib/libnccl.so"


@pytest.mark.parametrize("archs,status,measured", [
    ("120a", PASS, "120a"),
    ("86", FAIL, "86 (86 not in nvcc --list-gpu-arch)"),
])
def test_cuda_architectures_the_toolkit_lists(archs, status, measured):
    cuda = {"version": "13.1", "archs": ["90", "100", "120"]}
    c = by_id(cmake._cuda_archs(cuda, eng(NINFER, cuda_architectures=archs)))["engine.cuda_arch_supported"]
    assert (c.status, c.measured, c.pitfall) == (status, measured, "P05")


# ------------------------------------------------------------------------------ check: what is judged


def test_doctor_builds_nothing_so_the_build_is_skipped():
    cs = checks.check({}, NINFER)
    assert [c.id for c in cs] == ["engine.recipe", "engine.commit", "engine.cuda_arch", "engine.build"]
    assert (cs[-1].status, cs[-1].measured) == (SKIP, "not measured here: doctor builds nothing")


def test_vllm_is_judged_from_what_its_environment_holds():
    cs = checks.check({"engine_build": {"vllm_env": {}, "vllm_tree": None}}, SPARK)
    assert [c.id for c in cs] == ["engine.recipe", "engine.vllm_source_pin", "engine.commit", "engine.python_prefix",
                                  "engine.vllm"]
    assert (cs[-1].status, cs[-1].measured) == (FAIL, "could not determine: not probed")


PKG_MISSING = "Package libavformat was not found in the pkg-config search path."


@pytest.mark.parametrize("r,status,measured", [
    ({"ok": True, "version": "61.1.100"}, PASS, "61.1.100"),
    ({"ok": False, "error": PKG_MISSING}, FAIL, PKG_MISSING),
])
@pytest.mark.parametrize("path,shown", [("/opt/ffmpeg/lib/pkgconfig", "/opt/ffmpeg/lib/pkgconfig"), ("", "unset")])
def test_pkg_config_module_named_with_its_version_or_error(r, status, measured, path, shown):
    b = build(pkg_config={"libavformat": r}, refused=True, configure_rc=..., build_rc=..., build_tail=...,
              first_error=..., binary=..., libraries=...)
    c = by_id(checks.check({"engine_build": b}, eng(NINFER, pkg_config_path=path)))["engine.pkg_config.libavformat"]
    assert (c.status, c.measured, c.pitfall) == (status, measured, "P06")
    assert c.hint == ("" if status == PASS else f"PKG_CONFIG_PATH ({shown}) does not reach libavformat.pc: point "
                      "engine.pkg_config_path at it")


AFTER_TOOLCHAIN = ["engine.recipe", "engine.commit", "engine.cuda_arch", "engine.source", "engine.cuda",
                   "engine.cuda_arch_supported"]


@pytest.mark.parametrize("b,more", [
    # refused before configuring (a toolchain check failed): no build log, no binary judged
    (build(cuda={"version": "12.8", "archs": ["90", "120"]}, refused=True, configure_rc=..., build_rc=...,
           build_tail=..., first_error=..., binary=..., libraries=...), []),
    # refused, though the fact still carries an earlier build's binary: that binary is not this run's result
    (build(cuda={"version": "12.8", "archs": ["90", "120"]}, refused=True, configure_rc=..., build_rc=...,
           build_tail=..., first_error=...), []),
    # neither configured nor a binary read: nothing to judge
    (build(configure_rc=..., build_rc=..., build_tail=..., first_error=..., binary=..., libraries=...), []),
    # CMake failed: the configure step is judged, and nothing after it
    (build(configure_rc=1, build_rc=..., build_tail=..., binary=..., libraries=...,
           first_error="CMake Error at CMakeLists.txt:12 (find_package): Could not find CUDAToolkit"),
     ["engine.configure"]),
    # CMake failed, the binary of an earlier build still there: not judged
    (build(configure_rc=1, build_rc=..., build_tail=...,
           first_error="CMake Error at CMakeLists.txt:12 (find_package): Could not find CUDAToolkit"),
     ["engine.configure"]),
    # built now: configure, build, binary, libraries
    (build(), ["engine.configure", "engine.build", "engine.binary", "engine.libraries"]),
    # what is installed (no build in this run): binary and libraries only
    (build(configure_rc=..., build_rc=..., build_tail=..., first_error=...), ["engine.binary", "engine.libraries"]),
], ids=["refused", "refused-with-old-binary", "nothing", "configure-failed", "configure-failed-old-binary", "built",
        "installed"])
def test_what_the_build_fact_holds_decides_what_is_judged(b, more):
    cs = checks.check({"engine_build": b}, NINFER)
    assert [c.id for c in cs] == AFTER_TOOLCHAIN + more
    got = by_id(cs)
    if b.get("refused"):
        assert got["engine.cuda"].status == FAIL and got["engine.cuda"].measured == "12.8"
    if "engine.configure" in got:
        assert got["engine.configure"].status == (PASS if b["configure_rc"] == 0 else FAIL)
    if "engine.binary" in got:
        assert (got["engine.binary"].status, got["engine.binary"].measured) == (PASS, "ninfer-serve 0.3.1")


# --------------------------------------------------------------------------------- configure, build


def test_configure_and_build_that_succeed_say_ok():
    c = by_id(cmake._configure({"configure_rc": 0, "build_rc": 0, "build_tail": None, "first_error": None,
                                 "log": LOG}))
    assert (c["engine.configure"].status, c["engine.configure"].measured, c["engine.configure"].pitfall) == \
        (PASS, "ok", "")
    assert (c["engine.build"].status, c["engine.build"].measured, c["engine.build"].hint) == (PASS, "ok", "")


def test_configure_failure_shows_cmakes_first_error():
    err = "CMake Error at CMakeLists.txt:40 (message): No CMAKE_CUDA_COMPILER could be found."
    c = by_id(cmake._configure({"configure_rc": 1, "first_error": err, "log": LOG}))
    assert list(c) == ["engine.configure"]
    assert (c["engine.configure"].status, c["engine.configure"].measured, c["engine.configure"].pitfall) == \
        (FAIL, err, "P05")
    assert c["engine.configure"].hint == f"{cmake.NO_CUDA_COMPILER} (log: {LOG})"


def test_build_failure_shows_the_tail_of_the_build():
    tail = "FAILED: apps/ninfer-serve | collect2: error: ld returned 1 exit status | ninja: build stopped"
    c = by_id(cmake._configure({"configure_rc": 0, "build_rc": 1, "build_tail": tail, "first_error": None,
                                 "log": LOG}))["engine.build"]
    assert (c.status, c.measured, c.hint) == (FAIL, tail, f"read the build log: {LOG}")


# ---------------------------------------------------------------------------------- build log, binary

CRITERIA = {"found CUDAToolkit 13.1 or newer": "13.1 at /usr/local/cuda-13.1/include (build log)",
            "found libavformat": "61.1.100 (build log)", "no CMake Error": "none in the log",
            "linked apps/ninfer-serve": "linked in this build"}


def test_build_log_with_every_criterion_shows_the_evidence():
    c = by_id(cmake._result(build(criteria=CRITERIA), NINFER))["engine.build_log"]
    assert (c.status, c.pitfall) == (PASS, "P07")
    assert c.measured == "; ".join(f"{k}: {v}" for k, v in CRITERIA.items())
    assert c.expected == ", ".join(CRITERIA)


@pytest.mark.parametrize("cache,shown", [("/opt/p2pkit/ninfer/build/CMakeCache.txt", "/opt/p2pkit/ninfer/build/"
                                          "CMakeCache.txt"), (None, "none")])
def test_build_log_lacking_criteria_names_them_and_the_cache(cache, shown):
    crit = {**CRITERIA, "found libavformat": None, "linked apps/ninfer-serve": None}
    c = by_id(cmake._result(build(criteria=crit, cmake_cache=cache), NINFER))["engine.build_log"]
    assert (c.status, c.pitfall) == (FAIL, "P07")
    assert c.measured == "found libavformat, linked apps/ninfer-serve"
    assert c.hint == (f"the build log {LOG} lacks: found libavformat, linked apps/ninfer-serve (CMakeCache.txt: "
                      f"{shown}); rebuild with `p2pkit up --from engine --force`")


@pytest.mark.parametrize("binary,status,measured", [
    ({"runs": True, "version": "ninfer-serve 0.3.1"}, PASS, "ninfer-serve 0.3.1"),
    ({"runs": False, "error": "/opt/p2pkit/ninfer/build/apps/ninfer-serve was not built"}, FAIL,
     "/opt/p2pkit/ninfer/build/apps/ninfer-serve was not built"),
    ({}, FAIL, "missing"),
])
def test_engine_binary_named_by_its_version_or_why_not(binary, status, measured):
    c = by_id(cmake._result(build(binary=binary), NINFER))["engine.binary"]
    assert (c.status, c.measured) == (status, measured)


def test_no_linked_library_listed_is_no_proof():
    c = by_id(cmake._result(build(libraries=[]), NINFER))["engine.libraries"]
    assert (c.status, c.value, c.measured) == (FAIL, None, "no linked library listed")


CUDART = {"name": "libcudart.so.13", "path": "/usr/local/cuda-13.0/lib64/libcudart.so.13"}


def test_ninfer_is_not_judged_on_nccl_links():
    b = build(nccl_links={"ninfer-serve": [CUDART, {"name": "libnccl.so.2", "path": "/usr/lib/libnccl.so.2"}]})
    judged = cmake._result(b, NINFER) + ninfer_stage.result_more(b, NINFER)
    assert not [c for c in judged if c.id.startswith("engine.nccl")]


@pytest.mark.parametrize("links,status,measured", [
    ([CUDART, {"name": "libnccl.so.2", "path": "/opt/nccl/lib/libnccl.so.2"}], PASS, "/opt/nccl/lib/libnccl.so.2"),
    ([CUDART, {"name": "libnccl.so.2", "path": "/usr/lib/x86_64-linux-gnu/libnccl.so.2"}], FAIL,
     "/usr/lib/x86_64-linux-gnu/libnccl.so.2"),
    ([CUDART, {"name": "libnccl.so.2", "path": None}], FAIL, "not found"),
    ([CUDART], FAIL, "no libnccl"),  # built without NCCL
], ids=["profile-nccl", "system-nccl", "nccl-not-found", "no-nccl"])
def test_llamacpp_links_the_profiles_nccl(links, status, measured):
    c = by_id(llamacpp_stage.result_more(build(nccl_links={"llama-server": links}), LLAMA))["engine.nccl.llama-server"]
    assert (c.status, c.measured, c.expected, c.pitfall) == (status, measured, "under /opt/nccl", "P16")


# ------------------------------------------------------------------------------------------ vLLM tree

# each variable's lists, one per CUDA version branch of CMakeLists.txt (p2pkit.parse.build.cmake_arch_lists)
SM121_LISTS = {"CUDA_SUPPORTED_ARCHS": [["8.0", "9.0", "12.0", "12.1"]],
               "SCALED_MM_ARCHS": [["9.0a"], ["12.0a", "12.1a"]],
               "CUTLASS_MOE_DATA_ARCHS": [["12.0a", "12.1a"]], "FP4_SM120_ARCHS": [["12.0a", "12.1a"]]}


def tree(**kw) -> dict:
    t = {"path": "/opt/vllm-src", "head": COMMIT, "branch": "release/qwen38next",
         "branches_with_head": ["release/qwen38next"], "arch_lists": SM121_LISTS, "sm121_e2m1": True}
    return {**t, **kw}


@pytest.mark.parametrize("t,why", [
    ({"error": "could not determine vllm_tree: PermissionError"}, "could not determine vllm_tree: PermissionError"),
    ({"path": "/opt/vllm-src", "error": "/opt/vllm-src is not a git checkout"}, "/opt/vllm-src is not a git checkout"),
], ids=["failed", "not-a-checkout"])
def test_vllm_tree_that_cannot_be_read_is_a_failure(t, why):
    assert [(c.id, c.status, c.measured, c.pitfall) for c in vllm_stage.vllm_tree_checks(t, SPARK)] == \
        [("engine.vllm_source", FAIL, f"could not determine: {why}", "P21")]


def test_vllm_tree_at_the_pinned_commit_and_branch_with_the_sm121_patch():
    c = by_id(vllm_stage.vllm_tree_checks(tree(), SPARK))
    s = c["engine.vllm_source"]
    assert (s.status, s.expected, s.pitfall) == (PASS, f"{COMMIT[:12]} on release/qwen38next", "P21")
    # the checked-out branch also holds HEAD (`git branch --contains HEAD` names it): named once
    assert s.measured == f"{COMMIT[:12]} on release/qwen38next"
    m = c["engine.vllm_sm121"]
    assert (m.status, m.measured, m.pitfall) == (PASS, "12.1 in all four arch lists, E2M1 fallback", "P21")


def test_vllm_tree_on_a_detached_head_is_found_on_the_branches_holding_it():
    s = vllm_stage.vllm_tree_checks(tree(branch=None), SPARK)[0]
    assert (s.status, s.measured) == (PASS, f"{COMMIT[:12]} on release/qwen38next")


def test_vllm_tree_without_a_pinned_branch_takes_any():
    s = vllm_stage.vllm_tree_checks(tree(branch="main", branches_with_head=["main"]), eng(SPARK, branch=""))[0]
    assert (s.status, s.expected) == (PASS, f"{COMMIT[:12]} on any branch")
    assert s.measured == f"{COMMIT[:12]} on main"


@pytest.mark.parametrize("p,t,measured,expected,hint", [
    (SPARK, tree(head="0" * 40), "000000000000 on release/qwen38next",
     f"{COMMIT[:12]} on release/qwen38next", "check out the pinned commit of release/qwen38next in /opt/vllm-src"),
    (eng(SPARK, branch=""), tree(head=None, branch=None, branches_with_head=[]), "no commit on no branch",
     f"{COMMIT[:12]} on any branch", "check out the pinned commit of the pinned branch in /opt/vllm-src"),
    # nothing pinned and no HEAD read: an empty commit equals an empty HEAD, and still proves nothing
    (eng(SPARK, commit=""), tree(head=None), "no commit on release/qwen38next",
     "(engine.commit empty) on release/qwen38next", "check out the pinned commit of release/qwen38next"),
], ids=["other-commit", "no-head-no-branch", "nothing-pinned"])
def test_vllm_tree_not_the_pinned_one_says_what_was_read(p, t, measured, expected, hint):
    s = vllm_stage.vllm_tree_checks(t, p)[0]
    assert (s.id, s.status, s.expected, s.pitfall) == ("engine.vllm_source", FAIL, expected, "P21")
    assert s.measured.startswith(measured) and s.hint.startswith(hint)


# ----------------------------------------------------------------------------------- kernel archs (P39)


def test_kernel_archs_without_the_fact_judges_nothing():
    assert checks.kernel_archs({}, NINFER) == []


def test_kernel_archs_engine_not_built_yet_is_a_skip():
    why = "no engine kernel library (**/ninfer-serve) under /opt/p2pkit/ninfer: the engine is not built yet"
    (c,) = checks.kernel_archs({"engine_archs": {"missing": why}}, NINFER)
    assert (c.id, c.status, c.measured, c.expected, c.pitfall) == ("field.kernel_archs", SKIP, why, "sm_120", "P39")


def test_kernel_archs_unreadable_is_a_warning_naming_what_to_run():
    e = {"error": "cuobjdump: not found", "by_hand": "cuobjdump --list-elf /opt/p2pkit/ninfer/build/apps/ninfer-serve"}
    (c,) = checks.kernel_archs({"engine_archs": e}, NINFER)
    assert (c.status, c.measured, c.pitfall) == (WARN, "could not check, because cuobjdump: not found", "P39")
    assert c.hint == f"run by hand: {e['by_hand']}"


@pytest.mark.parametrize("archs,status,measured", [
    (["sm_90", "sm_120a"], PASS, "libggml-cuda.so: sm_90, sm_120a"),
    (["sm_90"], FAIL, "libggml-cuda.so: sm_90"),
    ([], FAIL, "libggml-cuda.so: no SASS"),
])
def test_kernel_archs_lists_the_sass_built(archs, status, measured):
    (c,) = checks.kernel_archs({"engine_archs": {"library": "libggml-cuda.so", "archs": archs}}, LLAMA)
    assert (c.id, c.status, c.measured, c.expected, c.pitfall) == \
        ("field.kernel_archs", status, measured, "includes sm_120", "P39")


# ------------------------------------------------------------------------- reproved (the engine gate)

IDENT = {"dev": 2049, "ino": 77, "size": 4096, "mtime_ns": 1, "ctime_ns": 2}
EXE = "/opt/p2pkit/ninfer/build/apps/ninfer-serve"
LIBS = [{"name": "libc.so.6", "path": "/lib/x86_64-linux-gnu/libc.so.6"}]


def built(**kw) -> dict:
    return {"engine_build": {"binary": {"path": EXE, "sha256": "ab" * 32, "identity": dict(IDENT), **kw}}}


def now(identity=..., libraries=None) -> dict:
    return {"binary": {"path": EXE, "identity": dict(IDENT) if identity is ... else identity,
                       "libraries": LIBS if libraries is None else libraries}}


def test_reproved_passes_the_unchanged_binary_with_its_libraries():
    (c,) = checks.reproved(built(), now(), NINFER)
    assert (c.id, c.status, c.measured) == ("engine.built_files", PASS,
                                            f"{EXE} unchanged since the build, 1 libraries resolved")


def test_reproved_has_nothing_to_prove_for_vllm():
    assert checks.reproved(built(), None, SPARK) == []


@pytest.mark.parametrize("fresh", [None, {"error": "ldd: timed out"}])
def test_reproved_unreadable_now_is_unknown(fresh):
    (c,) = checks.reproved(built(), fresh, NINFER)
    assert c.status == FAIL and c.measured.startswith("could not determine")


def test_reproved_a_binary_gone_is_stale():
    (c,) = checks.reproved(built(), now(identity=None), NINFER)
    assert c.status == FAIL and c.measured == f"{EXE} is not there any more (moved or deleted since the build)"
    assert "up --from engine" in c.hint


@pytest.mark.parametrize("rec", [{"identity": None}, {"sha256": None}])
def test_reproved_an_artifact_without_identity_and_sha256_is_stale(rec):
    (c,) = checks.reproved(built(**rec), now(), NINFER)
    assert c.status == FAIL and c.measured.startswith(f"the artifact records no identity and sha256 for {EXE}")


@pytest.mark.parametrize("field", ["dev", "ino", "size", "mtime_ns", "ctime_ns"])
def test_reproved_each_field_of_the_identity_counts(field):
    moved = {**IDENT, field: IDENT[field] + 1}
    (c,) = checks.reproved(built(), now(identity=moved), NINFER)
    assert c.status == FAIL and f"{field} {IDENT[field]} -> {IDENT[field] + 1}" in c.measured
    assert cmake.changed(IDENT, moved) == [f"{field} {IDENT[field]} -> {IDENT[field] + 1}"]


@pytest.mark.parametrize("lib, pitfall", [("libnccl.so.2", "P16"), ("libavformat.so.60", "")])
def test_reproved_a_library_that_no_longer_resolves_is_stale(lib, pitfall):
    (c,) = checks.reproved(built(), now(libraries=[*LIBS, {"name": lib, "path": None}]), NINFER)
    assert c.status == FAIL and c.measured == f"{EXE}: {lib} not found" and c.pitfall == pitfall
