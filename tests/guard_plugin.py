"""pytest plugin for bench/check_guard.py: forces one check function of p2pkit/checks to pass.

Loaded with `-p tests.guard_plugin` and P2PKIT_GUARD_MUTATE=module:function (like
p2pkit.stages.engine.checks:_result). Every Check the function returns (alone or in a list) that is not a
pass or a skip comes back as a pass with no hint, as if the check had been made to always pass.
The function is replaced everywhere it is referenced: the module, every p2pkit module that
imported it by name, and the stage registry. Loaded before conftest, so before the tests import.

With P2PKIT_GUARD_COND=module:function:INDEX:VALUE instead, one condition inside the function is
replaced by the constant VALUE (True or False): `conditions` numbers them in source order (each operand
of an `and`/`or`, each `if` test and comprehension filter, each comparison), and the function is
recompiled from its source with that one node replaced, then put everywhere the original was.

With P2PKIT_GUARD_PLAN=FILE (bench/check_guard.py --conditions writes it, one pytest process per
check module), the plugin runs the whole campaign inside this one session: the tests are collected
once; each runs once unmutated, with every planned function traced while it runs (through the
references the mutants replace) to record which of its lines each test runs (a test that fails
unmutated, or never runs a condition's line, cannot tell its mutants apart); then for each
function, each condition, True then False: the mutant is put everywhere the function is referenced
(the test modules included), the tests that ran its line run in turn until the first one fails
(the quickest first, by the unmutated run's times), and the original is put back. The result goes to
P2PKIT_GUARD_RESULT as JSON.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _forced(result):
    from p2pkit.rules.findings import PASS, SKIP, Check

    if isinstance(result, Check):
        return result if result.status in (PASS, SKIP) else dataclasses.replace(result, status=PASS, hint="")
    if isinstance(result, list):
        return [_forced(x) for x in result]
    return result


LITERALS = (ast.Constant, ast.JoinedStr, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.DictComp)


def conditions(fn: ast.FunctionDef) -> list[ast.expr]:
    """The conditions of a function, in source order, each once: every operand of an `and`/`or`, every
    `if`/`while`/conditional-expression test and comprehension filter, every comparison. Nested
    functions count as the function's own (a local helper's conditions are the check's). A literal
    operand (`errors or "none read"`, `out or [Check(...)]`) is a default value, not a condition."""
    found: dict[int, ast.expr] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                if not isinstance(v, LITERALS) or (isinstance(v, ast.Constant) and isinstance(v.value, bool)):
                    found.setdefault(id(v), v)
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            found.setdefault(id(node.test), node.test)
        elif isinstance(node, ast.comprehension):
            for c in node.ifs:
                found.setdefault(id(c), c)
        elif isinstance(node, ast.Compare):
            found.setdefault(id(node), node)
    return sorted(found.values(), key=lambda n: (n.lineno, n.col_offset, -(n.end_lineno or 0),
                                                 -(n.end_col_offset or 0)))


def function_node(mod, fn_name: str) -> tuple[ast.Module, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(mod))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn_name)
    return tree, fn


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.expr, value: bool):
        self.target, self.value = target, value

    def visit(self, node):
        if node is self.target:
            return ast.copy_location(ast.Constant(self.value), node)
        return super().visit(node)


def mutated_function(mod, fn_name: str, index: int, value: bool):
    """The function recompiled with condition `index` replaced by `value`, in its module's globals."""
    _, fn = function_node(mod, fn_name)
    target = conditions(fn)[index]
    fn = ast.fix_missing_locations(_Replace(target, value).visit(fn))
    fn.decorator_list = []
    ns: dict = {}
    code = compile(ast.Module([fn], type_ignores=[]), inspect.getsourcefile(mod), "exec", dont_inherit=True)
    exec(code, mod.__dict__, ns)
    return ns[fn_name]


def _ours(name: str, m) -> bool:
    """p2pkit's modules and the tests' (imported as test_x or tests.test_x: by file)."""
    if m is None:
        return False
    if name.startswith("p2pkit"):
        return True
    f = getattr(m, "__file__", None) or ""
    return f.startswith(str(REPO / "tests") + os.sep)


def _swapped(val, orig, new):
    """val with orig replaced by new: orig itself, or a tuple holding it (field.JUDGES, a combined
    check's parts); anything else as it is."""
    if val is orig:
        return new
    if isinstance(val, tuple) and any(x is orig for x in val):
        return tuple(new if x is orig else x for x in val)
    return val


def _replace_everywhere(orig, new) -> None:
    # what a decorator marked on the function goes with it (@reads: the facts a stage collects for it)
    for key, val in vars(orig).items():
        if not key.startswith("__") and key not in vars(new):
            setattr(new, key, val)
    mods = [m for name, m in list(sys.modules.items()) if _ours(name, m)]
    for m in mods:
        for attr, val in list(vars(m).items()):
            if _swapped(val, orig, new) is not val:
                setattr(m, attr, _swapped(val, orig, new))
    defs = sys.modules.get("p2pkit.stages.definitions")
    for st in getattr(defs, "STAGES", []):
        for f in dataclasses.fields(st):
            if getattr(st, f.name) is orig:
                object.__setattr__(st, f.name, new)
            _swap_in_closure(getattr(st, f.name), orig, new)
    for m in mods:
        for val in list(vars(m).values()):
            _swap_in_closure(val, orig, new)


def _swap_in_closure(fn, orig, new) -> None:
    """A function made by another (findings.combine: the rebar stage's check is combine(check,
    bar_assignment)) holds its parts in its closure: each cell holding the original, alone or in a
    tuple, holds the replacement instead (and `parts`, the combined check's list of them). Never the
    replacement's own closure: a traced or forced wrapper holds the original it calls."""
    if fn is new:
        return
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            val = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if _swapped(val, orig, new) is not val:
            cell.cell_contents = _swapped(val, orig, new)
    parts = getattr(fn, "parts", None)
    if isinstance(parts, tuple) and _swapped(parts, orig, new) is not parts:
        fn.parts = _swapped(parts, orig, new)


def mutate_condition(spec: str) -> None:
    mod_name, fn_name, index, value = spec.split(":")
    mod = importlib.import_module(mod_name)
    orig = getattr(mod, fn_name)
    new = mutated_function(mod, fn_name, int(index), value == "True")
    _replace_everywhere(orig, new)


def mutate(target: str) -> None:
    mod_name, fn_name = target.split(":")
    mod = importlib.import_module(mod_name)
    orig = getattr(mod, fn_name)

    def wrapper(*args, **kwargs):
        return _forced(orig(*args, **kwargs))
    wrapper.__name__ = orig.__name__
    wrapper.__wrapped__ = orig
    _replace_everywhere(orig, wrapper)


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang("a mutant ran past the guard's time for one test")


def _one(item, nxt, limit: int) -> list:
    """One item through setup, call and teardown (up to what `nxt` shares with it), unreported; a
    run past `limit` seconds is a failed call."""
    from _pytest.runner import runtestprotocol

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        return runtestprotocol(item, nextitem=nxt, log=False)
    except _Hang:
        return [_HangReport()]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


class _HangReport:
    failed = True


def _each(items: list, limit: int):
    """Every item in turn (item, its reports, its seconds), torn down at the end."""
    try:
        for i, item in enumerate(items):
            t = time.monotonic()
            reports = _one(item, items[i + 1] if i + 1 < len(items) else None, limit)
            yield item, reports, time.monotonic() - t
    finally:
        if items:
            items[0].session._setupstate.teardown_exact(None)


def _run(items: list, limit: int) -> str | None:
    """Run these items in turn until one fails: its node id, or None when all pass. Nothing is
    reported to the terminal; what the items set up is torn down before returning."""
    run = _each(items, limit)
    try:
        for item, reports, _ in run:
            if any(r.failed for r in reports):
                return item.nodeid
        return None
    finally:
        run.close()


def _codes(code) -> list:
    """A function's code object and those of the functions and comprehensions inside it."""
    out = [code]
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            out += _codes(c)
    return out


def campaign(session, plan: dict) -> dict:
    """The condition campaign of one check module (module docstring), inside this session."""
    by_test: dict[str, list] = {}
    for item in session.items:
        by_test.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    limit = int(plan.get("timeout", 300))
    funcs = plan["functions"]
    originals = {}
    for f in funcs:
        mod_name, fn_name = f["target"].split(":")
        originals[f["target"]] = (importlib.import_module(mod_name), fn_name)
    # the baseline: every item once, unmutated, the lines of each planned function it runs recorded
    codes = {}
    for target, (mod, fn_name) in originals.items():
        for code in _codes(getattr(mod, fn_name).__code__):
            codes[code] = target
    lines: dict[str, dict[str, set]] = {t: {} for t in originals}  # target -> node id -> lines run
    current: set = set()

    def local(frame, event, arg):
        if event == "line":
            current.add((codes[frame.f_code], frame.f_lineno))
        return local

    def calls(frame, event, arg):
        if frame.f_code in codes:
            current.add((codes[frame.f_code], frame.f_lineno))
            return local
        return None

    def traced(orig):  # the function as referenced, tracing its own lines while it runs
        def wrapper(*args, **kwargs):
            before = sys.gettrace()
            sys.settrace(calls)
            try:
                return orig(*args, **kwargs)
            finally:
                sys.settrace(before)
        wrapper.__name__ = orig.__name__
        wrapper.__wrapped__ = orig
        return wrapper

    wrapped = [(getattr(mod, fn_name), traced(getattr(mod, fn_name))) for mod, fn_name in originals.values()]
    for orig, w in wrapped:
        _replace_everywhere(orig, w)
    broken: set[str] = set()
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    try:  # one pass in session order: a module's fixtures set up once, as in a plain run
        for item, reports, secs in _each(session.items, limit):
            if any(r.failed for r in reports):
                broken.add(item.nodeid)
            seconds[item.nodeid] = secs
            for target, line in current:
                lines[target].setdefault(item.nodeid, set()).add(line)
            current.clear()
    finally:
        for orig, w in wrapped:
            _replace_everywhere(w, orig)
    out = {"module": plan["module"], "baseline_seconds": round(time.monotonic() - t0, 1),
           "broken": sorted(broken), "test_seconds": {k: round(v, 2) for k, v in seconds.items()}, "functions": []}
    for f in funcs:
        mod, fn_name = originals[f["target"]]
        orig = getattr(mod, fn_name)
        ran = lines[f["target"]]
        items = sorted((i for n in f["tests"] for i in by_test.get(n, [])
                        if i.nodeid not in broken and i.nodeid in ran),
                       key=lambda i: seconds[i.nodeid])  # the quickest first: a kill costs least
        res = {"target": f["target"], "tests": [i.nodeid for i in items], "conditions": []}
        t1 = time.monotonic()
        _, node = function_node(mod, fn_name)
        for index, cond in enumerate(conditions(node)):
            span = set(range(cond.lineno, (cond.end_lineno or cond.lineno) + 1))
            reach = [i for i in items if ran[i.nodeid] & span]  # a test that never ran its line cannot tell
            killed = {}
            for value in (True, False):
                new = mutated_function(mod, fn_name, index, value)
                _replace_everywhere(orig, new)
                try:
                    killer = _run(reach, limit) if reach else None
                finally:
                    _replace_everywhere(new, orig)
                killed[str(value)] = killer
            res["conditions"].append({"index": index, "killed": killed, "tests": len(reach)})
        res["seconds"] = round(time.monotonic() - t1, 1)
        out["functions"].append(res)
        print(f"guard: {f['target']}: {sum(1 for c in res['conditions'] for v in c['killed'].values() if v)} of "
              f"{2 * f['n_conditions']} killed over {len(items)} tests ({res['seconds']} s)", file=sys.stderr)
    return out


def pytest_runtestloop(session):
    plan_file = os.environ.get("P2PKIT_GUARD_PLAN")
    if not plan_file or session.config.option.collectonly:
        return None
    plan = json.loads(Path(plan_file).read_text())
    result = campaign(session, plan)
    Path(os.environ["P2PKIT_GUARD_RESULT"]).write_text(json.dumps(result, indent=2))
    return True


def pytest_configure(config) -> None:
    target = os.environ.get("P2PKIT_GUARD_MUTATE")
    cond = os.environ.get("P2PKIT_GUARD_COND")
    if target or cond:
        import p2pkit.stages.definitions  # noqa: F401 (built now, so its references are replaced too)

        if target:
            mutate(target)
        else:
            mutate_condition(cond)
