"""Every script in bench/ still starts against the code as it is (a bench script that no longer runs is a
defect: bench_link.py once crashed on the H200 after an API it used had moved): each parses its
arguments and imports what it imports at the top; the checkpoint maker of the GPU run makes its draft."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "gpu_model.py")


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_bench_script_answers_help(name):
    r = subprocess.run([sys.executable, str(BENCH / name), "--help"], capture_output=True, text=True, timeout=120,
                       cwd=BENCH.parent)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), (name, r.stdout[-500:], r.stderr[-1500:])


def test_the_gpu_runs_checkpoint_maker_makes_its_draft(tmp_path):
    """bench/gpu_model.py draft: the same vocabulary as the main model, a 32K context, and it never
    writes into a directory that holds something."""
    pytest.importorskip("safetensors")
    out = tmp_path / "draft"
    r = subprocess.run([sys.executable, str(BENCH / "gpu_model.py"), "draft", str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    made = json.loads(r.stdout)
    cfg = json.loads((out / "config.json").read_text())
    assert made["parameters"] > 1_000_000 and cfg["max_position_embeddings"] == 32768
    assert cfg["vocab_size"] == made["vocab"] and (out / "tokenizer.json").is_file()
    again = subprocess.run([sys.executable, str(BENCH / "gpu_model.py"), "draft", str(out)], capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 2 and "not overwritten" in again.stderr
    assert subprocess.run(["bash", "-n", str(BENCH / "gpu_engine_run.sh")]).returncode == 0
