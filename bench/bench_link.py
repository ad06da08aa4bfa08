"""Host<->device bandwidth: p2pkit's measurement against a plain CUDA reference, same GPU, same run.

Run on a GPU host: `python3 bench/bench_link.py [--device 0] [--mib 512]` (from a checkout: no install
needed). Builds bench/h2d_ref.cu with nvcc, alternates reference and p2pkit twice, prints one JSON
document: each figure, the ratio p2pkit / reference (target >= 0.95) and each figure's ratio to the
link's raw ceiling. p2pkit's side is the link stage's own: the load worker's device backend
(p2pkit.load.worker.TorchDevices) and its host_bandwidth.

`--root DIR` runs p2pkit's side on a simulated host's devices instead (`p2pkit sim init DIR`): every step
but the GPU's, labelled SIMULATED, the CUDA reference left out (there is no GPU to run it on).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # p2pkit from this checkout, installed or not


def devices(root: Path | None):
    """The link stage's device backend: the real GPUs (torch and NVML), or a simulated host's."""
    from p2pkit.core.errors import P2pkitError
    from p2pkit.host import Host
    from p2pkit.load import worker

    try:
        spec = Host.at(root).load_backend() if root else None
    except P2pkitError:
        spec = None
    if root and spec is None:
        raise SystemExit(f"error: {root} is not a simulated host (`p2pkit sim init {root}` lays one out)")
    return worker.devices(spec), spec is not None


def reference_exe() -> Path | str:
    """bench/h2d_ref.cu built with nvcc; a sentence when it cannot be."""
    if shutil.which("nvcc") is None:
        return "not run: nvcc is not on PATH (the CUDA toolkit builds bench/h2d_ref.cu)"
    exe = Path(tempfile.mkdtemp()) / "h2d_ref"
    subprocess.run(["nvcc", "-O2", "-o", str(exe), str(Path(__file__).with_name("h2d_ref.cu"))], check=True)
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--root", type=Path, help="a simulated host (p2pkit sim init): its devices, no reference")
    args = ap.parse_args()
    from p2pkit.load.worker import host_bandwidth
    from p2pkit.stages.link.checks import ceiling_gbps

    dev, simulated = devices(args.root)
    why = dev.unavailable()
    if why:
        print(f"error: no GPU to measure: {why}", file=sys.stderr)
        return 3
    exe = "not run: simulated devices (no GPU to run bench/h2d_ref.cu on)" if simulated else reference_exe()
    runs = []
    for _ in range(2):  # reference and p2pkit in turn
        ref = json.loads(subprocess.run([str(exe), str(args.device), str(args.mib)], check=True, capture_output=True,
                                        text=True).stdout) if isinstance(exe, Path) else None
        mine = host_bandwidth(dev, args.device, args.mib << 20, 9)
        runs.append({"reference": ref, "p2pkit": {k: mine[k] for k in ("h2d_gbps", "d2h_gbps")}})
    nv = dev.nvml
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(args.device)
    # the ceiling of the link as it can train (device and slot): a link idles below it between copies
    gen, width = nv.nvmlDeviceGetMaxPcieLinkGeneration(h), nv.nvmlDeviceGetMaxPcieLinkWidth(h)
    ceil = ceiling_gbps(gen, width)
    summary = {}
    for key in ("h2d_gbps", "d2h_gbps"):
        mine = max(r["p2pkit"][key] for r in runs)
        row = {"p2pkit": round(mine, 2), "p2pkit_of_ceiling": round(mine / ceil, 3)}
        if isinstance(exe, Path):
            best = max(r["reference"][key] for r in runs)
            row.update(reference=round(best, 2), ratio=round(mine / best, 4),
                       reference_of_ceiling=round(best / ceil, 3))
        summary[key] = row
    print(json.dumps({**({"simulated": True, "label": "SIMULATED"} if simulated else {}),
                      "gpu": dev.describe(args.device)[0], "link": f"Gen{gen} x{width}", "ceiling_gbps": round(ceil, 2),
                      "target_ratio": 0.95, **({"reference": exe} if isinstance(exe, str) else {}),
                      "summary": summary, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
