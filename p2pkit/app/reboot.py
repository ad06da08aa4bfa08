"""`p2pkit up --reboot`: reboot and resume. A simulated host reboots in place and `up` goes on; a
real host gets a oneshot unit that runs `p2pkit up` once after boot, then reboots."""

from __future__ import annotations

from pathlib import Path

from p2pkit.core import writers
from p2pkit.core.ansible import render
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.runner import own_executable

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
