"""The CMake recipes' build (NInfer, llama.cpp): the engine role installs the dependencies, checks out the
pinned commit (or p2pkit fetches and verifies the recipe's archive), then configures and builds with CMake
and Ninja, its output appended to this run's log in the state directory; p2pkit checks the toolchain before
the role builds (the role runs once, or twice when it must install a build dependency first: see build) and
proves what was built.

Before configuring, the CUDA toolkit version and pkg-config's view of the libraries the recipe links are
checked (P05, P06); a refused precondition never reaches CMake. What differs between the recipes is the
recipe module's (stages/engine/ninfer.py, llamacpp.py): its CMake options and targets, its pkg-config
modules, its source (a checkout or an archive), its build log's criteria."""

from __future__ import annotations

import os
import posixpath
import time
from pathlib import Path, PurePosixPath

from p2pkit.core.ansible import PlaybookFailed, run_playbook
from p2pkit.core.config import Profile
from p2pkit.core.errors import P2pkitError
from p2pkit.core.role_defaults import role_default
from p2pkit.host import system
from p2pkit.host.backup import sha256
from p2pkit.parse import build as pb
from p2pkit.parse.build import archs_unbuildable, ldd_problems, version_tuple
from p2pkit.rules import engine_cmd
from p2pkit.rules.engine_cmd import binary
from p2pkit.rules.findings import FAIL, PASS, WARN, Check, changed, failed, figure, judge, unknown
from p2pkit.stages.engine import common

CONFIGURE_MARK = "\n$ cmake -S "  # how the engine role records the configure command in the log
CURRENT_MARK = "\n$ cmake --build "  # ... and, when it found the build current, Ninja's dry run and its verdict
# the role's tasks whose failure is the build's own (configure_rc, build_rc); any other failure is the role's
CONFIGURE_TASK, BUILD_TASK = "Configure the engine (cmake -S)", "Build the engine's targets (cmake --build)"


def build_subdir() -> str:
    """The build directory's name inside the checkout: the engine role's (defaults/main.yml), read once."""
    return role_default(common.ROLE, "p2pkit_engine_build_subdir")


def role_vars(ctx, log: Path) -> dict:
    """What the engine role is given for the build run: base_vars, then the recipe's CMake options and
    targets, Ninja's jobs, pkg-config's path and the log."""
    e, r = ctx.profile.engine, common.recipe(ctx.profile)
    return {**common.base_vars(ctx), "p2pkit_engine_build": True,
            "p2pkit_engine_cmake_options": r.cmake_options(ctx), "p2pkit_engine_targets": r.targets(ctx.profile),
            "p2pkit_engine_jobs": 0,  # Ninja's own default, as p2pkit always built
            "p2pkit_engine_pkg_config_path": e.pkg_config_path, "p2pkit_engine_log": str(log)}


def _cmake(ctx, res: dict, log: Path) -> dict | None:
    """The role's configure and build, their rc and the build's last lines into res (a failure of another
    task is the role's, raised as it is); the run's summary (where it stopped, when configure or the build
    failed)."""
    try:
        ran = run_playbook(ctx, "engine", role_vars(ctx, log))
        res["configure_rc"] = res["build_rc"] = 0
        res["built"] = {"changed": ran.get("changed"), "tasks": {k: v for k, v in ran.get("tasks", {}).items()
                                                                  if k.endswith((CONFIGURE_TASK, BUILD_TASK))}}
    except PlaybookFailed as err:
        rc = err.result.get("rc") or 1
        ran = {"playbook": "engine.yml", "log": str(ctx.store.dir / "logs/engine.log"), "failed_task": err.task}
        if err.task.endswith(CONFIGURE_TASK):
            res["configure_rc"] = rc
        elif err.task.endswith(BUILD_TASK):
            res["configure_rc"], res["build_rc"] = 0, rc
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            res["build_tail"] = " | ".join(tail)
        else:
            raise
    if res.get("build_rc") == 0:
        res["build_tail"] = None
    return ran


def pkg_config(ctx, env: dict) -> dict:
    out = {}
    for mod in common.recipe(ctx.profile).PKG_MODULES:
        r = ctx.host.runner.run(["pkg-config", "--modversion", "--print-errors", mod], check=False, env=env)
        out[mod] = {"ok": r.returncode == 0, "version": r.stdout.strip() or None,
                    "error": (r.stderr.strip().splitlines() or ["not found"])[0] if r.returncode else None}
    return out


def env(ctx) -> dict:
    e = ctx.profile.engine
    paths = [str(ctx.host.path(x)) for x in e.pkg_config_path.split(":") if x]
    return {"PKG_CONFIG_PATH": ":".join(paths)} if paths else {}


def build(ctx) -> dict:
    """The toolchain checked, then the engine role's one run: dependencies, checkout, configure and build. Twice
    only when the role must act first: a build dependency to install (the toolchain checks need pkg-config), or
    the build directory's parent to make before an archive is fetched and unpacked into it; then its first run
    (dependencies, checkout) comes before the toolchain checks, as when a check refuses the build. What the stage
    does (not read-only); the summary of the role's run that ensured the dependencies and the checkout under
    "dependencies" (act takes it out of the record)."""
    p, host = ctx.profile, ctx.host
    e, r = p.engine, common.recipe(p)
    aside = changed_binary_aside(ctx)
    cpu = "" if e.cuda else " with CUDA OFF (engine.cuda = false: a CPU-only build, not for serving on the GPUs)"
    log = common.new_log(ctx, f"{e.recipe} at {e.commit or e.source_sha256}{cpu}")
    if cpu:
        ctx.out.step("engine", f"building {e.recipe}{cpu}")
    src = host.path(e.build_dir)
    archived = not r.checks_out(p)
    first = bool(common.missing_dependencies(ctx)) or (archived and not src.parent.is_dir())
    deps = common.dependencies(ctx) if first else None  # the role's first run: the dependencies and the checkout
    res: dict = {"log": str(log), **({"moved_aside": aside} if aside else {})}
    if archived:  # the role gives CMake real paths: a build dir reached through a link keeps its cache
        res["source"] = r.source(ctx, src.resolve(), log)
    res.update(toolchain(ctx))
    res["cuda_enabled"] = e.cuda
    refused = "error" in res.get("source", {}) or not toolchain_ok(res, p)
    if refused and deps is None:
        deps = common.dependencies(ctx)  # the checkout all the same: the source record says where it stands
    elif not refused:
        res["cmake_options"] = ["-G", "Ninja", *r.cmake_options(ctx)]
        ran = _cmake(ctx, res, log)
        deps = deps or ran
    if not archived:
        res["source"] = common.head_of(ctx, src)
        if not (res["source"]["head"] or "").startswith(e.commit or "-"):
            res["source"]["error"] = f"{e.build_dir} is not checked out at {e.commit} (the engine role checks it out)"
    res["dependencies"] = deps
    if refused or "error" in res["source"]:
        return {**res, "refused": True}  # refused before configuring: the checks say why, CMake never ran
    res["first_error"] = pb.first_cmake_error(log.read_text(errors="replace"))
    return res


def changed_binary_aside(ctx) -> str | None:
    """The binary the last build hashed (the artifact before this run), no longer those bytes (an edit with its
    mtime kept: Ninja rebuilds nothing): moved aside under a name of its own, kept and named, so the build links
    it again whatever the mtimes say (issue 48 item 3). None where it is unchanged or was never recorded."""
    was = ((((ctx.options.get("previous_artifact") or {}).get("facts") or {}).get("engine_build") or {})
           .get("binary") or {})
    exe = ctx.host.path(binary(ctx.profile))
    if not isinstance(was, dict) or not was.get("sha256") or not exe.is_file() or exe.is_symlink() \
            or system.file_identity(exe) == was.get("identity"):
        return None
    if sha256(exe) == was["sha256"]:
        return None
    aside = exe.with_name(f"{exe.name}.changed-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    os.rename(exe, aside)
    said = (f"{exe} no longer matches the sha256 of the last build ({was['sha256'][:12]}...): moved aside to "
            f"{aside} (kept) and built again")
    ctx.out.warn(f"[engine] {said}")
    return said


def toolchain_ok(res: dict, p) -> bool:
    cuda = res["cuda"]
    cuda_ok = cuda.get("off") or (cuda["version"] is not None
                                  and pb.version_tuple(cuda["version"]) >= pb.version_tuple(p.engine.cuda_min)
                                  and not pb.archs_unbuildable(p.engine.cuda_architectures, cuda.get("archs")))
    nccl = res.get("nccl")
    return bool(cuda_ok) and all(m["ok"] for m in res["pkg_config"].values()) and \
        (nccl is None or (nccl["header"] and nccl["library"] is not None))


def gpu_archs(ctx) -> list[str] | None:
    """The architectures this CUDA toolkit builds (`nvcc --list-gpu-arch`), or None when nvcc cannot
    list them (before CUDA 11): then CMake is the judge, as before."""
    r = ctx.host.runner.run(["nvcc", "--list-gpu-arch"], check=False)
    return (pb.nvcc_arch_list(r.stdout) or None) if r.returncode == 0 else None


def toolchain(ctx) -> dict:
    e = ctx.profile.engine
    if not e.cuda:
        return {"cuda": {"off": True, "version": None}, "pkg_config": pkg_config(ctx, env(ctx))}
    try:
        nv = ctx.host.runner.run(["nvcc", "--version"], check=False)
        cuda = {"version": pb.nvcc_release(nv.stdout), "raw": nv.stdout.strip().splitlines()[-1:]}
        cuda["archs"] = gpu_archs(ctx)
    except P2pkitError as err:
        cuda = {"version": None, "error": err.message}
    return {"cuda": cuda, "pkg_config": pkg_config(ctx, env(ctx)), **common.recipe(ctx.profile).toolchain_more(ctx)}


def installed(ctx) -> dict:
    """Read-only: what is built now (source head, the kept log, the binary, its libraries)."""
    p, host = ctx.profile, ctx.host
    r = common.recipe(p)
    src = host.path(p.engine.build_dir)
    log = common.last_log(ctx, CONFIGURE_MARK, CURRENT_MARK)
    source = r.unpacked(src) if not r.checks_out(p) else common.head_of(ctx, src)
    res: dict = {"log": str(log) if log else None, "source": source, "cuda_enabled": p.engine.cuda}
    if log:
        out = src / build_subdir()
        cache = out / "CMakeCache.txt"
        res["cmake_cache"] = str(cache) if cache.is_file() else None
        cached = pb.cmake_cache(cache.read_text(errors="replace")) if cache.is_file() else None
        res["up_to_date"], res["criteria"] = r.criteria(ctx, out, log.read_text(errors="replace"), cached)
    exe = host.path(binary(p))
    res["binary"] = _binary(ctx, exe)
    if exe.is_file():
        res["libraries"] = pb.ldd(host.runner.run(["ldd", str(exe)], check=False).stdout)
        res.update(r.installed_more(ctx, src / build_subdir(), res["libraries"]))
    return res


def measure(ctx, built: dict | None) -> dict:
    """The build's own record when the stage just built it, and always what is there now."""
    if built is not None and built.get("refused"):
        return {"engine_build": built}  # nothing was built: what an earlier build left is not this run's result
    now = installed(ctx)
    if built is None:
        now.update(toolchain(ctx))
        return {"engine_build": now}
    return {"engine_build": {**built, **{k: v for k, v in now.items() if k != "source"}}}


def up_to_date(ctx, build_dir: Path, targets: list[str], current=pb.ninja_no_work, more: tuple[str, ...] = ()) -> bool:
    """Ninja's dry run (-n: nothing runs) says the targets are current with their sources and flags."""
    if not (build_dir / "build.ninja").is_file():
        return False
    r = ctx.host.runner.run(["cmake", "--build", str(build_dir), "--target", *targets, "--", "-n", *more],
                            check=False, env=env(ctx), timeout=600)
    return r.returncode == 0 and current(r.stdout + r.stderr)


def _binary(ctx, exe: Path) -> dict:
    if not exe.is_file():
        return {"path": str(exe), "runs": False, "error": f"{exe} was not built"}
    ident = system.file_identity(exe)  # before the hash: a file changed while it is read is not vouched for
    h = sha256(exe)
    r = ctx.host.runner.run([str(exe), "--version"], check=False, timeout=60)
    return {"path": str(exe), "sha256": h, "identity": ident, "runs": r.returncode == 0,
            "version": (r.stdout.strip() or r.stderr.strip())[:200]}


# ------------------------------------------------------------------------------------------------ checks

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


def check(b: dict, p: Profile) -> list[Check]:
    """The CMake recipes' record judged: the source, the toolchain, pkg-config, configure and the build, the
    build log's criteria, the binary and its libraries, then the recipe's own (its NCCL links)."""
    out = [_source(b, p), *_cuda(b, p)]
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
    return out + _result(b, p) + common.recipe(p).result_more(b, p)


def _source(b: dict, p: Profile) -> Check:
    src = b["source"]
    if not common.recipe(p).checks_out(p):
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
    name = engine_cmd.engine(p).TITLE
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
    return out


def reproved(recorded: dict, now: dict | None, p: Profile) -> list[Check]:
    """What the engine artifact claims, against the files now (status and the gate; `verify engine` proves the
    build whole): the binary it built and hashed is still there and the same file (its identity, recorded with
    its sha256, unchanged: a moved, replaced or rewritten binary is caught without reading it), and every
    library it links still resolves (ldd)."""
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


def under(path: str, root: str) -> bool:
    """Whether path lies in the directory root, component by component: /opt/nccl-2.18.3/lib/libnccl.so.2
    is not under /opt/nccl (a string prefix says it is), and /opt/nccl/../nccl-2.18.3 is not either."""
    return bool(root) and PurePosixPath(posixpath.normpath(path)).is_relative_to(posixpath.normpath(root))


