"""A simulated `p2pkit sim init DIR && p2pkit --root DIR up --reboot`: CPU-seconds (user+sys of
p2pkit and every process it waited for), wall, ansible-playbook runs and the tasks they ran. With
--vs-source DIR (another p2pkit source tree, e.g. `git archive <commit> | tar -x -C DIR`) the two
run in turn, A B A B ..., on fresh simulated hosts, and the ratio is taken pair by pair.

Run by hand: `python3 bench/bench_up.py [--runs 3] [--vs-source /tmp/base]`; `--second N` times a
second `up` on a host brought up fully instead (N of them per arm, no stage work: the gates and
re-checks), `--command status` times `status` there instead. Not a test: nothing here asserts a time.
The other tree runs with this interpreter and its dependencies (PYTHONPATH puts its p2pkit first);
bytecode is written, as CI writes it, and a first untimed pair warms it."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAIN = "import sys; from p2pkit.cli.main import main; sys.argv[0] = 'p2pkit'; sys.exit(main())"


def p2pkit(source: Path | None) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # the other tree, or this checkout (`python3 bench/NAME.py` runs without an install), before what was there
    tree = str(source if source is not None else Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (tree, os.environ.get("PYTHONPATH")) if x)
    return [sys.executable, "-c", MAIN], env


def playbook_runs(state: Path) -> list[dict]:
    """Every ansible-playbook run the artifacts record (the pass before a reboot included)."""
    found = []

    def walk(x):
        if isinstance(x, dict):
            if "playbook" in x and "returncode" in x:
                found.append(x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    for f in sorted(state.glob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except ValueError:
            continue
        if isinstance(doc, dict) and "stage" in doc:
            walk(doc.get("acted"))
    return found


def one(source: Path | None) -> dict:
    argv, env = p2pkit(source)
    root = Path(tempfile.mkdtemp(prefix="bench-up-")) / "sim"
    cwd = root.parent  # not this source tree: `python -c` puts the working directory first on sys.path
    subprocess.run([*argv, "sim", "init", str(root)], env=env, check=True, capture_output=True, cwd=cwd)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([*argv, "--root", str(root), "up", "--reboot"], env=env, capture_output=True, text=True,
                       cwd=cwd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([*argv, "sim", "stop", str(root)], env=env, capture_output=True, cwd=cwd)  # the engine it started
    state = root / "var/lib/p2pkit"
    runs = playbook_runs(state)
    seconds = 0.0
    for f in state.glob("*.json"):
        doc = json.loads(f.read_text())
        if isinstance(doc, dict) and "stage" in doc:
            seconds += doc.get("seconds") or 0
            seconds += (doc.get("before_reboot") or {}).get("seconds") or 0
    return {"rc": r.returncode, "wall_s": round(wall, 2),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            "playbooks": len(runs), "tasks_run": sum(x.get("ok", 0) + x.get("changed", 0) for x in runs),
            "tasks_skipped": sum(x.get("skipped", 0) for x in runs), "artifact_seconds": round(seconds, 2)}


def done_host(source: Path | None) -> tuple[Path, list[str], dict]:
    """A simulated host brought up fully by this arm's p2pkit (its engine stopped again)."""
    argv, env = p2pkit(source)
    root = Path(tempfile.mkdtemp(prefix="bench-up-")) / "sim"
    cwd = root.parent
    subprocess.run([*argv, "sim", "init", str(root)], env=env, check=True, capture_output=True, cwd=cwd)
    r = subprocess.run([*argv, "--root", str(root), "up", "--reboot"], env=env, capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        sys.exit(f"the first up failed (exit {r.returncode}): {r.stderr[-800:]}")
    return root, argv, env


def second(root: Path, argv: list[str], env: dict, command: tuple[str, ...] = ("up",)) -> dict:
    """One more `up` on a done host: every stage's gate and re-check, no stage work (or `command`: status)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([*argv, "--root", str(root), *command], env=env, capture_output=True, text=True,
                       cwd=root.parent)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"rc": r.returncode, "wall_s": round(wall, 3),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3)}


def med(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--vs-source", type=Path, help="another p2pkit source tree to pair against (B)")
    ap.add_argument("--second", type=int, default=0, metavar="N",
                    help="instead: N second `up`s on one done host per arm (no stage work), A B A B ...")
    ap.add_argument("--command", default="up", help="with --second: the command timed on the done host (up, status)")
    a = ap.parse_args()
    cmd = tuple(a.command.split())
    arms = {"A": None} | ({"B": a.vs_source.resolve()} if a.vs_source else {})
    if a.second:
        hosts = {k: done_host(src) for k, src in arms.items()}
        for k in arms:  # warm-up
            second(*hosts[k], cmd)
        rows = {k: [] for k in arms}
        for _ in range(a.second):
            for k in arms:
                rows[k].append(second(*hosts[k], cmd))
        for root, argv, env in hosts.values():
            subprocess.run([*argv, "sim", "stop", str(root)], env=env, capture_output=True, cwd=root.parent)
            shutil.rmtree(root.parent, ignore_errors=True)
        out = {k: {"runs": v, "median_cpu_s": med(v, "cpu_s"), "median_wall_s": med(v, "wall_s")}
               for k, v in rows.items()}
        if "B" in rows:
            out.update(ratios(rows))
        print(json.dumps(out, indent=2))
        return
    for src in arms.values():  # warm-up: bytecode written, page cache filled
        one(src)
    rows: dict[str, list[dict]] = {k: [] for k in arms}
    for _ in range(a.runs):
        for k, src in arms.items():
            rows[k].append(one(src))
    out = {k: {"runs": v, **{f"median_{m}": med(v, m) for m in ("cpu_s", "wall_s", "playbooks", "tasks_run",
                                                                   "artifact_seconds")}}
           for k, v in rows.items()}
    if "B" in rows:
        out.update(ratios(rows))
    print(json.dumps(out, indent=2))



def ratios(rows: dict[str, list[dict]]) -> dict[str, float]:
    """A over B, pair by pair (the runs alternate A B A B), the median of each: CPU and wall."""
    return {f"ratio_{m.split('_')[0]}_A_over_B": round(statistics.median(x[m] / y[m] for x, y in
                                                                          zip(rows["A"], rows["B"])), 3)
            for m in ("cpu_s", "wall_s")}


if __name__ == "__main__":
    main()
