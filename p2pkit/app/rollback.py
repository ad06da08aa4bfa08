"""`p2pkit rollback p2p-module|driver`: back to the stock driver, from the stages' backups.

A plan first; `--yes` to act. Never deletes the engine build, the model or the state history
(logs, restore records, backups are kept; a rolled-back backup is renamed, not removed).
"""

from __future__ import annotations

import datetime as dt
import json

from p2pkit.app import pipeline
from p2pkit.core import safefs
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.errors import Exit, GateError, P2pkitError, ProbeError
from p2pkit.core.lock import state_lock
from p2pkit.host import kmod, launcher, system
from p2pkit.host.backup import Backup
from p2pkit.parse import field as pf
from p2pkit.stages import names


def _timer() -> str:
    """The restore timer's unit name (the p2p-module role's path, read when asked)."""
    return system.RESTORE_TIMER.rpartition("/")[2]


def _units() -> list[str]:
    """The p2p-module stage's units: the restore timer and the service it starts."""
    return [_timer(), system.RESTORE_UNIT.rpartition("/")[2]]


def _root_arg(ctx) -> str:
    return str(ctx.host.root)


def plan(ctx, stage: str) -> list[str]:
    b = Backup(ctx.store.dir, stage, ctx.host)
    if not b.manifest_path.exists():
        raise P2pkitError(f"there is no {stage} backup in {b.dir}: p2pkit has not replaced anything there yet "
                          "(or it was rolled back already)", hint="nothing to roll back", code=Exit.USAGE)
    steps = []
    if stage == "p2p-module":
        if launcher.systemd_booted(ctx.host):
            steps.append(f"stop {' '.join(_units())}")
        steps.append(f"disable {_timer()}")
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
        steps += [f"depmod {k}" for k in kernels] + ["update-grub", "update-initramfs -u -k all"]
        if launcher.systemd_booted(ctx.host):
            steps.append(f"systemctl daemon-reload; prove {' and '.join(_units())} not loaded (systemctl show)")
    else:
        steps.append("update-initramfs -u -k all")
    later = names()[names().index(stage):]
    steps.append(f"invalidate stages {', '.join(later)} (their artifacts are removed; logs and backups stay)")
    steps.append(after_reboot(ctx, stage, b))
    return steps


def next_boot_kernel(ctx) -> str:
    """The kernel the next boot starts: an installed one not booted yet, else the running one."""
    try:
        return kmod.pending_kernel(ctx.host).get("kernel") or system.kernel_release(ctx.host)
    except ProbeError:
        return system.kernel_release(ctx.host)


def module_after(ctx, b: Backup, kernel: str) -> tuple[str, str | None] | None:
    """The nvidia module modprobe picks for `kernel` once this rollback's files are put back and removed
    (Ubuntu's depmod.d searches updates/ before the kernel's own tree): its path on the host and its
    version (modinfo of the file, or of the copy the backup keeps); None when no module is left."""
    actions = dict((path, action) for action, path in b.plan())
    base = f"/lib/modules/{kernel}/"
    there = {"/" + str(f.relative_to(ctx.host.root)) for f in ctx.host.path(base).rglob("nvidia*.ko")
             if core_module(f.name)} if ctx.host.path(base).is_dir() else set()
    back = {p for p, a in actions.items() if a == "restore" and p.startswith(base) and core_module(p)}
    left = sorted({p for p in there if actions.get(p) != "remove"} | back,
                  key=lambda p: (0 if p.startswith(base + "updates/") else 1, p))
    if not left:
        return None
    path = left[0]
    source = b.copy_path(path) if path in back and b.copy_path(path).is_file() else ctx.host.path(path)
    r = ctx.host.runner.run(["modinfo", "-F", "version", str(source)], check=False)
    return path, (r.stdout.strip() or None) if r.returncode == 0 else None


def core_module(path: str) -> bool:
    """An nvidia module file that drives the GPU itself: nvidia.ko, or a distro's renamed one (Debian's DKMS installs
    nvidia-current-open.ko); not a companion (-modeset, -drm, -uvm, -peermem)."""
    name = path.rsplit("/", 1)[-1]
    return bool(pf.NVIDIA_ANY_KO.search(name)) and not name.split(".ko")[0].endswith(
        ("-modeset", "-drm", "-uvm", "-peermem", "_modeset", "_drm", "_uvm", "_peermem"))


def firmware_after(ctx, version: str, plans: list[list[tuple[str, str]]]) -> bool:
    """Whether the GSP firmware of `version` (what an open nvidia module of that version loads at probe)
    is on the host once the rollbacks' file actions (in order) are done."""
    d = f"/lib/firmware/nvidia/{version}/"
    files = {d + f.name for f in ctx.host.path(d).glob("gsp_*.bin")} if ctx.host.path(d).is_dir() else set()
    for plan in plans:
        for action, path in plan:
            if path.startswith(d) and path.rsplit("/", 1)[-1].startswith("gsp_"):
                (files.add if action == "restore" else files.discard)(path)
    return bool(files)


def after_reboot(ctx, stage: str, b: Backup) -> str:
    """What the next boot loads once this rollback is done, said as it will be, with the command that
    completes the way back where one more is needed: the pinned userspace stays until the driver's own
    rollback, and a stock module of another version does not work with it (no GSP firmware of its
    version: it does not load; NVIDIA's tools and CUDA refuse a module of another version)."""
    kernel = next_boot_kernel(ctx)
    found = module_after(ctx, b, kernel)
    pinned = ctx.profile.driver.version
    driver = Backup(ctx.store.dir, "driver", ctx.host)
    driver_left = stage == "p2p-module" and driver.manifest_path.exists()
    finish = pipeline.command(ctx, "rollback", "driver", "--yes")
    if found is None:
        said = (f"after a reboot no nvidia module loads on kernel {kernel}: the host has none there besides "
                "p2pkit's" if stage == "p2p-module" else
                f"after a reboot kernel {kernel} loads no nvidia module: the host had none there before p2pkit")
        return said + (f"; the pinned {pinned} userspace p2pkit installed stays until `{finish}`" if driver_left
                       else "")
    path, version = found
    module = f"the stock module {version or '(version unread)'} ({path})"
    firmware = f"its GSP firmware (/lib/firmware/nvidia/{version}/gsp_*.bin) is not there"
    package = f"install its firmware package (nvidia-firmware-{(version or '').split('.')[0]}-{version})"
    if driver_left and version != pinned:
        if firmware_after(ctx, version, [b.plan()]):
            said = (f"after a reboot kernel {kernel} loads {module}, but NVIDIA's tools and CUDA refuse it (Driver/"
                    f"library version mismatch): the pinned {pinned} userspace p2pkit installed stays")
        else:
            said = (f"after a reboot {module} does not load on kernel {kernel}: {firmware}, and the pinned {pinned} "
                    "userspace and firmware p2pkit installed stay")
        said += f"; run `{finish}` before the reboot"
        if firmware_after(ctx, version, [b.plan(), driver.plan()]):
            return said + f": then a reboot loads {module}"
        return said + f": it puts back the userspace the host had before p2pkit, without {version}'s GSP firmware; " \
            f"{package} too"
    if version and not firmware_after(ctx, version, [b.plan()]):
        return f"after a reboot {module} does not load on kernel {kernel}: {firmware}; {package}"
    return f"a reboot loads {module} on kernel {kernel}"


UNIT_PROPS = ["LoadState", "ActiveState", "SubState", "NeedDaemonReload", "UnitFileState"]


def stop_units(ctx, units: list[str]) -> None:
    """`systemctl stop` of the units (a restore timer that fires after its files are gone would put back
    what the rollback removed); one that will not stop is an error naming it, before anything changed."""
    r = ctx.host.runner.run(["systemctl", "stop", *units], check=False)
    view = system.unit_view(ctx.host, units, UNIT_PROPS)
    running = [u for u in units if view[u].get("ActiveState") not in ("inactive", "failed")]
    if r.returncode != 0 or running:
        said = (r.stderr or r.stdout).strip()[-300:]
        raise P2pkitError(
            f"{', '.join(running or units)} would not stop (systemctl stop exit {r.returncode}"
            + (f": {said}" if said else "") + "); nothing was rolled back",
            hint=f"find what keeps it (`systemctl status {' '.join(running or units)}`; a RefuseManualStop= drop-in?), "
                 f"stop it by hand (`systemctl stop {' '.join(running or units)}`), then run `"
                 + pipeline.command(ctx, "rollback", "p2p-module", "--yes") + "` again", code=Exit.CHECK_FAILED)


def units_gone(ctx, units: list[str]) -> dict:
    """After the unit files are removed and systemd reloaded: systemd's own view of each (`systemctl show`)
    is not-found and inactive, with nothing left to reload; anything else is an error naming the unit."""
    view = system.unit_view(ctx.host, units, UNIT_PROPS)
    left = {u: v for u, v in view.items()
            if v.get("LoadState") != "not-found" or v.get("ActiveState") != "inactive"
            or v.get("NeedDaemonReload") == "yes"}
    if left:
        said = "; ".join(f"{u}: " + ", ".join(f"{k}={v[k]}" for k in UNIT_PROPS if k in v) for u, v in left.items())
        raise P2pkitError(f"systemd still holds {', '.join(left)} after its files were removed and it reloaded: "
                          f"{said}", hint=f"`systemctl stop {' '.join(left)} && systemctl daemon-reload`, then "
                          f"`systemctl show {' '.join(left)} -p LoadState,ActiveState` says not-found, inactive",
                          code=Exit.CHECK_FAILED)
    return view


def initramfs_clean(ctx, files: list[str], removed: list[str]) -> dict:
    """Each /boot/initrd.img-K after its rebuild, as lsinitramfs lists it: none holds one of `files` (p2pkit's
    modprobe.d file) nor an nvidia.ko the rollback removed from /lib/modules. Returns {initrd: nvidia.ko
    paths it holds}; an initrd still holding one is an error naming it."""
    out, stale = {}, []
    for img in sorted(ctx.host.path("/boot").glob("initrd.img-*")):
        rel = f"/boot/{img.name}"
        r = ctx.host.runner.run(["lsinitramfs", str(img)], check=False)
        if r.returncode != 0:
            raise P2pkitError(f"lsinitramfs {rel} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}",
                              hint=f"`update-initramfs -u -k {img.name.removeprefix('initrd.img-')}`, then "
                                   f"`lsinitramfs {rel}`", code=Exit.CHECK_FAILED)
        listed = {"/" + ln.strip().removeprefix("usr/") for ln in r.stdout.splitlines() if ln.strip()}
        kos = pf.initramfs_nvidia(r.stdout)
        out[rel] = kos
        stale += [f"{rel}: {f}" for f in files if f in listed]
        stale += [f"{rel}: {ko}" for ko in kos if "/" + ko.removeprefix("usr/") in removed]
    if stale:
        raise P2pkitError(f"the initramfs still holds what the rollback removed: {'; '.join(stale)}",
                          hint="`update-initramfs -u -k all`, then `lsinitramfs /boot/initrd.img-$(uname -r)`",
                          code=Exit.CHECK_FAILED)
    return out


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
        # where the record goes, reached (made) before anything is undone: a link there is refused while the
        # host is still as it was, never after the backup is spent (issue 48 item 7's campaign)
        records = safefs.makedirs(ctx.store.dir / "rollback")  # no link on the way (issue 48 item 1)
        run = ctx.host.runner.run
        proofs: dict = {}
        if stage == "p2p-module":
            booted = launcher.systemd_booted(ctx.host)
            if booted:  # before anything is removed: a unit that will not stop leaves the host as it was
                stop_units(ctx, _units())
            run(["systemctl", f"--root={_root_arg(ctx)}", "disable", _timer()], check=False)
            done = b.apply()
            for k in sorted({e["kernel"] for e in m["entries"].values()}):
                run(["depmod", "-b", _root_arg(ctx), k])  # the host root's modules (`-b /` on a real host)
            run(["update-grub"])
            # the initramfs holds p2pkit's modprobe.d file (and the module it resolved when it was made)
            run(["update-initramfs", "-u", "-k", "all"])
            if booted:
                run(["systemctl", "daemon-reload"])
                proofs["systemd"] = units_gone(ctx, _units())
            proofs["initramfs"] = initramfs_clean(ctx, [system.MODPROBE_CONF],
                                                  [p for a, p in done if a == "remove"])
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
                  "files": [{"action": a, "path": p} for a, p in done], "invalidated": later, **proofs,
                  "reboot_needed": True, "after_reboot": steps[-1],
                  "next": pipeline.command(ctx, "rollback", "driver", "--yes")
                  if stage == "p2p-module" and Backup(ctx.store.dir, "driver", ctx.host).manifest_path.exists()
                  else None}
        atomic_write(records / f"{stamp}-{stage}.json", (json.dumps(record, indent=2) + "\n").encode())
        return record
