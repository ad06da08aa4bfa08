"""`p2pkit serve status|logs|restart|stop`: the engine service (a systemd unit, or where systemd is not
PID 1 the engine p2pkit's launcher started)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.core.errors import Exit
from p2pkit.host import system

app = typer.Typer(help="The inference engine's system service.", no_args_is_help=True)


@app.command()
def status() -> None:
    """systemctl status of the engine (or its launcher's record), and the engine judged now as status and
    doctor judge it: frozen (its process stopped), not answering (/health gives no answer), or answering."""
    from p2pkit.facts import collect
    from p2pkit.rules import engine_cmd
    from p2pkit.rules.findings import FAIL, PASS
    from p2pkit.stages.service import checks
    from p2pkit.stages.service import launcher as service_launcher

    ctx = common.context()
    doc: dict = {"manager": "launcher" if service_launcher.in_use(ctx) else "systemd"}
    if doc["manager"] == "launcher":
        ok = _launcher_status(ctx, doc)
    else:
        r = ctx.host.runner.run(["systemctl", "status", "--no-pager", system.ENGINE_UNIT], check=False)
        doc.update(unit=system.ENGINE_UNIT, systemctl_status=r.stdout.strip() or r.stderr.strip())
        ok = r.returncode == 0
        if not common.OPTS.json:
            ctx.out.line(doc["systemctl_status"])
    p = ctx.profile
    # the one judgement of a live engine (service.checks.alive over the engine_live fact), never a TCP connect:
    # a stopped process's listening socket still accepts
    judged = checks.alive(collect.collect(ctx.host, ("engine_live",), p).get("engine_live"))
    worker = engine_cmd.node(p)["role"] == "worker"
    doc["running"] = ok
    if worker:
        doc.update(role="worker", address=None, answers=None)
        if not common.OPTS.json:
            ctx.out.line("a headless worker node: it serves no API (the head does)")
    else:
        doc.update(role="head", address=f"{engine_cmd.client_host(p)}:{p.serve.port}",
                   answers=all(c.status == PASS for c in judged))
    doc["judged"] = [{"id": c.id, "status": c.status, "measured": c.measured, "hint": c.hint} for c in judged]
    where = "the engine" if worker else doc["address"]
    if not common.OPTS.json:
        for c in judged:
            ctx.out.line(f"{where}: {c.measured if c.status != PASS or worker else f'answers ({c.measured})'}")
            if c.status != PASS and c.hint:
                ctx.out.line(f"fix: {c.hint}")
    ok = ok and all(c.status != FAIL for c in judged)
    if common.OPTS.json:
        ctx.out.document(doc)
    raise typer.Exit(int(Exit.OK if ok else Exit.CHECK_FAILED))


def _launcher_status(ctx, doc: dict) -> bool:
    from p2pkit.host import launcher
    from p2pkit.stages.service import launcher as service_launcher
    from p2pkit.stages.service.checks import NO_RESTART

    st = launcher.state(service_launcher.path_of(ctx))
    rec = st.get("record", {})
    cg = rec.get("cgroup", {})
    say = (lambda _line: None) if common.OPTS.json else ctx.out.line
    doc["note"] = NO_RESTART
    if not rec:
        doc["record"] = None
        say(f"engine (p2pkit's launcher): not started here (no record at {launcher.RECORD}): `p2pkit up`")
        say(NO_RESTART)
        return False
    doc.update(record=rec, pid=rec.get("pid"), log=rec.get("log"), cgroup=cg.get("dir") or cg.get("error"))
    say(f"engine (p2pkit's launcher): {'running' if st['running'] else 'not running'}, pid {rec.get('pid')}, "
        f"log {rec.get('log')}, cgroup {cg.get('dir') or cg.get('error')}")
    say(f"  {' '.join(rec.get('argv', []))}")
    say(NO_RESTART)
    return st["running"]


@app.command()
def logs(lines: Annotated[int, typer.Option("--lines", "-n", min=0)] = 50) -> None:
    """The engine's last log lines (journalctl, or the launcher's log file where systemd is not PID 1)."""
    from p2pkit.stages.service import act as service

    ctx = common.context()
    got = service.logs(ctx.host, lines)
    if common.OPTS.json:
        ctx.out.document({"lines": got})
        return
    for line in got:
        ctx.out.line(line)


INVENTORY_HELP = ("an Ansible inventory: on every host of it at once (restart: every engine stopped first, then "
                  "started, a headless worker once its head's rendezvous answers)")


def _inventory(inventory: Path, action: str, command: list[str]) -> dict:
    from p2pkit.app import inventory as inv

    out = common.output()
    return inv.run(inventory, action, command, out, common.state_dir(common.host()) / "logs")[1]


def _inventory_done(kind: str, report: dict) -> None:
    from p2pkit.app import inventory as inv

    out = common.output()
    if common.OPTS.json:
        out.document({"kind": f"p2pkit-{kind}-inventory", **report})
    else:
        cols, rows = inv.table_rows(report)
        out.table(f"{kind.replace('-', ' ')} on {len(rows)} host(s)", cols, rows)
    raise typer.Exit(int(report["exit_code"]))


@app.command()
def restart(inventory: Annotated[Path | None, typer.Option("--inventory", "-i", help=INVENTORY_HELP)] = None) -> None:
    """Restart the engine and wait until /health answers 200 (a headless worker: until it joined its head, which
    it waits for first: a worker restarted alone cannot join a head that runs on; restart both with --inventory)."""
    from p2pkit.core.lock import state_lock
    from p2pkit.rules import engine_cmd
    from p2pkit.stages.service import act as service
    from p2pkit.stages.service import launcher as service_launcher

    if inventory is not None:  # every engine stopped first: a worker never meets the head it had
        stopped = _inventory(inventory, "serve-stop", ["serve", "stop"])
        report = {**_inventory(inventory, "serve-start", ["serve", "restart"]), "stopped": stopped["hosts"]}
        report["exit_code"] = max(report["exit_code"], stopped["exit_code"])
        _inventory_done("serve-restart", report)
    ctx = common.context()
    name = system.ENGINE_UNIT
    p = ctx.profile
    n = engine_cmd.node(p)
    worker = n["role"] == "worker"
    if worker:  # the worker starts only after its head's rendezvous answers (P27)
        head = service.wait_head(ctx, n["master_addr"], n["master_port"], p.serve.head_wait_s)
        if not head["ok"]:
            ctx.out.error(f"the head's rendezvous {head['address']} did not answer within {p.serve.head_wait_s:g} s "
                          f"({head.get('error') or 'no answer'}), so this worker was not restarted",
                          "start the head first (its `p2pkit serve restart`), or restart both with `p2pkit serve "
                          "restart --inventory FILE` (P27)")
            raise typer.Exit(int(Exit.CHECK_FAILED))
    with state_lock(ctx.store.dir, say=ctx.out.warn, root=ctx.host.root):  # never beside an `up`
        if service_launcher.in_use(ctx):
            service_launcher.restart(ctx, system.ENGINE_USER)
            name = "the engine (p2pkit's launcher)"
        else:
            ctx.host.runner.run(["systemctl", "restart", system.ENGINE_UNIT])
        h = (service.wait_joined(ctx, p.serve.health_timeout_s) if worker
             else service.wait_health(ctx, engine_cmd.health_url(p), p.serve.health_timeout_s))
    tail = [] if h["ok"] else service.logs(ctx.host, 5)
    said = (f"{name} restarted; " + (f"joined the head after {h['seconds']} s" if worker
                                     else f"/health 200 after {h['seconds']} s")) if h["ok"] else \
        f"{name} did not become healthy: {' | '.join(tail)}"
    if common.OPTS.json:
        ctx.out.document({"restarted": name, "healthy": bool(h["ok"]), "seconds": h.get("seconds"),
                          "log_tail": tail, "message": said})
    elif h["ok"]:
        ctx.out.line(said)
    if h["ok"]:
        raise typer.Exit(int(Exit.OK))
    ctx.out.error(f"{name} did not become healthy: {' | '.join(tail)}", "read `p2pkit serve logs`")
    raise typer.Exit(int(Exit.CHECK_FAILED))


@app.command()
def stop(inventory: Annotated[Path | None, typer.Option("--inventory", "-i", help=INVENTORY_HELP)] = None) -> None:
    """Stop the engine (SIGTERM, then SIGKILL of what is left after 30 s where p2pkit's launcher started it). Across
    nodes a headless worker does not end with its head: stop every node (--inventory)."""
    from p2pkit.core.lock import state_lock
    from p2pkit.stages.service import launcher as service_launcher

    if inventory is not None:
        _inventory_done("serve-stop", _inventory(inventory, "serve-stop", ["serve", "stop"]))
    ctx = common.context()
    with state_lock(ctx.store.dir, say=ctx.out.warn, root=ctx.host.root):  # never beside an `up`
        if service_launcher.in_use(ctx):
            res = service_launcher.stop(ctx)
            said = (f"the engine (pid {res['pid']}) stopped" + (f"; killed {res['killed']} after the wait"
                                                               if res["killed"] else "")
                    if res["stopped"] else f"the engine was {res['why']}")
            if common.OPTS.json:
                ctx.out.document({"stopped": "the engine (p2pkit's launcher)", "ok": True, "message": said})
            else:
                ctx.out.line(said)
            raise typer.Exit(int(Exit.OK))
        r = ctx.host.runner.run(["systemctl", "stop", system.ENGINE_UNIT], check=False)
    said = (f"systemctl stop {system.ENGINE_UNIT} failed: {r.stderr.strip()[-300:]}" if r.returncode
            else f"{system.ENGINE_UNIT} stopped")
    if common.OPTS.json:
        ctx.out.document({"stopped": system.ENGINE_UNIT, "ok": not r.returncode, "message": said})
    if r.returncode:
        ctx.out.error(said, "read `p2pkit serve logs`")
        raise typer.Exit(int(Exit.CHECK_FAILED))
    if not common.OPTS.json:
        ctx.out.line(said)
