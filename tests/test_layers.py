"""The product's layers hold: each module imports only its own layer or layers below it, there are
no import cycles, and no product module imports the simulator (a simulated host plugs in through
the host object; only the `sim` commands reach the simulator from the CLI)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "p2pkit"

# top to bottom; a module belongs to the first layer whose prefix names it (longest prefix wins)
LAYERS = [
    ("cli", ["p2pkit.cli", "p2pkit.__main__"]),
    ("use cases", ["p2pkit.pipeline", "p2pkit.doctor", "p2pkit.restore", "p2pkit.rollback", "p2pkit.pin",
                   "p2pkit.inventory", "p2pkit.bench",
                   "p2pkit.reboot", "p2pkit.reports", "p2pkit.report"]),
    ("stages", ["p2pkit.stages"]),
    ("checks and facts", ["p2pkit.checks", "p2pkit.facts", "p2pkit.fact_types", "p2pkit.engine_cmd",
                           "p2pkit.engine_env"]),
    ("host probes", ["p2pkit.host", "p2pkit.backup"]),
    ("parsers", ["p2pkit.parse"]),
    ("base", ["p2pkit.runner", "p2pkit.artifacts", "p2pkit.output", "p2pkit.errors", "p2pkit.config",
              "p2pkit.ansible", "p2pkit.lock", "p2pkit.children", "p2pkit.pitfalls", "p2pkit.load",
              "p2pkit.profiles", "p2pkit.schemas", "p2pkit.writers", "p2pkit.secrets", "p2pkit.tomlwrite",
              "p2pkit.hoststate", "p2pkit.logfiles", "p2pkit"]),
]
SIM = "p2pkit.sim"
SIM_DOORS = {"p2pkit.cli.sim_cmd"}  # the sim commands: outside the product's layers, plugged into the CLI


def modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        name = ".".join(f.relative_to(PKG.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def imports(name: str, f: Path, known: dict) -> set[str]:
    out = set()
    pkg = name if f.name == "__init__.py" else name.rpartition(".")[0]
    for n in ast.walk(ast.parse(f.read_text())):
        if isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - n.level + 1] + ([base] if base else []))
            for a in n.names:
                full = f"{base}.{a.name}"
                out.add(full if full in known else base)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
    return {m for m in out if m == "p2pkit" or m.startswith("p2pkit.")} - {name}


def layer(name: str) -> int | None:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or (p != "p2pkit" and name.startswith(p + "."))) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return best[0] if best else None


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, f, mods) for m, f in mods.items()}


def test_every_product_module_has_a_layer():
    unplaced = [m for m in graph() if not m.startswith(SIM) and layer(m) is None]
    assert unplaced == [], f"place these modules in a layer in tests/test_layers.py: {unplaced}"


def test_no_upward_import():
    up = []
    for m, deps in graph().items():
        if m.startswith(SIM) or m in SIM_DOORS or layer(m) is None:
            continue
        for d in deps:
            if d.startswith(SIM) or layer(d) is None:  # unplaced: the test above names it
                continue
            if layer(d) < layer(m):  # a smaller index is a higher layer
                up.append(f"{m} ({LAYERS[layer(m)][0]}) -> {d} ({LAYERS[layer(d)][0]})")
    assert up == [], "imports that run up the layers:\n" + "\n".join(sorted(up))


def test_no_product_module_imports_the_simulator():
    bad = sorted(f"{m} -> {d}" for m, deps in graph().items() if not m.startswith(SIM) and m not in SIM_DOORS
                 for d in deps if d.startswith(SIM))
    assert bad == [], "the simulator plugs in through the host object only:\n" + "\n".join(bad)


def test_no_import_cycles():
    g = graph()
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if d not in g:
                continue
            if state.get(d) == 1:
                cycles.append(" -> ".join([*stack[stack.index(d):], d]))
            elif d not in state:
                visit(d, [*stack, d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_the_layer_test_sees_an_upward_import(tmp_path, monkeypatch):
    """The guard itself: a parser that imported a stage would be reported."""
    f = PKG / "parse" / "build.py"
    g = imports("p2pkit.parse.build", f, modules())
    assert layer("p2pkit.parse.build") > layer("p2pkit.stages.engine")
    fake = tmp_path / "x.py"
    fake.write_text("from p2pkit.stages import engine\nimport p2pkit.sim.model\n")
    got = imports("p2pkit.parse.x", fake, {**modules(), "p2pkit.parse.x": fake})
    assert got == {"p2pkit.stages.engine", "p2pkit.sim.model"} and "p2pkit.stages.engine" not in g
