"""engine: build the inference engine from its pinned source. Dependencies through Ansible; the
checkout and the CMake build from Python, with the whole log kept in the state directory.

Before configuring, the CUDA toolkit version and pkg-config's view of the FFmpeg and curl
libraries are checked (P05, P06); a refused precondition never reaches CMake."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import time
from contextlib import nullcontext
from pathlib import Path

from p2pkit.core import safefs
from p2pkit.core.ansible import run_playbook
from p2pkit.core.errors import P2pkitError
from p2pkit.core.output import follow_cmd
from p2pkit.host import system
from p2pkit.parse import build as pb
from p2pkit.rules.engine_cmd import binary
from p2pkit.stages.engine import llamacpp
from p2pkit.stages.engine.checks import PKG_MODULES

CONFIGURE_MARK = "\n$ cmake -S "  # how _run records the configure command in the log


def _run(ctx, argv, log, cwd=None, env=None):
    """A build step, its output streamed into the run's build log as it comes (`p2pkit logs engine
    --follow`); a long one (configure, build) shows its elapsed time."""
    long = argv[0] == "cmake"
    with ctx.out.working(f"[engine] {' '.join(Path(a).name if i == 0 else a for i, a in enumerate(argv[:3]))}",
                         log=str(log), follow=follow_cmd("engine")) if long else nullcontext():
        r = ctx.host.runner.run(argv, check=False, cwd=cwd, env=env, timeout=7200, output_log=log)
    with safefs.open_file(log, "a") as fh:
        fh.write("\n")
    return r


def holds_files(d: Path) -> bool:
    """Whether a directory tree holds anything but directories (a file, a link, a socket: what p2pkit would lose
    by removing it). A link to a directory counts as a file: it is never followed."""
    return any(not entry.is_dir(follow_symlinks=False) or holds_files(Path(entry.path)) for entry in os.scandir(d))


def remove_empty_tree(d: Path) -> None:
    """Remove a tree of nothing but directories, bottom-up, never following a link and never onto another
    filesystem: each directory opened by its parent's fd (O_NOFOLLOW), each entry lstat'ed there; anything else
    met on the way (a link or file that appeared since, a mount) stops it with OSError, and rmdir itself
    refuses a directory that is not empty."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

    def clear(fd: int, dev: int) -> None:
        for name in os.listdir(fd):
            st = os.lstat(name, dir_fd=fd)
            if not stat.S_ISDIR(st.st_mode) or st.st_dev != dev:
                raise OSError(errno.ENOTEMPTY, f"{name} is not a directory of this filesystem")
            sub = os.open(name, flags, dir_fd=fd)
            try:
                clear(sub, dev)
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=fd)

    top = os.open(d, flags)
    try:
        clear(top, os.fstat(top).st_dev)
    finally:
        os.close(top)
    os.rmdir(d)


def checkout(ctx, src: Path, log: Path) -> dict:
    e = ctx.profile.engine
    if not (src / ".git" / "HEAD").is_file():  # an emptied .git is no checkout
        if src.is_dir() and not src.is_symlink() and not os.path.ismount(src) and not holds_files(src):
            try:
                remove_empty_tree(src)  # what is left of a checkout whose files were removed: nothing to lose
            except OSError as e:
                return {"path": str(src), "error": f"{src} holds no checkout and could not be cleared ({e}): move "
                        "it away (or point engine.build_dir elsewhere) and run `p2pkit up --from engine`"}
        elif src.exists() or src.is_symlink():
            return {"path": str(src), "error": f"{src} exists and is not a git checkout: p2pkit will not touch it; "
                    "move it away (or point engine.build_dir elsewhere) and run `p2pkit up --from engine`"}
        r = _run(ctx, ["git", "clone", "--quiet", "--", e.repo, str(src)], log)
        if r.returncode:
            return {"path": str(src), "error": f"git clone failed: {r.stderr.strip()[-300:]}"}
    _run(ctx, ["git", "-C", str(src), "fetch", "--quiet", "origin"], log)
    r = _run(ctx, ["git", "-C", str(src), "checkout", "--quiet", "--detach", e.commit], log)
    head = ctx.host.runner.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=False).stdout.strip()
    out = {"path": str(src), "head": head or None}
    if r.returncode:
        out["error"] = f"git checkout {e.commit} failed: {r.stderr.strip()[-300:]}"
    return out


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
    """The log of the last run that reached CMake (a run refused before configuring proves nothing
    about what is built)."""
    for x in reversed(build_logs(ctx)):
        if CONFIGURE_MARK in x.read_text(errors="replace"):
            return x
    legacy = ctx.store.dir / "logs/engine-build.log"  # before logs were kept per run
    return legacy if legacy.is_file() else None


def build(ctx) -> dict:
    """Check out, check the toolchain, configure and build. What the stage does (not read-only)."""
    p, host = ctx.profile, ctx.host
    e = p.engine
    log = _new_log(ctx)
    cpu = "" if e.cuda else " with CUDA OFF (engine.cuda = false: a CPU-only build, not for serving on the GPUs)"
    safefs.write_text(log, f"# p2pkit engine build: {e.recipe} at {e.commit or e.source_sha256}{cpu}"
                           f"{' (SIMULATED host)' if host.simulated else ''}\n", new=True)  # this run's own
    if cpu:
        ctx.out.step("engine", f"building {e.recipe}{cpu}")
    src = host.path(e.build_dir)
    if archived(p):  # CMake gets real paths: a build dir reached through a link keeps its cache
        src = src.resolve()
        res: dict = {"log": str(log), "source": llamacpp.source(ctx, src, log), **toolchain(ctx)}
    else:
        res = {"log": str(log), "source": checkout(ctx, src, log), **toolchain(ctx)}
    res["cuda_enabled"] = e.cuda
    if "error" in res["source"] or not toolchain_ok(res, p):
        return {**res, "refused": True}  # refused before configuring: the checks say why, CMake never ran
    if e.recipe == "llamacpp":
        opts, build_argv = llamacpp.cmake_options(ctx), llamacpp.build_argv(ctx, src / "build")
    else:
        opts = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_CUDA_ARCHITECTURES={e.cuda_architectures}"]
        build_argv = ["cmake", "--build", str(src / "build")]
    res["cmake_options"] = opts
    c = _run(ctx, ["cmake", "-S", str(src), "-B", str(src / "build"), *opts], log, env=_env(ctx))
    res["configure_rc"] = c.returncode
    if c.returncode == 0:
        b = _run(ctx, build_argv, log, env=_env(ctx))
        res["build_rc"] = b.returncode
        res["build_tail"] = " | ".join((b.stdout + b.stderr).strip().splitlines()[-3:]) if b.returncode else None
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
    if archived(p):
        source = llamacpp.unpacked(src)
    else:
        head = host.runner.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=False).stdout.strip() \
            if (src / ".git").is_dir() else None
        source = {"path": str(src), "head": head or None}
    res: dict = {"log": str(log) if log else None, "source": source, "cuda_enabled": p.engine.cuda}
    if log and p.engine.recipe in ("ninfer", "llamacpp"):
        cache = src / "build/CMakeCache.txt"
        res["cmake_cache"] = str(cache) if cache.is_file() else None
        cached = pb.cmake_cache(cache.read_text(errors="replace")) if cache.is_file() else None
        text = log.read_text(errors="replace")
        if p.engine.recipe == "ninfer":
            res["up_to_date"] = _up_to_date(ctx, src / "build", ["ninfer-serve"])
            res["criteria"] = pb.ninfer_criteria(text, cached, res["up_to_date"])
        else:  # llama.cpp: a no-op rebuild still runs its UI-assets step, so Ninja never says "no work to do"
            targets = tuple(p.engine.targets) or pb.LLAMACPP_TARGETS
            res["up_to_date"] = _up_to_date(ctx, src / "build", list(targets), pb.ninja_current, ("-d", "explain"))
            res["criteria"] = pb.llamacpp_criteria(text, cached, res["up_to_date"], p.engine.cuda, targets)
    exe = host.path(binary(p))
    res["binary"] = _binary(ctx, exe)
    if exe.is_file():
        res["libraries"] = pb.ldd(host.runner.run(["ldd", str(exe)], check=False).stdout)
        if p.engine.recipe == "llamacpp" and p.engine.cuda:
            ggml = next(iter(sorted((src / "build").rglob("libggml-cuda.so*"))), None)
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
    deps = dependencies(ctx)
    ctx.options["engine_build"] = build(ctx)
    return {"dependencies": deps, "log": ctx.options["engine_build"]["log"]}


def dependencies(ctx) -> dict:
    """The engine role: the build directory's parent (a mode only when it makes it), and the build
    dependencies dpkg does not have and whose tools are not on PATH, through apt-get. The role
    decides each from the host; p2pkit hands it the profile's recipe and build directory and keeps
    Ansible's own count."""
    e = ctx.profile.engine
    return run_playbook(ctx, "engine", {"p2pkit_engine_recipe": e.recipe, "p2pkit_engine_build_dir": e.build_dir})


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
