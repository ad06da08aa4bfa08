"""One judgement of a live engine everywhere (issue 40 item 6, issue 38 item 5): `serve status`, `status` and
`doctor` all say "frozen" for a stopped process and "not answering" for one that accepts and never answers,
`serve status`'s exit code following it (it said "answers", exit 0, for a SIGSTOPped engine: a TCP connect);
and every fact that needs the engine (its liveness, its NCCL, its memory fit) finds it through the launcher's
record where systemd is not PID 1 (it looked only for systemd's MainPID)."""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, make_sim, p2pkit_proc

from p2pkit.core import children, config
from p2pkit.host import Host, launcher
from p2pkit.sim import lifecycle
from p2pkit.sim.render import load_state, render


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A simulated host without systemd as PID 1, brought up whole: p2pkit's launcher started its engine."""
    root = make_sim(tmp_path_factory.mktemp("nosd") / "host", "no-systemd")
    r = p2pkit_proc("--root", str(root), "up", "--reboot")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert launcher.record_path(Host.at(root)).is_file()
    yield root
    lifecycle.stop_services(root)


def said(cli, root: Path, *args: str):
    r = cli("--root", str(root), *args)
    return r.code, r.out + r.err


def test_a_stopped_engine_is_frozen_in_serve_status_status_and_doctor_through_the_launcher(cli, served):
    pid = json.loads(launcher.record_path(Host.at(served)).read_text())["pid"]
    assert pid and cli("--root", str(served), "serve", "status").code == 0
    os.kill(pid, signal.SIGSTOP)
    try:
        for args in (["serve", "status"], ["status"], ["doctor"]):
            code, text = said(cli, served, *args)
            assert code == 1 and f"frozen: pid {pid} is stopped" in text and "answers" not in text.split(
                "SIMULATED")[-1], (args, text[-1500:])
    finally:
        os.kill(pid, signal.SIGCONT)
    code, text = said(cli, served, "serve", "status")
    assert code == 0 and "answers (pid" in text, text


def silent_listener(port: int) -> subprocess.Popen:
    """A process that listens on the port and never answers: the kernel completes every connection (the
    backlog), nothing reads a request."""
    code = ("import socket, sys, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('127.0.0.1', {port}))\ns.listen(16)\nprint('listening', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    return proc


def test_an_engine_that_accepts_and_never_answers_is_not_answering_everywhere(cli, served):
    host = Host.at(served)
    port = config.load(host.sim["profile"]).serve.port
    rec_path = launcher.record_path(host)
    rec = json.loads(rec_path.read_text())
    assert cli("--root", str(served), "serve", "stop").code == 0
    proc = silent_listener(port)
    try:
        rec.update(pid=proc.pid, start=children.start_time(proc.pid))
        rec_path.write_text(json.dumps(rec))
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # it accepts
        for args in (["serve", "status"], ["status"], ["doctor"]):
            code, text = said(cli, served, *args)
            assert code == 1 and f"not answering: pid {proc.pid}" in text, (args, text[-1500:])
    finally:
        proc.kill()
        proc.wait()
    code, text = said(cli, served, "serve", "status")
    assert code == 1 and "not running: the launcher's record names no running process" in text, text


def test_the_engines_nccl_is_found_through_the_launchers_record(cli, sim):
    # a live process stands in for the launcher's engine, in the cgroup the launcher makes, its record
    # written as the launcher writes it; the engine maps a scenario's NCCL (P37)
    root = sim("no-systemd")
    engine = subprocess.Popen(["sleep", "120"])
    try:
        lib = "/opt/nccl/lib/libnccl.so.2"
        st = load_state(root)
        st["engine_nccl"] = [lib]
        st["files"] = {lib.lstrip("/"): "\x7fELF SIMULATED libnccl NCCL version 2.25.1+cuda12.8\n"}
        procs = root / "sys/fs/cgroup/p2pkit-engine/cgroup.procs"
        procs.parent.mkdir(parents=True, exist_ok=True)
        procs.write_text(f"{engine.pid}\n")
        rec = launcher.record_path(Host.at(root))
        rec.parent.mkdir(parents=True, exist_ok=True)
        rec.write_text(json.dumps({"pid": engine.pid, "start": children.start_time(engine.pid), "argv": ["x"],
                                   "log": str(root / "engine.log"), "cgroup": {"dir": "/sys/fs/cgroup/p2pkit-engine"}}))
        render(root, st)
        r = cli("--root", str(root), "--set", "engine.nccl_min=2.26.2", "--json", "doctor")
        found = {c["id"]: c for g in r.json()["groups"] for c in g["checks"]}
        c = found["field.nccl_floor.engine"]
        assert c["status"] == "fail" and "2.25.1" in c["measured"] and f"pid {engine.pid}" in c["title"], c
        assert "systemctl" not in json.dumps(found)
    finally:
        engine.kill()
        engine.wait()


def test_every_fact_finds_the_engine_through_one_function():
    # the facts' probes (facts/probes.py) ask systemd for the engine's MainPID nowhere themselves:
    # host/launcher.engine_process does
    tree = ast.parse((REPO / "p2pkit/facts/probes.py").read_text())
    calls = [n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert "service_main_pid" not in calls and calls.count("engine_process") >= 3
