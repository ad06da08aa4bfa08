"""Start-up cost of p2pkit, before and after, in one run (issue 20): `--help`, `--version`, `status`
and a no-op `up` on a simulated host where `up --reboot` has finished, each beside `python -c pass`; and the
CLI framework's own import cost (typer, and pydantic, which typer imports to coerce options).

Each run is a whole process timed from outside: CPU-seconds are user+sys of the process and every
process it waited for (the simulated host's stand-in commands included), as the kernel accounts
them at exit (wait4); wall is a monotonic clock around it. The commands run in turn, pass / before /
after / pass / before / after ..., and each ratio is taken pair by pair within a round, so it holds
while the machine's speed drifts (a shared machine: quote ratios and medians, not single runs).

"before" is p2pkit from another source tree (a checkout of the commit to compare with, e.g.
`git worktree add /tmp/p2pkit-before <commit>`), "after" this tree; both run through the same
launcher (the console script's two lines) with PYTHONPATH naming their tree, so the simulated host's
stand-ins of each import their own simulator. Byte code is allowed (PYTHONDONTWRITEBYTECODE is
dropped) and a warm-up round writes it.

    python3 bench/bench_startup.py --before /tmp/p2pkit-before [--runs 9] [--host DIR] [--before-host DIR]

--host reuses a simulated host already brought up (`p2pkit sim init DIR`, `p2pkit --root DIR up --reboot`);
without it one is laid out and brought up first (about a minute). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = "import sys\nfrom p2pkit.cli.main import main\nsys.argv[0] = 'p2pkit'\nsys.exit(main())"
AIMS = {"help_wall_s": 0.15, "version_wall_s": 0.15, "status_cpu_s": 0.3}


def env_for(tree: Path | None) -> dict[str, str]:
    """The environment of a timed command: byte code allowed; a tree's p2pkit first on the path (before whatever
    PYTHONPATH already holds: the dependencies, where they are not installed)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(tree), os.environ.get("PYTHONPATH")) if x)
    return env


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int]:
    """(CPU-s of the process and what it waited for, wall s, exit code)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime, wall, proc.returncode


def stats(xs: list[float]) -> dict:
    return {"min": round(min(xs), 4), "median": round(statistics.median(xs), 4), "max": round(max(xs), 4)}


def measure(args, trees: dict[str, Path], runs: int) -> dict:
    """Rounds of pass / each tree, in turn; medians and pairwise ratios. `args`: the command line, or a
    function of the tree's name giving it (each tree on a host of its own)."""
    py = sys.executable
    args_of = args if callable(args) else (lambda _name: args)
    # each in its own tree's directory: `python -c` puts the working directory first on sys.path
    cmds = {"python -c pass": ([py, "-c", "pass"], env_for(None), REPO)}
    cmds.update({name: ([py, "-c", LAUNCHER, *args_of(name)], env_for(tree), tree) for name, tree in trees.items()})
    got: dict[str, dict[str, list]] = {n: {"cpu": [], "wall": [], "rc": []} for n in cmds}
    for i in range(runs + 1):
        for name, (argv, env, cwd) in cmds.items():
            cpu, wall, rc = timed(argv, env, cwd)
            if i:  # round 0 is the warm-up: byte code written, caches filled
                got[name]["cpu"].append(cpu)
                got[name]["wall"].append(wall)
                got[name]["rc"].append(rc)
    out: dict = {}
    base = got["python -c pass"]
    for name, g in got.items():
        row = {"cpu_s": stats(g["cpu"]), "wall_s": stats(g["wall"]), "exit": sorted(set(g["rc"]))}
        if name != "python -c pass":
            row["cpu_vs_python"] = round(statistics.median(a / b for a, b in zip(g["cpu"], base["cpu"])), 2)
            row["wall_vs_python"] = round(statistics.median(a / b for a, b in zip(g["wall"], base["wall"])), 2)
        out[name] = row
    if "before" in got and "after" in got:
        out["after_vs_before_cpu"] = round(statistics.median(
            a / b for a, b in zip(got["after"]["cpu"], got["before"]["cpu"])), 3)
    return out


def framework_floor(runs: int) -> dict:
    """What the CLI framework costs before any p2pkit code: importing typer, and the module typer
    imports to coerce any option that is not a flag (pydantic, from typer 0.2x on), beside `pass`."""
    py, env = sys.executable, env_for(None)
    cmds = {"pass": "pass", "import typer": "import typer", "import typer._adapters": "import typer._adapters"}
    got: dict[str, list[float]] = {n: [] for n in cmds}
    for i in range(runs + 1):
        for name, code in cmds.items():
            cpu, _, _ = timed([py, "-c", code], env, REPO)
            if i:
                got[name].append(cpu)
    return {name: stats(v) for name, v in got.items()}


def done_host() -> Path:
    """A simulated host brought up by this tree (`sim init`, `up --reboot`), through the same launcher the
    timed runs use: no console script needed (`python3 bench/bench_startup.py` runs from a checkout)."""
    root = Path(tempfile.mkdtemp(prefix="p2pkit-bench-")) / "sim"
    p2pkit, env = [sys.executable, "-c", LAUNCHER], env_for(REPO)
    for args in (["sim", "init", str(root)], ["--root", str(root), "up", "--reboot"]):
        r = subprocess.run([*p2pkit, *args], env=env, cwd=root.parent, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"p2pkit {' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-600:]}")
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, help="source tree of the p2pkit to compare with")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--host", type=Path, help="a simulated host where `up --reboot` finished")
    ap.add_argument("--before-host", type=Path, help="the host `before` runs on, brought up by that tree (its "
                    "stand-ins and files as that tree lays them out); default: --host")
    a = ap.parse_args()
    trees = {**({"before": a.before.resolve()} if a.before else {}), "after": REPO}
    root = a.host.resolve() if a.host else done_host()
    try:
        res = run_all(a, trees, root)
    finally:
        if not a.host:  # the host this run made: its engine stopped and its directory gone, nothing left running
            subprocess.run([sys.executable, "-c", LAUNCHER, "sim", "stop", str(root)], env=env_for(REPO),
                           cwd=root.parent, capture_output=True, text=True)
            shutil.rmtree(root.parent, ignore_errors=True)
    print(json.dumps(res, indent=2))


def run_all(a, trees: dict, root: Path) -> dict:
    roots = {"after": root, "before": a.before_host.resolve() if a.before_host else root}
    log = root / "var/lib/p2pkit/logs/driver.log"
    mtime = log.stat().st_mtime_ns if log.exists() else None
    res = {
        "runs": a.runs,
        "trees": {k: str(v) for k, v in trees.items()},
        "host": str(root), "before_host": str(roots["before"]),
        "help": measure(["--help"], trees, a.runs),
        "version": measure(["--version"], trees, a.runs),
        "status": measure(lambda name: ["--root", str(roots[name]), "status"], trees, a.runs),
        "noop_up": measure(lambda name: ["--root", str(roots[name]), "up"], trees, a.runs),
        "framework_floor_cpu_s": framework_floor(a.runs),
        "ansible_started_by_noop_up": log.exists() and log.stat().st_mtime_ns != mtime,
        "aims": AIMS,
    }
    return res


if __name__ == "__main__":
    main()
