"""The product's layers hold, read from the folder names: each module imports only what lies below it
in its own layer or in a lower layer; siblings of one rank (two stage folders, two host probes) never
import each other; there are no import cycles; and no product module imports the simulator (a
simulated host plugs in through the host object; only the `sim` commands reach the simulator).

Layers, top to bottom (the folder is the layer):
  cli/      the commands             app/    the use cases (up, doctor, restore, bench, pin, ...)
  stages/   one folder per stage     facts/  the facts, collected once    rules/  findings and engine rules
  host/     probes of a host root    parse/  pure parsers                 core/   errors, writers, config, ...
Inside a layer, RANKS orders its modules top to bottom; a module may import only a lower rank.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "p2pkit"
STAGE_FOLDERS = ("preflight", "driver", "p2p_module", "rebar", "topology", "link", "engine", "model", "service")
ENGINE_MODULES = ("ninfer", "llamacpp", "vllm")

# (layer, [ranks, top to bottom]); a rank is a list of module prefixes (longest prefix wins)
LAYERS: list[tuple[str, list[list[str]]]] = [
    ("cli", [["p2pkit.__main__"], ["p2pkit.cli.top_help"], ["p2pkit.cli.main"], ["p2pkit.cli.app"],
             ["p2pkit.cli.stages_cmd", "p2pkit.cli.bench_cmd", "p2pkit.cli.net_cmd", "p2pkit.cli.pin_cmd",
              "p2pkit.cli.profile_cmd", "p2pkit.cli.report_cmd", "p2pkit.cli.serve_cmd", "p2pkit.cli.sim_cmd",
              "p2pkit.cli.direct"],
             ["p2pkit.cli.container_cmd"], ["p2pkit.cli.failure"], ["p2pkit.cli.common"],
             ["p2pkit.cli.argv", "p2pkit.cli"]]),
    ("app", [["p2pkit.app.doctor", "p2pkit.app.bench", "p2pkit.app.pin", "p2pkit.app.restore", "p2pkit.app.rollback",
              "p2pkit.app.inventory", "p2pkit.app.reboot"],
             ["p2pkit.app.pipeline"],
             ["p2pkit.app.paste", "p2pkit.app.report", "p2pkit.app.reports", "p2pkit.app"]]),
    # a stage folder's modules may import each other (its act reads its checks); one stage never imports another
    ("stages", [["p2pkit.stages"], ["p2pkit.stages.definitions"],
                [f"p2pkit.stages.{s}" for s in STAGE_FOLDERS],
                ["p2pkit.stages.stage"]]),
    # the fact table names each fact's probe and type once; collect and types read it
    ("facts", [["p2pkit.facts.collect"], ["p2pkit.facts.types"], ["p2pkit.facts.table"],
               ["p2pkit.facts.probes", "p2pkit.facts.shapes", "p2pkit.facts"]]),
    # an engine module per recipe (rules/engines/): its flags, argv, refusals and fit rules; the package plugs
    # them into core/config.py when it is imported (config names no engine)
    ("rules", [["p2pkit.rules.places"], ["p2pkit.rules.engine_cmd", "p2pkit.rules.engine_env"],
               ["p2pkit.rules.engines"],
               [f"p2pkit.rules.engines.{e}" for e in ENGINE_MODULES],
               ["p2pkit.rules.engines.flags", "p2pkit.rules.engines.served"],
               ["p2pkit.rules.findings", "p2pkit.rules.pitfalls", "p2pkit.rules.distro", "p2pkit.rules"]]),
    ("host", [["p2pkit.host.field_facts", "p2pkit.host.kmod", "p2pkit.host.launcher", "p2pkit.host.mok"],
              ["p2pkit.host.system", "p2pkit.host.pci", "p2pkit.host.smi", "p2pkit.host.nvml", "p2pkit.host.arch",
               "p2pkit.host.access", "p2pkit.host.roce", "p2pkit.host.storage", "p2pkit.host.model",
               "p2pkit.host.engine_api", "p2pkit.host.boot", "p2pkit.host.backup", "p2pkit.host.dkms"],
              ["p2pkit.host"]]),
    ("parse", [["p2pkit.parse.paste", "p2pkit.parse.p2p_paste"], ["p2pkit.parse"]]),
    ("core", [["p2pkit.core.ansible", "p2pkit.core.hoststate", "p2pkit.schemas"],
              ["p2pkit.core.config", "p2pkit.core.artifacts"],
              ["p2pkit.core.writers"],
              ["p2pkit.core.tomlwrite", "p2pkit.core.logfiles", "p2pkit.core.output", "p2pkit.core.lock",
               "p2pkit.core.runner"],
              ["p2pkit.core.secrets", "p2pkit.core.children"], ["p2pkit.core.safefs", "p2pkit.core.role_defaults"],
              ["p2pkit.core.errors", "p2pkit.core"], ["p2pkit.core.breaks"],
              ["p2pkit.core.unitenv", "p2pkit.core.bootentry"]]),
    # data and child processes: the profiles (read with importlib.resources), the load worker (a child
    # process that imports nothing of p2pkit), the package itself (its version)
    ("data", [["p2pkit.profiles", "p2pkit.load", "p2pkit"]]),
]
SIM = "p2pkit.sim"
# the sim commands (the container host's among them): outside the product's layers, plugged into the CLI
SIM_DOORS = {"p2pkit.cli.sim_cmd", "p2pkit.cli.container_cmd"}


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


def place(name: str) -> tuple[int, int, str] | None:
    """(layer, rank, prefix) of a module: the longest prefix that names it."""
    best = None
    for li, (_, ranks) in enumerate(LAYERS):
        for ri, prefixes in enumerate(ranks):
            for p in prefixes:
                covers = name == p or (p != "p2pkit" and name.startswith(p + "."))
                if covers and (best is None or len(p) > len(best[2])):
                    best = (li, ri, p)
    return best


def stage_folder(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "stages" and parts[2] in STAGE_FOLDERS else None


def allowed(m: str, d: str) -> bool:
    pm, pd = place(m), place(d)
    if pm[0] != pd[0]:
        return pd[0] > pm[0]  # a smaller index is a higher layer
    if stage_folder(m) and stage_folder(m) == stage_folder(d):
        return True  # inside one stage's folder
    return pd[1] > pm[1]  # strictly lower rank: siblings never import each other


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, f, mods) for m, f in mods.items()}


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, deps in g.items():
        if m.startswith(SIM) or m in SIM_DOORS or place(m) is None:
            continue
        for d in deps:
            if d.startswith(SIM) or place(d) is None:  # unplaced: the test below names it
                continue
            if not allowed(m, d):
                (lm, rm, _), (ld, rd, _) = place(m), place(d)
                why = "upward" if ld < lm or (ld == lm and rd < rm) else "across one rank"
                bad.append(f"{m} ({LAYERS[lm][0]}) -> {d} ({LAYERS[ld][0]}): {why}")
    return sorted(bad)


def test_every_product_module_has_a_place():
    unplaced = [m for m in graph() if not m.startswith(SIM) and place(m) is None]
    assert unplaced == [], f"place these modules in a layer in tests/test_layers.py: {unplaced}"


def test_the_top_level_holds_only_layer_folders():
    loose = sorted(f.name for f in PKG.glob("*.py") if f.name not in ("__init__.py", "__main__.py"))
    assert loose == [], f"every module lives in its layer's folder: {loose}"


def test_imports_run_only_down_and_never_across():
    bad = violations(graph())
    assert bad == [], "imports that run up a layer or across one rank:\n" + "\n".join(bad)


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


def test_the_layer_test_sees_an_upward_a_sideways_and_an_across_import(tmp_path):
    """The guard itself: a parser that imports a stage (upward), one stage that imports another
    (across), and a core module that imports its sibling of the same rank, are each reported."""
    fake = tmp_path / "x.py"
    fake.write_text("from p2pkit.stages.engine import act\nimport p2pkit.sim.model\n")
    got = imports("p2pkit.parse.x", fake, {**modules(), "p2pkit.parse.x": fake})
    assert got == {"p2pkit.stages.engine.act", "p2pkit.sim.model"}
    g = {"p2pkit.parse.x": got,
         "p2pkit.stages.link.checks": {"p2pkit.stages.topology.checks"},  # one stage reads another's
         "p2pkit.core.runner": {"p2pkit.core.output"},  # siblings of one rank
         "p2pkit.stages.service.act": {"p2pkit.stages.service.checks", "p2pkit.rules.findings"}}  # allowed
    bad = violations(g)
    assert bad == [
        "p2pkit.core.runner (core) -> p2pkit.core.output (core): across one rank",
        "p2pkit.parse.x (parse) -> p2pkit.stages.engine.act (stages): upward",
        "p2pkit.stages.link.checks (stages) -> p2pkit.stages.topology.checks (stages): across one rank",
    ], bad


# ------------------------------------------------------------------------------------ the fact table

def fact_registries(tree: ast.AST, names: set[str]) -> list[int]:
    """The lines of dict literals keyed by five or more fact names: a second registry of facts."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Dict)
            and sum(isinstance(k, ast.Constant) and k.value in names for k in n.keys) >= 5]


def test_a_fact_is_declared_once_in_the_fact_table():
    """Issue 39: each fact has one line in p2pkit/facts/table.py (probe, type, profile sections, parser);
    collect runs exactly the probes it names and types judges exactly the types it names. A fact that one
    of them knows and the table does not (or a second dict of facts anywhere in the product) fails here. The
    simulator's state is its own world, keyed as it likes."""
    from p2pkit.core.config import SECTIONS
    from p2pkit.facts import collect, table, types

    names = [f.name for f in table.TABLE]
    assert len(names) == len(set(names)), "a fact declared twice in the table"
    readable = {f.name for f in table.TABLE if f.probe is not None}
    assert set(collect.COLLECTORS) | set(collect.PROFILE_COLLECTORS) == readable
    assert not set(collect.COLLECTORS) & set(collect.PROFILE_COLLECTORS)
    assert {n: f.probe for n, f in table.BY_NAME.items() if f.probe} == {**collect.COLLECTORS,
                                                                          **collect.PROFILE_COLLECTORS}
    assert {f.name: f.type for f in table.TABLE} == types.FACTS
    assert set(collect.WAITING) <= readable, set(collect.WAITING) - readable
    for f in table.TABLE:
        assert set(f.needs) <= set(SECTIONS), (f.name, f.needs)
        assert f.parse is None or f.probe is not None, f.name
    elsewhere = {m: lines for m, path in modules().items() if m != "p2pkit.facts.table" and not m.startswith(SIM)
                 and (lines := fact_registries(ast.parse(path.read_text()), set(names)))}
    assert elsewhere == {}, f"facts declared outside p2pkit/facts/table.py: {elsewhere}"
    # the guard itself sees a second registry
    assert fact_registries(ast.parse("X = {" + ", ".join(f"'{n}': 1" for n in names[:5]) + "}"), set(names)) == [1]


def test_the_registry_imports_each_stage_module_under_one_pattern():
    """stages/definitions.py names each stage module <stage folder>_<module> (driver_act, link_measure,
    service_checks): a reader finds a stage's part by its name alone."""
    tree = ast.parse((PKG / "stages/definitions.py").read_text())
    names = [(n.module, a.name, a.asname) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and (n.module or "").split(".")[-1] in STAGE_FOLDERS for a in n.names]
    assert names and all(asname == f"{module.split('.')[-1]}_{name}" for module, name, asname in names), names


# ------------------------------------------------------------------------------ engine knowledge
# An engine's flags are its engine module's (p2pkit/rules/engines/: ninfer, llamacpp, vllm): no other module
# names one (a string equal to a flag's name). host and port are [serve]'s own keys too.
ENGINES_PKG = "p2pkit.rules.engines"
# the same word, meaning something else there
NOT_A_FLAG = {
    "p2pkit.app.bench": {"metrics"},  # a source of drafting's counts (/metrics) in bench.json's draft_sources
    "p2pkit.host": {"devices"},  # the simulated host's library plug
    "p2pkit.parse.p2p_paste": {"devices"},  # a pasted output's device count
    "p2pkit.parse.engine_api": {"vision"},  # a phase of NInfer's request timing
    "p2pkit.stages.topology.checks": {"headless"},  # a GPU with no display
}


def engine_flag_names() -> set[str]:
    from p2pkit.rules.engines import ENGINES

    return {k for m in ENGINES.values() for k in m.FLAGS} - {"host", "port"}


def flags_named(mods: dict[str, Path], names: set[str]) -> dict[str, list[str]]:
    """Module -> the engine flags it names outside the engine modules (and what each is allowed)."""
    out = {}
    for m, f in mods.items():
        if m.startswith(SIM) or m == ENGINES_PKG or m.startswith(ENGINES_PKG + "."):
            continue
        found = {n.value for n in ast.walk(ast.parse(f.read_text()))
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names}
        found -= NOT_A_FLAG.get(m, set())
        if found:
            out[m] = sorted(found)
    return out


def test_an_engines_flags_are_named_only_in_its_engine_module():
    bad = flags_named(modules(), engine_flag_names())
    assert bad == {}, f"move what these know of an engine's flags into its engine module ({ENGINES_PKG}): {bad}"


def test_the_engine_knowledge_test_sees_config_naming_a_flag_again(tmp_path):
    """The guard itself: core/config.py with a table of fit flags in it again, and host/model.py reading the
    draft model (and the projector) from the flags again instead of being handed it, are each reported; the
    engine modules themselves are not."""
    names = engine_flag_names()
    fake = tmp_path / "config.py"
    fake.write_text('FIT_FLAGS = {"llamacpp": {"ctx-size": ("int", 0, 1 << 24)}}\n')
    more = tmp_path / "model.py"
    more.write_text('draft = flags.get("model-draft")\nmm = flags.get("mmproj")\n')
    mods = {"p2pkit.core.config": fake, "p2pkit.host.model": more,
            "p2pkit.rules.engines.llamacpp": modules()["p2pkit.rules.engines.llamacpp"]}
    assert flags_named(mods, names) == {"p2pkit.core.config": ["ctx-size"],
                                        "p2pkit.host.model": ["mmproj", "model-draft"]}


def test_every_reader_of_a_profile_has_the_engines_rules_plugged_in():
    """config asks the engine modules about [serve.flags], and their package plugs them in when it is
    imported: every product module and bench script that reads a profile (config.load, from_dict,
    from_record) imports it, straight or through what it imports (the simulator, which never imports the
    product's rules, reads profiles without them)."""
    g, mods = graph(), modules()

    def reaches(start: set[str]) -> bool:
        seen, todo = set(), list(start)
        while todo:
            m = todo.pop()
            if m == ENGINES_PKG:
                return True
            if m not in seen:
                seen.add(m)
                todo += sorted(g.get(m, ()))
        return False

    def reads_a_profile(tree) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr in ("load", "from_dict", "from_record")
                   and isinstance(n.value, ast.Name) and n.value.id == "config" for n in ast.walk(tree))

    readers = {m: {m} for m, f in mods.items() if not m.startswith(SIM) and reads_a_profile(ast.parse(f.read_text()))}
    for f in sorted((PKG.parent / "bench").glob("*.py")):
        tree = ast.parse(f.read_text())
        if reads_a_profile(tree):
            readers[f"bench/{f.name}"] = imports("bench", f, mods)
    assert len(readers) > 5, readers
    bad = sorted(m for m, start in readers.items() if not reaches(start))
    assert bad == [], f"these read a profile without importing {ENGINES_PKG} (config would not ask the engine): {bad}"


# ------------------------------------------------------------------------------ cyclomatic complexity
# Issue 39 item 4: no function in p2pkit/ above 25 in cyclomatic complexity, as `radon cc` counts it.
CC_MAX = 25


def complexities(source: str) -> list[tuple[str, int, int]]:
    """(name, line, cyclomatic complexity) of every function of a module as radon counts it: its functions,
    their closures, the methods of its classes (inner classes' too) and theirs. A class's own figure (the
    average of its methods) is not a function's and is left out."""
    from radon.complexity import cc_visit
    from radon.visitors import Class

    # cc_visit lists a class's methods beside the class: start from the classes and the plain functions only
    todo = [b for b in cc_visit(source) if isinstance(b, Class) or not b.is_method]
    out = []
    while todo:
        b = todo.pop()
        if isinstance(b, Class):
            todo += [*b.methods, *b.inner_classes]
        else:
            out.append((b.fullname, b.lineno, b.complexity))
            todo += b.closures
    return out


def test_no_function_above_25_in_cyclomatic_complexity():
    found = {f"{f.relative_to(PKG.parent)}:{line} {name} ({cc})": cc for f in sorted(PKG.rglob("*.py"))
             for name, line, cc in complexities(f.read_text())}
    assert len(found) > 1000, len(found)  # the walk saw the product, methods and closures included
    bad = sorted(k for k, cc in found.items() if cc > CC_MAX)
    assert bad == [], (f"functions above {CC_MAX} in cyclomatic complexity (radon cc; issue 39): split each into "
                       f"named parts with the same behaviour:\n" + "\n".join(bad))


def test_the_complexity_test_sees_a_method_a_closure_and_an_inner_class():
    """The guard itself: a function, a method, a closure and an inner class's method are each counted once, at
    radon's figure; at the bound (25) none is above it, one branch more (26) each is."""
    body = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(CC_MAX - 1)) + \
        "    return -1\n"
    src = "\n".join([body.replace("def f", "def plain"),
                     "class A:\n" + _indent(body.replace("def f", "def method")),
                     "def outer():\n" + _indent(body.replace("def f", "def closure")) + "    return closure\n",
                     "class B:\n    class Inner:\n" + _indent(_indent(body.replace("def f", "def deep")))])
    got = sorted((name, cc) for name, _, cc in complexities(src))
    assert got == [("A.method", 25), ("Inner.deep", 25), ("closure", 25), ("outer", 1), ("plain", 25)], got
    more = complexities(src.replace("return -1", "return -1 if x else -2"))
    assert sorted(name for name, _, cc in more if cc > CC_MAX) == ["A.method", "Inner.deep", "closure", "plain"], more


def _indent(text: str) -> str:
    return "".join(f"    {ln}\n" if ln else "\n" for ln in text.splitlines())


# ------------------------------------------------------------------------- one owner per engine recipe (issue 46)

# where a recipe's knowledge lives: its engine module, its engine-stage module, and the simulator (which states
# its own copy of every engine it imitates); every other module asks the engine module (rules/engines)
RECIPE_OWNERS = ("p2pkit.rules.engines.", "p2pkit.stages.engine.", "p2pkit.sim.")
RECIPE_STAGE_MODULES = ("p2pkit.stages.engine.act", "p2pkit.stages.engine.checks", "p2pkit.stages.engine.common",
                        "p2pkit.stages.engine.cmake")


def _is_recipe(node) -> bool:
    """`x.recipe`, `x["recipe"]` or a name `recipe`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "recipe"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "recipe"
    return isinstance(node, ast.Name) and node.id == "recipe"


def _names_engines(node) -> bool:
    """A literal name or names (`"vllm"`, `("ninfer", "llamacpp")`), or a module's constant list of them
    (`BUILT_ENGINES`): what a branch on particular engines compares a recipe with."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return all(isinstance(e, ast.Constant) for e in node.elts)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.isupper()


def recipe_branches(source: str) -> list[int]:
    """The lines where a recipe is compared (==, !=, in, not in) with particular engines: a branch on which
    engine this is (two recipes compared with each other are not)."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in n.ops):
            sides = [n.left, *n.comparators]
            if any(_is_recipe(s) for s in sides) and any(_names_engines(s) for s in sides if not _is_recipe(s)):
                out.append(n.lineno)
    return out


def test_a_recipe_is_asked_never_branched_on_outside_its_owners():
    """`recipe ==` outside rules/engines/, the engine stage's recipe modules and the simulator is a recipe's
    knowledge leaking into another layer: that layer must ask the engine module (dispatch, not branches)."""
    bad = []
    for name, f in modules().items():
        owner = name.startswith(RECIPE_OWNERS) and name not in RECIPE_STAGE_MODULES
        if not owner:
            bad += [f"{f.relative_to(PKG.parent)}:{line}" for line in recipe_branches(f.read_text())]
    assert bad == [], "branches on the engine recipe outside its owners:\n" + "\n".join(bad)


def test_the_recipe_guard_sees_each_form_of_a_branch():
    src = ("if p.engine.recipe == 'vllm': pass\nif e.recipe in ('a', 'b'): pass\nif data['engine']['recipe'] != 'x': "
           "pass\nok = recipe not in KNOWN\nif p.engine.recipe: pass\nx = {'recipe': 1}\n"
           "same = p.engine.recipe == own['engine.recipe']\n")
    assert recipe_branches(src) == [1, 2, 3, 4]


def test_every_recipe_has_its_engine_module_and_its_stage_module():
    from p2pkit.rules.engines import ENGINES

    for name in ENGINES:
        assert (PKG / "rules/engines" / f"{name}.py").is_file() and (PKG / "stages/engine" / f"{name}.py").is_file()
