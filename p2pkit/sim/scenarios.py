"""Scenarios: a healthy dual-5090 box, and each way a real one goes wrong."""

from __future__ import annotations

import copy
import uuid

GIB = 1 << 30

HEALTHY: dict = {
    "profile": "dual-5090-ninfer",
    "facts": {"euid": 0, "disk_free_bytes": 900 * GIB},
    "os": {"ID": "ubuntu", "VERSION_ID": "24.04", "PRETTY_NAME": "Ubuntu 24.04.3 LTS",
           "VERSION_CODENAME": "noble"},
    "kernel": "6.8.0-88-generic",
    "cpu_vendor": "AuthenticAMD",
    "cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.8.0-88-generic root=UUID=5d0c7a51 ro quiet splash",
    "grub_dropins": {},
    # Ubuntu 24.04 with the IOMMU on in firmware: translated DMA domains unless the command line says pt
    "iommu_firmware": True,
    "secure_boot": False,
    "gpus": [
        {"bdf": "0000:01:00.0", "root_port": "0000:00:01.1", "device": "0x2b85", "vram_gib": 32,
         "bar1_bytes": 32 * GIB, "gpu_max_gen": 5, "gpu_max_width": 16, "slot_gen": 5, "slot_width": 8,
         "switch": False, "monitor": False},
        {"bdf": "0000:41:00.0", "root_port": "0000:40:01.1", "device": "0x2b85", "vram_gib": 32,
         "bar1_bytes": 32 * GIB, "gpu_max_gen": 5, "gpu_max_width": 16, "slot_gen": 5, "slot_width": 8,
         "switch": False, "monitor": False},
    ],
    "arch": "x86_64",
    "chipset_p2p": True,
    "driver": {"userspace": None},
    "module": {"installed": None, "loaded": None},
    "cgroup_memory_cap": None,
    # build-essential and git: an Ubuntu box that builds kernel modules has them (the p2p-module role
    # installs what dpkg's database lacks, through the simulated host's apt-get)
    "packages": {"linux-image-6.8.0-88-generic": "ii", "linux-firmware": "ii", "nvidia-firmware-580-580.95.05": "ii",
                 "libnvidia-cfg1-580": "rc",
                 # a build host: the engine role's build dependencies (role p2pkit.host.p2pkit_engine) are in
                 # place, as the real tools the simulated engine build runs (CMake, Ninja, g++) are
                 "build-essential": "ii", "cmake": "ii", "ninja-build": "ii", "pkg-config": "ii", "git": "ii",
                 "libcurl4-openssl-dev": "ii", "python3-venv": "ii", "python3-dev": "ii", "libnuma1": "ii"},
}


def _set(path: str, value):
    def apply(s: dict) -> None:
        *keys, last = path.split(".")
        d = s
        for k in keys:
            d = d[int(k)] if isinstance(d, list) else d[k]
        d[last] = value
    return apply


def _gpus(**kw):
    def apply(s: dict) -> None:
        for g in s["gpus"]:
            g.update(kw)
    return apply


def _behind_switch(s: dict) -> None:
    """Each GPU behind a PLX switch on its root port: the GPU's address moves two buses down, below the
    switch's upstream and downstream ports (rules.below_bridge)."""
    from p2pkit.sim import rules

    for g in s["gpus"]:
        g["switch"] = True
        g["bdf"] = rules.below_bridge(g["root_port"], 3)


def _spark(head: bool):
    """A DGX Spark node (seed 004): an aarch64 host (`uname -m`, /usr/lib/aarch64-linux-gnu, NVIDIA's
    aarch64 installer, iommu.passthrough) with one GB10, two ConnectX-7 ports of which the cabled one
    is up; the RDMA device names differ between the two nodes (P24)."""
    def apply(s: dict) -> None:
        s["profile"] = "dual-spark-vllm"
        s["arch"] = "aarch64"
        s["kernel"] = "6.11.0-1016-nvidia"
        s["packages"] = {"linux-image-6.11.0-1016-nvidia": "ii", "linux-firmware": "ii", "build-essential": "ii",
                         "git": "ii", "python3-venv": "ii", "python3-dev": "ii", "libnuma1": "ii"}
        s["gpus"] = [{"bdf": "000f:01:00.0", "root_port": "000f:00:00.0", "device": "0x2e12", "name": "NVIDIA GB10",
                      "vram_gib": 128, "bar1_bytes": 128 * GIB, "gpu_max_gen": 5, "gpu_max_width": 16,
                      "slot_gen": 5, "slot_width": 16, "switch": False, "monitor": False}]
        up, down = ("rocep1s0f0", "rocep1s0f1") if head else ("rocep1s0f1", "rocep1s0f0")
        s["roce"] = [{"device": up, "bdf": "0000:01:00.0", "netdev": "enp1s0f0np0", "state": "ACTIVE"},
                     {"device": down, "bdf": "0000:01:00.1", "netdev": "enp1s0f1np1", "state": "DOWN"}]
    return apply


def _p2p_up(dwords: str = "RMForceStaticBar1=1"):
    """A box p2pkit has brought up to the link stage: the patched 615.71.09 module loaded with the
    profile's driver parameters, iommu=pt. The field scenarios each break one thing on top of it."""
    def apply(s: dict) -> None:
        s["cmdline"] = READY
        s["driver"]["userspace"] = "615.71.09"
        s["module"]["loaded"] = {"version": "615.71.09", "srcversion": "6C1D0E2F3A4B5C6D7E8F9A0B", "patched": True,
                                 "builder": "p2pkit-sim@build", "path": "/lib/modules/6.8.0-88-generic/kernel/drivers"
                                 "/video/nvidia.ko", "registry_dwords": dwords}
    return apply


READY = "BOOT_IMAGE=/boot/vmlinuz-6.8.0-88-generic root=UUID=5d0c7a51 ro quiet splash amd_iommu=on iommu=pt"

SD_BOOT_CMDLINE = "initrd=\\{mid}\\6.8.0-88-generic\\initrd.img-6.8.0-88-generic root=UUID=5d0c7a51 ro quiet splash"
POP_CMDLINE = ("initrd=\\EFI\\Pop_OS-5d0c7a51\\initrd.img root=UUID=5d0c7a51 ro quiet loglevel=0 "
               "systemd.show_status=false splash")

SCENARIOS: dict[str, tuple[str, list]] = {
    "healthy": ("a bare dual-5090 Ubuntu 24.04 box, each GPU on its own Gen5 x8 root port, 32 GiB BAR1", []),
    "no-gpu": ("a box with no NVIDIA GPU (like a CI runner)", [_set("gpus", [])]),
    "one-gpu": ("only one RTX 5090 seated", [lambda s: s["gpus"].pop()]),
    "wrong-os": ("Ubuntu 22.04 instead of 24.04",
                 [_set("os", {"ID": "ubuntu", "VERSION_ID": "22.04", "PRETTY_NAME": "Ubuntu 22.04.5 LTS",
                              "VERSION_CODENAME": "jammy"}), _set("kernel", "5.15.0-126-generic")]),
    "secure-boot-on": ("Secure Boot enabled in firmware", [_set("secure_boot", True)]),
    "secure-boot-stock-driver": ("Secure Boot on, iommu=pt already, Ubuntu's signed stock 580 DKMS driver loaded: "
                                 "the patched module is signed, and loads only after MokManager enrols the key",
                                 [_set("secure_boot", True), _set("cmdline", READY),
                                  _set("stock_driver", "580.95.05")]),
    "small-bar": ("Resizable BAR off in BIOS: BAR1 is 256 MiB", [_gpus(bar1_bytes=256 << 20)]),
    "behind-switch": ("both GPUs behind a PLX switch", [_behind_switch]),
    "gen4-slot": ("the second GPU in a Gen4 x8 slot", [_set("gpus.1.slot_gen", 4)]),
    "iommu-translating": ("the kernel forces a translating IOMMU (amd_iommu=on iommu.passthrough=0)",
                          [_set("cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.8.0-88-generic root=UUID=5d0c7a51 ro "
                                           "amd_iommu=on iommu.passthrough=0 quiet splash")]),
    "p2p-chipset-not-supported": ("a chipset on which the driver refuses P2P (CNS)", [_set("chipset_p2p", False)]),
    "driver-595": ("the profile pinned to driver 595.71.05 (P01)", [_set("driver_pin", "595.71.05")]),
    "gsp-firmware-missing": ("an installer that leaves out the GSP firmware", [_set("installer_gsp", False)]),
    "iommu-ready": ("the kernel command line already has amd_iommu=on iommu=pt: the module can be swapped live",
                    [_set("cmdline", READY)]),
    "stock-driver": ("iommu=pt already, Ubuntu's stock 580 DKMS driver installed and loaded",
                     [_set("cmdline", READY), _set("stock_driver", "580.95.05")]),
    "stock-driver-display": ("as stock-driver, and a display server (Xorg) holds the GPUs",
                             [_set("cmdline", READY), _set("stock_driver", "580.95.05"),
                              _set("gpu_holders", [{"pid": 2301, "command": "Xorg"}])]),
    "old-engine": ("the pinned engine source predates TP2 DFlash2 (P09)", [_set("engine_dflash2_tp2", False)]),
    "cuda-13.0": ("CUDA 13.0 installed: NInfer needs 13.1 (P05)", [_set("cuda_version", "13.0")]),
    "spark-head": ("a DGX Spark node (GB10) for the dual-spark-vllm pair, RoCE port up (rocep1s0f0)",
                   [_spark(head=True)]),
    "spark-worker": ("the other DGX Spark node: the same port is named rocep1s0f1 here (P24)", [_spark(head=False)]),
    "spark-fabric-down": ("a DGX Spark node whose fabric port is down",
                          [_spark(head=True), lambda s: s["roce"][0].update(state="DOWN")]),
    "spark-old-flashinfer": ("a DGX Spark node whose vLLM venv has flashinfer 0.6.17 (P25)",
                             [_spark(head=True), _set("flashinfer_version", "0.6.17")]),
    "spark-unpatched-vllm": ("a DGX Spark node whose vLLM tree lacks seed 004's sm_121 patch (P21)",
                             [_spark(head=True), _set("vllm_sm121_patch", False)]),
    "spark-table-on-nfs": ("a DGX Spark node whose n-gram table directory is an NFS mount (P26)",
                           [_spark(head=True), _set("mounts", [{"mount_point": "/var/lib/vllm", "fstype": "nfs4",
                                                                "source": "nas:/export/vllm", "device": "0:51"}])]),
    "other-bootloader": ("GRUB's files are there, but the firmware boots a loader p2pkit cannot see: no kernel "
                         "command line p2pkit writes takes effect", [_set("cmdline_frozen", True)]),
    "systemd-boot": ("Ubuntu booted by systemd-boot (kernel-install's entries on the ESP at /boot/efi, no GRUB)",
                     [_set("bootloader", "systemd-boot"), _set("cmdline", SD_BOOT_CMDLINE)]),
    "kernelstub": ("Pop!_OS: kernelstub keeps the kernel options and writes systemd-boot's Pop_OS-current entry",
                   [_set("bootloader", "kernelstub"), _set("cmdline", POP_CMDLINE)]),
    "unknown-bootloader": ("no GRUB, no systemd-boot entries, no kernelstub: a bootloader p2pkit does not know",
                           [_set("bootloader", "unknown")]),
    "p2p-up": ("the patched module loaded with the profile's parameters, iommu=pt: what the field scenarios break",
               [_p2p_up()]),
    "field-no-static-bar1": ("P28: the patched module loaded without RMForceStaticBar1=1 (topo OK, NCCL hangs)",
                             [_p2p_up(dwords="")]),
    "field-acs-redirect": ("P29: ACS request/completion redirect on the first GPU's root port (ACSCtl 0x001d)",
                           [_p2p_up(), _set("acs_ctl", {"0000:00:01.1": 0x1D})]),
    "field-intel-phb": ("P30: an Intel host whose GPUs meet at the CPU (topo PHB): NCCL's default takes SHM",
                        [_p2p_up(), _set("cpu_vendor", "GenuineIntel"), _set("topo_relation", "PHB"),
                         _set("files", {"etc/p2pkit/engine.env": "CUDA_DEVICE_ORDER=PCI_BUS_ID\n"})]),
    "field-bar-no-space": ("P31: the firmware left no room for BAR1: 256 MiB, the kernel could not assign it",
                           [_gpus(bar1_bytes=256 << 20), _set("dmesg", [
                               "[    2.831115] pci 0000:41:00.0: BAR 1 [mem size 0x800000000 64bit pref]: can't "
                               "assign; no space",
                               "[    2.831120] pci 0000:41:00.0: BAR 1 [mem size 0x800000000 64bit pref]: failed to "
                               "assign"])]),
    "field-display": ("P33: a monitor on the first GPU", [_p2p_up(), _set("gpus.0.monitor", True)]),
    "field-wedged": ("P35: a GPU left spinning by a hung collective, GSP cannot boot again (WPR2 already up)",
                     [_p2p_up(), _set("gpus.1.util", 100), _set("dmesg", [
                         "[  115.083711] NVRM: GPU1 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with "
                         "booting GSP"])]),
    "field-dmesg-restricted": ("kernel.dmesg_restrict=1 and p2pkit not root: the kernel log cannot be read",
                               [_p2p_up(), _set("dmesg_restrict", True)]),
    "field-roce-mtu-1500": ("P38: a Spark node whose fabric port fell back to MTU 1500 and lost its IPv4 GID",
                            [_spark(head=True), lambda s: s["roce"][0].update(mtu=1500, ipv4=False)]),
    "field-spark-sm120-only": ("P39: a DGX Spark node whose vLLM was built with CUDA 13 and lost sm_121",
                               [_spark(head=True), _set("vllm_sass", ["sm_100a", "sm_120a"])]),
    "capped-cgroup": ("p2pkit itself runs in a memory-capped cgroup (P12)", [_set("cgroup_memory_cap", 8 * GIB)]),
    "no-systemd": ("issue 27: PID 1 is a shell, not systemd, and p2pkit runs in a memory-capped cgroup (128 GiB): "
                   "p2pkit's launcher starts the engine in one without a cap",
                   [_set("systemd", False), _set("cgroup_memory_cap", 128 * GIB)]),
    "no-systemd-capped-root": ("no systemd as PID 1, and the cap (128 GiB) on the root of the container's cgroup "
                               "namespace: no uncapped cgroup can be had (P12)",
                               [_set("systemd", False), _set("cgroup_root_memory_cap", 128 * GIB)]),
}


def build(name: str) -> dict:
    if name not in SCENARIOS:
        import difflib

        from p2pkit.core.errors import UsageError

        near = difflib.get_close_matches(str(name), list(SCENARIOS), n=1)
        raise UsageError(f"no simulated scenario named {name!r}" + (f" (did you mean {near[0]}?)" if near else ""),
                         hint="scenarios: " + ", ".join(SCENARIOS))
    state = copy.deepcopy(HEALTHY)
    for change in SCENARIOS[name][1]:
        change(state)
    state["scenario"] = name
    state["machine_id"] = uuid.uuid4().hex
    state["cmdline"] = state["cmdline"].replace("{mid}", state["machine_id"])
    state["boot_id"] = str(uuid.uuid4())
    state["boots"] = 1
    return state
