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
    """driver.holds (conditions: failed(h), the package filter, the held filter, `unheld`) over a test
    that calls it and one that does not: the non-caller is left out; removing `failed(h)` either way
    breaks the caller (True: every input unknown; False: the error dict read as a package list)."""
    plan = {"module": "driver", "timeout": 120, "functions": [
        {"target": "p2pkit.checks.driver:holds", "n_conditions": 4, "tests": [HOLDS_TEST, NOT_A_CALLER]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "P2PKIT_GUARD_PLAN": str(tmp_path / "plan.json"),
           "P2PKIT_GUARD_RESULT": str(tmp_path / "result.json"), "P2PKIT_FAST": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.guard_plugin",
                        "-n", "0", HOLDS_TEST, NOT_A_CALLER], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["broken"] == [] and set(res["test_seconds"]) == {HOLDS_TEST, NOT_A_CALLER}
    (f,) = res["functions"]
    assert f["tests"] == [HOLDS_TEST]
    assert [c["index"] for c in f["conditions"]] == [0, 1, 2, 3]
    assert f["conditions"][0]["killed"] == {"True": HOLDS_TEST, "False": HOLDS_TEST}
    assert "guard: p2pkit.checks.driver:holds:" in r.stderr
