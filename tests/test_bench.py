"""`p2pkit bench`'s pure parts over the real llama-server's recorded responses, and its gate."""

import json
from pathlib import Path

import pytest

from p2pkit import bench
from p2pkit.cli import bench_cmd

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
    assert r.code == 3 and "service stage is not done" in r.err and "p2pkit up" in r.err
    assert not (root / "var/lib/p2pkit/bench.json").exists()


def test_a_non_llamacpp_engine_is_refused_not_timed_by_the_client(sim, cli):
    from p2pkit import config, pipeline
    from p2pkit.artifacts import Store
    from p2pkit.host import Host
    from p2pkit.output import Output

    p = config.load("dual-5090-ninfer")
    ctx = pipeline.Ctx(profile=p, host=Host.at("/"), store=Store(Path("/nonexistent")), out=Output())
    with pytest.raises(Exception, match="P15"):
        bench.run(ctx, 8, 8, 0, 1, None)
