"""The run loop as named steps (issue 39 item 4): what a stage's act did is handed to its proof and its
reboot hook, never left in ctx.options; the reboot loop and its budget are a use case in app/ (the CLI
parses and prints); a failed run keeps the recorded profile once a stage past preflight has started."""

from __future__ import annotations

import ast
from pathlib import Path

from p2pkit.app import pipeline
from p2pkit.app.reboot import up_with_reboots
from p2pkit.core import config, hoststate
from p2pkit.core.artifacts import Store
from p2pkit.core.errors import Exit
from p2pkit.core.output import Output
from p2pkit.host import Host
from p2pkit.sim.render import load_state, save
from p2pkit.stages.p2p_module import checks as p2p_module

PKG = Path(__file__).resolve().parent.parent / "p2pkit"


def ctx_for(root: Path, state: Path | None = None) -> pipeline.Ctx:
    h = Host.at(root)
    return pipeline.Ctx(profile=config.load(h.sim["profile"]), host=h, store=Store(state or root / "var/lib/p2pkit"),
                        out=Output())


def test_no_module_reads_what_an_act_did_from_ctx_options():
    """ctx.options carries run options (force, full_hash), never what a stage's act did."""
    found = []
    for f in PKG.rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            # ctx.options["acted"], ctx.options.get("acted"): a subscript or a call on `.options` naming it
            on_options = (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute)
                          and n.value.attr == "options" and getattr(n.slice, "value", None) == "acted") or \
                         (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                          and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "options"
                          and any(getattr(a, "value", None) == "acted" for a in n.args))
            if on_options:
                found.append(f"{f.relative_to(PKG)}:{n.lineno}")
    assert found == []
    tree = ast.parse('ctx.options["acted"] = {}\nx = ctx.options.get("acted")\n')  # the scan sees both forms
    assert sum(isinstance(n, ast.Subscript | ast.Call) and "acted" in ast.unparse(n) for n in ast.walk(tree)) == 2


def test_the_reboot_hook_is_handed_what_the_act_did(sim, monkeypatch):
    ctx = ctx_for(sim("healthy"))
    monkeypatch.setattr(p2p_module, "reboot_reason", lambda f, p: ("the command line changes at boot", ["p2p.iommu"]))
    assert p2p_module.reboot_with_note({}, ctx, {}) == ("the command line changes at boot", ["p2p.iommu"])
    noted = p2p_module.reboot_with_note({}, ctx, {"live_reload": {"why": "Xorg holds the GPUs"}})
    assert noted == ("the command line changes at boot (no live reload: Xorg holds the GPUs)", ["p2p.iommu"])


def test_up_with_its_reboots_runs_without_the_cli(sim):
    """The reboot loop is app/'s: a simulated host reboots in place within the budget and the stages go on;
    the budget is cleared when the run passes."""
    root = sim("healthy")
    ctx = ctx_for(root)
    res = up_with_reboots(ctx, None, "p2p-module", reboot=True, max_reboots=1)
    assert res.code == Exit.OK and res.ran == ["preflight", "driver", "p2p-module"] and not res.going_down
    assert res.message == "ran preflight, driver, p2p-module; all selected stages passed"
    assert hoststate.reboot_budget(ctx.store.dir) is None
    doc = ctx.store.read("p2p-module")
    assert doc["acted"]["after_reboot"].startswith("nothing") and doc["before_reboot"]["boot_id"]


def test_a_spent_budget_stops_the_loop_and_says_what_to_do(sim):
    root = sim("healthy")
    ctx = ctx_for(root)
    res = up_with_reboots(ctx, None, "p2p-module", reboot=True, max_reboots=0)
    assert res.code == Exit.CHECK_FAILED and res.message.startswith("reboot budget spent")
    assert "--yes up --reboot" in res.hint and hoststate.reboot_budget(ctx.store.dir, exhausted=True)


def test_a_failed_run_keeps_the_profile_once_a_stage_past_preflight_started(sim, tmp_path):
    """The record is put back only when nothing past preflight started (issue 39: `up` used to read this from
    the last stage's `acted`, so a run whose last stage acts on nothing, rebar here, put the record back although
    the stages before it had run with this profile)."""
    root = sim("p2p-up")
    state = load_state(root)
    for g in state["gpus"]:
        g["bar1_bytes"] = 256 << 20  # Resizable BAR off: the rebar stage fails, having acted on nothing
    save(root, state)
    ctx = ctx_for(root, tmp_path / "state")
    res = pipeline.up(ctx, None, "rebar")
    assert res.code == Exit.CHECK_FAILED and res.ran[-1] == "rebar" and "driver" in res.ran
    assert ctx.store.read("rebar")["acted"] == {}
    assert (ctx.store.dir / hoststate.PROFILE_FILE).is_file()
    # refused at preflight (nothing past it started): the record is put back, here: none again
    other = ctx_for(sim("wrong-os"), tmp_path / "state2")
    assert pipeline.up(other).code == Exit.CHECK_FAILED
    assert not (other.store.dir / hoststate.PROFILE_FILE).exists()
