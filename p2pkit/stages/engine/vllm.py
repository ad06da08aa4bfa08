"""vLLM's recipe for the engine stage (seed 004, P21, P25)."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.parse import build as pb
from p2pkit.parse.build import names_arch
from p2pkit.rules.findings import FAIL, Check, failed, judge, unknown

NAME = "vllm"


def checks_out(p: Profile) -> bool:
    return False


def precheck(p: Profile) -> list[Check]:
    return []  # nothing is built: the environment engine.python names is proven instead (check)


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


def build(ctx) -> dict:
    return _vllm_facts(ctx)


def measure(ctx, built: dict | None) -> dict:
    return {"engine_build": built or _vllm_facts(ctx)}


def check(b: dict, p: Profile) -> list[Check]:
    return _vllm(b.get("vllm_env", {}), p) + vllm_tree_checks(b.get("vllm_tree"), p)


def reproved(recorded: dict, now: dict | None, p: Profile) -> list[Check]:
    return []  # vLLM is not built: nothing to re-prove here


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


