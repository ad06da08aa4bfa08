"""`up`, `plan`, `status`, `verify`, `doctor`, `facts record`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from p2pkit.app import pipeline
from p2pkit.cli import common
from p2pkit.core import config, hoststate
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.errors import Exit, UsageError
from p2pkit.facts import collect as facts
from p2pkit.stages import get, names

facts_app = typer.Typer(help="Record what p2pkit reads from a host.", no_args_is_help=True)


def _stage_name(value: str | None) -> str | None:
    """A stage name, checked while the command line is read: a typo stops before anything runs."""
    if value is not None and value not in names():
        raise typer.BadParameter(f"no stage named {value!r}; the stages are: {', '.join(names())}")
    return value


def _complete_stage(incomplete: str) -> list[str]:
    return [n for n in names() if n.startswith(incomplete)]


STAGE = {"callback": _stage_name, "autocompletion": _complete_stage, "metavar": "STAGE"}
STAGES_HELP = f"(one of {', '.join(names())})"


def _complete_rollback(incomplete: str) -> list[str]:
    return [n for n in ROLLBACK_STAGES if n.startswith(incomplete)]


ROLLBACK_STAGES = ("p2p-module", "driver")


def _states_rows(states):
    return [[s.stage, s.state, s.reason, ((s.artifact or {}).get("finished") or "")[:19].replace("T", " ")]
            for s in states]


def up(
    start: Annotated[str | None, typer.Option("--from", help=f"first stage to run {STAGES_HELP}",
                                                     **STAGE)] = None,
    stop: Annotated[str | None, typer.Option("--to", help=f"last stage to run {STAGES_HELP}", **STAGE)] = None,
    force: Annotated[bool, typer.Option("--force", help="run the selected stages even when done")] = False,
    reboot: Annotated[bool, typer.Option("--reboot", help="when a stage needs a reboot, reboot and resume "
                                         "(a oneshot unit runs `p2pkit up` after boot)")] = False,
    inventory: Annotated[Path | None, typer.Option("--inventory", "-i", help="an Ansible inventory: run on "
                                                   "every host in parallel")] = None,
    wheel: Annotated[Path | None, typer.Option("--wheel", help="with --inventory: this p2pkit as a wheel, to "
                                               "install on remote hosts (default: this version from the index)")]
    = None,
    max_reboots: Annotated[int, typer.Option("--max-reboots", min=0, help="with --reboot: how many reboots this "
                                             "bring-up may take, counted on disk across boots")]
    = hoststate.DEFAULT_MAX_REBOOTS,
    pin: Annotated[bool, typer.Option("--pin", help="resolve the pins the profile leaves empty (the installer's "
                                      "sha256 after NVIDIA's own check, the fork's and engine's commits from "
                                      "`git ls-remote`), show them and write them into this host's profile first")]
    = False,
    resumed: Annotated[bool, typer.Option("--resumed", hidden=True, help="run by the resume unit after a reboot: "
                                          "spends the recorded reboot budget instead of starting one")] = False,
) -> None:
    """Run every stage that is not done, in order; each proves its result and writes an artifact."""
    if inventory is not None:
        cmd = ["up", *(["--from", start] if start else []), *(["--to", stop] if stop else []),
               *(["--force"] if force else []), *(["--reboot"] if reboot else []), *(["--pin"] if pin else [])]
        if reboot:
            cmd = ["--yes", *cmd]
        _inventory(inventory, "up", cmd, wheel)
    ctx = common.context()
    refuse_flags_given(ctx.profile)
    if ctx.host.banner():
        ctx.out.log(ctx.host.banner())
    own = f" ({ctx.profile.source})" if ctx.profile.source != ctx.profile.name else ""  # a file, or a host's own copy
    ctx.out.log(f"profile {ctx.profile.name}{own}; state in {ctx.store.dir}")
    if pin:
        from p2pkit.app.pin import pin_for_up

        pinned = pin_for_up(ctx)
        if pinned is not None:
            ctx.profile = common.contained(pinned, ctx.host)
    from p2pkit.app.reboot import up_with_reboots

    res = up_with_reboots(ctx, start, stop, force, reboot=reboot, resumed=resumed, max_reboots=max_reboots,
                          yes=common.OPTS.yes)
    if res.going_down:
        raise typer.Exit(int(Exit.REBOOT))
    doc = {"result": "ok" if res.code == Exit.OK else "stopped", "exit_code": int(res.code),
           "message": res.message, "ran": res.ran, "stages": [s.as_dict() for s in res.states]}
    if common.OPTS.json:
        ctx.out.document(doc)
    else:
        ctx.out.table("stages", ["stage", "state", "why", "finished"], _states_rows(res.states), status_col=1)
        if res.code == Exit.OK:
            ctx.out.line(res.message)
            left = ctx.host.engine_left_serving() if "service" in res.ran else None
            if left:
                ctx.out.log(left)
        else:
            ctx.out.error(res.message, res.hint)
    raise typer.Exit(int(res.code))


def refuse_flags_given(p) -> None:
    """An engine flag given with --set on this command that the service stage would refuse (one the engine does
    not know, one written as a word; given alone or as the whole serve.flags table) is refused now, exit 2,
    before `up` records the --set for the host or `plan` shows a run: as `profile validate` refuses it (a flag
    the host kept from an earlier run is the service stage's to judge, its hint naming the --unset)."""
    given = [o.partition("=")[0].strip() for o in common.OPTS.overrides]
    flags = [g for g in given if g == "serve" or g == "serve.flags" or g.startswith("serve.flags.")]
    if not flags:
        return
    from p2pkit.core.errors import UsageError
    from p2pkit.rules import engine_cmd

    refused = [(k, m) for k, m in engine_cmd.refusals(p) if any(k == g or k.startswith(g + ".") for g in flags)]
    if not refused:  # a value the start refuses (--tp 3 on two GPUs), where the profile without this --set passes
        refused = [(flags[0] if len(flags) == 1 else "serve.flags", f"{c.id} ({c.title}): {c.measured} (expected "
                    f"{c.expected}); {c.hint}") for c in engine_cmd.refused_by(p, without_flags(p, flags))]
    if refused:
        raise UsageError(f"--set {', '.join(flags)} gives serve.flags the engine's start would refuse: "
                         + "; ".join(f"{k}: {m}" for k, m in refused),
                         hint="correct or drop it on the command line and run the command again; nothing was run or "
                              f"recorded (a flag an earlier run kept for this host goes with `p2pkit --unset "
                              f"{refused[0][0]} ...`)")


def without_flags(p, flags: list[str]):
    """The profile as it is without this command line's --set of serve flags (what the host kept stays)."""
    from p2pkit.core import config

    given = [o for o in common.OPTS.overrides if o.partition("=")[0].strip() in flags]
    return config.load(p.source, tuple(o for o in p.overrides if o not in given), p.stored_secrets)


def _inventory(inventory: Path, action: str, command: list[str], wheel: Path | None = None,
               junit: Path | None = None, prometheus: Path | None = None) -> None:
    """`junit` is the controller's file (one for the lab); `prometheus` (absolute: a relative one was taken
    from the directory the operator ran in) a file on each host, named for that host."""
    from p2pkit.app import inventory as inv
    from p2pkit.app import reports

    out = common.output()
    logs = common.state_dir(common.host()) / "logs"  # the controller's: ansible-playbook's log goes there
    if junit is not None:
        junit = Path(os.path.abspath(junit))
    code, report = inv.run(inventory, action, command, out, logs, wheel, prometheus=prometheus)
    if junit is not None:  # one file for the lab: a suite per host and stage; a host with no result fails
        results = [{**r, "stage": f"{h}/{r['stage']}"} for h, v in sorted(report["hosts"].items())
                   for r in v.get("results", [])]
        results += [{"stage": f"{h}/p2pkit", "checks": [{"id": "p2pkit.ran", "title": "p2pkit ran on the host",
                                                       "status": "fail", "measured": v.get("error", "no result"),
                                                       "expected": "a result", "hint": "see the Ansible log: "
                                                       + report["log"]}]}
                    for h, v in sorted(report["hosts"].items()) if v["exit_code"] is None]
        reports.write(junit, reports.junit(results, any(v.get("simulated") for v in report["hosts"].values())))
        report["junit"] = str(junit)
        out.log(f"JUnit for every host: {junit}")
    for h, path in sorted(report.get("prometheus", {}).items()):
        out.log(f"Prometheus textfile of {h}: {path} (on {h})")
    if common.OPTS.json:
        out.document({"kind": f"p2pkit-{action}-inventory", **report})
    else:
        cols, rows = inv.table_rows(report)
        out.table(f"{action} on {len(rows)} host(s)", cols, rows)
    raise typer.Exit(int(code))


def plan() -> None:
    """Every stage with its gate state and what `up` would do. Changes nothing."""
    ctx = common.context()
    refuse_flags_given(ctx.profile)
    states = pipeline.evaluate(ctx)
    rows, docs, first_todo = [], [], None
    for s in states:
        if s.state == pipeline.DONE:
            action = "skip (done)"
        elif first_todo is None:
            first_todo = s.stage
            action = "wait for reboot" if s.state == pipeline.REBOOT else "run"
        else:
            action = f"run after {first_todo}"
        rows.append([s.stage, s.state, s.reason, action])
        docs.append({**s.as_dict(), "action": action})
    if common.OPTS.json:
        ctx.out.document({"profile": ctx.profile.name, "stages": docs})
    else:
        ctx.out.table(f"plan ({ctx.profile.name})", ["stage", "state", "why", "up would"], rows, status_col=1)


def status(
    inventory: Annotated[Path | None, typer.Option("--inventory", "-i", help="an Ansible inventory: gather "
                                                   "every host's state")] = None,
    wheel: Annotated[Path | None, typer.Option("--wheel", help="with --inventory: this p2pkit as a wheel, to "
                                               "install on remote hosts")] = None,
) -> None:
    """Re-run the quick read-only checks of every stage over its artifact; a table, or --json."""
    if inventory is not None:
        _inventory(inventory, "status", ["status"], wheel)
    ctx = common.context()
    ctx.host.runner.cap_s = pipeline.STATUS_COMMAND_S  # a hung nvidia-smi or systemctl: "could not check", no wait
    states = pipeline.evaluate(ctx, recheck=True)
    code = status_code(states)
    denied = list(dict.fromkeys(ctx.host.runner.denied))  # commands this user may not run: no verdict on them
    if denied:
        code = Exit.USAGE
    spent = hoststate.reboot_budget(ctx.store.dir, exhausted=True)
    if common.OPTS.json:
        ctx.out.document({"profile": ctx.profile.name, "all_done": code == Exit.OK,
                          "stages": [s.as_dict() for s in states], "reboot_budget": spent})
    else:
        ctx.out.table(f"status ({ctx.profile.name})", ["stage", "state", "why", "finished"], _states_rows(states),
                      status_col=1)
        if spent:
            from p2pkit.app.reboot import budget_fix

            ctx.out.error(f"{spent['exhausted']['why']} (at {spent['exhausted']['time']})", budget_fix(ctx))
        if denied:
            import os

            ctx.out.error(f"status could not re-check every stage: p2pkit runs as uid {os.geteuid()}, and the "
                          f"host's {', '.join(denied)} may not be run by it; a stage marked \"could not re-check\" "
                          "may well be done", f"run it as root: `sudo {pipeline.command(ctx, 'status')}`")
            raise typer.Exit(int(code))
        _no_systemd_note(ctx)
        first = next((s for s in states if s.state != pipeline.DONE), None)
        no_gpu = common.sim_hint(ctx.host) if code != Exit.OK else ""
        if no_gpu:  # `up` stops at preflight on a host without NVIDIA GPUs: the simulated host is the next step
            ctx.out.log(no_gpu)
        elif first is not None and first.state in (pipeline.STALE, pipeline.NOT_RUN, pipeline.REBOOT,
                                                   pipeline.INTERRUPTED):
            ctx.out.log(f"next: {pipeline.gate_fix(ctx, states, None)}")  # the one command that makes it done
    raise typer.Exit(int(code))


def status_code(states) -> Exit:
    """status's exit code: 0 every stage done; 4 where the first stage not done waits for a reboot (the README's
    "reboot needed"); 1 otherwise (a stage failed, stale, interrupted or not run yet)."""
    first = next((s for s in states if s.state != pipeline.DONE), None)
    if first is None:
        return Exit.OK
    return Exit.REBOOT if first.state == pipeline.REBOOT else Exit.CHECK_FAILED


def _no_systemd_note(ctx) -> None:
    """Where p2pkit's launcher started the engine (systemd is not PID 1), say plainly what that costs."""
    from p2pkit.stages.service import launcher as service_launcher
    from p2pkit.stages.service.checks import NO_RESTART

    if service_launcher.launched(ctx.host) or (ctx.store.exists("service") and service_launcher.in_use(ctx)):
        ctx.out.line(f"{NO_RESTART} (run `p2pkit up` again after one; `p2pkit serve status` shows the engine)")


def verify(
    stage: Annotated[str | None, typer.Argument(help=f"one stage {STAGES_HELP}; default: every stage",
                                                       **STAGE)] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="also write JUnit XML here")] = None,
    prometheus: Annotated[Path | None, typer.Option("--prometheus", help="also write node_exporter textfile "
                                                    "metrics here (with --inventory: this path on each host)")]
    = None,
    inventory: Annotated[Path | None, typer.Option("--inventory", "-i", help="an Ansible inventory: verify every "
                                                   "host in parallel; --junit gets a suite per host and stage")]
    = None,
    wheel: Annotated[Path | None, typer.Option("--wheel", help="with --inventory: this p2pkit as a wheel, to "
                                               "install on remote hosts")] = None,
) -> None:
    """Prove the host again: run the stages' read-only checks now. Writes no artifact."""
    from p2pkit.app import reports

    junit = common.output_file("--junit", junit)  # checked before any work, relative paths made absolute
    if prometheus and inventory is None:
        reports.textfile_path(prometheus)  # where node_exporter could never read it: said first
    prometheus = common.output_file("--prometheus", prometheus, remote=inventory is not None)
    if inventory is not None:  # --prometheus: a file on each host, named for it (per_host_prometheus)
        _inventory(inventory, "verify", ["verify", *([stage] if stage else [])], wheel, junit, prometheus=prometheus)
    if prometheus:
        reports.textfile_path(prometheus)  # a directory that does not exist is refused before the checks run
    ctx = common.context()
    selected = [get(stage).name] if stage else names()
    collected: dict = {}
    results, code = pipeline.verify(ctx, selected, collected)
    if junit:
        reports.write(junit, reports.junit(results, simulated=ctx.host.simulated))
    if prometheus:
        if "nvml" not in collected:
            from p2pkit.facts import collect as facts_mod

            collected.update(facts_mod.collect(ctx.host, ["nvml"]))
        reports.write_prometheus(prometheus, reports.prometheus(results, collected, simulated=ctx.host.simulated,
                                                                profile=ctx.profile.name))
    if common.OPTS.json:
        ctx.out.document({"profile": ctx.profile.name, "stages": results, "exit_code": int(code)})
    else:
        for r in results:
            pipeline.report_checks(ctx.out, r["stage"], r["checks"])
        ctx.out.table("verify", ["stage", "result"], [[r["stage"], r["status"]] for r in results], status_col=1)
    raise typer.Exit(int(code))


def doctor(
    facts_file: Annotated[Path | None, typer.Option("--facts", help="judge a recorded facts file")] = None,
    paste_file: Annotated[Path | None, typer.Option("--from-paste", help="judge a pasted output, one of: lspci (lspci "
                                                    "-vv, sudo lspci -vvv for ACS), nvidia-installer (its log), cmake "
                                                    "(CMake's or nvcc's errors), nvidia-smi-q (nvidia-smi -q), "
                                                    "simpleP2P, p2pBandwidthLatencyTest (the CUDA samples), nccl-log "
                                                    "(an NCCL or PyTorch log or crash), kernel-log "
                                                    "(sudo dmesg)")] = None,
) -> None:
    """Every read-only check p2pkit has, grouped by stage, with pitfall ids (docs/pitfalls.md) and fixes."""
    from p2pkit.app import doctor as doctor_mod

    if paste_file is not None:
        try:
            text = paste_file.read_text(errors="replace")
        except OSError as e:
            raise UsageError(f"cannot read the paste {paste_file}: {e.strerror}",
                             hint="give the path of a file holding the pasted output") from e
        report = doctor_mod.from_paste(text, common.profile(), str(paste_file))
    elif facts_file is not None:
        recorded = facts.load_recorded(facts_file)
        rec = recorded.get("profile")
        if common.OPTS.profile is None and rec:  # judged with the profile the facts were recorded under
            prof = config.from_record(rec, common.OPTS.overrides)
        else:
            prof = common.profile()
        report = doctor_mod.judge(recorded["facts"], prof, simulated=recorded["simulated"], recorded=str(facts_file))
        report["source"] = str(facts_file)
        report["profile_source"] = prof.source
    else:
        ctx = common.context()
        report = doctor_mod.run(ctx)
    out = common.output()
    out.simulated = report["simulated"]
    if common.OPTS.json:
        out.document(report)
    else:
        doctor_mod.render(out, report)
    # a paste too short to tell is never a pass, nor a check a command gave no answer to in time
    unsure = (paste_file is not None and report["not_checked"]) or report.get("unanswered")
    raise typer.Exit(int(Exit.CHECK_FAILED if report["failed"] or unsure else Exit.OK))


def restore(
    kernel: Annotated[str | None, typer.Option("--kernel", help="build for this kernel release "
                                               "(a kernel postinst hook passes the new one)")] = None,
) -> None:
    """Re-check the driver and p2p-module gates; on drift after an upgrade, rebuild and prove again."""
    from p2pkit.app.restore import restore as do_restore

    ctx = common.context()
    code, record = do_restore(ctx, kernel)
    if common.OPTS.json:
        ctx.out.document({**record, "after": None})
    elif code == Exit.REBOOT:
        ctx.out.error(f"restored for kernel {record['target_kernel']}: {record['reboot']}; reboot",
                      f"`{how}`" if (how := ctx.host.reboot_command()) else "reboot, then `p2pkit status`")
    elif code == Exit.OK:
        ctx.out.line(f"driver and P2P module hold for kernel {record['target_kernel']}"
                     + (f" ({len(record['actions'])} action(s) taken)" if record["actions"] else ""))
        if record.get("next"):  # what restore leaves to `up`: named, so that `status` can say done again
            nxt, first = record["next"], record["next"]["first"]
            ctx.out.line(f"{len(nxt['not_done'])} of {len(names())} stages are not done ({first['stage']}: "
                         f"{first['state']}" + (f", {first['reason']}" if first["reason"] else "") + "); "
                         f"{nxt['fix']}")
    raise typer.Exit(int(code))


def rollback(
    stage: Annotated[str, typer.Argument(help="p2p-module (first), then driver", metavar="STAGE",
                                         autocompletion=_complete_rollback)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="act on the plan")] = False,
) -> None:
    """Back to the stock driver: put back what the stage replaced, from its backup. Plan first."""
    from p2pkit.app import rollback as rb

    if stage not in ROLLBACK_STAGES:
        raise UsageError(f"p2pkit can roll back p2p-module and driver, not {stage!r}",
                         hint="`p2pkit rollback p2p-module --yes`, then `p2pkit rollback driver --yes`")
    ctx = common.context()
    steps = rb.plan(ctx, stage)
    if not (yes or common.OPTS.yes):
        if common.OPTS.json:
            ctx.out.document({"kind": "p2pkit-rollback-plan", "stage": stage, "plan": steps, "acted": False})
        else:
            ctx.out.line(f"rollback {stage} would:")
            for s in steps:
                ctx.out.line(f"  - {s}")
            ctx.out.line("nothing was changed; add --yes to act")
        raise typer.Exit(int(Exit.OK))
    record = rb.apply(ctx, stage)
    if common.OPTS.json:
        ctx.out.document(record)
    else:
        for f in record["files"]:
            ctx.out.log(f"[rollback] {f['action']} {f['path']}")
        for unit, v in (record.get("systemd") or {}).items():  # systemd's own word, after its reload
            ctx.out.log(f"[rollback] systemd: {unit} {v.get('LoadState')}, {v.get('ActiveState')}")
        for img, kos in (record.get("initramfs") or {}).items():
            ctx.out.log(f"[rollback] {img} rebuilt: " + (f"holds {', '.join(kos)}" if kos else "holds no nvidia.ko"))
        nxt = f"`{how}`" if (how := ctx.host.reboot_command()) else "reboot"
        # it worked: not an error, though the exit code (4) says a reboot is still due
        ctx.out.line(f"{stage} rolled back; stages {', '.join(record['invalidated'])} are invalidated")
        ctx.out.line(record["after_reboot"])  # what the next boot loads, as it will be
        ctx.out.log(f"next: `{record['next']}`, then {nxt}" if record.get("next") else f"next: {nxt}")
    raise typer.Exit(int(Exit.REBOOT))


@facts_app.command("record")
def facts_record(file: Annotated[Path, typer.Argument(help="JSON file to write")],
                 force: Annotated[bool, typer.Option("--force", help="replace FILE when it exists")] = False) -> None:
    """Write every fact p2pkit reads from this host to FILE (never over one that exists, without --force)."""
    file = common.output_file("", file)  # refused before any fact is read
    if file.exists() and not force:  # as `report` refuses: nothing overwritten unasked (issue 47 item 13)
        raise UsageError(f"{file} exists: p2pkit does not overwrite it",
                         hint="name another file, or add --force to replace it; nothing was read or written")
    h = common.host()
    doc = facts.record(h, common.profile(h))
    target = file.resolve()
    if not target.parent.is_dir():
        raise UsageError(f"cannot write {file}: {target.parent} is not a directory",
                         hint="create the directory first, or name a file in an existing one")
    atomic_write(target, (json.dumps(doc, indent=2, default=str) + "\n").encode())
    out = common.output()
    out.simulated = h.simulated
    out.log(f"facts of {h.root} written to {file}")
    if common.OPTS.json:
        out.document({"file": str(target), "root": str(h.root), "facts": len(doc["facts"]),
                      "profile": (doc.get("profile") or {}).get("name")})


def logs(
    stage: Annotated[str, typer.Argument(help=f"a stage {STAGES_HELP}: its log in <state>/logs (the engine's: its "
                                         "last build log); preflight, rebar and topology run no command and keep "
                                         "no log", **STAGE)],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing as the log grows, until the run "
                                         "writing it ends (Ctrl-C stops)")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="start with only the last N lines (0: all)")]
    = 0,
) -> None:
    """A stage's log: ansible-playbook's output, the engine build, the conversion, the load, as they
    are written (a 20-minute build can be followed with --follow). With --json, one document with the
    log's text once it is complete (--follow: once the run writing it ends)."""
    import sys
    import time

    from p2pkit.core.lock import lock_holder
    from p2pkit.stages.engine.common import build_logs

    st = get(stage)
    if st.act is None and st.measure is None:  # it only reads the host: its findings are its record
        raise UsageError(f"{st.name} keeps no log: it runs no command and changes nothing, it only reads the host "
                         "(its findings with their measured values are its record)",
                         hint=f"see them with `p2pkit verify {st.name}` (read now) or `p2pkit status` (its "
                              "artifact); the stages with a log: "
                              + ", ".join(x.name for x in _stages_with_logs()))
    ctx = common.context()
    d = ctx.store.dir / "logs"
    path = (build_logs(ctx) or [d / "engine-build.log"])[-1] if st.name == "engine" else d / f"{st.name}.log"
    while not path.is_file():
        if not follow or lock_holder(ctx.store.dir) is None:
            raise UsageError(f"no log for {st.name} yet ({path}): the stage has not run on this host",
                             hint=f"run the stage: `p2pkit up --to {st.name}`")
        time.sleep(0.5)
    json_mode = common.OPTS.json
    kept = bytearray()

    def emit(chunk: bytes) -> None:
        if json_mode:
            kept.extend(chunk)
        else:
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    with open(path, "rb") as fh:
        text = fh.read()
        if lines > 0:
            text = b"".join(text.splitlines(keepends=True)[-lines:])
        emit(text)
        idle = 0
        try:
            while follow:
                chunk = fh.read()
                if chunk:
                    emit(chunk)
                    idle = 0
                    continue
                idle = idle + 1 if lock_holder(ctx.store.dir) is None else 0
                if idle >= 2:  # no run holds the lock and nothing more came: the log is complete
                    break
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    if json_mode:
        ctx.out.document({"stage": st.name, "path": str(path), "text": kept.decode(errors="replace")})
    raise typer.Exit(0)


def _stages_with_logs():
    from p2pkit.stages import registry

    return [x for x in registry() if x.act is not None or x.measure is not None]
