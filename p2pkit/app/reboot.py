"""`p2pkit up --reboot`: reboot and resume. A simulated host reboots in place and `up` goes on; a
real host gets a oneshot unit that runs `p2pkit up` once after boot, then reboots. The reboots one
bring-up may take are counted on disk across boots (the budget)."""

from __future__ import annotations

from pathlib import Path

from p2pkit.app import pipeline
from p2pkit.core import hoststate, writers
from p2pkit.core.ansible import render
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.errors import Exit, UsageError
from p2pkit.core.runner import own_executable
from p2pkit.host.system import identity

UNIT = "p2pkit-resume.service"


def render_resume_unit(profile, state_dir: Path) -> str:
    """The unit runs `p2pkit up` with this run's profile and its --set overrides, so the stages
    after the reboot see the inputs the stages before it were proven with."""
    argv = [own_executable(), *profile.cli_args(), "--state-dir", str(state_dir), "--yes", "up", "--reboot",
            "--resumed"]  # one command line, quoted whole by the systemd writer
    return render(f"{UNIT}.j2", exec_start=writers.unit_exec(argv),
                  state_dir=writers.unit_path("the state directory", str(state_dir)))


def reboot_host(ctx) -> None:
    if ctx.host.reboot_in_place():
        ctx.out.log(f"rebooted the simulated host {ctx.host.root}; resuming")
        return
    unit = Path("/etc/systemd/system") / UNIT
    atomic_write(unit, render_resume_unit(ctx.profile, ctx.store.dir).encode(), under=Path("/"))  # no link on the way
    ctx.host.runner.run(["systemctl", "daemon-reload"])
    ctx.host.runner.run(["systemctl", "enable", UNIT])
    ctx.out.log(f"installed {unit}; rebooting now: p2pkit up resumes after boot (journalctl -u {UNIT})")
    ctx.host.runner.run(["systemctl", "reboot"])


def disable_resume_unit(ctx) -> bool:
    """The resume unit stops running at boot (the reboot budget is spent). Returns whether it was there."""
    if not ctx.host.path(f"/etc/systemd/system/{UNIT}").is_file():
        return False
    root = [f"--root={ctx.host.root}"] if ctx.host.root != Path("/") else []
    ctx.host.runner.run(["systemctl", *root, "disable", UNIT], check=False)
    return True


def up_with_reboots(ctx, start: str | None = None, stop: str | None = None, force: bool = False, *,
                    reboot: bool = False, resumed: bool = False, max_reboots: int = hoststate.DEFAULT_MAX_REBOOTS,
                    yes: bool = False) -> pipeline.UpResult:
    """`up`, and with `reboot` each reboot a stage asks for, within the budget: a simulated host reboots in
    place and the stages go on; a real host goes down (`going_down`) and its resume unit runs `up` after boot.
    A person's `up --reboot` starts a new budget of `max_reboots`; the resume unit's (`resumed`) spends the
    recorded one. Rebooting a real host needs `yes`. The result carries the next thing to do (`hint`)."""
    if not resumed and (refused := pipeline.refused_before_recording(ctx, start)) is not None:
        return refused  # nothing recorded on this host, and preflight stops the run: nothing written
    if reboot and not resumed:
        ctx.store.ensure()
        hoststate.start_reboot_budget(ctx.store.dir, max_reboots)
    res = pipeline.up(ctx, start, stop, force)
    while res.code == Exit.REBOOT and reboot:
        if ctx.host.reboots_for_real() and not yes:
            raise UsageError("a reboot is needed and --reboot asks p2pkit to do it, but this is a real host",
                             hint="add --yes to let p2pkit reboot this machine, or reboot yourself and run "
                                  "`p2pkit up` again")
        spent = hoststate.spend_reboot(ctx.store.dir, identity(ctx.host)["boot_id"], res.message)
        if spent:  # said on stderr: the resume unit's journal; `status` says it too
            disabled = disable_resume_unit(ctx)
            res.code = Exit.CHECK_FAILED
            res.message = spent + (f"; {UNIT} is disabled" if disabled else "")
            break
        reboot_host(ctx)
        if ctx.host.reboots_for_real():  # the machine is going down: the resume unit carries on after boot
            res.going_down = True
            return res
        res = _after_reboot(ctx, res, start, stop)
    if res.code == Exit.OK:
        hoststate.clear_reboot_budget(ctx.store.dir)
    else:
        res.hint = _next_step(ctx, res, reboot)
    return res


def _after_reboot(ctx, before: pipeline.UpResult, start: str | None, stop: str | None) -> pipeline.UpResult:
    """`up` again after an in-place reboot; the stages it ran are those of both runs, each once, in order."""
    res = pipeline.up(ctx, start, stop, force=False)
    res.ran = list(dict.fromkeys([*before.ran, *res.ran]))
    if res.code == Exit.OK and res.ran:
        res.message = f"ran {', '.join(res.ran)}; all selected stages passed"
    return res


def _next_step(ctx, res: pipeline.UpResult, reboot: bool) -> str:
    if reboot and hoststate.reboot_budget(ctx.store.dir, exhausted=True):
        return budget_fix(ctx)
    if res.code == Exit.REBOOT and (how := ctx.host.reboot_command()):
        return f"on this host: `{how}`, then `p2pkit up`"
    return ""


def budget_fix(ctx) -> str:
    return ("apply the change the stage names by hand (for the kernel command line: your bootloader's own "
            f"configuration), reboot, then run `{pipeline.command(ctx, '--yes', 'up', '--reboot')}` (a new budget)")
