"""The truth about a running engine (issue 31, item 7): status and doctor ask the engine once,
within a second or two, and a frozen one (its process stopped: state T in /proc/PID/stat) is a
finding, never "done"; dpkg-query has a limit sized to its work."""

import os
import signal

import pytest
from conftest import make_sim, p2pkit_proc

from p2pkit import pipeline, runner
from p2pkit.checks import service as checks
from p2pkit.host import Host
from p2pkit.parse import system as ps
from p2pkit.sim import lifecycle
from p2pkit.stages import service as svc


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One simulated host brought up whole (its engine serving), shared by the tests that judge a
    running engine; each leaves it as it found it."""
    root = make_sim(tmp_path_factory.mktemp("served") / "host")
    r = p2pkit_proc("--root", str(root), "up", "--reboot")
    assert r.returncode == 0, r.stdout + r.stderr
    yield root
    lifecycle.stop_services(root)


def test_proc_stat_state_reads_past_a_command_name_with_spaces_and_parentheses():
    # /proc/self/stat of this machine's own process, read now (the real kernel's format)
    with open("/proc/self/stat") as fh:
        assert ps.proc_stat_state(fh.read()) == "R"
    assert ps.proc_stat_state("1234 (a) b (c)) T 1 2 3") == "T"


def test_alive_judges_stopped_silent_and_healthy():
    assert checks.alive({"installed": False}) == []
    stopped = checks.alive({"installed": True, "pid": 7, "state": "T", "role": "single",
                            "health": {"code": None, "text": "timed out"}})
    assert stopped[0].status == "fail" and "state T" in stopped[0].measured
    silent = checks.alive({"installed": True, "pid": 7, "state": "S", "role": "single",
                           "health": {"code": None, "text": "timed out"}})
    assert silent[0].status == "fail" and "did not answer" in silent[0].measured
    assert checks.alive({"installed": True, "pid": 7, "state": "S", "role": "single",
                         "health": {"code": 200, "text": ""}})[0].status == "pass"


def test_dpkg_query_has_a_limit_sized_to_its_work():
    assert runner.timeout_for("dpkg-query") <= 10


def test_a_stopped_engine_is_a_finding_in_status_and_doctor(cli, served):
    root = served
    assert cli("--root", str(root), "status").code == 0
    pid = svc.main_pid(Host.at(root))
    os.kill(pid, signal.SIGSTOP)
    try:
        r = cli("--root", str(root), "status")
        assert r.code != 0 and "service.engine_alive" in r.out + r.err and "state T" in r.out + r.err, r.out + r.err
        r = cli("--root", str(root), "doctor")
        assert r.code != 0 and "service.engine_alive" in r.out + r.err and "frozen" in r.out + r.err, r.out + r.err
    finally:
        os.kill(pid, signal.SIGCONT)
    assert cli("--root", str(root), "status").code == 0


@pytest.mark.parametrize("hung", ["nvidia-smi", "systemctl"])
def test_status_waits_a_few_seconds_on_a_hung_command_and_names_it(cli, served, hung):
    # the stand-in sleeps until killed, as nvidia-smi does on a wedged driver; its own limit is 30-120 s
    hang = served / ".p2pkit-sim/hang"
    hang.write_text(hung + "\n")
    try:
        r = cli("--root", str(served), "status")
    finally:
        hang.unlink()
    assert r.code != 0 and f"{hung} did not answer within" in r.out, r.out + r.err
    said = float(r.out.split(f"{hung} did not answer within ")[1].split()[0])  # the limit it was given
    assert said <= pipeline.STATUS_COMMAND_S < runner.timeout_for(hung), r.out
    assert cli("--root", str(served), "status").code == 0
