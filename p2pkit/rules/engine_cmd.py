"""The engine's command line, built as a list from the profile, and the engine's own refusals
mirrored so that they come before a start, not after (P10, P11, P18, P20).

ninfer-serve takes the artifact first, then `--flag value` only (`--flag=value` is rejected as
unknown); booleans are bare flags. llama-server takes `-m MODEL` and the same `--flag value` form.
vLLM runs as `python -m vllm.entrypoints.openai.api_server --model DIR` with the same form; across
nodes each node has its --node-rank, and the workers are --headless (seed 004, P22, P27).
"""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.rules.findings import FAIL, PASS, WARN, Check, figure, judge, reading

NINFER_FLAGS = {
    "host", "port", "tp", "devices", "max-context", "kv-dtype", "kv-capacity", "max-concurrency",
    "prefill-chunk", "spec", "draft-tokens", "lm-head-draft", "default-max-tokens", "vision", "vision-device",
    "media-cache-mib", "media-live-mib", "model-id", "request-log-jsonl",
}
NINFER_KV_TP2 = {"bf16", "fp16", "fp8", "int8", "nvfp4"}
NINFER_SPECS = {"mtp", "dflash", "dflash2"}
LLAMACPP_FLAGS = {
    "host", "port", "n-gpu-layers", "split-mode", "tensor-split", "ctx-size", "flash-attn", "batch-size", "ubatch-size",
    "cache-type-k", "cache-type-v", "parallel", "kv-unified", "jinja", "spec-type", "spec-draft-n-max",
    "spec-draft-n-min", "metrics", "no-webui", "mmproj", "model-draft", "threads", "cache-ram",
}
VLLM_FLAGS = {
    "host", "port", "load-format", "tensor-parallel-size", "nnodes", "node-rank", "master-addr", "master-port",
    "distributed-executor-backend", "max-model-len", "max-num-seqs", "gpu-memory-utilization",
    "no-enable-prefix-caching", "enable-chunked-prefill", "max-num-batched-tokens", "long-prefill-token-threshold",
    "enforce-eager", "enable-auto-tool-choice", "tool-call-parser", "reasoning-parser", "speculative-config",
    "headless", "served-model-name",
}
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
BINARIES = {"ninfer": "build/apps/ninfer-serve", "llamacpp": "build/bin/llama-server"}


def binary(p: Profile) -> str:
    if p.engine.recipe == "vllm":
        return p.engine.python
    return f"{p.engine.build_dir}/{BINARIES.get(p.engine.recipe, 'bin/serve')}"


def model_path(p: Profile) -> str:
    """What the engine loads: the converted output, or for an HF-format model the source itself."""
    return p.model.output or (p.model.source if p.model.format == "hf" else "")


def served_model(p: Profile) -> str:
    """The model name an OpenAI request must give: vLLM's --served-model-name (its --model argument as
    given by default), NInfer's --model-id (ninfer-serve's default qwen3.6-27b)."""
    if p.engine.recipe == "ninfer":
        return str(p.serve.flags.get("model-id") or "qwen3.6-27b")
    return str(p.serve.flags.get("served-model-name") or model_path(p))


def request_log(p: Profile, host, state_dir):
    """Where NInfer's JSONL request log (--request-log-jsonl) is on this host, or None when the engine
    keeps none: a relative path is in the engine's working directory (the state directory's engine/)."""
    from pathlib import PurePosixPath

    name = p.serve.flags.get("request-log-jsonl")
    if not name or name is True:
        return None
    path = PurePosixPath(str(name))
    return host.path(str(path)) if path.is_absolute() else state_dir / "engine" / path


def _int(v, default: int | None) -> int | None:
    """A flag's integer value (TOML gives ints; a string of digits is accepted); None when it is not one."""
    if v is None:
        return default
    return int(v) if (isinstance(v, int) and not isinstance(v, bool)) or str(v).isdigit() else None


def node(p: Profile) -> dict:
    """This host's place in a multi-node engine: rank, how many, the head's rendezvous address.
    A value that is not a number reads as None, which the service checks refuse."""
    f = p.serve.flags
    n = _int(f.get("nnodes"), 1) or 1
    rank = _int(f.get("node-rank"), 0)
    role = "single" if n <= 1 else ("head" if rank == 0 else "worker")
    return {"nnodes": n, "rank": rank, "role": role, "master_addr": f.get("master-addr"),
            "master_port": _int(f.get("master-port"), None)}


def flags_of(p: Profile) -> dict:
    """The profile's flags with host and port from [serve] (the one place they are set); a headless
    vLLM worker serves no API, so it gets neither."""
    if p.engine.recipe == "vllm" and p.serve.flags.get("headless"):
        return dict(p.serve.flags)
    return {**p.serve.flags, "host": p.serve.host, "port": p.serve.port}


def client_host(p: Profile) -> str:
    """Where a client on this host reaches the engine: loopback when it listens on every address."""
    return "127.0.0.1" if p.serve.host in ("0.0.0.0", "::") else p.serve.host


def base_url(p: Profile) -> str:
    return f"http://{client_host(p)}:{p.serve.port}"


def health_url(p: Profile) -> str:
    return f"{base_url(p)}/health"


def argv(p: Profile) -> list[str]:
    out = [binary(p)]
    if p.engine.recipe == "ninfer":
        out.append(p.model.output)
    elif p.engine.recipe == "vllm":
        out += ["-m", VLLM_MODULE, "--model", model_path(p)]
    else:
        out += ["-m", p.model.output]
    for k, v in flags_of(p).items():
        if v is True:
            out.append(f"--{k}")
        elif v is False or v is None:
            continue
        else:
            out += [f"--{k}", str(v)]
    return out


def _devices(v) -> list[str]:
    return [d.strip() for d in str(v).split(",") if d.strip()]


def validate(p: Profile) -> list[Check]:
    flags = flags_of(p)
    known = {"ninfer": NINFER_FLAGS, "llamacpp": LLAMACPP_FLAGS, "vllm": VLLM_FLAGS}[p.engine.recipe]
    out = []
    unknown = sorted(set(flags) - known)
    out.append(judge("service.flags_known", "every serve flag is one the engine knows", not unknown,
                     ", ".join(unknown) or "all known", f"flags of {p.engine.recipe}",
                     f"remove or rename them; {p.engine.recipe} knows: {', '.join(sorted(known))}"))
    bad_form = sorted(k for k in flags if "=" in k or k.startswith("-"))
    if bad_form:
        out.append(Check("service.flags_form", "flags written as names", FAIL, ", ".join(bad_form),
                         "names without dashes or '='", "write serve.flags as `name = value` (p2pkit adds the "
                         "dashes; the engine rejects --flag=value)"))
    if "host" in flags:  # a headless vLLM worker listens nowhere
        out.append(_host(p))
    if p.engine.recipe == "ninfer":
        out += _ninfer(p, flags)
    elif p.engine.recipe == "llamacpp":
        out += _llamacpp(p, flags)
    else:
        out += _vllm(p, flags)
    return out


def _host(p: Profile) -> Check:
    if p.serve.host in ("0.0.0.0", "::"):
        return Check("service.listen", "listening address", WARN, p.serve.host, "127.0.0.1",
                     "serve.allow_public is set: the API is reachable from the network with no authentication; "
                     "put it behind a firewall or a reverse proxy")
    return Check("service.listen", "listening address", PASS, f"{p.serve.host}:{p.serve.port}", "127.0.0.1")


def _ninfer(p: Profile, f: dict) -> list[Check]:
    out = []
    tp = f.get("tp", 1)
    devices = _devices(f.get("devices", "0"))
    gpus = [str(i) for i in range(p.gpus.count)]
    out.append(reading("service.tp", "--tp is 1 or 2", PASS if tp in (1, 2) else FAIL, _int(tp, None), "count",
                       "1 or 2", "ninfer-serve runs --tp 1 or 2", missing=str(tp)))
    out.append(judge("service.devices", "--devices names exactly --tp GPUs of this host",
                     len(devices) == tp and set(devices) <= set(gpus) and len(set(devices)) == len(devices),
                     ",".join(devices), f"{tp} of {','.join(gpus)}",
                     f"set serve.flags.devices to {tp} distinct GPU ids among {','.join(gpus)}"))
    if f.get("vision") or "vision-device" in f:
        vd = str(f.get("vision-device", devices[0] if devices else "0"))
        out.append(judge("service.vision_device", "--vision-device is one of --devices", vd in devices, vd,
                         f"one of {','.join(devices)}", "set serve.flags.vision-device to one of the --devices"))
    spec = f.get("spec")
    if spec is not None:
        out.append(judge("service.spec", "--spec is a method the engine has", spec in NINFER_SPECS, spec,
                         "/".join(sorted(NINFER_SPECS)), "use mtp, dflash or dflash2"))
    if spec == "dflash2" and tp == 2:
        out.append(judge("service.lm_head_draft", "DFlash2 at TP2 has --lm-head-draft", f.get("lm-head-draft") is True,
                         bool(f.get("lm-head-draft")), True,
                         "the engine throws 'Engine tp 2 DFlash2 requires the optimized proposal head': set "
                         "serve.flags.lm-head-draft = true", pitfall="P10"))
    kv = f.get("kv-dtype")
    if kv is not None and tp == 2:
        out.append(judge("service.kv_dtype", "KV dtype the engine accepts at TP2", kv in NINFER_KV_TP2, kv,
                         "/".join(sorted(NINFER_KV_TP2)), "pick one of the accepted KV dtypes", pitfall="P11"))
    cap = f.get("kv-capacity", "auto")
    out.append(Check("service.kv_capacity", "--kv-capacity auto", PASS if cap == "auto" else WARN, cap, "auto",
                     "" if cap == "auto" else "a fixed KV capacity that does not fit is an OOM at start (the KV "
                     "dtype decides the pool size): use auto, and the engine fits it to the card", "P11"))
    # P20 was measured for MTP (seed 003: it pays at one slot only); seed 000 serves DFlash2 at
    # --max-concurrency 8 in production, the default profile's setting, so DFlash(2) is not held to one slot
    if spec is not None and spec not in ("dflash", "dflash2"):
        slots = f.get("max-concurrency", 1)
        out.append(figure("service.spec_slots", "speculative decoding with one slot", _int(slots, None), "==", 1,
                          "count", "speculative decoding pays at one concurrent slot; with more it can cost "
                          "throughput: benchmark wall throughput both ways", "P20", WARN, missing=str(slots)))
    return out


# llama-server's -np default: "number of server slots (default: -1, -1 = auto)" (its --help,
# tests/fixtures/llamacpp/llama-server-help.txt), and auto is 4 slots with a unified KV cache
# (tools/server/server.cpp of the vendored llama.cpp 0c1e570: "n_parallel is set to auto, using n_parallel = 4")
LLAMACPP_AUTO_SLOTS = "omitted: llama-server's default -1 = auto (4 slots)"


def llamacpp_spec(flags: dict) -> str | None:
    """llama-server's --spec-type when it turns drafting on: "none" (its default) and an empty value do not."""
    v = flags.get("spec-type")
    return None if v in (None, False, "", "none") else str(v)


def _llamacpp(p: Profile, f: dict) -> list[Check]:
    out = []
    if llamacpp_spec(f):
        np_ = f.get("parallel")
        shown = np_ if np_ is not None else LLAMACPP_AUTO_SLOTS
        out.append(figure("service.spec_slots", "speculative decoding with one slot", _int(np_, None), "==", 1,
                          "count", "MTP only pays at one concurrent slot: set serve.flags.parallel = 1 (the service "
                          "stage reads the running server's slots from /props)", "P20", WARN, missing=str(shown)))
    split = f.get("tensor-split")
    if split is not None:
        parts = str(split).split(",")
        out.append(judge("service.tensor_split", "--tensor-split names one share per GPU",
                         len(parts) == p.gpus.count, split, f"{p.gpus.count} shares",
                         f"give {p.gpus.count} comma-separated shares"))
    return out


def _vllm(p: Profile, f: dict) -> list[Check]:
    n = node(p)
    want_tp = p.profile.nodes * p.gpus.count
    out = [figure("service.tp", "--tensor-parallel-size spans every GPU of every node",
                  _int(f.get("tensor-parallel-size"), 1), "==", want_tp, "count",
                  f"set serve.flags.tensor-parallel-size = {want_tp} ({p.profile.nodes} node(s) x {p.gpus.count} GPU)",
                  missing=str(f.get("tensor-parallel-size")))]
    if p.profile.nodes > 1:
        out.append(figure("service.nnodes", "--nnodes is the profile's node count", n["nnodes"], "==",
                          p.profile.nodes, "count", f"set serve.flags.nnodes = {p.profile.nodes}"))
        out.append(judge("service.node_rank", "this node has its own --node-rank",
                         n["rank"] is not None and 0 <= n["rank"] < n["nnodes"],
                         n["rank"], f"0..{n['nnodes'] - 1}", "give each host its rank in the inventory: "
                         "p2pkit_set: {serve.flags.node-rank: 1} on the worker"))
        out.append(judge("service.rendezvous", "the head's rendezvous address is set",
                         bool(n["master_addr"]) and n["master_port"] is not None,
                         f"{n['master_addr'] or '(no master-addr)'}:{n['master_port'] or '(no master-port)'}",
                         "master-addr and master-port", "set serve.flags.master-addr to the head's fabric IP and "
                         "serve.flags.master-port (the same on every node)"))
        headless = bool(f.get("headless"))
        out.append(judge("service.headless", "workers run --headless, the head serves the API",
                         headless == ((n["rank"] or 0) > 0), "headless" if headless else "serves the API",
                         "headless" if (n["rank"] or 0) > 0 else "serves the API",
                         "set serve.flags.headless = true on the worker nodes only (p2pkit_set in the inventory)"))
        out.append(Check("service.ip_filter", "the unit talks to loopback and the fabric only",
                         PASS if p.network.fabric_cidr else WARN, p.network.fabric_cidr or "no IP filter",
                         "localhost and network.fabric_cidr", "" if p.network.fabric_cidr else
                         "the rendezvous and NCCL's bootstrap cross hosts, so loopback-only would cut them: set "
                         "network.fabric_cidr (like 10.10.0.0/24) and the unit allows only that and loopback"))
    table = p.serve.env.get("VLLM_PLE_MMAP_DIR")
    if table:
        on = str(p.serve.env.get("VLLM_PLE_MMAP", "")).lower() in ("1", "true")
        out.append(judge("service.ple_mmap", "the n-gram table is served by mmap", on,
                         f"VLLM_PLE_MMAP={p.serve.env.get('VLLM_PLE_MMAP', '(unset)')}", "VLLM_PLE_MMAP=1",
                         f"set serve.env.VLLM_PLE_MMAP = \"1\": the table at {table} must be mmapped from local NVMe "
                         "with MADV_RANDOM (seed 004)", pitfall="P26"))
    if "speculative-config" in f:
        seqs = _int(f.get("max-num-seqs"), None)
        out.append(figure("service.spec_slots", "speculative decoding with one sequence", seqs, "==", 1, "count",
                          "MTP pays per stream at one sequence; with more, each stream decodes slower (seed 004: "
                          "45.9 tok/s at 1 stream, 20.5 at 13): keep max-num-seqs > 1 only for aggregate throughput, "
                          "and benchmark wall throughput both ways", "P20", WARN,
                          missing=str(f.get("max-num-seqs", "vLLM's default (several)"))))
    if p.gpus.count * p.profile.nodes >= 2 and "speculative-config" in f:
        eager = bool(f.get("enforce-eager"))
        out.append(Check("service.eager", "MTP at TP2 runs eager", PASS if eager else FAIL,
                         "eager" if eager else "CUDA graphs", "--enforce-eager",
                         "" if eager else "CUDA graphs with MTP at TP2 cost about 28% of decode on GB10 (36 vs 50 "
                         "tok/s): set serve.flags.enforce-eager = true", "P22"))
    return out
