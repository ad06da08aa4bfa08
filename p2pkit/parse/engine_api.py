"""What served engines say about themselves: Prometheus text from /metrics (llama.cpp's
`llamacpp:` counters, vLLM's `vllm:` ones), the flags a binary's --help lists, NInfer's JSONL
request log.

Sources: llama.cpp tools/server/server-task.cpp (server_task_result_metrics::to_metrics: `# HELP
llamacpp:NAME`, `# TYPE llamacpp:NAME counter|gauge`, `llamacpp:NAME VALUE`), common/arg.cpp
(--help: one option per line, its names comma-separated, like `-c,    --ctx-size N`)."""

from __future__ import annotations

import json
import re

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def prometheus(text: str, prefix: str = "") -> dict[str, float]:
    """Sample lines of a Prometheus text exposition: name (prefix removed) -> value; labelled
    samples are summed per name (the per-position spec counters)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m or not m.group(1).startswith(prefix):
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        name = m.group(1)[len(prefix):]
        out[name] = out.get(name, 0.0) + v
    return out


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 6) for k in after}


def help_flags(text: str) -> set[str]:
    """Long option names (without dashes) an engine's --help lists: `-c,    --ctx-size N` -> ctx-size;
    a negated form (`--no-webui`) counts too."""
    out = set()
    for line in text.splitlines():
        # the options column ends at the first run of 2+ spaces not right after a comma
        # ("-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers ...")
        head = re.split(r"(?<=[^,\s])\s{2,}", line.strip(), maxsplit=1)[0]
        if not head.startswith("-"):
            continue
        for m in re.finditer(r"(?:^|[ ,])--([a-z0-9][a-z0-9-]*)", head):
            out.add(m.group(1))
    return out


def jsonl(text: str) -> list[dict]:
    """A JSONL log: one object per line; lines that are not JSON objects are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
