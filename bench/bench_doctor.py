"""`p2pkit doctor` wall time against `nvidia-smi -q` on the same machine, in one run.

Run on a GPU host: `python3 bench/bench_doctor.py [--runs 5]`. Prints the median of each and the
ratio (aim: doctor within 2x of nvidia-smi -q, while judging far more).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def wall(argv: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    smi = wall(["nvidia-smi", "-q"], args.runs)
    doc = wall([sys.executable, "-m", "p2pkit", "doctor", "--json"], args.runs)
    print(json.dumps({"nvidia_smi_q_s": round(statistics.median(smi), 3),
                      "doctor_s": round(statistics.median(doc), 3),
                      "ratio": round(statistics.median(doc) / statistics.median(smi), 2), "aim": "<= 2.0",
                      "runs": args.runs, "all": {"nvidia_smi_q": smi, "doctor": doc}}, indent=2))


if __name__ == "__main__":
    main()
