"""`up` end to end on a simulated host with the dual-5090-llamacpp profile and CUDA off: the real
llama.cpp (built once per machine, tests/llama_real.py), its real converter over a tiny checkpoint
made here, the real llama-server started by the simulated host's systemctl stand-in, then `bench`
on it, an A/B that puts the unit back byte for byte, and the bad-input cases."""

import json
import os
import shutil
from pathlib import Path

import llama_real
import pytest
import tiny_checkpoint

from p2pkit.host import launcher
from p2pkit.sim import lifecycle, scenarios

pytestmark = pytest.mark.slow

UNIT = "etc/systemd/system/p2pkit-engine.service"
MODEL = "/srv/models/tiny-llama"
GGUF = "/srv/models/tiny-llama-BF16.gguf"
# The GPU profile's serve flags, with what a CPU and a tiny model need instead: no tensor split
# (there are no GPUs), a small context, and the tiny model as its own draft (it has no MTP layers).
SETS = ["engine.cuda=false", f"model.source={MODEL}", f"model.output={GGUF}", 'model.components=["text"]',
        "serve.flags.split-mode=none", "serve.flags.ctx-size=2048", "serve.flags.spec-type=draft-simple",
        f"serve.flags.model-draft={GGUF}", "serve.flags.threads=2", "bench.prompt_tokens=32",
        "bench.output_tokens=32", "bench.requests=3",
        # the real build, shared by the tests' hosts: /opt/p2pkit-tests is a link to its cache, so the
        # build dir is a real directory inside it (a build dir that is itself a link out is refused)
        f"engine.build_dir=/opt/p2pkit-tests/{llama_real.build_dir().name}"]


def llama_sim(root: Path, scenario: str = "healthy", context: int = 2048) -> Path:
    """A simulated host for the llama.cpp profile, with the pinned archive in its download cache,
    its engine build dir in the real build's cache (engine.build_dir in SETS) and the tiny checkpoint
    as its model source."""
    state = scenarios.build(scenario)
    state["profile"] = "dual-5090-llamacpp"
    state["lent_dirs"] = ["/opt/p2pkit-tests"]  # the link below to the real build's cache, lent as in place
    root.mkdir(parents=True)
    lifecycle.init(root, state)
    arc = llama_real.archive()
    cached = root / "var/cache/p2pkit" / arc.name
    cached.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(arc, cached)
    except OSError:
        shutil.copy(arc, cached)
    (root / "opt").mkdir(exist_ok=True)
    (root / "opt/p2pkit-tests").symlink_to(llama_real.build_dir().parent)
    # head size 32: the profile's q4_0 KV cache needs it divisible by q4_0's block of 32
    # ("K cache type q4_0 with block size 32 does not divide n_embd_head_k=16" at hidden 64)
    tiny_checkpoint.make(root / MODEL.lstrip("/"), hidden=128, context=context)
    return root


def up(cli, root: Path, *more: str, up_args: tuple[str, ...] = ()):
    """`up` to the end: the first run stops for the p2p-module reboot, the simulated host reboots,
    the second run resumes. `more` goes before the command, `up_args` after it."""
    import fcntl

    # a key `more` sets again replaces SETS' value (p2pkit refuses one key given twice with two values)
    again = {more[i + 1].split("=", 1)[0] for i, a in enumerate(more[:-1]) if a == "--set"}
    args = [a for s in SETS if s.split("=", 1)[0] not in again for a in ("--set", s)]
    # the simulated hosts of these tests share one real build dir (a link to the cache): one `up` at
    # a time, as p2pkit's own lock keeps one run at a time on a real host
    with open(llama_real.CACHE / "llama-up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = cli("--root", str(root), *args, *more, "--yes", "up", *up_args)
        if "reboot, then run p2pkit up again" in r.err:
            lifecycle.reboot(root)
            r = cli("--root", str(root), *args, *more, "--yes", "up", *up_args)
    return r


@pytest.fixture
def served(tmp_path, cli):
    llama_real.wait()
    root = llama_sim(tmp_path / "host")
    r = up(cli, root)
    yield root, r
    lifecycle.stop_services(root)


def test_up_builds_converts_serves_and_benches_the_real_llamacpp(served, cli):
    root, r = served
    assert r.code == 0, r.err[-3000:]
    assert "CUDA OFF" in r.err  # said plainly, never silent
    state = root / "var/lib/p2pkit"
    # the simulated hosts share one real build dir, already built: the engine's proof holds before it
    # acts, and the artifact gate skips its build (the build path itself is forced at the end)
    assert "[engine] not acting: its proof holds before acting" in r.err
    model = json.loads((state / "model.json").read_text())
    v = model["facts"]["model_build"]["verify"]
    assert v["architecture"] == "llama" and v["tensor_count"] == 21 and model["facts"]["model_build"]["sha256"]
    assert "-m" in model["facts"]["model_build"]["convert_argv"]  # run as a module (P08)
    svc = json.loads((state / "service.json").read_text())
    checks = {c["id"]: c for c in svc["checks"]}
    assert checks["service.health"]["status"] == "pass" and 200 in svc["facts"]["service"]["health"]["codes"]
    assert checks["service.first_completion"]["status"] == "pass"
    assert checks["service.spec_running"]["status"] == "pass", checks["service.spec_running"]
    fc = svc["facts"]["service"]["first_completion"]
    assert fc["timings"]["draft_n"] > 0 and fc["metrics_delta"]["spec_decode_num_draft_tokens_total"] > 0

    # bench: the server's own figures agree with its /metrics deltas for the same requests
    r = cli("--root", str(root), "--json", "bench")
    assert r.code == 0, r.err[-2000:]
    doc = r.json()
    arm = doc["arms"][0]
    reqs, d = arm["requests"], arm["metrics_delta"]
    assert len(reqs) == 3 and all(x["predicted_n"] == 32 for x in reqs)
    assert d["tokens_predicted_total"] == sum(x["predicted_n"] for x in reqs)
    assert d["prompt_tokens_total"] == sum(x["prompt_n"] for x in reqs)
    secs = sum(x["predicted_ms"] for x in reqs) / 1000
    assert abs(d["tokens_predicted_seconds_total"] - secs) <= 0.01 * secs + 0.003
    assert arm["summary"]["decode_tps"]["median"] > 0 and arm["summary"]["metrics_decode_tps"] > 0
    assert json.loads((state / "bench.json").read_text())["arms"][0]["requests"] == reqs

    # A/B with one setting changed: two arms, the unit put back byte for byte
    before = (root / UNIT).read_bytes()
    r = cli("--root", str(root), "--json", "bench", "--ab", "serve.flags.threads=1", "--requests", "2")
    assert r.code == 0, r.err[-2000:]
    doc = r.json()
    assert [a["arm"] for a in doc["arms"]] == ["baseline", "serve.flags.threads=1"]
    assert all(len(a["requests"]) == 2 for a in doc["arms"]) and doc["ab_ratio_decode"] > 0
    assert doc["restored"] == {"files_identical": True, "health": True}
    assert (root / UNIT).read_bytes() == before

    # a server that dies during the B arm: requests done so far kept, unit restored, exit 1, its last lines
    from p2pkit.app import bench as bench_mod
    from p2pkit.stages.service import act as svc_mod

    real_one = bench_mod.one_request
    calls = {"n": 0}

    def dying(reader, n_prompt, n_out):
        calls["n"] += 1
        p = reader.p
        if p.overrides and p.overrides[-1] == "serve.flags.threads=1" and calls["n"] == 6:
            os.kill(svc_mod.main_pid(svc_mod.Host.at(root)), 9)
        return real_one(reader, n_prompt, n_out)

    bench_mod.one_request = dying
    try:
        r = cli("--root", str(root), "bench", "--ab", "serve.flags.threads=1", "--requests", "2", "--warmup", "1")
    finally:
        bench_mod.one_request = real_one
    assert r.code == 1 and "request" in r.err and "failed" in r.err and "last lines" in r.err
    doc = json.loads((state / "bench.json").read_text())
    assert len(doc["arms"][0]["requests"]) == 2 and len(doc["arms"][1]["requests"]) == 1
    assert doc["restored"]["files_identical"] and doc["restored"]["health"]
    assert (root / UNIT).read_bytes() == before

    # the engine stage's build path on the real llama.cpp, forced past the gate: CMake configures from
    # its cache with CUDA off, said plainly
    r = up(cli, root, up_args=("--from", "engine", "--to", "engine", "--force"))
    assert r.code == 0, r.err[-3000:]
    assert "CUDA OFF" in r.err  # said plainly, never silent
    eng = json.loads((state / "engine.json").read_text())
    b = eng["facts"]["engine_build"]
    assert b["cuda_enabled"] is False and "-DGGML_CUDA=OFF" in b["cmake_options"]
    assert b["source"]["sha256"] == llama_real.pinned()[1] and b["binary"]["runs"]
    checks = {c["id"]: c for c in eng["checks"]}
    assert checks["engine.cuda"]["status"] == "warn" and "CUDA OFF" in checks["engine.cuda"]["measured"]
    # P07 the llama.cpp way: the build dir is the cache's, already built, so this run links nothing and
    # Ninja's explained dry run says both binaries are current
    assert checks["engine.build_log"]["status"] == "pass" and b["up_to_date"] is True
    assert "linked bin/llama-bench: up to date" in checks["engine.build_log"]["measured"]


def sim_ctx(root: Path, *more: str):
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host

    h = Host.at(root)
    ctx = pipeline.Ctx(profile=config.load(h.sim["profile"], [*SETS, *more]), host=h,
                       store=Store(root / "var/lib/p2pkit"), out=Output())
    ctx.store.ensure()
    return ctx


def test_the_real_converter_failing_leaves_no_output_file(tmp_path):
    """llama.cpp's own converter, run by the model stage from the real source (as a module, P08) over a
    tiny checkpoint whose architecture it does not know: it exits 1 naming it, and neither the output
    nor a partial file nor an output record is left. The converter alone, not a whole `up`."""
    from p2pkit.stages.model import act as model_stage
    from p2pkit.stages.model import checks as model_checks

    llama_real.wait()
    root = llama_sim(tmp_path / "host")
    cfg = root / MODEL.lstrip("/") / "config.json"
    cfg.write_text(cfg.read_text().replace("LlamaForCausalLM", "NoSuchModelForCausalLM"))
    ctx = sim_ctx(root)
    res = model_stage.convert(ctx)
    assert res["convert_argv"][1:3] == ["-m", "convert_hf_to_gguf"] and res["convert_rc"] == 1, res
    c = {x.id: x for x in model_checks.check({"model_build": res}, ctx.profile)}["model.convert"]
    assert c.status == "fail" and "NoSuchModelForCausalLM is not supported" in c.measured
    out = root / GGUF.lstrip("/")
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))
    assert not (ctx.store.dir / "model-output.json").exists()


def test_a_flag_the_built_server_does_not_list_is_refused_before_a_start(tmp_path, monkeypatch):
    """A flag p2pkit's own list allows (patched here: a p2pkit newer than the engine commit) that the
    built llama-server's --help does not list: refused with the usage exit code before anything is
    installed or started."""
    from p2pkit.core.errors import Exit, P2pkitError
    from p2pkit.rules import engine_cmd
    from p2pkit.rules.engines import flags, llamacpp
    from p2pkit.stages.service import act as service

    monkeypatch.setitem(llamacpp.FLAGS, "no-such-flag", flags.Flag())
    llama_real.wait()
    root = llama_sim(tmp_path / "host")
    assert service.flags_accepted(sim_ctx(root))  # the profile's own flags are all in the real --help
    ctx = sim_ctx(root, "serve.flags.no-such-flag=1")
    assert not [c for c in engine_cmd.validate(ctx.profile) if c.status == "fail"]  # p2pkit's list lets it by
    with pytest.raises(P2pkitError) as e:
        service.act(ctx)
    assert e.value.code == Exit.USAGE and "--no-such-flag" in e.value.message
    assert "refused before a start" in e.value.message and "serve.flags" in e.value.hint
    assert not (root / UNIT).exists()  # nothing installed, nothing started


def test_bench_by_the_seeds_method_under_the_launcher(tmp_path, cli):
    """Issue 27 on the CPU: a host without systemd as PID 1 (the launcher starts the real llama-server),
    then bench by seed 000's whole method: both workload shapes at 1 and 2 streams, per-stream and
    aggregate figures from the server's own accounting, the lengths the server ran equal to the asked
    (P13), llama-bench at the same lengths and depth as the reference arm (read by the package's reader),
    the draft's acceptance per level, and the plot; then serve stop through p2pkit."""
    llama_real.wait()
    root = llama_sim(tmp_path / "host", "no-systemd", context=8192)
    try:
        r = up(cli, root, "--set", "serve.flags.ctx-size=8192", "--set", "serve.flags.parallel=2")
        assert r.code == 0, r.err[-3000:]
        assert "starting the engine with p2pkit's launcher" in r.out + r.err
        png = tmp_path / "bench.png"
        env_file = (root / "etc/p2pkit/engine.env").read_bytes()
        r = cli("--root", str(root), "--json", "bench", "--shapes", "decode,production", "--concurrency", "1,2",
                "--requests", "1", "--warmup", "1", "--reference", "--plot", str(png), "--ab",
                "serve.flags.spec-draft-n-max=2")
        assert r.code == 0, r.err[-3000:]
        doc = r.json()
        lv = doc["arms"][0]["levels"]
        assert [(x["shape"], x["concurrency"]) for x in lv] == [("decode", 1), ("decode", 2), ("production", 1),
                                                                 ("production", 2)]
        for x in lv:
            assert len(x["requests"]) == x["concurrency"] and {q["stream"] for q in x["requests"]} == \
                set(range(x["concurrency"]))
            s = x["summary"]
            assert s["lengths"]["match"], s["lengths"]  # P13: what the server ran is what was asked
            assert s["decode_tps"]["median"] > 0 and s["aggregate_decode_tps"] > 0
            assert s["draft_acceptance"] >= 0  # the draft is on (spec-type draft-simple in SETS)
            assert x["metrics_delta"]["tokens_predicted_total"] == sum(q["predicted_n"] for q in x["requests"])
        # the A/B under the launcher: the B arm ran every level, then the engine went back as it was
        assert [(x["shape"], x["concurrency"]) for x in doc["arms"][1]["levels"]] == [(x["shape"], x["concurrency"])
                                                                                     for x in lv]
        assert doc["restored"] == {"files_identical": True, "health": True}
        assert (root / "etc/p2pkit/engine.env").read_bytes() == env_file
        argv = launcher.read_record(root / launcher.RECORD.lstrip("/"))["argv"]
        assert argv[argv.index("--spec-draft-n-max") + 1] == "5"  # the baseline's flags again
        # the B arm really ran with its flag: the launcher started the engine with it between the two arms
        # (a flag is in no file where there is no unit: found on the H200, where the B arm had run unchanged)
        starts = [ln for ln in (root / "var/lib/p2pkit/logs/engine-launcher.log").read_text().splitlines()
                  if ln.startswith("-- p2pkit launcher")]
        assert ["--spec-draft-n-max 2" in ln for ln in starts[-2:]] == [True, False], starts
        ref = {x["shape"]: x for x in doc["reference"]["shapes"]}
        assert ref["decode"]["decode_tps"]["test"] == "tg512 @ d128" and ref["decode"]["prefill_tps"]["test"] == "pp128"
        assert ref["production"]["decode_tps"]["test"] == "tg128 @ d2048"
        ratios = {x["shape"]: x for x in doc["reference_ratios"]}
        assert set(ratios) == {"decode", "production"} and ratios["decode"]["decode_tps"]["ratio"] > 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        r = cli("--root", str(root), "serve", "stop")
        assert r.code == 0 and "stopped" in r.out, r.out + r.err
    finally:
        lifecycle.stop_services(root)
