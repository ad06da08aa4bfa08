"""P18: does the model fit the GPUs before the service starts, and what headroom is left after.
What cannot be read yet (no NVML before the driver stage, no model before the model stage) is a
"could not check", never a pass.

Weights, the KV cache at the configured context and KV type, and the draft (MTP) layers' KV, split
over the GPUs the engine uses, against each GPU's free VRAM (plus what the engine itself already
holds, when it runs) less the profile's headroom (serve.vram_headroom_gib). KV bytes per token:
layers x KV heads x (K head dim x K bytes + V head dim x V bytes); every layer is counted, so a
hybrid model with linear-attention layers is over-estimated, never under.

What the fit reads of the flags (the context, the KV types, the draft, each GPU's share) and the rules of
one engine's own (llama.cpp's KV types under tensor split) are the engine module's: fit_plan and
fit_checks in p2pkit/rules/engines.
"""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.rules import engines
from p2pkit.rules.findings import FAIL, PASS, WARN, Check, failed, figure, show, unknown

GIB = 1 << 30
# bytes per element: ggml's block types are (block bytes / 32 elements)
KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "fp16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
            "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
            "int8": 1.0, "nvfp4": 0.5625, "auto": 2.0}
FIT_FIX = "lower the context ({ctx}), pick a smaller KV type (q4_0 at 95K fit where 100K did not, seed 003) or " \
          "fewer draft tokens, or raise the GPUs' free VRAM (close what else uses them)"


def plan(p: Profile) -> dict:
    """What the profile asks of VRAM: context, K/V types, draft, and each GPU's share (the engine's fit_plan)."""
    return engines.of(p).fit_plan(p)


def kv_per_token(m: dict, k: str, v: str) -> float:
    return m["kv_heads"] * (m["head_dim_k"] * KV_BYTES[k] + m["head_dim_v"] * KV_BYTES[v])


def check(fit: dict | None, p: Profile) -> list[Check]:
    """P18 before start: the engine's own fit rules, then whether the model (and its draft) fits each GPU the
    engine uses, or why that cannot be read."""
    if fit is None:
        return []
    if failed(fit) or "error" in fit:
        return [unknown("service.vram_fit", "the model fits the GPUs' free VRAM", fit, "fits", needed=False,
                        pitfall="P18")]
    pl = plan(p)
    out = engines.of(p).fit_checks(fit, p, pl)
    m, gpus = fit.get("model", {}), fit.get("gpus", [])
    cannot = _cannot_fit(m, gpus, pl)
    if cannot:
        return [*out, cannot]
    ctx = int(pl["ctx"] or m.get("context_length") or 0)
    b = _model_bytes(m, pl, ctx)
    if isinstance(b, Check):
        return [*out, b]
    head = p.serve.vram_headroom_gib * GIB
    for i, share in enumerate(pl["shares"]):
        if share <= 0:
            continue
        out.append(_gpu_fit(i, share, next((x for x in gpus if x.get("index") == i), None), m, b, pl, ctx, head))
    return out


def _cannot_fit(m: dict, gpus: list | dict, pl: dict) -> Check | None:
    """Why the fit cannot be judged: no model reading, no GPU free-memory reading, or a KV type with no size."""
    if failed(m) or "error" in m:
        return unknown("service.vram_fit", "the model fits the GPUs' free VRAM", m, "fits", needed=False,
                       pitfall="P18")
    if failed(gpus) or not isinstance(gpus, list) or not gpus:
        return unknown("service.vram_fit", "the model fits the GPUs' free VRAM",
                       gpus if isinstance(gpus, dict) else {"error": "no GPU free-memory reading"}, "fits",
                       needed=False, pitfall="P18")
    if pl["k"] not in KV_BYTES or pl["v"] not in KV_BYTES:
        return Check("service.vram_fit", "the model fits the GPUs' free VRAM", FAIL,
                     f"unknown KV type {pl['k']}/{pl['v']}", "/".join(sorted(KV_BYTES)), "use a KV type the "
                     "engine knows", "P18")
    return None


def _model_bytes(m: dict, pl: dict, ctx: int) -> dict | Check:
    """The whole model's bytes at the context (KV per token, KV, the draft's KV, the weights, the draft model's
    included), or why a draft model's shape cannot be counted."""
    per_tok = kv_per_token(m, pl["k"], pl["v"])
    kv = m["layers"] * ctx * per_tok
    draft_kv = (m.get("draft_layers") or 0) * ctx * per_tok if pl["draft"] else 0.0
    weights = float(m["weights_bytes"])
    dm = m.get("draft_model")
    if dm is not None:
        if "error" in dm or not all(dm.get(k) for k in ("layers", "kv_heads", "head_dim_k", "head_dim_v")):
            return unknown("service.vram_fit", "the model and its draft model fit the GPUs' free VRAM",
                           {"error": dm.get("error") or f"the draft model {dm.get('path')} does not say its "
                            "shape"}, "fits", needed=False, pitfall="P18")
        # the draft's own KV cache: f16 unless --spec-draft-type-k/-v say otherwise (llama-server --help)
        draft_kv += int(dm["layers"]) * ctx * kv_per_token(dm, "f16", "f16")
        weights += float(dm["weights_bytes"])
    return {"per_tok": per_tok, "kv": kv, "draft_kv": draft_kv, "weights": weights, "dm": dm}


def _gpu_fit(i: int, share: float, g: dict | None, m: dict, b: dict, pl: dict, ctx: int, head: float) -> Check:
    """GPU i's share of the model and the headroom against its free VRAM (and what the engine holds there), with
    the longest context that would fit."""
    if g is None or g.get("free") is None:
        return unknown(f"service.vram_fit.gpu{i}", f"GPU {i}: the model fits its free VRAM",
                       {"error": f"no free-memory reading for GPU {i}"}, "fits", pitfall="P18")
    per_tok, kv, draft_kv, weights, dm = b["per_tok"], b["kv"], b["draft_kv"], b["weights"], b["dm"]
    avail = float(g["free"]) + float(g.get("engine_used") or 0)
    if "utilization" in pl:
        avail = min(avail, pl["utilization"] * float(g.get("total") or avail))
    need = share * (weights + kv + draft_kv)
    per_ctx = share * ((m["layers"] + ((m.get("draft_layers") or 0) if pl["draft"] else 0)) * per_tok
                       + (int(dm["layers"]) * kv_per_token(dm, "f16", "f16") if dm else 0))
    max_ctx = int(max(0.0, avail - head - share * weights) // per_ctx) if per_ctx else 0
    # the figure: what the GPU must hold (the model's share and the headroom) against what it has free
    parts = (f"needs {show(need / GIB, 'GiB')} (weights {share * weights / GIB:.1f}"
             + (f" with the draft model's {share * float(dm['weights_bytes']) / GIB:.2f}" if dm else "")
             + f" + KV {share * kv / GIB:.1f} at {show(ctx, 'tokens')} {pl['k']}/{pl['v']} + draft KV "
             f"{share * draft_kv / GIB:.1f}) + headroom {show(head / GIB, 'GiB')}; fits up to "
             f"{show(max_ctx, 'tokens')}")
    return figure(f"service.vram_fit.gpu{i}", f"GPU {i}: the model fits its free VRAM", (need + head) / GIB,
                  "<=", avail / GIB, "GiB", f"it would run out of memory at start (P18): set serve.flags."
                  f"{pl['ctx_flag']} to at most {max_ctx}, or " + FIT_FIX.format(ctx=pl["ctx_flag"]),
                  pitfall="P18", context=parts, expected_context="free")


def headroom(after: dict | None, p: Profile) -> list[Check]:
    """After start: the free VRAM NVML reads on each GPU the engine uses, against the headroom."""
    if after is None:
        return []
    if failed(after) or not isinstance(after.get("gpus"), list):
        return [unknown("service.vram_headroom", "VRAM headroom after start", after, "measured", needed=False,
                        pitfall="P18")]
    head = p.serve.vram_headroom_gib * GIB
    read = [g for g in after["gpus"] if g.get("free") is not None]
    fix = ("the engine left less headroom than the profile asks: a longer prompt or a second request can run out "
           "of memory (P18); lower the context or the KV type")
    if not read:
        return [Check("service.vram_headroom", "VRAM headroom after start", PASS, "no reading",
                      f">= {show(head / GIB, 'GiB')} free on each GPU", "", "P18")]
    # the figure: the least free VRAM of any GPU the engine uses, against the headroom
    return [figure("service.vram_headroom", "VRAM headroom after start", min(g["free"] for g in read) / GIB, ">=",
                   head / GIB, "GiB", fix, "P18", WARN, expected_context="free on each GPU",
                   context=", ".join(f"GPU {g['index']}: {show(g['free'] / GIB, 'GiB')} free" for g in read))]
