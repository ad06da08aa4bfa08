"""SIMULATED GPUs under load: the device backend a simulated host gives the real load worker.

The worker (p2pkit/load/worker.py) polls NVML, detects link training, takes medians and writes the
result with its own code; this backend answers only what the GPUs would: copy timings, peer
access, integrity, one load step. Its figures are the reference box's recorded ones (seed 000:
2x RTX 5090 at Gen5 x8, patched 615.71.09), bent by the scenario, and the result says so. Time is
virtual (a load step is 0.25 s of it), so a simulated load takes no wall time.
"""

from __future__ import annotations

from pathlib import Path

from p2pkit.sim import model, rules
from p2pkit.sim.model import REF_HOST_GBPS, REF_LATENCY_US, REF_P2P_GBPS, REF_STAGED_GBPS
from p2pkit.sim.nvml import SimNvml
from p2pkit.sim.render import load_state

STEP_S = 0.25
NO_P2P_LATENCY_US = 14.2  # host-staged small copies on the reference box without the patch


class SimDevices:
    threaded = False  # a virtual clock: the worker samples NVML after each load step
    def __init__(self, root: Path):
        self.label = {"simulated": True, "recorded_from": "seed 000 reference box figures, bent by the scenario"}
        self.versions = {"torch": None, "cuda": None}
        self.nvml = SimNvml(root)
        self.state = load_state(root)
        self.t = 0.0

    def clock(self) -> float:
        return self.t

    def unavailable(self) -> str | None:
        return model.nvml_error(self.state)

    def count(self) -> int:
        return len(self.state["gpus"])

    def describe(self, d: int) -> tuple[str, str]:
        g = self.state["gpus"][d]
        return model.gpu_name(g), g["bdf"].lower()

    def load_prepare(self, devs: list[int]) -> None:
        self.nvml.under_load = True

    def load_step(self, devs: list[int]) -> None:
        self.t += STEP_S

    def load_finish(self) -> None:
        pass  # links stay trained while the copies below run, as they do on a real box

    @staticmethod
    def _ms(nbytes: int, gbps: float, samples: int) -> list[float]:
        return [nbytes / (gbps * 1e9) * 1000] * samples

    def host_copy_ms(self, d: int, nbytes: int, samples: int) -> tuple[list[float], list[float]]:
        gen, width = model.link_max(self.state["gpus"][d])
        scale = (rules.PCIE_GTS[gen] * width) / (rules.PCIE_GTS[5] * 8)
        return (self._ms(nbytes, REF_HOST_GBPS * scale, samples),
                self._ms(nbytes, REF_HOST_GBPS * scale * 0.98, samples))

    def _p2p(self) -> bool:
        return model.p2p_status(self.state) == "OK"

    def peer_access(self, a: int, b: int) -> bool:
        return self._p2p()

    def peer_copy_ms(self, a: int, b: int, nbytes: int, samples: int) -> list[float]:
        return self._ms(nbytes, REF_P2P_GBPS if self._p2p() else REF_STAGED_GBPS, samples)

    def peer_bidir_ms(self, a: int, b: int, nbytes: int, samples: int) -> list[float]:
        return self._ms(2 * nbytes, 2 * REF_P2P_GBPS * 0.93 if self._p2p() else REF_STAGED_GBPS, samples)

    def peer_latency_us(self, a: int, b: int, n: int) -> float:
        return REF_LATENCY_US if self._p2p() else NO_P2P_LATENCY_US

    def staged_copy_ms(self, a: int, b: int, nbytes: int, samples: int) -> list[float]:
        return self._ms(nbytes, REF_STAGED_GBPS, samples)

    def peer_integrity(self, a: int, b: int, n: int, seed: int) -> dict:
        # P2P over a translating IOMMU: the copy "succeeds" and the data arrive zero-filled (P32)
        bad = n if self._p2p() and model.iommu_effective(self.state) == "translating" else 0
        return {"equal": bad == 0, "mismatches": bad, "zeros": bad}


def open(root: Path) -> SimDevices:
    return SimDevices(root)


def nccl_allreduce(root: str, env: dict[str, str]) -> dict:
    """The simulated pair under the link stage's NCCL all-reduce (p2pkit/load/nccl_allreduce.py): NCCL's
    lines on stdout as the real one prints them, then the result; a hang is a hang (the parent's timeout
    ends it, as on a real box)."""
    import sys
    import time

    lines, hangs = model.nccl_lines(load_state(Path(root)), env)
    print("\n".join(lines), flush=True)
    if hangs:
        sys.stdout.flush()
        while True:
            time.sleep(3600)
    return {"nccl_version": "2.27.7", "elements": 2097152, "wrong": [0, 0], "init_s": 0.41, "seconds": 0.52,
            "simulated": True}
