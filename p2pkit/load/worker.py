"""Link training under load, host<->device and P2P bandwidth, latency and integrity.

Never locks clocks (P04): the load is real compute. GB = 1e9 bytes. Timings use CUDA events
where the copy runs on one stream; wall time around full synchronisation where it cannot.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time

os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

APP_CLOCKS_REASON = 0x2  # nvmlClocksEventReasonApplicationsClocksSetting (also set by locked clocks)


def nvq(nv, fn, h):
    """An NVML reading, or None where the GPU does not report it (NOT_SUPPORTED: no PCIe link to read)."""
    try:
        return fn(h)
    except nv.NVMLError:
        return None


class Poller(threading.Thread):
    """NVML link gen/width, replay counter and clock event reasons every poll_ms."""

    def __init__(self, handles, poll_ms: int):
        super().__init__(daemon=True)
        import pynvml

        self.nv, self.handles, self.poll = pynvml, handles, poll_ms / 1000
        self.t0 = time.monotonic()
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
        return (round(time.monotonic() - self.t0, 3), i, nvq(nv, nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                nvq(nv, nv.nvmlDeviceGetCurrPcieLinkWidth, h), nvq(nv, nv.nvmlDeviceGetPcieReplayCounter, h), reasons)

    def run(self):
        while not self.stop_ev.is_set():
            for i, h in enumerate(self.handles):
                self.samples.append(self.read(i, h))
            self.stop_ev.wait(self.poll)

    def mark(self) -> float:
        return time.monotonic() - self.t0


def median_gbps(nbytes: int, ms: list[float]) -> float:
    return nbytes / (statistics.median(ms) / 1000) / 1e9


def timed_events(torch, fn, stream, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(stream)
        fn()
        e.record(stream)
        e.synchronize()
        out.append(s.elapsed_time(e))
    return out


def host_bandwidth(torch, dev: int, nbytes: int, samples: int) -> dict:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    with torch.cuda.device(dev):
        st = torch.cuda.current_stream()
        for _ in range(2):  # warm-up
            gpu.copy_(host, non_blocking=True)
            host.copy_(gpu, non_blocking=True)
        torch.cuda.synchronize(dev)
        h2d = timed_events(torch, lambda: gpu.copy_(host, non_blocking=True), st, samples)
        d2h = timed_events(torch, lambda: host.copy_(gpu, non_blocking=True), st, samples)
    return {"h2d_gbps": median_gbps(nbytes, h2d), "d2h_gbps": median_gbps(nbytes, d2h),
            "h2d_ms": h2d, "d2h_ms": d2h, "bytes": nbytes}


def pair(torch, a: int, b: int, nbytes: int, samples: int) -> dict:
    out: dict = {"from": a, "to": b, "peer_access": bool(torch.cuda.can_device_access_peer(a, b))}
    src = torch.empty(nbytes, dtype=torch.uint8, device=a)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=b)
    back_src = torch.empty(nbytes, dtype=torch.uint8, device=b)
    back_dst = torch.empty(nbytes, dtype=torch.uint8, device=a)
    for _ in range(2):  # torch enables peer access lazily, on the first copy: warm up both ways
        dst.copy_(src)
        back_dst.copy_(back_src)
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)
    with torch.cuda.device(a):
        st = torch.cuda.current_stream()  # a cross-device copy_ runs on the source device's current stream
        ms = timed_events(torch, lambda: dst.copy_(src, non_blocking=True), st, samples)
    out["unidir_gbps"] = median_gbps(nbytes, ms)
    out["unidir_ms"] = ms
    # both directions at once: each copy on its own pair of streams so neither waits for the other
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
    out["bidir_gbps"] = median_gbps(2 * nbytes, walls)
    # small-copy latency, GPU-timed over a back-to-back batch
    tiny_s = torch.zeros(1, dtype=torch.int32, device=a)
    tiny_d = torch.zeros(1, dtype=torch.int32, device=b)
    n = 200
    tiny_d.copy_(tiny_s)
    with torch.cuda.device(a):
        st = torch.cuda.current_stream()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(st)
        for _ in range(n):
            tiny_d.copy_(tiny_s, non_blocking=True)
        e.record(st)
        e.synchronize()
    out["latency_us"] = s.elapsed_time(e) * 1000 / n
    # host-staged baseline: what the same bytes cost without P2P
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    walls = []
    for _ in range(samples):
        torch.cuda.synchronize(a)
        t0 = time.perf_counter()
        host.copy_(src)
        dst.copy_(host)
        torch.cuda.synchronize(b)
        walls.append((time.perf_counter() - t0) * 1000)
    out["staged_gbps"] = median_gbps(nbytes, walls)
    # integrity: a known pattern across, compared through the host (not through P2P)
    n_int = min(nbytes // 4, 16 << 20)
    g = torch.Generator(device="cpu").manual_seed(1234 + a * 16 + b)
    pattern = torch.randint(-(2**31), 2**31 - 1, (n_int,), dtype=torch.int32, generator=g)
    src_i = pattern.to(a)
    dst_i = torch.empty_like(src_i, device=b)
    dst_i.copy_(src_i)
    torch.cuda.synchronize(b)
    got = dst_i.cpu()
    out["integrity"] = {"elements": n_int, "equal": bool(torch.equal(got, pattern)),
                        "mismatches": int((got != pattern).sum()), "zeros": int((got == 0).sum())}
    return out


def matmul_load(torch, devs: list[int], seconds: float, poller: Poller, target: tuple[int, int],
                trained: dict) -> float:
    """Real compute and copies on every GPU until all trained (plus 2 s), at least 3 s, at most `seconds`."""
    mats = {d: torch.randn(8192, 8192, dtype=torch.bfloat16, device=d) for d in devs}
    hosts = {d: torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True) for d in devs}
    bufs = {d: torch.empty(64 << 20, dtype=torch.uint8, device=d) for d in devs}
    start = poller.mark()
    while True:
        for d in devs:
            with torch.cuda.device(d):
                m = mats[d]
                for _ in range(4):
                    m = (m @ mats[d]).clamp_(-1, 1)
                bufs[d].copy_(hosts[d], non_blocking=True)
        for d in devs:
            torch.cuda.synchronize(d)
        for t, i, gen, width, _, _ in list(poller.samples):
            if t >= start and i not in trained and gen is not None and width is not None \
                    and gen >= target[0] and width >= target[1]:
                trained[i] = round(t - start, 3)
        elapsed = poller.mark() - start
        done = len(trained) == len(devs) and elapsed >= max(3.0, max(trained.values()) + 2.0)
        if done or elapsed >= seconds:
            return elapsed


def main(cfg: dict) -> dict:
    import pynvml
    import torch

    if not torch.cuda.is_available():
        return {"error": "torch sees no CUDA device (torch.cuda.is_available() is False)"}
    pynvml.nvmlInit()
    n = torch.cuda.device_count()
    handles, gpus = [], []
    for d in range(n):
        p = torch.cuda.get_device_properties(d)
        bus = f"{getattr(p, 'pci_domain_id', 0):08x}:{getattr(p, 'pci_bus_id', 0):02x}:" \
              f"{getattr(p, 'pci_device_id', 0):02x}.0"
        try:
            h = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        except pynvml.NVMLError:
            h = pynvml.nvmlDeviceGetHandleByIndex(d)
        handles.append(h)
        gpus.append({"index": d, "name": p.name, "bus_id": bus})
    poller = Poller(handles, cfg["poll_ms"])
    for i, h in enumerate(handles):
        _, _, gen, width, replay, _ = poller.read(i, h)
        gpus[i].update(idle={"gen": gen, "width": width}, replay_before=replay,
                       max_gen=nvq(pynvml, pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                       max_width=nvq(pynvml, pynvml.nvmlDeviceGetMaxPcieLinkWidth, h))
    poller.start()
    trained: dict[int, float] = {}
    load_s = matmul_load(torch, list(range(n)), cfg["load_seconds"], poller,
                         (cfg["min_gen"], cfg["min_width"]), trained)
    nbytes = cfg["sample_mib"] << 20
    for d in range(n):
        gpus[d]["host"] = host_bandwidth(torch, d, nbytes, cfg["samples"])
    pairs = [pair(torch, a, b, nbytes, cfg["samples"]) for a in range(n) for b in range(n) if a != b]
    poller.stop_ev.set()
    poller.join()
    for i, h in enumerate(handles):
        mine = [s for s in poller.samples if s[1] == i]
        best = max(((s[2], s[3]) for s in mine if s[2] is not None and s[3] is not None), default=(None, None))
        gpus[i].update(trained_after_s=trained.get(i), max_seen={"gen": best[0], "width": best[1]},
                       replay_after=nvq(pynvml, pynvml.nvmlDeviceGetPcieReplayCounter, h),
                       app_clocks_reason_under_load=any(s[5] & APP_CLOCKS_REASON for s in mine))
    trace = [list(s[:4]) for s in poller.samples]
    pynvml.nvmlShutdown()
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "device_count": n, "gpus": gpus,
            "pairs": pairs, "load_seconds": round(load_s, 3), "poll_ms": cfg["poll_ms"],
            "target": {"gen": cfg["min_gen"], "width": cfg["min_width"]}, "trace": trace[-4000:]}


if __name__ == "__main__":
    try:
        doc = main(json.loads(sys.argv[1]))
    except Exception as e:  # report, never hang or crash silently: the parent judges
        doc = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(doc))
