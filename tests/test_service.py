"""The service stage: flags refused before a start, the unit checked by the real systemd-analyze,
/health waited on, the main PID's cgroup, and the engine's own failures explained."""

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from p2pkit.app import pipeline
from p2pkit.core import config
from p2pkit.core.artifacts import Store
from p2pkit.core.output import Output
from p2pkit.host import Host, system
from p2pkit.rules import engine_cmd
from p2pkit.sim import lifecycle
from p2pkit.stages import get
from p2pkit.stages.service import act as svc

BASE = config.load(None)


def flags(**changes) -> config.Profile:
    f = dict(BASE.serve.flags)
    for k, v in changes.items():
        k = k.replace("_", "-")
        if v is None:
            f.pop(k, None)
        else:
            f[k] = v
    return replace(BASE, serve=replace(BASE.serve, flags=f))


@pytest.mark.parametrize("changes,check,fragment", [
    ({"tp": 3}, "service.tp", "1 or 2"),
    ({"devices": "0"}, "service.devices", "2 distinct GPU ids"),
    ({"devices": "0,2"}, "service.devices", "among 0,1"),
    ({"devices": "1,1"}, "service.devices", "distinct"),
    ({"vision_device": 3}, "service.vision_device", "one of the --devices"),
    ({"lm_head_draft": None}, "service.lm_head_draft", "requires the optimized proposal head"),
    ({"spec": "medusa"}, "service.spec", "mtp, dflash or dflash2"),
    ({"kv_dtype": "q4_0"}, "service.kv_dtype", "accepted KV dtypes"),
    ({"bogus_flag": 1}, "service.flags_known", "ninfer knows: default-max-tokens"),
    ({"port=1": 1}, "service.flags_form", "rejects --flag=value"),
])
def test_each_refusal(changes, check, fragment):
    found = {c.id: c for c in engine_cmd.validate(flags(**changes))}
    assert found[check].status == "fail", found[check]
    assert fragment in found[check].hint


@pytest.mark.parametrize("changes,check,pitfall", [
    ({"kv_capacity": 60000}, "service.kv_capacity", "P11"),
    ({"max_concurrency": 4, "spec": "mtp"}, "service.spec_slots", "P20"),
])
def test_warnings(changes, check, pitfall):
    c = {c.id: c for c in engine_cmd.validate(flags(**changes))}[check]
    assert c.status == "warn" and c.pitfall == pitfall


def test_the_builtin_profiles_do_not_warn_on_their_own_slots():
    """The default profile serves DFlash2 at --max-concurrency 8 (seed 000's production setting): P20
    (MTP pays at one slot, seed 003) is not its warning; MTP at several slots still is."""
    from p2pkit.core import config

    for name in ("dual-5090-ninfer", "dual-5090-llamacpp"):
        found = {c.id: c for c in engine_cmd.validate(config.load(name))}
        assert "service.spec_slots" not in found or found["service.spec_slots"].status == "pass", name
    mtp = {c.id: c for c in engine_cmd.validate(config.load(None, ["serve.flags.spec=mtp"]))}
    assert mtp["service.spec_slots"].status == "warn" and mtp["service.spec_slots"].value == 8


def test_llamacpp_warns_where_idle_slots_cells_stay_in_a_unified_cache():
    """Several slots in one unified KV cache with no RAM prompt cache: idle slots' cells stay, and one stream's
    decode slowed to 0.77x on the H200 (docs/measurements.md); one slot, no unified cache or a RAM cache do not
    warn. The built-in llama.cpp profile serves one slot (seed 003): no warning there."""
    from p2pkit.core import config

    base = config.load("dual-5090-llamacpp")

    def found(**flags):
        f = {k: v for k, v in {**base.serve.flags, **flags}.items() if v is not None}
        q = replace(base, serve=replace(base.serve, flags=f))
        return {c.id: c for c in engine_cmd.validate(q)}.get("service.idle_slot_cells")

    assert found() is None  # parallel 1, kv-unified, cache-ram 0
    c = found(parallel=8)
    assert c.status == "warn" and "8 slots" in c.measured and "kv-unified = false" in c.hint
    assert found(parallel=None).measured.startswith("4 slots")  # llama-server's auto: 4 slots, one unified cache
    assert found(parallel=8, **{"kv-unified": None}) is None
    assert found(parallel=8, **{"cache-ram": 8192}) is None
    assert found(parallel=8, **{"cache-ram": None}) is None  # llama-server's default RAM cache, 8192 MiB


def test_default_profile_passes_validation_and_builds_the_command_as_a_list():
    assert not [c for c in engine_cmd.validate(BASE) if c.status == "fail"]
    argv = engine_cmd.argv(BASE)
    assert argv[:2] == [engine_cmd.binary(BASE), BASE.model.output]  # the artifact first
    assert "--lm-head-draft" in argv and not any("=" in a for a in argv)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_public_host_is_a_warning():
    p = replace(BASE, serve=replace(BASE.serve, host="0.0.0.0", allow_public=True))
    c = {c.id: c for c in engine_cmd.validate(p)}["service.listen"]
    assert c.status == "warn" and "no authentication" in c.hint


@pytest.fixture
def service_host(sim):
    roots = []

    def make(env: dict | None = None):
        root = sim("healthy")
        h = Host.at(root)
        prof = config.load(h.sim["profile"])
        prof = replace(prof, serve=replace(prof.serve, health_timeout_s=30.0))  # sim init picked a free port
        lifecycle.place_engine(root, prof)
        if env:
            from p2pkit.sim.render import load_state, render

            st = load_state(root)
            st["engine_env"] = env
            render(root, st)
        roots.append(root)
        return pipeline.Ctx(profile=prof, host=h, store=Store(root / "var/lib/p2pkit"), out=Output())

    yield make
    for root in roots:  # never leave an engine running
        subprocess.run([str(root / "usr/bin/systemctl"), "stop", system.ENGINE_UNIT], check=False)


@pytest.mark.slow
def test_service_stage_on_the_simulated_host(service_host):
    # the engine answers 503 to the first two /health polls: the stage's wait sees the load on a
    # machine of any speed (an event, not a time window)
    ctx = service_host({"P2PKIT_SIM_LOAD_POLLS": "2", "P2PKIT_SIM_LOAD_SECONDS": "0"})
    doc = pipeline.run_stage(ctx, get("service"), "model")
    checks = {c["id"]: c for c in doc["checks"]}
    assert doc["status"] == "passed", [c for c in doc["checks"] if c["status"] == "fail"]
    assert checks["service.unit_verify"]["status"] == "pass"  # the real systemd-analyze verify
    exposure = float(checks["service.exposure"]["measured"].split()[0])
    assert exposure <= 5.0  # the real systemd-analyze security --offline
    assert checks["service.health"]["measured"].startswith("200 after")
    assert "503" in checks["service.health"]["measured"]  # it waited through the model load
    assert checks["service.memory_cap"]["measured"] == "none up from /p2pkit.slice/p2pkit-engine.service"
    assert checks["service.listen_where"]["measured"] == f"127.0.0.1:{ctx.profile.serve.port}"
    assert checks["service.spec_running"]["status"] == "pass"
    unit = (ctx.host.root / "etc/systemd/system/p2pkit-engine.service").read_text()
    assert "Slice=p2pkit.slice" in unit and "MemoryMax=infinity" in unit and "LimitMEMLOCK=infinity" in unit
    assert f"ExecStart={engine_cmd.binary(ctx.profile)} {ctx.profile.model.output} --tp 2" in unit
    assert "MemoryMax=infinity" in (ctx.host.root / "etc/systemd/system/p2pkit.slice").read_text()


@pytest.mark.slow
def test_engine_that_exits_at_start_shows_its_log_and_the_likely_cause(service_host):
    ctx = service_host(env={"P2PKIT_SIM_ENGINE_FAIL": "kv"})
    doc = pipeline.run_stage(ctx, get("service"), "model")
    h = {c["id"]: c for c in doc["checks"]}["service.health"]
    assert doc["status"] == "failed" and h["status"] == "fail"
    assert "the engine exited at start" in h["measured"] and "short by 2.1 GiB" in h["measured"]
    assert "KV cache does not fit" in h["hint"] and h["pitfall"] == "P11"


@pytest.mark.slow
def test_verify_after_the_engine_was_stopped_says_it_had_started(service_host):
    """Stopped on purpose after it served: verify names that (and the last log line), not "the engine
    exited at start", whose log would say it was listening."""
    ctx = service_host({"P2PKIT_SIM_LOAD_POLLS": "0", "P2PKIT_SIM_LOAD_SECONDS": "0"})
    assert pipeline.run_stage(ctx, get("service"), "model")["status"] == "passed"
    subprocess.run([str(ctx.host.root / "usr/bin/systemctl"), "stop", system.ENGINE_UNIT], check=True)
    results, _ = pipeline.verify(ctx, ["service"])
    h = {c["id"]: c for c in results[0]["checks"]}["service.health"]
    assert h["status"] == "fail" and "exited at start" not in h["measured"]
    assert "the engine is not running (stopped after it had started: last log line " in h["measured"]


@pytest.mark.slow
def test_flags_refused_before_anything_is_installed(service_host):
    ctx = service_host()
    ctx.profile = flags(lm_head_draft=None)
    doc = pipeline.run_stage(ctx, get("service"), "model")
    assert doc["status"] == "failed" and doc["acted"] == {}
    assert not (ctx.host.root / "etc/systemd/system/p2pkit-engine.service").exists()


@pytest.mark.slow
def test_serve_commands_use_the_overrides_the_host_was_brought_up_with(service_host, cli):
    """The service was brought up with --set serve.port=P (recorded in the host's state, as `up`
    does): serve status and restart find it there without repeating the --set (issue 17)."""
    from p2pkit.core import hoststate
    from p2pkit.sim.provision import free_port

    ctx = service_host()
    port = free_port()
    ctx.profile = config.load(ctx.host.sim["profile"], (f"serve.port={port}", "serve.health_timeout_s=30"))
    hoststate.record_profile(ctx.store.dir, ctx.profile)
    pipeline.run_stage(ctx, get("service"), "model")
    root = str(ctx.host.root)
    r = cli("--root", root, "serve", "status")
    assert r.code == 0 and "Active: active" in r.out and f"127.0.0.1:{port}: answers" in r.out
    r = cli("--root", root, "serve", "logs")
    assert "spec dflash2" in r.out
    r = cli("--root", root, "serve", "restart")
    assert r.code == 0 and "/health 200" in r.out


class Flaky(BaseHTTPRequestHandler):
    answers: ClassVar[list[int]] = []

    def do_GET(self):
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_health_wait_against_a_real_server_503_then_200_then_dies(sim):
    ctx = pipeline.Ctx(profile=BASE, host=Host.at(sim("healthy")), store=Store(Path("/nonexistent")), out=Output())
    Flaky.answers = [503, 503, 503]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    res = svc.wait_health(ctx, url, timeout=120, alive=lambda: True)  # returns at the 200: an event
    assert res["ok"] and res["codes"] == [503, 200]
    server.shutdown()
    server.server_close()
    t0 = time.monotonic()
    res = svc.wait_health(ctx, url, timeout=1, alive=lambda: True)  # it died: no answer at all
    assert not res["ok"] and not res["exited"] and time.monotonic() - t0 < 60  # ends at its timeout, not later
    res = svc.wait_health(ctx, url, timeout=30, alive=lambda: False)  # the unit is gone: stop waiting
    assert not res["ok"] and res["exited"]


def test_pid_cgroup_of_a_real_process_in_a_capped_cgroup(capped_cgroup):
    def enter():
        (capped_cgroup / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], preexec_fn=enter)
    try:
        caps = svc.pid_caps(Host.at("/"), proc.pid)["memory_caps"]
        assert any(c["limit_bytes"] == 1 << 30 for c in caps), json.dumps(caps)
    finally:
        proc.kill()
        proc.wait()
