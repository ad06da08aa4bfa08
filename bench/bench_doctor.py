"""`p2pkit doctor` wall time against `nvidia-smi -q` on the same machine, in one run.

Run on a GPU host: `python3 bench/bench_doctor.py [--runs 7]`. The two commands run in turn
(doctor, nvidia-smi, doctor, ...) and the ratio is taken pair by pair, so a machine whose speed
drifts still gives a fair ratio (farm-bench's method; farm-bench itself is not on the GPU machine).
Aim: doctor at or under 1.5x `nvidia-smi -q`, while judging far more.

Python's own floor is printed beside it (`python3 -c pass`, and `-S` without site's .pth files),
because no Python command can be faster than that. Byte code is written on a warm-up run first
(PYTHONDONTWRITEBYTECODE is dropped for the children): a pip-installed p2pkit has its .pyc files,
and a run that compiles every module each time measures the compiler, not p2pkit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=ENV)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--doctor", default=f"{sys.executable} -m p2pkit doctor --json",
                    help="the doctor command line (split on spaces)")
    args = ap.parse_args()
    doctor, smi = args.doctor.split(), ["nvidia-smi", "-q"]
    once(doctor)  # warm-up: byte code written, page cache warm
    once(smi)
    pairs = [(once(doctor), once(smi)) for _ in range(args.runs)]
    floor = [once([sys.executable, "-c", "pass"]) for _ in range(args.runs)]
    floor_s = [once([sys.executable, "-S", "-c", "pass"]) for _ in range(args.runs)]
    med = statistics.median
    print(json.dumps({
        "doctor_s": round(med(d for d, _ in pairs), 3),
        "nvidia_smi_q_s": round(med(s for _, s in pairs), 3),
        "ratio": round(med(d / s for d, s in pairs), 2), "aim": "<= 1.5",
        "python_c_pass_s": round(med(floor), 3), "python_S_c_pass_s": round(med(floor_s), 3),
        "runs": args.runs,
        "all": {"doctor": [round(d, 3) for d, _ in pairs], "nvidia_smi_q": [round(s, 3) for _, s in pairs]},
    }, indent=2))


if __name__ == "__main__":
    main()
