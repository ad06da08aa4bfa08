"""`p2pkit bench`'s pure parts over the real llama-server's recorded responses, and its gate."""

import json
import struct
import sys
import time
import zlib
from pathlib import Path

import pytest

from p2pkit.app import bench
from p2pkit.cli import bench_cmd
from p2pkit.core.errors import P2pkitError
from p2pkit.parse import engine_api as pe

FIX = Path(__file__).parent / "fixtures/llamacpp"


def arm_from_recording(name: str, n: int = 3) -> dict:
    """An arm whose requests are the recorded real response (llama-server's timings), n times."""
    t = json.loads((FIX / "spec_on.json").read_text())["response"]["timings"]
    r = {"ok": True, "prompt_n": t["prompt_n"], "prompt_ms": t["prompt_ms"], "predicted_n": t["predicted_n"],
         "predicted_ms": t["predicted_ms"], "prefill_tps": t["prompt_per_second"],
         "decode_tps": t["predicted_per_second"], "ttft_ms": t["prompt_ms"], "draft_n": t.get("draft_n"),
         "draft_accepted": t.get("draft_n_accepted"), "client_s": 0.5, "client_tps": t["predicted_n"] / 0.5}
    arm = {"arm": name, "requests": [r] * n,
           "metrics_delta": {"tokens_predicted_total": n * t["predicted_n"],
                             "tokens_predicted_seconds_total": n * t["predicted_ms"] / 1000,
                             "prompt_tokens_total": n * t["prompt_n"],
                             "prompt_seconds_total": n * t["prompt_ms"] / 1000}}
    arm["summary"] = bench.summarize(arm)
    return arm


def test_summary_is_the_servers_own_figures():
    arm = arm_from_recording("baseline")
    s = arm["summary"]
    t = arm["requests"][0]
    assert s["decode_tps"] == {"median": round(t["decode_tps"], 3), "min": round(t["decode_tps"], 3),
                               "max": round(t["decode_tps"], 3), "n": 3}
    assert 0 <= s["draft_acceptance"] <= 1
    assert s["metrics_decode_tps"] == pytest.approx(t["predicted_n"] * 1000 / t["predicted_ms"], rel=1e-3)


def test_prometheus_text_parses_with_one_family_per_metric():
    from prometheus_client.parser import text_string_to_metric_families

    doc = {"engine": "llamacpp", "arms": [arm_from_recording("baseline"), arm_from_recording('x="1"')]}
    fams = {f.name: f for f in text_string_to_metric_families(bench_cmd.prometheus_text(doc))}
    dec = fams["p2pkit_bench_decode_tokens_per_second"]
    assert {s.labels["arm"] for s in dec.samples} == {"baseline", 'x="1"'}
    assert len(fams) == 3


@pytest.mark.slow
def test_bench_before_the_service_stage_exits_3(sim, cli):
    root = sim("healthy")
    r = cli("--root", str(root), "bench")
    assert r.code == 3 and "service stage is not done" in r.err and f"`p2pkit --root {root} up`" in r.err
    assert not (root / "var/lib/p2pkit/bench.json").exists()


@pytest.mark.parametrize("ab,said", [
    ("serve.flags.tp=3", "service.tp (--tp is 1 or 2): 3 (expected 1 or 2)"),  # a value doctor and the start refuse
    ("serve.env.BOGUS", "--ab 'serve.env.BOGUS' is not section.key=VALUE"),  # no value
    ("serve.nosuchkey=1", "serve.nosuchkey: unknown key"),
])
def test_an_ab_change_the_start_refuses_is_refused_before_anything_runs(sim, cli, ab, said):
    """Issue 47 item 6: `bench --ab serve.flags.tp=3` ran and printed a ratio for a value doctor fails; `--ab
    serve.env.BOGUS` ran the whole baseline arm, then exited 1 and overwrote bench.json. Both are usage: exit 2,
    before the gate, the lock or a request, nothing written."""
    root = sim("healthy")
    r = cli("--root", str(root), "bench", "--ab", ab)
    assert r.code == 2 and said in r.err and "nothing was run" in r.err, r.err
    assert not (root / "var/lib/p2pkit").exists()


def ctx_for(profile: str, root: Path = Path("/"), store: Path = Path("/nonexistent")):
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host

    return pipeline.Ctx(profile=config.load(profile), host=Host.at(root), store=Store(store), out=Output())


def test_ninfer_without_its_request_log_is_refused_not_timed_by_the_client():
    from dataclasses import replace

    ctx = ctx_for("dual-5090-ninfer")
    flags = {k: v for k, v in ctx.profile.serve.flags.items() if k != "request-log-jsonl"}
    ctx = replace(ctx, profile=replace(ctx.profile, serve=replace(ctx.profile.serve, flags=flags)))
    with pytest.raises(P2pkitError, match="P15") as e:
        bench.run(ctx, 8, 8, 0, 1, None)
    assert "serve.flags.request-log-jsonl" in e.value.hint


def test_an_engine_bench_cannot_read_is_refused():
    from dataclasses import replace

    ctx = ctx_for("dual-5090-ninfer")
    ctx = replace(ctx, profile=replace(ctx.profile, engine=replace(ctx.profile.engine, recipe="tgi")))
    with pytest.raises(P2pkitError, match="P15"):
        bench.run(ctx, 8, 8, 0, 1, None)


def test_ninfer_figures_from_its_request_log_line():
    recs = pe.ninfer_done(pe.jsonl((FIX.parent / "ninfer/request_log.jsonl").read_text()))
    assert [r["event"] for r in recs] == ["request_done"]  # request_start is not accounting
    f = pe.ninfer_figures(recs[0])
    # NInfer's own summary line for this request reads prefill=960.0tok/s decode=522.7tok/s ttft=18ms
    assert f["prefill_tps"] == 960.0 and f["decode_tps"] == pytest.approx(522.727, abs=1e-3)
    assert round(f["ttft_ms"]) == 18 and f["predicted_n"] == 24 and f["prompt_n"] == 16
    assert (f["draft_n"], f["draft_accepted"]) == (35, 18)


def test_vllm_figures_from_its_metrics_around_one_request():
    """The simulated vLLM's /metrics (vLLM's own families) before and after one request: the
    figures are that request's, whatever it cost the client."""
    from p2pkit.sim import serving

    m = serving.VllmMetrics("/srv/models/m", 4096, 3)
    before = pe.prometheus(m.text().decode(), "vllm:")
    g = {"prompt_tokens": 32, "completion_tokens": 17, "prefill_s": 0.008, "decode_s": 0.04, "total_s": 0.048,
         "window": 3, "rounds": 8, "drafted": 24, "accepted": 8, "per_pos": [8, 0, 0]}
    m.finished(g, 17)
    f = pe.vllm_figures(pe.deltas(before, pe.prometheus(m.text().decode(), "vllm:")))
    assert f["requests"] == 1 and (f["prompt_n"], f["predicted_n"]) == (32, 17)
    assert f["decode_tps"] == 400.0 and f["prefill_tps"] == 4000.0 and f["ttft_ms"] == 8.0  # (17 - 1) / 0.04
    assert (f["draft_n"], f["draft_accepted"]) == (24, 8)


def png_chunks(path: Path) -> list[tuple[bytes, bytes]]:
    """A PNG read chunk by chunk, each CRC checked: (type, data)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    out, i = [], 8
    while i < len(data):
        n = struct.unpack(">I", data[i:i + 4])[0]
        kind, body = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        assert struct.unpack(">I", data[i + 8 + n:i + 12 + n])[0] == zlib.crc32(kind + body), kind
        out.append((kind, body))
        i += 12 + n
    assert out[0][0] == b"IHDR" and out[-1][0] == b"IEND"
    return out


def test_plot_is_a_valid_png_with_both_arms(tmp_path):
    pytest.importorskip("matplotlib")
    doc = {"engine": "llamacpp", "simulated": True, "shape": {"prompt_tokens": 16, "output_tokens": 16},
           "arms": [arm_from_recording("baseline", 3), arm_from_recording("serve.env.NCCL_P2P_DISABLE=1", 2)]}
    out = tmp_path / "bench.png"
    bench_cmd.plot(doc, out)
    chunks = png_chunks(out)
    w, h = struct.unpack(">II", chunks[0][1][:8])
    assert w > 300 and h > 200 and any(k == b"IDAT" for k, _ in chunks)
    text = b" ".join(b for k, b in chunks if k == b"tEXt").decode("latin-1")
    assert "baseline=3" in text and "serve.env.NCCL_P2P_DISABLE=1=2" in text


# ------------------------------------------------------------------ on a simulated host, end to end

@pytest.mark.slow
def test_bench_on_the_simulated_ninfer(sim, cli, monkeypatch, tmp_path):
    """One simulated host brought up with the default profile (the simulated NInfer serving with its
    request log), then: an A/B read from the log with its PNG; --plot without matplotlib; an A/B
    interrupted in its second arm. One test, so that one `up` serves all three (xdist spreads tests)."""
    root = sim("healthy")
    r = cli("--root", str(root), "up", "--reboot")
    assert r.code == 0, r.err[-3000:]
    ab_read_from_the_request_log(root, cli, tmp_path)
    kept = (root / "var/lib/p2pkit/bench.json").read_bytes()  # a bad --ab on a served host: no baseline run, nothing
    r = cli("--root", str(root), "bench", "--ab", "serve.env.BOGUS")  # overwritten (issue 47 item 6)
    assert r.code == 2 and (root / "var/lib/p2pkit/bench.json").read_bytes() == kept, r.err
    without_matplotlib(root, cli, monkeypatch, tmp_path)
    ab_interrupted_in_the_second_arm(root)


def draft_tokens(server_start: dict) -> str | None:
    argv = server_start["argv"]
    return argv[argv.index("--draft-tokens") + 1] if "--draft-tokens" in argv else None


def log_records(log: Path, offset: int) -> list[dict]:
    return [json.loads(x) for x in log.read_bytes()[offset:].decode().splitlines() if x.strip()]


def ab_read_from_the_request_log(root: Path, cli, tmp_path: Path) -> None:
    log = root / "var/lib/p2pkit/engine/requests.jsonl"  # relative to the unit's WorkingDirectory
    offset = log.stat().st_size if log.exists() else 0
    unit = {f: (root / f.lstrip("/")).read_bytes() for f in bench.unit_files()}
    png = tmp_path / "bench.png"
    r = cli("--root", str(root), "--json", "bench", "--requests", "3", "--warmup", "1", "--prompt-tokens", "16",
            "--output-tokens", "24", "--ab", "serve.flags.draft-tokens=3", "--plot", str(png))
    assert r.code == 0, r.err[-2000:]
    doc = r.json()
    assert doc["engine"] == "ninfer" and doc["accounting"].startswith("NInfer's own") and doc["simulated"]
    done = [x for x in log_records(log, offset) if x["event"] == "request_done"]
    by_server: dict[str, list] = {}
    for x in done:
        by_server.setdefault(x["server_instance_id"], []).append(x)
    assert [len(v) for v in by_server.values()] == [4, 4]  # a warm-up and 3 timed requests per arm
    for arm, recs in zip(doc["arms"], by_server.values()):
        assert len(arm["requests"]) == 3
        for req, rec in zip(arm["requests"], recs[1:]):  # the warm-up is left out
            t, res = rec["timings_seconds"], rec["result"]
            assert req["prompt_n"] == res["prompt_tokens"] == req["usage"]["prompt_tokens"] == 16
            assert req["predicted_n"] == res["completion_tokens"] == req["usage"]["completion_tokens"] == 24
            assert req["decode_tps"] == pytest.approx(23 / t["decode"], rel=1e-3)
            assert req["prefill_tps"] == pytest.approx(16 / t["prefill"], rel=1e-3)
            assert req["ttft_ms"] == pytest.approx(1000 * (t["prepare"] + t["vision"] + t["prefill"]), rel=1e-3)
            assert req["draft_n"] == rec["speculative"]["drafted_tokens"] > 0
            # the server's figure, never the client's: here the reply reaches the client well after the
            # server's clock stopped (P15), so a bench that timed the client would read far lower
            assert req["client_tps"] < req["decode_tps"] / 2
        tot = arm["log_totals"]
        assert tot["completion_tokens"] == 72 and tot["decode_seconds"] == pytest.approx(
            sum(r["timings_seconds"]["decode"] for r in recs[1:]), rel=1e-4)
    assert [a["arm"] for a in doc["arms"]] == ["baseline", "serve.flags.draft-tokens=3"]
    assert doc["ab_ratio_decode"] < 1  # a smaller draft window decodes slower
    assert doc["restored"] == {"files_identical": True, "health": True}
    assert {f: (root / f.lstrip("/")).read_bytes() for f in bench.unit_files()} == unit
    text = b" ".join(b for k, b in png_chunks(png) if k == b"tEXt").decode("latin-1")
    assert doc["plot"] == str(png) and "baseline=3" in text and "serve.flags.draft-tokens=3=3" in text


def without_matplotlib(root: Path, cli, monkeypatch, tmp_path: Path) -> None:
    """--plot without matplotlib: bench says so plainly and still writes the JSON."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    png = tmp_path / "nomatplotlib.png"
    r = cli("--root", str(root), "--json", "bench", "--requests", "1", "--warmup", "0", "--plot", str(png))
    assert r.code == 0, r.err[-2000:]
    doc = r.json()
    assert "matplotlib" in doc["plot_skipped"] and "matplotlib" in r.err and "p2pkit[plot]" in r.err
    assert not png.exists() and len(doc["arms"][0]["requests"]) == 1
    assert json.loads(Path(doc["artifact"]).read_text())["arms"][0]["requests"] == doc["arms"][0]["requests"]


def ab_interrupted_in_the_second_arm(root: Path) -> None:
    """SIGINT to p2pkit while the B arm runs: the unit files come back byte for byte and the engine
    runs again as it was (the baseline's flags), and p2pkit exits 130 (the interrupt's code)."""
    import signal
    import subprocess

    log = root / "var/lib/p2pkit/engine/requests.jsonl"
    offset = log.stat().st_size
    unit = {f: (root / f.lstrip("/")).read_bytes() for f in bench.unit_files()}
    exe = Path(sys.executable).parent / "p2pkit"
    proc = subprocess.Popen([str(exe), "--root", str(root), "bench", "--ab", "serve.flags.draft-tokens=3",
                             "--requests", "40", "--warmup", "0", "--output-tokens", "32"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, b_server = time.monotonic() + 240, None
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            recs = log_records(log, offset)
            starts = [x for x in recs if x["event"] == "server_start" and draft_tokens(x) == "3"]
            if starts:
                b_server = starts[-1]["server_instance_id"]
                if any(x["event"] == "request_start" and x["server_instance_id"] == b_server for x in recs):
                    break  # the B arm's first request is running
            time.sleep(0.05)
        assert b_server and proc.poll() is None, "the second arm never started"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in err, err[-2000:]
    assert {f: (root / f.lstrip("/")).read_bytes() for f in bench.unit_files()} == unit
    last = [x for x in log_records(log, offset) if x["event"] == "server_start"][-1]
    assert last["server_instance_id"] != b_server and draft_tokens(last) == "7"
    from p2pkit.core import config
    from p2pkit.host import engine_api
    from p2pkit.rules import engine_cmd

    assert engine_api.get(engine_cmd.health_url(config.load(str(root / ".p2pkit-sim/profile.toml"))))[0] == 200


def test_no_server_figures_means_a_failed_request_never_the_clients_clock(tmp_path, monkeypatch):
    """The server answered 200, but its own accounting has nothing for the request (NInfer's log got
    no line; vLLM's /metrics is off): the request fails, it is not timed by the client instead (P15)."""
    from p2pkit.host import engine_api

    monkeypatch.setattr(engine_api, "openai_request", lambda *a, **k: {
        "status": 200, "client_seconds": 0.5, "usage": {"prompt_tokens": 8, "completion_tokens": 8}})
    ctx = ctx_for("dual-5090-ninfer", store=tmp_path)
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine/requests.jsonl").write_text("")
    r = bench.Ninfer(ctx, ctx.profile).request(8, 8)
    assert r["ok"] is False and "0 request_done line(s)" in r["error"] and "decode_tps" not in r
    monkeypatch.setattr(engine_api, "metrics", lambda base, prefix: {"status": 501, "values": {}})
    ctx = ctx_for("dual-spark-vllm", store=tmp_path)
    r = bench.Vllm(ctx, ctx.profile).request(8, 8)
    assert r["ok"] is False and "/metrics answered 501" in r["error"] and "decode_tps" not in r


def test_a_levels_client_stalls_are_one_warning_naming_the_worst():
    from types import SimpleNamespace

    from p2pkit.cli import bench_cmd

    said = []
    ctx = SimpleNamespace(out=SimpleNamespace(warn=said.append))
    stalls = [{"stream": 0, "index": i, "client_first_byte_s": 0.1 + i / 10, "server_s": 0.05,
               "outside_s": 0.05 + i / 10} for i in range(5)]
    doc = {"arms": [{"arm": "base", "levels": [{"shape": "decode", "concurrency": 1, "summary": {"stalls": stalls}},
                                               {"shape": "production", "concurrency": 1, "summary": {}}]}]}
    bench_cmd._say_levels(ctx, doc)
    assert len(said) == 1, said
    assert said[0].startswith("base, decode at 1 stream(s): 5 request(s) waited at the client") and \
        "stream 0 request 4: 0.5 s at the client against 0.05 s" in said[0], said[0]
