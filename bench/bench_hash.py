"""The model artifact hash: p2pkit's streamed sha256 against `sha256sum` on the same file, in one
run (aim: at least 0.9 of sha256sum's throughput). Run by hand: `python3 bench/bench_hash.py
[--mib 2048] [--runs 3]`; the file is written to a temporary directory and removed."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # p2pkit from this checkout, installed or not

from p2pkit.host import Host
from p2pkit.host.model import sha256_cached


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp())
    f = d / "model.bin"
    with open(f, "wb") as fh:
        for _ in range(a.mib):
            fh.write(os.urandom(1 << 20))
    mine, ref = [], []
    try:
        for i in range(a.runs):
            t0 = time.perf_counter()
            out = subprocess.run(["sha256sum", str(f)], capture_output=True, text=True, check=True).stdout.split()[0]
            ref.append(time.perf_counter() - t0)
            cache = d / f"cache-{i}.json"  # a fresh cache: really hash every time
            t0 = time.perf_counter()
            got = sha256_cached(Host.at("/"), f, cache)
            mine.append(time.perf_counter() - t0)
            assert got == out, "digests differ"
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
    mb = a.mib * (1 << 20) / 1e6
    res = {"file_mib": a.mib, "sha256sum_MBps": round(mb / statistics.median(ref), 1),
           "p2pkit_MBps": round(mb / statistics.median(mine), 1),
           "ratio": round(statistics.median(ref) / statistics.median(mine), 3), "aim": ">= 0.9",
           "note": "page cache warm after the first write; both read the same cached file"}
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
