"""The service stage where systemd is not PID 1: the engine's files as on any host (the service role
makes the user and writes the environment files and the working directory, no unit), then p2pkit's launcher
(p2pkit/host/launcher.py) starts the engine with the unit's ExecStart argv and environment, in a
session and an uncapped memory cgroup of its own. `serve status|restart|stop` and `status` go
through the same record. Nothing restarts such an engine after a reboot: `status` says so."""

from __future__ import annotations

from pathlib import Path

from p2pkit.core import secrets
from p2pkit.core.ansible import run_playbook
from p2pkit.host import Host, launcher
from p2pkit.rules import engine_cmd, engine_env

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the PATH systemd gives a service
LOG = "logs/engine-launcher.log"  # under the state directory


def manager(ctx) -> str:
    """"systemd" or "launcher": serve.manager, or on "auto" whether systemd is PID 1 on the host. A
    simulated host has systemd unless its state says it has none (scenario no-systemd)."""
    m = ctx.profile.serve.manager
    if m != "auto":
        return m
    return "systemd" if launcher.systemd_booted(ctx.host) else "launcher"


def in_use(ctx) -> bool:
    """The engine here is (or is to be) the launcher's: a record, or serve.manager/the host says so."""
    return launched(ctx.host) or manager(ctx) == "launcher"


def launched(host: Host) -> bool:
    """The engine on this host is the launcher's (its record is there, running or not)."""
    return launcher.record_path(host).is_file()


def record(host: Host) -> dict | None:
    return launcher.read_record(launcher.record_path(host))


def main_pid(host: Host) -> int | None:
    rec = record(host)
    return rec["pid"] if launcher.is_running(rec) else None


def alive(host: Host) -> bool:
    return launcher.is_running(record(host))


def logs(host: Host, n: int = 30) -> list[str]:
    rec = record(host)
    return launcher.log_tail(rec["log"], n) if rec else []


def act(ctx, v: dict, *, user: str, argv: list[str] | None = None) -> dict:
    """The service role without a unit (the engine's user, working directory and environment files),
    then the engine's start (a restart when the role changed something it reads, or its command line
    changed, while it runs). `argv`: this start's command line (engine_cmd.start_line, computed once by the act)."""
    argv = engine_cmd.argv(ctx.profile) if argv is None else argv
    refuse_beside_unit(ctx)
    acted = run_playbook(ctx, "service", {**v, "p2pkit_service_manager": "launcher"})
    changed = bool(acted.get("changed"))  # Ansible's own count: the role wrote or made something
    rec_path = launcher.record_path(ctx.host)
    rec = launcher.read_record(rec_path)
    if launcher.is_running(rec):
        # a flag is in no file here (a unit's ExecStart would be): the running command line is compared too
        argv_changed = rec.get("argv") != argv
        if not changed and not argv_changed:
            acted["launcher"] = {"started": False, "why": "already running; nothing it reads changed",
                                 "pid": main_pid(ctx.host)}
            return acted
        ctx.out.step("service", "the engine's command line changed: stopping it to start it again" if argv_changed
                     else "what the engine reads changed: stopping it to start it again")
        acted["launcher_stop"] = launcher.stop(rec_path)
    acted["launcher"] = start(ctx, user, argv)
    return acted


def refuse_beside_unit(ctx) -> None:
    """serve.manager = "launcher" on a host where systemd is PID 1 and runs the engine's unit: a second engine
    would start beside it on the same port ("Address already in use") and hold the same GPUs. Refused before
    anything is written, naming the unit and both ways out."""
    from p2pkit.core.errors import Exit, P2pkitError
    from p2pkit.host import system

    if not launcher.systemd_booted(ctx.host):
        return
    unit = system.ENGINE_UNIT
    pid = system.service_main_pid(ctx.host, unit)
    if pid is None:
        return
    raise P2pkitError(f"serve.manager is \"launcher\" but systemd runs the engine here: {unit} is active (main "
                      f"pid {pid}); a second engine started beside it would find its port taken and its GPUs held",
                      hint=f"keep systemd's: drop the setting (`--unset serve.manager`); or stop and disable the unit "
                           f"first (`systemctl disable --now {unit}`), then `p2pkit up --from service --force`",
                      code=Exit.USAGE)


def start(ctx, service_user: str, argv: list[str] | None = None) -> dict:
    """The launcher's start of the engine: the unit's ExecStart argv and environment, as the unit's
    user where p2pkit runs as root on the host itself and the host has the user."""
    p, host = ctx.profile, ctx.host
    shown = engine_cmd.argv(p) if argv is None else argv
    env = {"PATH": PATH, **engine_env.engine_env(p, engine_env.pair_level(host, p))}
    plain, secret = secrets.split_env(env, p.secret_names())
    env = launcher.process_env(host, {**plain, **secret})
    work_dir = host.path(f"{host.host_path(ctx.store.dir)}/engine")
    ctx.out.step("service", f"no systemd as PID 1 here: starting the engine with p2pkit's launcher "
                            f"(log {ctx.store.dir / LOG})")
    return launcher.start(host, record=launcher.record_path(host), log=ctx.store.dir / LOG,
                          argv=[launcher.on_this_machine(host, a) for a in shown], env=env, cwd=work_dir,
                          user=launcher.run_as(host, service_user), shown_argv=shown)


def stop(ctx) -> dict:
    return launcher.stop(launcher.record_path(ctx.host))


def restart(ctx, service_user: str) -> dict:
    stopped = stop(ctx)
    return {"stop": stopped, "start": start(ctx, service_user)}


def measured(host: Host) -> dict:
    """What the service artifact keeps of the launcher besides the service's own proofs."""
    rec = record(host) or {}
    return {"manager": "launcher", "launcher": {k: rec.get(k) for k in ("pid", "start", "argv", "log", "cgroup",
                                                                          "move_error", "user") if k in rec},
            "no_restart_after_reboot": True}


def path_of(ctx) -> Path:
    return launcher.record_path(ctx.host)
