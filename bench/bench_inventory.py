"""Inventory runs on 1, 4 and 8 simulated hosts (local connection, each its own root): CPU-seconds
(user+sys of p2pkit and every process it waited for) and wall of `up --inventory --reboot` and of
`status --inventory`, with the fixed and per-host cost fitted over the sizes (least squares), and
a plain `p2pkit status` of one host beside them (the part each host's own p2pkit costs).

With --vs-source DIR (another p2pkit source tree, e.g. `git archive <commit> | tar -x -C DIR`),
that tree brings up hosts of its own (its stand-ins, its files) with `up --inventory --reboot` (a
fixed and per-host fit for each, and the per-host ratio) and `status --inventory` runs A B A B ...
against it, paired run by run, with a fixed and per-host fit for each.

--no-bytecode keeps PYTHONDONTWRITEBYTECODE=1 (this environment sets it; issue 20 measured with it:
every p2pkit process compiles every module it imports); by default byte code is written, as a
pip-installed p2pkit has it.

Run by hand: `python3 bench/bench_inventory.py [--sizes 1 4 8] [--runs 3] [--up-runs 1] [--vs-source DIR]
[--no-bytecode]`; --up-runs N brings up fresh hosts N times per size, A and B in turn, and takes the median.
Not a test: nothing here asserts a time."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAIN = "import sys; from p2pkit.cli.main import main; sys.argv[0] = 'p2pkit'; sys.exit(main())"


def timed(argv: list[str], env: dict, cwd: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"rc": r.returncode, "wall_s": round(wall, 2),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)}


BYTECODE = True


def p2pkit(source: Path | None) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if not BYTECODE:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    # the other tree, or this checkout (`python3 bench/NAME.py` runs without an install), before what was there
    tree = str(source if source is not None else Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (tree, os.environ.get("PYTHONPATH")) if x)
    return [sys.executable, "-c", MAIN], env


def fit(points: list[tuple[int, float]]) -> dict:
    """cost = fixed + per_host * hosts, least squares over the sizes measured."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return {"fixed_cpu_s": round(my - slope * mx, 2), "per_host_cpu_s": round(slope, 2)}


def hosts(d: Path, prefix: str, n: int, argv: list[str], env: dict, work: Path) -> tuple[list[Path], Path]:
    """n simulated hosts laid out by this p2pkit, and an inventory naming them (local connection)."""
    roots = [d / f"{prefix}{i}" for i in range(n)]
    for r in roots:
        subprocess.run([*argv, "sim", "init", str(r)], env=env, cwd=work, check=True, capture_output=True)
    inv = d / f"{prefix}-hosts.yml"
    inv.write_text("all:\n  hosts:\n" + "".join(f"    {prefix}{i}: {{ansible_connection: local, p2pkit_root: {r}}}\n"
                                                 for i, r in enumerate(roots)))
    return roots, inv


def stop(roots: list[Path], argv: list[str], env: dict, work: Path) -> None:
    """The engines these simulated hosts' `up` started."""
    for r in roots:
        subprocess.run([*argv, "sim", "stop", str(r)], env=env, cwd=work, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--runs", type=int, default=3, help="status --inventory runs per size (median)")
    ap.add_argument("--up-runs", type=int, default=1, help="`up --inventory` runs per size, A B A B on fresh "
                    "hosts (median)")
    ap.add_argument("--vs-source", type=Path, help="another p2pkit source tree to pair status --inventory against")
    ap.add_argument("--no-bytecode", action="store_true", help="keep PYTHONDONTWRITEBYTECODE=1, as issue 20 measured")
    a = ap.parse_args()
    global BYTECODE
    BYTECODE = not a.no_bytecode
    work = Path(tempfile.mkdtemp(prefix="bench-inventory-"))
    # the controller's state directory (its inventory logs, its lock) is the bench's, never this machine's
    # /var/lib/p2pkit
    controller = ["--state-dir", str(work / "controller")]
    argv, env = p2pkit(None)
    out: dict = {"bytecode_written": BYTECODE, "sizes": {}}
    up_points, status_points, vs_points, vs_up_points = [], [], [], []
    for n in a.sizes:
        d = work / f"n{n}"
        d.mkdir()
        b_argv, b_env = p2pkit(a.vs_source.resolve()) if a.vs_source else (None, None)
        ups, b_ups = [], []
        for k in range(a.up_runs):  # A B A B ...: fresh hosts for every `up`
            roots, inv = hosts(d, f"h{k}-", n, argv, env, work)
            ups.append(timed([*argv, *controller, "--json", "up", "--inventory", str(inv), "--reboot"], env, work))
            if k < a.up_runs - 1:
                stop(roots, argv, env, work)
            if a.vs_source:
                b_roots, b_inv = hosts(d, f"b{k}-", n, b_argv, b_env, work)
                b_ups.append(timed([*b_argv, *controller, "--json", "up", "--inventory", str(b_inv), "--reboot"],
                                   b_env, work))
                if k < a.up_runs - 1:
                    stop(b_roots, b_argv, b_env, work)
        up = {"runs": ups, "cpu_s": statistics.median(u["cpu_s"] for u in ups),
              "wall_s": statistics.median(u["wall_s"] for u in ups)}
        status = [timed([*argv, *controller, "--json", "status", "--inventory", str(inv)], env, work)
                  for _ in range(a.runs)]
        row = {"up": up, "status_inventory": status,
               "status_inventory_median_cpu_s": statistics.median(s["cpu_s"] for s in status)}
        if a.vs_source:
            row["vs_up"] = {"runs": b_ups, "cpu_s": statistics.median(u["cpu_s"] for u in b_ups),
                            "wall_s": statistics.median(u["wall_s"] for u in b_ups)}
            pairs = []
            for _ in range(a.runs):
                x = timed([*argv, *controller, "--json", "status", "--inventory", str(inv)], env, work)
                y = timed([*b_argv, *controller, "--json", "status", "--inventory", str(b_inv)], b_env, work)
                pairs.append({"A": x, "B": y, "ratio_cpu": round(x["cpu_s"] / y["cpu_s"], 3)})
            row["vs"] = {"pairs": pairs, "median_B_cpu_s": statistics.median(p["B"]["cpu_s"] for p in pairs),
                         "median_ratio_cpu": statistics.median(p["ratio_cpu"] for p in pairs)}
            vs_points.append((n, row["vs"]["median_B_cpu_s"]))
            vs_up_points.append((n, row["vs_up"]["cpu_s"]))
            stop(b_roots, b_argv, b_env, work)  # the engines B's hosts started
        if n == a.sizes[0]:
            out["plain_status_one_host"] = [timed([*argv, "--root", str(roots[0]), "--json", "status"], env, work)
                                            for _ in range(a.runs)]
        stop(roots, argv, env, work)
        out["sizes"][n] = row
        up_points.append((n, up["cpu_s"]))
        status_points.append((n, row["status_inventory_median_cpu_s"]))
    out["up_fit"] = fit(up_points)
    out["status_fit"] = fit(status_points)
    if vs_points:
        out["status_fit_B"] = fit(vs_points)
        out["up_fit_B"] = fit(vs_up_points)
        b_per_host = out["up_fit_B"]["per_host_cpu_s"]
        a_per_host = out["up_fit"]["per_host_cpu_s"]
        out["up_per_host_ratio_A_over_B"] = round(a_per_host / b_per_host, 3) if b_per_host else None
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
