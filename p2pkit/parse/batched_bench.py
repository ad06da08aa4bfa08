"""llama-batched-bench's output: its table (`--output-format md`, the default) and its JSONL
(`--output-format jsonl`), and the errors it stops with.

Source: llama.cpp tools/batched-bench/batched-bench.cpp (0c1e570, as vendored in llama-cpp-python 0.3.36).
It decodes `pl` sequences at once: each a prompt of `pp` tokens (one batch for all of them, unless -pps
shares one prompt), then `tg` steps of one token per sequence. Per (pp, tg, pl) it prints one row:
N_KV (the KV cells needed), T_PP s and S_PP t/s (the prompts), T_TG s and S_TG t/s (the decode steps:
pl*tg tokens), T s and S t/s (both: all prompt and generated tokens over the whole time). The table
starts after a settings line (`FUNC: n_kv_max = N, n_batch = ..., n_gpu_layers = N, n_threads = N, ...`);
the JSONL carries those settings in every line. Both go to stdout (LOG: common/log.cpp writes level
NONE to stdout), the model loader's lines and the errors to stderr.

A combination whose KV need (pl*(pp+tg), or less with a shared prompt) is over n_kv_max (-c) is skipped
without a word, and a row can be missing for another reason: the tool never flushes llama.cpp's logger
before it exits (common/log.cpp, common_log_main: the singleton is leaked, "logs may be lost"), and the CPU
build here lost its last JSONL line in about one run of five. `missing()` names what was asked for and not
printed. A -c far too small for a batch makes it abort inside llama.cpp (GGML_ABORT: "common.cpp:2158:
get_sub_batch: failed to add token ..."), after the rows it printed: an error here, never a result.

Pass stdout and stderr together (stdout first). Recorded real outputs: tests/fixtures/llamacpp/batched-bench/
(the CPU build) and tests/fixtures/h200-device/ (the CUDA one); README.md in each."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field


class BatchedBenchError(ValueError):
    """llama-batched-bench stopped (or printed no result): its own error line and the fix."""


@dataclass(frozen=True)
class BatchedRow:
    pp: int              # prompt tokens per sequence
    tg: int              # generated tokens per sequence
    pl: int              # parallel sequences
    n_kv: int
    t_pp: float          # seconds
    speed_pp: float      # prompt tokens per second
    t_tg: float
    speed_tg: float      # generated tokens per second, all sequences (pl*tg / t_tg)
    t: float
    speed: float         # prompt and generated tokens per second, over the whole time

    @property
    def output_tps(self) -> float:
        """Generated tokens over the whole time, the prompts' included (pl*tg / T): what a server's
        output tokens over a level's wall time compare with."""
        return self.pl * self.tg / self.t if self.t > 0 else 0.0


@dataclass(frozen=True)
class BatchedRun:
    fmt: str                                   # "md" or "jsonl"
    settings: dict = field(default_factory=dict)  # n_kv_max, n_batch, n_ubatch, flash_attn, n_gpu_layers, ...
    rows: tuple[BatchedRow, ...] = ()


# its error lines, each with what it means and the fix
ERRORS = (
    (re.compile(r"error: invalid argument: (?P<arg>\S+)"),
     "this llama-batched-bench does not accept {arg}: read `llama-batched-bench --help` of the built binary"),
    (re.compile(r"error while handling argument \"(?P<arg>[^\"]+)\": (?P<why>[^\n]+)"),
     "the value of {arg} is not one it takes ({why}): read `llama-batched-bench --help`"),
    (re.compile(r"error: unable to load model"),
     "the model could not be loaded: check that the file exists, is readable and is a GGUF file this build "
     "reads (the model stage writes and checks it)"),
    (re.compile(r"error: failed to create the llama_context"),
     "the context could not be created (out of memory for this -c, or KV settings this build refuses): "
     "lower -c or the parallel sequences"),
    (re.compile(r"failed to decode the batch, n_batch = (?P<nb>\d+), ret = (?P<ret>-?\d+)"),
     "a batch of {nb} tokens failed to decode (llama_decode returned {ret}: 1 means no KV slot for it): "
     "raise -c or lower the lengths or sequences"),
    (re.compile(r"llama_decode\(\) failed"),
     "a decode failed inside llama.cpp: read the lines above it"),
    (re.compile(r"^\S+\.(?:cpp|c|cu|h):\d+: (?P<what>[^\n]+)$", re.M),
     "it aborted inside llama.cpp ({what}): read the lines around it; a batch larger than its -c aborts so"),
)

SETTINGS = re.compile(r"^\S+: (?P<kv>n_kv_max = .*)$", re.M)
ROW = re.compile(r"^\|" + r"\s*(\d+)\s*\|" * 4 + r"\s*([0-9.]+|nan|inf)\s*\|" * 6 + r"\s*$", re.M)
JSONL_KEYS = ("pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed")


def read(text: str) -> BatchedRun:
    """Every row it printed and its settings; BatchedBenchError when it stopped with an error (even after
    some rows: a cut run is not a result) or printed no row."""
    for rx, fix in ERRORS:
        m = rx.search(text)
        if m:
            raise BatchedBenchError(f"llama-batched-bench said \"{m.group(0).strip()}\": "
                                    f"{fix.format(**m.groupdict())}")
    jsonl = _jsonl(text)
    if jsonl:
        first = jsonl[0]
        settings = {k: v for k, v in first.items() if k not in JSONL_KEYS}
        return BatchedRun("jsonl", settings, tuple(_row([x[k] for k in JSONL_KEYS]) for x in jsonl))
    rows = tuple(_row(m.groups()) for m in ROW.finditer(text))
    if not rows:
        tail = " | ".join(x.strip() for x in text.strip().splitlines()[-3:]) or "(no output)"
        raise BatchedBenchError(f"llama-batched-bench printed no result row (last lines: {tail[:300]}): run it again "
                                "and read its whole output; a combination over -c is skipped without a word")
    s = SETTINGS.search(text)
    return BatchedRun("md", _settings(s.group("kv")) if s else {}, rows)


def _jsonl(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith('{"n_kv_max":'):
            try:
                x = json.loads(line)
            except ValueError:
                raise BatchedBenchError(f"a JSONL line of llama-batched-bench does not parse (cut short?): "
                                        f"{line[:120]}") from None
            if all(k in x for k in JSONL_KEYS):
                out.append(x)
    return out


def _settings(text: str) -> dict:
    out: dict = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        v = v.strip()
        out[k.strip()] = int(v) if re.fullmatch(r"-?\d+", v) else v
    return out


def _row(v) -> BatchedRow:
    pp, tg, pl, n_kv = (int(x) for x in v[:4])
    t_pp, s_pp, t_tg, s_tg, t, s = (float(x) for x in v[4:])
    return BatchedRow(pp, tg, pl, n_kv, t_pp, s_pp, t_tg, s_tg, t, s)


def missing(run: BatchedRun, pp: list[int], tg: list[int], pl: list[int]) -> list[tuple[int, int, int]]:
    """The (pp, tg, pl) asked for that it did not print (skipped: over n_kv_max)."""
    got = {(r.pp, r.tg, r.pl) for r in run.rows}
    return [(a, b, c) for a in pp for b in tg for c in pl if (a, b, c) not in got]


def kv_needed(pp: int, tg: int, pl: int, shared_prompt: bool = False, kv_unified: bool = False) -> int:
    """The KV cells one combination needs (batched-bench.cpp: n_ctx_req), which -c must cover."""
    if shared_prompt:
        return (pp if kv_unified else pl * pp) + pl * tg
    return pl * (pp + tg)
