"""llama-bench's output, in each of the four formats it prints (`-o md`, `-o json`, `-o jsonl`,
`-o csv`; the format is read from the text), and the errors it stops with.

Source: llama.cpp tools/llama-bench/llama-bench.cpp (markdown_printer, csv_printer, json_printer,
jsonl_printer; the test fields from test::get_fields). md shows only the columns that differ from
the defaults (and `ngl` only on a GPU backend), so its columns are read by their header names; the
test name ("pp512", "tg128", "pp512+tg128", "pp512 @ d512") carries the prompt, generation and depth
lengths, "t/s" is "MEAN ± STDDEV", the build commit is on the "build: COMMIT (NUMBER)" line after
the table. The machine formats carry every field and the samples (`samples_ts`); a build without
depth has no `n_depth` field (0 here).

Pass stdout and stderr together (stdout first): the results are on stdout, the errors on stderr.
Recorded real outputs: tests/fixtures/llamacpp/bench/ (README.md there)."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass


class LlamaBenchError(ValueError):
    """llama-bench stopped (or printed no result): its own error line and the fix."""


@dataclass(frozen=True)
class BenchRow:
    test: str            # as md shows it: "pp512", "tg128", "pp512 @ d512", "tg128 @ d3475", "pp512+tg128"
    n_prompt: int
    n_gen: int
    n_depth: int         # 0 when the build has no depth
    avg_ts: float        # tokens per second, mean
    stddev_ts: float
    samples_ts: tuple[float, ...]   # empty where the format has none (md, csv)
    model_type: str | None
    backend: str | None
    n_gpu_layers: int | None
    build_commit: str | None


# llama-bench's error lines (stderr), each with what it means and the fix
ERRORS = (
    (re.compile(r"error: invalid parameter for argument: (?P<arg>\S+)"),
     "this llama-bench does not accept {arg} (or its value is missing or malformed): read `llama-bench --help` "
     "of the built binary and fix the bench arguments"),
    (re.compile(r"error: failed to load model '(?P<path>[^']*)'"),
     "the model {path} could not be loaded: check that the file exists, is readable and is a GGUF file this "
     "build reads (the model stage writes and checks it)"),
    (re.compile(r"error: failed to create context with model '(?P<path>[^']*)'"),
     "the context for {path} could not be created (out of memory for these -p/-n/-d lengths, or KV settings this "
     "build refuses): lower the lengths or the GPU layers"),
    (re.compile(r"error: failed to run (?P<what>prompt warmup|gen warmup|depth|prompt|gen)\b"),
     "the {what} run failed inside llama.cpp: read the lines above it; run again with -v for llama.cpp's own log"),
    (re.compile(r"^error: (?P<what>.+)$", re.M),
     "llama-bench stopped: {what}; read `llama-bench --help` of the built binary"),
)


def read(text: str) -> list[BenchRow]:
    """Every result row llama-bench printed; LlamaBenchError when it stopped with an error (even
    after some rows: a partial run is not a result) or printed no row."""
    err = _error(text)
    if err:
        raise LlamaBenchError(err)
    fmt = detect(text)
    rows = {"md": _md, "json": _json, "jsonl": _jsonl, "csv": _csv}[fmt](text) if fmt else []
    if not rows:
        tail = " | ".join(x.strip() for x in text.strip().splitlines()[-3:]) or "(no output)"
        raise LlamaBenchError(f"llama-bench printed no result row ({'format ' + fmt if fmt else 'no table'}; last "
                              f"lines: {tail[:300]}): run it again and read its whole output")
    return rows


def detect(text: str) -> str | None:
    """'md', 'json', 'jsonl' or 'csv' from the text's own shape; None when it holds no table."""
    for line in text.splitlines():
        if re.match(r"^\|.*\|\s*t/s\s*\|\s*$", line) and "test" in line:
            return "md"
        if line.startswith('{"build_commit":'):
            return "jsonl"
        if line.rstrip() == "[":
            return "json"
        if line.startswith("build_commit,"):
            return "csv"
    return None


def _error(text: str) -> str | None:
    for rx, fix in ERRORS:
        m = rx.search(text)
        if m:
            said = m.group(0).strip()
            return f"llama-bench said \"{said}\": {fix.format(**m.groupdict())}"
    return None


def _num(v, kind=float):
    try:
        return kind(v)
    except (TypeError, ValueError):
        return None


def _commit(v: str | None) -> str | None:
    """The build's commit; a tree built without git says "unknown" (llama_commit()): None."""
    return None if not v or v == "unknown" else v


def _test_name(n_prompt: int, n_gen: int, n_depth: int) -> str:
    """The md printer's test name (markdown_printer::print_test)."""
    name = f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}" if n_prompt == 0 else f"pp{n_prompt}+tg{n_gen}"
    return f"{name} @ d{n_depth}" if n_depth > 0 else name


def _row(d: dict, samples: tuple[float, ...]) -> BenchRow:
    n_prompt, n_gen, n_depth = (int(d.get(k) or 0) for k in ("n_prompt", "n_gen", "n_depth"))
    ngl = _num(d.get("n_gpu_layers"), int)
    return BenchRow(test=_test_name(n_prompt, n_gen, n_depth), n_prompt=n_prompt, n_gen=n_gen, n_depth=n_depth,
                    avg_ts=float(d["avg_ts"]), stddev_ts=float(d.get("stddev_ts") or 0.0), samples_ts=samples,
                    model_type=d.get("model_type") or None, backend=d.get("backends") or d.get("backend") or None,
                    n_gpu_layers=ngl, build_commit=_commit(d.get("build_commit")))


def _samples(v) -> tuple[float, ...]:
    if isinstance(v, list):
        return tuple(float(x) for x in v)
    return ()  # csv prints no samples


def _json(text: str) -> list[BenchRow]:
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.rstrip() == "[")
    body = []
    for line in lines[start:]:  # stderr lines after the array (or between, when both went to one pipe) are not JSON
        if line.rstrip() == "]":
            body.append("]")
            break
        if line[:1] in ("[", " ", "{", "}", ","):
            body.append(line)
    else:
        raise LlamaBenchError("llama-bench's JSON output ends before its closing ']': the run was cut short; run it "
                              "again and read its whole output")
    try:
        items = json.loads("\n".join(body))
    except ValueError as e:
        raise LlamaBenchError(f"llama-bench's JSON output does not parse ({e}): run it again") from None
    return [_row(x, _samples(x.get("samples_ts"))) for x in items if isinstance(x, dict) and "avg_ts" in x]


def _jsonl(text: str) -> list[BenchRow]:
    out = []
    for line in text.splitlines():
        if line.startswith('{"build_commit":'):
            try:
                x = json.loads(line)
            except ValueError:
                raise LlamaBenchError(f"a JSONL line of llama-bench does not parse (cut short?): {line[:120]}") \
                    from None
            out.append(_row(x, _samples(x.get("samples_ts"))))
    return out


def _csv(text: str) -> list[BenchRow]:
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("build_commit,"))
    body = [lines[start]] + [x for x in lines[start + 1:] if x.startswith('"')]  # csv_printer quotes every value
    return [_row(d, _samples(d.get("samples_ts"))) for d in csv.DictReader(io.StringIO("\n".join(body)))
            if d.get("avg_ts")]


MD_TEST = re.compile(r"^(?:pp(?P<p>\d+)\+tg(?P<g2>\d+)|pp(?P<p1>\d+)|tg(?P<g1>\d+))(?: @ d(?P<d>\d+))?$")
MD_TS = re.compile(r"^(?P<avg>[0-9.]+(?:e[+-]?\d+)?)\s*±\s*(?P<sd>[0-9.]+(?:e[+-]?\d+)?|nan|-?inf)$")


def _md(text: str) -> list[BenchRow]:
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if re.match(r"^\|.*\|\s*t/s\s*\|\s*$", x) and "test" in x)
    names = [c.strip() for c in lines[start].strip().strip("|").split("|")]
    build = next((m for x in lines[start:] if (m := re.match(r"^build: (\S+) \((\d+)\)", x))), None)
    out = []
    for line in lines[start + 2:]:  # after the header and its |---:| line
        if not line.startswith("|"):
            continue  # the blank line and "build: ..." after the table, or a stderr line in between
        cells = dict(zip(names, (c.strip() for c in line.strip().strip("|").split("|")), strict=False))
        m, ts = MD_TEST.match(cells.get("test", "")), MD_TS.match(cells.get("t/s", ""))
        if not m or not ts:
            raise LlamaBenchError(f"a row of llama-bench's table does not read (test {cells.get('test')!r}, t/s "
                                  f"{cells.get('t/s')!r}): {line.strip()[:160]}")
        n_prompt = int(m["p"] or m["p1"] or 0)
        n_gen = int(m["g2"] or m["g1"] or 0)
        out.append(BenchRow(test=cells["test"], n_prompt=n_prompt, n_gen=n_gen, n_depth=int(m["d"] or 0),
                            avg_ts=float(ts["avg"]), stddev_ts=float(ts["sd"]), samples_ts=(),
                            model_type=cells.get("model") or None, backend=cells.get("backend") or None,
                            n_gpu_layers=_num(cells.get("ngl"), int),
                            build_commit=_commit(build.group(1) if build else None)))
    return out
