"""A short NCCL all-reduce across the GPU pair, in its own process and in the engine's environment
(P28, P30): `python -m p2pkit.load.nccl_allreduce CONFIG_JSON`.

It loads the NCCL the engine uses (the profile's, by path) and the driver API (libcuda) through ctypes,
so no second NCCL (torch's) is in the process: ncclCommInitAll over GPUs 0 and 1 (as llama.cpp does),
one float32 all-reduce of ones, each GPU's result compared with 2.0 exactly. NCCL_DEBUG=INFO makes it
print its channel lines ("via P2P/..." or "via SHM/..."), which the parent judges; the parent also
holds the timeout, since a static-BAR1 fault hangs inside ncclCommInitAll with no error. The last
stdout line is this process's JSON result. On a simulated host the parent names its device
backend, whose `nccl_allreduce(root, env)` prints and returns the same way.
"""

from __future__ import annotations

import ctypes
import json
import struct
import sys
import time

NCCL_FLOAT32, NCCL_SUM = 7, 0
ONE = 0x3F800000  # 1.0f as bits


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _cu(lib, name: str, *args) -> None:
    r = getattr(lib, name)(*args)
    if r != 0:
        raise RuntimeError(f"{name} returned CUDA error {r}")


def _nccl(lib, name: str, *args) -> None:
    r = getattr(lib, name)(*args)
    if r != 0:
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{name} failed: {lib.ncclGetErrorString(r).decode()} ({r})")


def main(cfg: dict) -> dict:
    backend = cfg.get("backend")
    if backend:  # a simulated host's devices: its stand-in answers as the GPUs and NCCL would
        import importlib
        import os

        return importlib.import_module(backend["module"]).nccl_allreduce(backend["root"], dict(os.environ))
    t0 = time.monotonic()
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return {"error": f"the CUDA driver library is not loadable: {e}"}
    try:
        nccl = ctypes.CDLL(cfg.get("lib") or "libnccl.so.2")
    except OSError as e:
        return {"error": f"NCCL is not loadable ({cfg.get('lib') or 'libnccl.so.2'}): {e}"}
    _cu(cuda, "cuInit", 0)
    n = ctypes.c_int()
    _cu(cuda, "cuDeviceGetCount", ctypes.byref(n))
    gpus = int(cfg.get("gpus", 2))  # the pair; 1 proves the bindings on a one-GPU machine
    if n.value < gpus:
        return {"error": f"{n.value} GPU(s) visible: the all-reduce needs {gpus}"}
    devs = tuple(range(gpus))
    want = f32_bits(float(gpus))  # a sum of ones over every GPU
    version = ctypes.c_int()
    _nccl(nccl, "ncclGetVersion", ctypes.byref(version))
    count = max(1, cfg.get("bytes", 8 << 20) // 4)
    ctxs, bufs, streams = [], [], []
    for d in devs:
        dev, ctx, buf, st = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_void_p()
        _cu(cuda, "cuDeviceGet", ctypes.byref(dev), d)
        _cu(cuda, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        _cu(cuda, "cuCtxSetCurrent", ctx)
        _cu(cuda, "cuMemAlloc_v2", ctypes.byref(buf), ctypes.c_size_t(count * 4))
        _cu(cuda, "cuMemsetD32_v2", buf, ctypes.c_uint(ONE), ctypes.c_size_t(count))
        _cu(cuda, "cuStreamCreate", ctypes.byref(st), 0)
        ctxs.append(ctx)
        bufs.append(buf)
        streams.append(st)
    comms = (ctypes.c_void_p * gpus)()
    devlist = (ctypes.c_int * gpus)(*devs)
    _nccl(nccl, "ncclCommInitAll", comms, gpus, devlist)
    init_s = time.monotonic() - t0
    _nccl(nccl, "ncclGroupStart")
    for d in devs:
        _cu(cuda, "cuCtxSetCurrent", ctxs[d])
        _nccl(nccl, "ncclAllReduce", ctypes.c_void_p(bufs[d].value), ctypes.c_void_p(bufs[d].value),
              ctypes.c_size_t(count), NCCL_FLOAT32, NCCL_SUM, ctypes.c_void_p(comms[d]), streams[d])
    _nccl(nccl, "ncclGroupEnd")
    wrong = []
    for d in devs:
        _cu(cuda, "cuCtxSetCurrent", ctxs[d])
        _cu(cuda, "cuStreamSynchronize", streams[d])
        host = (ctypes.c_uint32 * count)()
        _cu(cuda, "cuMemcpyDtoH_v2", host, bufs[d], ctypes.c_size_t(count * 4))
        bad = sum(1 for v in host if v != want)
        wrong.append(bad)
    for d in devs:
        nccl.ncclCommDestroy(ctypes.c_void_p(comms[d]))
    v = version.value
    return {"nccl_version": f"{v // 10000}.{v // 100 % 100}.{v % 100}", "elements": count, "wrong": wrong,
            "init_s": round(init_s, 3), "seconds": round(time.monotonic() - t0, 3)}


if __name__ == "__main__":
    try:
        doc = main(json.loads(sys.argv[1]))
    except Exception as e:  # report, never crash silently: the parent judges
        doc = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.flush()
    print(json.dumps(doc), flush=True)
