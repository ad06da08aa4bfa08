"""NInfer's ninfer-serve: its flags, its command line, its refusals before a start (P10, P11, P20) and what
the VRAM fit reads of its flags.

ninfer-serve takes the artifact first, then `--flag value` only (`--flag=value` is rejected as unknown);
booleans are bare flags. After a flag that takes a value it takes the next argument as that value, whatever
it starts with (src/serve/serve_options.cpp, require_value).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from p2pkit.rules.engines import flags, served
from p2pkit.rules.engines.flags import MAX_CONTEXT, as_int, no_draft_model, single_node
from p2pkit.rules.engines.served import SPEC_TITLE
from p2pkit.rules.findings import FAIL, PASS, WARN, Check, figure, judge, reading

NAME = "ninfer"
TITLE = "NInfer"
FLAGS = flags.schema(
    values=("host", "port", "devices", "kv-dtype", "kv-capacity", "max-concurrency", "prefill-chunk", "spec",
            "draft-tokens", "default-max-tokens", "vision-device", "media-cache-mib", "media-live-mib", "model-id"),
    switches=("lm-head-draft", "vision"),
    bounds={"tp": ("int", 1, 64), "max-context": ("int", 0, MAX_CONTEXT)},
    writes=("request-log-jsonl",),
)
RELATIVE_FLAGS = flags.with_path(FLAGS, "writes")
PATH_FLAGS = flags.with_path(FLAGS, "reads")
SECRET_ENV = ""
CHECKS_HELP = False  # the flags are held to FLAGS; ninfer-serve's --help is not read
SERVER = "build/apps/ninfer-serve"
KV_TP2 = {"bf16", "fp16", "fp8", "int8", "nvfp4"}
SPECS = {"mtp", "dflash", "dflash2"}
DEFAULT_MODEL_ID = "qwen3.6-27b"  # ninfer-serve's --model-id default

node = single_node
draft_model = no_draft_model  # NInfer's draft is inside the artifact (its components), not a file of its own


def binary(p) -> str:
    return f"{p.engine.build_dir}/{SERVER}"


def flags_of(p) -> dict:
    return flags.with_listen(p, p.serve.flags)


def command(p) -> list[str]:
    """The command line's words before the flags (the service role's p2pkit_service_command)."""
    return [binary(p), p.model.output]


def argv(p) -> list[str]:
    """The whole command line: command(p), then the flags as words, and nothing after them (the service role
    builds ExecStart the same way from the command and the flags)."""
    return [*command(p), *flags.words(flags_of(p))]


def flag_problems(f: dict) -> list[tuple[str, str]]:
    return flags.problems(NAME, FLAGS, f, SECRET_ENV)


def served_model(p) -> str:
    """The model name an OpenAI request must give: --model-id (ninfer-serve's default qwen3.6-27b)."""
    return str(p.serve.flags.get("model-id") or DEFAULT_MODEL_ID)


def request_log(p, host, state_dir):
    """Where the JSONL request log (--request-log-jsonl) is on this host, or None when the engine keeps
    none: a relative path is in the engine's working directory (the state directory's engine/)."""
    name = p.serve.flags.get("request-log-jsonl")
    if not name or name is True:
        return None
    path = PurePosixPath(str(name))
    return host.path(str(path)) if path.is_absolute() else state_dir / "engine" / path


def drafting(f: dict) -> str | None:
    """--spec's method when it is given (mtp, dflash, dflash2); None when drafting is off."""
    spec = f.get("spec")
    return str(spec) if spec else None


def tensor_parallel(f: dict):
    """--tp as the profile gives it (ninfer-serve's default 1)."""
    return f.get("tp", 1)


def fit_plan(p) -> dict:
    """What the VRAM fit reads of the flags: the context, the KV dtype, the draft, each GPU's share (--tp)."""
    f = p.serve.flags
    tp = int(f.get("tp", 1) or 1)
    kv = str(f.get("kv-dtype", "bf16"))
    return {"ctx": f.get("max-context"), "k": kv, "v": kv, "draft": f.get("spec") is not None, "split": "tp",
            "shares": [1 / tp] * tp, "ctx_flag": "max-context"}


def fit_checks(fit: dict, p, plan: dict) -> list[Check]:
    return []


def _devices(v) -> list[str]:
    return [d.strip() for d in str(v).split(",") if d.strip()]


def checks(p, f: dict) -> list[Check]:
    """ninfer-serve's own refusals, before a start: --tp and --devices, the vision device, the speculative
    method, DFlash2 at TP2 (P10), the KV dtype at TP2 and its capacity (P11), drafting with one slot (P20)."""
    out = []
    tp = f.get("tp", 1)
    devices = _devices(f.get("devices", "0"))
    gpus = [str(i) for i in range(p.gpus.count)]
    out.append(reading("service.tp", "--tp is 1 or 2", PASS if tp in (1, 2) else FAIL, as_int(tp, None), "count",
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
        out.append(judge("service.spec", "--spec is a method the engine has", spec in SPECS, spec,
                         "/".join(sorted(SPECS)), "use mtp, dflash or dflash2"))
    if spec == "dflash2" and tp == 2:
        out.append(judge("service.lm_head_draft", "DFlash2 at TP2 has --lm-head-draft", f.get("lm-head-draft") is True,
                         bool(f.get("lm-head-draft")), True,
                         "the engine throws 'Engine tp 2 DFlash2 requires the optimized proposal head': set "
                         "serve.flags.lm-head-draft = true", pitfall="P10"))
    kv = f.get("kv-dtype")
    if kv is not None and tp == 2:
        out.append(judge("service.kv_dtype", "KV dtype the engine accepts at TP2", kv in KV_TP2, kv,
                         "/".join(sorted(KV_TP2)), "pick one of the accepted KV dtypes", pitfall="P11"))
    cap = f.get("kv-capacity", "auto")
    out.append(Check("service.kv_capacity", "--kv-capacity auto", PASS if cap == "auto" else WARN, cap, "auto",
                     "" if cap == "auto" else "a fixed KV capacity that does not fit is an OOM at start (the KV "
                     "dtype decides the pool size): use auto, and the engine fits it to the card", "P11"))
    # P20 was measured for MTP (seed 003: it pays at one slot only); seed 000 serves DFlash2 at
    # --max-concurrency 8 in production, the default profile's setting, so DFlash(2) is not held to one slot
    if spec is not None and spec not in ("dflash", "dflash2"):
        slots = f.get("max-concurrency", 1)
        out.append(figure("service.spec_slots", "speculative decoding with one slot", as_int(slots, None), "==", 1,
                          "count", "speculative decoding pays at one concurrent slot; with more it can cost "
                          "throughput: benchmark wall throughput both ways", "P20", WARN, missing=str(slots)))
    return out


def check_ninfer_requests(s: dict, p) -> list[Check]:
    """NInfer: one real completion once /health is 200, and with --spec the `speculative` block of its
    request log's `request_done` line must show drafted tokens (P19)."""
    fc = s.get("first_completion")
    if fc is None:
        return []
    out = [served.openai_first(fc, s, "NInfer")]
    spec = drafting(p.serve.flags)
    if spec:
        out.append(ninfer_spec_running(fc, spec))
    return out


def ninfer_spec_running(fc: dict, spec: str) -> Check:
    """P19 on NInfer from its JSONL request log (src/serve/request_log.cpp, the `speculative` block of
    `request_done`: backend, rounds, drafted_tokens, accepted_tokens, accepted_per_position)."""
    want = f"request_done with speculative.backend {spec} and drafted tokens"
    if fc.get("request_log") is None:
        return Check("service.spec_running", served.SPEC_TITLE, FAIL, "the engine keeps no request log", want,
                     'set serve.flags.request-log-jsonl = "requests.jsonl" (the built-in profile does): NInfer '
                     "counts drafts only there, and nothing else proves drafting", "P19")
    done = [e for e in fc.get("log_events", []) if e.get("event") == "request_done"]
    if not done:
        return Check("service.spec_running", served.SPEC_TITLE, FAIL, f"no request_done line in {fc['request_log']} "
                     "for the request", want, "the request log did not record the request: check that the engine "
                     "writes where serve.flags.request-log-jsonl says (relative to its working directory)", "P19")
    sp = done[-1].get("speculative") or {}
    drafted, accepted, rounds = (sp.get("drafted_tokens") or 0), (sp.get("accepted_tokens") or 0), sp.get("rounds")
    per = sp.get("accepted_per_position") or []
    rates = ", ".join(f"{n / rounds:.2f}" for n in per) if rounds else ""
    # the figure: the tokens drafted for the request (rounds and acceptances stay in the text)
    return reading("service.spec_running", SPEC_TITLE, PASS if sp.get("backend") not in (None, "none") and drafted > 0
                   else FAIL, drafted, "count", want, f"--spec {spec} is set but NInfer drafted nothing: the "
                   "artifact lacks the draft components (convert it with the draft head), or the engine ignored the "
                   "method", "P19", text=f"backend {sp.get('backend')}, rounds {rounds}, drafted {{}}, accepted "
                   f"{accepted}" + (f"; acceptance per position {rates}" if rates else ""))


request_checks = check_ninfer_requests


# ------------------------------------------------------------ what the other stages and commands ask of NInfer

LINKED_BINARY = True  # ninfer-serve is a native binary: its libraries resolve through ldd
NCCL_FLOOR = ("P16", "NCCL 2.25.1 fails on the 5090 (ncclMaxSharedMem ... exceeds) and 2.18.3 hangs on SM120: point "
                     "engine.nccl_root at NCCL >= 2.26.2")
# bench reads NInfer's own accounting from its JSONL request log, one request at a time
BENCH = {"accounting": "request_log", "concurrent": False, "reference": None,
         "says": "NInfer's own: the `request_done` line of its JSONL request log (--request-log-jsonl; result, "
                 "timings_seconds, speculative; Neroued/ninfer src/serve/request_log.cpp), the response's `usage` "
                 "beside it"}


def build_tools(p) -> tuple[str, ...]:
    """The commands the engine stage's CMake build runs (preflight.tools finds them before anything runs)."""
    return ("cmake", "ninja", "pkg-config", "git", "c++")


def pins_missing(p) -> list[str]:
    """The engine's pins this profile leaves empty (preflight names them before anything changes)."""
    return [] if len(p.engine.commit) >= 7 else ["engine.commit"]


def env(p, level: str | None) -> dict[str, str]:
    """The engine's own part of its environment file: NCCL's P2P level where its default stops short (P30)."""
    return {"NCCL_P2P_LEVEL": level} if level else {}


def p2p_env_checks(env: dict[str, str]) -> list[Check]:
    return []


def kernel_library(p) -> tuple[str, str]:
    """Where the engine's CUDA kernels are, for their architectures (P39): a directory and a glob under it."""
    return p.engine.build_dir, f"**/{SERVER.rsplit('/', 1)[-1]}"


def fit_facts(host, p) -> dict:
    return {}


def model_facts(host, p) -> dict:
    return {}


def model_checks(facts: dict | None, p) -> list[Check]:
    return []


def model_prechecks(p) -> list[Check]:
    """What the model stage needs of the profile for NInfer's converter."""
    return [judge("model.convert_recipe", "NInfer convert recipe set", bool(p.model.convert_recipe),
                  p.model.convert_recipe or "(empty)", "a recipe", "set model.convert_recipe")]


def convert_argv(p, host, src: str, tmp: str) -> list[str]:
    """NInfer's converter run as a module from its source root (P08), writing exactly `tmp`."""
    m = p.model
    argv = [p.engine.python, "-m", "tools.convert", "--recipe", m.convert_recipe, "--source", f"quantized={src}"]
    if "dflash2" in m.components and m.draft_source:
        argv += ["--source", f"dflash2={host.path(m.draft_source)}"]
    return [*argv, "--components", ",".join(m.components), "--proposal", "--out", tmp]


def first_completion(base: str, p, host, state_dir) -> dict:
    """The service proof's one real request, with the request log's lines for it."""
    from p2pkit.host import engine_api

    return engine_api.ninfer_first_completion(base, served_model(p), request_log(p, host, state_dir))
