"""`p2pkit bench`: the served engine's throughput from its own accounting; an A/B with --ab."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.core.errors import Exit, MissingError


def _fmt(s: dict | None, unit: str = "") -> str:
    if not s:
        return "-"
    return f"{s['median']:g}{unit} ({s['min']:g}-{s['max']:g})"


def levels(arm: dict) -> list[dict]:
    """An arm's levels (shape x concurrency); an arm recorded without levels is one level of its own."""
    return arm.get("levels") or [{"shape": "-", "concurrency": 1, **arm}]


def rows(doc: dict) -> list[list]:
    """One row per arm and level."""
    out = []
    for a in doc["arms"]:
        for lv in levels(a):
            s = lv.get("summary", {})
            out.append([a["arm"], lv.get("shape", "-"), lv.get("concurrency", 1), len(lv["requests"]),
                        _fmt(s.get("decode_tps")), s.get("aggregate_decode_tps", "-"),
                        s.get("metrics_decode_tps", s.get("log_decode_tps", "-")),
                        _fmt(s.get("prefill_tps")), _fmt(s.get("ttft_ms")), _fmt(s.get("client_tps")),
                        s.get("draft_acceptance", "-"),
                        lv.get("error") or (f"spoiled: {lv['spoiled']}" if lv.get("spoiled") else a.get("error", ""))])
    return out


def title(doc: dict) -> str:
    """The table's title: every shape's lengths (two shapes: both), the warm-up and the timed requests."""
    sh = doc["shape"]
    seen = list(dict.fromkeys((lv.get("shape", "-"), lv.get("prompt_tokens"), lv.get("output_tokens"))
                              for lv in doc.get("levels") or []))
    if len(seen) > 1 or (seen and seen[0][0] not in ("profile", "-")):
        lengths = ", ".join(f"{s_} prompt {lp} / output {lo} tokens" for s_, lp, lo in seen)
    else:
        lengths = f"prompt {sh['prompt_tokens']} / output {sh['output_tokens']} tokens"
    return f"bench: {doc['engine']}, {lengths}, {sh['warmup']} warm-up + {sh['requests']} timed"


def _ints(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 or v > 256 for v in vals):
        from p2pkit.core.errors import UsageError

        raise UsageError(f"{what} {text!r}: expected a comma-separated list of whole numbers from 1 to 256",
                         hint=f"for example {what} 1,2,4,8")
    return vals


def _shapes(text: str | None) -> list[str] | None:
    from p2pkit.app.bench import SHAPES

    if text is None:
        return None
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in SHAPES]
    if not names or bad:
        from p2pkit.core.errors import UsageError

        raise UsageError(f"--shapes {text!r}: unknown shape {', '.join(bad) or '(none given)'}",
                         hint="shapes are " + ", ".join(f"{k} ({v[0]} prompt / {v[1]} output tokens)"
                                                        for k, v in SHAPES.items()))
    return names


def _label(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(doc: dict) -> str:
    """The bench figures as Prometheus text: one HELP/TYPE per family, a sample per arm and level, each
    labelled with its arm, engine, shape, concurrency and lengths (two shapes, or two concurrency levels,
    never collapse into one sample)."""
    fams = (("p2pkit_bench_decode_tokens_per_second", "decode_tps",
             "median decode tok/s per stream from the server's timings"),
            ("p2pkit_bench_prefill_tokens_per_second", "prefill_tps", "median prefill tok/s from the server's timings"),
            ("p2pkit_bench_time_to_first_token_seconds", "ttft_ms", "median time to first token (server prompt_ms)"),
            ("p2pkit_bench_aggregate_decode_tokens_per_second", "aggregate_decode_tps",
             "output tokens the server counted over the level's wall time, all streams"))
    lines = []
    for name, key, help_ in fams:
        samples = []
        for a in doc["arms"]:
            for lv in levels(a):
                st = (lv.get("summary") or {}).get(key)
                if st is None or st == {}:
                    continue
                v = st["median"] if isinstance(st, dict) else st
                v = v / 1000 if key == "ttft_ms" else v
                labels = {"arm": a["arm"], "engine": doc["engine"], "shape": lv.get("shape", "-"),
                          "concurrency": lv.get("concurrency", 1),
                          "prompt_tokens": lv.get("prompt_tokens", doc.get("shape", {}).get("prompt_tokens", "")),
                          "output_tokens": lv.get("output_tokens", doc.get("shape", {}).get("output_tokens", ""))}
                text = ",".join(f'{k}="{_label(x)}"' for k, x in labels.items())
                samples.append(f"{name}{{{text}}} {v:g}")
        if samples:
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", *samples]
    return "\n".join(lines) + "\n"


def figure(doc: dict):
    """The figure `plot` saves: one panel per shape; the concurrency levels are the x axis's categories (1, 2,
    4, 8 evenly spaced, each labelled; one level is one category, not a number line around it), each arm's
    points beside the others' at a level (never on top of them): the per-stream median with its spread
    (min-max) as error bars, the aggregate as a hollow square; the legend below the panels, off the points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(lv["shape"] for a in doc["arms"] for lv in levels(a)))
    arms = [a for a in doc["arms"] if any(per_stream(lv.get("summary")) for lv in levels(a))]
    fig, axes = plt.subplots(1, len(shapes), figsize=(max(8.5, 6 * len(shapes)), 4.8), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        _panel(ax, doc, shape, arms)
    _legend(fig, axes, arms, shapes)
    return fig


def per_stream(s: dict | None) -> dict | None:
    """A level's per-stream decode tok/s from the server's own accounting: the median of its requests' own figures
    with their spread where each request has one, else the level's mean from the engine's counters (vLLM at
    several streams: the tokens after the first over the decode time it summed over the level's requests)."""
    s = s or {}
    if s.get("decode_tps"):
        return s["decode_tps"]
    m = s.get("metrics_decode_tps")
    return {"median": m, "min": m, "max": m, "n": 1} if m else None


def _panel(ax, doc: dict, shape: str, arms: list[dict]) -> None:
    """One shape's panel: each arm's points, the references, the title and the axes."""
    concs = sorted({lv["concurrency"] for a in doc["arms"] for lv in levels(a) if lv["shape"] == shape})
    width = 0.7 / max(1, len(arms))  # the arms share 70% of a category's width
    top = 0.0
    for i, a in enumerate(arms):
        lvs = [lv for lv in levels(a) if lv["shape"] == shape and per_stream(lv.get("summary"))]
        if lvs:
            xs = [concs.index(lv["concurrency"]) + (i - (len(arms) - 1) / 2) * width for lv in lvs]
            top = max(top, _arm_points(ax, a, lvs, xs))
    top = max(top, _references(ax, doc, shape, concs))
    lv0 = next((lv for a in doc["arms"] for lv in levels(a) if lv["shape"] == shape), {})
    ax.set_title(f"{'SIMULATED ' if doc.get('simulated') else ''}{doc['engine']}, {shape}: prompt "
                 f"{lv0.get('prompt_tokens', doc['shape']['prompt_tokens'])} / output "
                 f"{lv0.get('output_tokens', doc['shape']['output_tokens'])}")
    ax.set_xticks(range(len(concs)), [str(c) for c in concs])
    ax.set_xlim(-0.5, len(concs) - 0.5)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("decode tok/s (server's own accounting)")


def _arm_points(ax, a: dict, lvs: list[dict], xs: list[float]) -> float:
    """An arm's per-stream medians with their spread, and its aggregates; the highest point drawn."""
    st = [per_stream(lv["summary"]) for lv in lvs]
    ys = [x["median"] for x in st]
    err = [[y - x["min"] for y, x in zip(ys, st)], [x["max"] - y for y, x in zip(ys, st)]]
    line = ax.errorbar(xs, ys, yerr=err, marker="o", linestyle="none", capsize=3, label=f"{a['arm']}: per stream")
    top = max(x["max"] for x in st)
    agg = [(x, lv["summary"]["aggregate_decode_tps"]) for x, lv in zip(xs, lvs)
           if lv["summary"].get("aggregate_decode_tps")]
    if agg:
        ax.plot([x for x, _ in agg], [y for _, y in agg], linestyle="none", marker="s", markerfacecolor="none",
                color=line[0].get_color(), label=f"{a['arm']}: aggregate")
        top = max(top, *(y for _, y in agg))
    return top


# the references measured at each level's stream count: the doc's key, its ratios' key, its marker, its legend entry
LEVEL_REFERENCES = (("batched_reference", "batched_ratios", "^", "llama-batched-bench: output tok/s (pl*tg/T)"),
                    ("serve_reference", "serve_ratios", "v", "vllm bench serve: output tok/s (its aggregate)"))


def _references(ax, doc: dict, shape: str, concs: list[int]) -> float:
    """The references at the levels' categories: llama-batched-bench's or vLLM's benchmark client's output tok/s
    at each stream count, each with the baseline aggregate's ratio to it written beside it ("x0.86"), and
    llama-bench's tg at one stream; the highest point drawn (0 without them)."""
    top = 0.0
    for key, ratios, marker, label in LEVEL_REFERENCES:
        ref = next((r for r in doc.get(key, {}).get("shapes", []) if r["shape"] == shape), None)
        pts = [(concs.index(x["streams"]), x["output_tps"]["median"], x["streams"])
               for x in (ref or {}).get("levels", []) if x["streams"] in concs and x.get("output_tps")]
        if not pts:
            continue
        ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], linestyle="none", marker=marker, color="black",
                label=label)
        top = max(top, *(y for _, y, _ in pts))
        for x, y, c in pts:
            row = next((r for r in doc.get(ratios, []) if r["shape"] == shape and r["streams"] == c), {})
            if row.get("aggregate_decode_ratio") is not None:
                ax.annotate(f"x{row['aggregate_decode_ratio']:.2f}", (x, y), xytext=(7, -3),
                            textcoords="offset points", fontsize="small")
    single = next((r for r in doc.get("reference", {}).get("shapes", []) if r["shape"] == shape), None)
    if single and single.get("decode_tps") and 1 in concs:
        ax.plot([concs.index(1)], [single["decode_tps"]["avg"]], marker="*", markersize=10, linestyle="none",
                color="black", label=f"llama-bench {single['decode_tps']['test']}")
        top = max(top, single["decode_tps"]["avg"])
    return top


def _legend(fig, axes, arms: list[dict], shapes: list[str]) -> None:
    """The legend below the panels, each arm's two entries together."""
    handles, labels = axes[0][0].get_legend_handles_labels()
    rank = {f"{a['arm']}: {what}": (i, j) for i, a in enumerate(arms) for j, what in enumerate(("per stream",
                                                                                               "aggregate"))}
    order = sorted(range(len(labels)), key=lambda k: rank.get(labels[k], (len(arms), 0)))
    handles, labels = [handles[k] for k in order], [labels[k] for k in order]
    if handles:
        ncol = 2 if len(shapes) == 1 else min(4, len(labels))  # an arm's two entries on one row
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize="small", frameon=False)
        fig.tight_layout(rect=(0, 0.055 * -(-len(labels) // ncol) + 0.02, 1, 1))
    else:
        fig.tight_layout()


def plot(doc: dict, path: Path) -> None:
    """A PNG of each arm's per-stream decode tok/s (the server's own figure) by concurrency (figure()). The
    arms and their request counts are also in the PNG's text chunks. Needs matplotlib (the `plot` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise MissingError("the PNG plot needs matplotlib, which is not installed",
                           hint="pip install 'p2pkit[plot]' (the JSON artifact is written without it)") from e
    import matplotlib.pyplot as plt

    fig = figure(doc)
    arms = "; ".join(f"{a['arm']}={sum(len(lv['requests']) for lv in levels(a))}" for a in doc["arms"])
    fig.savefig(path, format="png", metadata={"Title": "p2pkit bench", "Description": f"arms: {arms}"})
    plt.close(fig)


def _default(key: str) -> str:
    """Where an unset length comes from: the profile's [bench] key, and the built-in default."""
    from dataclasses import fields

    from p2pkit.core.config import Bench

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
    png: Annotated[Path | None, typer.Option("--plot", help="a PNG of tok/s per arm, shape and concurrency "
                                                             "(matplotlib)")] = None,
    shapes: Annotated[str | None, typer.Option("--shapes", metavar="decode,production",
                                               help="seed 000's workload shapes instead of the profile's lengths: "
                                                    "decode (128 prompt / 512 output tokens), production (2048 / "
                                                    "128)")] = None,
    concurrency: Annotated[str | None, typer.Option("--concurrency", metavar="1,2,4,8",
                                                    help="concurrent streams per level (default 1)")] = None,
    reference: Annotated[bool, typer.Option("--reference", help="the engine's own benchmark at the same lengths, "
                                                                "and the served figures as ratios of it: llama.cpp's "
                                                                "llama-bench (decode at the prompt's depth) and "
                                                                "llama-batched-bench at the levels' streams; vLLM's "
                                                                "vllm bench serve at the levels' streams")] = False,
) -> None:
    """Benchmark the served engine (it gates nothing): fixed lengths, warm-up left out, the server's own figures."""
    from contextlib import nullcontext

    from p2pkit.app import bench as b
    from p2pkit.core.artifacts import atomic_write
    from p2pkit.core.lock import state_lock
    from p2pkit.stages.service import act as service

    prometheus, png = common.output_file("--prometheus", prometheus), common.output_file("--plot", png)
    ctx = common.context()
    cfg = ctx.profile.bench
    shape_names, levels = _shapes(shapes), _ints(concurrency, "--concurrency")
    b.refuse(ctx.profile, levels, reference)  # usage this engine cannot take: exit 2 before the gate and the lock
    b.refuse_ab(ctx.profile, ab)  # and an --ab change the profile or the engine's start refuses
    # --ab changes the unit: it holds the host's lock, refused beside an `up` (exit 5) before anything
    with state_lock(ctx.store.dir, say=ctx.out.warn, root=ctx.host.root) if ab else nullcontext():
        b.gate(ctx)
        doc = b.run(ctx, prompt_tokens or cfg.prompt_tokens, output_tokens or cfg.output_tokens,
                    cfg.warmup if warmup is None else warmup, requests or cfg.requests, ab, shape_names, levels,
                    reference)
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
        _say(ctx, doc, ab)
    if failed:
        ctx.out.error("; ".join(f"{a['arm']}: {a['error']}" for a in failed) + ". The server's last lines: "
                      + " | ".join(doc["server_log_tail"][-6:]), "read `p2pkit serve logs`; the requests done so far "
                      f"are kept in {doc['artifact']}")
        raise typer.Exit(int(Exit.CHECK_FAILED))
    if "restored" in doc and not doc["restored"]["files_identical"]:
        raise typer.Exit(int(Exit.CHECK_FAILED))


def _say(ctx, doc: dict, ab: str | None) -> None:
    """bench's figures as text: the table, then what they must be read with."""
    ctx.out.table(title(doc),
                  ["arm", "shape", "streams", "done", "decode tok/s per stream, median (min-max)",
                   "aggregate decode tok/s", "/metrics decode tok/s", "prefill tok/s", "TTFT ms (server)",
                   "client tok/s (not the measure)", "draft acceptance", "error"], rows(doc))
    _say_lengths(ctx, doc)
    _say_references(ctx, doc)
    _say_batched(ctx, doc)
    _say_serve(ctx, doc)
    _say_levels(ctx, doc)
    if "ab_ratio_decode" in doc:
        ctx.out.line(f"A/B decode ratio ({ab} / baseline): {doc['ab_ratio_decode']}")
    if "restored" in doc:
        ctx.out.line(f"unit restored byte for byte: {doc['restored']['files_identical']}, healthy again: "
                     f"{doc['restored']['health']}")
    ctx.out.line(f"artifact: {doc['artifact']}")


def _say_lengths(ctx, doc: dict) -> None:
    """P13: a level whose server ran other lengths than were asked."""
    off = [(a["arm"], lv["shape"], lv["concurrency"], lv["summary"]["lengths"]) for a in doc["arms"]
           for lv in a.get("levels", []) if not (lv.get("summary") or {}).get("lengths", {}).get("match", True)]
    for arm, shape, c, ln in off:
        ctx.out.warn(f"P13: {arm}, {shape} at {c} stream(s): the server ran prompt {ln['prompt_n']} / output "
                     f"{ln['predicted_n']} tokens where {ln['asked'][0]} / {ln['asked'][1]} were asked: these "
                     "figures are not at the asked lengths")


def _say_references(ctx, doc: dict) -> None:
    """The served figures as ratios of llama-bench's, and what made one unreliable."""
    for r in doc.get("reference_ratios", []):
        ctx.out.line(f"{r['shape']}: served / llama-bench at {r['prompt_tokens']}/{r['output_tokens']} tokens: "
                     f"decode {r['decode_tps']['ratio']} ({r['decode_tps']['served_median']} vs "
                     f"{r['decode_tps']['llama_bench']}), prefill {r['prefill_tps']['ratio']} "
                     f"({r['prefill_tps']['served_median']} vs {r['prefill_tps']['llama_bench']})")
    for r in doc.get("reference_ratios", []):
        for k in ("decode_tps", "prefill_tps"):
            if r[k].get("unreliable"):
                ctx.out.warn(f"{r['shape']} {k.split('_')[0]} ratio unreliable: {r[k]['unreliable']}")
    for ref in doc.get("reference", {}).get("shapes", []):
        if "error" in ref:
            ctx.out.warn(f"reference (llama-bench) {ref['shape']}: {ref['error']}")


def _say_batched(ctx, doc: dict) -> None:
    """The aggregate as a ratio of llama-batched-bench's, and its errors."""
    for r in doc.get("batched_ratios", []):
        ctx.out.line(f"{r['shape']} at {r['streams']} stream(s): aggregate / llama-batched-bench "
                     f"{r['aggregate_decode_ratio']} ({r['aggregate_decode_tps']} vs "
                     f"{r['batched_bench_tps']:.1f}), "
                     f"over the server's own time {r['aggregate_server_decode_ratio']}"
                     + (f"; unreliable: {r['unreliable']}" if r.get("unreliable") else "")
                     + (f"; spoiled: {r['spoiled']}" if r.get("spoiled") else ""))
    for ref in doc.get("batched_reference", {}).get("shapes", []):
        if "error" in ref:
            ctx.out.warn(f"reference (llama-batched-bench) {ref['shape']}: {ref['error']}")


def _say_serve(ctx, doc: dict) -> None:
    """The aggregate as a ratio of vLLM's own benchmark client, and the levels it could not measure."""
    for r in doc.get("serve_ratios", []):
        ctx.out.line(f"{r['shape']} at {r['streams']} stream(s): aggregate / vllm bench serve "
                     f"{r['aggregate_decode_ratio']} ({r['aggregate_decode_tps']} vs {r['reference_tps']:.1f} tok/s)"
                     + (f"; unreliable: {r['unreliable']}" if r.get("unreliable") else "")
                     + (f"; spoiled: {r['spoiled']}" if r.get("spoiled") else ""))
    for ref in doc.get("serve_reference", {}).get("shapes", []):
        for lv in ref.get("levels", []):
            for k in ("error", "lengths"):
                if k in lv:
                    ctx.out.warn(f"{'P13: ' if k == 'lengths' else ''}reference (vllm bench serve) {ref['shape']} at "
                                 f"{lv['streams']} stream(s): {lv[k]}")


def _say_levels(ctx, doc: dict) -> None:
    """Each level's stalls, spoiled runs and drafting counts that disagree."""
    for a in doc["arms"]:
        for lv in a.get("levels", []):
            stalls = (lv.get("summary") or {}).get("stalls", [])
            if stalls:  # one line a level: how many, the worst, what it does to the aggregate (the JSON has each)
                st = max(stalls, key=lambda x: x["outside_s"])
                ctx.out.warn(f"{a['arm']}, {lv['shape']} at {lv['concurrency']} stream(s): {len(stalls)} request(s) "
                             "waited at the client well beyond the server's own time (the aggregate's wall holds "
                             f"that wait; the per-stream figures do not); the worst, stream {st['stream']} request "
                             f"{st['index']}: {st['client_first_byte_s']} s at the client against {st['server_s']} s "
                             f"of the server's ({st['outside_s']} s outside it)")
            for why in lv.get("spoiled_runs", []):
                ctx.out.warn(f"{a['arm']}, {lv['shape']} at {lv['concurrency']} stream(s) was spoiled and run "
                             f"again: {why}")
            src = (lv.get("summary") or {}).get("draft_sources")
            if src and src.get("agree") is False:
                ctx.out.warn(f"{a['arm']}, {lv['shape']} at {lv['concurrency']} stream(s): drafting's counts "
                             "differ between sources: " + ", ".join(
                                 f"{k} {v['accepted']}/{v['drafted']}" for k, v in src.items() if k != "agree"))
