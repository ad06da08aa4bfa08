"""What the real llama.cpp prints, read by p2pkit: llama-bench's four output formats and its errors,
llama-server's --help (removed options), its start failures, and the build's own log, re-configure
and no-op dry run (P07). Every text here was recorded from the real CPU build tests/llama_real.py
makes; tests/fixtures/llamacpp/README.md says how."""

import json
from pathlib import Path

import pytest

from p2pkit.parse import engine_api as pe

FIX = Path(__file__).parent / "fixtures/llamacpp"


# ------------------------------------------------------------------ --help: removed options (issue 27, 4)

def test_options_the_real_help_marks_removed_are_not_accepted_flags():
    """llama-server keeps --draft-max and friends in its --help only to say what replaced them
    (common/arg.cpp arg_removed): they are not flags to write into a unit."""
    text = (FIX / "llama-server-help.txt").read_text()
    flags, removed = pe.help_flags(text), pe.help_removed(text)
    gone = {"draft", "draft-n", "draft-max", "draft-min", "draft-n-min", "spec-ngram-size-n", "spec-ngram-size-m",
            "spec-ngram-min-hits"}
    assert set(removed) == gone and not gone & flags
    assert removed["draft-max"] == "the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max"
    assert {"spec-draft-n-max", "spec-draft-n-min", "ctx-checkpoints", "swa-checkpoints"} <= flags
    # a description that starts on the next line (the names fill the column) is read there
    opts = {tuple(sorted(n)): d for n, d in pe.help_options(text)}
    assert opts[("ctx-checkpoints", "swa-checkpoints")].startswith("max number of context checkpoints")


# ------------------------------------------------------------------ the build judged the llama.cpp way (P07)

BUILD = FIX / "build"


def _cache(name: str) -> dict:
    from p2pkit.parse import build as pb

    return pb.cmake_cache((BUILD / name).read_text())


def test_the_real_first_cpu_build_meets_llamacpps_criteria():
    from p2pkit.parse import build as pb

    log = (BUILD / "cpu-first-build.log").read_text()
    crit = pb.llamacpp_criteria(log, _cache("cpu.CMakeCache.txt"), False, cuda=False)
    assert crit == {"no CMake Error": "none in the log", "linked bin/llama-server": "linked in this build",
                    "linked bin/llama-bench": "linked in this build"}
    # the same log without its last link line: the build did not end by linking llama-server
    cut = "\n".join(x for x in log.splitlines() if "Linking CXX executable bin/llama-server" not in x)
    assert pb.llamacpp_criteria(cut, None, False, cuda=False)["linked bin/llama-server"] is None
    # a CUDA build judged on this CPU log: no toolkit found, and the cache says GGML_CUDA is off
    assert pb.llamacpp_criteria(log, _cache("cpu.CMakeCache.txt"), False, cuda=True)["found CUDAToolkit"] is None


def test_a_rebuild_links_nothing_and_the_explained_dry_run_says_the_targets_are_current():
    """p2pkit's recipe run again over the built tree: CMake re-configures, the build runs llama.cpp's
    UI-assets step alone (it restats: nothing downstream rebuilds) and links nothing. Ninja's plain
    dry run cannot run that step, so it lists ui.cpp, server-http.cpp and llama-server's link as
    work (REFERENCE: never "no work to do"); with `-d explain` the only root reason is that custom
    target's stamp, which never exists. A target not built (llama-cli) has real reasons."""
    from p2pkit.parse import build as pb

    log = (BUILD / "cpu-rebuild.log").read_text()
    build = log[log.index("$ cmake --build"):]
    assert "Provisioning UI assets" in build and "Linking" not in build and "Building" not in build
    plain = json.loads((BUILD / "cpu-noop-dry-run.json").read_text())
    assert plain["rc"] == 0 and "Linking CXX executable bin/llama-server" in plain["stdout"]
    assert not pb.ninja_no_work(plain["stdout"]) and not pb.ninja_current(plain["stdout"] + plain["stderr"])
    explain = json.loads((BUILD / "cpu-noop-dry-run-explain.json").read_text())
    assert pb.ninja_current(explain["stdout"] + explain["stderr"])
    unbuilt = json.loads((BUILD / "cpu-unbuilt-target-dry-run-explain.json").read_text())
    assert not pb.ninja_current(unbuilt["stdout"] + unbuilt["stderr"])
    crit = pb.llamacpp_criteria(log, _cache("cpu.CMakeCache.txt"), True, cuda=False)
    assert all(crit.values()), crit
    assert crit["linked bin/llama-server"].startswith("up to date")
    assert pb.llamacpp_criteria(log, None, False, cuda=False)["linked bin/llama-server"] is None


def test_cuda_toolkit_found_from_the_log_and_on_a_reconfigure_from_the_cache():
    """The real CUDA configure here (nvcc 13.0, no cuBLAS: it stops at generate): FindCUDAToolkit's
    own line in the first run; a re-configure prints only llama.cpp's "CUDA Toolkit found", and the
    version comes from CMakeCache.txt. The CMake Error is a failed criterion either way."""
    from p2pkit.parse import build as pb

    first = (BUILD / "cuda-configure-no-cublas.log").read_text()
    again = (BUILD / "cuda-reconfigure-no-cublas.log").read_text()
    cache = _cache("cuda-no-cublas.CMakeCache.txt")
    assert "Found CUDAToolkit" not in again and "-- CUDA Toolkit found" in again
    c1 = pb.llamacpp_criteria(first, None, False, cuda=True)
    assert c1["found CUDAToolkit"] == "13.0.88 at /usr/local/cuda-13.0/include (build log)"
    assert c1["no CMake Error"] is None and c1["linked bin/llama-server"] is None
    assert pb.llamacpp_criteria(again, None, False, cuda=True)["found CUDAToolkit"] is None
    assert pb.llamacpp_criteria(again, cache, False, cuda=True)["found CUDAToolkit"] == "13.0.88 (CMakeCache.txt)"
    # where a build caches the version itself (the lead's CUDA build: CUDAToolkit_VERSION)
    assert pb.llamacpp_criteria("", {"CUDAToolkit_VERSION": "13.0.88"}, cuda=True)["found CUDAToolkit"] == \
        "13.0.88 (CMakeCache.txt CUDAToolkit_VERSION)"


def _verify_engine(tmp_path, log_text: str, *sets: str) -> tuple[dict, dict]:
    """What `p2pkit verify engine` judges on the real CPU build (the stage's measure over the build
    tests/llama_real.py made), with log_text as the last build log in a fresh state directory."""
    import llama_real

    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages.engine import act as es
    from p2pkit.stages.engine import checks as ec

    llama_real.wait()
    from dataclasses import replace

    # the build dir is the test cache's (under ~/.cache): a path the profile check refuses for a directory p2pkit
    # makes as root (/root is a system directory, issue 48 item 5); measuring it makes nothing
    given = [s for s in llama_real.overrides() if not s.startswith("engine.build_dir=")]
    p = config.load(llama_real.PROFILE, [*given, *sets])
    p = replace(p, engine=replace(p.engine, build_dir=str(llama_real.build_dir())))
    store = Store(tmp_path / "state")
    store.ensure()
    (store.dir / "logs").mkdir(exist_ok=True)
    (store.dir / "logs/engine-build-0001-20261203T000000Z.log").write_text(log_text)
    ctx = pipeline.Ctx(profile=p, host=Host.at("/"), store=store, out=Output())
    facts = es.measure(ctx)
    return {c.id: c for c in ec.check(facts, p)}, facts["engine_build"]


@pytest.mark.slow
def test_verify_engine_on_the_real_cpu_build_passes_p07_and_a_log_without_the_link_fails(tmp_path):
    import llama_real

    log = Path(llama_real.wait()["log"]).read_text()
    c, b = _verify_engine(tmp_path / "a", log)
    assert c["engine.build_log"].status == "pass", c["engine.build_log"]
    assert b["up_to_date"] is True and c["engine.binary"].status == "pass"
    assert "linked bin/llama-server: linked in this build" in c["engine.build_log"].measured
    # the same run's log cut before its last link: llama-server was not linked by it. Ninja's dry run
    # says the binary is current, which is what a rebuild with nothing to do shows: the criterion holds
    # through the dry run, not through the log
    cut = log[:log.index("Linking CXX executable bin/llama-server")]
    c, b = _verify_engine(tmp_path / "b", cut)
    assert c["engine.build_log"].status == "pass"
    assert "linked bin/llama-server: up to date" in c["engine.build_log"].measured
    # and a log with a CMake Error fails whatever Ninja says
    c, b = _verify_engine(tmp_path / "c", log + "\nCMake Error at CMakeLists.txt:1 (message):\n  boom\n")
    assert c["engine.build_log"].status == "fail" and c["engine.build_log"].pitfall == "P07"
    assert "no CMake Error" in c["engine.build_log"].measured
    # a target the dry run would still build (llama-cli is not built here): nothing is current, so the
    # log without the link line fails, naming llama-server
    c, b = _verify_engine(tmp_path / "d", cut, "engine.targets=[\"llama-server\", \"llama-cli\"]")
    assert b["up_to_date"] is False and c["engine.build_log"].status == "fail"
    assert "linked bin/llama-server" in c["engine.build_log"].measured


# ------------------------------------------------------------------ llama-bench's four formats (issue 27, 1)

BENCH = FIX / "bench"
FORMATS = ("md", "json", "jsonl", "csv")
TESTS = {"plain": [("pp32", 32, 0, 0), ("tg16", 0, 16, 0)],
         "depth": [("pp32 @ d32", 32, 0, 32), ("tg16 @ d32", 0, 16, 32)],
         "pg": [("pp32", 32, 0, 0), ("tg16", 0, 16, 0), ("pp32+tg16", 32, 16, 0)]}


def _bench(name: str) -> dict:
    return json.loads((BENCH / f"{name}.json").read_text())


def _read(name: str):
    from p2pkit.parse import llama_bench as lb

    rec = _bench(name)
    return lb.read(rec["stdout"] + rec["stderr"])


def test_this_llama_bench_has_depth():
    assert "-d, --n-depth <n>" in (BENCH / "llama-bench-help.txt").read_text()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("run", sorted(TESTS))
def test_each_format_of_the_real_llama_bench_reads_to_the_same_rows(run, fmt):
    from p2pkit.parse import llama_bench as lb

    rec = _bench(f"{run}.{fmt}")
    assert rec["rc"] == 0 and lb.detect(rec["stdout"] + rec["stderr"]) == fmt
    rows = _read(f"{run}.{fmt}")
    assert [(r.test, r.n_prompt, r.n_gen, r.n_depth) for r in rows] == TESTS[run]
    for r in rows:
        assert r.avg_ts > 0 and r.stddev_ts >= 0 and r.backend == "CPU" and r.model_type.startswith("llama")
        assert r.build_commit is None  # this tree has no git: llama-bench says "unknown" (md: "build: unknown (0)")
        assert r.n_gpu_layers is None if fmt == "md" else r.n_gpu_layers == -1  # md shows no ngl on a CPU backend
        if fmt in ("md", "csv"):
            assert r.samples_ts == ()  # neither prints the samples
        else:
            assert len(r.samples_ts) == 2  # -r 2
            assert r.avg_ts == pytest.approx(sum(r.samples_ts) / 2, rel=1e-4)


def test_md_columns_are_read_by_their_names():
    """-b 64 puts an n_batch column before the test column: the rows still read the same."""
    head = next(x for x in _bench("batch.md")["stdout"].splitlines() if x.startswith("|"))
    assert "n_batch" in head
    plain = _read("plain.md")
    rows = _read("batch.md")
    assert [(r.test, r.n_prompt, r.n_gen) for r in rows] == [(r.test, r.n_prompt, r.n_gen) for r in plain]
    assert rows[0].model_type == plain[0].model_type and rows[0].build_commit == plain[0].build_commit


def test_a_known_build_commit_is_kept():
    from p2pkit.parse import llama_bench as lb

    rec = _bench("plain.md")
    text = rec["stdout"].replace("build: unknown (0)", "build: 0c1e570 (1)")  # a tree with git says its commit
    assert {r.build_commit for r in lb.read(text)} == {"0c1e570"}


@pytest.mark.parametrize("name,said", [
    ("missing-model", "failed to load model"),
    ("not-gguf", "failed to load model"),
    ("invalid-argument", "invalid parameter for argument: --no-such-flag"),
])
@pytest.mark.parametrize("fmt", ("md", "json"))
def test_llama_bench_errors_are_named_with_their_fix(name, said, fmt):
    from p2pkit.parse import llama_bench as lb

    rec = _bench(f"error-{name}.{fmt}")
    assert rec["rc"] != 0
    with pytest.raises(lb.LlamaBenchError) as e:
        lb.read(rec["stdout"] + rec["stderr"])
    msg = str(e.value)
    assert said in msg and "llama-bench said" in msg
    assert ("--help" in msg) if name == "invalid-argument" else ("GGUF" in msg)


def test_no_output_and_a_cut_json_are_errors_not_empty_results():
    from p2pkit.parse import llama_bench as lb

    with pytest.raises(lb.LlamaBenchError, match="no result row"):
        lb.read("")
    out = _bench("plain.json")["stdout"]
    with pytest.raises(lb.LlamaBenchError, match="closing"):
        lb.read(out[:out.rindex("]")])


# ------------------------------------------------------------------ llama-server's start failures (issue 27, 5)

@pytest.mark.parametrize("case,word", [
    ("not-gguf", "could not load the model file"),
    ("missing-model", "could not load the model file"),
    ("unknown-flag", "a flag this llama-server does not know"),
    ("removed-flag", "no longer accepts"),
    ("port-in-use", "the port is taken"),
])
def test_the_real_servers_start_failures_are_named(case, word):
    """Each start failure of the real llama-server (recorded: exit code and its own stderr) maps to
    its cause the way the service stage reads the unit's log (likely_cause: the first needle of
    CAUSES found in it)."""
    from p2pkit.stages.service.act import CAUSES

    rec = json.loads((FIX / f"server-start/{case}.json").read_text())
    assert rec["rc"] != 0
    text = "\n".join((rec["stdout"] + rec["stderr"]).splitlines()[-50:])  # the log tail the service reads
    cause = next((c for needle, c in CAUSES if needle in text), None)
    assert cause is not None and word in cause, (case, cause)


@pytest.mark.slow
def test_a_removed_flag_is_refused_before_a_start_by_the_real_servers_help(tmp_path, monkeypatch):
    """--draft-max is in the real llama-server's --help, as removed: a profile that sets it (p2pkit's
    own list patched to allow it, like an older p2pkit would) is refused with what replaced it."""
    import llama_real
    from test_llamacpp_e2e import llama_sim, sim_ctx

    from p2pkit.core.errors import Exit, P2pkitError
    from p2pkit.rules.engines import flags, llamacpp
    from p2pkit.stages.service import act as service

    monkeypatch.setitem(llamacpp.FLAGS, "draft-max", flags.Flag())
    llama_real.wait()
    ctx = sim_ctx(llama_sim(tmp_path / "host"), "serve.flags.draft-max=4")
    with pytest.raises(P2pkitError) as e:
        service.flags_accepted(ctx)
    assert e.value.code == Exit.USAGE and "--draft-max" in e.value.message
    assert "use --spec-draft-n-max" in e.value.message


def test_the_cuda_build_on_the_h200_meets_the_llamacpp_criteria():
    """P07 the llama.cpp way on the real CUDA build (p2pkit's engine stage on the lent H200, sm_90,
    tests/fixtures/h200-device/engine-run): the first build's log names the toolkit FindCUDAToolkit
    found and links both targets; the re-configure's log does not print the Found line again, and the
    cache says what was found. A log without the link lines and no up-to-date dry run fails."""
    from p2pkit.parse import build as pb

    d = Path(__file__).parent / "fixtures/h200-device/engine-run"
    first = next(d.glob("engine-build-0001-*.log")).read_text()
    again = next(d.glob("engine-build-0002-*.log")).read_text()
    cache = pb.cmake_cache((d / "CMakeCache.txt").read_text())
    c1 = pb.llamacpp_criteria(first, cache, up_to_date=False, cuda=True)
    assert all(c1.values()), c1
    assert c1["found CUDAToolkit"].startswith("13.0.88 at /usr/local/cuda") and "(build log)" in c1["found CUDAToolkit"]
    assert "Found CUDAToolkit" not in again  # a re-configure prints it no more ...
    c2 = pb.llamacpp_criteria(again, cache, up_to_date=False, cuda=True)
    assert c2["found CUDAToolkit"] == "13.0.88 (CMakeCache.txt)" and all(c2.values())  # ... the cache says it
    unlinked = "\n".join(x for x in first.splitlines() if "Linking CXX executable bin/" not in x)
    assert pb.llamacpp_criteria(unlinked, cache, up_to_date=False, cuda=True)["linked bin/llama-server"] is None
