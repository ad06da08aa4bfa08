"""NVML through nvidia-ml-py (import pynvml), imported only when asked for.

The library comes from the host: pynvml on a real host, the simulated host's stand-in for it on
a simulated one, so this gathering code is the same for both. Every failure becomes
{"error": "..."} at the level it happened; nothing raises. A function the installed driver or
nvidia-ml-py lacks, or one the GPU does not support, reads as its error text ("Not Supported",
"Function Not Found"), never a crash.
"""

from __future__ import annotations

from p2pkit.host import Host, NotThisMachine

P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
ANCESTOR = {0: "INTERNAL", 10: "SINGLE", 20: "MULTIPLE", 30: "HOSTBRIDGE", 40: "NODE", 50: "SYSTEM"}
P2P_READ, P2P_WRITE = 0, 1  # pass plain ints: the binding's NVML_P2P_CAPS_INDEX_READ is a tuple


def _call(fn, *args):
    """fn(*args) as a reading: fn is a function, or the name of one in the bound library (a name the
    installed nvidia-ml-py lacks is a reading too: "nvmlX is not in this nvidia-ml-py")."""
    if isinstance(fn, tuple):
        nv, name = fn
        fn = getattr(nv, name, None)
        if fn is None:
            return {"error": f"Function Not Found: {name} is not in this nvidia-ml-py or driver"}
    try:
        v = fn(*args)
        return v.decode() if isinstance(v, bytes) else v
    except Exception as e:  # NVMLError and its many subclasses; a missing symbol too
        return {"error": str(e) or type(e).__name__}


def facts(host: Host) -> dict:
    def labelled(nv) -> dict:
        out = _gather(nv)
        if getattr(nv, "simulated", None):
            out["recorded"] = nv.simulated
        return out
    return _session(host, labelled)


def per_gpu(host: Host, function: str) -> dict:
    """One NVML device function's answer for every GPU, by the GPU's PCI bus id (a fact of its own in the
    fact table: p2pkit/facts/table.py): {"00000000:01:00.0": answer or {"error": ...}}, or {"error": ...}."""
    return _session(host, lambda nv: _each_gpu(nv, function))


def _session(host: Host, read) -> dict:
    """read(nv) between NVML's init and shutdown; a library that cannot load or start is the reading's error."""
    try:
        nv = host.library("nvml")
    except NotThisMachine as e:
        return {"error": str(e)}
    except ImportError as e:
        return {"error": f"nvidia-ml-py is not installed (pip install nvidia-ml-py): {e}"}
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        msg = str(e).rstrip(".")
        if "mismatch" in msg.lower():
            msg += ": the loaded kernel module and the userspace driver differ; reboot or reload the module"
        return {"error": f"NVML did not initialise: {msg}"}
    try:
        out = read(nv)
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
    return out


def _each_gpu(nv, function: str) -> dict:
    count = _call((nv, "nvmlDeviceGetCount"))
    if isinstance(count, dict):
        return count
    out = {}
    for i in range(count):
        h = _call((nv, "nvmlDeviceGetHandleByIndex"), i)
        if isinstance(h, dict):
            return {"error": f"GPU {i}: {h['error']}"}
        pci = _call((nv, "nvmlDeviceGetPciInfo"), h)
        bus = f"GPU {i}" if isinstance(pci, dict) else pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
        out[bus] = _call((nv, function), h)
    return out


def _gather(nv) -> dict:
    out: dict = {
        "driver_version": _call((nv, "nvmlSystemGetDriverVersion")),
        "cuda_driver_version": _call((nv, "nvmlSystemGetCudaDriverVersion")),
        "gpus": [],
        "p2p": [],
    }
    count = _call((nv, "nvmlDeviceGetCount"))
    if isinstance(count, dict):
        out["error"] = count["error"]
        return out
    handles = []
    for i in range(count):
        h = _call((nv, "nvmlDeviceGetHandleByIndex"), i)
        if isinstance(h, dict):
            out["error"] = f"GPU {i}: {h['error']}"
            return out
        handles.append(h)
    for i, h in enumerate(handles):
        mem = _call((nv, "nvmlDeviceGetMemoryInfo"), h)
        bar1 = _call((nv, "nvmlDeviceGetBAR1MemoryInfo"), h)
        pci = _call((nv, "nvmlDeviceGetPciInfo"), h)
        out["gpus"].append({
            "index": i,
            "name": _call((nv, "nvmlDeviceGetName"), h),
            "uuid": _call((nv, "nvmlDeviceGetUUID"), h),
            "bus_id": (pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId)
            if not isinstance(pci, dict) else pci,
            "memory_total": mem.total if not isinstance(mem, dict) else mem,
            "memory_free": mem.free if not isinstance(mem, dict) else mem,
            "processes": _processes(nv, h),
            "util_gpu_pct": _utilization(nv, h),
            "bar1_total": bar1.bar1Total if not isinstance(bar1, dict) else bar1,
            "link": {
                "current_gen": _call((nv, "nvmlDeviceGetCurrPcieLinkGeneration"), h),
                "current_width": _call((nv, "nvmlDeviceGetCurrPcieLinkWidth"), h),
                "max_gen": _call((nv, "nvmlDeviceGetMaxPcieLinkGeneration"), h),
                "gpu_max_gen": _call((nv, "nvmlDeviceGetGpuMaxPcieLinkGeneration"), h),
                "max_width": _call((nv, "nvmlDeviceGetMaxPcieLinkWidth"), h),
                "speed_mbps": _call((nv, "nvmlDeviceGetPcieSpeed"), h),
            },
            "replay_counter": _call((nv, "nvmlDeviceGetPcieReplayCounter"), h),
            "clock_event_reasons": _call((nv, "nvmlDeviceGetCurrentClocksEventReasons"), h),
            "locked_clocks": _locked(nv, h),
        })
    for i, a in enumerate(handles):
        for j, b in enumerate(handles):
            if i == j:
                continue
            r = _call((nv, "nvmlDeviceGetP2PStatus"), a, b, P2P_READ)
            w = _call((nv, "nvmlDeviceGetP2PStatus"), a, b, P2P_WRITE)
            anc = _call((nv, "nvmlDeviceGetTopologyCommonAncestor"), a, b)
            out["p2p"].append({
                "from": i, "to": j,
                "read": P2P_STATUS.get(r, r) if not isinstance(r, dict) else r,
                "write": P2P_STATUS.get(w, w) if not isinstance(w, dict) else w,
                "common_ancestor": ANCESTOR.get(anc, anc) if not isinstance(anc, dict) else anc,
            })
    return out


def _locked(nv, h) -> dict | None:
    """Clocks locked by someone (nvidia-smi -lgc / -ac): the applications clock reason is active."""
    reasons = _call((nv, "nvmlDeviceGetCurrentClocksEventReasons"), h)
    if isinstance(reasons, dict):
        return reasons
    app_setting = getattr(nv, "nvmlClocksEventReasonApplicationsClocksSetting", 0x2)
    return {"applications_clocks_setting": bool(reasons & app_setting)}


def _utilization(nv, h) -> int | dict:
    """Percent of the last sample period a kernel ran (what `nvidia-smi -q` prints as Utilization/GPU)."""
    u = _call((nv, "nvmlDeviceGetUtilizationRates"), h)
    return u if isinstance(u, dict) else u.gpu


def _processes(nv, h) -> list | dict:
    """The compute processes on a GPU and the memory each holds (P18: what the engine itself uses)."""
    procs = _call((nv, "nvmlDeviceGetComputeRunningProcesses"), h)
    if isinstance(procs, dict):
        return procs
    return [{"pid": x.pid, "used": x.usedGpuMemory} for x in procs]
