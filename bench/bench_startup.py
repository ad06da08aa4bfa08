"""Start-up and no-op wall times: `p2pkit --help`, `p2pkit status`, and `p2pkit up` on a simulated
host where every gate holds (no ansible-playbook may start). Aims: --help under 0.3 s, no-op up
under 1 s. Run by hand: `python3 bench/bench_startup.py [--runs 5]`."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXE = str(Path(sys.executable).parent / "p2pkit")


def wall(argv: list[str], runs: int) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - t0)
    return round(statistics.median(out), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    root = Path(tempfile.mkdtemp()) / "sim"
    subprocess.run([EXE, "sim", "init", str(root)], check=True, capture_output=True)
    subprocess.run([EXE, "--root", str(root), "up", "--reboot", "--to", "link"], check=True, capture_output=True)
    log = root / "var/lib/p2pkit/logs/driver.log"
    before = log.stat().st_mtime_ns
    res = {
        "help_s": wall([EXE, "--help"], runs),
        "status_s": wall([EXE, "--root", str(root), "status"], runs),
        "noop_up_s": wall([EXE, "--root", str(root), "up", "--to", "link"], runs),
        "ansible_started_by_noop_up": log.stat().st_mtime_ns != before,
        "aims": {"help_s": 0.3, "noop_up_s": 1.0},
        "runs": runs,
    }
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
