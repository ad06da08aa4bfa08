"""llama.cpp's llama-server: its flags, its command line, its refusals before a start (P20, the tensor
split's shares), the flags its built --help accepts, and what the VRAM fit reads of its flags (P18).

llama-server takes `-m MODEL`, then `--flag value`; after a flag that takes a value it takes the next
argument as that value, whatever it starts with (common/arg.cpp, parse_cli_args: `argv[++i]`).
"""

from __future__ import annotations

from p2pkit.core.errors import Exit, P2pkitError
from p2pkit.parse import engine_api as pe
from p2pkit.rules.engines import flags, served
from p2pkit.rules.engines.flags import MAX_CONTEXT, as_int, no_request_log, single_node
from p2pkit.rules.findings import FAIL, PASS, WARN, Check, figure, judge, reading, unknown

NAME = "llamacpp"
TITLE = "llama.cpp"
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


def help_text(host, p) -> dict:
    """The built llama-server's --help (what the flags check reads): {"text"}."""
    r = host.runner.run([str(host.path(binary(p))), "--help"], check=False, timeout=60)
    return {"text": r.stdout + r.stderr}


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


def check_llamacpp_requests(s: dict, p) -> list[Check]:
    """llama-server: one real completion once /health is 200 (MTP under tensor split can crash at the
    first decode with /health already 200), and with a speculative type the draft counts of that
    response and of /metrics' spec_decode counters must have grown (P19). `-md` alone leaves
    drafting off and the start-up log does not say either way: only the counters tell."""
    spec = drafting(p.serve.flags)
    fc = s.get("first_completion")
    if fc is None:
        return []  # /health never answered 200: the health check already failed
    t = fc.get("timings") or {}
    ok, first = served.first_completion(
        fc, s, t.get("predicted_n") or 0, f"{{}} tokens in {t.get('predicted_ms', 0):.1f} ms (server timings)",
        "the server said healthy but failed its first decode: read `p2pkit serve logs` (with "
        "MTP under --split-mode tensor this is the known crash; try --split-mode layer or another KV type)")
    out = [first]
    if not spec:
        return out
    if "total_slots" in fc:
        out.append(running_slots(fc["total_slots"], slots(p.serve.flags)))
    if fc.get("metrics_status") != 200:
        out.append(Check("service.spec_running", "speculative decoding is really running", FAIL,
                         f"/metrics answered {fc.get('metrics_status')}", "spec_decode counters growing",
                         "start llama-server with --metrics (serve.flags.metrics = true): without it /metrics "
                         "answers 501 and nothing proves drafting", "P19"))
        return out
    d = fc.get("metrics_delta", {})
    drafted = d.get("spec_decode_num_draft_tokens_total", 0)
    accepted = d.get("spec_decode_num_accepted_tokens_total", 0)
    ok = ok and (t.get("draft_n") or 0) > 0 and drafted > 0
    # the figure: the draft tokens /metrics counted over the request (the response's own counts stay in the text)
    out.append(reading("service.spec_running", "speculative decoding is really running", PASS if ok else FAIL,
                       drafted, "count", "draft tokens in the response and in /metrics",
                       f"--spec-type {spec} is set but nothing was drafted: the draft model or the MTP layers are "
                       "missing (`-md` alone leaves drafting off; the model stage checks the nextn layers)", "P19",
                       text=f"response draft_n {t.get('draft_n', 0)}, accepted {t.get('draft_n_accepted', 0)}; "
                       f"/metrics spec_decode_num_draft_tokens_total +{{}}, accepted_tokens_total +{accepted:g}"))
    return out


def running_slots(n: int | dict, flag) -> Check:
    """P20 on the running llama-server: its slots as /props says (an omitted --parallel is its automatic
    default, not 1)."""
    title = "the running server drafts for one slot"
    given = f"--parallel {flag}" if flag is not None else "--parallel omitted (auto)"
    if not isinstance(n, int):
        return unknown("service.spec_slots_running", title, n, 1, needed=False, pitfall="P20")
    return figure("service.spec_slots_running", title, n, "==", 1, "count",
                  "MTP only pays at one concurrent slot: set serve.flags.parallel = 1 and "
                  "`p2pkit up --from service --force`", pitfall="P20", severity=WARN,
                  context=f"/props total_slots, {given}")


request_checks = check_llamacpp_requests


# ------------------------------------------------------------ what the other stages and commands ask of llama.cpp

LINKED_BINARY = True  # llama-server is a native binary: its libraries resolve through ldd
NCCL_FLOOR = ("P16", "NCCL 2.25.1 fails on the 5090 (ncclMaxSharedMem ... exceeds) and 2.18.3 hangs on SM120: point "
                     "engine.nccl_root at NCCL >= 2.26.2")
# bench reads each response's own `timings`: requests can run at once; llama-bench and llama-batched-bench are
# the references on the same GPU and model
BENCH = {"accounting": "timings", "concurrent": True, "reference": "llama-bench",
         "says": "llama-server's own: each /completion response's `timings` (tools/server/server-common.cpp, "
                 "server_slot_stats::to_json) and /metrics llamacpp:* counters (server-task.cpp, to_metrics)"}


def build_tools(p) -> tuple[str, ...]:
    """The commands the engine stage's CMake build runs (preflight.tools finds them before anything runs)."""
    return ("cmake", "ninja", "pkg-config", "git", "c++")


def pins_missing(p) -> list[str]:
    """The engine's pins this profile leaves empty: the archive's sha256, or the checkout's commit."""
    if p.engine.source_url:
        return [] if p.engine.source_sha256 else ["engine.source_sha256"]
    return [] if len(p.engine.commit) >= 7 else ["engine.commit"]


def env(p, level: str | None) -> dict[str, str]:
    """llama.cpp's part of its environment file: NCCL's P2P level (P30), no InfiniBand between the local pair,
    peer access outside NCCL (GGML_CUDA_P2P, P17), the profile's NCCL first on the library path (P16)."""
    out = {"NCCL_P2P_LEVEL": level} if level else {}
    out["NCCL_IB_DISABLE"] = "1"
    if p.gpus.count >= 2:  # llama.cpp enables peer access outside NCCL only with this set (P17)
        out["GGML_CUDA_P2P"] = "1"
    if p.engine.nccl_root:  # the profile's NCCL, never the system's 2.18.3 that hangs on SM120 (P16)
        out["LD_LIBRARY_PATH"] = f"{p.engine.nccl_root}/lib"
    return out


def p2p_env_checks(env: dict[str, str]) -> list[Check]:
    """P17: llama.cpp enables peer access outside NCCL only when GGML_CUDA_P2P is set."""
    return [judge("field.ggml_cuda_p2p", "llama.cpp enables peer access (GGML_CUDA_P2P)",
                  env.get("GGML_CUDA_P2P", "") not in ("", "0"), env.get("GGML_CUDA_P2P", "(unset)"), "set",
                  "llama.cpp enables peer access outside NCCL only when GGML_CUDA_P2P is set "
                  "(ggml-cuda.cu): `p2pkit up --from service --force` writes it", pitfall="P17")]


def kernel_library(p) -> tuple[str, str]:
    """Where the engine's CUDA kernels are, for their architectures (P39): libggml-cuda under the build."""
    return p.engine.build_dir, "**/libggml-cuda.so*"


def fit_facts(host, p) -> dict:
    """What the VRAM fit reads of the built tree: which KV types its tensor split refuses."""
    from p2pkit.host import model

    return {"tp_quant_kv_refused": model.tp_quant_kv_refused(host, p.engine.build_dir)}


def model_facts(host, p) -> dict:
    return {}


def model_checks(facts: dict | None, p) -> list[Check]:
    return []


def model_prechecks(p) -> list[Check]:
    return []


def convert_argv(p, host, src: str, tmp: str) -> list[str]:
    """llama.cpp's converter run as a module from its source root (P08): it finds its `conversion` package
    and gguf-py beside it; it writes exactly --outfile, the temporary name."""
    return [p.engine.python, "-m", "convert_hf_to_gguf", src, "--outfile", tmp, "--outtype", "bf16"]


def first_completion(base: str, p, host, state_dir) -> dict:
    """The service proof's one real request: the response's timings and /metrics around it."""
    from p2pkit.host import engine_api

    return engine_api.first_completion(base)
