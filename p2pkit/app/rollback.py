"""`p2pkit rollback p2p-module|driver`: back to the stock driver, from the stages' backups.

A plan first; `--yes` to act. Never deletes the engine build, the model or the state history
(logs, restore records, backups are kept; a rolled-back backup is renamed, not removed).
"""

from __future__ import annotations

import datetime as dt
import json

from p2pkit.app import pipeline
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.errors import Exit, GateError, P2pkitError
from p2pkit.core.lock import state_lock
from p2pkit.host import system
from p2pkit.host.backup import Backup
from p2pkit.stages import names

TIMER = "p2pkit-restore.timer"


def _root_arg(ctx) -> str:
    return str(ctx.host.root)


def plan(ctx, stage: str) -> list[str]:
    b = Backup(ctx.store.dir, stage, ctx.host)
    if not b.manifest_path.exists():
        raise P2pkitError(f"there is no {stage} backup in {b.dir}: p2pkit has not replaced anything there yet "
                          "(or it was rolled back already)", hint="nothing to roll back", code=Exit.USAGE)
    steps = []
    if stage == "p2p-module":
        steps.append(f"disable {TIMER}")
    if stage == "driver":
        if Backup(ctx.store.dir, "p2p-module", ctx.host).manifest_path.exists():
            raise GateError("the P2P-patched module is still installed over this driver",
                            hint="roll it back first: `p2pkit rollback p2p-module --yes`")
        m = b.manifest()
        steps.append(f"run the installer's uninstall: {m.get('installer')} --uninstall --silent")
        steps += [f"unhold {p}" for p in _held_by_p2pkit(ctx, m)]
    steps += [f"{a} {p}" for a, p in b.plan()]
    if stage == "p2p-module":
        kernels = sorted({e["kernel"] for e in b.manifest()["entries"].values()})
        steps += [f"depmod {k}" for k in kernels] + ["update-grub"]
    else:
        steps.append("update-initramfs -u")
    later = names()[names().index(stage):]
    steps.append(f"invalidate stages {', '.join(later)} (their artifacts are removed; logs and backups stay)")
    steps.append("a reboot loads the stock driver")
    return steps


def _held_by_p2pkit(ctx, manifest: dict) -> list[str]:
    """The holds p2pkit added: held now (read as every other reading of holds is, from dpkg's database:
    system.package_holds; a failed read stops here rather than leaving holds in place unsaid) and not
    before the stage ran."""
    before = set(manifest.get("held_before") or [])
    return [p for p in system.package_holds(ctx.host)["held"] if p not in before]


def apply(ctx, stage: str) -> dict:
    with state_lock(ctx.store.dir, say=ctx.out.warn, root=ctx.host.root):
        steps = plan(ctx, stage)
        b = Backup(ctx.store.dir, stage, ctx.host)
        m = b.manifest()
        bad = b.verify()
        if bad:
            b.apply()  # raises, naming the file; nothing has been changed yet
        run = ctx.host.runner.run
        if stage == "p2p-module":
            run(["systemctl", f"--root={_root_arg(ctx)}", "disable", TIMER], check=False)
            done = b.apply()
            for k in sorted({e["kernel"] for e in m["entries"].values()}):
                run(["depmod", "-b", _root_arg(ctx), k])  # the host root's modules (`-b /` on a real host)
            run(["update-grub"])
        else:
            installer = ctx.host.path(m["installer"])
            if installer.is_file():
                run([str(installer), "--uninstall", "--silent"])
            held = _held_by_p2pkit(ctx, m)
            if held:
                run(["apt-mark", "unhold", *held])
            done = b.apply()
            run(["update-initramfs", "-u", "-k", "all"])
        later = names()[names().index(stage):]
        for s in later:
            ctx.store.delete(s)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        b.dir.rename(b.dir.with_name(f"{stage}.rolled-back-{stamp}"))
        record = {"kind": "p2pkit-rollback", "stage": stage, "simulated": ctx.host.simulated,
                  "kernel": system.kernel_release(ctx.host), "time": pipeline.now(), "plan": steps,
                  "files": [{"action": a, "path": p} for a, p in done], "invalidated": later,
                  "reboot_needed": True}
        d = ctx.store.dir / "rollback"
        d.mkdir(parents=True, exist_ok=True)
        atomic_write(d / f"{stamp}-{stage}.json", (json.dumps(record, indent=2) + "\n").encode())
        return record
