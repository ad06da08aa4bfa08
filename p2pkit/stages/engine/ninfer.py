"""NInfer's recipe for the engine stage: a git checkout at the pinned commit, CMake and Ninja for CUDA
architecture 120a only (P05), the FFmpeg and curl libraries found through pkg-config (P06), and its build log's
own criteria (P07)."""

from __future__ import annotations

from pathlib import Path

from p2pkit.core.config import Profile
from p2pkit.core.errors import UsageError
from p2pkit.parse import build as pb
from p2pkit.rules.findings import Check, judge
from p2pkit.stages.engine import cmake

NAME = "ninfer"
PKG_MODULES = ("libavformat", "libavcodec", "libavutil", "libswscale", "libcurl")
TARGETS = ("ninfer-serve",)


def checks_out(p: Profile) -> bool:
    """Its source is a git checkout at the pinned commit (the engine role's)."""
    return True


def precheck(p: Profile) -> list[Check]:
    return [judge("engine.commit", "engine source pinned", len(p.engine.commit) >= 7 and bool(p.engine.repo),
                  p.engine.commit or "(empty)", "a repository and a commit",
                  "set engine.repo and engine.commit to the source you reviewed; p2pkit never builds an unpinned "
                  "engine (a DFlash2 artifact needs a commit with TP2 DFlash2 support, P09)", pitfall="P09"),
            judge("engine.cuda_arch", "CMAKE_CUDA_ARCHITECTURES is 120a", p.engine.cuda_architectures == "120a",
                  p.engine.cuda_architectures, "120a", "NInfer supports only CMAKE_CUDA_ARCHITECTURES=120a",
                  pitfall="P05")]


def cmake_options(ctx) -> list[str]:
    return ["-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_CUDA_ARCHITECTURES={ctx.profile.engine.cuda_architectures}"]


def targets(p: Profile) -> list[str]:
    return []  # all: NInfer's tree builds its server and its tools


def toolchain_more(ctx) -> dict:
    return {}


def criteria(ctx, out: Path, log: str, cached: dict | None) -> tuple[bool, dict]:
    current = cmake.up_to_date(ctx, out, list(TARGETS))
    return current, pb.ninfer_criteria(log, cached, current)


def installed_more(ctx, build: Path, libraries: list) -> dict:
    return {}


def result_more(b: dict, p: Profile) -> list[Check]:
    return []


def offline(ctx, dest: Path) -> dict:
    raise UsageError(f"--engine-offline packs an engine's pinned sources for a box without network, and "
                     f"{ctx.profile.name}'s engine (NInfer) is a git checkout: copy the repository instead",
                     hint="use a profile whose engine is built from an archive (dual-5090-llamacpp) or wheels (vLLM)")


# the build, its record, its checks and their re-proof: the CMake recipes' (stages/engine/cmake.py), which asks this
# module for what is the recipe's own (its options, targets, pkg-config modules, criteria)
build, measure, check, reproved = cmake.build, cmake.measure, cmake.check, cmake.reproved
