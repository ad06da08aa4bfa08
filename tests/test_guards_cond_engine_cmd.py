"""Condition guards for the engine's own refusals mirrored before a start (p2pkit/rules/engine_cmd.py:
validate and the per-engine checks it runs, P10, P11, P20, P22, P26): each test gives validate the
profile where one condition decides a finding, and asserts the finding's status, id, pitfall and
measured text, so that the condition replaced by True or by False is noticed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pkit.core import config
from p2pkit.rules import engine_cmd
from p2pkit.rules.engines import llamacpp

NINFER = config.load("dual-5090-ninfer")
LLAMA = config.load("dual-5090-llamacpp")
SPARK = config.load("dual-spark-vllm")
DROP = object()


def prof(base: config.Profile, env: dict | None = None, nodes: int | None = None, cidr: str | None = None,
         host: str | None = None, **flags) -> config.Profile:
    """The profile with serve.flags changed (a flag's name with _ for -, DROP removes it), and serve.env,
    the node count, the fabric's subnet or the listening address when given."""
    f = dict(base.serve.flags)
    for k, v in flags.items():
        k = k.replace("_", "-")
        if v is DROP:
            f.pop(k, None)
        else:
            f[k] = v
    serve = replace(base.serve, flags=f)
    if env is not None:
        serve = replace(serve, env=env)
    if host is not None:
        serve = replace(serve, host=host, allow_public=True)
    p = replace(base, serve=serve)
    if nodes is not None:
        p = replace(p, profile=replace(p.profile, nodes=nodes))
    if cidr is not None:
        p = replace(p, network=replace(p.network, fabric_cidr=cidr))
    return p


def checks(p: config.Profile) -> dict:
    out = engine_cmd.validate(p)
    ids = [c.id for c in out]
    assert len(ids) == len(set(ids)), ids
    return {c.id: c for c in out}


# ------------------------------------------------------------------------------------- validate

def test_validate_unknown_flags_are_named_and_none_is_all_known():
    ok = checks(NINFER)["service.flags_known"]
    assert ok.status == "pass" and ok.measured == "all known" and ok.hint == ""
    bad = checks(prof(NINFER, bogus=1))["service.flags_known"]
    assert bad.status == "fail" and bad.measured == "bogus" and "ninfer knows: default-max-tokens" in bad.hint
    # in the profile itself: edited there, so no --unset is named; given with --set and kept: the --unset is
    assert bad.hint.startswith("remove or rename them; ") and "--unset" not in bad.hint, bad.hint
    kept = checks(replace(prof(NINFER, bogus=1, other=2), overrides=("serve.flags.other=2",)))["service.flags_known"]
    assert kept.measured == "bogus, other" and "`p2pkit --unset serve.flags.other up`" in kept.hint, kept.hint
    assert "--unset serve.flags.bogus" not in kept.hint


@pytest.mark.parametrize("flag", ["ctx=4", "--spec", "-x"])
def test_validate_a_flag_written_with_dashes_or_equals_is_refused(flag):
    c = checks(prof(NINFER, **{flag: 1}))["service.flags_form"]
    assert c.status == "fail" and c.measured == flag and "rejects --flag=value" in c.hint


def test_validate_flags_written_as_names_have_no_form_finding():
    for p in (NINFER, LLAMA, SPARK):
        assert "service.flags_form" not in checks(p)


def test_validate_a_headless_vllm_worker_has_no_listening_address():
    worker = prof(SPARK, node_rank=1, headless=True)
    assert "service.listen" not in checks(worker)
    head = checks(SPARK)["service.listen"]
    assert head.status == "pass" and head.measured == "127.0.0.1:8086"


@pytest.mark.parametrize("p,present,absent", [
    (NINFER, {"service.devices", "service.kv_capacity"}, {"service.tensor_split", "service.nnodes"}),
    (LLAMA, {"service.tensor_split", "service.spec_slots"}, {"service.devices", "service.kv_capacity", "service.tp"}),
    (SPARK, {"service.tp", "service.nnodes", "service.eager"}, {"service.devices", "service.tensor_split"}),
])
def test_validate_runs_the_checks_of_the_profiles_engine(p, present, absent):
    ids = set(checks(p))
    assert present <= ids and not (absent & ids), ids


# ------------------------------------------------------------------------------------------ _host

def test_host_loopback_passes_and_every_address_warns():
    lo = checks(NINFER)["service.listen"]
    assert lo.status == "pass" and lo.measured == "127.0.0.1:12435" and lo.hint == ""
    for addr in ("0.0.0.0", "::"):
        c = checks(prof(NINFER, host=addr))["service.listen"]
        assert c.status == "warn" and c.measured == addr and "no authentication" in c.hint


# ---------------------------------------------------------------------------------------- _ninfer

@pytest.mark.parametrize("tp,devices,status", [
    (1, "0", "pass"), (2, "0,1", "pass"), (3, "0,1", "fail"),
])
def test_ninfer_tp_is_one_or_two(tp, devices, status):
    c = checks(prof(NINFER, tp=tp, devices=devices, spec=DROP, kv_dtype=DROP))["service.tp"]
    assert c.status == status and c.value == tp and c.unit == "count"


@pytest.mark.parametrize("tp,devices,status,hint", [
    (2, "0,1", "pass", ""),
    (1, "1", "pass", ""),
    (2, "0", "fail", "2 distinct GPU ids among 0,1"),  # fewer than --tp
    (2, "0,2", "fail", "among 0,1"),  # not a GPU of this host
    (2, "1,1", "fail", "distinct"),  # one GPU twice
])
def test_ninfer_devices_names_exactly_tp_distinct_gpus(tp, devices, status, hint):
    c = checks(prof(NINFER, tp=tp, devices=devices))["service.devices"]
    assert c.status == status and c.measured == devices and c.expected == f"{tp} of 0,1" and hint in c.hint


def test_ninfer_vision_device_judged_only_where_vision_is_asked():
    none = checks(prof(NINFER, vision=DROP, vision_device=DROP))
    assert "service.vision_device" not in none
    off = checks(prof(NINFER, vision=False, vision_device=DROP))
    assert "service.vision_device" not in off
    # vision on without --vision-device: the engine's default, the first of --devices
    c = checks(prof(NINFER, tp=1, devices="1", vision=True, vision_device=DROP))["service.vision_device"]
    assert c.status == "pass" and c.measured == "1" and c.expected == "one of 1"
    # --vision-device given with vision off is still judged
    bad = checks(prof(NINFER, vision=DROP, vision_device=3))["service.vision_device"]
    assert bad.status == "fail" and bad.measured == "3" and "one of the --devices" in bad.hint


def test_ninfer_vision_device_default_with_no_devices_is_gpu_zero():
    c = checks(prof(NINFER, devices="", vision=True, vision_device=DROP))["service.vision_device"]
    assert c.status == "fail" and c.measured == "0"


@pytest.mark.parametrize("spec,status", [("mtp", "pass"), ("dflash", "pass"), ("dflash2", "pass"), ("medusa", "fail")])
def test_ninfer_spec_is_a_method_the_engine_has(spec, status):
    c = checks(prof(NINFER, spec=spec))["service.spec"]
    assert c.status == status and c.measured == spec


def test_ninfer_no_spec_no_spec_findings():
    found = checks(prof(NINFER, spec=DROP))
    assert not {"service.spec", "service.lm_head_draft", "service.spec_slots"} & set(found)


def test_ninfer_dflash2_at_tp2_needs_the_lm_head_draft_p10():
    ok = checks(NINFER)["service.lm_head_draft"]
    assert ok.status == "pass" and ok.measured is True and ok.pitfall == "P10"
    bad = checks(prof(NINFER, lm_head_draft=DROP))["service.lm_head_draft"]
    assert bad.status == "fail" and bad.measured is False and bad.pitfall == "P10"
    assert "requires the optimized proposal head" in bad.hint
    # not DFlash2, or DFlash2 at TP1: the engine does not ask for it
    assert "service.lm_head_draft" not in checks(prof(NINFER, spec="mtp", lm_head_draft=DROP))
    assert "service.lm_head_draft" not in checks(prof(NINFER, tp=1, devices="0", lm_head_draft=DROP))


def test_ninfer_kv_dtype_judged_at_tp2_only_p11():
    ok = checks(NINFER)["service.kv_dtype"]
    assert ok.status == "pass" and ok.measured == "nvfp4" and ok.pitfall == "P11"
    bad = checks(prof(NINFER, kv_dtype="q4_0"))["service.kv_dtype"]
    assert bad.status == "fail" and bad.measured == "q4_0" and "accepted KV dtypes" in bad.hint
    assert "service.kv_dtype" not in checks(prof(NINFER, kv_dtype=DROP))
    assert "service.kv_dtype" not in checks(prof(NINFER, tp=1, devices="0", kv_dtype="q4_0"))


def test_ninfer_kv_capacity_auto_passes_and_a_fixed_one_warns_p11():
    ok = checks(NINFER)["service.kv_capacity"]
    assert ok.status == "pass" and ok.measured == "auto" and ok.hint == "" and ok.pitfall == "P11"
    fixed = checks(prof(NINFER, kv_capacity=60000))["service.kv_capacity"]
    assert fixed.status == "warn" and fixed.measured == 60000 and "OOM at start" in fixed.hint


def test_ninfer_spec_slots_for_mtp_only_p20():
    mtp = checks(prof(NINFER, spec="mtp", max_concurrency=4))["service.spec_slots"]
    assert mtp.status == "warn" and mtp.value == 4 and mtp.pitfall == "P20"
    one = checks(prof(NINFER, spec="mtp", max_concurrency=1))["service.spec_slots"]
    assert one.status == "pass" and one.value == 1
    for spec in ("dflash", "dflash2"):
        assert "service.spec_slots" not in checks(prof(NINFER, spec=spec, max_concurrency=8))
    assert "service.spec_slots" not in checks(prof(NINFER, spec=DROP, max_concurrency=8))


# -------------------------------------------------------------------------------------- _llamacpp

def test_llamacpp_spec_slots_only_with_drafting_p20():
    ok = checks(LLAMA)["service.spec_slots"]
    assert ok.status == "pass" and ok.value == 1 and ok.pitfall == "P20"
    many = checks(prof(LLAMA, parallel=4))["service.spec_slots"]
    assert many.status == "warn" and many.value == 4 and many.measured == "4"
    for off in ("none", DROP):
        assert "service.spec_slots" not in checks(prof(LLAMA, spec_type=off, parallel=4))


def test_llamacpp_spec_slots_shows_what_parallel_says_or_the_auto_default():
    auto = checks(prof(LLAMA, parallel=DROP))["service.spec_slots"]
    assert auto.status == "warn" and auto.value is None and auto.measured == llamacpp.AUTO_SLOTS
    text = checks(prof(LLAMA, parallel="-1"))["service.spec_slots"]
    assert text.status == "warn" and text.value is None and text.measured == "-1"


def test_llamacpp_tensor_split_names_one_share_per_gpu():
    ok = checks(LLAMA)["service.tensor_split"]
    assert ok.status == "pass" and ok.measured == "0.5,0.5"
    bad = checks(prof(LLAMA, tensor_split="1,1,1"))["service.tensor_split"]
    assert bad.status == "fail" and bad.measured == "1,1,1" and "give 2 comma-separated shares" in bad.hint
    assert "service.tensor_split" not in checks(prof(LLAMA, tensor_split=DROP))


# ------------------------------------------------------------------------------------------- _vllm

WORKER = prof(SPARK, node_rank=1, headless=True, master_addr="10.10.0.1")
HEAD = prof(SPARK, master_addr="10.10.0.1")


def test_vllm_one_node_has_no_node_findings():
    one = checks(prof(SPARK, nodes=1, nnodes=DROP, node_rank=DROP, tensor_parallel_size=1))
    assert not {"service.nnodes", "service.node_rank", "service.rendezvous", "service.headless",
                "service.ip_filter"} & set(one)
    assert one["service.tp"].status == "pass" and one["service.tp"].value == 1
    two = checks(HEAD)
    assert two["service.nnodes"].status == "pass" and two["service.nnodes"].value == 2


@pytest.mark.parametrize("rank,status", [(0, "pass"), (1, "pass"), (2, "fail"), ("x", "fail")])
def test_vllm_node_rank_within_the_node_count(rank, status):
    c = checks(prof(HEAD, node_rank=rank))["service.node_rank"]
    assert c.status == status and c.expected == "0..1"
    assert c.measured == (None if rank == "x" else rank)


@pytest.mark.parametrize("addr,port,status,measured", [
    ("10.10.0.1", 29511, "pass", "10.10.0.1:29511"),
    (DROP, 29511, "fail", "(no master-addr):29511"),
    ("10.10.0.1", DROP, "fail", "10.10.0.1:(no master-port)"),
])
def test_vllm_rendezvous_needs_address_and_port(addr, port, status, measured):
    c = checks(prof(SPARK, master_addr=addr, master_port=port))["service.rendezvous"]
    assert c.status == status and c.measured == measured


@pytest.mark.parametrize("p,status,measured,expected", [
    (HEAD, "pass", "serves the API", "serves the API"),
    (WORKER, "pass", "headless", "headless"),
    (prof(HEAD, headless=True), "fail", "headless", "serves the API"),
    (prof(WORKER, headless=False), "fail", "serves the API", "headless"),
])
def test_vllm_workers_headless_and_the_head_serves(p, status, measured, expected):
    c = checks(p)["service.headless"]
    assert c.status == status and c.measured == measured and c.expected == expected


def test_vllm_ip_filter_from_the_fabric_subnet():
    none = checks(HEAD)["service.ip_filter"]
    assert none.status == "warn" and none.measured == "no IP filter" and "set network.fabric_cidr" in none.hint
    ok = checks(prof(HEAD, cidr="10.10.0.0/24"))["service.ip_filter"]
    assert ok.status == "pass" and ok.measured == "10.10.0.0/24" and ok.hint == ""


def test_vllm_ngram_table_needs_mmap_p26():
    ok = checks(SPARK)["service.ple_mmap"]
    assert ok.status == "pass" and ok.measured == "VLLM_PLE_MMAP=1" and ok.pitfall == "P26"
    env = dict(SPARK.serve.env)
    bad = checks(prof(SPARK, env={**env, "VLLM_PLE_MMAP": "0"}))["service.ple_mmap"]
    assert bad.status == "fail" and bad.measured == "VLLM_PLE_MMAP=0" and "/var/lib/vllm/ple-table" in bad.hint
    no_table = {k: v for k, v in env.items() if k != "VLLM_PLE_MMAP_DIR"}
    assert "service.ple_mmap" not in checks(prof(SPARK, env={**no_table, "VLLM_PLE_MMAP": "0"}))


def test_vllm_spec_slots_and_eager_only_with_a_speculative_config():
    c = checks(SPARK)
    assert c["service.spec_slots"].status == "warn" and c["service.spec_slots"].value == 13
    assert c["service.spec_slots"].pitfall == "P20"
    off = checks(prof(SPARK, speculative_config=DROP, enforce_eager=DROP))
    assert "service.spec_slots" not in off and "service.eager" not in off


def test_vllm_mtp_at_tp2_runs_eager_p22():
    ok = checks(SPARK)["service.eager"]
    assert ok.status == "pass" and ok.measured == "eager" and ok.hint == "" and ok.pitfall == "P22"
    bad = checks(prof(SPARK, enforce_eager=DROP))["service.eager"]
    assert bad.status == "fail" and bad.measured == "CUDA graphs" and "about 28% of decode" in bad.hint
    # one GPU on one node: no TP, nothing to judge
    one = prof(SPARK, nodes=1, nnodes=DROP, node_rank=DROP, tensor_parallel_size=1, enforce_eager=DROP)
    assert "service.eager" not in checks(one)
