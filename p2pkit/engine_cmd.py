"""The engine's command line, built as a list from the profile, and the engine's own refusals
mirrored so that they come before a start, not after (P10, P11, P18, P20).

ninfer-serve takes the artifact first, then `--flag value` only (`--flag=value` is rejected as
unknown); booleans are bare flags. llama-server takes `-m MODEL` and the same `--flag value` form.
"""

from __future__ import annotations

from p2pkit.checks import FAIL, PASS, WARN, Check, judge
from p2pkit.config import Profile

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
    "spec-draft-n-min", "metrics", "no-webui", "mmproj", "model-draft",
}
BINARIES = {"ninfer": "build/apps/ninfer-serve", "llamacpp": "build/bin/llama-server"}


def binary(p: Profile) -> str:
    return f"{p.engine.build_dir}/{BINARIES.get(p.engine.recipe, 'bin/serve')}"


def flags_of(p: Profile) -> dict:
    """The profile's flags with host and port from [serve] (the one place they are set)."""
    return {**p.serve.flags, "host": p.serve.host, "port": p.serve.port}


def client_host(p: Profile) -> str:
    """Where a client on this host reaches the engine: loopback when it listens on every address."""
    return "127.0.0.1" if p.serve.host in ("0.0.0.0", "::") else p.serve.host


def health_url(p: Profile) -> str:
    return f"http://{client_host(p)}:{p.serve.port}/health"


def argv(p: Profile) -> list[str]:
    out = [binary(p)]
    if p.engine.recipe == "ninfer":
        out.append(p.model.output)
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
    known = NINFER_FLAGS if p.engine.recipe == "ninfer" else LLAMACPP_FLAGS
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
    out.append(_host(p))
    if p.engine.recipe == "ninfer":
        out += _ninfer(p, flags)
    elif p.engine.recipe == "llamacpp":
        out += _llamacpp(p, flags)
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
    out.append(judge("service.tp", "--tp is 1 or 2", tp in (1, 2), tp, "1 or 2", "ninfer-serve runs --tp 1 or 2"))
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
    if spec is not None:
        slots = f.get("max-concurrency", 1)
        out.append(Check("service.spec_slots", "speculative decoding with one slot", PASS if slots == 1 else WARN,
                         slots, 1, "" if slots == 1 else "speculative decoding pays at one concurrent slot; with "
                         "more it can cost throughput: benchmark wall throughput both ways", "P20"))
    return out


def _llamacpp(p: Profile, f: dict) -> list[Check]:
    out = []
    if f.get("spec-type"):
        np_ = f.get("parallel", 1)
        out.append(Check("service.spec_slots", "speculative decoding with one slot", PASS if np_ == 1 else WARN,
                         np_, 1, "" if np_ == 1 else "MTP only pays at one concurrent slot (--parallel 1)", "P20"))
    split = f.get("tensor-split")
    if split is not None:
        parts = str(split).split(",")
        out.append(judge("service.tensor_split", "--tensor-split names one share per GPU",
                         len(parts) == p.gpus.count, split, f"{p.gpus.count} shares",
                         f"give {p.gpus.count} comma-separated shares"))
    return out
