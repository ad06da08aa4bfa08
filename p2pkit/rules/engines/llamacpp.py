"""llama.cpp's llama-server: its flags, its command line, its refusals before a start (P20, the tensor
split's shares), the flags its built --help accepts, and what the VRAM fit reads of its flags (P18).

llama-server takes `-m MODEL`, then `--flag value`; after a flag that takes a value it takes the next
argument as that value, whatever it starts with (common/arg.cpp, parse_cli_args: `argv[++i]`).
"""

from __future__ import annotations

from p2pkit.core.errors import Exit, P2pkitError
from p2pkit.parse import engine_api as pe
from p2pkit.rules.engines import flags
from p2pkit.rules.engines.flags import MAX_CONTEXT, as_int, no_request_log, single_node
from p2pkit.rules.findings import WARN, Check, figure, judge, unknown

NAME = "llamacpp"
FLAGS = flags.schema(
    values=("host", "port", "n-gpu-layers", "split-mode", "flash-attn", "batch-size", "ubatch-size", "cache-type-k",
            "cache-type-v", "parallel", "spec-type", "spec-draft-n-max", "spec-draft-n-min", "threads", "cache-ram"),
    switches=("kv-unified", "jinja", "metrics", "no-webui"),
    bounds={"ctx-size": ("int", 0, MAX_CONTEXT), "tensor-split": ("split", 0, 0)},
    reads=("mmproj", "model-draft"),
)
RELATIVE_FLAGS = flags.with_path(FLAGS, "writes")
PATH_FLAGS = flags.with_path(FLAGS, "reads")
SECRET_ENV = "llama-server reads LLAMA_API_KEY"
CHECKS_HELP = True  # the built llama-server's --help says which flags this commit accepts
SERVER = "build/bin/llama-server"
# llama-server's -np default: "number of server slots (default: -1, -1 = auto)" (its --help,
# tests/fixtures/llamacpp/llama-server-help.txt), and auto is 4 slots with a unified KV cache
# (tools/server/server.cpp of the vendored llama.cpp 0c1e570: "n_parallel is set to auto, using n_parallel = 4")
AUTO_SLOTS = "omitted: llama-server's default -1 = auto (4 slots)"
# llama.cpp's tensor split (--split-mode tensor) refused a quantized KV cache until PR #23792
# ("simultaneous use of SPLIT_MODE_TENSOR and KV cache quantization not implemented", issue #23567);
# after it q8_0 and q4_0 work while q4_1, q5_0, q5_1 and iq4_nl still abort at start with
# GGML_ASSERT(ret.axis != GGML_BACKEND_SPLIT_AXIS_UNKNOWN) (issue #27116). The built tree tells which.
TP_KV_OLD = {"f32", "f16", "bf16"}  # before llama.cpp PR #23792
TP_KV_ASSERTS = {"q4_1", "q5_0", "q5_1", "iq4_nl"}  # issue #27116

node = single_node
request_log = no_request_log


def binary(p) -> str:
    return f"{p.engine.build_dir}/{SERVER}"


def flags_of(p) -> dict:
    return flags.with_listen(p, p.serve.flags)


def command(p) -> list[str]:
    """The command line's words before the flags (the service role's p2pkit_service_command)."""
    return [binary(p), "-m", p.model.output]


def argv(p) -> list[str]:
    """The whole command line: command(p), then the flags as words, and nothing after them (the service role
    builds ExecStart the same way from the command and the flags)."""
    return [*command(p), *flags.words(flags_of(p))]


def flag_problems(f: dict) -> list[tuple[str, str]]:
    return flags.problems(NAME, FLAGS, f, SECRET_ENV)


def served_model(p) -> str:
    """The model name an OpenAI request gives: the model's path (llama-server serves the one it loaded)."""
    return flags.model_path(p)


def drafting(f: dict) -> str | None:
    """llama-server's --spec-type when it turns drafting on: "none" (its default) and an empty value do not."""
    v = f.get("spec-type")
    return None if v in (None, False, "", "none") else str(v)


def slots(f: dict):
    """llama-server's --parallel as the profile gives it; None when it is omitted (its auto default, AUTO_SLOTS)."""
    return f.get("parallel")


def draft_model(p) -> str | None:
    """The separate draft model llama-server is given (-md): it loads it, drafting on or off, so its weights and
    KV count in the VRAM fit."""
    return p.serve.flags.get("model-draft")


def bench_flags(f: dict) -> list[str]:
    """llama-bench's words for the server's offload and flash-attention settings (-ngl, -fa on|off)."""
    out = []
    if f.get("n-gpu-layers") is not None:
        out += ["-ngl", str(f["n-gpu-layers"])]
    fa = f.get("flash-attn")
    if fa is not None:
        out += ["-fa", {True: "on", False: "off"}.get(fa, str(fa))]
    return out


# the flags llama-batched-bench takes under the same names as llama-server (common/arg.cpp, both examples)
BATCHED_SAME_FLAGS = ("n-gpu-layers", "flash-attn", "kv-unified", "batch-size", "ubatch-size", "cache-type-k",
                      "cache-type-v", "threads", "threads-batch", "split-mode", "tensor-split", "main-gpu")


def batched_context(f: dict, need: int) -> int:
    """llama-batched-bench's -c: the server's --ctx-size where it is larger than the KV the levels need."""
    ctx_size = f.get("ctx-size")
    return max(need, int(ctx_size)) if isinstance(ctx_size, int | str) and str(ctx_size).isdigit() else need


def batched_flags(f: dict) -> list[str]:
    """llama-batched-bench's words for the server's settings it shares (BATCHED_SAME_FLAGS): offload, flash
    attention, unified KV, batch sizes, KV types, threads, split."""
    out = []
    for k in BATCHED_SAME_FLAGS:
        v = f.get(k)
        if v is True:
            out.append(f"--{k}")
        elif v not in (None, False):
            out += [f"--{k}", {True: "on", False: "off"}.get(v, str(v))]
    return out


def refuse_unaccepted(shown_binary: str, help_text: str, used: list[str]) -> None:
    """The flags used against what the built llama-server's --help accepts: an unknown one (or one its help
    lists only to say what replaced it) is refused before a start, not found in a crash log after it."""
    known = pe.help_flags(help_text)
    removed = pe.help_removed(help_text)  # listed by --help only to say what replaced them
    unknown_ = sorted(set(used) - known)
    if not known or unknown_:
        said = "".join(f"; --{k}: {removed[k]}" for k in unknown_ if k in removed)
        raise P2pkitError(
            f"serve flag(s) {', '.join('--' + k for k in unknown_) or '(none listed)'} are not accepted by the built "
            f"{shown_binary} (its --help lists {len(known)} options){said}: refused before a start",
            hint="remove or rename them in serve.flags (`p2pkit --unset serve.flags.NAME ...`), or build the engine "
                 "commit that has them", code=Exit.USAGE)


def fit_plan(p) -> dict:
    """What the VRAM fit reads of the flags: the context, the K and V types, the draft, each GPU's share
    (--split-mode and --tensor-split)."""
    f = p.serve.flags
    ctx, kt, vt = f.get("ctx-size"), f.get("cache-type-k", "f16"), f.get("cache-type-v", "f16")
    draft = bool(drafting(f))
    split = str(f.get("split-mode", "layer"))
    shares = [float(x) for x in str(f.get("tensor-split", "")).split(",") if x.strip()] or [1.0] * p.gpus.count
    if split == "none":
        shares = [1.0] + [0.0] * (p.gpus.count - 1)
    return {"ctx": ctx, "k": str(kt), "v": str(vt), "draft": draft, "split": split,
            "shares": [s / sum(shares) for s in shares], "ctx_flag": "ctx-size"}


def fit_checks(fit: dict, p, plan: dict) -> list[Check]:
    """With --split-mode tensor: the KV types the built tree accepts (P18)."""
    if plan["split"] != "tensor":
        return []
    guard = fit.get("tp_quant_kv_refused")
    if guard is None:
        return [unknown("service.kv_split", "the built llama.cpp accepts this KV type with tensor split",
                        {"error": "the llama.cpp source tree was not readable"}, "accepted", pitfall="P18")]
    bad = sorted({t for t in (plan["k"], plan["v"]) if (t not in TP_KV_OLD if guard else t in TP_KV_ASSERTS)})
    why = ("this llama.cpp predates PR #23792: tensor split refuses every quantized KV type ('simultaneous use of "
           "SPLIT_MODE_TENSOR and KV cache quantization not implemented'): use f16/bf16 KV, or build a newer commit"
           if guard else "with tensor split these KV types abort at start (GGML_ASSERT(ret.axis != "
           "GGML_BACKEND_SPLIT_AXIS_UNKNOWN), llama.cpp #27116): use q8_0 or q4_0")
    return [judge("service.kv_split", "the built llama.cpp accepts this KV type with tensor split", not bad,
                  f"{plan['k']}/{plan['v']}" + (f" ({', '.join(bad)} refused)" if bad else ""),
                  "/".join(sorted(TP_KV_OLD)) if guard else "not " + "/".join(sorted(TP_KV_ASSERTS)), why,
                  pitfall="P18")]


# Idle slots' cells with a unified KV cache and no RAM prompt cache: llama-server keeps them in the cache (it saves
# and clears idle slots only into the RAM cache: "--cache-idle-slots requires --cache-ram, disabling"), and each
# decode step's attention spans the cache up to its highest used cell (llama_kv_cache::get_n_kv), so one stream
# decodes slower for what the other slots hold. Measured on the H200 (docs/measurements.md, "The slots' KV cache"):
# 0.76B model, 8 slots, ctx 32768, one decode stream right after an 8-stream level of 2048-token prompts: 685 tok/s
# unified against 895 with --no-kv-unified (0.77x).
IDLE_CELLS_HINT = ("one stream decodes slower for every cell the idle slots keep (measured 0.77x on the H200 after an "
                   "8-stream level): set serve.flags.kv-unified = false (each slot then gets ctx-size/parallel "
                   "cells), or parallel = 1, or a cache-ram above 0 (idle slots then move to RAM, about 0.2 s "
                   "each when a new task starts)")


def idle_slot_cells(f: dict) -> Check | None:
    """A WARN where several slots share a unified KV cache with no RAM prompt cache (IDLE_CELLS_HINT)."""
    np_ = f.get("parallel")
    auto = np_ is None or as_int(np_, None) == -1  # llama-server's auto: 4 slots in one unified cache (AUTO_SLOTS)
    n = 4 if auto else as_int(np_, None)
    unified = auto or f.get("kv-unified") is True
    if n is None or n <= 1 or not unified or str(f.get("cache-ram")) != "0":
        return None
    return judge("service.idle_slot_cells", "idle slots' cells leave the one busy stream's decode alone", False,
                 f"{n} slots in one unified KV cache, cache-ram 0", "kv-unified off, one slot, or cache-ram > 0",
                 IDLE_CELLS_HINT, severity=WARN)


def checks(p, f: dict) -> list[Check]:
    """llama-server's own refusals, before a start: drafting with one slot (P20), one tensor-split share per GPU;
    and a warning where idle slots' cells slow the one busy stream (idle_slot_cells)."""
    out = [c for c in (idle_slot_cells(f),) if c]
    if drafting(f):
        np_ = f.get("parallel")
        shown = np_ if np_ is not None else AUTO_SLOTS
        out.append(figure("service.spec_slots", "speculative decoding with one slot", as_int(np_, None), "==", 1,
                          "count", "MTP only pays at one concurrent slot: set serve.flags.parallel = 1 (the service "
                          "stage reads the running server's slots from /props)", "P20", WARN, missing=str(shown)))
    split = f.get("tensor-split")
    if split is not None:
        parts = str(split).split(",")
        out.append(judge("service.tensor_split", "--tensor-split names one share per GPU",
                         len(parts) == p.gpus.count, split, f"{p.gpus.count} shares",
                         f"give {p.gpus.count} comma-separated shares"))
    return out
