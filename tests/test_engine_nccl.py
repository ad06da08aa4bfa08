"""NCCL from the engine itself: the service stage reads the init lines of the start it judges (however
long the log has grown), and P37 reads the maps of every process of the engine, workers included."""

import os
import subprocess
import sys
from types import SimpleNamespace

from p2pkit.host import Host, system
from p2pkit.host import field_facts as hf
from p2pkit.parse import nccl
from p2pkit.stages.service import act as service
from p2pkit.stages.service import launcher as service_launcher
from tests.conftest import FIXTURES

BY_RELEASE = (FIXTURES / "nccl/channels_by_release.txt").read_text().splitlines()


def test_start_lines_from_the_recorded_offset_however_long_the_log(tmp_path, monkeypatch):
    log = tmp_path / "engine.log"
    earlier = [f"h:1:1 [0] NCCL INFO Channel {i % 32:02d} : 0[0] -> 1[1] via SHM/direct" for i in range(1000)]
    log.write_text("\n".join(earlier) + "\n")
    offset = log.stat().st_size
    later = [BY_RELEASE[10]] + [f"request {i}" for i in range(2000)]  # this start: P2P, then a long log
    with open(log, "a") as fh:
        fh.write("\n".join(later) + "\n")
    monkeypatch.setattr(service_launcher, "launched", lambda host: True)
    monkeypatch.setattr(service_launcher, "record", lambda host: {"log": str(log)})
    lines = service.start_lines(Host.at(tmp_path), {"file": str(log), "offset": offset})
    assert lines == later and nccl.init_summary(lines)["local"] == ["P2P/CUMEM"]
    # no recorded position: the launcher's log from its last start line, not its last 400 lines
    assert service.start_lines(Host.at(tmp_path), None) == earlier + later  # one start, no start line
    with open(log, "a") as fh:
        fh.write("-- p2pkit launcher 2026-12-03 21:54:16: llama-server ...\nnext start\n")
    assert service.start_lines(Host.at(tmp_path), None) == ["-- p2pkit launcher 2026-12-03 21:54:16: llama-server ...",
                                                              "next start"]


def test_start_lines_from_the_journal_cursor_or_the_current_invocation(monkeypatch):
    calls = []

    def run(args, check=False, **kw):
        calls.append(args)
        return SimpleNamespace(stdout="abc123\n" if args[0] == "systemctl" else "x\ny\n", returncode=0)

    monkeypatch.setattr(service_launcher, "launched", lambda host: False)
    host = SimpleNamespace(runner=SimpleNamespace(run=run))
    assert service.start_lines(host, {"cursor": "s=1;i=2"}) == ["x", "y"]
    assert calls[-1] == ["journalctl", "-u", system.ENGINE_UNIT, "--after-cursor=s=1;i=2", "--no-pager"]
    service.start_lines(host, None)
    assert calls[-2][:2] == ["systemctl", "show"] and "InvocationID" in calls[-2]
    assert calls[-1] == ["journalctl", "_SYSTEMD_INVOCATION_ID=abc123", "--no-pager"]


def test_p37_reads_every_process_of_the_unit(tmp_path):
    # the unit's main process maps no NCCL; its worker (vLLM's) does
    root = tmp_path
    cg = "/system.slice/p2pkit-engine.service"
    for pid, maps in ((100, "55d0a0000000-55d0a0200000 r-xp 00000000 103:02 11 /usr/bin/python3.12\n"),
                      (101, "ffff8a000000-ffff8b000000 r-xp 00000000 103:02 3414 /opt/nccl/lib/libnccl.so.2.28.9\n")):
        (root / f"proc/{pid}").mkdir(parents=True)
        (root / f"proc/{pid}/cgroup").write_text(f"0::{cg}\n")
        (root / f"proc/{pid}/maps").write_text(maps)
    (root / f"sys/fs/cgroup{cg}").mkdir(parents=True)
    (root / f"sys/fs/cgroup{cg}/cgroup.procs").write_text("101\n100\n")
    e = hf.process_nccl(Host.at(root), 100)
    assert e["pids"] == [100, 101]
    assert e["libraries"] == [{"path": "/opt/nccl/lib/libnccl.so.2.28.9", "version": "2.28.9", "pids": [101]}]


def test_unit_pids_on_this_machine_include_a_child():
    # the real /proc: a child of this process shares its cgroup and its session
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pids = hf.unit_pids(Host.at("/"), os.getpid())
        assert pids[0] == os.getpid() and child.pid in pids
    finally:
        child.kill()
        child.wait()
