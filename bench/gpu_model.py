"""Make a Llama checkpoint of realistic size on a machine without network, for the engine on a real
GPU (issue 27): random weights (throughput does not care what they say), its own byte-fallback BPE
tokenizer, laid out as Hugging Face writes one, built by the same code as the tests' tiny checkpoint
(tests/tiny_checkpoint.py). Three sizes: `main` (about 0.76B parameters: hidden 2048, 16 layers, FFN
5632, a 32K context), `draft` (about 7M, the same vocabulary, for speculative decoding) and `large`
(about 5.7B: Llama-2-7B's shape with 8 KV heads, hidden 4096, 32 layers, FFN 11008; every layer holds
the first layer's random values, so its 11 GB are written in seconds: a decode step of several
milliseconds, as a real model's, against main's one, issue 38).

    python3 bench/gpu_model.py main DIR
    python3 bench/gpu_model.py draft DIR
    python3 bench/gpu_model.py large DIR

Prints the parameter count and the bytes written as JSON."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

SIZES = {
    "main": {"hidden": 2048, "layers": 16, "heads": 16, "kv_heads": 8, "ffn": 5632, "seed": 1, "context": 32768},
    "draft": {"hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 704, "seed": 2, "context": 32768},
    "large": {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "ffn": 11008, "seed": 3, "context": 32768,
              "distinct_layers": False},
}


def main(argv: list[str]) -> int:
    if argv in (["--help"], ["-h"]):
        print(f"usage: gpu_model.py {'|'.join(SIZES)} DIR\n\n{__doc__}")
        return 0
    if len(argv) != 2 or argv[0] not in SIZES:
        print(f"usage: gpu_model.py {'|'.join(SIZES)} DIR", file=sys.stderr)
        return 2
    import tiny_checkpoint

    out = Path(argv[1])
    if out.exists() and any(out.iterdir()):
        print(f"{out} exists and is not empty: not overwritten", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    tiny_checkpoint.make(out, **SIZES[argv[0]])
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    params = idx["metadata"]["total_size"] // 2  # float16
    print(json.dumps({"size": argv[0], "dir": str(out), "parameters": params, "vocab": cfg["vocab_size"],
                      "bytes": sum(f.stat().st_size for f in out.iterdir()),
                      "seconds": round(time.monotonic() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
