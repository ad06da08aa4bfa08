"""Where a directory really lives (P26): the mount it sits on, the block device behind it, and
whether that is a local NVMe disk. The PLE n-gram table vLLM mmaps at random reads 30x more from
anything slower; from a network filesystem it is not local at all."""

from __future__ import annotations

import os
import posixpath

from p2pkit.host import Host
from p2pkit.parse.system import mount_of, mountinfo

NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "9p", "ceph", "glusterfs", "lustre", "fuse.sshfs", "virtiofs"}


def _disk(host: Host, dev: str) -> dict:
    """The disk behind a major:minor: a partition's parent, a device-mapper volume's first slave."""
    if dev.startswith("0:"):  # an anonymous device: tmpfs, proc, overlay... no disk behind it
        return {"disk": None, "rotational": None}
    link = f"/sys/dev/block/{dev}"
    if not host.exists(link):
        return {"error": f"{link} does not exist"}
    real = host.realpath(link)
    name = posixpath.basename(real)
    if host.exists(f"{real}/partition"):
        name = posixpath.basename(posixpath.dirname(real))
    slaves = host.listdir(f"/sys/block/{name}/slaves")
    if name.startswith("dm-") and slaves:  # LVM or dm-crypt on top of a disk
        inner = slaves[0]
        parent = posixpath.basename(posixpath.dirname(host.realpath(f"/sys/class/block/{inner}")))
        name = parent if host.exists(f"/sys/class/block/{inner}/partition") else inner
    rot = f"/sys/block/{name}/queue/rotational"
    return {"disk": name, "rotational": host.read(rot).strip() == "1" if host.exists(rot) else None}


def locate(host: Host, path: str) -> dict:
    path = os.path.normpath(path)
    real = host.realpath(path)  # a symlink to the NVMe copy counts as the copy
    out: dict = {"path": path, "exists": host.exists(real)}
    if real != path:
        out["resolved"] = real
    m = mount_of(mountinfo(host.read("/proc/self/mountinfo", "the mount table")), real)
    if m is None:
        return {**out, "error": f"no mount above {path} in /proc/self/mountinfo"}
    out.update(mount_point=m["mount_point"], fstype=m["fstype"], source=m["source"], device=m["device"],
               network=m["fstype"] in NETWORK_FS)
    if not out["network"]:
        out.update(_disk(host, m["device"]))
    out["nvme"] = not out["network"] and str(out.get("disk", "")).startswith("nvme")
    return out


def nvme_paths(host: Host, profile) -> dict:
    return {p: locate(host, p) for p in profile.model.nvme_paths}
