"""bench's numbers that tell the truth (issue 38), on recorded real outputs: /metrics judged as counters
(a reset, a changed engine process, a /metrics gone mid-level spoil a level, which runs again or is reported
spoiled, never a figure; gauges read as values), warm-up per level at its shape and concurrency, the
aggregate with a client-side stall shown as itself, and drafting acceptance from llama-server's own log lines
beside the responses and /metrics.

Recorded: tests/fixtures/llamacpp/ (the real llama-server of the CPU build) and tests/fixtures/h200-device/
(the CUDA build on the lent H200); README.md in each."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from p2pkit.app import bench
from p2pkit.core import config
from p2pkit.parse import engine_api as pe

FIX = Path(__file__).parent / "fixtures"
H200 = FIX / "h200-device"


def metrics_of(text: str) -> dict:
    return {"status": 200, "values": pe.prometheus(text, "llamacpp:"), "types": pe.prometheus_types(text, "llamacpp:")}


def spec_on() -> dict:
    return json.loads((FIX / "llamacpp/spec_on.json").read_text())


def reader(monkeypatch, identities=None) -> bench.Llamacpp:
    ids = list(identities or [None, None])
    monkeypatch.setattr(bench, "engine_identity", lambda ctx: ids.pop(0) if ids else None)
    ctx = SimpleNamespace(profile=config.load("dual-5090-llamacpp"), host=None, store=None, options={})
    r = bench.Llamacpp(ctx, ctx.profile)
    r.identity = ids.pop(0) if ids else None
    return r


def test_counters_are_differenced_and_gauges_read_as_values(monkeypatch):
    """The real llama-server's /metrics before and after one request: every counter's delta, no gauge's
    (n_busy_slots_per_decode, requests_processing, the per-second averages are gauges: issue 38 saw a
    gauge's delta reported, negative); the gauges kept as read after."""
    rec = spec_on()
    before, after = metrics_of(rec["metrics_before"]), metrics_of(rec["metrics_after"])
    assert after["types"]["n_busy_slots_per_decode"] == "gauge" and after["types"]["prompt_tokens_total"] == "counter"
    level: dict = {}
    reader(monkeypatch).judge_metrics(level, before, after)
    assert "spoiled" not in level
    d, g = level["metrics_delta"], level["metrics_gauges"]
    assert d["tokens_predicted_total"] == rec["response"]["timings"]["predicted_n"]
    assert not {"n_busy_slots_per_decode", "requests_processing", "predicted_tokens_seconds"} & set(d)
    assert g["n_busy_slots_per_decode"] == after["values"]["n_busy_slots_per_decode"]


def test_a_counter_lower_after_than_before_spoils_the_level_and_gives_no_figure(monkeypatch):
    """After a restart the engine's counters start again from 0: the real /metrics after a request set against
    a freshly started llama-server's: no delta, no throughput (issue 38: -16 predicted tokens and -0.021 s
    became 764 tok/s), the counter and both values named."""
    rec = spec_on()
    level: dict = {"requests": [{"ok": True, "decode_tps": 900.0, "predicted_n": 16}]}
    reader(monkeypatch).judge_metrics(level, metrics_of(rec["metrics_after"]), metrics_of(rec["metrics_before"]))
    assert "went down" in level["spoiled"] and "metrics_delta" not in level
    s = bench.summarize(level)
    assert s == {"spoiled": level["spoiled"]}


def test_a_changed_engine_pid_or_start_time_spoils_the_level(monkeypatch):
    rec = spec_on()
    before, after = metrics_of(rec["metrics_before"]), metrics_of(rec["metrics_after"])  # counters only grew
    for ids, word in (([{"pid": 10, "start_ticks": 5}, {"pid": 11, "start_ticks": 9}], "pid 10 before it, 11 after"),
                      ([{"pid": 10, "start_ticks": 5}, {"pid": 10, "start_ticks": 9}], "another process"),
                      ([{"pid": 10, "start_ticks": 5}, {"pid": None, "start_ticks": None}], "not running")):
        level: dict = {}
        reader(monkeypatch, ids).judge_metrics(level, before, after)
        assert word in level["spoiled"] and "metrics_delta" not in level, level
    level = {}
    reader(monkeypatch, [{"pid": 10, "start_ticks": 5}, {"pid": 10, "start_ticks": 5}]).judge_metrics(level, before,
                                                                                                      after)
    assert "spoiled" not in level and level["metrics_delta"]


def test_metrics_gone_mid_level_spoils_it(monkeypatch):
    rec = spec_on()
    level: dict = {}
    reader(monkeypatch).judge_metrics(level, metrics_of(rec["metrics_before"]), {"status": None, "values": {}})
    assert "/metrics answered None after the level and 200 before it" in level["spoiled"]
    off = {"status": 501, "values": {}}  # a server without --metrics: nothing to judge, nothing spoiled
    level = {}
    reader(monkeypatch).judge_metrics(level, off, off)
    assert "spoiled" not in level and "metrics_delta" not in level


class FakeReader(bench.Reader):
    """The real llama-server's recorded response for every request; each level's accounting judged as the
    script says (spoiled or not), and every request counted with the level it came in."""

    def __init__(self, spoil: list[str | None]):
        self.spoil, self.calls, self.started = spoil, [], 0
        t = spec_on()["response"]["timings"]
        self.figures = pe.llamacpp_figures(t)

    def start(self):
        self.started += 1

    def request(self, n_prompt, n_out):
        self.calls.append((self.started, n_prompt, n_out))
        return self.with_client(dict(self.figures), 0.5, {"sent": 0.0, "first_byte_s": 0.49})

    def finish(self, level):
        why = self.spoil.pop(0) if self.spoil else None
        if why:
            level["spoiled"] = why


def arm_with(monkeypatch, fake, levels, warmup=1, requests=2):
    monkeypatch.setitem(bench.READERS, "timings", lambda ctx, p: fake)  # llama.cpp's accounting
    ctx = SimpleNamespace(out=SimpleNamespace(working=lambda *a, **k: __import__("contextlib").nullcontext()))
    p = config.load("dual-5090-llamacpp")
    return bench.run_arm(ctx, p, "baseline", 16, 16, warmup, requests, levels)


def test_a_spoiled_level_runs_again_and_one_spoiled_twice_is_reported_without_a_figure(monkeypatch):
    fake = FakeReader(["the engine restarted during the level: pid 1 before it, 2 after", None,
                       "a counter went down", "a counter went down"])
    arm = arm_with(monkeypatch, fake, [("decode", 128, 512, 1), ("production", 2048, 128, 1)])
    first, second = arm["levels"]
    assert "spoiled" not in first and first["spoiled_runs"] == ["the engine restarted during the level: pid 1 "
                                                                 "before it, 2 after"]
    assert first["summary"]["decode_tps"]["median"] > 0 and first["summary"]["aggregate_decode_tps"] > 0
    assert second["spoiled"] == "a counter went down" and second["spoiled_runs"] == ["a counter went down"] * 2
    assert set(second["summary"]) == {"spoiled", "lengths"}  # no figure of any kind
    doc = {"arms": [arm], "reference": {"shapes": [
        {"shape": "production", "prompt_tokens": 2048, "output_tokens": 128, "decode_tps": {"avg": 1.0},
         "prefill_tps": {"avg": 1.0}}]}}
    r = bench.reference_ratios(doc)[0]
    assert r["spoiled"] == "a counter went down" and r["decode_tps"]["ratio"] is None


def test_each_level_is_warmed_up_at_its_own_shape_and_concurrency(monkeypatch):
    """issue 38: the warm-up ran the first level's shape only, so the production level's first request paid
    for its new shape. Each level's warm-up requests come before its accounting starts, at its lengths and
    stream count, and none of them is among its timed requests."""
    fake = FakeReader([])
    arm = arm_with(monkeypatch, fake, [("decode", 128, 512, 1), ("production", 2048, 128, 4)], warmup=2,
                   requests=3)
    warm = [(n, p, o) for n, p, o in fake.calls if n == 0 or (n == 1 and p == 2048)]
    assert warm.count((0, 128, 512)) == 2 * 1  # 2 rounds of 1 stream, before the first level's start
    assert warm.count((1, 2048, 128)) == 2 * 4  # 2 rounds of 4 streams, before the second level's start
    assert [len(lv["requests"]) for lv in arm["levels"]] == [3, 12]
    assert arm["warmup"] == 2 and all(lv["warmup"] == 2 for lv in arm["levels"])


def test_a_stall_outside_the_server_shows_as_itself():
    """The H200's production level at one stream (engine-run-2): the first request took 2.06 s at the client
    against 0.21 s of the server's own time, the second 0.19 s against 0.19. The wall-time aggregate holds the
    stall; the aggregate over the server's own time does not, and the stall is named."""
    rec = json.loads((H200 / "engine-run-2/bench.json").read_text())
    lv = next(x for x in rec["arms"][0]["levels"] if x["shape"] == "production" and x["concurrency"] == 1)
    reqs, at = [], 0.0
    for i, r in enumerate(lv["requests"]):
        server = (r["prompt_ms"] + r["predicted_ms"]) / 1000
        reqs.append({**r, "index": i, "at_s": at, "client_first_byte_s": r["client_s"] - 0.001,
                     "server_s": round(server, 4), "outside_server_s": round(r["client_s"] - 0.001 - server, 4)})
        at += r["client_s"]
    agg = bench.aggregate(reqs, lv["wall_s"])
    assert agg["aggregate_decode_tps"] == pytest.approx(256 / lv["wall_s"], rel=1e-3)  # 113 tok/s, as recorded
    assert agg["aggregate_server_decode_tps"] > 3 * agg["aggregate_decode_tps"]
    assert [s["index"] for s in agg["stalls"]] == [0] and agg["stalls"][0]["outside_s"] > 1.8
    assert agg["outside_server_s"] == pytest.approx(lv["wall_s"] - agg["server_span_s"], abs=1e-3)


def test_overlapping_requests_count_the_servers_time_once():
    reqs = [{"at_s": 0.0, "client_first_byte_s": 1.0, "server_s": 1.0, "outside_server_s": 0.0, "predicted_n": 10},
            {"at_s": 0.0, "client_first_byte_s": 1.0, "server_s": 0.9, "outside_server_s": 0.1, "predicted_n": 10},
            {"at_s": 1.5, "client_first_byte_s": 1.0, "server_s": 1.0, "outside_server_s": 0.0, "predicted_n": 10}]
    agg = bench.aggregate(reqs, 2.5)
    assert agg["server_span_s"] == 2.0 and agg["aggregate_server_decode_tps"] == 15.0 and agg["stalls"] == []


def test_drafting_from_llama_servers_log_lines_and_the_other_two_sources():
    """The H200's drafting arm (engine-run-2, random weights: nothing accepted): the slot's own lines of the
    decode level's two timed tasks, the responses' draft counts and /metrics' counters agree: 0 of 3054."""
    lines = (H200 / "engine-run-2/engine-launcher-spec-lines.txt").read_text().splitlines()
    drafted = pe.llamacpp_draft_lines(lines)
    assert drafted[0] == {"slot": 7, "task": 0, "accepted": 0, "generated": 1527, "rate": 0.0, "mean_len": 1.0}
    rec = json.loads((H200 / "engine-run-2/bench.json").read_text())
    lv = rec["arms"][1]["levels"][0]
    timed = [x for x in drafted if x["task"] in (514, 1027)]
    log = {"tasks": len(timed), "accepted": sum(x["accepted"] for x in timed),
           "generated": sum(x["generated"] for x in timed)}
    delta = {k: v for k, v in lv["metrics_delta"].items() if k.startswith("spec_decode")}
    src = bench.draft_sources(lv["requests"], delta, log)
    assert src["agree"] is True and src["log"] == {"accepted": 0, "drafted": 3054, "tasks": 2, "acceptance": 0.0}
    assert src["responses"]["drafted"] == src["metrics"]["drafted"] == 3054
    off = bench.draft_sources(lv["requests"], delta, {**log, "accepted": 5})
    assert off["agree"] is False
    assert bench.draft_sources([{"decode_tps": 1.0}], None, None) is None  # no drafting: no comparison


def test_the_cpu_servers_draft_line_and_response_agree():
    """The CPU build's llama-server with the tiny model as its own draft: its log line and its response."""
    rec = spec_on()
    lines = (FIX / "llamacpp/spec_on.startup.txt").read_text().splitlines()
    got = pe.llamacpp_draft_lines(lines)
    t = rec["response"]["timings"]
    assert len(got) == 1 and (got[0]["accepted"], got[0]["generated"]) == (t["draft_n_accepted"], t["draft_n"])


# ------------------------------------------------------------ llama-batched-bench, the concurrency reference

BATCHED = FIX / "llamacpp/batched-bench"


def batched_rec(name: str) -> dict:
    return json.loads((BATCHED / f"{name}.json").read_text())


def batched_text(name: str) -> str:
    rec = batched_rec(name)
    return rec["stdout"] + "\n" + rec["stderr"]


def test_batched_benchs_table_and_jsonl_read_to_the_same_levels():
    """The real llama-batched-bench of the CPU build (-npp 32 -ntg 16 -npl 1,2): its table and its JSONL, each
    level's generated tokens over the whole time (pl*tg/T) from its own columns."""
    from p2pkit.parse import batched_bench as bb

    md, jl = bb.read(batched_text("md")), bb.read(batched_text("jsonl"))
    assert (md.fmt, jl.fmt) == ("md", "jsonl")
    assert [(r.pp, r.tg, r.pl, r.n_kv) for r in md.rows] == [(r.pp, r.tg, r.pl, r.n_kv) for r in jl.rows] == \
        [(32, 16, 1, 48), (32, 16, 2, 96)]
    assert md.settings["n_kv_max"] == jl.settings["n_kv_max"] == 2048 and md.settings["n_threads"] == 2
    r = md.rows[1]
    assert r.output_tps == pytest.approx(2 * 16 / r.t) and bb.missing(md, [32], [16], [1, 2]) == []


def test_a_lost_row_an_abort_and_its_errors_are_said():
    """Real runs: a JSONL run whose last row its logger lost at exit (llama.cpp never flushes it), a -c too
    small (it printed two rows, then aborted inside llama.cpp), a missing model and an unknown flag."""
    from p2pkit.parse import batched_bench as bb

    lost = bb.read(batched_text("jsonl-lost-row"))
    assert bb.missing(lost, [32], [16], [1, 2]) == [(32, 16, 2)]
    for name, said in (("too-small-c", "aborted inside llama.cpp"), ("missing-model", "could not be loaded"),
                       ("invalid-argument", "does not accept --no-such-flag")):
        with pytest.raises(bb.BatchedBenchError) as e:
            bb.read(batched_text(name))
        assert said in str(e.value), (name, str(e.value))
    with pytest.raises(bb.BatchedBenchError, match="no result row"):
        bb.read("")


def batched_ctx(outputs: list, built: bool = True):
    calls = []

    def run(argv, check=False, timeout=None):
        calls.append(argv)
        return outputs.pop(0)

    host = SimpleNamespace(path=lambda x: Path(x) if built else Path("/nonexistent") / Path(x).name,
                           runner=SimpleNamespace(run=run))
    out = SimpleNamespace(working=lambda *a, **k: __import__("contextlib").nullcontext())
    p = config.load("dual-5090-llamacpp", ["serve.flags.parallel=2"])
    return SimpleNamespace(host=host, out=out, profile=p), p, calls


def test_the_batched_reference_combines_its_runs_and_outlives_a_lost_row(monkeypatch):
    from p2pkit.parse import batched_bench as bb

    recs = [batched_rec(n) for n in ("jsonl", "jsonl-lost-row", "jsonl")]
    ctx, p, calls = batched_ctx([SimpleNamespace(returncode=r["rc"], stdout=r["stdout"], stderr=r["stderr"])
                                 for r in recs])
    monkeypatch.setattr(Path, "is_file", lambda self: True)
    ref = bench.batched_arm(ctx, p, [("tiny", 32, 16, [1, 2])])
    entry = ref["shapes"][0]
    assert "error" not in entry, entry
    one, two = entry["levels"]
    assert one["output_tps"]["n"] == 3 and two["output_tps"]["n"] == 2 and entry["rows_missing"] == 1
    argv = calls[0]
    assert argv[argv.index("-npl") + 1] == "1,2" and argv[argv.index("--output-format") + 1] == "jsonl"
    assert argv[argv.index("-c") + 1] == str(max(bb.kv_needed(32, 16, 2), 95000))  # the server's own ctx-size
    assert "--kv-unified" in argv and argv[argv.index("--flash-attn") + 1] == "on"  # the server's settings
    doc = {"arms": [{"levels": [{"shape": "tiny", "concurrency": 2, "summary": {
        "aggregate_decode_tps": two["output_tps"]["median"] / 2, "aggregate_server_decode_tps": None}}]}],
        "batched_reference": ref}
    row = bench.batched_ratios(doc)[0]
    assert row["streams"] == 2 and row["aggregate_decode_ratio"] == 0.5 and row["aggregate_server_decode_ratio"] is None


def test_a_batched_bench_not_built_or_failing_says_so_and_leaves_the_rest():
    ctx, p, calls = batched_ctx([], built=False)
    ref = bench.batched_arm(ctx, p, [("decode", 128, 512, [1, 2])])
    assert "not in the build" in ref["shapes"][0]["error"] and "engine.targets" in ref["shapes"][0]["error"]
    assert calls == [] and bench.batched_ratios({"arms": [{"levels": []}], "batched_reference": ref}) == []
    rec = batched_rec("missing-model")
    ctx, p, _ = batched_ctx([SimpleNamespace(returncode=rec["rc"], stdout=rec["stdout"], stderr=rec["stderr"])])
    import unittest.mock

    with unittest.mock.patch.object(Path, "is_file", lambda self: True):
        ref = bench.batched_arm(ctx, p, [("decode", 128, 512, [1])])
    assert "could not be loaded" in ref["shapes"][0]["error"] and "levels" not in ref["shapes"][0]


# ------------------------------------------------------------ recorded across a restart; the first-request stall

def test_the_real_metrics_pair_across_a_restart_spoils_the_level(monkeypatch):
    """The CPU build's llama-server: two requests, /metrics, the server stopped and started again on the same
    port, /metrics again: every counter went down, the PID and the start time changed. Read as a level, it is
    spoiled twice over, with no figure."""
    rec = json.loads((FIX / "llamacpp/metrics/metrics-across-restart.json").read_text())
    level: dict = {}
    reader(monkeypatch, [rec["engine_before"], rec["engine_after"]]).judge_metrics(
        level, metrics_of(rec["metrics_before"]), metrics_of(rec["metrics_after"]))
    assert "engine restarted during the level" in level["spoiled"] and "went down" in level["spoiled"]
    assert "metrics_delta" not in level
    # the old way: differenced anyway, a throughput out of nothing
    naive = pe.deltas(pe.prometheus(rec["metrics_before"], "llamacpp:"), pe.prometheus(rec["metrics_after"],
                                                                                      "llamacpp:"))
    assert naive["tokens_predicted_total"] < 0 and naive["tokens_predicted_seconds_total"] < 0


def test_the_first_request_after_eight_streams_saves_every_idle_slot():
    """Issue 38's 1.97 s first production request, found: llama-server (tools/server/server-context.cpp, the
    task loop after launch_slot_with_task) saves every idle slot to its RAM prompt cache when a new task starts,
    and with a unified KV clears it (--cache-idle-slots, on by default, needs --cache-ram). Recorded on the CPU
    build: 8 decode requests at once fill 8 slots, then one long request alone: the trace shows the idle slots
    saved as it starts; with --cache-ram 0 none is. On a GPU each save copies the slot's KV cell range by
    range, layer by layer (llama_kv_cache::state_write_data): cells that 8 streams decoded in lockstep are
    interleaved, one range per generated token, so the 1.85 s outside the server's timings on the H200 are
    thousands of small device-to-host copies, none of them in prompt_ms or predicted_ms."""
    on = json.loads((FIX / "llamacpp/stall/stall-default.json").read_text())
    off = json.loads((FIX / "llamacpp/stall/stall-cache-ram-0.json").read_text())
    saved = [ln for ln in on["log_lines"] if "saving idle slot to prompt cache" in ln]
    assert len({ln.split("id ")[1].split("|")[0].strip() for ln in saved}) >= 7  # every other slot
    assert not any("saving idle slot" in ln for ln in off["log_lines"])
    for r in (on["first"], off["first"]):  # the server's own timings never hold it
        t = r["timings"]
        assert r["client_first_byte_s"] >= (t["prompt_ms"] + t["predicted_ms"]) / 1000


# ------------------------------------------------------------ the CUDA build on the lent H200 (issue 38's two calls)

NUM = H200 / "numbers"  # `bash bench/gpu_numbers_run.sh probe` and `... final`, 2026-12-04; README.md there
H200_GAUGES = {"prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing", "requests_deferred",
               "n_busy_slots_per_decode"}


def h200_metrics(name: str) -> dict:
    return metrics_of((NUM / "probe" / f"{name}.txt").read_text())


def test_the_h200_metrics_pair_across_a_restart_is_spoiled_with_no_figure(monkeypatch):
    """The served engine's /metrics after the whole probe bench, `p2pkit serve restart`, /metrics again, and the
    engine's identity each time (the launcher's record: pid 5458, then 5977): every counter back to 0, and the
    gauge n_busy_slots_per_decode 3.74 -> 0. Read as a level it is spoiled by the new process and by a counter,
    each named; the gauge went down too (and sorts first) but is not what is named. Differenced anyway, the pair
    made 431 tok/s out of -38416 tokens over -89.1 s: issue 38's 764 and 513 tok/s."""
    before, after = h200_metrics("metrics-before-restart"), h200_metrics("metrics-after-restart")
    assert {k for k, t in after["types"].items() if t == "gauge"} == H200_GAUGES
    ids = [json.loads((NUM / "probe" / f"engine-{w}-restart.json").read_text()) for w in ("before", "after")]
    level: dict = {"requests": [{"ok": True, "decode_tps": 900.0, "predicted_n": 512}]}
    reader(monkeypatch, ids).judge_metrics(level, before, after)
    assert "the engine restarted during the level: pid 5458 before it, 5977 after" in level["spoiled"]
    assert "the counter n_decode_total went down from 10298 to 0" in level["spoiled"]
    assert "n_busy_slots_per_decode" not in level["spoiled"]
    assert "metrics_delta" not in level and "metrics_gauges" not in level
    assert bench.summarize(level) == {"spoiled": level["spoiled"]}
    level = {}  # no identity to compare (systemd's MainPID unreadable, say): the counters alone spoil it
    reader(monkeypatch).judge_metrics(level, before, after)
    assert "went down" in level["spoiled"] and "restarted during" not in level["spoiled"]
    naive = pe.deltas(before["values"], after["values"])  # the old way
    assert naive["tokens_predicted_total"] == -38416 and naive["tokens_predicted_seconds_total"] == -89.1138
    assert naive["tokens_predicted_total"] / naive["tokens_predicted_seconds_total"] == pytest.approx(431.08, abs=0.01)


def test_the_h200_gauges_are_read_as_values_and_never_differenced(monkeypatch):
    """Two real readings of llama-server's /metrics on the H200, set as one level's pair: the decode probe's
    server (the profile's flags) after its requests, then the served engine after the whole bench (one
    identity given for both). Every counter is higher in the second, every gauge but one lower
    (prompt_tokens_seconds 37341.2 -> 0, predicted_tokens_seconds 883.7 -> 0): a gauge that went down neither
    spoils the level nor becomes a delta (issue 38 reported n_busy_slots_per_decode's, negative); the gauges
    are kept as read after it."""
    probe = json.loads((NUM / "probe/probe.json").read_text())
    v = next(x for x in probe["variants"] if x["variant"] == "p2pkit")
    first = {"status": 200, "values": v["metrics"], "types": v["metrics_types"]}
    last = h200_metrics("metrics-before-restart")
    same = {"pid": 5458, "start_ticks": 31969}
    level: dict = {}
    reader(monkeypatch, [same, same]).judge_metrics(level, first, last)
    assert "spoiled" not in level, level
    d, g = level["metrics_delta"], level["metrics_gauges"]
    assert not H200_GAUGES & set(d)
    assert d["tokens_predicted_total"] == 38416 - 2560 and d["prompt_tokens_total"] == 130605 - 8704
    assert g == {"prompt_tokens_seconds": 0.0, "predicted_tokens_seconds": 0.0, "requests_processing": 0.0,
                 "requests_deferred": 0.0, "n_busy_slots_per_decode": 3.74306}
    s = bench.summarize({"requests": [], "metrics_delta": d})
    assert s["metrics_decode_tps"] == round(d["tokens_predicted_total"] / d["tokens_predicted_seconds_total"], 3)


def cuda_batched(name: str) -> tuple[str, int]:
    """llama-batched-bench's stdout and stderr as bench passes them, and its exit code: the stderr file's last
    line (`exit N`) is the recording script's, not the tool's."""
    out = (NUM / "probe/batched" / f"{name}.txt").read_text()
    err = (NUM / "probe/batched" / f"{name}.stderr.txt").read_text().splitlines()
    assert err[-1].startswith("exit ")
    return out + "\n" + "\n".join(err[:-1]), int(err[-1].split()[1])


def test_the_cuda_batched_benchs_table_and_jsonl_read_to_the_same_levels():
    """The CUDA build's llama-batched-bench on the H200 (-ngl 99 -fa on -c 4096 -npp 128 -ntg 32 -npl 1,2): its
    table and its JSONL, every column read where it stands, the settings line of each."""
    from p2pkit.parse import batched_bench as bb

    (md_text, md_rc), (jl_text, jl_rc) = cuda_batched("md"), cuda_batched("jsonl")
    md, jl = bb.read(md_text), bb.read(jl_text)
    assert (md_rc, jl_rc, md.fmt, jl.fmt) == (0, 0, "md", "jsonl")
    assert [(r.pp, r.tg, r.pl, r.n_kv) for r in md.rows] == [(r.pp, r.tg, r.pl, r.n_kv) for r in jl.rows] == \
        [(128, 32, 1, 160), (128, 32, 2, 320)]
    common = {"n_kv_max": 4096, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 1, "is_pp_shared": 0,
              "n_gpu_layers": 99, "n_threads": 16, "n_threads_batch": 16}
    assert md.settings == {**common, "is_tg_separate": 0} and jl.settings == common
    r = md.rows[1]
    assert (r.t_pp, r.speed_pp, r.t_tg, r.speed_tg, r.t, r.speed) == (0.015, 17243.70, 0.056, 1141.72, 0.071, 4513.27)
    r = jl.rows[0]
    assert (r.t_pp, r.speed_pp, r.t_tg, r.speed_tg, r.t, r.speed) == \
        (0.098655, 1297.450684, 0.039139, 817.598816, 0.137794, 1161.153564)
    assert r.output_tps == pytest.approx(32 / 0.137794) and bb.missing(jl, [128], [32], [1, 2]) == []


def test_the_cuda_batched_benchs_small_c_and_missing_model():
    """-c 512 -npl 1,2,4 on the CUDA build: llama.cpp pads the context to 1024 and warns, and its batch (min(-c,
    n_batch) = 512 tokens) holds the largest prompt batch (4 x 128): all three rows, exit 0, a result and not
    an error (the CPU build's -c 96 aborts: test_a_lost_row_an_abort_and_its_errors_are_said). A missing model:
    its own error, exit 1, and the fix; through the reference arm it leaves no level and says why."""
    from p2pkit.parse import batched_bench as bb

    text, rc = cuda_batched("too-small-c")
    run = bb.read(text)
    assert rc == 0 and "rounding down to 1024" in text
    assert run.settings["n_kv_max"] == 1024 and [r.pl for r in run.rows] == [1, 2, 4]
    assert bb.missing(run, [128], [32], [1, 2, 4]) == [] and bb.kv_needed(128, 32, 4) <= 1024
    text, rc = cuda_batched("missing-model")
    assert rc == 1
    with pytest.raises(bb.BatchedBenchError, match="could not be loaded: check that the file exists"):
        bb.read(text)
    out, err = text.split("\n", 1)
    ctx, p, _ = batched_ctx([SimpleNamespace(returncode=rc, stdout=out, stderr=err)])
    import unittest.mock

    with unittest.mock.patch.object(Path, "is_file", lambda self: True):
        ref = bench.batched_arm(ctx, p, [("decode", 128, 32, [1])])
    assert "could not be loaded" in ref["shapes"][0]["error"] and "levels" not in ref["shapes"][0]


def test_drafting_from_the_h200_log_lines_agrees_with_the_responses_and_metrics():
    """final's drafting arm (random weights: nothing accepted): the slots' own "draft acceptance" lines, split by
    level (the warm-up's tasks 0, 1541 and 1542 are not the level's), give what bench read from the live log,
    and the three sources agree: 0 of 3054 at one stream, 0 of 6108 at two; with a warm-up's line counted too
    they do not, and say so."""
    drafted = pe.llamacpp_draft_lines((NUM / "final/engine-launcher-draft.txt").read_text().splitlines())
    assert [(x["slot"], x["task"]) for x in drafted] == [(7, 0), (7, 514), (7, 1027), (6, 1542), (7, 1541),
                                                         (6, 2057), (7, 2056), (6, 2570), (7, 2572)]
    assert {(x["accepted"], x["generated"], x["rate"], x["mean_len"]) for x in drafted} == {(0, 1527, 0.0, 1.0)}
    rec = json.loads((NUM / "final/bench-draft.json").read_text())
    levels = ({514, 1027}, {2056, 2057, 2570, 2572})
    warmups = ({0}, {1541, 1542})

    def log_of(tasks: set[int]) -> dict:
        timed = [x for x in drafted if x["task"] in tasks]
        return {"tasks": len(timed), "accepted": sum(x["accepted"] for x in timed),
                "generated": sum(x["generated"] for x in timed)}

    for lv, tasks, warm in zip(rec["arms"][1]["levels"], levels, warmups, strict=True):
        log = log_of(tasks)
        assert log == lv["draft_log"]
        delta = {k: v for k, v in lv["metrics_delta"].items() if k.startswith("spec_decode")}
        src = bench.draft_sources(lv["requests"], delta, log)
        assert src == lv["summary"]["draft_sources"] and src["agree"] is True
        assert src["log"]["drafted"] == src["metrics"]["drafted"] == src["responses"]["drafted"] == 1527 * len(tasks)
        # the log read from before the level's warm-up: its lines count 1527 drafted tokens more a warm-up task
        off = bench.draft_sources(lv["requests"], delta, log_of(tasks | warm))
        assert off["agree"] is False and off["log"]["drafted"] == 1527 * len(tasks | warm)
    assert all("draft_sources" not in lv["summary"] for lv in rec["arms"][0]["levels"])  # drafting off


def test_the_h200_stall_at_eight_streams_shows_as_itself_and_is_gone_without_the_ram_cache():
    """The decode shape at 8 streams, probe (RAM prompt cache on) and final (cache-ram 0): the aggregate
    recomputed from the recorded requests is the recorded one. In the probe 16 of the 24 requests waited about
    1.76 s each outside the server's own timings (the idle slots saved to the RAM cache): the level's
    wall time holds 3.52 s outside the server, the aggregate over wall time is half the one over the server's
    time (0.45 and 0.92 of llama-batched-bench at 8 sequences), and each such request is named; in final nothing
    is outside."""
    probe = json.loads((NUM / "probe/bench-decode8-trimmed.json").read_text())["arms"][0]["levels"][0]
    final = next(lv for lv in json.loads((NUM / "final/bench.json").read_text())["arms"][0]["levels"]
                 if (lv["shape"], lv["concurrency"]) == ("decode", 8))
    for lv in (probe, final):
        agg, s = bench.aggregate(lv["requests"], lv["wall_s"]), lv["summary"]
        keys = ("aggregate_server_decode_tps", "server_span_s", "outside_server_s", "stalls")
        assert {k: agg[k] for k in keys} == {k: s[k] for k in keys}
        assert agg["aggregate_decode_tps"] == pytest.approx(s["aggregate_decode_tps"], rel=1e-4)  # wall_s is rounded
    agg = bench.aggregate(probe["requests"], probe["wall_s"])
    assert agg["outside_server_s"] == pytest.approx(3.52, abs=0.01)
    assert agg["aggregate_server_decode_tps"] > 2 * agg["aggregate_decode_tps"]
    assert len(agg["stalls"]) == 16 and min(x["outside_s"] for x in agg["stalls"]) > 1.7
    agg = bench.aggregate(final["requests"], final["wall_s"])
    assert agg["outside_server_s"] < 0.01 and agg["stalls"] == []


def test_the_h200_restart_in_the_middle_of_a_level_is_reported_never_averaged():
    """final: `p2pkit serve restart` 4 s into a level of 8 requests: 4 done, the fifth cut. The level keeps the
    error and the reasons (the engine it started with is gone, /metrics did not answer after it), and no figure:
    judged again now it still gives none, and no ratio is made of it."""
    rec = json.loads((NUM / "final/bench-restart.json").read_text())
    lv = rec["arms"][0]["levels"][0]
    assert "RemoteDisconnected" in lv["error"] and rec["arms"][0]["error"] == lv["error"]
    assert "the engine (pid 7546) was not running at the end of the level" in lv["spoiled"]
    assert "/metrics answered None after the level and 200 before it" in lv["spoiled"]
    assert len(lv["requests"]) == 4 and all(r["decode_tps"] > 0 for r in lv["requests"])
    assert set(lv["summary"]) == {"spoiled", "lengths"}
    assert bench.summarize(lv) == {"spoiled": lv["spoiled"]}
    doc = {"arms": rec["arms"], "reference": {"shapes": [{"shape": "decode", "prompt_tokens": 128,
                                                          "output_tokens": 512, "decode_tps": {"avg": 994.8},
                                                          "prefill_tps": {"avg": 52980.5}}]}}
    r = bench.reference_ratios(doc)[0]
    assert r["decode_tps"]["ratio"] is None and r["spoiled"] == lv["spoiled"]
