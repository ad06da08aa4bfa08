"""RoCE HCAs resolved from sysfs each time (P24), over sysfs trees laid out by the test."""

from pathlib import Path

from p2pkit.core import config
from p2pkit.host import Host
from p2pkit.host.roce import ports
from p2pkit.parse.roce import resolve
from p2pkit.stages.topology import checks as topology

SPARK = config.load("dual-spark-vllm")


def port(root: Path, dev: str, n: int, state: str, layer: str, netdev: str) -> None:
    base = root / "sys/class/infiniband" / dev
    (base / "ports" / str(n)).mkdir(parents=True, exist_ok=True)
    (base / "ports" / str(n) / "state").write_text(state + "\n")
    (base / "ports" / str(n) / "link_layer").write_text(layer + "\n")
    (base / "device/net" / netdev).mkdir(parents=True, exist_ok=True)


def test_only_active_ethernet_ports_on_the_fabric(tmp_path):
    port(tmp_path, "rocep1s0f0", 1, "4: ACTIVE", "Ethernet", "enp1s0f0np0")
    port(tmp_path, "rocep1s0f1", 1, "1: DOWN", "Ethernet", "enp1s0f1np1")
    port(tmp_path, "rocep9s0", 1, "4: ACTIVE", "Ethernet", "eno1")  # the management port: not the fabric
    port(tmp_path, "ibp2s0", 1, "4: ACTIVE", "InfiniBand", "ib0")
    found = ports(Host.at(tmp_path))
    assert resolve(found, SPARK.network.fabric_netdevs) == ["rocep1s0f0:1"]


def test_a_renamed_device_is_followed(tmp_path):
    port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "Ethernet", "enp1s0f0np0")  # the same port, named differently
    assert resolve(ports(Host.at(tmp_path)), SPARK.network.fabric_netdevs) == ["mlx5_0:1"]


def test_topology_judges_roce_only_where_the_profile_needs_it(tmp_path):
    port(tmp_path, "rocep1s0f1", 1, "1: DOWN", "Ethernet", "enp1s0f1np1")
    f = {"pci_gpus": [], "roce": ports(Host.at(tmp_path))}
    c = {x.id: x for x in topology.check(f, SPARK)}["topology.roce"]
    assert c.status == "fail" and c.pitfall == "P24" and "rocep1s0f1:1 DOWN" in c.measured
    assert "topology.roce" not in {x.id for x in topology.check(f, config.load(None))}


def test_net_hca_command(cli, tmp_path):
    port(tmp_path, "rocep1s0f0", 1, "4: ACTIVE", "Ethernet", "enp1s0f0np0")
    r = cli("--root", str(tmp_path), "--profile", "dual-spark-vllm", "net", "hca")
    assert r.code == 0 and r.out.strip() == "NCCL_IB_HCA=rocep1s0f0:1" and "error" not in r.err
    r = cli("--root", str(tmp_path), "--profile", "dual-spark-vllm", "net", "hca", "--env-file", "/run/e/nccl.env")
    assert r.code == 0 and "error" not in r.err
    env = (tmp_path / "run/e/nccl.env").read_text()  # under the host root, as every host path
    assert "NCCL_IB_HCA=rocep1s0f0:1\nNCCL_SOCKET_IFNAME=enp1s0f0np0\nGLOO_SOCKET_IFNAME=enp1s0f0np0\n" in env
    (tmp_path / "sys/class/infiniband/rocep1s0f0/ports/1/state").write_text("1: DOWN\n")
    r = cli("--root", str(tmp_path), "--profile", "dual-spark-vllm", "net", "hca")
    assert r.code == 1 and "no ACTIVE Ethernet RDMA port" in r.err and "P24" in r.err
