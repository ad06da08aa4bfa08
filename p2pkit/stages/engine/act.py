"""engine: build the inference engine from its pinned source. The engine role (Ansible) installs the
dependencies, checks out the pinned commit, and configures and builds with CMake and Ninja, its output
appended to this run's log in the state directory; p2pkit fetches and verifies a source archive,
checks the toolchain before the role builds (the role runs once, or twice when it must install a build
dependency first: see build), and proves what was built.

Before configuring, the CUDA toolkit version and pkg-config's view of the FFmpeg and curl
libraries are checked (P05, P06); a refused precondition never reaches CMake."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path

from p2pkit.core import safefs
from p2pkit.core.ansible import PlaybookFailed, run_playbook
from p2pkit.core.errors import P2pkitError
from p2pkit.core.role_defaults import role_default
from p2pkit.host import system
from p2pkit.parse import build as pb
from p2pkit.rules.engine_cmd import binary
from p2pkit.stages.engine import llamacpp
from p2pkit.stages.engine.checks import PKG_MODULES

CONFIGURE_MARK = "\n$ cmake -S "  # how the engine role records the configure command in the log
CURRENT_MARK = "\n$ cmake --build "  # ... and, when it found the build current, Ninja's dry run and its verdict


ROLE = "p2pkit_engine"


def build_subdir() -> str:
    """The build directory's name inside the checkout: the engine role's (defaults/main.yml), read once."""
    return role_default(ROLE, "p2pkit_engine_build_subdir")


def role_vars(ctx, log: Path | None = None) -> dict:
    """What the engine role is given: the recipe and the build directory; the repository and the pinned
    commit to check out (none for an archive p2pkit verified and unpacked); and, with a log (the build
    run), the recipe's CMake options, targets and jobs, and pkg-config's path."""
    e = ctx.profile.engine
    git = not archived(ctx.profile)
    out = {"p2pkit_engine_recipe": e.recipe, "p2pkit_engine_build_dir": e.build_dir,
           "p2pkit_engine_repo": e.repo if git else "", "p2pkit_engine_commit": e.commit if git else "",
           "p2pkit_engine_build": log is not None}
    if log is not None:
        opts = llamacpp.cmake_options(ctx) if e.recipe == "llamacpp" else \
            ["-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_CUDA_ARCHITECTURES={e.cuda_architectures}"]
        targets = list(e.targets) if e.recipe == "llamacpp" else []
        out.update({"p2pkit_engine_cmake_options": opts, "p2pkit_engine_targets": targets,
                    "p2pkit_engine_jobs": 0,  # Ninja's own default, as p2pkit always built
                    "p2pkit_engine_pkg_config_path": e.pkg_config_path, "p2pkit_engine_log": str(log)})
    return out


# the role's tasks whose failure is the build's own (configure_rc, build_rc); any other failure is the role's
CONFIGURE_TASK, BUILD_TASK = "Configure the engine (cmake -S)", "Build the engine's targets (cmake --build)"


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


def head_of(ctx, src: Path) -> dict:
    """Read-only: the git checkout in src and its HEAD (None when there is none)."""
    head = ctx.host.runner.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=False).stdout.strip() \
        if (src / ".git").is_dir() else None
    return {"path": str(src), "head": head or None}


def pkg_config(ctx, env: dict) -> dict:
    out = {}
    for mod in PKG_MODULES.get(ctx.profile.engine.recipe, ()):
        r = ctx.host.runner.run(["pkg-config", "--modversion", "--print-errors", mod], check=False, env=env)
        out[mod] = {"ok": r.returncode == 0, "version": r.stdout.strip() or None,
                    "error": (r.stderr.strip().splitlines() or ["not found"])[0] if r.returncode else None}
    return out


def _env(ctx) -> dict:
    e = ctx.profile.engine
    paths = [str(ctx.host.path(x)) for x in e.pkg_config_path.split(":") if x]
    return {"PKG_CONFIG_PATH": ":".join(paths)} if paths else {}


KEEP_LOGS = 20  # build logs kept in <state>/logs, one per run, the oldest deleted first


def build_logs(ctx) -> list[Path]:
    """This engine's build logs, oldest first (engine-build-NNNN-<UTC time>.log: one per run)."""
    d = ctx.store.dir / "logs"
    found = [x for x in d.glob("engine-build-*.log") if re.match(r"engine-build-\d+-", x.name)] if d.is_dir() else []
    return sorted(found, key=lambda x: int(x.name.split("-")[2]))


def _new_log(ctx) -> Path:
    """A new log for this run; earlier runs' logs are kept (the last KEEP_LOGS)."""
    logs = safefs.makedirs(ctx.store.dir / "logs")  # no link on the way (issue 40)
    old = build_logs(ctx)
    n = int(old[-1].name.split("-")[2]) + 1 if old else 1
    for x in old[:max(0, len(old) - KEEP_LOGS + 1)]:
        x.unlink()
    return logs / f"engine-build-{n:04d}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"


def _last_build_log(ctx) -> Path | None:
    """The log of the last run that reached CMake: its configure and build, or Ninja's dry run that found
    the build current (a run refused before configuring proves nothing about what is built)."""
    for x in reversed(build_logs(ctx)):
        text = x.read_text(errors="replace")
        if CONFIGURE_MARK in text or CURRENT_MARK in text:
            return x
    legacy = ctx.store.dir / "logs/engine-build.log"  # before logs were kept per run
    return legacy if legacy.is_file() else None


def build(ctx) -> dict:
    """The toolchain checked, then the engine role's one run: dependencies, checkout, configure and build. Twice
    only when the role must act first: a build dependency to install (the toolchain checks need pkg-config), or
    the build directory's parent to make before an archive is fetched and unpacked into it; then its first run
    (dependencies, checkout) comes before the toolchain checks, as when a check refuses the build. What the stage
    does (not read-only); the summary of the role's run that ensured the dependencies and the checkout under
    "dependencies" (act takes it out of the record)."""
    p, host = ctx.profile, ctx.host
    e = p.engine
    log = _new_log(ctx)
    cpu = "" if e.cuda else " with CUDA OFF (engine.cuda = false: a CPU-only build, not for serving on the GPUs)"
    safefs.write_text(log, f"# p2pkit engine build: {e.recipe} at {e.commit or e.source_sha256}{cpu}"
                           f"{' (SIMULATED host)' if host.simulated else ''}\n", new=True)  # this run's own
    if cpu:
        ctx.out.step("engine", f"building {e.recipe}{cpu}")
    src = host.path(e.build_dir)
    first = bool(missing_dependencies(ctx)) or (archived(p) and not src.parent.is_dir())
    deps = dependencies(ctx) if first else None  # the role's first run: the dependencies and the checkout
    res: dict = {"log": str(log)}
    if archived(p):  # the role gives CMake real paths: a build dir reached through a link keeps its cache
        res["source"] = llamacpp.source(ctx, src.resolve(), log)
    res.update(toolchain(ctx))
    res["cuda_enabled"] = e.cuda
    refused = "error" in res.get("source", {}) or not toolchain_ok(res, p)
    if refused and deps is None:
        deps = dependencies(ctx)  # the checkout all the same: the source record says where it stands
    elif not refused:
        res["cmake_options"] = ["-G", "Ninja", *role_vars(ctx, log)["p2pkit_engine_cmake_options"]]
        ran = _cmake(ctx, res, log)
        deps = deps or ran
    if not archived(p):
        res["source"] = head_of(ctx, src)
        if not (res["source"]["head"] or "").startswith(e.commit or "-"):
            res["source"]["error"] = f"{e.build_dir} is not checked out at {e.commit} (the engine role checks it out)"
    res["dependencies"] = deps
    if refused or "error" in res["source"]:
        return {**res, "refused": True}  # refused before configuring: the checks say why, CMake never ran
    res["first_error"] = pb.first_cmake_error(log.read_text(errors="replace"))
    return res


def archived(p) -> bool:
    """The source is an archive pinned by sha256 (llama.cpp's recipe), not a git checkout."""
    return p.engine.recipe == "llamacpp" and bool(p.engine.source_url)


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
        return {"cuda": {"off": True, "version": None}, "pkg_config": pkg_config(ctx, _env(ctx))}
    try:
        nv = ctx.host.runner.run(["nvcc", "--version"], check=False)
        cuda = {"version": pb.nvcc_release(nv.stdout), "raw": nv.stdout.strip().splitlines()[-1:]}
        cuda["archs"] = gpu_archs(ctx)
    except P2pkitError as err:
        cuda = {"version": None, "error": err.message}
    out = {"cuda": cuda, "pkg_config": pkg_config(ctx, _env(ctx))}
    if e.recipe == "llamacpp" and e.nccl_root:
        out["nccl"] = llamacpp.nccl_layout(ctx.host.path(e.nccl_root))
    return out


def installed(ctx) -> dict:
    """Read-only: what is built now (source head, the kept log, the binary, its libraries)."""
    p, host = ctx.profile, ctx.host
    src = host.path(p.engine.build_dir)
    log = _last_build_log(ctx)
    source = llamacpp.unpacked(src) if archived(p) else head_of(ctx, src)
    res: dict = {"log": str(log) if log else None, "source": source, "cuda_enabled": p.engine.cuda}
    if log and p.engine.recipe in ("ninfer", "llamacpp"):
        out = src / build_subdir()
        cache = out / "CMakeCache.txt"
        res["cmake_cache"] = str(cache) if cache.is_file() else None
        cached = pb.cmake_cache(cache.read_text(errors="replace")) if cache.is_file() else None
        text = log.read_text(errors="replace")
        if p.engine.recipe == "ninfer":
            res["up_to_date"] = _up_to_date(ctx, out, ["ninfer-serve"])
            res["criteria"] = pb.ninfer_criteria(text, cached, res["up_to_date"])
        else:  # llama.cpp: a no-op rebuild still runs its UI-assets step, so Ninja never says "no work to do"
            targets = tuple(p.engine.targets) or pb.LLAMACPP_TARGETS
            res["up_to_date"] = _up_to_date(ctx, out, list(targets), pb.ninja_current, ("-d", "explain"))
            res["criteria"] = pb.llamacpp_criteria(text, cached, res["up_to_date"], p.engine.cuda, targets)
    exe = host.path(binary(p))
    res["binary"] = _binary(ctx, exe)
    if exe.is_file():
        res["libraries"] = pb.ldd(host.runner.run(["ldd", str(exe)], check=False).stdout)
        if p.engine.recipe == "llamacpp" and p.engine.cuda:
            ggml = next(iter(sorted((src / build_subdir()).rglob("libggml-cuda.so*"))), None)
            res["nccl_links"] = {"llama-server": res["libraries"]}
            if ggml:
                res["nccl_links"]["libggml-cuda.so"] = pb.ldd(host.runner.run(["ldd", str(ggml)],
                                                                              check=False).stdout)
    return res


VLLM_PROBE = """
import importlib.metadata as md, json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import vllm
    out["vllm"] = {"version": getattr(vllm, "__version__", None), "file": vllm.__file__}
except Exception as e:
    out["vllm"] = {"error": f"{type(e).__name__}: {e}"}
pins = {}
for name in sys.argv[1:]:
    try:
        pins[name] = md.version(name)
    except md.PackageNotFoundError:
        pins[name] = None
out["pins"] = pins
print(json.dumps(out))
"""


def engine_python(ctx) -> str:
    """engine.python on the host (through the host root; a bare name is looked up on PATH)."""
    py = ctx.profile.engine.python
    return str(ctx.host.path(py)) if py.startswith("/") else py


def vllm_env(ctx) -> dict:
    """Read-only: what engine.python's environment holds (vLLM, the pinned packages)."""
    pins = sorted(ctx.profile.engine.python_pins)
    return ctx.host.runner.json_result([engine_python(ctx), "-c", VLLM_PROBE, *pins], ctx.profile.engine.python, 600)


SM121_E2M1 = "csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh"  # the patch's second file (seed 004)


def vllm_tree(ctx) -> dict:
    """Read-only: the source tree vLLM was built from (engine.build_dir): its commit, its branch, the
    arch lists of its CMakeLists.txt and the software E2M1 conversion the sm_121 patch adds (P21)."""
    d = ctx.profile.engine.build_dir
    src = ctx.host.path(d)
    if not (src / ".git").exists():
        return {"path": d, "error": f"{d} is not a git checkout (engine.build_dir names the tree vLLM was built "
                                    "from)"}

    def git(*args: str) -> str:
        return ctx.host.runner.run(["git", "-C", str(src), *args], check=False).stdout.strip()
    cm, cuh = src / "CMakeLists.txt", src / SM121_E2M1
    return {"path": d, "head": git("rev-parse", "HEAD") or None, "branch": git("branch", "--show-current") or None,
            "branches_with_head": git("branch", "--format=%(refname:short)", "--contains", "HEAD").split(),
            "arch_lists": pb.cmake_arch_lists(cm.read_text(errors="replace")) if cm.is_file() else {},
            "sm121_e2m1": cuh.is_file() and "__CUDA_ARCH__ == 1210" in cuh.read_text(errors="replace")}


def _vllm_facts(ctx) -> dict:
    return {"vllm_env": vllm_env(ctx), "vllm_tree": vllm_tree(ctx)}


def act(ctx) -> dict:
    e = ctx.profile.engine
    if e.recipe == "vllm":  # nothing to build yet: the recipe of seed 004 is not automated (P21)
        ctx.options["engine_build"] = _vllm_facts(ctx)
        return {"built": False, "note": f"vLLM is used as installed at {e.python}; p2pkit proves it"}
    aside = changed_binary_aside(ctx)
    ctx.options["engine_build"] = build(ctx)
    return {"dependencies": ctx.options["engine_build"].pop("dependencies"), "log": ctx.options["engine_build"]["log"],
            **({"moved_aside": aside} if aside else {})}


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
    if hashlib.sha256(exe.read_bytes()).hexdigest() == was["sha256"]:
        return None
    aside = exe.with_name(f"{exe.name}.changed-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    os.rename(exe, aside)
    said = (f"{exe} no longer matches the sha256 of the last build ({was['sha256'][:12]}...): moved aside to "
            f"{aside} (kept) and built again")
    ctx.out.warn(f"[engine] {said}")
    return said


COMMON_ROLE = "p2pkit_common"


def dpkg_installed_pattern() -> str:
    """How dpkg's database says a package is installed, as the engine role (and the driver and p2p-module roles)
    read it: the common role's p2pkit_dpkg_installed (defaults/main.yml), each match (package, selection)."""
    return role_default(COMMON_ROLE, "p2pkit_dpkg_installed")


def missing_dependencies(ctx) -> list[str]:
    """Read-only: the recipe's build dependencies (the engine role's defaults) that the engine role would install,
    decided as the role decides: dpkg's database (/var/lib/dpkg/status under the host root) says the package is
    installed, or else each of the package's tools (p2pkit_engine_tools) is an executable on the host's PATH."""
    pkgs = role_default(ROLE, "p2pkit_engine_packages").get(ctx.profile.engine.recipe) or []
    tools = role_default(ROLE, "p2pkit_engine_tools")
    try:
        text = ctx.host.path("/var/lib/dpkg/status").read_text(errors="replace")
        installed = {name for name, _selection in re.findall(dpkg_installed_pattern(), text, re.M)}
    except OSError:
        installed = set()
    path = ":".join(d for d in ctx.host.runner.path_env().split(":") if d.startswith("/"))
    return [pkg for pkg in pkgs if pkg not in installed
            and not (tools.get(pkg) and all(shutil.which(t, path=path) for t in tools[pkg]))]


def dependencies(ctx) -> dict:
    """The engine role's first run: the build directory's parent (a mode only when it makes it), the
    build dependencies dpkg does not have and whose tools are not on PATH (through apt-get), and the
    checkout at the pinned commit (a tree of empty directories where it belongs is removed, one holding
    a file refused). The role decides each from the host; p2pkit hands it the profile's values and
    keeps Ansible's own count. The build follows (build): in the same run when nothing is to be installed first,
    else in a second run after the toolchain checks."""
    return run_playbook(ctx, "engine", role_vars(ctx))


def measure(ctx, acted: dict | None = None) -> dict:
    """The build's own record when the stage just built it, and always what is there now."""
    built = ctx.options.pop("engine_build", None)
    if ctx.profile.engine.recipe == "vllm":
        return {"engine_build": built or _vllm_facts(ctx)}
    if built is not None and built.get("refused"):
        return {"engine_build": built}  # nothing was built: what an earlier build left is not this run's result
    now = installed(ctx)
    if built is None:
        now.update(toolchain(ctx))
        return {"engine_build": now}
    return {"engine_build": {**built, **{k: v for k, v in now.items() if k != "source"}}}


def _up_to_date(ctx, build_dir: Path, targets: list[str], current=pb.ninja_no_work, more: tuple[str, ...] = ()) -> bool:
    """Ninja's dry run (-n: nothing runs) says the targets are current with their sources and flags."""
    if not (build_dir / "build.ninja").is_file():
        return False
    r = ctx.host.runner.run(["cmake", "--build", str(build_dir), "--target", *targets, "--", "-n", *more],
                            check=False, env=_env(ctx), timeout=600)
    return r.returncode == 0 and current(r.stdout + r.stderr)


def _binary(ctx, exe: Path) -> dict:
    if not exe.is_file():
        return {"path": str(exe), "runs": False, "error": f"{exe} was not built"}
    ident = system.file_identity(exe)  # before the hash: a file changed while it is read is not vouched for
    h = hashlib.sha256(exe.read_bytes()).hexdigest()
    r = ctx.host.runner.run([str(exe), "--version"], check=False, timeout=60)
    return {"path": str(exe), "sha256": h, "identity": ident, "runs": r.returncode == 0,
            "version": (r.stdout.strip() or r.stderr.strip())[:200]}
