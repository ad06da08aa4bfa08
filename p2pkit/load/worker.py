"""Link training under load, host<->device and P2P bandwidth, latency and integrity.

Never locks clocks (P04): the load is real compute. GB = 1e9 bytes. Timings use CUDA events
where the copy runs on one stream; wall time around full synchronisation where it cannot.

The worker drives a device backend: the real GPUs through torch (TorchDevices, below), or the
devices a simulated host provides (its `load_backend()` names them). Polling, link-training
detection, the medians and the result are this module's own code for both.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

APP_CLOCKS_REASON = 0x2  # nvmlClocksEventReasonApplicationsClocksSetting (also set by locked clocks)


def nvq(nv, fn, h):
    """An NVML reading, or None where the GPU does not report it (NOT_SUPPORTED: no PCIe link to read)."""
    try:
        return fn(h)
    except nv.NVMLError:
        return None


class Poller(threading.Thread):
    """NVML link gen/width, replay counter and clock event reasons every poll_ms, on the backend's clock.
    A backend whose clock is not the wall clock (a simulated one) is sampled after each load step instead."""

    def __init__(self, nv, handles, poll_ms: int, clock=time.monotonic):
        super().__init__(daemon=True)
        self.nv, self.handles, self.poll, self.clock = nv, handles, poll_ms / 1000, clock
        self.t0 = clock()
        self.samples: list[tuple[float, int, int, int, int, int]] = []
        self.stop_ev = threading.Event()

    def read(self, i, h):
        nv = self.nv
        get = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        try:
            reasons = get(h)
        except nv.NVMLError:
            reasons = 0
        return (round(self.clock() - self.t0, 3), i, nvq(nv, nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                nvq(nv, nv.nvmlDeviceGetCurrPcieLinkWidth, h), nvq(nv, nv.nvmlDeviceGetPcieReplayCounter, h), reasons)

    def sample(self):
        for i, h in enumerate(self.handles):
            self.samples.append(self.read(i, h))

    def run(self):
        while not self.stop_ev.is_set():
            self.sample()
            self.stop_ev.wait(self.poll)

    def mark(self) -> float:
        return self.clock() - self.t0


def median_gbps(nbytes: int, ms: list[float]) -> float:
    return nbytes / (statistics.median(ms) / 1000) / 1e9


def host_bandwidth(dev, d: int, nbytes: int, samples: int) -> dict:
    h2d, d2h = dev.host_copy_ms(d, nbytes, samples)
    return {"h2d_gbps": median_gbps(nbytes, h2d), "d2h_gbps": median_gbps(nbytes, d2h),
            "h2d_ms": h2d, "d2h_ms": d2h, "bytes": nbytes}


def pair(dev, a: int, b: int, nbytes: int, samples: int) -> dict:
    out: dict = {"from": a, "to": b, "peer_access": bool(dev.peer_access(a, b)), "bytes": nbytes}
    ms = dev.peer_copy_ms(a, b, nbytes, samples)
    out["unidir_gbps"] = median_gbps(nbytes, ms)
    out["unidir_ms"] = ms
    # every bandwidth with the samples it is the median of: the gate re-proves each figure from them
    out["bidir_ms"] = dev.peer_bidir_ms(a, b, nbytes, samples)
    out["bidir_gbps"] = median_gbps(2 * nbytes, out["bidir_ms"])
    out["latency_us"] = dev.peer_latency_us(a, b, 200)
    out["staged_ms"] = dev.staged_copy_ms(a, b, nbytes, samples)
    out["staged_gbps"] = median_gbps(nbytes, out["staged_ms"])
    # integrity: a known pattern across, compared through the host (not through P2P)
    n_int = min(nbytes // 4, 16 << 20)
    out["integrity"] = {"elements": n_int, **dev.peer_integrity(a, b, n_int, seed=1234 + a * 16 + b)}
    return out


def load(dev, devs: list[int], seconds: float, poller: Poller, target: tuple[int, int], trained: dict,
         threaded: bool) -> float:
    """Real compute and copies on every GPU until all trained (plus 2 s), at least 3 s, at most `seconds`."""
    dev.load_prepare(devs)
    start = poller.mark()
    while True:
        dev.load_step(devs)
        if not threaded:
            poller.sample()
        for t, i, gen, width, _, _ in list(poller.samples):
            if t >= start and i not in trained and gen is not None and width is not None \
                    and gen >= target[0] and width >= target[1]:
                trained[i] = round(t - start, 3)
        elapsed = poller.mark() - start
        done = len(trained) == len(devs) and elapsed >= max(3.0, max(trained.values()) + 2.0)
        if done or elapsed >= seconds:
            dev.load_finish()
            return elapsed


class TorchDevices:
    """The real GPUs, through torch and NVML (nvidia-ml-py)."""

    threaded = True  # the wall clock: NVML is polled by its own thread while the load runs
    clock = staticmethod(time.monotonic)
    def __init__(self):
        self.label: dict = {}
        import pynvml
        import torch

        self.torch, self.nvml = torch, pynvml
        self.versions = {"torch": torch.__version__, "cuda": torch.version.cuda}

    def unavailable(self) -> str | None:
        if not self.torch.cuda.is_available():
            return "torch sees no CUDA device (torch.cuda.is_available() is False)"
        return None

    def count(self) -> int:
        return self.torch.cuda.device_count()

    def describe(self, d: int) -> tuple[str, str]:
        p = self.torch.cuda.get_device_properties(d)
        bus = f"{getattr(p, 'pci_domain_id', 0):08x}:{getattr(p, 'pci_bus_id', 0):02x}:" \
              f"{getattr(p, 'pci_device_id', 0):02x}.0"
        return p.name, bus

    def _timed(self, fn, stream, samples: int) -> list[float]:
        torch, out = self.torch, []
        for _ in range(samples):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(stream)
            fn()
            e.record(stream)
            e.synchronize()
            out.append(s.elapsed_time(e))
        return out

    def load_prepare(self, devs: list[int]) -> None:
        torch = self.torch
        self.mats = {d: torch.randn(8192, 8192, dtype=torch.bfloat16, device=d) for d in devs}
        self.hosts = {d: torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True) for d in devs}
        self.bufs = {d: torch.empty(64 << 20, dtype=torch.uint8, device=d) for d in devs}

    def load_step(self, devs: list[int]) -> None:
        torch = self.torch
        for d in devs:
            with torch.cuda.device(d):
                m = self.mats[d]
                for _ in range(4):
                    m = (m @ self.mats[d]).clamp_(-1, 1)
                self.bufs[d].copy_(self.hosts[d], non_blocking=True)
        for d in devs:
            torch.cuda.synchronize(d)

    def load_finish(self) -> None:
        self.mats = self.hosts = self.bufs = {}

    def host_copy_ms(self, d: int, nbytes: int, samples: int) -> tuple[list[float], list[float]]:
        torch = self.torch
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(nbytes, dtype=torch.uint8, device=d)
        with torch.cuda.device(d):
            st = torch.cuda.current_stream()
            for _ in range(2):  # warm-up
                gpu.copy_(host, non_blocking=True)
                host.copy_(gpu, non_blocking=True)
            torch.cuda.synchronize(d)
            h2d = self._timed(lambda: gpu.copy_(host, non_blocking=True), st, samples)
            d2h = self._timed(lambda: host.copy_(gpu, non_blocking=True), st, samples)
        return h2d, d2h

    def peer_access(self, a: int, b: int) -> bool:
        return self.torch.cuda.can_device_access_peer(a, b)

    def _pair_buffers(self, a: int, b: int, nbytes: int):
        torch = self.torch
        key = (a, b, nbytes)
        if getattr(self, "_pb_key", None) != key:
            src = torch.empty(nbytes, dtype=torch.uint8, device=a)
            dst = torch.empty(nbytes, dtype=torch.uint8, device=b)
            back_src = torch.empty(nbytes, dtype=torch.uint8, device=b)
            back_dst = torch.empty(nbytes, dtype=torch.uint8, device=a)
            for _ in range(2):  # torch enables peer access lazily, on the first copy: warm up both ways
                dst.copy_(src)
                back_dst.copy_(back_src)
            torch.cuda.synchronize(a)
            torch.cuda.synchronize(b)
            self._pb_key, self._pb = key, (src, dst, back_src, back_dst)
        return self._pb

    def peer_copy_ms(self, a: int, b: int, nbytes: int, samples: int) -> list[float]:
        torch = self.torch
        src, dst, _, _ = self._pair_buffers(a, b, nbytes)
        with torch.cuda.device(a):
            st = torch.cuda.current_stream()  # a cross-device copy_ runs on the source device's current stream
            return self._timed(lambda: dst.copy_(src, non_blocking=True), st, samples)

    def peer_bidir_ms(self, a: int, b: int, nbytes: int, samples: int) -> list[float]:
        """Both directions at once: each copy on its own pair of streams so neither waits for the other."""
        torch = self.torch
        src, dst, back_src, back_dst = self._pair_buffers(a, b, nbytes)
        s1a, s1b = torch.cuda.Stream(device=a), torch.cuda.Stream(device=b)
        s2a, s2b = torch.cuda.Stream(device=a), torch.cuda.Stream(device=b)
        walls = []
        for _ in range(samples):
            torch.cuda.synchronize(a)
            torch.cuda.synchronize(b)
            t0 = time.perf_counter()
            with torch.cuda.stream(s1a), torch.cuda.stream(s1b):
                dst.copy_(src, non_blocking=True)
            with torch.cuda.stream(s2b), torch.cuda.stream(s2a):
                back_dst.copy_(back_src, non_blocking=True)
            torch.cuda.synchronize(a)
            torch.cuda.synchronize(b)
            walls.append((time.perf_counter() - t0) * 1000)
        return walls

    def peer_latency_us(self, a: int, b: int, n: int) -> float:
        """Small-copy latency, GPU-timed over a back-to-back batch."""
        torch = self.torch
        tiny_s = torch.zeros(1, dtype=torch.int32, device=a)
        tiny_d = torch.zeros(1, dtype=torch.int32, device=b)
        tiny_d.copy_(tiny_s)
        with torch.cuda.device(a):
            st = torch.cuda.current_stream()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(st)
            for _ in range(n):
                tiny_d.copy_(tiny_s, non_blocking=True)
            e.record(st)
            e.synchronize()
        return s.elapsed_time(e) * 1000 / n

    def staged_copy_ms(self, a: int, b: int, nbytes: int, samples: int) -> list[float]:
        """The host-staged baseline: what the same bytes cost without P2P."""
        torch = self.torch
        src, dst, _, _ = self._pair_buffers(a, b, nbytes)
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        walls = []
        for _ in range(samples):
            torch.cuda.synchronize(a)
            t0 = time.perf_counter()
            host.copy_(src)
            dst.copy_(host)
            torch.cuda.synchronize(b)
            walls.append((time.perf_counter() - t0) * 1000)
        return walls

    def peer_integrity(self, a: int, b: int, n: int, seed: int) -> dict:
        torch = self.torch
        g = torch.Generator(device="cpu").manual_seed(seed)
        pattern = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, generator=g)
        src_i = pattern.to(a)
        dst_i = torch.empty_like(src_i, device=b)
        dst_i.copy_(src_i)
        torch.cuda.synchronize(b)
        got = dst_i.cpu()
        return {"equal": bool(torch.equal(got, pattern)), "mismatches": int((got != pattern).sum()),
                "zeros": int((got == 0).sum())}


def devices(spec: dict | None):
    """The backend the parent named: None for the real GPUs, else a module with `open(root)`."""
    if spec is None:
        return TorchDevices()
    return importlib.import_module(spec["module"]).open(Path(spec["root"]))


def main(cfg: dict) -> dict:
    dev = devices(cfg.get("backend"))
    why = dev.unavailable()
    if why:
        return {"error": why}
    nv = dev.nvml
    nv.nvmlInit()
    n = dev.count()
    handles, gpus = [], []
    for d in range(n):
        name, bus = dev.describe(d)
        try:
            h = nv.nvmlDeviceGetHandleByPciBusId(bus)
        except nv.NVMLError:
            h = nv.nvmlDeviceGetHandleByIndex(d)
        handles.append(h)
        gpus.append({"index": d, "name": name, "bus_id": bus})
    poller = Poller(nv, handles, cfg["poll_ms"], dev.clock)
    for i, h in enumerate(handles):
        _, _, gen, width, replay, _ = poller.read(i, h)
        gpus[i].update(idle={"gen": gen, "width": width}, replay_before=replay,
                       max_gen=nvq(nv, nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
                       max_width=nvq(nv, nv.nvmlDeviceGetMaxPcieLinkWidth, h))
    if dev.threaded:
        poller.start()
    trained: dict[int, float] = {}
    load_s = load(dev, list(range(n)), cfg["load_seconds"], poller, (cfg["min_gen"], cfg["min_width"]), trained,
                  dev.threaded)
    nbytes = cfg["sample_mib"] << 20
    for d in range(n):
        gpus[d]["host"] = host_bandwidth(dev, d, nbytes, cfg["samples"])
    pairs = [pair(dev, a, b, nbytes, cfg["samples"]) for a in range(n) for b in range(n) if a != b]
    if dev.threaded:
        poller.stop_ev.set()
        poller.join()
    for i, h in enumerate(handles):
        mine = [s for s in poller.samples if s[1] == i]
        best = max(((s[2], s[3]) for s in mine if s[2] is not None and s[3] is not None), default=(None, None))
        gpus[i].update(trained_after_s=trained.get(i), max_seen={"gen": best[0], "width": best[1]},
                       replay_after=nvq(nv, nv.nvmlDeviceGetPcieReplayCounter, h),
                       app_clocks_reason_under_load=any(s[5] & APP_CLOCKS_REASON for s in mine))
    trace = [list(s[:4]) for s in poller.samples]
    nv.nvmlShutdown()
    return {**dev.label, **dev.versions, "device_count": n, "gpus": gpus,
            "pairs": pairs, "load_seconds": round(load_s, 3), "poll_ms": cfg["poll_ms"],
            "target": {"gen": cfg["min_gen"], "width": cfg["min_width"]}, "trace": trace[-4000:]}


if __name__ == "__main__":
    try:
        doc = main(json.loads(sys.argv[1]))
    except Exception as e:  # report, never hang or crash silently: the parent judges
        doc = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(doc))
