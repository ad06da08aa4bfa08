"""engine: the engine built from its pinned source, proven by its build log and its binary."""

from __future__ import annotations

import posixpath
from pathlib import PurePosixPath

from p2pkit.core.config import Profile
from p2pkit.parse import field as pf
from p2pkit.parse.build import archs_unbuildable, ldd_problems, names_arch, version_tuple
from p2pkit.rules.findings import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    changed,
    could_not,
    failed,
    figure,
    judge,
    not_measured,
    reads,
    unknown,
    unreadable,
)

NO_CUDA_COMPILER = ("CMake found no CUDA compiler (nvcc is not on PATH, or the toolkit is missing): install CUDA "
                    "13.1 or newer and put its bin/ first on PATH, or point CUDACXX (CMAKE_CUDA_COMPILER) at "
                    "/usr/local/cuda/bin/nvcc; then run the engine stage again")
NO_DEFAULT_ARCH = ("CMake could not compile its CUDA probe, so it found no default architecture (the CUDA compiler "
                   "identification is unknown: usually an nvcc CMake cannot run, or a stale build directory): point "
                   "CUDACXX at the toolkit's nvcc, remove the build directory, and always pass "
                   "CMAKE_CUDA_ARCHITECTURES (120a for the 5090; p2pkit passes engine.cuda_architectures)")
CMAKE_FIXES = (
    ("No CMAKE_CUDA_COMPILER could be found", "P05", NO_CUDA_COMPILER),
    ("CMAKE_CUDA_COMPILER-NOTFOUND", "P05", NO_CUDA_COMPILER),
    ("Failed to detect a default CUDA architecture", "P05", NO_DEFAULT_ARCH),
    ("CMAKE_CUDA_ARCHITECTURES", "P05", "NInfer builds only for 120a (RTX 5090, Blackwell): set "
                                        "engine.cuda_architectures = \"120a\""),
    ("libavformat", "P06", "pkg-config does not reach the FFmpeg libraries: set engine.pkg_config_path to the "
                           "directory holding libavformat.pc (and libavcodec, libavutil, libswscale)"),
    ("requires CUDA", "P05", "install CUDA 13.1 or newer and put its nvcc first on PATH"),
    ("CUDA::cublas", "", "the CUDA toolkit has no cuBLAS (llama.cpp's ggml-cuda links it): install the toolkit's "
                         "cuBLAS development files (apt install libcublas-dev-13-0, or cuda-libraries-dev-13-0) and "
                         "run the engine stage again"),
    ("Could not find", "", "a build dependency is missing: install it (see the line above)"),
)
PKG_MODULES = {"ninfer": ("libavformat", "libavcodec", "libavutil", "libswscale", "libcurl"), "llamacpp": ()}
RECIPES = (*PKG_MODULES, "vllm")
ENGINE_NAMES = {"ninfer": "NInfer", "llamacpp": "llama.cpp", "vllm": "vLLM"}


def precheck(p: Profile) -> list[Check]:
    out = [judge("engine.recipe", "a recipe for this engine", p.engine.recipe in RECIPES, p.engine.recipe,
                 " or ".join(RECIPES), "use one of the recipes p2pkit has")]
    if p.engine.recipe == "vllm":
        return out  # nothing is built: the environment engine.python names is proven instead (check)
    if p.engine.recipe == "llamacpp" and p.engine.source_url:
        out.append(judge("engine.source_pin", "engine source archive pinned by sha256", bool(p.engine.source_sha256),
                         p.engine.source_sha256 or "(no sha256)", "a sha256", "set engine.source_sha256 to the "
                         "digest of the archive you reviewed; p2pkit never unpacks an unpinned archive"))
        out += _nccl_root(p)
        return out
    out.append(judge("engine.commit", "engine source pinned", len(p.engine.commit) >= 7 and bool(p.engine.repo),
                     p.engine.commit or "(empty)", "a repository and a commit",
                     "set engine.repo and engine.commit to the source you reviewed; p2pkit never builds an unpinned "
                     "engine (a DFlash2 artifact needs a commit with TP2 DFlash2 support, P09)", pitfall="P09"))
    if p.engine.recipe == "ninfer":
        out.append(judge("engine.cuda_arch", "CMAKE_CUDA_ARCHITECTURES is 120a", p.engine.cuda_architectures == "120a",
                         p.engine.cuda_architectures, "120a", "NInfer supports only CMAKE_CUDA_ARCHITECTURES=120a",
                         pitfall="P05"))
    if p.engine.recipe == "llamacpp":
        out += _nccl_root(p)
    return out


def _nccl_root(p: Profile) -> list[Check]:
    if not p.engine.cuda:  # a CPU build links no NCCL (the cuda check says it is off)
        return []
    return [judge("engine.nccl_root", "a pinned NCCL for llama.cpp", bool(p.engine.nccl_root),
                  p.engine.nccl_root or "(empty)", "a directory", "set engine.nccl_root: the system libnccl "
                  "2.18.3 hangs at init on SM120", pitfall="P16")]


def _source(b: dict, p: Profile) -> Check:
    src = b["source"]
    if p.engine.recipe == "llamacpp" and p.engine.source_url:
        arch = src.get("archive", {})
        err = src.get("error") or arch.get("error")
        ok = not err and src.get("sha256") == p.engine.source_sha256
        return judge("engine.source", "source archive verified (sha256) and unpacked", ok,
                     err or f"sha256 {str(src.get('sha256'))[:16]}... in {src.get('path')}",
                     f"sha256 {p.engine.source_sha256[:16]}...",
                     "the archive is not the one the profile pins, or the build directory holds something else: "
                     "fetch the pinned archive again (or fix engine.source_sha256 after reviewing it)")
    head = src.get("head") or ""
    return judge("engine.source", "source checked out at the pinned commit",
                 bool(p.engine.commit) and bool(head) and head.startswith(p.engine.commit),
                 head or src.get("error") or "no checkout",
                 p.engine.commit, "the checkout is not the pinned commit: check engine.repo and engine.commit")


def _cuda(b: dict, p: Profile) -> list[Check]:
    cuda = b.get("cuda", {})
    if cuda.get("off") or b.get("cuda_enabled") is False:
        return [Check("engine.cuda", "CUDA toolkit version", WARN, "CUDA OFF (engine.cuda = false)",
                      f">= {p.engine.cuda_min}", "this engine was built for the CPU only, on purpose: it cannot "
                      "serve on the GPUs; set engine.cuda = true (the default) on the GPU box", "P05")]
    if cuda.get("version") is None:
        return [Check("engine.cuda", "CUDA toolkit version", FAIL, cuda.get("error", "nvcc not found"),
                      f">= {p.engine.cuda_min}", "install the CUDA toolkit and put nvcc on PATH", "P05")]
    name = ENGINE_NAMES.get(p.engine.recipe, p.engine.recipe)
    out = [judge("engine.cuda", "CUDA toolkit version", version_tuple(cuda["version"]) >=
                 version_tuple(p.engine.cuda_min), cuda["version"], f">= {p.engine.cuda_min}",
                 f"{name} requires CUDA {p.engine.cuda_min} or newer: install it and put its nvcc first on PATH",
                 pitfall="P05")]
    out += _cuda_archs(cuda, p)
    n = b.get("nccl")
    if n is not None:
        out.append(judge("engine.nccl_layout", "NCCL root has include/nccl.h and lib/libnccl.so",
                         n["header"] and n["library"] is not None,
                         f"header {'found' if n['header'] else 'missing'}, " + (n["library"] or "no libnccl.so"
                         + (f" (only {', '.join(n['versioned'])})" if n["versioned"] else "")),
                         f"{n['root']}/include/nccl.h and lib/libnccl.so",
                         "CMake's FindNCCL looks for include/nccl.h and lib/libnccl.so under NCCL_ROOT; without them "
                         "llama.cpp builds with 'NCCL not found' and no error. A pip nvidia-nccl wheel ships only "
                         "libnccl.so.2: add the link (ln -s libnccl.so.2 lib/libnccl.so)", pitfall="P16"))
    return out


def _cuda_archs(cuda: dict, p: Profile) -> list[Check]:
    """P05: every architecture engine.cuda_architectures names is one this toolkit builds (`nvcc
    --list-gpu-arch`), said before CMake is run (it fails late, in a compiler test, otherwise)."""
    archs = cuda.get("archs")
    if not archs:
        return []  # an nvcc that cannot list them (before CUDA 11): CMake judges, as before
    bad = archs_unbuildable(p.engine.cuda_architectures, archs)
    return [judge("engine.cuda_arch_supported", "the CUDA toolkit builds engine.cuda_architectures", not bad,
                  p.engine.cuda_architectures + (f" ({', '.join(bad)} not in nvcc --list-gpu-arch)" if bad else ""),
                  f"one of {', '.join(archs)} (nvcc --list-gpu-arch; an a/f suffix is the same number)",
                  f"CUDA {cuda.get('version')} cannot build for {', '.join(bad)}: set engine.cuda_architectures to "
                  f"the GPUs' architecture from that list (RTX 5090: 120a, H200: 90), or install a CUDA toolkit that "
                  f"lists it, then run the engine stage again", pitfall="P05")]


@reads(given=("engine_build",))
def check(f: dict, p: Profile) -> list[Check]:
    out = precheck(p)
    missing = not_measured(f, "engine_build", "engine.build", "engine built", "doctor builds nothing",
                           "a run of `p2pkit up`")
    if missing:
        return [*out, missing]
    b = f["engine_build"]
    if p.engine.recipe == "vllm":
        return out + _vllm(b.get("vllm_env", {}), p) + vllm_tree(b.get("vllm_tree"), p)
    out.append(_source(b, p))
    out += _cuda(b, p)
    for mod, r in b.get("pkg_config", {}).items():
        out.append(judge(f"engine.pkg_config.{mod}", f"pkg-config finds {mod}", r["ok"], r.get("version") or
                         r.get("error"), "found", f"PKG_CONFIG_PATH ({p.engine.pkg_config_path or 'unset'}) does not "
                         f"reach {mod}.pc: point engine.pkg_config_path at it", pitfall="P06"))
    if b.get("refused") or ("binary" not in b and "configure_rc" not in b):
        return out  # refused before configuring: the checks above say why; no build log is judged
    if "configure_rc" in b:
        out += _configure(b)
        if b["configure_rc"] != 0:
            return out
    return out + _result(b, p)


def _configure(b: dict) -> list[Check]:
    out = []
    err = b.get("first_error")
    fix = next(((pit, h) for needle, pit, h in CMAKE_FIXES if err and needle in err), ("", "read the build log: "
                                                                                       + str(b.get("log"))))
    out.append(judge("engine.configure", "cmake configure", b["configure_rc"] == 0, err or "ok", "ok",
                     f"{fix[1]} (log: {b.get('log')})", pitfall=fix[0]))
    if b["configure_rc"] == 0:
        out.append(judge("engine.build", "cmake --build", b["build_rc"] == 0, b.get("build_tail") or "ok", "ok",
                         f"read the build log: {b.get('log')}"))
    return out


def _result(b: dict, p: Profile) -> list[Check]:
    out = []
    crit = b.get("criteria", {})
    missing = [k for k, v in crit.items() if not v]
    if crit:
        out.append(judge("engine.build_log", "build log shows success", not missing, ", ".join(missing) or
                         "; ".join(f"{k}: {v}" for k, v in crit.items()), ", ".join(crit),
                         f"the build log {b['log']} lacks: {', '.join(missing)} (CMakeCache.txt: "
                         f"{b.get('cmake_cache') or 'none'}); rebuild with `p2pkit up --from engine --force`",
                         pitfall="P07"))
    binr = b.get("binary", {})
    out.append(judge("engine.binary", "engine binary exists and runs", binr.get("runs", False),
                     binr.get("version") or binr.get("error") or "missing", "runs (--version)",
                     "the build did not produce a working binary: see the build log"))
    libs = b.get("libraries", [])
    unresolved = ldd_problems(libs)
    out.append(figure("engine.libraries", "every linked library resolves", len(unresolved) if libs else None, "==",
                      0, "count", text=f"{{}} of {len(libs)} unresolved", context="; ".join(unresolved),
                      missing="no linked library listed", expected_context="(all resolved)", hint=""
                      "install the missing libraries or fix RUNPATH (readelf -d); a missing version (GLIBC_2.38) "
                     "means the binary was built against a newer library than this host has: build it here"))
    if p.engine.recipe == "llamacpp":
        for target, lst in b.get("nccl_links", {}).items():
            nccl = [x["path"] for x in lst if x["name"].startswith("libnccl")]
            ok = bool(nccl) and all(n and under(n, p.engine.nccl_root) for n in nccl)
            out.append(judge(f"engine.nccl.{target}", f"{target} links the profile's NCCL", ok,
                             ", ".join(n or "not found" for n in nccl) or "no libnccl", f"under {p.engine.nccl_root}",
                             "the system libnccl (2.18.3) hangs at init on SM120: rebuild with NCCL_ROOT and RUNPATH "
                             "set to the profile's NCCL", pitfall="P16"))
    return out


# the lists seed 004's patch adds 12.1 to; its tree calls the NVFP4 SM12x list FP4_SM120_ARCHS, main FP4_ARCHS
SM121_VARS = (("CUDA_SUPPORTED_ARCHS",), ("SCALED_MM_ARCHS",), ("CUTLASS_MOE_DATA_ARCHS",),
              ("FP4_SM120_ARCHS", "FP4_ARCHS"))


def vllm_tree(t: dict | None, p: Profile) -> list[Check]:
    """P21: the tree vLLM was built from is the pinned commit on the profile's branch; for GB10 (sm_121)
    it carries the seed's two-file patch (12.1 in the four arch lists of CMakeLists.txt, the software
    E2M1 conversion) and the profile builds for 12.1."""
    if t is None:
        return []
    if failed(t) or "error" in t:
        return [unknown("engine.vllm_source", "the vLLM source tree", t, p.engine.build_dir, pitfall="P21")]
    out = []
    # the branch checked out, then every branch holding HEAD (which names the checked-out one again), once each
    where = list(dict.fromkeys(x for x in (t.get("branch"), *t.get("branches_with_head", [])) if x))
    head = t.get("head") or ""
    out.append(judge("engine.vllm_source", "the vLLM tree is the pinned commit on the pinned branch",
                     bool(p.engine.commit) and head == p.engine.commit and (not p.engine.branch or
                                                                            p.engine.branch in where),
                     f"{head[:12] or 'no commit'} on {', '.join(where) or 'no branch'}",
                     f"{p.engine.commit[:12] or '(engine.commit empty)'} on {p.engine.branch or 'any branch'}",
                     f"check out the pinned commit of {p.engine.branch or 'the pinned branch'} in {p.engine.build_dir} "
                     "and build vLLM from it (main does not have this model)", pitfall="P21"))
    if "121" not in p.engine.cuda_architectures.replace(".", ""):
        return out
    lists = t.get("arch_lists", {})
    lacking = [v[0] for v in SM121_VARS if not any(names_arch(x, "12.1") for n in v for x in lists.get(n, []))]
    if not t.get("sm121_e2m1"):
        lacking.append("software E2M1 conversion (__CUDA_ARCH__ == 1210 in nvfp4_utils.cuh)")
    out.append(judge("engine.vllm_sm121", "the tree carries the sm_121 (GB10) patch", not lacking,
                     f"lacks: {'; '.join(lacking)}" if lacking else "12.1 in all four arch lists, E2M1 fallback",
                     "12.1 in " + ", ".join(v[0] for v in SM121_VARS) + " and the E2M1 fallback",
                     "apply the seed's two-file sm_121 patch (CMakeLists.txt arch lists, "
                     "csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh) and rebuild vLLM for arch 12.1",
                     pitfall="P21"))
    return out


def under(path: str, root: str) -> bool:
    """Whether path lies in the directory root, component by component: /opt/nccl-2.18.3/lib/libnccl.so.2
    is not under /opt/nccl (a string prefix says it is), and /opt/nccl/../nccl-2.18.3 is not either."""
    return bool(root) and PurePosixPath(posixpath.normpath(path)).is_relative_to(posixpath.normpath(root))


def _vllm(env: dict, p: Profile) -> list[Check]:
    """vLLM is not built by p2pkit yet (the PR branch plus the two-file sm_121 patch, P21): the stage
    proves the environment at engine.python holds it, at the pinned tree, with the pinned packages."""
    if failed(env) or not env:
        return [unknown("engine.vllm", "vLLM importable from engine.python", env or {"error": "not probed"},
                        "importable")]
    v = env.get("vllm", {})
    out = [judge("engine.vllm", "vLLM importable from engine.python", "error" not in v,
                 v.get("error") or f"vllm {v.get('version')} ({v.get('file')})", "importable",
                 f"install vLLM into the environment of {p.engine.python} (the recipe of seed 004: the PR #53896 "
                 "branch with the sm_121 patch, built for CUDA arch 121)", pitfall="P21")]
    if "error" in v:
        return out
    if p.engine.commit:
        version = str(v.get("version") or "")
        out.append(judge("engine.vllm_tree", "the installed vLLM is the pinned tree",
                         f"g{p.engine.commit[:7]}" in version, version, f"a version built from {p.engine.commit[:12]}",
                         "this model needs a specific vLLM branch, not main: install the tree engine.commit names",
                         pitfall="P21"))
    else:
        out.append(Check("engine.vllm_tree", "the installed vLLM is the pinned tree", FAIL,
                         "cannot be proven: engine.commit is empty", "a pinned commit",
                         "this model needs the PR branch's tree, not a release: set engine.commit to the HEAD of the "
                         f"tree you built (`git -C {p.engine.build_dir} rev-parse HEAD`)", "P21"))
    for name, want in sorted(p.engine.python_pins.items()):
        got = env.get("pins", {}).get(name)
        flashinfer = "flashinfer" in name
        out.append(judge(f"engine.pin.{name}", f"{name} is the pinned version", got == str(want),
                         got or "not installed", str(want), f"pip install {name}=={want} into {p.engine.python}"
                         + (" (flashinfer 0.6.17 crashes the NVFP4 MoE fallback kernels on GB10)" if flashinfer
                            else ""), pitfall="P25" if flashinfer else ""))
    return out


# ---------------------------------------------------------------- field pitfalls (shared/PITFALLS.md)


@reads("engine_archs")
def kernel_archs(f: dict, p: Profile) -> list[Check]:
    """P39: the engine's kernels carry SASS for the GPU's architecture."""
    e = f.get("engine_archs")
    if e is None:
        return []
    want = "sm_" + "".join(ch for ch in p.engine.cuda_architectures.split(";")[0] if ch.isdigit())
    id_, title = "field.kernel_archs", "engine kernels built for the GPU's architecture"
    if isinstance(e, dict) and e.get("missing"):
        return [Check(id_, title, SKIP, e["missing"], want, "", "P39")]
    if unreadable(e):
        return [could_not(id_, title, e, want, "P39")]
    return [judge(id_, title, pf.arch_covers(e["archs"], want), f"{e['library']}: {', '.join(e['archs']) or 'no SASS'}",
                  f"includes {want}", f"the build dropped {want} (CUDA 13's arch matching, vllm#36835): rebuild with "
                  f"the arch list naming {want[3:]} (TORCH_CUDA_ARCH_LIST / CMAKE_CUDA_ARCHITECTURES)",
                  pitfall="P39")]


def reproved(recorded: dict, now: dict | None, p: Profile) -> list[Check]:
    """What the engine artifact claims, against the files now (status and the gate; `verify engine` proves the
    build whole): the binary it built and hashed is still there and the same file (its identity, recorded with
    its sha256, unchanged: a moved, replaced or rewritten binary is caught without reading it), and every
    library it links still resolves (ldd). vLLM is not built: nothing to re-prove here."""
    if p.engine.recipe == "vllm":
        return []
    id_, title = "engine.built_files", "the built binary is there, the one hashed, its libraries resolved"
    want = "the binary the build hashed, unchanged; every library found"
    b = (recorded.get("engine_build") or {}).get("binary") or {}
    if failed(now) or now is None:
        return [unknown(id_, title, now, want)]
    nb = now["binary"]
    redo = "run `p2pkit up --from engine`: it proves the build again and rebuilds only when the proof fails"
    if not nb.get("identity"):
        return [Check(id_, title, FAIL, f"{nb['path']} is not there any more (moved or deleted since the build)",
                      want, redo)]
    if not b.get("identity") or not b.get("sha256"):
        return [Check(id_, title, FAIL, f"the artifact records no identity and sha256 for {nb['path']} (an earlier "
                      "p2pkit's, or not a build's)", want, redo)]
    moved = changed(b["identity"], nb["identity"])
    if moved:
        return [Check(id_, title, FAIL, f"{nb['path']} changed since the build hashed it ({'; '.join(moved)})", want,
                      redo)]
    bad = ldd_problems(nb.get("libraries") or [])
    if bad:
        return [Check(id_, title, FAIL, f"{nb['path']}: {'; '.join(bad)}", want,
                      "a library it linked is gone or changed: restore it, or rebuild (`p2pkit up --from engine "
                      "--force`)", "P16" if any("nccl" in x for x in bad) else "")]
    return [Check(id_, title, PASS, f"{nb['path']} unchanged since the build, {len(nb.get('libraries') or [])} "
                  "libraries resolved", want)]
