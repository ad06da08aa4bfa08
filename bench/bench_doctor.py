"""`p2pkit doctor` wall time against `nvidia-smi -q`, and `p2pkit --help` / `--version` against a bare
interpreter, on the same machine, in one run.

Run on a GPU host: `python3 bench/bench_doctor.py [--runs 9]` (from a checkout: no install needed, p2pkit
runs from this tree). Each round runs, in turn, `python3 -c pass`, `p2pkit --help`, `p2pkit --version`,
`p2pkit doctor --json` and `nvidia-smi -q`, and each ratio is taken pair by pair within a round, so a
machine whose speed drifts still gives a fair ratio (farm-bench's method; farm-bench itself is not on the
GPU machine). Aims (issue 38): doctor at most 1.5x `nvidia-smi -q`, while judging far more; --help and
--version at most 1.5x a bare interpreter. p2pkit runs as the installed command does: scripts/p2pkit (what
pip installs as bin/p2pkit), from this checkout.

Python's floor without site's .pth files (`python3 -S -c pass`) is printed too: no Python command can be
faster than that. Byte code is written on a warm-up round first (PYTHONDONTWRITEBYTECODE is dropped for
the children): a pip-installed p2pkit has its .pyc files, and a run that compiles every module each time
measures the compiler, not p2pkit. `--smi` names another command in place of `nvidia-smi -q` (a machine
without a GPU: the CI test runs every step with a stand-in).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
P2PKIT_ENV = {**ENV, "PYTHONPATH": os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)}


def once(argv: list[str], env: dict[str, str] = ENV) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env,
                       cwd=REPO.parent)
    return time.perf_counter() - t0, r.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--doctor", default=None,
                    help="the doctor command line (split like a shell; default: p2pkit doctor --json from this tree)")
    ap.add_argument("--smi", default="nvidia-smi -q", help="the reference command line (default: nvidia-smi -q)")
    args = ap.parse_args()
    py = sys.executable
    p2pkit = [py, str(REPO / "scripts/p2pkit")]
    cmds = {"python -c pass": ([py, "-c", "pass"], ENV), "python -S -c pass": ([py, "-S", "-c", "pass"], ENV),
            "p2pkit --help": ([*p2pkit, "--help"], P2PKIT_ENV),
            "p2pkit --version": ([*p2pkit, "--version"], P2PKIT_ENV),
            "doctor": (shlex.split(args.doctor) if args.doctor else [*p2pkit, "doctor", "--json"], P2PKIT_ENV),
            "smi": (shlex.split(args.smi), ENV)}
    try:
        for argv, env in cmds.values():  # warm-up: byte code written, page cache warm
            once(argv, env)
    except FileNotFoundError as e:
        print(f"error: {e.filename} is not installed here: this bench needs it (or name another with --smi)",
              file=sys.stderr)
        return 2
    got: dict[str, list[float]] = {k: [] for k in cmds}
    rcs: dict[str, set[int]] = {k: set() for k in cmds}
    for _ in range(args.runs):
        for name, (argv, env) in cmds.items():
            s, rc = once(argv, env)
            got[name].append(s)
            rcs[name].add(rc)
    med = statistics.median

    def ratio(a: str, b: str) -> float:
        return round(med(x / y for x, y in zip(got[a], got[b], strict=True)), 2)

    print(json.dumps({
        "doctor_s": round(med(got["doctor"]), 3), "nvidia_smi_q_s": round(med(got["smi"]), 3),
        "ratio": ratio("doctor", "smi"), "aim": "<= 1.5",
        "help_s": round(med(got["p2pkit --help"]), 4), "version_s": round(med(got["p2pkit --version"]), 4),
        "python_c_pass_s": round(med(got["python -c pass"]), 4),
        "python_S_c_pass_s": round(med(got["python -S -c pass"]), 4),
        "help_vs_python": ratio("p2pkit --help", "python -c pass"),
        "version_vs_python": ratio("p2pkit --version", "python -c pass"), "help_version_aim": "<= 1.5",
        "reference": args.smi, "runs": args.runs,
        "exit_codes": {k: sorted(v) for k, v in rcs.items()},
        "all": {k: [round(x, 4) for x in v] for k, v in got.items()},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
