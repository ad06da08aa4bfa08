"""Which checks a test guards: force each check function of p2pkit/checks to pass, in turn, and run
the tests that should catch it. A check is guarded when at least one of them then fails.

    python3 bench/check_guard.py                 # fast tests only (the default; minutes on 2 cores)
    python3 bench/check_guard.py --slow          # end-to-end tests too, for checks no fast test catches
    python3 bench/check_guard.py --only engine   # the check functions of one module (or module:function)
    python3 bench/check_guard.py --json out.json
    python3 bench/check_guard.py --conditions --only field   # condition by condition (below)
    python3 bench/check_guard.py --conditions --markdown docs/guards.md   # the doc, from the result

A check function is a function in p2pkit/checks/*.py whose return annotation names Check. Forcing it
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
CHECKS = REPO / "p2pkit/checks"
TESTS = REPO / "tests"
MAKERS = {"judge", "Check", "unknown", "not_measured"}
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
                ids |= _literal_prefix(call.args[0])
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


def check_functions(only: str | None = None) -> list[dict]:
    """Every function of p2pkit/checks whose return annotation names Check, with the ids it writes."""
    out = []
    for path in sorted(CHECKS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        src = path.read_text()
        tree = ast.parse(src)
        aliases = _module_aliases(tree)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.returns is None:
                continue
            if "Check" not in ast.unparse(node.returns):
                continue
            ids = set()
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) in MAKERS and call.args:
                    ids |= _literal_prefix(call.args[0])
            calls = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            for c in ast.walk(node):  # engine_cmd.validate(p) and the like: the other module's ids
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and \
                        isinstance(c.func.value, ast.Name) and c.func.value.id in aliases:
                    ids |= _ids_in(aliases[c.func.value.id], c.func.attr)
            name = f"p2pkit.checks.{path.stem}:{node.name}"
            if only and not {path.stem, name.split(":", 1)[1], name, f"{path.stem}:{node.name}"} & set(only.split(",")):
                continue
            out.append({"target": name, "module": path.stem, "function": node.name, "ids": sorted(ids),
                        "calls": calls, "node": node})
    by_name = {(f["module"], f["function"]): f for f in out}
    for f in out:  # a function that gathers others (check, precheck) is caught by what catches them
        for c in sorted(f.pop("calls")):
            if (f["module"], c) in by_name and c != f["function"]:
                f["ids"] = sorted(set(f["ids"]) | set(by_name[(f["module"], c)]["ids"]))
    return out


def _literal_prefix(arg: ast.expr) -> set[str]:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        return {prefix} if len(prefix) > 4 else set()
    return set()


def test_functions() -> list[dict]:
    """Every test function: its node id, whether it is slow, and its source (decorators included)."""
    out = []
    for path in sorted(TESTS.glob("test_*.py")):
        src = path.read_text()
        tree = ast.parse(src)
        module_slow = "pytestmark = pytest.mark.slow" in src
        lines = src.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
                text = "\n".join(lines[start:node.end_lineno])
                slow = module_slow or "mark.slow" in text.split("def ", 1)[0]
                out.append({"node": f"tests/{path.name}::{node.name}", "slow": slow, "text": text})
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
    src = ast.get_source_segment((CHECKS / f"{fn['module']}.py").read_text(), fn["node"]) or ""
    return set(PITFALL.findall(src))


def scenarios_naming(pitfalls: set[str]) -> list[str]:
    from p2pkit.sim.scenarios import SCENARIOS

    return [name for name, (desc, _) in SCENARIOS.items() if set(PITFALL.findall(desc)) & pitfalls]


def relevant_tests(fn: dict, tests: list[dict]) -> list[dict]:
    """The tests that exercise a check however they name it: by its ids or name (tests_for), every
    test of its module's test file, and those naming one of its pitfalls or a scenario that does."""
    named = {t["node"] for t in tests_for(fn, tests)}
    pits = pitfalls_of(fn)
    needles = [re.compile(rf"\b{p}\b") for p in pits]
    needles += [re.compile(re.escape(f'"{s}"')) for s in scenarios_naming(pits)]
    own = re.compile(rf"^tests/test_{re.escape(fn['module'])}(_\w+)?\.py::")
    return [t for t in tests if t["node"] in named or own.match(t["node"])
            or any(n.search(t["text"]) for n in needles)]


def condition_list(fn: dict) -> list[dict]:
    """Each condition of the function: its index, line and source."""
    import importlib

    from tests.guard_plugin import conditions, function_node

    mod = importlib.import_module(fn["target"].split(":")[0])
    _, node = function_node(mod, fn["function"])
    src = (CHECKS / f"{fn['module']}.py").read_text()
    return [{"index": i, "line": c.lineno, "source": ast.get_source_segment(src, c) or ast.unparse(c)}
            for i, c in enumerate(conditions(node))]


def conditions_run(fns: list[dict], a) -> dict:
    """Every condition of every function replaced by True, then False; its tests run on each mutant."""
    tests = test_functions()
    total = killed = 0
    t_all = time.monotonic()
    for fn in fns:
        chosen = [t for t in relevant_tests(fn, tests) if a.slow or not t["slow"]]
        broken = baseline([t["node"] for t in chosen], a.timeout * 4)
        nodes = [t["node"] for t in chosen if t["node"] not in broken]
        fn["tests"] = nodes
        fn["conditions"] = condition_list(fn)
        fn["survivors"] = []
        for c in fn["conditions"]:
            c["killed"] = {}
            for value in (True, False):
                total += 1
                spec = f"{fn['target']}:{c['index']}:{value}"
                rc, out, _ = pytest(nodes, None, a.timeout, cond=spec) if nodes else (5, "", 0.0)
                if rc not in (0, 5):
                    killed += 1
                    failed = re.search(r"^FAILED (\S+)", out, re.M)
                    c["killed"][str(value)] = failed.group(1) if failed else f"exit {rc}"
                else:
                    c["killed"][str(value)] = None
                    fn["survivors"].append({"line": c["line"], "source": c["source"], "as": value})
        n = 2 * len(fn["conditions"])
        print(f"{n - len(fn['survivors']):3} of {n:3} killed  {fn['target']} ({len(nodes)} tests"
              + (f"; {len(broken)} failing unmutated left out" if broken else "") + ")", file=sys.stderr)
    print(f"{killed} of {total} condition mutants killed in {len(fns)} check functions "
          f"({'fast and slow' if a.slow else 'fast'} tests, {time.monotonic() - t_all:.0f} s)")
    for fn in fns:
        for sv in fn["survivors"]:
            print(f"  survives: {fn['target']} line {sv['line']}: `{sv['source']}` as {sv['as']}")
    return {"killed": killed, "total": total, "functions": [
        {k: v for k, v in fn.items() if k != "node"} for fn in fns]}


DOC_HEAD = """# Which checks a test guards

<!-- Generated by `python3 bench/check_guard.py --conditions --markdown docs/guards.md`: do not edit by hand. -->

A check nobody tests can rot silently. `bench/check_guard.py` measures it for every check function in
`p2pkit/checks` (a function whose return annotation names `Check`) at two depths:

- the function (the default): `tests/guard_plugin.py` forces it to pass (every fail, warn or pending it
  returns comes back as a pass without a hint) and runs the tests that name its check ids or itself;
- each condition inside it (`--conditions`): every operand of an `and`/`or`, every `if` test and
  comprehension filter, every comparison is replaced by True, then by False, one at a time (the
  function recompiled from its source with that node replaced, put wherever the original is
  referenced), and its tests run on each mutant: those naming its ids or itself, every test of
  `tests/test_<module>*.py`, and those naming a pitfall it judges or a simulated scenario whose
  description names that pitfall. A mutant under which every one of them passes survives: no test
  notices that condition going away.

Tests that fail unmutated are left out (a baseline run per function) and named. Fast tests by default;
`--slow` adds the end-to-end ones, `--only MODULE[,MODULE:FUNCTION]` narrows the run.

What it cannot see: a check judged only in another process (an Ansible-run `p2pkit verify` on a lab
host, the kernel postinst hook's `p2pkit restore`); and whether a test fails for the right reason (the
tests assert the check's id, status, pitfall and measured value). A surviving mutant can be an
equivalent one: a condition that cannot change the result (say, a guard that an earlier line already
ensured); the list below names each survivor so that a reader can tell which.
"""


def markdown(res: dict, a) -> str:
    fns = res["functions"]
    mods = sorted({f["module"] for f in fns})
    out = [DOC_HEAD, "## The last run\n",
           f"`python3 bench/check_guard.py --conditions{' --slow' if a.slow else ''}"
           f"{' --only ' + a.only if a.only else ''}` on {time.strftime('%Y-%m-%d')}: "
           f"**{res['killed']} of {res['total']} condition mutants killed** in {len(fns)} check functions of "
           f"{', '.join(mods)} ({'fast and slow' if a.slow else 'fast'} tests).\n",
           "| check function | conditions | mutants killed | tests run |", "|---|---|---|---|"]
    for f in fns:
        n = 2 * len(f["conditions"])
        out.append(f"| {f['module']}:{f['function']} | {len(f['conditions'])} | {n - len(f['survivors'])} of {n} "
                   f"| {len(f['tests'])} |")
    survivors = [(f, s) for f in fns for s in f["survivors"]]
    out.append("\n## Surviving mutants\n")
    if not survivors:
        out.append("None.")
    for f, sv in survivors:
        src = " ".join(sv["source"].split())
        out.append(f"- {f['module']}:{f['function']}, line {sv['line']}: `{src}` replaced by {sv['as']}")
    return "\n".join(out) + "\n"


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
    ap.add_argument("--only", help="one module of p2pkit/checks (engine) or module:function")
    ap.add_argument("--json", type=Path, help="write the result here as JSON")
    ap.add_argument("--timeout", type=int, default=900, help="seconds for one pytest run")
    ap.add_argument("--conditions", action="store_true", help="mutate each condition inside each check instead")
    ap.add_argument("--markdown", type=Path, help="with --conditions: write this result as docs/guards.md's table")
    a = ap.parse_args(argv)
    fns = check_functions(a.only)
    if a.conditions:
        res = conditions_run(fns, a)
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
