"""A kill campaign: random SIGKILLs of `p2pkit up --reboot` on simulated hosts, each followed by a
resume (`up --reboot` again, unkilled) that must finish the job.

For each kill: a fresh simulated host (`p2pkit sim init`), `up --reboot` started and killed with
SIGKILL at a time drawn uniformly over a measured unkilled run's duration (the stage it was acting
on is read from the state directory's running.json just before the kill), then one resume. Per
stage it counts:
- half-written: an artifact (*.json under the state directory) that does not parse, or a *.tmp left
  there, after the kill;
- finished: resumes that exit 0 with every stage done (`p2pkit status` exits 0);
- orphans: processes left from the killed run after the resume (their cwd or command line inside
  the host's root), the simulated engine the resume runs aside;
- lock problems: resumes that exit 5 (the killed run's lock still held).

Run by hand: `python3 bench/bench_kill.py [--kills 50] [--seed 1] [--json FILE]`; each kill costs
about one unkilled run (~45 s on two cores). `--duration S` skips the measured run. Not a test:
tests/test_bench_kill.py runs it with --kills 2."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAIN = "import sys; from p2pkit.cli.main import main; sys.argv[0] = 'p2pkit'; sys.exit(main())"
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # p2pkit from this checkout, installed or not
STATE = "var/lib/p2pkit"
LOCKED = 5  # p2pkit.core.errors.Exit.LOCKED


def p2pkit(*args: str) -> list[str]:
    return [sys.executable, "-c", MAIN, *args]


def fresh_host(base: Path, name: str, scenario: str = "healthy") -> Path:
    root = base / name
    subprocess.run(p2pkit("sim", "init", "--force", "--scenario", scenario, str(root)), check=True,
                   capture_output=True, cwd=base)
    return root


def stop_host(root: Path) -> None:
    subprocess.run(p2pkit("sim", "stop", str(root)), capture_output=True, cwd=root.parent)


def measured_run(base: Path) -> float:
    """One unkilled `up --reboot`: its wall time (it must succeed)."""
    root = fresh_host(base, "measured")
    t0 = time.monotonic()
    r = subprocess.run(p2pkit("--root", str(root), "up", "--reboot"), capture_output=True, text=True, cwd=base)
    took = time.monotonic() - t0
    stop_host(root)
    if r.returncode != 0:
        sys.exit(f"the unkilled run failed (exit {r.returncode}): {r.stderr[-800:]}")
    shutil.rmtree(root, ignore_errors=True)
    return took


def half_written(state: Path) -> list[str]:
    """Artifacts that do not parse and temp files left under the state directory."""
    bad = []
    for f in sorted(state.rglob("*")):
        if not f.is_file():
            continue
        if f.name.endswith(".tmp") or ".tmp" in f.suffixes:
            bad.append(f"{f.relative_to(state)} (temp file left)")
        elif f.suffix == ".json":
            try:
                json.loads(f.read_text())
            except (OSError, ValueError) as e:
                bad.append(f"{f.relative_to(state)} (does not parse: {e})")
    return bad


def engine_pids(root: Path) -> set[int]:
    """The simulated host's running services (its engine) and their descendants: meant to run."""
    try:
        doc = json.loads((root / ".p2pkit-sim/state.json").read_text())
    except (OSError, ValueError):
        return set()
    keep = {s["pid"] for s in doc.get("services", {}).values() if isinstance(s, dict) and s.get("pid")}
    todo = list(keep)
    while todo:
        pid = todo.pop()
        for kids in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                for c in kids.read_text().split():
                    if int(c) not in keep:
                        keep.add(int(c))
                        todo.append(int(c))
            except (OSError, ValueError):
                pass
    return keep


def processes_in(root: Path) -> dict[int, str]:
    """This machine's processes whose cwd or command line lies inside root: pid -> command line."""
    found = {}
    mine = str(root)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            cwd = os.readlink(d / "cwd")
        except OSError:
            continue
        if mine in cmd or cwd == mine or cwd.startswith(mine + "/"):
            found[int(d.name)] = cmd[:200]
    return found


def one_kill(base: Path, i: int, at: float) -> dict:
    root = fresh_host(base, f"kill-{i}")
    state = root / STATE
    proc = subprocess.Popen(p2pkit("--root", str(root), "up", "--reboot"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=base)
    end = time.monotonic() + at
    while time.monotonic() < end and proc.poll() is None:
        time.sleep(0.05)
    stage = "(finished before the kill)"
    if proc.poll() is None:
        try:
            stage = json.loads((state / "running.json").read_text())["stage"]
        except (OSError, ValueError, KeyError):
            stage = "(between stages)"
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = set(processes_in(root)) - engine_pids(root)  # what the killed run left (its children die with it)
    broken = half_written(state)
    r = subprocess.run(p2pkit("--root", str(root), "up", "--reboot"), capture_output=True, text=True, cwd=base)
    status = subprocess.run(p2pkit("--root", str(root), "--json", "status"), capture_output=True, text=True, cwd=base)
    left = processes_in(root)
    orphans = {pid: cmd for pid, cmd in left.items() if pid in before and pid not in engine_pids(root)}
    stop_host(root)
    out = {"kill": i, "at_s": round(at, 2), "stage": stage, "half_written": broken, "resume_exit": r.returncode,
           "finished": r.returncode == 0 and status.returncode == 0, "orphans": [f"{p} {c}" for p, c in
                                                                                orphans.items()],
           "lock_problem": r.returncode == LOCKED}
    if not out["finished"]:
        out["resume_tail"] = r.stderr[-600:]
        out["status_not_done"] = not_done(status.stdout)  # which stage status did not call done, and why
    for pid in orphans:  # leave this machine as it was
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(root, ignore_errors=True)
    return out


def not_done(status_json: str) -> list[str]:
    """The stages `status --json` did not call done, each with its state and reason (issue 48 item 6: a stale
    after a resume that finished is said with its reason, never only counted)."""
    try:
        return [f"{s['stage']}: {s['state']}: {s['reason']}" for s in json.loads(status_json)["stages"]
                if s["state"] != "done"]
    except (ValueError, KeyError, TypeError):
        return [f"status printed no document: {status_json[-300:]}"]


def table(kills: list[dict], stages: list[str]) -> list[dict]:
    rows = []
    for st in [*stages, *sorted({k["stage"] for k in kills} - set(stages))]:
        ks = [k for k in kills if k["stage"] == st]
        if ks:
            rows.append({"stage": st, "kills": len(ks), "half_written": sum(bool(k["half_written"]) for k in ks),
                         "finished": sum(k["finished"] for k in ks), "orphans": sum(len(k["orphans"]) for k in ks),
                         "lock_problems": sum(k["lock_problem"] for k in ks)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=None, help="seconds of an unkilled run (skips measuring one)")
    ap.add_argument("--json", type=Path, default=None, help="write every kill and the table here")
    a = ap.parse_args()
    # the p2pkit processes it starts run this checkout too (`python3 bench/bench_kill.py` needs no install)
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
    from p2pkit.stages import registry

    stages = [s.name for s in registry()]
    rng = random.Random(a.seed)
    base = Path(tempfile.mkdtemp(prefix="bench-kill-"))
    try:
        duration = a.duration if a.duration else measured_run(base)
        print(f"unkilled run: {duration:.1f} s; {a.kills} kills drawn uniformly over it (seed {a.seed})",
              file=sys.stderr)
        kills = []
        for i in range(a.kills):
            kills.append(one_kill(base, i, rng.uniform(0, duration)))
            k = kills[-1]
            print(f"kill {i + 1}/{a.kills} at {k['at_s']} s in {k['stage']}: resume exit {k['resume_exit']}"
                  f"{', half-written ' + str(k['half_written']) if k['half_written'] else ''}"
                  f"{', orphans ' + str(k['orphans']) if k['orphans'] else ''}"
                  f"{', status: ' + '; '.join(k['status_not_done']) if k.get('status_not_done') else ''}",
                  file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = table(kills, stages)
    cols = ["stage", "kills", "half_written", "finished", "orphans", "lock_problems"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
    if a.json:
        a.json.write_text(json.dumps({"kind": "p2pkit-bench-kill", "seed": a.seed, "duration_s": round(duration, 2),
                                      "kills": kills, "table": rows}, indent=2) + "\n")
    bad = any(k["half_written"] or not k["finished"] or k["orphans"] or k["lock_problem"] for k in kills)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
