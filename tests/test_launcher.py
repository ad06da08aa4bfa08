"""p2pkit's launcher, the engine's starter where systemd is not PID 1 (issue 27 item 3): out of a
memory-capped cgroup for real (root; v1 or v2, whichever this machine has), a second start refused,
a killed p2pkit leaves no orphan, an engine that dies at once reports its log; and the service
stage, `serve status|restart|stop` and `status` on a simulated host without systemd."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from p2pkit.app import pipeline
from p2pkit.core import config
from p2pkit.core.artifacts import Store
from p2pkit.core.errors import Exit, P2pkitError
from p2pkit.core.output import Output
from p2pkit.host import Host, launcher, system
from p2pkit.sim import lifecycle
from p2pkit.stages import get

GIB = 1 << 30
# the engine's stand-in: answers GET /health 200 on the port it is given, and marks that it ran
ENGINE = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
open(sys.argv[2], "w").write("ran")
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_gone(pid: int, start: int | None, limit_s: float = 30.0) -> bool:
    """Whether the process is gone within limit_s (a bound on waiting for an event, not a timing claim)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if not launcher.children.running(pid, start):
            return True
        time.sleep(0.05)
    return False


def tmp_host(root: Path) -> Host:
    """A host root with a cgroup v2 layout of plain files: the launcher's mechanics without touching
    this machine's cgroups (p2pkit itself in a capped session scope)."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("0::/user.slice/session-1.scope\n")
    (root / "sys/fs/cgroup/user.slice/session-1.scope").mkdir(parents=True)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("memory pids\n")
    (root / "sys/fs/cgroup/user.slice/session-1.scope/memory.max").write_text(f"{8 * GIB}\n")
    return Host.at(root)


@pytest.fixture
def records(tmp_path):
    """Record paths for this test; every engine they name is stopped afterwards."""
    made = []

    def make(name: str = "rec") -> Path:
        made.append(tmp_path / f"{name}.json")
        return made[-1]
    yield make
    for rec in made:
        launcher.stop(rec, timeout_s=5)


DRIVER = """
import json, sys
from pathlib import Path
from p2pkit.host import Host, launcher
from p2pkit.core.errors import P2pkitError
spec = json.loads(sys.argv[1])
if spec.get("pause_before_record"):  # stop in the middle of a start: the stub runs, nothing is recorded yet
    real = launcher.atomic_write
    def pause(*a, **k):
        print(json.dumps({"paused": True}), flush=True)
        import time
        time.sleep(600)
    launcher.atomic_write = pause
try:
    rec = launcher.start(Host.at(spec["root"]), record=Path(spec["record"]), log=Path(spec["log"]), argv=spec["argv"],
                         env={"PATH": "/usr/bin:/bin"}, cgroup_name=spec.get("cgroup", "p2pkit-engine"))
except P2pkitError as e:
    print(json.dumps({"error": e.message, "code": int(e.code)}), flush=True)
    sys.exit(int(e.code))
print(json.dumps(rec), flush=True)
if spec.get("then_wait"):
    import time
    time.sleep(600)
"""


def driver(spec: dict, enter=None) -> subprocess.Popen:
    """p2pkit's launcher in a process of its own (the p2pkit a test kills, or one started in a capped cgroup)."""
    return subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(spec)], stdout=subprocess.PIPE, text=True,
                            preexec_fn=enter)


def test_the_engine_leaves_the_capped_cgroup_p2pkit_was_started_in(capped_cgroup, records, tmp_path):
    """Root, on this machine's own memory controller: p2pkit runs in a cgroup capped at 1 GiB (a
    shell's, as in seed 000); the engine it starts has no cap anywhere up its chain."""
    port, marker = free_port(), tmp_path / "ran"
    rec_path, name = records(), f"p2pkit-engine-test-{os.getpid()}"
    mount = capped_cgroup.parent
    while (mount.parent / "cgroup.procs").exists():
        mount = mount.parent  # the root of the memory hierarchy: where the launcher makes its cgroup
    made = mount / name
    try:
        d = driver({"root": "/", "record": str(rec_path), "log": str(tmp_path / "engine.log"), "cgroup": name,
                    "argv": [sys.executable, "-c", ENGINE, str(port), str(marker)]},
                   enter=lambda: (capped_cgroup / "cgroup.procs").write_text(str(os.getpid())))
        out, _ = d.communicate(timeout=120)
        rec = json.loads(out.splitlines()[-1])
        assert "error" not in rec, rec
        # p2pkit itself was capped: the driver's chain had the 1 GiB limit the fixture set
        own = Path(f"/proc/{rec['pid']}/cgroup").read_text()
        caps = system.pid_caps(Host.at("/"), rec["pid"])
        assert caps["memory_caps"] == [], (own, caps)
        assert rec["caps"]["memory_caps"] == [] and rec["cgroup"]["dir"].endswith("/" + name), rec
        assert f"/{name}" in own, own
        assert str(rec["pid"]) in (made / "cgroup.procs").read_text().split()
        import urllib.request

        end = time.monotonic() + 60
        while True:  # the stand-in engine really serves
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < end, "the engine never answered /health"
                time.sleep(0.1)
        assert launcher.stop(rec_path)["stopped"]
        assert not launcher.children.running(rec["pid"], rec["start"])
    finally:
        launcher.stop(rec_path, timeout_s=5)
        if made.is_dir():
            made.rmdir()


def test_a_second_start_is_refused_while_one_runs(tmp_path, records):
    host, rec = tmp_host(tmp_path / "host"), records()
    argv = [sys.executable, "-c", "import time; time.sleep(600)"]
    first = launcher.start(host, record=rec, log=tmp_path / "engine.log", argv=argv, env={})
    with pytest.raises(P2pkitError) as e:
        launcher.start(host, record=rec, log=tmp_path / "engine.log", argv=argv, env={})
    assert e.value.code == Exit.LOCKED
    assert f"pid {first['pid']}" in e.value.message and "second start was refused" in e.value.message
    # the cgroup it made is under the root of the hierarchy, not under p2pkit's capped session scope
    assert first["cgroup"]["path"] == "/p2pkit-engine" and first["cgroup"]["caps"] == []
    assert (tmp_path / "host/sys/fs/cgroup/p2pkit-engine/cgroup.procs").read_text().split() == [str(first["pid"])]
    assert launcher.stop(rec)["stopped"]
    again = launcher.start(host, record=rec, log=tmp_path / "engine.log", argv=argv, env={})  # stopped: it may
    assert again["pid"] != first["pid"]


def test_a_killed_p2pkit_in_the_middle_of_a_start_leaves_no_orphan(tmp_path, records):
    """SIGKILL after the stub runs but before the record is written: the engine never runs (the stub
    reads end-of-file and exits instead of exec'ing it)."""
    (tmp_path / "host").mkdir()
    tmp_host(tmp_path / "host")
    marker, rec = tmp_path / "ran", records()
    d = driver({"root": str(tmp_path / "host"), "record": str(rec), "log": str(tmp_path / "engine.log"),
                "pause_before_record": True, "argv": [sys.executable, "-c", ENGINE, str(free_port()), str(marker)]})
    assert json.loads(d.stdout.readline()) == {"paused": True}
    procs = (tmp_path / "host/sys/fs/cgroup/p2pkit-engine/cgroup.procs").read_text().split()
    stub = int(procs[0])
    start = launcher.children.start_time(stub)
    assert launcher.children.running(stub, start)  # the stub waits, moved into its cgroup, on p2pkit's word
    d.send_signal(signal.SIGKILL)
    d.wait()
    assert wait_gone(stub, start), f"the stub {stub} outlived the p2pkit that started it"
    assert not marker.exists(), "the engine ran though no record names it"
    assert launcher.read_record(rec) is None


def test_a_killed_p2pkit_after_the_start_leaves_an_engine_its_record_stops(tmp_path, records):
    (tmp_path / "host").mkdir()
    tmp_host(tmp_path / "host")
    marker, rec = tmp_path / "ran", records()
    d = driver({"root": str(tmp_path / "host"), "record": str(rec), "log": str(tmp_path / "engine.log"),
                "then_wait": True, "argv": [sys.executable, "-c", ENGINE, str(free_port()), str(marker)]})
    got = json.loads(d.stdout.readline())
    d.send_signal(signal.SIGKILL)
    d.wait()
    assert launcher.read_record(rec)["pid"] == got["pid"]
    assert launcher.is_running(launcher.read_record(rec))  # not taken down with p2pkit: it is the service
    res = launcher.stop(rec)
    assert res["stopped"] and res["pid"] == got["pid"]
    assert wait_gone(got["pid"], got["start"]) and not launcher.session_members(got["pid"])
    assert not launcher.is_running(launcher.read_record(rec))


def test_an_engine_that_exits_at_once_reports_its_last_log_lines(tmp_path, records):
    host, rec = tmp_host(tmp_path / "host"), records()
    argv = ["/bin/sh", "-c", "echo 'loading /srv/models/x.ninfer'; echo 'error: cannot open artifact' >&2; exit 3"]
    with pytest.raises(P2pkitError) as e:
        launcher.start(host, record=rec, log=tmp_path / "engine.log", argv=argv, env={"PATH": "/usr/bin:/bin"},
                       settle_s=60)
    assert "exit 3" in e.value.message
    assert "loading /srv/models/x.ninfer | error: cannot open artifact" in e.value.message


def test_systemd_booted_reads_pid1_and_run_systemd(tmp_path):
    h = tmp_host(tmp_path)
    assert not launcher.systemd_booted(h)  # no /run/systemd/system
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    (tmp_path / "proc/1").mkdir()
    (tmp_path / "proc/1/comm").write_text("tini\n")
    assert not launcher.systemd_booted(h)  # the directory from a container image, PID 1 is not systemd
    (tmp_path / "proc/1/comm").write_text("systemd\n")
    assert launcher.systemd_booted(h)


# ---------------------------------------------------------------------------------------- the service stage

def service_ctx(root: Path, **serve) -> pipeline.Ctx:
    h = Host.at(root)
    prof = config.load(h.sim["profile"])
    prof = replace(prof, serve=replace(prof.serve, health_timeout_s=60.0, **serve))
    lifecycle.place_engine(root, prof)
    return pipeline.Ctx(profile=prof, host=h, store=Store(root / "var/lib/p2pkit"), out=Output())


@pytest.mark.slow
def test_where_no_uncapped_cgroup_can_be_had_the_cap_is_a_finding_with_its_number_and_fix(sim):
    root = sim("no-systemd-capped-root")
    ctx = service_ctx(root)
    doc = pipeline.run_stage(ctx, get("service"), "model")
    checks = {c["id"]: c for c in doc["checks"]}
    cap = checks["service.memory_cap"]
    assert cap["status"] == "fail", cap
    assert "/sys/fs/cgroup/memory.max = 137438953472 bytes (128.0 GiB)" in cap["measured"]
    assert "root shell outside the capped cgroup" in cap["hint"] and "systemd unit" in cap["hint"]
    assert checks["service.health"]["status"] == "pass"
    assert checks["service.manager"]["status"] == "warn"
    assert "nothing restarts the engine after a reboot" in checks["service.manager"]["measured"]
    assert doc["facts"]["service"]["launcher"]["cgroup"]["dir"] == "/sys/fs/cgroup/p2pkit-engine"


@pytest.mark.slow
def test_up_on_a_host_without_systemd_then_serve_status_restart_stop(sim, cli):
    root = sim("no-systemd")
    r = cli("--root", str(root), "up", "--reboot")
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    assert "starting the engine with p2pkit's launcher" in r.out + r.err
    said = r.out + r.err
    assert not (root / "etc/systemd/system/p2pkit-engine.service").exists()  # no unit where systemd is not PID 1
    assert (root / "etc/p2pkit/engine.env").is_file()  # the same environment file as a unit would read
    rec = launcher.read_record(root / launcher.RECORD.lstrip("/"))
    assert launcher.is_running(rec)
    # the P12 proof read the launcher's pid: its chain is the cgroup the launcher made, without a cap,
    # though p2pkit itself ran capped (128 GiB, the box)
    art = json.loads((root / "var/lib/p2pkit/service.json").read_text())
    svc = art["facts"]["service"]
    assert svc["main_pid"] == rec["pid"] and svc["pid_cgroup"]["v2_path"] == "/p2pkit-engine"
    assert svc["pid_cgroup"]["memory_caps"] == []
    checks = {c["id"]: c for c in art["checks"]}
    assert checks["service.memory_cap"]["status"] == "pass"
    assert checks["service.not_inherited"]["status"] == "warn"  # p2pkit's own cap was not the engine's
    # what the operator reads tells the host's own story, once: no systemd unit, slice or system service
    # (issue 41): the stage's title, preflight's fix for p2pkit's cap, and the cgroup the engine got
    assert "systemd service" not in said and "system service" not in said, said
    assert "own slice" not in said and "p2pkit.slice" not in said, said
    assert "[service] running: engine service healthy, no memory cap" in said
    pre = {c["id"]: c for c in json.loads((root / "var/lib/p2pkit/preflight.json").read_text())["checks"]}
    assert "systemd is not PID 1 here, so p2pkit's launcher starts the engine in a memory cgroup of its own" \
        in pre["preflight.cgroup"]["hint"]
    assert checks["service.memory_cap"]["measured"] == "none up from /p2pkit-engine"
    assert "a memory cgroup of its own (/p2pkit-engine), not in the capped one p2pkit runs in" in \
        checks["service.not_inherited"]["hint"]

    r = cli("--root", str(root), "status")
    assert r.code == 0 and "no systemd: nothing restarts the engine after a reboot" in r.out
    r = cli("--root", str(root), "serve", "status")
    assert r.code == 0 and f"running, pid {rec['pid']}" in r.out and "answers" in r.out, r.out
    r = cli("--root", str(root), "serve", "restart")
    assert r.code == 0 and "/health 200" in r.out, r.out + r.err
    new = launcher.read_record(root / launcher.RECORD.lstrip("/"))
    assert new["pid"] != rec["pid"] and launcher.is_running(new) and not launcher.is_running(rec)
    r = cli("--root", str(root), "serve", "stop")
    assert r.code == 0 and f"pid {new['pid']}) stopped" in r.out, r.out
    assert not launcher.is_running(launcher.read_record(root / launcher.RECORD.lstrip("/")))
    r = cli("--root", str(root), "serve", "status")
    assert r.code == Exit.CHECK_FAILED and "not running: the launcher's record names no running process" in r.out


def test_host_paths_reach_the_engine_process_through_the_host_object(tmp_path):
    """What the engine process (a process of this machine) gets under a host root other than /: a
    path that exists in that root points into it, and so does a file still to be written in a
    directory that exists there (the engine's request log); anything else stays; the host's own additions to
    the engine's environment come from the host; the unit's user is never looked up on this machine
    for another tree."""
    hl = launcher
    (tmp_path / "opt/e").mkdir(parents=True)
    (tmp_path / "opt/e/serve").write_text("")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\np2pkit-engine:x:0:0::/:/bin/false\n")
    tree, here = Host.at(tmp_path), Host.at("/")
    assert hl.on_this_machine(tree, "/opt/e/serve") == str(tmp_path / "opt/e/serve")
    assert hl.on_this_machine(tree, "/opt/e/new.jsonl") == str(tmp_path / "opt/e/new.jsonl")
    assert hl.on_this_machine(tree, "/opt/none/x") == "/opt/none/x" and hl.on_this_machine(tree, "x") == "x"
    assert hl.on_this_machine(here, "/usr") == "/usr"
    assert hl.process_env(tree, {"M": "/opt/e/serve", "N": "2"}) == {"M": str(tmp_path / "opt/e/serve"), "N": "2"}
    assert hl.run_as(tree, "p2pkit-engine") is None  # another tree's user: not this machine's
