"""The shape of each fact p2pkit reads, each number with its unit: the types the fact table
(p2pkit/facts/table.py) names, one per fact.

A fact is JSON: what a probe returns, or what `p2pkit facts record` wrote on another host. Each is a
TypedDict (or a plain type); a number's unit is in its type, `Annotated[int, BYTES]`, and shows in the
validator's message (p2pkit/facts/types.py). Keys are optional (a probe that could not read a part
leaves it out or puts {"error": ...} in its place) and keys not declared are let through (a recording
from an earlier or later p2pkit); what is declared must have its type."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypedDict

# units
BYTES, MIB, MBPS, GBPS, SECONDS, PERCENT = "bytes", "MiB", "Mb/s", "Gb/s", "s", "%"
GEN, LANES, COUNT, BITS = "PCIe generation", "lanes", "count", "bitmask"

Bytes = Annotated[int, BYTES]
MiB = Annotated[int, MIB]
Gen = Annotated[int, GEN]  # 1..6: 2.5, 5, 8, 16, 32, 64 GT/s per lane
Lanes = Annotated[int, LANES]
Count = Annotated[int, COUNT]
Percent = Annotated[int, PERCENT]
Mbps = Annotated[int, MBPS]
Gbps = Annotated[float, GBPS]
Epoch = Annotated[float, SECONDS]  # a file's modification time, seconds since the epoch
EpochNs = Annotated[int, "ns"]


class Failed(TypedDict, total=False):
    """A fact, or a part of one, that could not be read: why, and what to run by hand."""
    error: str
    by_hand: str


class Guards(TypedDict, total=False):
    nouveau_blacklisted: bool
    apt_pin: bool
    unattended_upgrades_blacklist: bool


class PackageHolds(TypedDict, total=False):
    installed: list[str]
    held: list[str]


class Identity(TypedDict, total=False):
    machine_id: str
    boot_id: str
    kernel: str
    hostname: str


class Iommu(TypedDict, total=False):
    intent: str
    detail: str
    cmdline_tokens: list[str]
    cpu_vendor: str


class Bootloader(TypedDict, total=False):
    name: str
    why: str
    esp: str | None
    entries: dict[str, list[str]]
    kernel_cmdline: list[str] | str | None
    kernelstub: list[str] | None
    loader_info: str | None


class Disk(TypedDict, total=False):
    path: str
    free_bytes: Bytes


class DpkgProblem(TypedDict, total=False):
    package: str
    status: str


class DistroModule(TypedDict, total=False):
    dkms: str
    name: str
    version: str
    kernels: dict[str, str]
    state: str | None
    modules: list[dict[str, str]]
    package: str | None
    package_version: str | None
    package_status: str | None
    held: bool


class DistroDkms(TypedDict, total=False):
    modules: list[DistroModule]
    routes: dict[str, list[str]]


class MemoryCap(TypedDict, total=False):
    file: str
    limit_bytes: Bytes


class Cgroup(TypedDict, total=False):
    v2_path: str | None
    v1_memory_path: str | None
    memory_caps: list[MemoryCap]
    systemd_booted: bool  # systemd is PID 1: the engine gets a slice, else the launcher's own cgroup


class PciLink(TypedDict, total=False):
    current_gen: Gen | None
    current_width: Lanes | None
    max_gen: Gen | None
    max_width: Lanes | None
    current_speed: str | None  # as sysfs writes it: "32.0 GT/s PCIe"
    max_speed: str | None


class Aperture(TypedDict, total=False):
    index: int
    size: Bytes
    flags: str
    resizable_to: list[Bytes]


class BridgeWindow(TypedDict, total=False):
    bdf: str
    prefetch_size: Bytes | None
    error: str


class ParentLink(TypedDict, total=False):
    bdf: str
    max_gen: Gen | None
    max_width: Lanes | None


class Upstream(TypedDict, total=False):
    bdf: str
    port_type: str | None


class PciGpu(TypedDict, total=False):
    bdf: str
    device_id: str | None
    name: str
    link: PciLink
    aperture: Aperture | None
    bridge_window: BridgeWindow
    parent_link: ParentLink
    sysfs_path: str
    upstream: list[Upstream]
    iommu_group: str | None
    errors: list[str]


class KernelModuleVersion(TypedDict, total=False):
    loaded: bool
    version: str
    open_module: bool
    builder: str | None
    line: str


class Module(TypedDict, total=False):
    loaded_srcversion: str | None
    modinfo_filename: str | None
    modinfo_srcversion: str | None
    modinfo_error: str


class KernelModule(Module, total=False):
    """What modprobe would load for a kernel that is not running (modinfo -k K nvidia)."""
    modinfo_sig_key: str | None  # colon-separated hex serial of the key that signed it; None: unsigned


class PendingKernel(KernelModule, total=False):
    running: str
    boot_image: str
    kernel: str | None
    held_for: str


class UserspaceDriver(TypedDict, total=False):
    versions: list[str]
    gsp_firmware: dict[str, list[str]]


class NvmlLink(TypedDict, total=False):
    current_gen: Gen | Failed
    current_width: Lanes | Failed
    max_gen: Gen | Failed
    gpu_max_gen: Gen | Failed
    max_width: Lanes | Failed
    speed_mbps: Mbps | Failed


class GpuProcess(TypedDict, total=False):
    pid: int
    used: Bytes | None


class LockedClocks(TypedDict, total=False):
    applications_clocks_setting: bool
    error: str


class NvmlGpu(TypedDict, total=False):
    index: int
    name: str | Failed
    uuid: str | Failed
    bus_id: str | Failed
    memory_total: Bytes | Failed
    memory_free: Bytes | Failed
    processes: list[GpuProcess] | Failed
    util_gpu_pct: Percent | Failed | None
    bar1_total: Bytes | Failed
    link: NvmlLink
    replay_counter: Count | Failed
    clock_event_reasons: Annotated[int, BITS] | Failed
    locked_clocks: LockedClocks


NvmlPair = TypedDict("NvmlPair", {  # "from" is a keyword: the class form cannot name it
    "from": int, "to": int, "read": str | Failed, "write": str | Failed, "common_ancestor": str | Failed,
}, total=False)


class Nvml(TypedDict, total=False):
    driver_version: str | Failed
    cuda_driver_version: int | Failed  # 13000 for CUDA 13.0: a version, not a number to compare with units
    gpus: list[NvmlGpu]
    p2p: list[NvmlPair]
    recorded: str


class SmiMatrix(TypedDict, total=False):
    matrix: dict[str, dict[str, str]]
    pair: str


class RocePort(TypedDict, total=False):
    device: str
    port: int | str
    state: str
    link_layer: str
    netdevs: list[str]
    rate: str
    rate_gbps: Gbps | None


class DriverParams(TypedDict, total=False):
    loaded: bool
    params: dict[str, str]
    registry_dwords: dict[str, str]


class AcsPort(TypedDict, total=False):
    bdf: str
    gpu: str
    ctl: Annotated[int, BITS] | None  # the ACS control register; None: the port has no ACS capability
    # (a switch's upstream port: nothing to redirect there)
    flags: dict[str, bool] | None
    error: str
    by_hand: str


class Acs(TypedDict, total=False):
    ports: list[AcsPort]


class KernelLog(TypedDict, total=False):
    bar_no_space: list[str]
    resize_fatal: list[str]
    wpr2: list[str]
    io_page_fault: list[str]


class Connector(TypedDict, total=False):
    connector: str
    card: str
    status: str
    bdf: str


class Drm(TypedDict, total=False):
    connectors: list[Connector]


class Initramfs(TypedDict, total=False):
    path: str
    nvidia: list[str]
    other: list[str]
    mtime: Epoch


class DkmsModule(TypedDict, total=False):
    dkms: str
    package: str | None
    kernels: dict[str, str]
    state: str | None


class ModuleSources(TypedDict, total=False):
    kernel: str
    updates: list[str]
    dkms: list[DkmsModule]
    holders: list[str]
    installed_mtime: Epoch | None
    initramfs: Initramfs | Failed


class Gid(TypedDict, total=False):
    index: int
    gid: str
    type: str
    netdev: str


class GidPort(TypedDict, total=False):
    device: str
    port: str | int
    state: str
    netdevs: list[str]
    mtu: dict[str, Annotated[int, BYTES]]  # per netdev, bytes per frame
    gids: list[Gid]


class RoceGids(TypedDict, total=False):
    ports: list[GidPort]


class EngineEnvFile(TypedDict, total=False):
    path: str
    env: dict[str, str] | None


class RestoreUnits(TypedDict, total=False):
    systemd: bool  # systemd is PID 1: the units below are its own view (systemctl show)
    timer: dict[str, str]  # name, path and the properties read (LoadState, ActiveState, NeedDaemonReload, ...)
    service: dict[str, str]


class Held(TypedDict, total=False):
    kernel: str
    new_kernel: str
    module: KernelModule  # modinfo -k NEW_KERNEL nvidia, read now


class BootHold(TypedDict, total=False):
    held: Held | None


class Health(TypedDict, total=False):
    code: int | None  # an HTTP status
    text: str


class Rendezvous(TypedDict, total=False):
    address: str  # "ADDR:PORT"
    up: bool
    error: str


class EngineLive(TypedDict, total=False):
    installed: bool
    manager: str  # "systemd" or "launcher": how the engine was found (host/launcher.py, engine_process)
    pid: int | None
    state: str | None
    role: str
    health: Health
    head: Rendezvous  # a headless worker's head, asked once
    age_s: float | None  # where /health gave no answer: how long the process has run (an engine still starting)
    starting_window_s: float  # the profile's serve.health_timeout_s: how long the unit's start may take


class ModelShape(TypedDict, total=False):
    path: str
    arch: str
    layers: Count | None
    kv_heads: Count | None
    head_dim_k: Count | None
    head_dim_v: Count | None
    draft_layers: Count | None
    context_length: Annotated[int, "tokens"] | None
    weights_bytes: Bytes
    draft_model: dict[str, Any]
    error: str


class FitGpu(TypedDict, total=False):
    index: int
    total: Bytes | Failed | None
    free: Bytes | None
    engine_used: Bytes


class VramFit(TypedDict, total=False):
    model: ModelShape
    gpus: list[FitGpu] | Failed
    tp_quant_kv_refused: bool | None


class HeadRendezvous(TypedDict, total=False):
    role: str
    address: str
    up: bool
    why: str


class BuiltModule(TypedDict, total=False):
    path: str
    srcversion: str | None
    kernel: str | None
    error: str


class Storage(TypedDict, total=False):
    path: str
    exists: bool
    resolved: str
    mount_point: str
    fstype: str
    source: str
    device: str
    network: bool
    disk: str | None
    rotational: bool | None
    nvme: bool
    error: str


class NcclLibrary(TypedDict, total=False):
    path: str
    version: str | None
    pids: list[int]


class EngineNccl(TypedDict, total=False):
    running: bool
    pid: int
    pids: list[int]
    libraries: list[NcclLibrary]


class EngineArchs(TypedDict, total=False):
    library: str
    archs: list[str]
    missing: str


class ProfileNccl(TypedDict, total=False):
    path: str
    version: str | None


class FileIdentity(TypedDict, total=False):  # host/system.file_identity
    dev: int
    ino: int
    size: Bytes
    mtime_ns: EpochNs
    ctime_ns: EpochNs


class LinkedLibrary(TypedDict, total=False):  # a line of ldd
    name: str
    path: str | None
    missing_versions: list[str]


class BuiltFile(TypedDict, total=False):
    path: str
    identity: FileIdentity | None
    libraries: list[LinkedLibrary]


class WrittenFile(TypedDict, total=False):  # a file a stage wrote, as its gate re-proves it
    sha256: str
    identity: FileIdentity  # a file whose digest would tell too much (the secrets file)
    error: str


class EngineFiles(TypedDict, total=False):  # what the engine gate re-proves: the built binary now
    binary: BuiltFile


class ModelFile(TypedDict, total=False):  # what the model gate re-proves: the output now
    path: str
    identity: FileIdentity | None
    directory: bool


class SmiQGpu(TypedDict, total=False):  # `nvidia-smi -q` as p2pkit 0.1.0 recorded it (smi_q)
    bus_id: str
    name: str
    bar1_total_mib: MiB
    fb_total_mib: MiB
    gen_max: Gen
    gen_current: Gen
    width_max: Lanes
    width_current: Lanes
    replays: Count
    util_gpu_pct: Percent
    processes: Count


class SmiQ(TypedDict, total=False):
    gpus: list[SmiQGpu]


class CertIdentity(TypedDict, total=False):
    serial: str  # upper-case hex, no colons or leading zeros (as modinfo's sig_key reads without them)
    cn: str


class Mok(TypedDict, total=False):
    """The module signing with Secure Boot on (host/mok.facts); {"needed": False} with it off."""
    needed: bool
    key: str
    cert: str
    key_exists: bool
    cert_exists: bool
    sign_file: str | None
    mokutil: bool
    password_given: bool
    kernel: str
    cert_id: CertIdentity
    enrolment: Literal["enrolled", "in-db", "queued", "not-enrolled"]
    cert_error: str
    module_sig_key: str | None
    module_signer: str | None
