"""Probes for the field pitfalls (P28-P39): the driver's live parameters, ACS control of the bridges
above the GPUs, the kernel log, DRM connectors, every place an nvidia module can come from, RoCE GIDs
and MTUs, the NCCL an engine process has mapped, and the architectures its kernels were built for.

A fact that cannot be read says why and what to run by hand ({"error": ..., "by_hand": ...}): the
checks turn it into "could not check", never into a pass."""

from __future__ import annotations

import os
import re

from p2pkit.core.errors import P2pkitError, ProbeError
from p2pkit.host import Host, dkms
from p2pkit.host import pci as hpci
from p2pkit.parse import field as pf
from p2pkit.parse import pci as pp
from p2pkit.parse import system as ps

PARAMS = "/proc/driver/nvidia/params"
DRM = "/sys/class/drm"
IB = "/sys/class/infiniband"


def cannot(why: str, by_hand: str) -> dict:
    return {"error": why, "by_hand": by_hand}


def last_said(r) -> str:
    """What a command that failed said last: its last line, whole (a message cut at the front reads as
    something else)."""
    lines = [ln for ln in (r.stderr or r.stdout).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "no output"


def driver_params(host: Host) -> dict:
    """The loaded driver's live parameters. The sysfs copy of NVreg_RegistryDwords reads empty even when
    the setting is live (club-3090 PR #885): /proc/driver/nvidia/params is the one to read."""
    if not host.exists("/proc/driver/nvidia/version"):
        return {"loaded": False}
    if not host.exists(PARAMS):
        return cannot(f"{PARAMS} does not exist (an older driver, or the module is not fully loaded)",
                      "grep -i registrydwords /proc/driver/nvidia/params")
    try:
        params = pf.driver_params(host.read(PARAMS, "the driver parameters"))
    except ProbeError as e:
        return cannot(e.why, "sudo grep -i registrydwords /proc/driver/nvidia/params")
    return {"loaded": True, "params": params,
            "registry_dwords": pf.registry_dwords(params.get("RegistryDwords", ""))}


def bridges(host: Host) -> dict[str, list[str]]:
    """Each GPU's upstream bridges (root port first), from sysfs."""
    out = {}
    for bdf in hpci.gpu_bdfs(host):
        chain = pp.upstream_chain(host.realpath(f"{hpci.DEVICES}/{bdf}"))
        out[bdf] = chain[:-1]
    return out


def acs(host: Host) -> dict:
    """ACS Control of every bridge between the GPUs, from config space (root reads the extended part)."""
    ports = []
    for gpu, chain in bridges(host).items():
        for b in chain:
            if any(p["bdf"] == b for p in ports):
                continue
            entry: dict = {"bdf": b, "gpu": gpu}
            try:
                ctl = pf.acs_ctl_from_config(host.read_bytes(f"{hpci.DEVICES}/{b}/config"))
                entry.update(ctl=ctl, flags=None if ctl is None else pf.acs_flags(ctl))
            except (ProbeError, ValueError) as e:
                entry.update(cannot(str(getattr(e, "why", e)), f"sudo lspci -vvv -s {b} | grep ACSCtl"))
            ports.append(entry)
    return {"ports": ports}


def kernel_log(host: Host) -> dict:
    """The kernel ring buffer's lines that name a field pitfall. dmesg_restrict=1 refuses non-root."""
    try:
        r = host.runner.run(["dmesg"], check=False, timeout=30)
    except P2pkitError as e:
        return cannot(e.message, "sudo dmesg | grep -E 'BAR|NVRM|IO_PAGE_FAULT'")
    if r.returncode != 0:
        said = last_said(r)
        restricted = "not permitted" in said.lower() or "permission denied" in said.lower()
        return cannot(f"dmesg exited {r.returncode}: {said}" + (" (kernel.dmesg_restrict=1 lets only root read the "
                                                                 "kernel log)" if restricted else ""),
                      "sudo dmesg | grep -E 'BAR|NVRM|IO_PAGE_FAULT'")
    return pf.kernel_log(r.stdout)


def drm_connectors(host: Host) -> dict:
    """Connected display outputs and the PCI device that drives each (/sys/class/drm/cardN-*/status)."""
    out = []
    for name in host.listdir(DRM):
        m = re.fullmatch(r"(card\d+)-(.+)", name)
        if not m or not host.exists(f"{DRM}/{name}/status"):
            continue
        status = host.read(f"{DRM}/{name}/status").strip()
        dev = host.realpath(f"{DRM}/{m.group(1)}/device")
        out.append({"connector": m.group(2), "card": m.group(1), "status": status,
                    "bdf": os.path.basename(dev)})
    return {"connectors": out}


def module_sources(host: Host) -> dict:
    """Every place an nvidia module can come from for the running kernel: what modprobe picks, the DKMS
    copies under updates/, the copy in the initramfs, and which modules hold nvidia (unload order)."""
    kernel = host.read("/proc/sys/kernel/osrelease", "the kernel release").strip()
    base = f"/lib/modules/{kernel}"
    out: dict = {"kernel": kernel, "updates": [], "holders": host.listdir("/sys/module/nvidia/holders")}
    for d, _dirs, files in os.walk(host.path(f"{base}/updates")):
        out["updates"] += [host.host_path(os.path.join(d, f)) for f in files if pf.NVIDIA_ANY_KO.search(f)]
    # a distro's module DKMS would build again for the next kernel (P34's cousin)
    out["dkms"] = [{"dkms": m["dkms"], "package": m["package"], "kernels": m["kernels"], "state": m["state"]}
                   for m in dkms.nvidia_modules(host)]
    installed = host.path(f"{base}/kernel/drivers/video/nvidia.ko")
    out["installed_mtime"] = installed.stat().st_mtime if installed.exists() else None
    initrd = f"/boot/initrd.img-{kernel}"
    if not host.exists(initrd):
        out["initramfs"] = cannot(f"{initrd} does not exist", f"ls -l /boot; lsinitramfs {initrd} | grep nvidia")
        return out
    try:
        r = host.runner.run(["lsinitramfs", str(host.path(initrd))], check=False, timeout=120)
    except P2pkitError as e:
        out["initramfs"] = cannot(e.message, f"sudo lsinitramfs {initrd} | grep nvidia")
        return out
    if r.returncode != 0:
        out["initramfs"] = cannot(f"lsinitramfs exited {r.returncode}: {last_said(r)}",
                                  f"sudo lsinitramfs {initrd} | grep nvidia")
        return out
    out["initramfs"] = {"path": initrd, "nvidia": pf.initramfs_nvidia(r.stdout),
                        "other": pf.initramfs_other_nvidia(r.stdout),
                        "mtime": host.path(initrd).stat().st_mtime}
    return out


def roce_gids(host: Host) -> dict:
    """Per port: the RoCE v2 IPv4 GIDs with their index (they differ per node and drift, P38), and the
    MTU of each netdev beside it."""
    ports = []
    for dev in host.listdir(IB):
        for port in host.listdir(f"{IB}/{dev}/ports"):
            base = f"{IB}/{dev}/ports/{port}"
            gids = []
            for idx in host.listdir(f"{base}/gids"):
                try:
                    gid = host.read(f"{base}/gids/{idx}").strip()
                    kind = host.read(f"{base}/gid_attrs/types/{idx}").strip()
                except ProbeError:  # unused entries cannot be read (EINVAL)
                    continue
                ndev = host.read(f"{base}/gid_attrs/ndevs/{idx}").strip() if host.exists(
                    f"{base}/gid_attrs/ndevs/{idx}") else ""
                if gid.replace(":", "").strip("0"):
                    gids.append({"index": int(idx), "gid": gid, "type": kind, "netdev": ndev})
            state = host.read(f"{base}/state").strip() if host.exists(f"{base}/state") else "unknown"
            netdevs = host.listdir(f"{IB}/{dev}/device/net")
            mtus = {n: int(host.read(f"/sys/class/net/{n}/mtu").strip()) for n in netdevs
                    if host.exists(f"/sys/class/net/{n}/mtu")}
            ports.append({"device": dev, "port": port, "state": state.split(":", 1)[-1].strip(),
                          "netdevs": netdevs, "mtu": mtus, "gids": sorted(gids, key=lambda g: g["index"])})
    return {"ports": ports}


def library_nccl_version(host: Host, path: str) -> tuple[int, int, int] | None:
    """An NCCL library's version: from its resolved file name, else from the version string inside it
    (the pip wheel ships one file named libnccl.so.2, vllm PR #3661)."""
    real = host.realpath(path)
    v = pf.nccl_version(real)
    if v:
        return v
    pattern, tail = re.compile(rb"(\d+\.\d+\.\d+)\+cuda\d+\.\d+"), b""
    try:
        with open(host.path(real), "rb") as fh:  # 200 MB and more: read in pieces, overlapping at the seams
            while chunk := fh.read(8 << 20):
                m = pattern.search(tail + chunk)
                if m:
                    return pf.nccl_version(m.group(0).decode())
                tail = chunk[-64:]
    except OSError:
        return None
    return None


def unit_pids(host: Host, pid: int) -> list[int]:
    """Every process of the engine, its main PID first: the processes of its cgroup (cgroup.procs: the
    unit's, or the launcher's own cgroup), workers included (vLLM runs NCCL in worker processes, not
    in the main one); where that cannot be read, the processes of the main PID's session (the
    launcher starts the engine in a session of its own)."""
    try:
        cg = ps.proc_cgroup(host.read(f"/proc/{pid}/cgroup", f"the cgroup of pid {pid}"))
        if cg.v2_path not in (None, "/"):
            procs = host.read(f"/sys/fs/cgroup{cg.v2_path}/cgroup.procs", "the engine's processes")
            pids = [int(x) for x in procs.split() if x.isdigit()]
            if pid in pids:
                return [pid, *sorted(x for x in pids if x != pid)]
    except ProbeError:
        pass
    try:
        sid = ps.proc_stat_session(host.path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return [pid]
    same = []
    for d in host.path("/proc").iterdir():
        try:
            if d.name.isdigit() and int(d.name) != pid and ps.proc_stat_session((d / "stat").read_text()) == sid:
                same.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return [pid, *sorted(same)]


def process_nccl(host: Host, pid: int) -> dict:
    """The libnccl files the engine has mapped, each with its version: those of every process of the
    engine (unit_pids), each file once, with the processes that map it."""
    libs: dict[str, dict] = {}
    pids = unit_pids(host, pid)
    for i, each in enumerate(pids):
        try:
            maps = host.read(f"/proc/{each}/maps", "the engine's mapped libraries")
        except ProbeError as e:
            if i == 0:
                return cannot(e.why, f"sudo grep libnccl /proc/{pid}/maps")
            continue  # a worker that exited meanwhile
        for p in pf.maps_nccl(maps):
            if p not in libs:
                v = library_nccl_version(host, p)
                libs[p] = {"path": p, "version": ".".join(map(str, v)) if v else None, "pids": []}
            libs[p]["pids"].append(each)
    return {"pid": pid, "pids": pids, "libraries": list(libs.values())}


def cuobjdump_archs(host: Host, lib: str) -> dict:
    """The SM architectures of the SASS in `lib` (cuobjdump --list-elf)."""
    exe = host.runner.which("cuobjdump") or next(
        (str(host.path(p)) for p in ("/usr/local/cuda/bin/cuobjdump",) if host.exists(p)), None)
    if exe is None:
        return cannot("cuobjdump is not installed (it comes with the CUDA toolkit)",
                      f"/usr/local/cuda/bin/cuobjdump --list-elf {lib}")
    r = host.runner.run([exe, "--list-elf", str(host.path(lib))], check=False, timeout=300)
    if r.returncode != 0:
        return cannot(f"cuobjdump exited {r.returncode}: {last_said(r)}",
                      f"cuobjdump --list-elf {lib}")
    return {"library": lib, "archs": pf.cuobjdump_archs(r.stdout)}
