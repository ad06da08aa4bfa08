"""engine: the engine built from its pinned source, proven by what its recipe's module judges of its record
(stages/engine/<recipe>.py): a CMake build's log and binary, a vLLM venv's import, pins and --help."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.parse import field as pf
from p2pkit.rules.engines import ENGINES
from p2pkit.rules.findings import SKIP, Check, could_not, judge, not_measured, reads, unreadable
from p2pkit.stages.engine import common


def precheck(p: Profile) -> list[Check]:
    known = ENGINES.get(p.engine.recipe) is not None
    out = [judge("engine.recipe", "a recipe for this engine", known, p.engine.recipe, " or ".join(ENGINES),
                 "use one of the recipes p2pkit has")]
    return out + common.recipe(p).precheck(p) if known else out


@reads(given=("engine_build",))
def check(f: dict, p: Profile) -> list[Check]:
    out = precheck(p)
    missing = not_measured(f, "engine_build", "engine.build", "engine built", "doctor builds nothing",
                           "a run of `p2pkit up`")
    if missing:
        return [*out, missing]
    return out + common.recipe(p).check(f["engine_build"], p)


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
    build whole): the recipe's own re-proof."""
    return common.recipe(p).reproved(recorded, now, p)
