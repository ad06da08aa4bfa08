"""`p2pkit serve status|logs|restart`: the engine service."""

from __future__ import annotations

from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.errors import Exit

app = typer.Typer(help="The inference engine's system service.", no_args_is_help=True)


@app.command()
def status() -> None:
    """systemctl status of the engine, and whether /health answers."""
    from p2pkit import engine_cmd
    from p2pkit.stages import service

    ctx = common.context()
    r = ctx.host.runner.run(["systemctl", "status", "--no-pager", service.UNIT], check=False)
    ctx.out.line(r.stdout.strip() or r.stderr.strip())
    p = ctx.profile
    if engine_cmd.node(p)["role"] == "worker":
        ctx.out.line("a headless worker node: it serves no API (the head does)")
    else:
        ln = service.listening(p, service.main_pid(ctx.host))
        ctx.out.line(f"{engine_cmd.client_host(p)}:{p.serve.port}: {'answers' if ln['connect'] else 'no answer'}")
    raise typer.Exit(int(Exit.OK if r.returncode == 0 else Exit.CHECK_FAILED))


@app.command()
def logs(lines: Annotated[int, typer.Option("--lines", "-n")] = 50) -> None:
    """The engine's last log lines (journalctl)."""
    from p2pkit.stages import service

    ctx = common.context()
    for line in service.logs(ctx.host, lines):
        ctx.out.line(line)


@app.command()
def restart() -> None:
    """Restart the engine and wait until /health answers 200."""
    from p2pkit import engine_cmd
    from p2pkit.lock import state_lock
    from p2pkit.stages import service

    ctx = common.context()
    p = ctx.profile
    worker = engine_cmd.node(p)["role"] == "worker"
    with state_lock(ctx.store.dir, say=ctx.out.warn, root=ctx.host.root):  # never beside an `up`
        ctx.host.runner.run(["systemctl", "restart", service.UNIT])
        h = (service.wait_joined(ctx, p.serve.health_timeout_s) if worker
             else service.wait_health(ctx, engine_cmd.health_url(p), p.serve.health_timeout_s))
    if h["ok"]:
        ctx.out.line(f"{service.UNIT} restarted; " + (f"joined the head after {h['seconds']} s" if worker
                                                      else f"/health 200 after {h['seconds']} s"))
        raise typer.Exit(int(Exit.OK))
    tail = " | ".join(service.logs(ctx.host, 5))
    ctx.out.error(f"{service.UNIT} did not become healthy: {tail}", "read `p2pkit serve logs`")
    raise typer.Exit(int(Exit.CHECK_FAILED))
