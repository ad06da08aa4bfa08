"""bench by seed 000's method, the parts that need no server: the levels, the P13 lengths check, the
llama-bench reference arm over llama-bench's real outputs (recorded from the real binaries: the CPU
build here, tests/fixtures/llamacpp/bench, and the CUDA build on the lent H200,
tests/fixtures/h200-device/engine-run/formats), and the CLI's refusals of a bad level list."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from p2pkit.app import bench
from p2pkit.cli import bench_cmd
from p2pkit.core import config
from p2pkit.core.errors import UsageError

FIX = Path(__file__).parent / "fixtures"


def test_levels_are_each_shape_at_each_concurrency_in_order():
    assert bench.levels_of(["decode", "production"], [1, 8], 99, 9) == [
        ("decode", 128, 512, 1), ("decode", 128, 512, 8), ("production", 2048, 128, 1), ("production", 2048, 128, 8)]
    assert bench.levels_of(None, None, 99, 9) == [("profile", 99, 9, 1)]


def test_p13_lengths_the_server_ran_against_the_asked():
    ok = bench.lengths_ran([{"prompt_n": 128, "predicted_n": 512}] * 2, 128, 512)
    assert ok["match"] and ok["prompt_n"] == [128]
    off = bench.lengths_ran([{"prompt_n": 131, "predicted_n": 512}], 128, 512)  # a BOS and a word split in two
    assert not off["match"] and off["prompt_n"] == [131]
    assert not bench.lengths_ran([], 128, 512)["match"]  # nothing ran is not a match


@pytest.mark.parametrize("bad", ["0", "1,x", "", "300"])
def test_a_bad_concurrency_list_is_a_usage_error(bad):
    with pytest.raises(UsageError) as e:
        bench_cmd._ints(bad, "--concurrency")
    assert "--concurrency 1,2,4,8" in e.value.hint


def test_an_unknown_shape_names_the_known_ones():
    with pytest.raises(UsageError) as e:
        bench_cmd._shapes("decode,chat")
    assert "chat" in e.value.message and "production (2048 prompt / 128 output tokens)" in e.value.hint


def _ctx(outputs: list[SimpleNamespace]):
    p = config.load("dual-5090-llamacpp")
    calls = []

    def run(argv, check=False, timeout=None):
        calls.append(argv)
        return outputs.pop(0)
    host = SimpleNamespace(path=lambda x: Path(x), runner=SimpleNamespace(run=run))
    out = SimpleNamespace(working=lambda *a, **k: __import__("contextlib").nullcontext())
    return SimpleNamespace(host=host, out=out, profile=p), p, calls


def test_the_reference_reads_the_h200s_real_llama_bench_at_the_same_depth():
    """llama-bench's real JSON from the CUDA build on the H200 (-p 64 -n 32 -d 0,64): the prefill
    reference is pp at depth 0, the decode reference tg at the prompt's depth."""
    text = (FIX / "h200-device/engine-run/formats/llama-bench.json").read_text()
    ctx, p, calls = _ctx([SimpleNamespace(returncode=0, stdout=text, stderr="")])
    ref = bench.reference_arm(ctx, p, [("tiny", 64, 32)])
    shape = ref["shapes"][0]
    assert "error" not in shape, shape
    assert shape["prefill_tps"]["test"] == "pp64" and shape["decode_tps"]["test"] == "tg32 @ d64"
    argv = calls[0]
    assert argv[argv.index("-d") + 1] == "0,64" and argv[argv.index("-p") + 1] == "64"
    assert argv[argv.index("-ngl") + 1] == "99" and argv[argv.index("-fa") + 1] == "on"  # the server's settings
    doc = {"arms": [{"levels": [{"shape": "tiny", "concurrency": 1, "summary": {
        "decode_tps": {"median": shape["decode_tps"]["avg"] / 2}, "prefill_tps": {"median": 1.0}}}]}],
           "reference": ref}
    r = bench.reference_ratios(doc)[0]
    assert r["decode_tps"]["ratio"] == 0.5


def test_a_failing_llama_bench_leaves_an_error_on_its_shape_and_the_rest_alone():
    """The real llama-bench's output for a model it cannot load (exit 1, its error line on stderr), and one
    that prints nothing: each shape says why; the reference arm never raises, so the served arms stay."""
    rec = json.loads((FIX / "llamacpp/bench/error-missing-model.json.json").read_text())
    ctx, p, _ = _ctx([SimpleNamespace(returncode=int(rec["rc"]), stdout=rec["stdout"], stderr=rec["stderr"]),
                      SimpleNamespace(returncode=0, stdout="", stderr="")])
    ref = bench.reference_arm(ctx, p, [("decode", 128, 512), ("production", 2048, 128)])
    missing, empty = ref["shapes"]
    assert "failed to load model" in missing["error"] and "prefill_tps" not in missing
    assert "no result row" in empty["error"]
    assert bench.reference_ratios({"arms": [{"levels": []}], "reference": ref}) == []


def test_ninfer_read_one_request_at_a_time_refuses_concurrency_and_the_reference():
    """NInfer's log lines are read in order: at 2 streams its figures could not be told apart per request, so
    bench refuses before any request; p2pkit runs no benchmark of NInfer's own."""
    from p2pkit.core.errors import P2pkitError

    ctx = SimpleNamespace(profile=config.load("dual-5090-ninfer"))
    with pytest.raises(P2pkitError) as e:
        bench.run(ctx, 16, 16, 0, 1, None, None, [1, 2])
    assert "one request at a time" in e.value.message and "--concurrency at 1" in e.value.hint
    with pytest.raises(P2pkitError) as e:
        bench.run(ctx, 16, 16, 0, 1, None, None, [1], reference=True)
    assert "llama-bench" in e.value.message and "vllm bench serve" in e.value.message


@pytest.mark.parametrize("profile", ["dual-spark-vllm", "vllm-cpu", "dual-5090-llamacpp"])
def test_vllm_and_llamacpp_take_several_streams_and_their_own_reference(profile):
    """vLLM's level figures are its /metrics around the whole level and llama.cpp's responses carry their own:
    both run at any concurrency, and each has a benchmark of its own bench knows how to run."""
    p = config.load(profile)
    bench.refuse(p, [1, 2, 4], True)
    assert bench.bench_of(p)["concurrent"] and bench.bench_of(p)["reference"] in bench.REFERENCES
