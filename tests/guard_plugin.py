"""pytest plugin for bench/check_guard.py: forces one check function of p2pkit/checks to pass.

Loaded with `-p tests.guard_plugin` and P2PKIT_GUARD_MUTATE=module:function (like
p2pkit.checks.engine:_result). Every Check the function returns (alone or in a list) that is not a
pass or a skip comes back as a pass with no hint, as if the check had been made to always pass.
The function is replaced everywhere it is referenced: the module, every p2pkit module that
imported it by name, and the stage registry. Loaded before conftest, so before the tests import.

With P2PKIT_GUARD_COND=module:function:INDEX:VALUE instead, one condition inside the function is
replaced by the constant VALUE (True or False): `conditions` numbers them in source order (each operand
of an `and`/`or`, each `if` test and comprehension filter, each comparison), and the function is
recompiled from its source with that one node replaced, then put everywhere the original was.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import sys


def _forced(result):
    from p2pkit.checks import PASS, SKIP, Check

    if isinstance(result, Check):
        return result if result.status in (PASS, SKIP) else dataclasses.replace(result, status=PASS, hint="")
    if isinstance(result, list):
        return [_forced(x) for x in result]
    return result


def conditions(fn: ast.FunctionDef) -> list[ast.expr]:
    """The conditions of a function, in source order, each once: every operand of an `and`/`or`, every
    `if`/`while`/conditional-expression test and comprehension filter, every comparison. Nested
    functions count as the function's own (a local helper's conditions are the check's)."""
    found: dict[int, ast.expr] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.BoolOp):
            for v in node.values:
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


def _replace_everywhere(orig, new) -> None:
    for m in [m for name, m in list(sys.modules.items()) if name.startswith("p2pkit") and m is not None]:
        for attr, val in list(vars(m).items()):
            if val is orig:
                setattr(m, attr, new)
    defs = sys.modules.get("p2pkit.stages.definitions")
    for st in getattr(defs, "STAGES", []):
        for f in dataclasses.fields(st):
            if getattr(st, f.name) is orig:
                object.__setattr__(st, f.name, new)
    for m in [m for name, m in list(sys.modules.items()) if name.startswith("p2pkit") and m is not None]:
        for attr, val in list(vars(m).items()):  # tuples of judges (field.JUDGES)
            if isinstance(val, tuple) and any(x is orig for x in val):
                setattr(m, attr, tuple(new if x is orig else x for x in val))


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


def pytest_configure(config) -> None:
    target = os.environ.get("P2PKIT_GUARD_MUTATE")
    cond = os.environ.get("P2PKIT_GUARD_COND")
    if target or cond:
        import p2pkit.stages.definitions  # noqa: F401 (built now, so its references are replaced too)

        if target:
            mutate(target)
        else:
            mutate_condition(cond)
