"""Which checks a test guards: force each check function of p2pkit's check modules to pass, in turn, and run
the tests that should catch it. A check is guarded when at least one of them then fails.

    python3 bench/check_guard.py                 # fast tests only (the default; minutes on 2 cores)
    python3 bench/check_guard.py --slow          # end-to-end tests too, for checks no fast test catches
    python3 bench/check_guard.py --only engine   # the check functions of one module (or module:function)
    python3 bench/check_guard.py --json out.json
    python3 bench/check_guard.py --conditions --only link   # condition by condition (below)
    python3 bench/check_guard.py --conditions --markdown docs/guards.md   # the doc, from the result

A check function is a function in p2pkit/stages/*/checks.py whose return annotation names Check. Forcing it
to pass (tests/guard_plugin.py) turns every fail, warn or pending it returns into a pass with no
hint. Its tests are the test functions (decorators included) that name one of the check ids the
function writes (the literal first argument of its judge/Check/unknown calls, the constant part of
an f-string id) or the function itself; every such test must pass unmutated (a baseline run drops
those that do not, and says so). Checks judged only inside a subprocess (an Ansible-run `p2pkit
verify` on a lab host) are out of this plugin's reach and count as unguarded unless a test in this
process catches them too.

Prints "N of M checks guarded", then each unguarded function with the ids it writes. Exit 0.

--conditions goes inside each function: every condition in it (each operand of an `and`/`or`, each
`if` test and comprehension filter, each comparison: tests/guard_plugin.py `conditions`) is replaced
by True, then by False, one at a time, and the function's tests run on each such mutant; a mutant
under which they all pass survives. Its tests here are wider than the ids: those above, every test of
the check module's own test file (tests/test_<module>*.py), and the tests that name a pitfall the
function judges or a simulated scenario (p2pkit/sim/scenarios.py) whose description names it. Prints
"K of N condition mutants killed" and each survivor with its line and source.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# the check modules: each stage's checks.py (named by its stage), the VRAM fit the service stage
# judges, each engine module's refusals before a start (p2pkit/rules/engines: named by the engine), and
# the reader of pasted outputs
CHECK_FILES = sorted([*REPO.glob("p2pkit/stages/*/checks.py"), REPO / "p2pkit/stages/service/fit.py",
                      *REPO.glob("p2pkit/rules/engines/*.py"), REPO / "p2pkit/app/paste.py"])


def module_of(path: Path) -> str:
    """A check module's short name: its stage's for a stage's checks.py (engine), else its own (fit)."""
    return path.parent.name if path.name == "checks.py" else path.stem
TESTS = REPO / "tests"
MAKERS = {"judge", "Check", "unknown", "not_measured", "could_not", "figure"}
GENERIC = {"check", "precheck", "judge", "unknown", "failed", "worst", "not_measured"}


def _ids_in(path: Path, fn_name: str, seen: set | None = None) -> set[str]:
    """The check ids a function of another p2pkit module writes, with the local helpers it calls
    (service.precheck is engine_cmd.validate: its ids are there)."""
    seen = set() if seen is None else seen
    if (path, fn_name) in seen or not path.is_file():
        return set()
    seen.add((path, fn_name))
    funcs = {n.name: n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
    node = funcs.get(fn_name)
    if node is None:
        return set()
    ids: set[str] = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            if call.func.id in MAKERS and call.args:
                ids |= _literal_prefix(call.args[0], _local_strings(node))
            elif call.func.id in funcs:
                ids |= _ids_in(path, call.func.id, seen)
    return ids


def _module_aliases(tree: ast.Module) -> dict[str, Path]:
    """`from p2pkit import engine_cmd` / `import p2pkit.x as y`: the alias and the module's file."""
    out = {}
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("p2pkit"):
            for a in n.names:
                f = REPO / (n.module.replace(".", "/") + f"/{a.name}.py")
                if f.is_file():
                    out[a.asname or a.name] = f
    return out


def _check_defs(path: Path) -> list[ast.FunctionDef]:
    """The module's functions whose return annotation names Check."""
    return [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.returns is not None
            and "Check" in ast.unparse(n.returns)]


def check_functions(only: str | None = None) -> list[dict]:
    """Every function of p2pkit's check modules whose return annotation names Check, with the ids it writes;
    and those of the other p2pkit modules the checks delegate to (service.precheck is
    engine_cmd.validate: engine_cmd's _vllm, _llamacpp, ... judge there)."""
    out = []
    delegates: set[Path] = set()
    for path in CHECK_FILES:
        aliases = _module_aliases(ast.parse(path.read_text()))
        for node in _check_defs(path):
            for c in ast.walk(node):
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and \
                        isinstance(c.func.value, ast.Name) and c.func.value.id in aliases and \
                        aliases[c.func.value.id] not in CHECK_FILES:
                    delegates.add(aliases[c.func.value.id])
    for path in CHECK_FILES + sorted(delegates):
        aliases = _module_aliases(ast.parse(path.read_text()))
        dotted = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for node in _check_defs(path):
            ids = set()
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) in MAKERS and call.args:
                    ids |= _literal_prefix(call.args[0], _local_strings(node))
            calls = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            for c in ast.walk(node):  # engine_cmd.validate(p) and the like: the other module's ids
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and \
                        isinstance(c.func.value, ast.Name) and c.func.value.id in aliases:
                    ids |= _ids_in(aliases[c.func.value.id], c.func.attr)
            name = f"{dotted}:{node.name}"
            out.append({"target": name, "module": module_of(path), "path": str(path.relative_to(REPO)),
                        "function": node.name, "ids": sorted(ids), "calls": calls, "node": node})
    by_name = {(f["module"], f["function"]): f for f in out}
    own = {id(f): set(f["ids"]) for f in out}
    for f in out:  # a function that gathers others (check, precheck) is caught by what catches them,
        for c in sorted(f.pop("calls")):  # and a helper (field.could_not) by what catches its callers
            if (f["module"], c) in by_name and c != f["function"]:
                helper = by_name[(f["module"], c)]
                f["ids"] = sorted(set(f["ids"]) | own[id(helper)])
                helper["ids"] = sorted(set(helper["ids"]) | own[id(f)])
    if only:
        want = set(only.split(","))
        out = [f for f in out if {f["module"], f["function"], f["target"], f"{f['module']}:{f['function']}"} & want]
    return out


def _local_strings(fn: ast.FunctionDef) -> dict[str, str]:
    """The function's names bound once to a string literal (`id_, title = "field.acs", "..."`)."""
    out: dict[str, str] = {}
    for a in ast.walk(fn):
        if not isinstance(a, ast.Assign) or len(a.targets) != 1:
            continue
        t, v = a.targets[0], a.value
        pairs = zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) else [(t, v)]
        for name, val in pairs:
            if isinstance(name, ast.Name) and isinstance(val, ast.Constant) and isinstance(val.value, str):
                out[name.id] = val.value
    return out


def _literal_prefix(arg: ast.expr, local: dict[str, str] | None = None) -> set[str]:
    """The check id a maker's first argument writes: a literal, the constant start of an f-string, a
    local name bound to a literal, or such a name with a suffix added (`id_ + ".unread"`)."""
    local = local or {}
    if isinstance(arg, ast.Name) and arg.id in local:
        return {local[arg.id]}
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add) and isinstance(arg.left, ast.Name) \
            and arg.left.id in local:
        return {local[arg.left.id]}
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        return {prefix} if len(prefix) > 4 else set()
    return set()


def test_functions() -> list[dict]:
    """Every test function: its node id, whether it is slow, and its source (decorators included, and
    the module-level helpers of its file it calls: `source()` naming engine.source names it for the test)."""
    out = []
    for path in sorted(TESTS.glob("test_*.py")):
        src = path.read_text()
        tree = ast.parse(src)
        module_slow = "pytestmark = pytest.mark.slow" in src
        imported = _imported_modules(tree)
        lines = src.splitlines()
        hosts = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")
                 and any("fixture" in ast.unparse(d) for d in n.decorator_list)
                 and SIM_HOST.search(ast.get_source_segment(src, n) or "")}
        helpers = {n.name: ast.get_source_segment(src, n) or "" for n in tree.body
                   if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
                text = "\n".join(lines[start:node.end_lineno])
                used = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in helpers})
                text += "".join("\n" + helpers[h] for h in used)  # what its helpers name, it names
                slow = module_slow or "mark.slow" in text.split("def ", 1)[0]
                out.append({"node": f"tests/{path.name}::{node.name}", "slow": slow, "text": text,
                            "host_fixture": bool(hosts & {a.arg for a in node.args.args}), "imports": imported})
    return out


def _imported_modules(tree: ast.Module) -> set[str]:
    """The p2pkit modules a test file imports, anywhere in it (`from p2pkit.stages.link import checks`
    is p2pkit.stages.link.checks)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("p2pkit") and not n.level:
            out.add(n.module)
            out |= {f"{n.module}.{a.name}" for a in n.names}
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.startswith("p2pkit")}
    return out


def tests_for(fn: dict, tests: list[dict]) -> list[dict]:
    needles = list(fn["ids"])
    if fn["function"] not in GENERIC:
        needles.append(re.escape(fn["function"]) + r"\(")
    pats = [re.compile(re.escape(n) if not n.endswith(r"\(") else n) for n in needles]
    return [t for t in tests if any(p.search(t["text"]) for p in pats)]


PITFALL = re.compile(r"\bP\d\d\b")


def pitfalls_of(fn: dict) -> set[str]:
    """The pitfall ids a check function names (pitfall="P30", or a "P16" in its source)."""
    src = ast.get_source_segment((REPO / fn["path"]).read_text(), fn["node"]) or ""
    return set(PITFALL.findall(src))


def scenarios_naming(pitfalls: set[str]) -> list[str]:
    from p2pkit.sim.scenarios import SCENARIOS

    return [name for name, (desc, _) in SCENARIOS.items() if set(PITFALL.findall(desc)) & pitfalls]


def relevant_tests(fn: dict, tests: list[dict]) -> list[dict]:
    """The tests that exercise a check however they name it: by its ids or name (tests_for), every
    test of its module's test file or of a file that imports its module (not those over a simulated
    host that name none of these: scenario_wide), and those naming one of its pitfalls or a scenario
    that does.
    tests/guard_plugin.py then keeps, per function, those that call it."""
    named = {t["node"] for t in tests_for(fn, tests)}
    pits = pitfalls_of(fn)
    needles = [re.compile(rf"\b{p}\b") for p in pits]
    needles += [re.compile(re.escape(f'"{s}"')) for s in scenarios_naming(pits)]
    own = re.compile(rf"^tests/test_{re.escape(fn['module'])}(_\w+)?\.py::")
    dotted = ".".join(Path(fn["path"]).with_suffix("").parts)
    return [t for t in tests if t["node"] in named
            or ((own.match(t["node"]) or dotted in t.get("imports", ())) and not scenario_wide(t))
            or any(n.search(t["text"]) for n in needles)]


SIM_HOST = re.compile(r"\b(make_)?sim\(")


def scenario_wide(t: dict) -> bool:
    """A test that lays out a simulated host and runs p2pkit over it (`sim(...)`, `make_sim(...)`, or a
    fixture of its file that does, like test_engine_truth's `served`): it exercises every check of
    the stages it runs, and is slow beside a test of one check; a condition's set holds it only where
    it names the function's check ids, the function, its pitfall or a scenario that does."""
    return bool(SIM_HOST.search(t["text"])) or t.get("host_fixture", False)


def condition_list(fn: dict) -> list[dict]:
    """Each condition of the function: its index, line and source."""
    import importlib

    from tests.guard_plugin import conditions, function_node

    mod = importlib.import_module(fn["target"].split(":")[0])
    _, node = function_node(mod, fn["function"])
    src = (REPO / fn["path"]).read_text()
    return [{"index": i, "line": c.lineno, "source": ast.get_source_segment(src, c) or ast.unparse(c)}
            for i, c in enumerate(conditions(node))]


def conditions_run(fns: list[dict], a) -> dict:
    """Every condition of every function replaced by True, then False; its tests run on each mutant.
    One pytest process per check module: tests/guard_plugin.py (P2PKIT_GUARD_PLAN) collects the
    module's tests once, runs each once unmutated (dropping those that fail, and, per function, those
    that never call it), then applies the mutants in turn inside that session, each run stopping at
    its first failing test."""
    tests = test_functions()
    t_all = time.monotonic()
    for fn in fns:
        fn["conditions"] = condition_list(fn)
    modules: dict[str, dict] = {}
    for module in sorted({fn["module"] for fn in fns}):
        mine = [fn for fn in fns if fn["module"] == module]
        for fn in mine:
            fn["tests"] = [t["node"] for t in relevant_tests(fn, tests) if a.slow or not t["slow"]]
        nodes = sorted({n for fn in mine for n in fn["tests"]})
        plan = {"module": module, "timeout": a.timeout,
                "functions": [{"target": fn["target"], "n_conditions": len(fn["conditions"]), "tests": fn["tests"]}
                              for fn in mine]}
        t_mod = time.monotonic()
        res = _campaign(plan, nodes, a.timeout * (4 + sum(len(f["conditions"]) for f in mine)))
        secs = res.get("test_seconds", {})
        modules[module] = {"seconds": round(time.monotonic() - t_mod), "baseline_seconds": res.get("baseline_seconds"),
                           "tests": len(secs), "slowest": sorted(secs, key=secs.get, reverse=True)[:3]}
        got = {f["target"]: f for f in res.get("functions", [])}
        for fn in mine:
            r = got.get(fn["target"])
            fn["broken"] = [n for n in res.get("broken", []) if n.split("[", 1)[0] in fn["tests"]]
            fn["tests"] = r["tests"] if r else []
            fn["survivors"] = []
            for c in fn["conditions"]:
                c["killed"] = r["conditions"][c["index"]]["killed"] if r else {"True": None, "False": None}
                for value in ("True", "False"):
                    if not c["killed"][value]:
                        fn["survivors"].append({"line": c["line"], "source": c["source"], "as": value == "True"})
            n = 2 * len(fn["conditions"])
            print(f"{n - len(fn['survivors']):3} of {n:3} killed  {fn['target']} ({len(fn['tests'])} tests call it"
                  + (f"; {len(fn['broken'])} failing unmutated left out: {', '.join(fn['broken'])}"
                     if fn["broken"] else "") + ")"
                  + ("" if r else f"; no result: {res.get('error', '')}"), file=sys.stderr)
    secs = time.monotonic() - t_all
    res = summary(fns, secs) | {"modules": modules}
    killed, total, n_cond, caught = res["killed"], res["total"], res["conditions"], res["caught"]
    print(f"{killed} of {total} condition mutants killed in {len(fns)} check functions; {caught} of {n_cond} "
          f"conditions caught both ways ({'fast and slow' if a.slow else 'fast'} tests, {secs:.0f} s)")
    for fn in fns:
        for sv in fn["survivors"]:
            print(f"  survives: {fn['target']} line {sv['line']}: `{sv['source']}` as {sv['as']}"
                  + (" (equivalent)" if sv.get("equivalent") else ""))
    return res


def summary(fns: list[dict], secs: float) -> dict:
    """The figure over the campaign's functions; survivors known to be equivalent marked (EQUIVALENT)."""
    for fn in fns:
        for sv in fn["survivors"]:
            why = EQUIVALENT.get((f"{fn['module']}:{fn['function']}", " ".join(sv["source"].split()), sv["as"]))
            if why:
                sv["equivalent"] = why
    total = sum(2 * len(fn["conditions"]) for fn in fns)
    killed = total - sum(len(fn["survivors"]) for fn in fns)
    n_cond = sum(len(fn["conditions"]) for fn in fns)
    caught = sum(1 for fn in fns for c in fn["conditions"] if all(c["killed"].values()))
    partly = sum(1 for fn in fns for c in fn["conditions"] if any(c["killed"].values())) - caught
    equivalent = sum(1 for fn in fns for sv in fn["survivors"] if sv.get("equivalent"))
    return {"killed": killed, "total": total, "conditions": n_cond, "caught": caught, "partly": partly,
            "none": n_cond - caught - partly, "equivalent": equivalent, "seconds": round(secs),
            "functions": [{k: v for k, v in fn.items() if k != "node"} for fn in fns]}


def _campaign(plan: dict, nodes: list[str], timeout: int) -> dict:
    """One pytest process for one check module's campaign (tests/guard_plugin.py): its result."""
    import tempfile

    if not nodes:
        return {"functions": [], "broken": []}
    with tempfile.TemporaryDirectory(prefix="p2pkit-guard-") as d:
        plan_file, result = Path(d, "plan.json"), Path(d, "result.json")
        plan_file.write_text(json.dumps(plan))
        env = {**os.environ, "COLUMNS": "200", "P2PKIT_GUARD_PLAN": str(plan_file), "P2PKIT_GUARD_RESULT": str(result)}
        env.pop("P2PKIT_GUARD_MUTATE", None)
        env.pop("P2PKIT_GUARD_COND", None)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.guard_plugin",
               "-n", "0", "--no-header", *nodes]
        try:
            # its progress (a line per function, tests/guard_plugin.py) goes to our stderr as it comes
            r = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
        if not result.is_file():
            return {"error": f"pytest exit {r.returncode}: {r.stdout[-1500:]}"}
        return json.loads(result.read_text())


DOC_HEAD = """# Which checks a test guards

<!-- Generated by `python3 bench/check_guard.py --conditions --markdown docs/guards.md`: do not edit by hand
(the reasons for equivalent mutants live in bench/check_guard.py, EQUIVALENT). -->

A check nobody tests can rot silently. `bench/check_guard.py` measures it for every check function in
`p2pkit/stages/*/checks.py` (a function whose return annotation names `Check`), and in the modules those delegate
to (`service.precheck` is `engine_cmd.validate`), at two depths:

- the function (the default): `tests/guard_plugin.py` forces it to pass (every fail, warn or pending it
  returns comes back as a pass without a hint) and runs the tests that name its check ids or itself;
- each condition inside it (`--conditions`): every operand of an `and`/`or` (a literal default such as
  `x or "none"` is a value, not a condition), every `if` test and comprehension filter, every comparison
  is replaced by True, then by False, one at a time (the function recompiled from its source with that
  node replaced, put wherever the original is referenced, the test modules included). A mutant under
  which every test of the function passes survives: no test notices that condition going away.

The tests of a function: those naming its ids or itself, every test of `tests/test_<module>*.py`, and
those naming a pitfall it judges or a simulated scenario whose description names that pitfall. A test
over a simulated host (`sim(...)`: doctor or `up` over a whole scenario) is kept only where it names
the check's ids, the function, its pitfall or such a scenario, not for being in the module's test
file: it exercises every check and would run for every surviving mutant. One pytest process per
module runs the campaign (`P2PKIT_GUARD_PLAN`): its tests collected once and run once unmutated, each
check function traced meanwhile (a test that fails then proves nothing and is left out; a test that
never runs a condition's line cannot tell its mutants apart), then each mutant in turn over the tests
that ran its line, quickest first, stopping at the first failure. Fast tests by default; `--slow` adds
the end-to-end ones, `--only MODULE[,MODULE:FUNCTION]` narrows the run.

What it cannot see: a check judged only in another process (an Ansible-run `p2pkit verify` on a lab
host, the kernel postinst hook's `p2pkit restore`); and whether a test fails for the right reason (the
tests assert the check's id, status, pitfall and measured value). A surviving mutant can be an
equivalent one: a condition that cannot change the result (a guard that an earlier line already
ensured, a default that only shapes the text); those known are marked below with the reason.
"""

# Survivors that are equivalent mutants: (module:function, the condition's source, True/False) -> why no
# test can kill them. check_guard marks them in docs/guards.md; a survivor not here is a gap.
EQUIVALENT: dict[tuple[str, str, bool], str] = {
    ("engine:_source", "bool(head)", True): "an empty HEAD never starts with a non-empty engine.commit, and an "
    "empty engine.commit already fails the operand before it",
    ("engine:vllm_tree", "failed(t)", False): "failed(t) is true only when 'error' is in t, so the operand "
    "beside it already decides and nothing changes",
    ("engine:kernel_archs", "isinstance(e, dict)", True): "e is None (returned earlier) or a dict (the collector "
    "gives EngineArchs, {'missing'} or {'error'}); for any other value both versions crash alike",
    ("preflight:_pins", "keys", True): "with no empty pin ok is True and judge drops the hint of a pass: the "
    "hint built anyway changes nothing",
    ("preflight:bootloader", "not failed(io)", True): "a failed iommu fact is exactly {'error': ...}: its "
    "intent is None, never the profile's passthrough or off, so applied stays False either way",
    ("p2p_module:install_checks", "failed(built)", False): "a failed built fact is {'error': ...} alone: "
    "`not built.get('srcversion')` beside it is already true",
    ("p2p_module:pending_kernel", "same_build", False): "that line runs only when `got == want and same_build` "
    "was false: wherever same_build holds there, got != want holds too and the suffix is empty either way",
    ("fit:check", "failed(fit)", False): "failed(x) implies 'error' in x: the `'error' in fit` operand beside it "
    "returns the same could-not-determine finding",
    ("fit:_cannot_fit", "failed(m)", False): "failed(m) implies 'error' in m: the `'error' in m` operand beside it "
    "returns the same could-not-determine finding",
    ("fit:_cannot_fit", "failed(gpus)", False): "a failed fact is a dict, never a list: `not isinstance(gpus, list)` "
    "already holds and returns the same finding",
    ("fit:headroom", "failed(after)", False): "a failed fact holds only its 'error': after.get('gpus') is None and "
    "`not isinstance(..., list)` returns the same could-not-determine finding",
    ("link:locked_clocks", "failed(nv)", False): "a failed nv is exactly {'error': ...}: the operand beside it, "
    "`'gpus' not in nv`, is then true too and returns the same unknown finding",
    ("service:memory_cap", "not failed(own)", True): "a failed fact is exactly {'error': ...}: own.get('memory_caps') "
    "is None and the conjunction is false either way",
    ("service:listening", 'p.serve.host == "::" and f":::{p.serve.port}" in addrs', False): "with serve.host '::' the "
    "address wanted is already :::port, so `want in addrs` decides the same case",
    ("service:listening", 'p.serve.host == "::"', False): "with serve.host '::', `want in addrs` already accepts "
    ":::port",
    ("service:listening", 'f":::{p.serve.port}" in addrs', False): "the one case it matters (serve.host '::') is "
    "already matched by `want in addrs`",
    ("service:nccl_floor", "isinstance(e, dict)", True): "None is handled by `e is None` before it and every dict "
    "gives the same answer; any other value crashes either way",
    ("service:nccl_floor", "len({v for _, v in found}) > 1", False): "two different versions mean two libraries "
    "at least: `len(found) > 1` beside it gives the same result",
    ("service:_spec", "p.engine.recipe in by_recipe", True): "engine.recipe is one of ninfer, llamacpp, vllm "
    "(config.py refuses any other), the three keys of by_recipe: the test is always true",
}


def markdown(res: dict, a) -> str:
    fns = res["functions"]
    mods = sorted({f["module"] for f in fns})
    n_fn = {m: [f for f in fns if f["module"] == m] for m in mods}
    out = [DOC_HEAD, "## The last run\n",
           f"`python3 bench/check_guard.py --conditions{' --slow' if a.slow else ''}"
           f"{' --only ' + a.only if a.only else ''}` on {time.strftime('%Y-%m-%d')} "
           f"({'fast and slow' if a.slow else 'fast'} tests, {res['seconds']} s on two shared cores):\n",
           f"- **{res['conditions']} conditions** in {len(fns)} check functions of {len(mods)} modules "
           f"({', '.join(mods)});",
           f"- **{res['caught']} of them caught both ways** (a test fails when the condition is replaced by True, "
           f"and one when it is replaced by False), {res['partly']} one way only, {res['none']} neither;",
           f"- **{res['killed']} of {res['total']} mutants killed**; of the {res['total'] - res['killed']} "
           f"survivors, {res['equivalent']} are equivalent (below, with the reason) and "
           f"{res['total'] - res['killed'] - res['equivalent']} are gaps.\n",
           *([f"({res['note']}.)\n"] if res.get("note") else []),
           "| module | check functions | conditions | caught both ways | mutants killed | survivors (gaps) | seconds |",
           "|---|---|---|---|---|---|---|"]
    for m in mods:
        fs = n_fn[m]
        c = sum(len(f["conditions"]) for f in fs)
        both = sum(1 for f in fs for x in f["conditions"] if all(x["killed"].values()))
        sv = sum(len(f["survivors"]) for f in fs)
        gaps = sum(1 for f in fs for x in f["survivors"] if not x.get("equivalent"))
        took = ((res.get("modules") or {}).get(m) or {}).get("seconds", "")
        out.append(f"| {m} | {len(fs)} | {c} | {both} | {2 * c - sv} of {2 * c} | {sv} ({gaps}) | {took} |")
    out += ["\n## By check function\n", "| check function | conditions | mutants killed | tests that call it |",
            "|---|---|---|---|"]
    for f in fns:
        n = 2 * len(f["conditions"])
        out.append(f"| {f['module']}:{f['function']} | {len(f['conditions'])} | {n - len(f['survivors'])} of {n} "
                   f"| {len(f['tests'])} |")
    out.append("\n## Surviving mutants, by check function\n")
    if not any(f["survivors"] for f in fns):
        out.append("None.")
    for f in fns:
        if not f["survivors"]:
            continue
        out.append(f"### {f['module']}:{f['function']}\n")
        for sv in f["survivors"]:
            src = " ".join(sv["source"].split()).replace("|", "\\|")
            why = f" (equivalent: {sv['equivalent']})" if sv.get("equivalent") else ""
            out.append(f"- line {sv['line']}: `{src}` replaced by {sv['as']}{why}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def pytest(nodes: list[str], mutate: str | None, timeout: int, cond: str | None = None) -> tuple[int, str, float]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("P2PKIT_GUARD_MUTATE", None)
    env.pop("P2PKIT_GUARD_COND", None)
    if mutate:
        env["P2PKIT_GUARD_MUTATE"] = mutate
    if cond:
        env["P2PKIT_GUARD_COND"] = cond
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "tests.guard_plugin",
           "-n", "0", "--no-header", "-rf", *nodes]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout[-2000:], time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return 124, "timed out", time.monotonic() - t0


def baseline(nodes: list[str], timeout: int) -> set[str]:
    """The selected tests that fail unmutated (one run without -x; their results mean nothing)."""
    if not nodes:
        return set()
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("P2PKIT_GUARD_MUTATE", None)
    env.pop("P2PKIT_GUARD_COND", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rf",
                        "--no-header", *nodes], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return {m.group(1) for m in re.finditer(r"^FAILED (\S+)", r.stdout, re.M)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", action="store_true", help="also run end-to-end tests for checks no fast test catches")
    ap.add_argument("--only", help="one module of p2pkit's check modules (engine) or module:function")
    ap.add_argument("--json", type=Path, help="write the result here as JSON")
    ap.add_argument("--timeout", type=int, default=900, help="seconds for one pytest run")
    ap.add_argument("--conditions", action="store_true", help="mutate each condition inside each check instead")
    ap.add_argument("--markdown", type=Path, help="with --conditions: write this result as docs/guards.md's table")
    ap.add_argument("--from-json", type=Path, action="append", help="with --markdown: the doc from saved --json "
                    "results, not a run (after EQUIVALENT changed); given again, a later result replaces the "
                    "earlier one's functions and modules (a module run again after its tests changed)")
    a = ap.parse_args(argv)
    if a.from_json:
        docs = [json.loads(f.read_text()) for f in a.from_json]
        res = docs[0]
        again_mods = sorted({m for later in docs[1:] for m in (later.get("modules") or {})})
        for later in docs[1:]:
            again = {f["target"] for f in later["functions"]}
            res["functions"] = [f for f in res["functions"] if f["target"] not in again] + later["functions"]
            res["modules"] = {**(res.get("modules") or {}), **(later.get("modules") or {})}
        for fn in res["functions"]:
            for sv in fn["survivors"]:
                sv.pop("equivalent", None)
        order = {f["target"]: i for i, f in enumerate(check_functions())}
        res["functions"].sort(key=lambda f: order.get(f["target"], len(order)))
        secs = sum(m.get("seconds") or 0 for m in (res.get("modules") or {}).values()) or res["seconds"]
        res = summary(res["functions"], secs) | {k: res.get(k) for k in ("only", "slow", "modules")}
        if again_mods:
            res["note"] = (f"{', '.join(again_mods)} run again (`--only {','.join(again_mods)}`), its result "
                           "in place of the first run's")
        a.only, a.slow = res["only"], res["slow"]
        if a.markdown:
            a.markdown.write_text(markdown(res, a))
        if a.json:
            a.json.write_text(json.dumps(res, indent=2))
        return 0
    fns = check_functions(a.only)
    if a.conditions:
        res = conditions_run(fns, a) | {"only": a.only, "slow": a.slow}
        if a.json:
            a.json.write_text(json.dumps(res, indent=2))
        if a.markdown:
            a.markdown.write_text(markdown(res, a))
        return 0
    tests = test_functions()
    for fn in fns:
        fn["tests"] = tests_for(fn, tests)
    fast = sorted({t["node"] for fn in fns for t in fn["tests"] if not t["slow"]})
    slow = sorted({t["node"] for fn in fns for t in fn["tests"] if t["slow"]}) if a.slow else []
    print(f"{len(fns)} check functions; baseline over {len(fast)} fast and {len(slow)} slow tests", file=sys.stderr)
    broken = baseline(fast + slow, a.timeout * 4)
    if broken:
        print("left out (they fail unmutated): " + ", ".join(sorted(broken)), file=sys.stderr)
    t_all = time.monotonic()
    for fn in fns:
        fn["guarded_by"] = None
        for kind in ("fast", "slow"):
            nodes = [t["node"] for t in fn["tests"] if t["slow"] == (kind == "slow") and t["node"] not in broken]
            if not nodes or (kind == "slow" and not a.slow):
                continue
            rc, out, secs = pytest(nodes, fn["target"], a.timeout)
            fn.setdefault("runs", []).append({"kind": kind, "tests": len(nodes), "rc": rc, "seconds": round(secs, 1)})
            if rc not in (0, 5):  # 5: nothing collected
                failed = re.search(r"^FAILED (\S+)", out, re.M)
                fn["guarded_by"] = failed.group(1) if failed else f"{kind} tests (exit {rc})"
                break
        mark = "guarded" if fn["guarded_by"] else "UNGUARDED"
        print(f"{mark:9} {fn['target']}  {fn['guarded_by'] or ''}", file=sys.stderr)
    guarded = [f for f in fns if f["guarded_by"]]
    print(f"{len(guarded)} of {len(fns)} checks guarded ({'fast and slow' if a.slow else 'fast'} tests, "
          f"{time.monotonic() - t_all:.0f} s)")
    for f in fns:
        if not f["guarded_by"]:
            why = "no test names it" if not f["tests"] else "its tests still pass when it always passes"
            print(f"  unguarded: {f['target']} ({', '.join(f['ids']) or 'no literal id'}): {why}")
    if a.json:
        doc = [{k: v for k, v in f.items() if k not in ("tests", "node")} | {"tests": [t["node"] for t in f["tests"]]}
               for f in fns]
        a.json.write_text(json.dumps({"guarded": len(guarded), "total": len(fns), "functions": doc}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
