"""`p2pkit restore`: after an upgrade, put the pinned driver and the patched module back.

Re-checks the driver and p2p-module gates. On drift (the userspace driver replaced, a new kernel
without the patched module, a stock module winning) it re-runs what those stages do, for the
target kernel, from the cached installer and source, proves the result again, and records what it
did under <state>/restore/. It never touches the engine build or the model.
"""

from __future__ import annotations

import datetime as dt
import json
import os

from p2pkit.app import pipeline
from p2pkit.core import safefs
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.errors import Exit
from p2pkit.core.lock import state_lock
from p2pkit.facts import collect as facts
from p2pkit.host import kmod, system
from p2pkit.rules.findings import FAIL, Check, worst
from p2pkit.stages import get
from p2pkit.stages.driver import act as driver_act
from p2pkit.stages.p2p_module import act as acting
from p2pkit.stages.p2p_module import checks as p2p_module

SAFEGUARDS = ("driver.guards", "driver.holds")  # put back by the driver stage alone: no module rebuild


def module_for_kernel(ctx, kernel: str) -> list[Check]:
    """The p2p-module install checks for a kernel that is not running (what modprobe would load)."""
    f = {"kernel": kernel, "module": kmod.modinfo(ctx.host, kernel),
         **facts.collect(ctx.host, ["built_module", "restore_guards"], ctx.profile)}
    return p2p_module.install_checks(f, ctx.profile)


def gate_checks(ctx, kernel: str, running: str) -> dict[str, list[Check]]:
    out = {}
    for name in ("driver", "p2p-module"):
        st = get(name)
        if name == "p2p-module" and kernel != running:
            out[name] = module_for_kernel(ctx, kernel)
            continue
        out[name] = pipeline.prove(ctx, st)[1]
    return out


def restore(ctx, kernel: str | None = None) -> tuple[Exit, dict]:
    running = system.kernel_release(ctx.host)
    target = kernel or running
    record: dict = {"kind": "p2pkit-restore", "simulated": ctx.host.simulated, "running_kernel": running,
                    "target_kernel": target, "started": pipeline.now(), "actions": []}
    with state_lock(ctx.store.dir, say=ctx.out.warn, root=ctx.host.root):
        if engine_mark(ctx).is_file():  # a restore killed while the engine was stopped
            ctx.out.warn("a restore that was killed left the engine stopped: starting it again first")
            _engine(ctx, "start")
            engine_mark(ctx).unlink(missing_ok=True)
            record["actions"].append({"engine_service": "started again (a killed restore had stopped it)"})
        before = gate_checks(ctx, target, running)
        record["drift"] = {n: [c.as_dict() for c in cs if c.status == FAIL] for n, cs in before.items()}
        drifted = [n for n, cs in before.items() if worst(cs) == FAIL]
        if "driver" in drifted and any(c["id"] not in SAFEGUARDS for c in record["drift"]["driver"]):
            drifted = ["driver", "p2p-module"]  # a new userspace driver needs its module rebuilt too
        if not drifted:
            ctx.out.step("restore", f"no drift: the pinned driver and the patched module hold for kernel {target}")
        engine_was_running = bool(drifted) and target == running and _stop_engine(ctx)
        if engine_was_running:
            record["actions"].append({"engine_service": "stopped for the rebuild"})
        try:
            code, after = _act(ctx, record, drifted, target, running)
        finally:  # an error, Ctrl-C or SIGTERM too: the engine goes back to the state restore found it in
            if engine_was_running:
                _engine(ctx, "start")
                engine_mark(ctx).unlink(missing_ok=True)
                record["actions"].append({"engine_service": "started again"})
        if code == Exit.OK and target != running:
            lift_hold(ctx, record, target, after)
        record["after"] = {n: [c.as_dict() for c in cs] for n, cs in after.items()}
        record["next"] = next_command(ctx) if code == Exit.OK else None
        record["finished"] = pipeline.now()
        record["exit_code"] = int(code)
        d = safefs.makedirs(ctx.store.dir / "restore")  # no link on the way (issue 48 item 1)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        atomic_write(d / f"{stamp}.json", (json.dumps(record, indent=2, default=str) + "\n").encode())
    return code, record


def lift_hold(ctx, record: dict, target: str, after: dict) -> None:
    """P36: the kernel hook held the boot default at the running kernel because the module did not build for
    `target`; with the module proven for it now, the hold goes and update-grub runs (after a headers package's
    hook, or a restore run by hand, nothing else runs it), and GRUB's default is read back: the next boot
    starts `target`."""
    if any(worst(cs) == FAIL for cs in after.values()):
        return
    hold = ctx.host.path(system.BOOT_HOLD)
    if not hold.is_file() or f"# p2pkit-new_kernel={target}\n" not in hold.read_text() + "\n":
        return
    ctx.out.step("restore", f"the module holds for kernel {target}: lifting the boot-default hold (P36) and "
                 "running update-grub")
    hold.unlink()
    ctx.host.runner.run(["update-grub"])
    nxt = kmod.pending_kernel(ctx.host)
    record["actions"].append({"boot_default": f"hold for {target} lifted; update-grub: {nxt.get('boot_image')}"})
    if nxt.get("kernel") != target:
        ctx.out.warn(f"after update-grub the next boot starts {nxt.get('kernel') or nxt.get('running')}, not "
                     f"{target} ({nxt.get('boot_image')}): GRUB_DEFAULT in /etc/default/grub names another entry")


def next_command(ctx) -> dict | None:
    """What restore leaves to `up`: the stages that are not done now (after a reboot into a new kernel,
    every artifact was proven on the old one) and the one command that proves them again; None when
    every stage is done. Restore itself never touches the later stages (the engine, the model)."""
    states = pipeline.evaluate(ctx, recheck=False)
    todo = [s for s in states if s.state != pipeline.DONE]
    if not todo:
        return None
    first = todo[0]
    return {"not_done": [s.stage for s in todo],
            "first": {"stage": first.stage, "state": first.state, "reason": first.reason},
            "fix": pipeline.gate_fix(ctx, states, None)}


def _act(ctx, record: dict, drifted: list[str], target: str, running: str) -> tuple[Exit, dict]:
    code = Exit.OK
    if target == running:
        # act and prove the way the stages do; their artifacts stay true (later stages go stale)
        for name in drifted:
            why = ", ".join(c["id"] for c in record["drift"].get(name, [])) or "the driver before it"
            ctx.out.step("restore", f"{name} drifted ({why}): running the {name} stage again for kernel {target}")
            doc = pipeline.run_stage(ctx, get(name), "preflight" if name == "driver" else "driver")
            record["actions"].append({name: doc["acted"]})
            pipeline.report_checks(ctx.out, name, doc["checks"])
            if doc["status"] == pipeline.REBOOT:
                code = Exit.REBOOT
                record["reboot"] = doc["reboot"]["why"]
            elif doc["status"] == "failed":
                code = Exit.CHECK_FAILED
                break
        return code, gate_checks(ctx, target, running)
    if "driver" in drifted:
        ctx.out.step("restore", "the userspace driver drifted: installing the pinned one again")
        record["actions"].append({"driver": driver_act.driver(ctx)})
    if "p2p-module" in drifted:
        ctx.out.step("restore", f"building the P2P-patched module for kernel {target} (not running yet)")
        record["actions"].append({"p2p-module": acting.p2p_module(ctx, kernel=target)})
    after = gate_checks(ctx, target, running)
    for name, cs in after.items():
        pipeline.report_checks(ctx.out, name, [c.as_dict() for c in cs])
    if any(worst(cs) == FAIL for cs in after.values()):
        code = Exit.CHECK_FAILED
    return code, after


def engine_mark(ctx):
    """Where restore records that it stopped a running engine, before it stops it."""
    return ctx.store.dir / "restore" / "engine-was-running"


def _stop_engine(ctx) -> bool:
    """Record that the engine ran, then stop it: a restore killed after this point leaves the mark,
    and the next restore starts the engine before anything else."""
    from p2pkit.stages.service.act import unit_alive

    if not ctx.host.path(system.ENGINE_UNIT_FILE).is_file() or not unit_alive(ctx.host):
        return False
    safefs.makedirs(engine_mark(ctx).parent)
    said = f"{system.ENGINE_UNIT} was running when restore (pid {os.getpid()}) stopped it\n"
    atomic_write(engine_mark(ctx), said.encode())
    return _engine(ctx, "stop")


def _engine(ctx, action: str) -> bool:
    """Stop the engine service around a rebuild (it holds the GPUs), start it after. Never touches
    the engine build or the model. Returns whether it acted."""
    from p2pkit.stages.service.act import unit_alive

    if not ctx.host.path(system.ENGINE_UNIT_FILE).is_file():
        return False
    if action == "stop" and not unit_alive(ctx.host):
        return False
    ctx.out.step("restore", f"{action} {system.ENGINE_UNIT}")
    ctx.host.runner.run(["systemctl", action, system.ENGINE_UNIT])
    return True
