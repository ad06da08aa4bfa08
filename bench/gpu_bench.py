"""`p2pkit bench` on a GPU machine whose hardware stages cannot pass (issue 27, the lent H200), past
its gate: bench.run as the command runs it (the same arms, levels, reference and plot), its JSON
written as the bench artifact of that state directory and to --out.

    python3 bench/gpu_bench.py --profile bench/h200-llamacpp.toml --state-dir DIR [--set K=V ...] \\
        --shapes decode,production --concurrency 1,2,4,8 --requests 2 --reference [--ab K=V] \\
        --out bench.json --plot bench.png"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str]) -> int:
    from gpu_stages import context, parser  # beside this script: the options and context of the GPU run

    from p2pkit.app import bench
    from p2pkit.cli import bench_cmd
    from p2pkit.core.errors import P2pkitError

    ap = parser(__doc__)
    ap.add_argument("--shapes")
    ap.add_argument("--concurrency")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--ab")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args(argv)
    ctx = context(a)
    p = ctx.profile
    try:
        doc = bench.run(ctx, p.bench.prompt_tokens, p.bench.output_tokens, a.warmup, a.requests, a.ab,
                        bench_cmd._shapes(a.shapes), bench_cmd._ints(a.concurrency, "--concurrency"), a.reference)
    except P2pkitError as e:
        print(f"error: {e.message}\nfix: {e.hint}", file=sys.stderr)
        return 1
    if a.plot:
        bench_cmd.plot(doc, a.plot)
        doc["plot"] = str(a.plot)
    doc["artifact"] = str(ctx.store.write("bench", doc))
    a.out.write_text(json.dumps(doc, indent=1))
    for row in bench_cmd.rows(doc):
        print(" | ".join(str(x) for x in row))
    for k in ("reference_ratios", "batched_ratios"):
        for r in doc.get(k, []):
            print(json.dumps(r))
    for ref in doc.get("batched_reference", {}).get("shapes", []):
        if "error" in ref:
            print(f"llama-batched-bench {ref['shape']}: {ref['error']}")
    return 1 if any(x.get("error") for x in doc["arms"]) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
