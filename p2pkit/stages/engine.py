"""engine: build the inference engine from its pinned source. Dependencies through Ansible; the
checkout and the CMake build from Python, with the whole log kept in the state directory.

Before configuring, the CUDA toolkit version and pkg-config's view of the FFmpeg and curl
libraries are checked (P05, P06); a refused precondition never reaches CMake."""

from __future__ import annotations

import hashlib
from pathlib import Path

from p2pkit.ansible import run_playbook
from p2pkit.checks.engine import PKG_MODULES
from p2pkit.engine_cmd import binary
from p2pkit.errors import P2pkitError
from p2pkit.parse import build as pb


def act(ctx) -> dict:
    e = ctx.profile.engine
    return run_playbook(ctx, "engine", {"p2pkit_engine_recipe": e.recipe, "p2pkit_engine_build_dir": e.build_dir})


def _run(ctx, argv, log, cwd=None, env=None):
    r = ctx.host.runner.run(argv, check=False, cwd=cwd, env=env, timeout=7200)
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n{r.stdout}{r.stderr}\n")
    return r


def checkout(ctx, src: Path, log: Path) -> dict:
    e = ctx.profile.engine
    if not (src / ".git").is_dir():
        if src.exists() and any(src.iterdir()):
            return {"path": str(src), "error": f"{src} exists and is not a git checkout: p2pkit will not touch it"}
        r = _run(ctx, ["git", "clone", "--quiet", e.repo, str(src)], log)
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


def measure(ctx) -> dict:
    p, host = ctx.profile, ctx.host
    e = p.engine
    logs = ctx.store.dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "engine-build.log"
    log.write_text(f"# p2pkit engine build: {e.recipe} at {e.commit}{' (SIMULATED host)' if host.simulated else ''}\n")
    src = host.path(e.build_dir)
    res: dict = {"log": str(log), "configured_run": False}
    res["source"] = checkout(ctx, src, log)
    env = {"PKG_CONFIG_PATH": ":".join(str(host.path(x)) for x in e.pkg_config_path.split(":") if x)} \
        if e.pkg_config_path else {}
    try:
        nv = ctx.host.runner.run(["nvcc", "--version"], check=False)
        res["cuda"] = {"version": pb.nvcc_release(nv.stdout), "raw": nv.stdout.strip().splitlines()[-1:]}
    except P2pkitError as err:
        res["cuda"] = {"version": None, "error": err.message}
    res["pkg_config"] = pkg_config(ctx, env)
    cuda_ok = res["cuda"]["version"] is not None and pb.version_tuple(res["cuda"]["version"]) >= \
        pb.version_tuple(e.cuda_min)
    if "error" in res["source"] or not cuda_ok or not all(m["ok"] for m in res["pkg_config"].values()):
        return {"engine_build": res}
    opts = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_CUDA_ARCHITECTURES={e.cuda_architectures}"]
    if e.recipe == "llamacpp":
        opts += ["-DGGML_CUDA=ON", "-DGGML_CUDA_NCCL=ON", f"-DNCCL_ROOT={host.path(e.nccl_root)}",
                 f"-DCMAKE_BUILD_RPATH={host.path(e.nccl_root)}/lib",
                 f"-DCMAKE_INSTALL_RPATH={host.path(e.nccl_root)}/lib"]
    res["cmake_options"] = opts
    res["configured_run"] = True
    build = src / "build"
    c = _run(ctx, ["cmake", "-S", str(src), "-B", str(build), *opts], log, env=env)
    res["configure_rc"] = c.returncode
    if c.returncode == 0:
        b = _run(ctx, ["cmake", "--build", str(build)], log, env=env)
        res["build_rc"] = b.returncode
        res["build_tail"] = " | ".join((b.stdout + b.stderr).strip().splitlines()[-3:]) if b.returncode else None
    text = log.read_text(errors="replace")
    res["first_error"] = pb.first_cmake_error(text)
    if e.recipe == "ninfer":
        res["criteria"] = pb.ninfer_criteria(text)
    exe = host.path(binary(p))
    res["binary"] = _binary(ctx, exe)
    if exe.is_file():
        res["libraries"] = pb.ldd(ctx.host.runner.run(["ldd", str(exe)], check=False).stdout)
        if e.recipe == "llamacpp":
            ggml = next(iter(sorted(build.rglob("libggml-cuda.so*"))), None)
            res["nccl_links"] = {"llama-server": res["libraries"]}
            if ggml:
                res["nccl_links"]["libggml-cuda.so"] = pb.ldd(ctx.host.runner.run(["ldd", str(ggml)],
                                                                                 check=False).stdout)
    return {"engine_build": res}


def _binary(ctx, exe: Path) -> dict:
    if not exe.is_file():
        return {"path": str(exe), "runs": False, "error": f"{exe} was not built"}
    h = hashlib.sha256(exe.read_bytes()).hexdigest()
    r = ctx.host.runner.run([str(exe), "--version"], check=False, timeout=60)
    return {"path": str(exe), "sha256": h, "runs": r.returncode == 0,
            "version": (r.stdout.strip() or r.stderr.strip())[:200]}
