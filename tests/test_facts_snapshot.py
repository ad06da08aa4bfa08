"""One judgement of every stage reads each fact once (issue 48's benchmark): `status`, and the pass `up` makes
before it acts, re-check stage after stage with nothing acting between them, so a fact two stages read (the
kernel log: rebar's and topology's re-checks; one more `dmesg` each time) is read once and given to both. A
read in which p2pkit was refused a command (not root) is not kept: each stage sees that refusal as its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from p2pkit.facts import collect as facts
from p2pkit.sim import lifecycle
from tests.conftest import make_sim
from tests.test_rootsafe_content import MAIN, p2pkit


class Reads:
    """facts.collect stood in: counts each fact's reads; `refuse` names facts whose read the runner refuses."""

    def __init__(self, host, refuse=()):
        self.host, self.refuse, self.count = host, set(refuse), {}

    def __call__(self, host, names, profile=None):
        out = {}
        for n in names:
            self.count[n] = self.count.get(n, 0) + 1
            if n in self.refuse:
                host.runner.denied.append(f"cmd-of-{n}")
            out[n] = {"value": n, "read": self.count[n]}
        return out


def host():
    return SimpleNamespace(runner=SimpleNamespace(denied=[]))


def test_a_fact_two_stages_read_is_read_once(monkeypatch):
    h = host()
    reads = Reads(h)
    monkeypatch.setattr(facts, "collect", reads)
    snap = facts.Snapshot(h)
    rebar = snap.collect(("kernel_log", "pci_gpus"))
    topology = snap.collect(("pci_gpus", "kernel_log", "smi_topo_m"))
    assert reads.count == {"kernel_log": 1, "pci_gpus": 1, "smi_topo_m": 1}
    assert topology["kernel_log"] is rebar["kernel_log"] and list(topology) == ["pci_gpus", "kernel_log",
                                                                                "smi_topo_m"]


def test_a_read_the_runner_refused_is_read_again_by_the_next_stage(monkeypatch):
    """Each stage compares the runner's refusals before and after its own read (pipeline._rechecked): a kept
    read would hide from the second stage that its facts came from a command p2pkit may not run."""
    h = host()
    reads = Reads(h, refuse={"kernel_log"})
    monkeypatch.setattr(facts, "collect", reads)
    snap = facts.Snapshot(h)
    snap.collect(("kernel_log", "pci_gpus"))
    before = len(h.runner.denied)
    snap.collect(("kernel_log",))
    assert reads.count["kernel_log"] == 2 and len(h.runner.denied) > before


@pytest.mark.slow
def test_status_on_a_done_host_runs_dmesg_once(tmp_path):
    """The real command on a simulated host brought up fully, its process tree recorded by strace."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace (apt-get install strace)")
    root = make_sim(tmp_path / "host")
    try:
        r = p2pkit("--root", str(root), "up", "--reboot")
        assert r.returncode == 0, r.stderr[-3000:]
        trace = tmp_path / "status.trace"
        r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace), sys.executable, "-c",
                            MAIN, "--root", str(root), "status"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        ran = [ln for ln in trace.read_text().splitlines() if "execve(" in ln and "ENOENT" not in ln]
        dmesg = [ln for ln in ran if f'execve("{root}/usr/bin/dmesg"' in ln]
        assert len(dmesg) == 1, "\n".join(ran)
        assert any("nvidia-smi" in ln for ln in ran)  # the re-checks ran at all
    finally:
        lifecycle.stop_services(root)
