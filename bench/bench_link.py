"""Host<->device bandwidth: p2pkit's measurement against a plain CUDA reference, same GPU, same run.

Run on a GPU host: `python3 bench/bench_link.py [--device 0] [--mib 512]`. Builds bench/h2d_ref.cu
with nvcc, alternates reference and p2pkit twice, prints one JSON document: each figure, the
ratio p2pkit / reference (target >= 0.95) and each figure's ratio to the link's raw ceiling.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--mib", type=int, default=512)
    args = ap.parse_args()
    import pynvml
    import torch

    from p2pkit.load.worker import host_bandwidth
    from p2pkit.stages.link.checks import ceiling_gbps

    exe = Path(tempfile.mkdtemp()) / "h2d_ref"
    subprocess.run(["nvcc", "-O2", "-o", str(exe), str(Path(__file__).with_name("h2d_ref.cu"))], check=True)
    runs = []
    for _ in range(2):
        ref = json.loads(subprocess.run([str(exe), str(args.device), str(args.mib)], check=True,
                                        capture_output=True, text=True).stdout)
        mine = host_bandwidth(torch, args.device, args.mib << 20, 9)
        runs.append({"reference": ref, "p2pkit": {k: mine[k] for k in ("h2d_gbps", "d2h_gbps")}})
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(args.device)
    gen, width = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h), pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)
    ceil = ceiling_gbps(gen, width)
    summary = {}
    for key in ("h2d_gbps", "d2h_gbps"):
        ref = max(r["reference"][key] for r in runs)
        mine = max(r["p2pkit"][key] for r in runs)
        summary[key] = {"reference": round(ref, 2), "p2pkit": round(mine, 2), "ratio": round(mine / ref, 4),
                        "reference_of_ceiling": round(ref / ceil, 3), "p2pkit_of_ceiling": round(mine / ceil, 3)}
    print(json.dumps({"gpu": torch.cuda.get_device_name(args.device), "link": f"Gen{gen} x{width}",
                      "ceiling_gbps": round(ceil, 2), "target_ratio": 0.95, "summary": summary, "runs": runs},
                     indent=2))


if __name__ == "__main__":
    main()
