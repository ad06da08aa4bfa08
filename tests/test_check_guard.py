"""bench/check_guard.py's condition mode and tests/guard_plugin.py's campaign: what counts as a
condition, and one module's campaign inside one pytest session (callers recorded, non-callers left
out, each mutant applied and undone in turn)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from tests.conftest import REPO
from tests.guard_plugin import conditions

HOLDS_TEST = "tests/test_pitfalls.py::test_an_unheld_nvidia_package_is_p02_with_restore_as_the_fix"
NOT_A_CALLER = "tests/test_pitfalls.py::test_guarded_packages_are_the_driver_playbooks"


def test_conditions_are_operands_tests_filters_and_comparisons_not_literal_defaults():
    fn = ast.parse('def f(x, ys):\n'
                   '    if x and g(x):\n'
                   '        return [y for y in ys if y > 1] or ["none"]\n'
                   '    return h(x) or "nothing"\n').body[0]
    got = [ast.unparse(c) for c in conditions(fn)]
    assert got == ["x and g(x)", "x", "g(x)", "y > 1", "h(x)"]


def test_one_modules_campaign_runs_in_one_session(tmp_path):
    """driver.holds (conditions: failed(h), the package filter, the held filter) over a test
    that calls it and one that does not: the non-caller is left out; removing `failed(h)` either way
    breaks the caller (True: every input unknown; False: the error dict read as a package list)."""
    plan = {"module": "driver", "timeout": 120, "functions": [
        {"target": "p2pkit.stages.driver.checks:holds", "n_conditions": 3, "tests": [HOLDS_TEST, NOT_A_CALLER]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {k: v for k, v in os.environ.items() if k not in ("P2PKIT_GUARD_MUTATE", "P2PKIT_GUARD_COND")}
    env |= {"P2PKIT_GUARD_PLAN": str(tmp_path / "plan.json"), "P2PKIT_GUARD_RESULT": str(tmp_path / "result.json"),
            "P2PKIT_FAST": "1"}  # the campaign's own, never a guard run's mutant around this test
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.guard_plugin",
                        "-n", "0", HOLDS_TEST, NOT_A_CALLER], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["broken"] == [] and set(res["test_seconds"]) == {HOLDS_TEST, NOT_A_CALLER}
    (f,) = res["functions"]
    assert f["tests"] == [HOLDS_TEST]
    assert [c["index"] for c in f["conditions"]] == [0, 1, 2]
    assert f["conditions"][0]["killed"] == {"True": HOLDS_TEST, "False": HOLDS_TEST}
    assert "guard: p2pkit.stages.driver.checks:holds:" in r.stderr


def _fn(target: str, killed: list[tuple[str | None, str | None]]) -> dict:
    dotted, function = target.split(":")
    parts = dotted.split(".")
    module = parts[-2] if parts[-1] == "checks" else parts[-1]  # a stage's checks.py is named by its stage
    conds = [{"index": i, "line": 10 + i, "source": f"c{i}", "killed": {"True": t, "False": f}}
             for i, (t, f) in enumerate(killed)]
    survivors = [{"line": c["line"], "source": c["source"], "as": v == "True"} for c in conds
                 for v in ("True", "False") if not c["killed"][v]]
    return {"target": target, "module": module, "function": function, "tests": ["t"], "conditions": conds,
            "survivors": survivors}


def test_doc_from_saved_results_a_module_run_again_replaces_the_first(tmp_path, monkeypatch):
    """--from-json twice: the second result's functions replace the first's; the figure counts
    conditions caught both ways, one way, neither, and marks the equivalent survivors."""
    sys.path.insert(0, str(REPO / "bench"))
    import check_guard

    monkeypatch.setitem(check_guard.EQUIVALENT, ("rebar:check", "c1", False), "a reason")
    first = {"seconds": 100, "modules": {"rebar": {"seconds": 60}, "driver": {"seconds": 40}}, "functions": [
        _fn("p2pkit.stages.rebar.checks:check", [(None, None)]),
        _fn("p2pkit.stages.driver.checks:holds", [("t", "t"), ("t", None)])]}
    again = {"seconds": 30, "modules": {"rebar": {"seconds": 30}}, "functions": [
        _fn("p2pkit.stages.rebar.checks:check", [("t", "t"), ("t", None)])]}
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(again))
    out = tmp_path / "guards.md"
    assert check_guard.main(["--from-json", str(tmp_path / "a.json"), "--from-json", str(tmp_path / "b.json"),
                             "--markdown", str(out)]) == 0
    doc = out.read_text()
    assert "**4 conditions** in 2 check functions of 2 modules (driver, rebar)" in doc
    assert "**2 of them caught both ways**" in doc and "2 one way only, 0 neither" in doc
    assert "**6 of 8 mutants killed**; of the 2 survivors, 1 are equivalent" in doc and "1 are gaps" in doc
    assert "(rebar run again" in doc and "70 s on two shared cores" in doc
    assert "- line 11: `c1` replaced by False (equivalent: a reason)" in doc
    assert "- line 11: `c1` replaced by False\n" in doc  # driver's, not marked


def test_a_test_file_that_imports_the_check_module_is_its_own():
    """The field checks' tests live in tests/test_field.py, not test_link*.py: a test of a file that
    imports the check's module exercises it however the file is named; a scenario-wide one does not."""
    sys.path.insert(0, str(REPO / "bench"))
    import check_guard

    fn = {"ids": ["field.gpu_wedged"], "function": "wedged", "module": "link", "path": "p2pkit/stages/link/checks.py",
          "node": None}
    imports = {"p2pkit.stages.link", "p2pkit.stages.link.checks"}
    tests = [{"node": "tests/test_field.py::test_x", "text": "def test_x():\n    assert 1", "imports": imports},
             {"node": "tests/test_field.py::test_y", "text": "def test_y(sim):\n    sim('healthy')",
              "imports": imports},
             {"node": "tests/test_other.py::test_z", "text": "def test_z():\n    assert 1", "imports": set()}]
    import unittest.mock as um

    with um.patch.object(check_guard, "pitfalls_of", return_value=set()):
        got = [t["node"] for t in check_guard.relevant_tests(fn, tests)]
    assert got == ["tests/test_field.py::test_x"]


def test_a_replaced_check_keeps_what_its_decorator_marked():
    """A traced, forced or mutated check keeps its @reads marks: a stage collects its facts from them,
    and without them every test of that stage fails unmutated (and is left out of the campaign)."""
    from tests import guard_plugin

    def orig():
        return 1

    orig.reads, orig.given = ("kernel_log",), ()

    def new():
        return 2

    guard_plugin._replace_everywhere(orig, new)
    assert (new.reads, new.given) == (("kernel_log",), ())


def test_a_replaced_check_reaches_the_stage_check_that_combines_it():
    """The rebar stage's check is findings.combine(rebar.check, rebar.bar_assignment): the parts live in
    the combined function's closure, out of reach of a module attribute. A replaced part is the one the
    stage runs (before, a test through the stage never ran the mutant, and every rebar mutant it could
    have caught survived)."""
    from p2pkit.core import config
    from p2pkit.stages import definitions
    from p2pkit.stages.rebar import checks as rebar
    from tests import guard_plugin

    stage = next(s for s in definitions.STAGES if s.name == "rebar")
    orig = rebar.bar_assignment
    marker = object()

    def new(f, p):
        return [marker]

    try:
        guard_plugin._replace_everywhere(orig, new)
        assert rebar.bar_assignment is new
        assert new in stage.check.parts and orig not in stage.check.parts
        # what the stage runs: its own check's findings (facts it could not read), then the replacement's
        got = stage.check({}, config.load("dual-5090-ninfer"))
        assert got[-1] is marker, got
    finally:
        guard_plugin._replace_everywhere(new, orig)
    assert orig in stage.check.parts and rebar.bar_assignment is orig


def test_a_wrapper_put_in_place_of_a_check_still_calls_the_original():
    """The traced and forced wrappers hold the check they wrap in their own closure: replacing the check
    by its wrapper must not make the wrapper call itself (every call a RecursionError, every test
    'failing unmutated')."""
    from p2pkit.core import config
    from p2pkit.stages import definitions
    from p2pkit.stages.rebar import checks as rebar
    from tests import guard_plugin

    stage = next(s for s in definitions.STAGES if s.name == "rebar")
    orig = rebar.bar_assignment
    seen = []

    def wrapper(f, p):
        seen.append(1)
        return orig(f, p)

    try:
        guard_plugin._replace_everywhere(orig, wrapper)
        stage.check({}, config.load("dual-5090-ninfer"))
        assert seen == [1]
    finally:
        guard_plugin._replace_everywhere(wrapper, orig)
