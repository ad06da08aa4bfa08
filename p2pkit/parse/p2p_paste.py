"""What people paste when P2P is broken, beyond the system's own tools (issue 38, 8): the CUDA samples'
simpleP2P and p2pBandwidthLatencyTest, and a crash log of NCCL or PyTorch (with or without NCCL's own
version line). Each reader keeps what it saw and whether the paste reached its end, so a cut paste is
never read as a pass.

Sources (NVIDIA/cuda-samples, Samples/0_Introduction/simpleP2P/simpleP2P.cu and
Samples/5_Domain_Specific/p2pBandwidthLatencyTest/p2pBandwidthLatencyTest.cu; Common/helper_cuda.h):
- simpleP2P prints "> Peer access from NAME (GPUi) -> NAME (GPUj) : Yes|No", waives ("Two or more GPUs with
  Peer-to-Peer access capability are required ...", "Peer to Peer access is not available amongst GPUs in the
  system, waiving test.") when no pair has it, "cudaMemcpyPeer / cudaMemcpy between GPU0 and GPU1: N GB/s",
  "Verification error @ element I: val = V, ref = R" for each wrong element it reads back, and ends with
  "Test passed" or "Test failed!". checkCudaErrors prints "CUDA error at FILE:LINE code=N(cudaErrorName)
  "CALL"" and exits.
- p2pBandwidthLatencyTest prints "Device=i CAN|CANNOT Access Peer Device=j", the "P2P Connectivity Matrix",
  then bandwidth matrices (GB/s) and latency matrices (us) with P2P disabled and enabled; its cudaCheckError
  prints "Cuda failure FILE:LINE: 'MESSAGE'" and exits.
- NCCL's own lines ("HOST:PID:TID [DEV] NCCL INFO|WARN ..."; src/include/debug.h), PyTorch's
  ProcessGroupNCCL ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=N, OpType=OP, ...,
  Timeout(ms)=T) ran for M milliseconds before timing out", "NCCL error in: ..., unhandled cuda error ...",
  "ncclUnhandledCudaError: Call to CUDA function failed.", "Cuda failure 217 'peer access is not supported
  between these two devices'"). Recorded pastes: tests/fixtures/paste/README.md."""

from __future__ import annotations

import re

from p2pkit.parse import nccl

PEER = re.compile(r"^> Peer access from (?P<a>.+?) \(GPU(?P<i>\d+)\) -> (?P<b>.+?) \(GPU(?P<j>\d+)\) : (?P<ok>Yes|No)",
                  re.M)
CUDA_ERROR = re.compile(r"CUDA error at (?P<where>\S+?:\d+) code=(?P<code>\d+)\((?P<name>\w+)\)"
                        r"(?: \"(?P<call>[^\"]*)\")?")
VERIFY = re.compile(r"Verification error @ element (?P<i>\d+): val = (?P<val>\S+), ref = (?P<ref>\S+)")
SIMPLE_BW = re.compile(r"cudaMemcpyPeer / cudaMemcpy between GPU(\d+) and GPU(\d+): ([0-9.]+)\s*GB/s")
CAN = re.compile(r"^Device=(\d+) (CAN|CANNOT) Access Peer Device=(\d+)", re.M)
CUDA_FAILURE = re.compile(r"Cuda failure (?:(?P<code>\d+) )?(?:(?P<where>\S+?:\d+): )?'(?P<what>[^']+)'")
MATRIX_TITLE = re.compile(r"^(?P<title>.*P2P=(?:Enabled|Disabled).*Matrix \((?:GB/s|us)\))\s*$")
ROW = re.compile(r"^\s*(\d+)((?:\s+[0-9.]+)+)\s*$")
# spaces may be line breaks: posters wrap the line (vllm-project/vllm#42354)
WATCHDOG = re.compile(r"Watchdog caught collective operation timeout:\s+WorkNCCL\(SeqNum=(?P<seq>\d+),\s+"
                      r"OpType=(?P<op>\w+)[^)]*?Timeout\(ms\)=(?P<timeout>\d+)\)\s+ran\s+for\s+(?P<ran>\d+)\s+milliseconds")
# PyTorch's heartbeat monitor: the watchdog itself blocked in a CUDA or NCCL call that never returned
HEARTBEAT = re.compile(r"ProcessGroupNCCL's watchdog got stuck for (?P<s>\d+) seconds")
# vLLM names the NCCL it loaded in its own words (pynccl.py), without NCCL's "NCCL version" line
VLLM_NCCL = re.compile(r"vLLM is using nccl==(\d+\.\d+\.\d+)")
# NCCL's verbs failures between nodes: a transport retry timeout (error 12), a queue pair that cannot reach the peer
IB_FAILURE = re.compile(r"NCCL WARN (?P<what>NET/IB ?: Got completion .*?error 12\b.*|Call to ibv_modify_qp failed.*)$",
                        re.M)
SHARED_MEM = re.compile(r"ncclMaxSharedMem (?P<need>\d+) exceeds device/fn maxSharedMem (?P<has>\d+)")
NCCL_ERROR = re.compile(r"NCCL error in: \S+?, (?P<what>[^,\n(]+)")
NCCL_CODE = re.compile(r"\b(?P<code>ncclUnhandledCudaError|ncclSystemError|ncclInternalError|ncclInvalidUsage|"
                       r"ncclRemoteError|ncclInvalidArgument)\b")
WARN = re.compile(r"NCCL WARN (?P<what>.+)$", re.M)
ILLEGAL = re.compile(r"an illegal memory access was encountered|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS")

# CUDA's own error names and messages for what a broken P2P setup gives (cuda_runtime_api.h, cudaError)
PEER_UNSUPPORTED = ("cudaErrorPeerAccessUnsupported", "peer access is not supported between these two devices")
MAP_FAILED = ("cudaErrorMapBufferObjectFailed", "mapping of buffer object failed")
NO_KERNEL_IMAGE = ("cudaErrorNoKernelImageForDevice", "no kernel image is available for execution on the device")


def simple_p2p(text: str) -> dict:
    peers = [{"from": int(m["i"]), "to": int(m["j"]), "ok": m["ok"] == "Yes", "from_name": m["a"].strip(),
              "to_name": m["b"].strip()} for m in PEER.finditer(text)]
    bw = [{"from": int(a), "to": int(b), "gbps": float(g)} for a, b, g in SIMPLE_BW.findall(text)]
    return {"peers": peers, "bandwidth": bw,
            "waived": "waiving test" in text or "Peer-to-Peer access capability are required" in text,
            "cuda_errors": [m.groupdict() for m in CUDA_ERROR.finditer(text)],
            "verification_errors": [{"element": int(m["i"]), "val": m["val"], "ref": m["ref"]}
                                    for m in VERIFY.finditer(text)],
            "passed": bool(re.search(r"^Test passed", text, re.M)),
            "failed": bool(re.search(r"^Test failed", text, re.M))}


def p2p_bandwidth(text: str) -> dict:
    """Peer access, the connectivity matrix and every bandwidth and latency matrix it printed (title -> rows of
    floats, by device), and its Cuda failure line if it stopped."""
    can = {(int(i), int(j)): w == "CAN" for i, w, j in CAN.findall(text)}
    matrices: dict[str, dict[int, list[float]]] = {}
    lines = text.splitlines()
    for k, line in enumerate(lines):
        m = MATRIX_TITLE.match(line.strip())
        if not m:
            continue
        rows: dict[int, list[float]] = {}
        for nxt in lines[k + 1:]:
            if re.match(r"^\s*(D\\D|GPU|CPU)\s", nxt):
                if nxt.strip().startswith("CPU") and rows:
                    break  # the latency test's CPU block is another matrix
                continue
            r = ROW.match(nxt)
            if not r:
                break
            rows[int(r.group(1))] = [float(x) for x in r.group(2).split()]
        matrices[m["title"]] = rows
    failures = [m.groupdict() for m in CUDA_FAILURE.finditer(text)]
    return {"can": can, "matrices": matrices, "failures": failures, "devices": len(re.findall(r"^Device: \d+,", text,
                                                                                                 re.M)),
            "complete": "NOTE: The CUDA Samples are not meant for performance" in text}


def crash_log(text: str) -> dict:
    """What an NCCL or PyTorch log says of a failure, whether or not it carries NCCL's version line."""
    lines = text.splitlines()
    version = nccl.VERSION_LINE.search(text) or VLLM_NCCL.search(text)
    return {"version": version.group(1) if version else None,
            "timeouts": [{"seq": int(m["seq"]), "op": m["op"], "timeout_ms": int(m["timeout"]), "ran_ms": int(m["ran"])}
                         for m in WATCHDOG.finditer(text)],
            "watchdog_stuck_s": [int(m["s"]) for m in HEARTBEAT.finditer(text)],
            # NCCL < 2.29.3 on aarch64 loses proxy-op slots; the rank whose pool ran dry spins (or faults) here
            "local_op_append": "ncclLocalOpAppend" in text, "aarch64": "aarch64" in text,
            "ib_failures": [m["what"].strip() for m in IB_FAILURE.finditer(text)],
            "shared_mem": [m.groupdict() for m in SHARED_MEM.finditer(text)],
            "nccl_errors": sorted({m["what"].strip() for m in NCCL_ERROR.finditer(text)}),
            "nccl_codes": sorted({m["code"] for m in NCCL_CODE.finditer(text)}),
            "warnings": [m["what"].strip() for m in WARN.finditer(text)],
            "cuda_failures": [m.groupdict() for m in CUDA_FAILURE.finditer(text)],
            "transports": sorted({t for ln in lines if (t := nccl.transport(ln))}),
            "peer_unsupported": any(s in text for s in PEER_UNSUPPORTED),
            "map_failed": any(s in text for s in MAP_FAILED),
            "illegal_address": bool(ILLEGAL.search(text)),
            "torch_no_cuda": "Torch not compiled with CUDA enabled" in text,
            "no_kernel_image": any(s in text for s in NO_KERNEL_IMAGE)}
