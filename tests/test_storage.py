"""P26: the n-gram table must sit on local NVMe. The mount table parsed from a real host's
/proc/self/mountinfo, and the directory located on simulated Spark nodes."""

import json
import shutil
from pathlib import Path

from p2pkit.core import config
from p2pkit.facts import collect as facts
from p2pkit.host import Host
from p2pkit.parse.system import mount_of, mountinfo
from p2pkit.stages.model import checks as model_checks

REAL = Path(__file__).parent / "fixtures/h200-device/storage"
TABLE = "/var/lib/vllm/ple-table"


def test_real_mountinfo_from_the_gpu_host():
    mounts = mountinfo((REAL / "mountinfo.txt").read_text())
    assert len(mounts) == 11
    root = mount_of(mounts, "/tmp")
    assert (root["mount_point"], root["fstype"], root["source"], root["device"]) == ("/", "ext4", "/dev/vda", "254:0")
    assert mount_of(mounts, "/dev/shm")["device"] == "0:27"  # mounted twice there: the later mount wins
    assert mount_of(mounts, "/usr/local/nvidia/bin")["fstype"] == "squashfs"
    assert mount_of(mounts, "/sys/fs/cgroupx")["mount_point"] == "/sys"  # a prefix is not a parent
    # what p2pkit concluded on that machine, judged now: a virtio disk is not NVMe
    recorded = json.loads((REAL / "storage_facts.json").read_text())
    p = config.load("dual-spark-vllm", ['model.nvme_paths=["/tmp", "/var/lib/vllm/ple-table"]'])
    c = model_checks.nvme(recorded, p)[0]
    assert c.status == "fail" and "disk vda (rotational)" in c.measured and c.pitfall == "P26"


def test_escaped_mount_points():
    line = "40 22 0:51 / /srv/my\\040models rw,relatime shared:60 - nfs4 nas:/export/a\\040b rw"
    m = mountinfo(line)[0]
    assert m["mount_point"] == "/srv/my models" and m["source"] == "nas:/export/a b"


def _judge(root: Path) -> dict:
    h = Host.at(root)
    p = config.load(h.sim["profile"])
    found = facts.collect(h, ("storage",), p)["storage"]
    return {c.id: c for c in model_checks.nvme(found, p)}


def test_table_on_local_nvme_nfs_or_missing(sim):
    ok = _judge(sim("spark-head"))[f"model.nvme.{TABLE}"]
    assert ok.status == "pass" and ok.measured == "ext4 /dev/nvme0n1p2 at /, disk nvme0n1"
    nfs = _judge(sim("spark-table-on-nfs"))[f"model.nvme.{TABLE}"]
    assert nfs.status == "fail" and nfs.measured.startswith("nfs4 nas:/export/vllm at /var/lib/vllm")
    gone = sim("spark-worker")
    shutil.rmtree(gone / TABLE.lstrip("/"))
    c = _judge(gone)[f"model.nvme.{TABLE}"]
    assert c.status == "fail" and c.measured.startswith("missing")


def test_table_dir_must_be_proven():
    from p2pkit.core.errors import ProfileError

    try:
        config.load("dual-spark-vllm", ["model.nvme_paths=[]"])
    except ProfileError as e:
        assert any(k == "model.nvme_paths" and "VLLM_PLE_MMAP_DIR" in m for k, m in e.problems)
    else:
        raise AssertionError("a mmapped table dir outside model.nvme_paths was accepted")


def test_a_symlink_is_judged_where_it_points(sim):
    """The table directory as a symlink onto an NFS mount is on NFS, whatever its own path says."""
    import os

    root = sim("spark-table-on-nfs", "link")
    table = root / TABLE.lstrip("/")
    shutil.rmtree(table.parent)
    (root / "srv/copy").mkdir(parents=True)
    table.parent.mkdir(parents=True)
    os.symlink("/srv/copy", table)  # absolute, as a user makes it: resolved inside the host root
    c = _judge(root)[f"model.nvme.{TABLE}"]
    assert c.status == "pass" and c.measured.startswith("ext4 /dev/nvme0n1p2 at /")
