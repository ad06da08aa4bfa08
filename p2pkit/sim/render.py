"""Lay out the simulated host's files from its state."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from p2pkit.core.errors import STANDIN_CANNOT_RUN, STANDIN_EXIT
from p2pkit.host import SIM_MARKER
from p2pkit.sim import model, rules
from p2pkit.sim.scenarios import GIB

STANDINS = ["nvidia-smi", "modinfo", "dpkg", "dpkg-query", "apt-mark", "apt-get", "apt-cache", "update-initramfs",
            "depmod", "update-grub", "fuser", "modprobe", "systemctl", "journalctl", "nvcc", "uname", "dmesg",
            "lsinitramfs", "cuobjdump", "kernelstub", "useradd", "usermod", "mokutil"]
AMD, NV = "0x1022", "0x10de"


def write(root: Path, rel: str, text: str | bytes, mode: int | None = None) -> Path:
    p = root / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    if mode is not None:
        p.chmod(mode)
    return p


def config_space(port_type: int, acs_ctl: int | None = None, extended: bool = False) -> bytes:
    """256 bytes with a capability list holding one PCIe capability of the given port type; a bridge
    gets the 4 KiB root reads, with an ACS extended capability at 0x100 (control word `acs_ctl`), or
    none (`extended` alone: a switch's upstream port)."""
    cfg = bytearray(256 if acs_ctl is None and not extended else 4096)
    if acs_ctl is not None:
        cfg[0x100:0x104] = (0x000D | 1 << 16).to_bytes(4, "little")  # ACS, version 1, no next capability
        cfg[0x104:0x106] = (0x005F).to_bytes(2, "little")  # capabilities: SV TB RR CR UF DT
        cfg[0x106:0x108] = acs_ctl.to_bytes(2, "little")
    cfg[0x06] = 0x10
    cfg[0x34] = 0x40
    cfg[0x40] = 0x10
    cfg[0x41] = 0x00
    cfg[0x42] = (port_type << 4) | 0x2
    return bytes(cfg)


def _link(root: Path, bdf: str, target: Path) -> None:
    link = root / "sys/bus/pci/devices" / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def _pci_dev(root: Path, path: Path, bdf: str, vendor: str, device: str, cls: str, port_type: int,
             max_gen: int, max_width: int, cur_gen: int, cur_width: int, resource: str = "",
             acs_ctl: int | None = None, extended: bool = False) -> None:
    path.mkdir(parents=True, exist_ok=True)
    files = {"vendor": vendor, "device": device, "class": cls,
             "max_link_speed": model.speed_text(max_gen), "max_link_width": str(max_width),
             "current_link_speed": model.speed_text(cur_gen), "current_link_width": str(cur_width)}
    for k, v in files.items():
        (path / k).write_text(v + "\n")
    (path / "config").write_bytes(config_space(port_type, acs_ctl, extended))
    # what udev reads of a device (libudev's enumeration of subsystem pci, pyudev's on a real root): the
    # subsystem link and the uevent the kernel composes (drivers/pci/pci-driver.c, pci_uevent)
    (path / "subsystem").symlink_to(os.path.relpath(root / "sys/bus/pci", path))
    ids = f"{int(vendor, 16):04X}:{int(device, 16):04X}"
    klass = int(cls, 16)
    alias = (f"pci:v{int(vendor, 16):08X}d{int(device, 16):08X}sv{int(vendor, 16):08X}sd00000000"
             f"bc{klass >> 16:02X}sc{klass >> 8 & 0xFF:02X}i{klass & 0xFF:02X}")
    (path / "uevent").write_text(f"PCI_CLASS={klass:X}\nPCI_ID={ids}\nPCI_SUBSYS_ID={ids}\nPCI_SLOT_NAME={bdf}\n"
                                 f"MODALIAS={alias}\n")
    (path / "modalias").write_text(alias + "\n")
    (path / "resource").write_text(resource or ("0x0000000000000000 0x0000000000000000 0x0000000000000000\n" * 13))
    _link(root, bdf, path)


def _resource_table(g: dict, i: int) -> str:
    z = "0x0000000000000000 0x0000000000000000 0x0000000000000000"
    bar0 = 0xF0000000 + i * 0x4000000
    bar1 = 0x18_0000_0000 * (i + 1)
    lines = [
        f"0x{bar0:016x} 0x{bar0 + (64 << 20) - 1:016x} 0x0000000000040200",  # BAR0: 32-bit MEM
        f"0x{bar1:016x} 0x{bar1 + g['bar1_bytes'] - 1:016x} 0x000000000014220c",  # BAR1: 64-bit prefetch
        z,
        f"0x{bar1 + (64 * GIB):016x} 0x{bar1 + (64 * GIB) + (32 << 20) - 1:016x} 0x000000000014220c",
        z,
        f"0x000000000000{0xe000 + i * 0x1000:04x} 0x000000000000{0xe07f + i * 0x1000:04x} 0x0000000000040101",
    ]
    return "\n".join(lines + [z] * 7) + "\n"


def _moved_into_cgroups(root: Path) -> dict[str, list[int]]:
    """The simulated kernel keeps what p2pkit wrote into a cgroup.procs (a cgroup it made for the
    engine and the processes moved there) across a new rendering of /sys and /proc: {cgroup path: pids
    still running}."""
    import os

    base = root / "sys/fs/cgroup"
    out = {}
    for procs in base.rglob("cgroup.procs") if base.is_dir() else []:
        pids = [int(x) for x in procs.read_text().split() if x.isdigit() and os.path.exists(f"/proc/{x}")]
        if pids:
            out["/" + str(procs.parent.relative_to(base))] = pids
    return out


def gpu_files(root: Path, state: dict) -> None:
    """What the GPUs (and the ConnectX ports, the EFI variable) put in sysfs: PCI functions with their
    links, BARs and config space, DRM cards, IOMMU groups. Written under `root`: a simulated host's
    directory, or a container host's / (its sysfs overlaid: p2pkit.sim.guest)."""
    root = Path(root)
    sysdev = root / "sys/devices"
    eff = model.iommu_effective(state)
    group_type = {"passthrough": "identity", "translating": "DMA-FQ"}.get(eff)
    for i, g in enumerate(state["gpus"]):
        dom = f"pci0000:{g['root_port'][5:7]}"
        rp = sysdev / dom / g["root_port"]
        _gen, width = model.link_max(g)
        _pci_dev(root, rp, g["root_port"], AMD, "0x14db", "0x060400", 4, g["slot_gen"], g["slot_width"], 1, width,
                 acs_ctl=state.get("acs_ctl", {}).get(g["root_port"], 0))
        parent = rp
        if g["switch"]:  # root port > the switch's upstream port > its downstream port > the GPU
            up, down = rules.below_bridge(g["root_port"], 1), rules.below_bridge(g["root_port"], 2)
            if g["bdf"] in (up, down):
                raise ValueError(f"the scenario puts GPU {g['bdf']} where its switch's ports are ({up}, {down})")
            parent = rp / up
            _pci_dev(root, parent, up, "0x10b5", "0x8747", "0x060400", 5, 3, 16, 3, 16, extended=True)
            parent = parent / down  # a downstream port carries ACS (as the root port does)
            _pci_dev(root, parent, down, "0x10b5", "0x8747", "0x060400", 6, 3, 16, 3, 16,
                     acs_ctl=state.get("acs_ctl", {}).get(down, 0))
        gdir = parent / g["bdf"]
        _pci_dev(root, gdir, g["bdf"], NV, g["device"], "0x030000", 0, g["gpu_max_gen"], g["gpu_max_width"],
                 1, width, _resource_table(g, i))
        if g["bar1_bytes"] >= 32 * GIB:
            (gdir / "resource1_resize").write_text("0000000000007fc0\n")  # 64 MiB .. 32 GiB
        else:
            (gdir / "resource1_resize").write_text("0000000000003fc0\n")
        card = root / f"sys/class/drm/card{i + 1}"  # a display output per GPU: connected when a monitor is
        card.mkdir(parents=True, exist_ok=True)
        (card / "device").symlink_to(os.path.relpath(gdir, card))
        write(root, f"sys/class/drm/card{i + 1}-DP-1/status",
              "connected\n" if g.get("monitor") else "disconnected\n")
        if group_type:
            grp = root / f"sys/kernel/iommu_groups/{12 + i}"
            grp.mkdir(parents=True, exist_ok=True)
            (grp / "type").write_text(group_type + "\n")
            (gdir / "iommu_group").symlink_to(os.path.relpath(grp, gdir))
    for nic in state.get("roce", []):  # ConnectX ports: an RDMA device per port, its netdev beside it
        write(root, f"sys/class/net/{nic['netdev']}/mtu", f"{nic.get('mtu', 9000)}\n")
        pci = root / "sys/devices" / f"pci0000:{nic['bdf'][5:7]}" / nic["bdf"]
        _pci_dev(root, pci, nic["bdf"], "0x15b3", "0x1021", "0x020000", 0, 5, 4, 5, 4)
        (pci / "net" / nic["netdev"]).mkdir(parents=True, exist_ok=True)
        ib = root / "sys/class/infiniband" / nic["device"]
        port = ib / "ports/1"
        port.mkdir(parents=True, exist_ok=True)
        (ib / "device").symlink_to(os.path.relpath(pci, ib))
        active = nic.get("state", "ACTIVE") == "ACTIVE"
        for idx, (gid, kind) in enumerate(roce_gids(nic)):
            write(root, str(port.relative_to(root) / f"gids/{idx}"), gid + "\n")
            write(root, str(port.relative_to(root) / f"gid_attrs/types/{idx}"), kind + "\n")
            write(root, str(port.relative_to(root) / f"gid_attrs/ndevs/{idx}"), nic["netdev"] + "\n")
        for name, text in (("state", "4: ACTIVE" if active else "1: DOWN"),
                           ("phys_state", "5: LinkUp" if active else "3: Disabled"),
                           ("link_layer", "Ethernet"), ("rate", nic.get("rate", "200 Gb/sec (4X HDR)"))):
            (port / name).write_text(text + "\n")
    # an EFI system; the variable says whether Secure Boot is on
    efivar = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    write(root, efivar, bytes([6, 0, 0, 0, 1 if state["secure_boot"] else 0]))


def render(root: Path, state: dict) -> None:
    """Lay the simulated host out from its state: /sys, /proc and /dev anew (the GPUs, storage, the loaded module,
    the kernel, the cgroups and the processes in them), the files a scenario left, /etc, dpkg's database, the
    state itself and the stand-ins."""
    root = Path(root)
    if root.resolve() == Path("/"):  # a simulated host is a directory; a container host's root is real
        raise RuntimeError("SIMULATED host: refusing to lay a simulated host out over / (a container host's "
                           "state is saved by p2pkit.sim.guest)")
    moved = _moved_into_cgroups(root)
    shutil.rmtree(root / "sys", ignore_errors=True)
    shutil.rmtree(root / "proc", ignore_errors=True)
    shutil.rmtree(root / "dev", ignore_errors=True)
    gpu_files(root, state)
    _storage(root, state)
    module_files(root, state)
    _kernel(root, state)
    _own_cgroup(root, state)
    for unit, svc in state.get("services", {}).items():  # what systemd does for a running unit
        if svc.get("started") and svc.get("pid"):
            _unit_process(root, state, unit, svc)
    for rel, pids in moved.items():  # the cgroups p2pkit made (its launcher's), with the processes moved there
        _moved_processes(root, state, rel, pids)
    for rel, text in state.get("files", {}).items():  # files a scenario's earlier life left behind
        write(root, rel, text)
    _etc(root, state)
    _dpkg_database(root, state)
    write(root, ".p2pkit-sim/README", "SIMULATED host laid out by `p2pkit sim init`. Nothing here is real.\n")
    state["driver"]["userspace"] = userspace_on_disk(root)  # what NVML would load: the files decide
    # the libraries a real host answers through (NVML, the GPUs under load), as this host's stand-ins
    state_doc = {**state, "libraries": LIBRARIES, "lends": list(LENDS)}
    write(root, SIM_MARKER, json.dumps(state_doc, indent=2) + "\n")
    for name in STANDINS:
        write_standin(root, name, standin_script(name))


def _kernel(root: Path, state: dict) -> None:
    """What the kernel says of itself: its command line, the CPU, arch, release and hostname, /boot, the boot id,
    and PID 1 (systemd, with its /run/systemd/system, unless the scenario has none)."""
    write(root, "proc/cmdline", state["cmdline"] + "\n")
    if state.get("arch") == "aarch64":  # arm64's /proc/cpuinfo has no vendor_id (GB10: Cortex-X925, 0x41 is Arm)
        write(root, "proc/cpuinfo", "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\n"
              "CPU architecture: 8\nCPU part\t: 0xd85\n")
    else:
        write(root, "proc/cpuinfo", "processor\t: 0\nvendor_id\t: " + state["cpu_vendor"] +
              "\nmodel name\t: AMD Ryzen 9 9950X3D 16-Core Processor\n")
    write(root, "proc/sys/kernel/arch", state.get("arch", "x86_64") + "\n")
    write(root, "proc/sys/kernel/osrelease", state["kernel"] + "\n")
    write(root, "proc/sys/kernel/hostname", "sim-dual5090\n")
    _boot(root, state)
    write(root, "proc/sys/kernel/random/boot_id", state["boot_id"] + "\n")
    # PID 1: systemd (and its /run/systemd/system, sd_booted's test) unless the scenario has none (a
    # container's shell or tini, where p2pkit's launcher starts the engine)
    write(root, "proc/1/comm", "systemd\n" if state.get("systemd", True) else "sh\n")
    if state.get("systemd", True):
        (root / "run/systemd/system").mkdir(parents=True, exist_ok=True)


def _own_cgroup(root: Path, state: dict) -> None:
    """The cgroup p2pkit itself runs in (a user session's capped scope where the scenario caps it) and the
    cgroup tree's root."""
    cap = state.get("cgroup_memory_cap")
    cg = "/user.slice/user-1000.slice/session-3.scope" if cap else "/system.slice/p2pkit.service"
    write(root, "proc/self/cgroup", f"0::{cg}\n")
    write(root, "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
    write(root, f"sys/fs/cgroup{cg}/memory.max", f"{cap}\n" if cap else "max\n")
    if state.get("cgroup_root_memory_cap"):  # a container's cgroup namespace: its root is a capped cgroup
        write(root, "sys/fs/cgroup/memory.max", f"{state['cgroup_root_memory_cap']}\n")


def _unit_process(root: Path, state: dict, unit: str, svc: dict) -> None:
    """A running unit's engine: its cgroup in its slice with the unit's MemoryMax=, its state, smaps and maps
    (a scenario's NCCL libraries there, P37)."""
    cgpath = f"/{svc.get('slice') or 'system.slice'}/{unit}"
    write(root, f"proc/{svc['pid']}/cgroup", f"0::{cgpath}\n")
    # the engine is a real process here: its mappings are the kernel's own (P26's VmFlags)
    (root / f"proc/{svc['pid']}/smaps").symlink_to(f"/proc/{svc['pid']}/smaps")
    (root / f"proc/{svc['pid']}/stat").symlink_to(f"/proc/{svc['pid']}/stat")  # its state: T when stopped
    if state.get("engine_nccl"):  # a scenario's NCCL libraries in the engine's mappings (P37)
        base = 0xFFFF8A000000
        maps = [f"{base + i * 0x1000000:012x}-{base + i * 0x1000000 + 0xE00000:012x} r-xp 00000000 103:02 "
                f"{3414 + i} {lib}" for i, lib in enumerate(state["engine_nccl"])]
        maps.append(f"{base - 0x200000:012x}-{base:012x} rw-s 00000000 00:1a 77 /dev/shm/nccl-Ab12Cd")
        write(root, f"proc/{svc['pid']}/maps", "\n".join(maps) + "\n")
    else:  # every process has its mappings: the engine's own, as the kernel shows them
        (root / f"proc/{svc['pid']}/maps").symlink_to(f"/proc/{svc['pid']}/maps")
    write(root, f"sys/fs/cgroup/{svc.get('slice') or 'system.slice'}/memory.max", "max\n")
    mm = svc.get("memory_max", "max")
    write(root, f"sys/fs/cgroup{cgpath}/memory.max", ("max" if mm in ("infinity", "max") else mm) + "\n")


def _moved_processes(root: Path, state: dict, rel: str, pids: list[int]) -> None:
    """A cgroup p2pkit made, with the processes moved there: its procs, its default memory.max, and each
    process's cgroup, state, smaps and (with a scenario's NCCL libraries) maps."""
    write(root, f"sys/fs/cgroup{rel}/cgroup.procs", "".join(f"{p}\n" for p in pids))
    write(root, f"sys/fs/cgroup{rel}/memory.max", "max\n")  # a new cgroup's default
    for pid in pids:
        write(root, f"proc/{pid}/cgroup", f"0::{rel}\n")
        # a real process, as a unit's engine is above: its state and mappings are the kernel's own, and a
        # scenario's NCCL libraries are in its maps (P37)
        for name in ("stat", "smaps"):
            if not (root / f"proc/{pid}/{name}").is_symlink():
                (root / f"proc/{pid}/{name}").symlink_to(f"/proc/{pid}/{name}")
        if state.get("engine_nccl"):
            base = 0xFFFF8A000000
            write(root, f"proc/{pid}/maps", "\n".join(
                f"{base + i * 0x1000000:012x}-{base + i * 0x1000000 + 0xE00000:012x} r-xp 00000000 103:02 "
                f"{3414 + i} {lib}" for i, lib in enumerate(state["engine_nccl"])) + "\n")


def _etc(root: Path, state: dict) -> None:
    """/etc: the machine id, Ubuntu's base users and groups (laid out once) and os-release."""
    write(root, "etc/machine-id", state["machine_id"] + "\n")
    # Ubuntu's base users and groups (video: base-passwd's fixed 44; render: a system gid udev's
    # package makes), laid out once: the useradd and usermod stand-ins change them afterwards
    for rel, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"),
                      ("etc/group", "root:x:0:\nvideo:x:44:\nrender:x:992:\n")):
        if not (root / rel).exists():
            write(root, rel, text)
    os_ = state["os"]
    write(root, "etc/os-release", "".join(f'{k}="{v}"\n' for k, v in os_.items()) + "ID_LIKE=debian\n")


def module_files(root: Path, state: dict, clear: bool = False) -> None:
    """What the loaded nvidia module makes: /sys/module/nvidia*, /dev/nvidia*, /proc/driver/nvidia. With
    `clear`, what an earlier load made goes first (a container host's module is loaded and unloaded in
    place; a simulated host's directory is laid out anew)."""
    root = Path(root)
    if clear:
        for d in ("sys/module/nvidia", "sys/module/nvidia_uvm", "sys/module/nvidia_modeset", "sys/module/nvidia_drm",
                  "proc/driver/nvidia"):
            shutil.rmtree(root / d, ignore_errors=True)
        for f in (root / "dev").glob("nvidia*"):
            f.unlink()
    mod = model.loaded(state)
    if mod is not None:
        write(root, "sys/module/nvidia/srcversion", mod["srcversion"] + "\n")
        for extra in ("nvidia_uvm", "nvidia_modeset", "nvidia_drm"):
            write(root, f"sys/module/{extra}/refcnt", "0\n")
        for dev in ("nvidiactl", "nvidia-uvm", *(f"nvidia{i}" for i in range(len(state["gpus"])))):
            write(root, f"dev/{dev}", "")
        write(root, "proc/driver/nvidia/params", "ResmanDebugLevel: 4294967295\nEnableResizableBar: 0\n"
              f"DynamicPowerManagement: 3\nRegistryDwords: \"{mod.get('registry_dwords', '')}\"\n"
              "RegistryDwordsPerDevice: \"\"\n")
        for holder in state.get("module_holders", []):
            write(root, f"sys/module/nvidia/holders/{holder}", "")
        kind = "Open Kernel Module" if mod.get("open", True) else "Kernel Module"
        write(root, "proc/driver/nvidia/version",
              f"NVRM version: NVIDIA UNIX {kind} for {state.get('arch', 'x86_64')}  {mod['version']}  Release Build  "
              f"({mod.get('builder', 'dvs-builder@U22-I3-AM02-24-3')})  Tue Nov  3 10:00:00 UTC 2026\n"
              f"GCC version:  {mod.get('compiler') or 'gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)'}\n")


def _boot(root: Path, state: dict) -> None:
    """/boot as Ubuntu keeps it: a vmlinuz-<k> per installed kernel and the /boot/vmlinuz symlink
    (linux-base's linux-update-symlinks) at the newest one, the kernel GRUB's default entry boots next
    (lifecycle.reboot's next_kernel)."""
    kernels = [state["kernel"], *([state["next_kernel"]] if state.get("next_kernel") else [])]
    for k in kernels:
        if not (root / f"boot/vmlinuz-{k}").exists():
            write(root, f"boot/vmlinuz-{k}", f"SIMULATED Linux kernel image {k}\n")
    link = root / "boot/vmlinuz"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(f"vmlinuz-{kernels[-1]}")


def write_standin(root: Path, name: str, text: str) -> None:
    """A stand-in in usr/bin, replaced only when it changed and then by a rename: a shell stand-in
    that is being read keeps its own copy."""
    path = root / "usr/bin" / name
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)


LIBRARIES = {"nvml": "p2pkit.sim.nvml", "devices": "p2pkit.sim.devices", "machine": "p2pkit.sim.lifecycle"}
# The commands of this machine the simulated host lends p2pkit by name (p2pkit.core.runner: every other
# command is the simulated host's own stand-in, or missing): the engine is built for real (git,
# pkg-config, CMake, Ninja, make, the compilers; ldd reads what it links) and the service's unit is
# verified by the real systemd-analyze; the Secure Boot key is made and checked by the real openssl (the
# simulated mokutil and sign-file read certificates with it too); vLLM's environment is made by the real
# Python (python3 -m venv, pip); the network between nodes is this machine's own (network namespaces in the tests),
# so `ip` is its own too. What reads the host (dmesg, modinfo, nvidia-smi, ...) is never lent.
LENDS = ("git", "pkg-config", "cmake", "ninja", "make", "cc", "c++", "ldd", "systemd-analyze", "openssl", "python3",
         "ip")


def roce_gids(nic: dict) -> list[tuple[str, str]]:
    """The GID table of a ConnectX port as the kernel shows it: link-local IPv6 as RoCE v1 and v2, then
    the IPv4-mapped address as v1 and v2 (index 3 here; `gid_shift` moves it, as interface events do)."""
    ll = "fe80:0000:0000:0000:0eaf:0bff:fe1c:2a00"
    v4 = "0000:0000:0000:0000:0000:ffff:0a0a:00" + f"{nic.get('ip_last', 1):02x}"
    table = [(ll, "IB/RoCE v1"), (ll, "RoCE v2")] + [("0000:0000:0000:0000:0000:0000:0000:0000", "")] * \
        nic.get("gid_shift", 0) + ([(v4, "IB/RoCE v1"), (v4, "RoCE v2")] if nic.get("ipv4", True) else [])
    return table


def _dpkg_database(root: Path, state: dict) -> None:
    """A real dpkg database (the simulated host's dpkg, dpkg-query, apt-mark and apt are this machine's
    real ones pointed at it): the state's packages, each stanza in dpkg's own status format; a hold
    set by dpkg itself (dpkg --set-selections, ansible's dpkg_selections) survives a re-render. bash is
    Essential, as on every Debian and Ubuntu host: dpkg writes that field between Package and Status
    (the shape the roles' reading of this file must allow, tests/fixtures/dpkg), so the reader of the
    holds allows any field lines there too, never a blank line (the next stanza)."""
    status = root / "var/lib/dpkg/status"
    held = set(re.findall(r"^Package: (\S+)\n(?:[^\n]+\n)*?Status: hold ", status.read_text(), re.M)) \
        if status.is_file() else set()
    arch = "arm64" if state.get("arch") == "aarch64" else "amd64"
    out = [f"Package: bash\nEssential: yes\nStatus: {'hold' if 'bash' in held else 'install'} ok installed\n"
           "Priority: required\nSection: shells\n"
           f"Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>\nArchitecture: {arch}\n"
           "Version: 5.2.21-2ubuntu4\nDescription: GNU Bourne Again SHell (SIMULATED)\n"]
    for name, abbrev in sorted(state.get("packages", {}).items()):
        want = "hold" if name in held else ("install" if abbrev == "ii" else "deinstall")
        version = re.search(r"(\d+\.\d+\.\d+)$", name)
        version = f"{version.group(1)}-0ubuntu1" if version else "1.0-0ubuntu1"
        installed = abbrev == "ii"
        out.append(f"Package: {name}\nStatus: {want} ok {'installed' if installed else 'config-files'}\n"
                   "Priority: optional\nSection: misc\nMaintainer: Ubuntu Developers "
                   f"<ubuntu-devel-discuss@lists.ubuntu.com>\nArchitecture: {arch}\nVersion: {version}\n"
                   + ("" if installed else f"Config-Version: {version}\n") + f"Description: {name} (SIMULATED)\n")
    write(root, "var/lib/dpkg/status", "\n".join(out) + "\n")
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/lib/apt/lists/partial",
              "var/cache/apt/archives/partial", "etc/apt/preferences.d", "etc/apt/apt.conf.d",
              "etc/apt/sources.list.d", "var/log/apt"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for f in ("var/lib/dpkg/available", "etc/apt/sources.list"):
        if not (root / f).exists():
            write(root, f, "")


def _storage(root: Path, state: dict) -> None:
    """The root filesystem on an NVMe partition (mount table, /sys/dev/block, /sys/block), plus any
    mounts the scenario adds (a network filesystem under the model's paths, say)."""
    disk = root / "sys/devices/pci0000:00/0000:00:02.4/0000:03:00.0/nvme/nvme0/nvme0n1"
    part = disk / "nvme0n1p2"
    (disk / "queue").mkdir(parents=True, exist_ok=True)
    (disk / "queue/rotational").write_text("0\n")
    part.mkdir(parents=True, exist_ok=True)
    (part / "partition").write_text("2\n")
    for link, target in (("sys/dev/block/259:2", part), ("sys/block/nvme0n1", disk),
                         ("sys/class/block/nvme0n1p2", part), ("sys/class/block/nvme0n1", disk)):
        lp = root / link
        lp.parent.mkdir(parents=True, exist_ok=True)
        lp.symlink_to(os.path.relpath(target, lp.parent))
    lines = ["22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro",
             "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw"]
    for i, m in enumerate(state.get("mounts", [])):
        lines.append(f"{40 + i} 22 {m['device']} / {m['mount_point']} rw,relatime shared:{60 + i} - {m['fstype']} "
                     f"{m['source']} rw")
    write(root, "proc/self/mountinfo", "\n".join(lines) + "\n")


def userspace_on_disk(root: Path) -> str | None:
    """The userspace driver version NVML loads: the library libnvidia-ml.so.1 points to, if it is there
    (in the multiarch directory of either architecture: an aarch64 Spark node's is aarch64-linux-gnu)."""
    links = [Path(root) / d.lstrip("/") / "libnvidia-ml.so.1" for d in rules.MULTIARCH_LIBDIR.values()]
    link = next((x for x in links if x.is_symlink() and x.exists()), None)
    if link is None:
        return None
    m = re.fullmatch(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)", Path(os.readlink(link)).name)
    return m.group(1) if m else None


def load_state(root: Path) -> dict:
    doc = json.loads((Path(root) / SIM_MARKER).read_text())
    doc.pop("libraries", None)
    doc.pop("lends", None)
    return doc


def save(root: Path, state: dict) -> None:
    render(root, state)


REAL_PACKAGE_TOOLS = ("dpkg", "dpkg-query", "apt-mark", "apt-get", "apt-cache")


def apt_root_options(root: str) -> list[str]:
    """apt's options that make it read and change only the simulated root: its sources, preferences,
    lists, cache and dpkg status, and dpkg through the simulated host's own dpkg (below)."""
    return ["-o", f"Dir={root}", "-o", f"Dir::State::status={root}/var/lib/dpkg/status",
            "-o", f"Dir::Bin::dpkg={root}/usr/bin/dpkg"]


def real_package_tool(name: str) -> str:
    """Not a stand-in: a shell script that runs this machine's real dpkg or apt on the simulated host's
    database (dpkg's --root, apt's Dir options), so holds and pins are judged by the real tools and this
    machine's own package state is never touched. The host is where the script lies: <root>/usr/bin."""
    real = f"/usr/bin/{name}"
    opts = {"dpkg": ["--root=$root"], "dpkg-query": ["--admindir=$root/var/lib/dpkg"]}.get(name) \
        or apt_root_options("$root")
    quoted = " ".join(f'"{o}"' for o in opts)  # $root expands in them, nothing else does
    return ("#!/bin/sh\n"
            f"# SIMULATED host: this machine's real {real} on the simulated host's package database\n"
            'self=$(readlink -f "$0")\nroot=${self%/usr/bin/*}\n'
            f'if [ ! -f {real} ]; then\n'
            f'  echo "SIMULATED host: {name} runs this machine\'s real {real}, which is not installed" >&2\n'
            "  exit 127\nfi\n"
            f'exec {real} {quoted} "$@"\n')


def standin_script(name: str) -> str:
    """The file a stand-in is: a Python that imports only p2pkit's simulator (-S: no site-packages,
    no .pth hooks; p2pkit's own directory last on the path, so a PYTHONPATH still picks the tree), or
    for the package tools a shell script that runs this machine's real one (real_package_tool).

    Where p2pkit was installed again another way since the host was laid out (the README's `pip install .`,
    then `pip install -e .`), the directory it names may hold only a folder the editable install left
    (p2pkit/_share), which the first try imports as a namespace package: the stand-in forgets that, then
    takes the interpreter's own site-packages and .pth hooks. Where no p2pkit is left to this Python, it
    says so whole on stderr, with the command that lays this host out again, and exits STANDIN_EXIT
    (the runner stops the command with that message: p2pkit.core.runner.standin_cannot_run)."""
    if name in REAL_PACKAGE_TOOLS:
        return real_package_tool(name)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return (f"#!{sys.executable} -S\n# SIMULATED stand-in for {name}: p2pkit's simulated host\n"
            f"import sys\nsys.path.append({here!r})\n"
            "try:\n    from p2pkit.sim.standins import main\n"
            "except ImportError:\n"
            "    for m in [m for m in sys.modules if m == 'p2pkit' or m.startswith('p2pkit.')]:\n"
            "        del sys.modules[m]\n"
            "    import importlib, site\n    site.main()\n    importlib.invalidate_caches()\n"
            "    try:\n        from p2pkit.sim.standins import main\n"
            "    except ImportError:\n"
            f"        import json, os\n        here, name = {here!r}, {name!r}\n"
            "        root = os.path.dirname(os.path.abspath(__file__))\n"
            "        while root != '/' and not os.path.isfile(os.path.join(root, " f"{SIM_MARKER!r}" ")):\n"
            "            root = os.path.dirname(root)\n"
            "        try:\n"
            "            with open(os.path.join(root, " f"{SIM_MARKER!r}" ")) as fh:\n"
            "                scenario = json.load(fh).get('scenario') or 'healthy'\n"
            "        except (OSError, ValueError):\n"
            "            scenario = 'healthy'\n"
            f"        sys.stderr.write({STANDIN_CANNOT_RUN!r} + {REINSTALLED!r}.format(\n"
            "            root=root, name=name, here=here, python=sys.executable) + '\\n'\n"
            f"            + {REINSTALLED_FIX!r}.format(root=root, scenario=scenario) + '\\n')\n"
            f"        sys.exit({STANDIN_EXIT})\n"
            f"sys.exit(main({name!r}, sys.argv[1:]))\n")


REINSTALLED = ("the simulated host at {root} cannot run its stand-in for {name}: the p2pkit it was laid out with "
               "({here}) is gone from the Python the stand-ins run on ({python}); p2pkit was removed from it or "
               "installed elsewhere since")
REINSTALLED_FIX = ("fix: lay the simulated host out again with the p2pkit you have now (its stages start anew): "
                   "`p2pkit sim init --force {root} --scenario {scenario}`")
