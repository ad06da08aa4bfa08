"""Condition guards for P18, the VRAM fit the service stage judges before a start and the headroom it
reads after (p2pkit/stages/service/fit.py: check, _kv_types, headroom): each test gives the check the
facts where one condition decides a finding, and asserts the finding's status, id, pitfall and its
figure or text, so that the condition replaced by True or by False is noticed."""

from __future__ import annotations

import pytest

from p2pkit.core import config
from p2pkit.stages.service import fit
from tests.test_guards_cond_engine_cmd import DROP, prof  # serve.flags changed, DROP removes one

GIB = 1 << 30
LLAMA = config.load("dual-5090-llamacpp")  # tensor split 0.5,0.5, ctx 95000, q4_0 K and V, MTP drafting
NINFER = config.load("dual-5090-ninfer")  # TP2, max-context 131072, nvfp4 KV, DFlash2
SPARK = config.load("dual-spark-vllm")  # one GPU a node, TP2 over two nodes, gpu-memory-utilization 0.85
HEAD = 2 * GIB  # every built-in profile's serve.vram_headroom_gib
Q4 = 18 / 32  # q4_0: bytes per element

# 4 KV heads x (256 + 256) x q4_0 = 1,152 bytes a token of context in each layer
SHAPE = {"layers": 64, "kv_heads": 4, "head_dim_k": 256, "head_dim_v": 256, "draft_layers": 3,
         "weights_bytes": 50 * GIB, "context_length": 262144}
PER_TOK = 4 * (256 * Q4 + 256 * Q4)




def gpus(*free, total=32 * GIB, engine_used=0) -> list[dict]:
    return [{"index": i, "total": total, "free": x, "engine_used": engine_used} for i, x in enumerate(free)]


def facts(model=None, free=(31.5 * GIB, 31.5 * GIB), refused=False, **more) -> dict:
    return {"model": SHAPE if model is None else model, "gpus": gpus(*free), "tp_quant_kv_refused": refused, **more}


def by_id(out: list) -> dict:
    ids = [c.id for c in out]
    assert len(ids) == len(set(ids)), ids
    return {c.id: c for c in out}


# ------------------------------------------------------------------------------------ check: inputs

def test_check_and_headroom_without_their_fact_say_nothing():
    assert fit.check(None, LLAMA) == []
    assert fit.headroom(None, LLAMA) == []


@pytest.mark.parametrize("fact", [
    {"error": "NVML did not initialise: Driver Not Loaded"},
    # a failed reading that says more than its error (how to read it by hand), the rest of the facts beside it
    {"error": "NVML did not initialise: Driver Not Loaded", "by_hand": "nvidia-smi", **facts()},
])
def test_check_a_fit_that_could_not_be_read_is_one_could_not_determine(fact):
    out = fit.check(fact, LLAMA)
    assert len(out) == 1, out
    c = out[0]
    assert (c.id, c.status, c.pitfall) == ("service.vram_fit", "skip", "P18")
    assert c.measured == "could not determine: NVML did not initialise: Driver Not Loaded"


@pytest.mark.parametrize("model,why", [
    ({"error": "/srv/x.gguf does not exist yet (the model stage writes it)"},
     "/srv/x.gguf does not exist yet (the model stage writes it)"),
    # an unreadable GGUF: model_shape keeps the file's size beside the reader's error
    ({"error": "not a readable GGUF file: bad magic", "weights_bytes": 50 * GIB},
     "not a readable GGUF file: bad magic"),
])
def test_check_a_model_not_read_is_could_not_determine_after_the_kv_split(model, why):
    found = by_id(fit.check(facts(model=model), LLAMA))
    assert set(found) == {"service.kv_split", "service.vram_fit"}
    assert found["service.kv_split"].status == "pass"  # judged from the profile and the tree, not the model
    c = found["service.vram_fit"]
    assert c.status == "skip" and c.pitfall == "P18" and c.measured == f"could not determine: {why}"


@pytest.mark.parametrize("reading,why", [
    ([], "no GPU free-memory reading"),
    ({"error": "NVML did not initialise: Driver Not Loaded"}, "NVML did not initialise: Driver Not Loaded"),
    ({"error": "NVML did not initialise: Driver Not Loaded", "by_hand": "nvidia-smi"},
     "NVML did not initialise: Driver Not Loaded"),
])
def test_check_no_gpu_reading_is_one_could_not_determine(reading, why):
    found = by_id(fit.check({**facts(), "gpus": reading}, LLAMA))
    assert set(found) == {"service.kv_split", "service.vram_fit"}
    c = found["service.vram_fit"]
    assert c.status == "skip" and c.pitfall == "P18" and c.measured == f"could not determine: {why}"


@pytest.mark.parametrize("k,v", [("q3_k", "q4_0"), ("q4_0", "q3_k")])
def test_check_a_kv_type_the_check_does_not_know_fails(k, v):
    p = prof(LLAMA, split_mode="layer", cache_type_k=k, cache_type_v=v)
    found = by_id(fit.check(facts(), p))
    assert set(found) == {"service.vram_fit"}
    c = found["service.vram_fit"]
    assert c.status == "fail" and c.pitfall == "P18" and c.measured == f"unknown KV type {k}/{v}"
    assert "q4_0" in c.expected and c.hint == "use a KV type the engine knows"


# ------------------------------------------------------------------------- check: what it counts

def need_gib(share, ctx, layers, per_tok=PER_TOK, weights=50 * GIB, extra_kv=0.0) -> float:
    """What one GPU must hold, in GiB: its share of the weights and of the KV at the context, plus the headroom."""
    return (share * (weights + layers * ctx * per_tok + extra_kv) + HEAD) / GIB


def max_ctx(share, free, per_ctx, weights=50 * GIB) -> int:
    return int(max(0.0, free - HEAD - share * weights) // per_ctx)


def test_check_counts_the_profiles_context_and_both_gpus():
    found = by_id(fit.check(facts(), LLAMA))
    for i in (0, 1):
        c = found[f"service.vram_fit.gpu{i}"]
        assert c.status == "pass" and c.pitfall == "P18" and c.unit == "GiB" and c.op == "<="
        assert c.value == pytest.approx(need_gib(0.5, 95000, 64 + 3))  # the draft (MTP) layers' KV too
        assert c.limit == 31.5
        assert "at 95000 tokens q4_0/q4_0" in c.measured
        assert f"fits up to {max_ctx(0.5, 31.5 * GIB, 0.5 * 67 * PER_TOK)} tokens" in c.measured


def test_check_without_a_context_flag_counts_the_models_own_context():
    p = prof(LLAMA, ctx_size=DROP)
    c = by_id(fit.check(facts(model={**SHAPE, "context_length": 4096}), p))["service.vram_fit.gpu0"]
    assert c.status == "pass" and "at 4096 tokens q4_0/q4_0" in c.measured
    assert c.value == pytest.approx(need_gib(0.5, 4096, 67))


@pytest.mark.parametrize("spec,layers", [("draft-mtp", 64 + 3), ("none", 64)])
def test_check_counts_the_draft_layers_only_while_drafting(spec, layers):
    c = by_id(fit.check(facts(), prof(LLAMA, spec_type=spec)))["service.vram_fit.gpu0"]
    assert c.value == pytest.approx(need_gib(0.5, 95000, layers))
    draft_kv = 0.5 * 3 * 95000 * PER_TOK / GIB if spec != "none" else 0.0
    assert f"draft KV {draft_kv:.1f})" in c.measured
    assert f"fits up to {max_ctx(0.5, 31.5 * GIB, 0.5 * layers * PER_TOK)} tokens" in c.measured


DRAFT = {"path": "/srv/models/draft.gguf", "layers": 4, "kv_heads": 4, "head_dim_k": 128, "head_dim_v": 128,
         "weights_bytes": GIB}
DRAFT_TOK = 4 * (128 * 2.0 + 128 * 2.0)  # the draft model's own KV: f16


def test_check_counts_a_draft_models_weights_and_its_own_kv():
    c = by_id(fit.check(facts(model={**SHAPE, "draft_model": DRAFT}), LLAMA))["service.vram_fit.gpu0"]
    assert c.status == "pass" and c.pitfall == "P18"
    assert c.value == pytest.approx(need_gib(0.5, 95000, 67, weights=51 * GIB, extra_kv=4 * 95000 * DRAFT_TOK))
    assert "(weights 25.5 with the draft model's 0.50 + KV" in c.measured
    per_ctx = 0.5 * (67 * PER_TOK + 4 * DRAFT_TOK)
    assert f"fits up to {max_ctx(0.5, 31.5 * GIB, per_ctx, weights=51 * GIB)} tokens" in c.measured
    plain = by_id(fit.check(facts(), LLAMA))["service.vram_fit.gpu0"]
    assert "draft model's" not in plain.measured


@pytest.mark.parametrize("draft,why", [
    ({"path": "/x.gguf", "error": "the draft model /x.gguf does not exist"}, "the draft model /x.gguf does not exist"),
    # a reading that failed is never counted, whatever else it says
    ({**DRAFT, "error": "not a readable GGUF file: truncated"}, "not a readable GGUF file: truncated"),
    ({"path": "/x.gguf", "layers": 4, "kv_heads": 4, "head_dim_k": 128, "weights_bytes": GIB},
     "the draft model /x.gguf does not say its shape"),
])
def test_check_a_draft_model_not_read_is_could_not_determine(draft, why):
    found = by_id(fit.check(facts(model={**SHAPE, "draft_model": draft}), LLAMA))
    assert set(found) == {"service.kv_split", "service.vram_fit"}
    c = found["service.vram_fit"]
    assert c.status == "skip" and c.pitfall == "P18" and c.measured == f"could not determine: {why}"
    assert c.title == "the model and its draft model fit the GPUs' free VRAM"


# ---------------------------------------------------------------------------- check: each GPU

def test_check_a_gpu_with_no_share_is_not_judged():
    found = by_id(fit.check(facts(), prof(LLAMA, split_mode="none")))
    assert "service.vram_fit.gpu0" in found and "service.vram_fit.gpu1" not in found
    assert found["service.vram_fit.gpu0"].value == pytest.approx(need_gib(1.0, 95000, 67))


def test_check_each_gpu_is_judged_on_its_own_reading_by_its_index():
    f = facts(free=(31.5 * GIB, 24 * GIB))
    f["gpus"] = f["gpus"][::-1]  # NVML's order is not the GPU's index
    found = by_id(fit.check(f, prof(LLAMA, tensor_split="3,1")))
    g0, g1 = found["service.vram_fit.gpu0"], found["service.vram_fit.gpu1"]
    assert g0.limit == 31.5 and g1.limit == 24.0
    assert g0.value == pytest.approx(need_gib(0.75, 95000, 67))
    assert g1.value == pytest.approx(need_gib(0.25, 95000, 67))


@pytest.mark.parametrize("reading", [[{"index": 0, "total": 32 * GIB, "free": 31.5 * GIB, "engine_used": 0}],
                                     gpus(31.5 * GIB, None)])
def test_check_a_gpu_without_a_free_reading_fails_could_not_determine(reading):
    found = by_id(fit.check({**facts(), "gpus": reading}, LLAMA))
    assert found["service.vram_fit.gpu0"].status == "pass"
    c = found["service.vram_fit.gpu1"]
    assert c.status == "fail" and c.pitfall == "P18"
    assert c.measured == "could not determine: no free-memory reading for GPU 1"


def test_check_what_the_running_engine_holds_counts_as_free():
    f = {**facts(), "gpus": gpus(20 * GIB, 20 * GIB, engine_used=11.5 * GIB)}
    c = by_id(fit.check(f, LLAMA))["service.vram_fit.gpu0"]
    assert c.status == "pass" and c.limit == 31.5
    none = by_id(fit.check(facts(), LLAMA))["service.vram_fit.gpu0"]
    assert none.limit == 31.5  # nothing held: the free reading alone, to the byte


@pytest.mark.parametrize("total,limit", [(128 * GIB, 0.85 * 128), (None, 0.85 * 120)])
def test_check_vllm_holds_to_its_memory_utilization(total, limit):
    """vLLM takes gpu-memory-utilization of the GPU's total, never more than is free; with no total read,
    of what is free."""
    shape = {**SHAPE, "context_length": None}
    f = {"model": shape, "gpus": [{"index": 0, "total": total, "free": 120 * GIB, "engine_used": 0}]}
    c = by_id(fit.check(f, SPARK))["service.vram_fit.gpu0"]
    assert c.limit == pytest.approx(limit) and c.pitfall == "P18"
    assert "at 262144 tokens auto/auto" in c.measured


def test_check_a_model_with_no_kv_per_token_is_judged_on_its_weights():
    c = by_id(fit.check(facts(model={**SHAPE, "kv_heads": 0}), LLAMA))["service.vram_fit.gpu0"]
    assert c.status == "pass" and c.value == pytest.approx((0.5 * 50 * GIB + HEAD) / GIB)


def test_check_a_model_that_does_not_fit_names_the_largest_context():
    c = by_id(fit.check(facts(), prof(LLAMA, ctx_size=200000)))["service.vram_fit.gpu0"]
    n = max_ctx(0.5, 31.5 * GIB, 0.5 * 67 * PER_TOK)
    assert c.status == "fail" and c.pitfall == "P18" and f"serve.flags.ctx-size to at most {n}," in c.hint


# --------------------------------------------------------------------------------------- _kv_types

@pytest.mark.parametrize("k,v,refused,status,measured,expected,why", [
    ("q4_0", "q4_0", False, "pass", "q4_0/q4_0", "not iq4_nl/q4_1/q5_0/q5_1", ""),
    ("iq4_nl", "q4_0", False, "fail", "iq4_nl/q4_0 (iq4_nl refused)", "not iq4_nl/q4_1/q5_0/q5_1", "#27116"),
    ("q4_0", "q5_1", False, "fail", "q4_0/q5_1 (q5_1 refused)", "not iq4_nl/q4_1/q5_0/q5_1", "#27116"),
    ("f16", "bf16", True, "pass", "f16/bf16", "bf16/f16/f32", ""),
    ("q4_0", "f16", True, "fail", "q4_0/f16 (q4_0 refused)", "bf16/f16/f32", "#23792"),
    ("q8_0", "q4_0", True, "fail", "q8_0/q4_0 (q4_0, q8_0 refused)", "bf16/f16/f32", "#23792"),
])
def test_kv_types_the_built_tree_takes_with_tensor_split(k, v, refused, status, measured, expected, why):
    p = prof(LLAMA, cache_type_k=k, cache_type_v=v)
    c = by_id(fit.check(facts(refused=refused), p))["service.kv_split"]
    assert c.status == status and c.pitfall == "P18" and c.measured == measured and c.expected == expected
    assert (why in c.hint) if why else c.hint == ""


def test_kv_types_judged_for_llamacpp_tensor_split_only():
    layer = prof(LLAMA, split_mode="layer", cache_type_k="iq4_nl", cache_type_v="iq4_nl")
    assert "service.kv_split" not in by_id(fit.check(facts(refused=True), layer))
    ninfer = {"model": SHAPE, "gpus": gpus(31.5 * GIB, 31.5 * GIB)}  # no llama.cpp tree read for NInfer
    assert "service.kv_split" not in by_id(fit.check(ninfer, NINFER))


def test_kv_types_a_tree_that_could_not_be_read_fails_could_not_determine():
    c = by_id(fit.check(facts(refused=None), LLAMA))["service.kv_split"]
    assert c.status == "fail" and c.pitfall == "P18"
    assert c.measured == "could not determine: the llama.cpp source tree was not readable"


# ---------------------------------------------------------------------------------------- headroom

def test_headroom_is_the_least_free_gpu_against_the_profiles_headroom():
    c = fit.headroom({"gpus": [{"index": 0, "free": 3 * GIB}, {"index": 1, "free": GIB}]}, LLAMA)[0]
    assert c.id == "service.vram_headroom" and c.status == "warn" and c.pitfall == "P18"
    assert c.value == 1.0 and c.limit == 2.0 and "GPU 1: 1.0 GiB free" in c.measured
    ok = fit.headroom({"gpus": [{"index": 0, "free": 3 * GIB}, {"index": 1, "free": None}]}, LLAMA)
    assert len(ok) == 1 and ok[0].status == "pass" and ok[0].value == 3.0
    assert ok[0].measured == "3.0 GiB (GPU 0: 3.0 GiB free)"


def test_headroom_no_free_reading_on_any_gpu_is_no_reading():
    out = fit.headroom({"gpus": [{"index": 0, "free": None}, {"index": 1, "free": None}]}, LLAMA)
    assert len(out) == 1 and out[0].status == "pass" and out[0].measured == "no reading" and out[0].pitfall == "P18"


@pytest.mark.parametrize("after,why", [
    ({"error": "NVML did not initialise"}, "NVML did not initialise"),
    ({"error": "NVML did not initialise", "by_hand": "nvidia-smi"}, "NVML did not initialise"),
    ({"gpus": {"error": "NVML did not initialise"}}, "None"),
])
def test_headroom_not_read_is_could_not_determine(after, why):
    out = fit.headroom(after, LLAMA)
    assert len(out) == 1
    c = out[0]
    assert c.id == "service.vram_headroom" and c.status == "skip" and c.pitfall == "P18"
    assert c.measured == f"could not determine: {why}"
