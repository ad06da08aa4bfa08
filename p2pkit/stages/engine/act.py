"""engine: build the inference engine from its pinned source, each recipe by its own module
(stages/engine/<recipe>.py: ninfer and llamacpp through CMake, vllm into a venv), and prove what was built."""

from __future__ import annotations

from p2pkit.stages.engine import common


def act(ctx) -> dict:
    """The recipe's build; its record kept for measure, the summary of the engine role's first run (the
    dependencies and the checkout) returned as what the stage did."""
    built = common.recipe(ctx.profile).build(ctx)
    ctx.options["engine_build"] = built
    return {"dependencies": built.pop("dependencies", None), "log": built.get("log"),
            **({"moved_aside": built["moved_aside"]} if built.get("moved_aside") else {})}


def measure(ctx, acted: dict | None = None) -> dict:
    """The build's own record when the stage just built it, and always what is there now."""
    return common.recipe(ctx.profile).measure(ctx, ctx.options.pop("engine_build", None))
