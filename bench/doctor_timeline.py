"""Where `p2pkit doctor`'s time goes, in one process: when the waiting facts start (p2pkit.facts.collect's
start_early), each fact's start and end, when the imports are done (app.doctor.run called), when its facts
are all in, and the end; seconds from the interpreter's start (time.perf_counter at this script's first
line, after the interpreter's own start-up). doctor runs as the command runs it (p2pkit.cli.main.main, its
output to /dev/null), its code untouched: the timings come from wrappers put around four functions first.

    python3 bench/doctor_timeline.py [--runs 3] [-- DOCTOR ARGS]   (default: doctor --json)

Prints one JSON object a run: {"facts_started_s", "imports_done_s", "facts_done_s", "end_s", "exit",
"modules", "facts": [[name, start_s, end_s], ...] by end}. Run from a checkout, no install needed."""

import time

T0 = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def one(args: list[str]) -> dict:
    """One doctor in this process, instrumented."""
    sys.path.insert(0, str(REPO))
    marks: dict = {"facts": []}

    def at() -> float:
        return round(time.perf_counter() - T0, 4)

    import p2pkit.facts.collect as collect  # the waiting facts' module: imported here as main.py would

    orig_one, orig_start, orig_collect = collect._one, collect.start_early, collect.collect

    def one_fact(host, name, profile, *rest):  # whatever else collect hands a fact's reading (its used facts)
        s = at()
        try:
            return orig_one(host, name, profile, *rest)
        finally:
            marks["facts"].append([name, s, at()])

    def start_early(host):
        marks["facts_started_s"] = at()
        return orig_start(host)

    def collect_(host, names=None, profile=None):
        marks["imports_done_s"] = at()
        try:
            return orig_collect(host, names, profile)
        finally:
            marks["facts_done_s"] = at()

    collect._one, collect.start_early, collect.collect = one_fact, start_early, collect_
    from p2pkit.cli import main as cli_main

    sys.argv = ["p2pkit", *args]
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(1)
    os.dup2(devnull, 1)
    code = 0
    try:
        cli_main.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
    marks["end_s"] = at()
    marks["exit"] = code
    marks["modules"] = len(sys.modules)
    marks["facts"].sort(key=lambda f: f[2])
    return marks


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: doctor_timeline.py [--runs N] [-- DOCTOR ARGS]\n\n{__doc__}")
        return 0
    runs = 3
    if argv[:1] == ["--runs"]:
        try:
            runs = int(argv[1])
        except (IndexError, ValueError):
            print("usage: doctor_timeline.py [--runs N] [-- DOCTOR ARGS]", file=sys.stderr)
            return 2
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    args = argv or ["doctor", "--json"]
    if os.environ.get("_DOCTOR_TIMELINE_CHILD"):
        print(json.dumps(one(args)))
        return 0
    env = {**os.environ, "_DOCTOR_TIMELINE_CHILD": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for _ in range(runs + 1):  # the first writes byte code and warms the page cache: not printed
        r = subprocess.run([sys.executable, __file__, "--", *args], env=env, capture_output=True, text=True,
                           check=False)
        if r.returncode != 0 or not r.stdout.strip():
            print(f"doctor_timeline: the run failed (exit {r.returncode}): {r.stderr.strip()[-400:]}", file=sys.stderr)
            return 1
        if _ == 0:
            continue
        print(r.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
