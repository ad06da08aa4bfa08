"""pytest plugin for bench/check_guard.py: forces one check function of p2pkit/checks to pass.

Loaded with `-p tests.guard_plugin` and P2PKIT_GUARD_MUTATE=module:function (like
p2pkit.checks.engine:_result). Every Check the function returns (alone or in a list) that is not a
pass or a skip comes back as a pass with no hint, as if the check had been made to always pass.
The function is replaced everywhere it is referenced: the module, every p2pkit module that
imported it by name, and the stage registry. Loaded before conftest, so before the tests import.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys


def _forced(result):
    from p2pkit.checks import PASS, SKIP, Check

    if isinstance(result, Check):
        return result if result.status in (PASS, SKIP) else dataclasses.replace(result, status=PASS, hint="")
    if isinstance(result, list):
        return [_forced(x) for x in result]
    return result


def mutate(target: str) -> None:
    mod_name, fn_name = target.split(":")
    mod = importlib.import_module(mod_name)
    orig = getattr(mod, fn_name)

    def wrapper(*args, **kwargs):
        return _forced(orig(*args, **kwargs))
    wrapper.__name__ = orig.__name__
    wrapper.__wrapped__ = orig
    for m in [m for name, m in list(sys.modules.items()) if name.startswith("p2pkit") and m is not None]:
        for attr, val in list(vars(m).items()):
            if val is orig:
                setattr(m, attr, wrapper)
    defs = sys.modules.get("p2pkit.stages.definitions")
    for st in getattr(defs, "STAGES", []):
        for f in dataclasses.fields(st):
            if getattr(st, f.name) is orig:
                object.__setattr__(st, f.name, wrapper)


def pytest_configure(config) -> None:
    target = os.environ.get("P2PKIT_GUARD_MUTATE")
    if target:
        import p2pkit.stages.definitions  # noqa: F401 (built now, so its references are replaced too)

        mutate(target)
