"""SIMULATED NVML: the simulated host's answer at the library boundary.

A real host answers NVML through libnvidia-ml.so and nvidia-ml-py's `pynvml` module; p2pkit's
gathering code (p2pkit/host/nvml.py) and the load worker call that module's functions. The
simulated host hands them this object instead: the same function names, the same return types
(nvidia-ml-py's own ctypes structures, its NVMLError classes and codes), answered from the
simulated host's state. So the real gathering code runs against the simulated GPUs.

What NVML reports is modelled on the reference box and the real H200 readings in
tests/fixtures/h200-vm: an idle link reads Gen1 (ASPM) and trains to its maximum under load; the
clock event reasons read "GPU idle" (0x1); P2P status comes from the loaded module and chipset.
"""

from __future__ import annotations

from pathlib import Path

import pynvml

from p2pkit.sim import model
from p2pkit.sim.render import load_state
from p2pkit.sim.scenarios import GIB

# nvmlGpuTopologyLevel_t
_SINGLE, _HOSTBRIDGE = 10, 30
# nvmlGpuP2PStatus_t by the names nvidia-smi prints
_P2P_CODE = {"OK": 0, "CNS": 1, "GNS": 2, "TNS": 3, "DR": 4, "NS": 5, "U": 6}
# what NVML's init returns for the simulated driver's state (model.nvml_error's words)
_INIT_ERROR = {"NVML Shared Library Not Found": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
               "Driver Not Loaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
               "Driver/library version mismatch": pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH}
_IDLE = 0x1  # nvmlClocksEventReasonGpuIdle


class SimNvml:
    """The pynvml functions p2pkit calls, over one simulated host's state."""

    NVMLError = pynvml.NVMLError
    simulated = "SIMULATED NVML: answered from the simulated host's state"

    def __init__(self, root: Path):
        self.root = Path(root)
        self.state: dict | None = None
        self.under_load = False  # set by the simulated device backend while it runs the load

    # -- life
    def nvmlInit(self) -> None:
        state = load_state(self.root)
        err = model.nvml_error(state)
        if err:
            raise pynvml.NVMLError(_INIT_ERROR[err])
        self.state = state

    def nvmlShutdown(self) -> None:
        self._state()
        self.state = None

    def _state(self) -> dict:
        if self.state is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.state

    def _gpu(self, h: int) -> dict:
        gpus = self._state()["gpus"]
        if not isinstance(h, int) or not 0 <= h < len(gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpus[h]

    # -- system
    def nvmlSystemGetDriverVersion(self) -> str:
        return model.loaded(self._state())["version"]

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._state()
        return 13020

    # -- devices (a handle is the GPU's index)
    def nvmlDeviceGetCount(self) -> int:
        return len(self._state()["gpus"])

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._gpu(i)
        return i

    def nvmlDeviceGetHandleByPciBusId(self, bus: str | bytes) -> int:
        bus = bus.decode() if isinstance(bus, bytes) else bus
        for i, g in enumerate(self._state()["gpus"]):
            if g["bdf"].lower()[-12:] == bus.lower()[-12:]:
                return i
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, h: int) -> str:
        return model.gpu_name(self._gpu(h))

    def nvmlDeviceGetUUID(self, h: int) -> str:
        self._gpu(h)
        return f"GPU-5170a7ed-0000-4000-8000-{h:012x}"

    def nvmlDeviceGetPciInfo(self, h: int):
        g = self._gpu(h)
        dom, bus, rest = g["bdf"].split(":")
        info = pynvml.nvmlPciInfo_t()
        info.busId = ("0000" + g["bdf"].upper())[-16:].encode()
        info.domain, info.bus, info.device = int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId = (int(g["device"], 16) << 16) | 0x10DE
        return info

    def nvmlDeviceGetMemoryInfo(self, h: int):
        total = self._gpu(h)["vram_gib"] * GIB
        used = 512 << 20
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list:
        return []  # the simulated engine holds no GPU memory

    def nvmlDeviceGetUtilizationRates(self, h: int):
        util = int(self._gpu(h).get("util", 0))  # a scenario's GPU left spinning (P35) sets it
        return pynvml.c_nvmlUtilization_t(gpu=util, memory=0)

    def nvmlDeviceGetBAR1MemoryInfo(self, h: int):
        total = self._gpu(h)["bar1_bytes"]
        return pynvml.c_nvmlBAR1Memory_t(bar1Total=total, bar1Free=total - (2 << 20), bar1Used=2 << 20)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        gen, _ = model.link_max(self._gpu(h))
        return gen if self.under_load else 1  # ASPM parks an idle link at Gen1

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return model.link_max(self._gpu(h))[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return model.link_max(self._gpu(h))[0]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h)["gpu_max_gen"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return model.link_max(self._gpu(h))[1]

    def nvmlDeviceGetPcieSpeed(self, h: int) -> int:
        gen = self.nvmlDeviceGetCurrPcieLinkGeneration(h)
        return {1: 2500, 2: 5000, 3: 8000, 4: 16000, 5: 32000, 6: 64000}[gen]

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        # on, as on the H200 (nvidia-persistenced keeps it so); a scenario's GPU nobody turned it on for is off
        return pynvml.NVML_FEATURE_ENABLED if self._gpu(h).get("persistence", True) else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return self._gpu(h).get("replay_counter", 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        self._gpu(h)
        return 0 if self.under_load else _IDLE

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        self._gpu(a), self._gpu(b)
        if index not in (0, 1, 2, 3, 4, 5, 6):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _P2P_CODE[model.p2p_status(self._state())]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        ga, gb = self._gpu(a), self._gpu(b)
        if ga["root_port"] == gb["root_port"] or ga["switch"] or gb["switch"]:
            return _SINGLE
        return _HOSTBRIDGE


def open(root: Path) -> SimNvml:
    return SimNvml(root)
