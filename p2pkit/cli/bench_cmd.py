"""`p2pkit bench`: the served engine's throughput from its own accounting; an A/B with --ab."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.errors import Exit, MissingError


def _fmt(s: dict | None, unit: str = "") -> str:
    if not s:
        return "-"
    return f"{s['median']:g}{unit} ({s['min']:g}-{s['max']:g})"


def rows(doc: dict) -> list[list]:
    out = []
    for a in doc["arms"]:
        s = a.get("summary", {})
        out.append([a["arm"], len(a["requests"]), _fmt(s.get("decode_tps")),
                    s.get("metrics_decode_tps", s.get("log_decode_tps", "-")),
                    _fmt(s.get("prefill_tps")), _fmt(s.get("ttft_ms")), _fmt(s.get("client_tps")),
                    s.get("draft_acceptance", "-"), a.get("error", "")])
    return out


def prometheus_text(doc: dict) -> str:
    """The bench figures as Prometheus text (one HELP/TYPE per family, an arm label per sample)."""
    fams = (("p2pkit_bench_decode_tokens_per_second", "decode_tps", "median decode tok/s from the server's timings"),
            ("p2pkit_bench_prefill_tokens_per_second", "prefill_tps", "median prefill tok/s from the server's timings"),
            ("p2pkit_bench_time_to_first_token_seconds", "ttft_ms", "median time to first token (server prompt_ms)"))
    lines = []
    for name, key, help_ in fams:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for a in doc["arms"]:
            st = (a.get("summary") or {}).get(key)
            if st:
                v = st["median"] / 1000 if key == "ttft_ms" else st["median"]
                arm = a["arm"].replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'{name}{{arm="{arm}",engine="{doc["engine"]}"}} {v:g}')
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    """A PNG of each request's decode tok/s (the server's own figure), one line per arm; the arms and
    their request counts are also in the PNG's text chunks. Needs matplotlib (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingError("the PNG plot needs matplotlib, which is not installed",
                           hint="pip install 'p2pkit[plot]' (the JSON artifact is written without it)") from e
    sh = doc["shape"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for a in doc["arms"]:
        ys = [r.get("decode_tps") for r in a["requests"]]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{a['arm']} ({len(ys)})")
    ax.set_xlabel("timed request")
    ax.set_ylabel("decode tok/s (server's own accounting)")
    ax.set_title(f"{'SIMULATED ' if doc.get('simulated') else ''}{doc['engine']}: prompt {sh['prompt_tokens']} / "
                 f"output {sh['output_tokens']} tokens")
    ax.legend()
    arms = "; ".join(f"{a['arm']}={len(a['requests'])}" for a in doc["arms"])
    fig.savefig(path, format="png", metadata={"Title": "p2pkit bench", "Description": f"arms: {arms}"})
    plt.close(fig)


def _default(key: str) -> str:
    """Where an unset length comes from: the profile's [bench] key, and the built-in default."""
    from dataclasses import fields

    from p2pkit.config import Bench

    default = next(f.default for f in fields(Bench) if f.name == key)
    return f"(default: the profile's bench.{key}; {default} unless it sets one)"


def bench(
    requests: Annotated[int | None, typer.Option("--requests", "-n", min=1, help="timed requests per arm "
                                                 f"{_default('requests')}")] = None,
    warmup: Annotated[int | None, typer.Option("--warmup", min=0, help="warm-up requests, left out "
                                               f"{_default('warmup')}")] = None,
    prompt_tokens: Annotated[int | None, typer.Option("--prompt-tokens", min=1, metavar="TOKENS",
                                                      help="the fixed prompt length of every request "
                                                      f"{_default('prompt_tokens')}")] = None,
    output_tokens: Annotated[int | None, typer.Option("--output-tokens", min=1, metavar="TOKENS",
                                                      help="the fixed output length of every request "
                                                      f"{_default('output_tokens')}")] = None,
    ab: Annotated[str | None, typer.Option("--ab", metavar="SECTION.KEY=VALUE",
                                           help="a second arm with this one setting changed, like "
                                                "serve.env.NCCL_P2P_DISABLE=1; the unit is put back after")] = None,
    prometheus: Annotated[Path | None, typer.Option("--prometheus", help="write the figures as Prometheus "
                                                                            "text")] = None,
    png: Annotated[Path | None, typer.Option("--plot", help="a PNG of per-request tok/s per arm (matplotlib)")] = None,
) -> None:
    """Benchmark the served engine (it gates nothing): fixed lengths, warm-up left out, the server's own figures."""
    from p2pkit import bench as b
    from p2pkit.artifacts import atomic_write
    from p2pkit.stages import service

    ctx = common.context()
    b.gate(ctx)
    cfg = ctx.profile.bench
    doc = b.run(ctx, prompt_tokens or cfg.prompt_tokens, output_tokens or cfg.output_tokens,
                cfg.warmup if warmup is None else warmup, requests or cfg.requests, ab)
    failed = [a for a in doc["arms"] if a.get("error")]
    if failed:
        doc["server_log_tail"] = service.logs(ctx.host, 12)
    if png:  # optional: without matplotlib bench says so and the JSON is written all the same
        try:
            plot(doc, png)
            doc["plot"] = str(png)
        except MissingError as e:
            doc["plot_skipped"] = e.message
            ctx.out.warn(f"{e.message}: no PNG written ({e.hint})")
    doc["artifact"] = str(ctx.store.write("bench", doc))
    if prometheus:
        atomic_write(prometheus, prometheus_text(doc).encode())
    if ctx.out.json_mode:
        ctx.out.document(doc)
    else:
        sh = doc["shape"]
        ctx.out.table(f"bench: {doc['engine']}, prompt {sh['prompt_tokens']} / output {sh['output_tokens']} tokens, "
                      f"{sh['warmup']} warm-up + {sh['requests']} timed",
                      ["arm", "done", "decode tok/s median (min-max)", "/metrics decode tok/s", "prefill tok/s",
                       "TTFT ms (server)", "client tok/s (not the measure)", "draft acceptance", "error"], rows(doc))
        if "ab_ratio_decode" in doc:
            ctx.out.line(f"A/B decode ratio ({ab} / baseline): {doc['ab_ratio_decode']}")
        if "restored" in doc:
            ctx.out.line(f"unit restored byte for byte: {doc['restored']['files_identical']}, healthy again: "
                         f"{doc['restored']['health']}")
        ctx.out.line(f"artifact: {doc['artifact']}")
    if failed:
        ctx.out.error("; ".join(f"{a['arm']}: {a['error']}" for a in failed) + ". The server's last lines: "
                      + " | ".join(doc["server_log_tail"][-6:]), "read `p2pkit serve logs`; the requests done so far "
                      f"are kept in {doc['artifact']}")
        raise typer.Exit(int(Exit.CHECK_FAILED))
    if "restored" in doc and not doc["restored"]["files_identical"]:
        raise typer.Exit(int(Exit.CHECK_FAILED))
