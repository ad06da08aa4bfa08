"""A SIMULATED inference engine for the simulated host: refuses bad flags the way ninfer-serve
does, logs its start-up, then serves /health (503 while "loading", then 200) on the profile's
address, and completions with the engine's own accounting of them (p2pkit/sim/serving.py). It
stands in for the engine the engine stage would compile."""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# The options ninfer-serve knows (after the artifact path; `--flag value` only, `--flag=value` is
# "unknown option"): REFERENCE.md, "Engines" (--tp, --devices, --kv-dtype, --kv-capacity, --spec,
# --draft-tokens, --lm-head-draft, --vision, --vision-device, --request-log-jsonl) and its serving and
# budget options (--host, --port, --model-id, --max-context, --max-concurrency, --prefill-chunk,
# --default-max-tokens, --media-cache-mib, --media-live-mib). The simulator's own list, never the
# product's flag table: a flag the product wrongly believes known fails here as it would on the engine.
NINFER_SERVE_FLAGS = frozenset({
    "host", "port", "model-id", "tp", "devices", "max-context", "max-concurrency", "prefill-chunk", "kv-dtype",
    "kv-capacity", "spec", "draft-tokens", "lm-head-draft", "default-max-tokens", "vision", "vision-device",
    "media-cache-mib", "media-live-mib", "request-log-jsonl",
})
# vLLM's OpenAI server's options the simulated node accepts (vllm/entrypoints/openai/cli_args.py and
# vllm/engine/arg_utils.py: `vllm serve --help`); anything else is "unrecognized arguments", as argparse says.
VLLM_SERVE_FLAGS = frozenset({
    "host", "port", "served-model-name", "load-format", "tensor-parallel-size", "nnodes", "node-rank",
    "master-addr", "master-port", "distributed-executor-backend", "headless", "max-model-len", "max-num-seqs",
    "gpu-memory-utilization", "no-enable-prefix-caching", "enable-chunked-prefill", "max-num-batched-tokens",
    "long-prefill-token-threshold", "enforce-eager", "enable-auto-tool-choice", "tool-call-parser",
    "reasoning-parser", "speculative-config", "kv-cache-dtype", "dtype",
})

LOAD_SECONDS = float(os.environ.get("P2PKIT_SIM_LOAD_SECONDS", "1.5"))
# loading also lasts until this many /health requests were answered 503: a wait that must see the
# load is proven by an event, not by a time window a busy machine can miss
LOAD_POLLS = int(os.environ.get("P2PKIT_SIM_LOAD_POLLS", "0"))


def loading_done(started: float):
    polls = [0]

    def ready() -> bool:
        polls[0] += 1
        return polls[0] > LOAD_POLLS and time.monotonic() - started >= LOAD_SECONDS
    return ready


def parse(argv: list[str]) -> tuple[str, dict]:
    if not argv or argv[0].startswith("-"):
        raise SystemExit("error: the artifact path comes first")
    artifact, flags, it = argv[0], {}, iter(argv[1:])
    for a in it:
        if not a.startswith("--") or "=" in a:
            raise SystemExit(f"error: unknown option {a}")
        name = a[2:]
        if name not in NINFER_SERVE_FLAGS:
            raise SystemExit(f"error: unknown option {a}")
        if name in ("lm-head-draft", "vision"):
            flags[name] = True
        else:
            flags[name] = next(it, None)
    return artifact, flags


def loaded_module(artifact: str) -> dict | bool | None:
    """The host's loaded nvidia module as the GPUs the engine opens would show it: its record, or False when none
    is loaded. On a container host (a real OS whose reboots and rollbacks really unload the module) always; on a
    directory host once one of its boots tried to load it (its state records what modprobe said: after a rollback
    of both driver stages and a reboot, "Module nvidia not found"). None where a directory host was laid out
    without a module and never booted to load one (the stage tests that start the engine on such a host). The
    state file, .p2pkit-sim/state.json, is the first above the artifact that holds one (a container host's is /)."""
    for d in Path(artifact).resolve().parents:
        try:
            doc = json.loads((d / ".p2pkit-sim/state.json").read_text())
        except (OSError, ValueError):
            continue
        module = doc.get("module") or {}
        if module.get("loaded"):
            return module["loaded"]
        if doc.get("layout") == "container" or module.get("load_error"):
            return False
        return None
    return None


def main() -> None:
    print("ninfer-serve (SIMULATED) starting", flush=True)
    artifact, f = parse(sys.argv[1:])
    try:  # read as the engine reads it, as the unit's user: a model it may not read stops it here
        with open(artifact, "rb") as fh:
            fh.read(8)
    except OSError as e:
        raise SystemExit(f"error: cannot open artifact {artifact}: {e.strerror}") from None
    fail = os.environ.get("P2PKIT_SIM_ENGINE_FAIL", "")
    if f.get("tp") == "2" and f.get("spec") == "dflash2" and not f.get("lm-head-draft"):
        raise SystemExit("Engine tp 2 DFlash2 requires the optimized proposal head")
    mod = loaded_module(artifact)
    if mod is False:  # no nvidia module loaded: CUDA finds no device (cudaErrorNoDevice's string)
        raise SystemExit("CUDA error: no CUDA-capable device is detected (SIMULATED: the nvidia module is not "
                         "loaded)")
    print(f"loading {artifact}", flush=True)
    if f.get("tp") == "2":
        p2p = mod is None or bool(mod.get("patched"))  # GeForce P2P only with the patched module
        print(f"tp 2 on devices {f.get('devices')}: all-reduce p2p {'on' if p2p else 'off (shared memory)'}",
              flush=True)
    if fail == "kv":
        raise SystemExit("FATAL: KV cache does not fit: need 9.4 GiB, 7.3 GiB free (short by 2.1 GiB)")
    if f.get("spec"):
        print(f"spec {f['spec']}: draft tokens {f.get('draft-tokens')}, lm-head-draft "
              f"{'on' if f.get('lm-head-draft') else 'off'}", flush=True)
    from p2pkit.sim import serving

    log = serving.NinferLog(f.get("request-log-jsonl"), sys.argv[1:], artifact)
    chat = serving.ninfer_chat(log, f.get("model-id") or "qwen3.6-27b", f.get("spec") or "none",
                               int(f.get("draft-tokens") or 0) if f.get("spec") else 0)
    serve_health(f.get("host"), f.get("port") or 12435, loading_done(time.monotonic()),
                 f"listening on {f.get('host')}:{f.get('port')}", post={"/v1/chat/completions": chat})


def serve_health(host: str | None, port, ready, announce: str, post: dict | None = None,
                 get: dict | None = None) -> None:
    """/health on host:port: 200 once ready() says so, 503 while loading; `announce` printed once
    the port is bound; forever. `post` and `get` map further paths to handlers: POST ones take the
    JSON body and return (status, JSON), GET ones return (status, content type, bytes)."""
    post, get = post or {}, get or {}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path in get:
                self._send(*get[self.path]())
                return
            if self.path != "/health":
                self.send_error(404)
                return
            ok = ready()
            self._send(200 if ok else 503, "application/json",
                       json.dumps({"status": "ok" if ok else "loading"}).encode())

        def do_POST(self):
            handle = post.get(self.path)
            if handle is None:
                self.send_error(404)
                return
            if not ready():
                self._send(503, "application/json", json.dumps({"error": {"message": "loading"}}).encode())
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                self._send(400, "application/json", json.dumps({"error": {"message": "invalid JSON"}}).encode())
                return
            status, doc = handle(body)
            self._send(status, "application/json", json.dumps(doc).encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    print(announce, flush=True)
    server.serve_forever()

# ---------------------------------------------------------------------------------------- vLLM

VLLM_BOOL = {"headless", "enforce-eager", "no-enable-prefix-caching", "enable-chunked-prefill",
             "enable-auto-tool-choice"}


def vllm_help() -> str:
    """The simulated server's `--help=all`: argparse's option lines (`  --name NAME` for a value, `  --name` for a
    switch, two spaces and the description), as vLLM 0.32.0's prints them, for the simulator's own flags."""
    lines = ["usage: api_server.py [-h] [options]  (SIMULATED vLLM)", "", "options:"]
    for name in sorted({*VLLM_SERVE_FLAGS, "model"}):
        arg = "" if name in VLLM_BOOL else " " + name.upper().replace("-", "_")
        lines.append(f"  --{name}{arg}  (SIMULATED)")
    return "\n".join(lines) + "\n"


def parse_vllm(argv: list[str]) -> dict:
    if "--help=all" in argv or "--help" in argv:
        print(vllm_help(), end="")
        raise SystemExit(0)
    flags, it = {}, iter(argv)
    for a in it:
        name = a[2:] if a.startswith("--") else None
        if name is None or "=" in a or (name not in VLLM_SERVE_FLAGS and name != "model"):
            raise SystemExit(f"api_server.py: error: unrecognized arguments: {a}")
        flags[name] = True if name in VLLM_BOOL else next(it, None)
    return flags


def _nccl_lines(rank: int, peer: int) -> list[str]:
    """What NCCL_DEBUG=INFO prints as the communicator forms: RoCE when NCCL_IB_HCA names a port
    (P24), the TCP socket fallback otherwise (P23)."""
    hca = os.environ.get("NCCL_IB_HCA", "")
    via = "NET/IB/0" if hca else "NET/Socket/0"
    tag = f"sim-spark:{os.getpid()}:{os.getpid()} [0]"
    head = [f"{tag} NCCL INFO NCCL_IB_HCA set to {hca}"] if hca else [f"{tag} NCCL INFO NET/IB : No device found."]
    return [*head, f"{tag} NCCL INFO Using network {'IB' if hca else 'Socket'}",
            f"{tag} NCCL INFO Channel 00/0 : {rank}[0] -> {peer}[0] [send] via {via}"]


def _map_ple_table() -> list:
    """The seed's tree with VLLM_PLE_MMAP=1 mmaps the n-gram table and advises MADV_RANDOM (P26): done
    here for real, so /proc/PID/smaps shows the mapping with `rr` as the real engine's would."""
    import mmap

    d = os.environ.get("VLLM_PLE_MMAP_DIR")
    if os.environ.get("VLLM_PLE_MMAP") != "1" or not d or not os.path.isdir(d):
        return []
    maps = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as fh:
            m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
        m.madvise(mmap.MADV_RANDOM)
        maps.append(m)
    print(f"INFO PLE n-gram table mmapped from {d} (MADV_RANDOM, SIMULATED)", flush=True)
    return maps


def vllm_main() -> None:
    """A SIMULATED `vllm serve` (`python -m vllm.entrypoints.cli.main serve`): the head (node-rank 0) opens its
    rendezvous port and serves /health 503 until every worker joined and the load time passed; a
    headless worker must find the head's port at start or it exits (why the worker starts after
    the head, P27)."""
    import socket
    import threading

    f = parse_vllm(sys.argv[1:])
    print("INFO vLLM API server (SIMULATED) starting", flush=True)
    table = _map_ple_table()  # noqa: F841 (kept mapped while the server runs)
    model = f.get("model") or ""
    if not os.path.isdir(model):
        raise SystemExit(f"ValueError: model path {model} does not exist")
    nnodes, rank = int(f.get("nnodes") or 1), int(f.get("node-rank") or 0)
    addr, mport = f.get("master-addr") or "127.0.0.1", int(f.get("master-port") or 29500)
    if nnodes > 1 and rank > 0:
        deadline = time.monotonic() + 3
        while True:
            try:
                conn = socket.create_connection((addr, mport), timeout=2)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise SystemExit(f"RuntimeError: node {rank} cannot reach the head at {addr}:{mport}: {e}") from e
                time.sleep(0.2)
        conn.settimeout(None)  # from here on the worker lives as long as the head does
        conn.sendall(f"hello rank={rank}\n".encode())
        conn.recv(16)
        for line in _nccl_lines(rank, 0):
            print(line, flush=True)
        print(f"INFO node {rank} joined the head at {addr}:{mport} (headless)", flush=True)
        while conn.recv(16):
            pass
        raise SystemExit("RuntimeError: the head closed the connection")
    joined = {"n": 0, "at": None if nnodes > 1 else time.monotonic()}
    if nnodes > 1:
        srv = socket.create_server((addr, mport))
        print(f"INFO rendezvous at {addr}:{mport} open at {time.time():.3f}: waiting for {nnodes - 1} node(s)",
              flush=True)

        def accept() -> None:
            keep = []
            while True:
                c, _ = srv.accept()
                c.settimeout(5)
                try:
                    hello = c.recv(64).decode()
                except OSError:
                    hello = ""
                if not hello.startswith("hello"):
                    c.close()  # a readiness probe, not a node
                    continue
                c.sendall(b"ok\n")
                keep.append(c)
                joined["n"] += 1
                if joined["n"] == nnodes - 1:
                    for line in _nccl_lines(0, 1):
                        print(line, flush=True)
                    print(f"INFO all {nnodes} nodes joined; loading {model}", flush=True)
                    joined["at"] = time.monotonic()

        threading.Thread(target=accept, daemon=True).start()

    from p2pkit.sim import serving

    name = f.get("served-model-name") or serving.host_view(model)
    spec = json.loads(f.get("speculative-config") or "{}")
    window = int(spec.get("num_speculative_tokens") or 0)
    import prometheus_client

    prometheus_client.disable_created_metrics()  # vLLM's multiprocess registry exposes no _created samples
    metrics = serving.VllmMetrics(name, int(f.get("max-model-len") or 8192), window)
    serve_health(f.get("host"), f.get("port") or 8000,
                 lambda: joined["at"] is not None and time.monotonic() - joined["at"] >= LOAD_SECONDS,
                 f"INFO API on {f.get('host')}:{f.get('port')}",
                 post={"/v1/completions": serving.vllm_completions(metrics, name, window)},
                 get={"/metrics": lambda: (200, "text/plain; version=0.0.4; charset=utf-8", metrics.text())})


if __name__ == "__main__":
    main()
