"""Run p2pkit's own stages on a GPU machine whose hardware stages cannot pass (issue 27: the lent
H200 has one GPU, another driver and no systemd as PID 1), past the gate, by hand:

    python3 bench/gpu_stages.py --profile bench/h200-llamacpp.toml --state-dir DIR [--set K=V ...] STAGE...

Each named stage runs as `p2pkit up` runs it (pipeline.run_stage: artifact deleted, act, prove,
artifact written) but without the gate rule, which `up` keeps: preflight to link are not run here.
Prints each check; exits 1 when a stage fails. Every artifact it writes is an ordinary one, read
by `p2pkit status` and `verify` on that state directory."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parser(doc: str):
    """The options every GPU-run script takes: the profile, its overrides and the state directory."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--state-dir", required=True, type=Path)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    return ap


def context(a):
    """The real host at / with the profile and state directory the options name."""
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host

    return pipeline.Ctx(profile=config.load(a.profile, a.overrides), host=Host.at("/"), store=Store(a.state_dir),
                        out=Output())


def main(argv: list[str]) -> int:
    from p2pkit.app import pipeline
    from p2pkit.stages import get

    ap = parser(__doc__)
    ap.add_argument("stages", nargs="+")
    a = ap.parse_args(argv)
    ctx = context(a)
    names = [s.name for s in pipeline.registry()]
    worst = 0
    for name in a.stages:
        st = get(name)
        prev = names[names.index(name) - 1] if names.index(name) else None
        t0 = time.monotonic()
        print(f"== {name} (gate bypassed by bench/gpu_stages.py)", flush=True)
        doc = pipeline.run_stage(ctx, st, prev)
        pipeline.report_checks(ctx.out, name, doc["checks"])
        print(json.dumps({"stage": name, "status": doc["status"], "seconds": round(time.monotonic() - t0, 1)}),
              flush=True)
        if doc["status"] == "failed":
            worst = 1
            break
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
