"""Condition guards for the model stage (bench/check_guard.py --conditions --only model): each condition of
p2pkit.stages.model.checks judged on the facts where it decides the findings, the check functions called
directly with a model_build fact as the stage's act writes it (p2pkit.stages.model.act: the source read by
p2pkit.host.model.hf_source, the disk, the convert run, verify_file, engine_support, the sha256) and the
built-in profiles, so a condition replaced by True or by False changes a finding's id, status, pitfall,
measured or expected text, or the hint asserted here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pkit.core import config
from p2pkit.stages.model import checks as mc

GIB = 1 << 30
NINFER = config.load("dual-5090-ninfer")  # ninfer format, components text/vision/mtp/dflash2, --tp 2
LLAMA = config.load("dual-5090-llamacpp")  # gguf, components text/mtp, no convert recipe
_SPARK = config.load("dual-spark-vllm")  # hf (served as it is), one nvme path
SPARK = replace(_SPARK, model=replace(_SPARK.model, nvme_paths=[]))
TABLE = "/var/lib/vllm/ple-table"
SHA = "ab" * 32
SHARD = "model-00001-of-00002.safetensors"


def model(p, **kw):
    return replace(p, model=replace(p.model, **kw))


def flags(p, **kw):
    return replace(p, serve=replace(p.serve, flags={**p.serve.flags, **kw}))


def source(**kw) -> dict:
    """hf_source of a whole two-shard HF directory (54 GiB), with `kw` over it."""
    return {"path": "/srv/models/Qwen3.8-27B", "config": True,
            "shards": {SHARD: {"present": True, "size": 27 * GIB, "missing_keys": [], "extra_keys": [],
                               "truncated": False},
                       "model-00002-of-00002.safetensors": {"present": True, "size": 27 * GIB, "missing_keys": [],
                                                            "extra_keys": [], "truncated": False}},
            "total_bytes": 54 * GIB, **kw}


def engine(**kw) -> dict:
    return {"reads": [2, 3], "dflash2_tp2": True, "shard_mapping_files": ["src/shard_mapping.cpp"], **kw}


def ninfer_verify(**kw) -> dict:
    return {"container_version": 2, "components": ["text", "vision", "mtp", "dflash2"], "tensor_count": 900,
            "formats": ["bf16", "nvfp4"], **kw}


def gguf_verify(**kw) -> dict:
    return {"tensor_count": 700, "formats": ["BF16", "F32"], "architecture": "qwen38", "nextn_predict_layers": 1,
            "mtp_tensors": 12, **kw}


def build(**kw) -> dict:
    """A conversion that just ran and went well (the stage's act), with `kw` over it (a key given as None is
    left out)."""
    b = {"source": source(), "output": NINFER.model.output, "engine": engine(),
         "disk": {"free_bytes": 200 * GIB, "need_bytes": 60 * GIB}, "convert_rc": 0,
         "convert_tail": ["wrote 900 tensors"], "verify": ninfer_verify(), "sha256": SHA, **kw}
    return {k: v for k, v in b.items() if v is not None}


def run(b: dict | None, p=NINFER, **f) -> dict:
    out = mc.check({"model_build": b, **f} if b is not None else f, p)
    ids = [c.id for c in out]
    assert len(ids) == len(set(ids)), ids
    return {c.id: c for c in out}


# ------------------------------------------------------------------------------------------ precheck

def test_precheck_hf_asks_for_the_source_only():
    c = mc.precheck(SPARK)
    assert [(x.id, x.status, x.title) for x in c] == [("model.paths", "pass", "model source set")]
    assert c[0].measured == SPARK.model.source and c[0].expected == "an HF-format directory"


def test_precheck_hf_without_a_source_fails():
    c = mc.precheck(model(SPARK, source=""))
    assert [(x.id, x.status) for x in c] == [("model.paths", "fail")]
    assert c[0].measured == "(no source)" and c[0].hint == "set model.source to the model's directory"


@pytest.mark.parametrize("src,out,ok,measured", [
    ("/srv/a", "/srv/a.ninfer", True, "/srv/a -> /srv/a.ninfer"),
    ("", "/srv/a.ninfer", False, "(no source) -> /srv/a.ninfer"),
    ("/srv/a", "", False, "/srv/a -> (no output)"),
    ("", "", False, "(no source) -> (no output)"),
])
def test_precheck_converted_formats_ask_for_source_and_output(src, out, ok, measured):
    c = mc.precheck(model(NINFER, source=src, output=out))[0]
    assert (c.id, c.title, c.status) == ("model.paths", "model source and output set", "pass" if ok else "fail")
    assert c.measured == measured


def test_precheck_convert_recipe_is_asked_of_ninfer_only():
    assert [(x.id, x.status) for x in mc.precheck(LLAMA)] == [("model.paths", "pass")]
    c = {x.id: x for x in mc.precheck(NINFER)}["model.convert_recipe"]
    assert (c.status, c.measured) == ("pass", "qwen3_8_27b_nvfp4")
    c = {x.id: x for x in mc.precheck(model(NINFER, convert_recipe=""))}["model.convert_recipe"]
    assert (c.status, c.measured, c.hint) == ("fail", "(empty)", "set model.convert_recipe")


# ------------------------------------------------------------------------------------------ check

def test_check_without_a_build_is_not_measured():
    c = mc.check({}, NINFER)
    assert [(x.id, x.status) for x in c] == [("model.paths", "pass"), ("model.convert_recipe", "pass"),
                                             ("model.build", "skip")]
    assert c[-1].measured == "not measured here: doctor converts nothing"
    bad = mc.check({"model_build": {"error": "the model record is unreadable"}}, NINFER)[-1]
    assert (bad.id, bad.status, bad.measured) == ("model.build", "fail",
                                                  "could not determine: the model record is unreadable")


def test_check_a_converted_ninfer_model_in_full():
    c = run(build())
    assert list(c) == ["model.paths", "model.convert_recipe", "model.source", "model.disk", "model.convert",
                       "model.container", "model.components", "model.formats", "model.dflash2_tp2", "model.sha256"]
    assert all(x.status == "pass" for x in c.values())
    assert c["model.source"].measured == "2 shard(s), 54.0 GiB"
    assert c["model.disk"].measured == "200.0 GiB (free)" and c["model.disk"].limit == 60
    assert c["model.convert"].measured == "wrote 900 tensors"
    assert c["model.container"].measured == "v2" and c["model.container"].expected == "one of v2, v3"
    assert c["model.formats"].measured == "bf16, nvfp4"
    assert c["model.dflash2_tp2"].measured == "dflash2 branch in shard mapping"
    assert (c["model.sha256"].measured, c["model.sha256"].hint) == (SHA, "")


def test_check_hf_served_as_it_is_judges_the_source_only():
    b = {"source": source(), "output": SPARK.model.source, "as_is": True}
    c = mc.check({"model_build": b}, SPARK)
    assert [(x.id, x.status) for x in c] == [("model.paths", "pass"), ("model.source", "pass")]


def test_check_output_not_converted_yet():
    b = {"source": source(), "output": NINFER.model.output, "engine": engine(),
         "missing": f"{NINFER.model.output} has not been converted"}
    c = mc.check({"model_build": b}, NINFER)
    assert [x.id for x in c][2:] == ["model.output"]
    assert (c[-1].status, c[-1].measured, c[-1].expected) == ("fail", b["missing"], NINFER.model.output)


def test_check_output_not_ours_is_refused():
    b = {"source": source(), "output": NINFER.model.output, "engine": engine(),
         "refused": f"{NINFER.model.output} exists and is not the artifact p2pkit wrote"}
    c = mc.check({"model_build": b}, NINFER)
    assert [x.id for x in c][2:] == ["model.output_free"]
    assert (c[-1].status, c[-1].measured) == ("fail", b["refused"])


def test_check_kept_output_is_verified_not_converted_again():
    """A kept artifact (the recorded sha256 still on disk): no source, disk or convert findings, even where the
    source directory has gone since."""
    b = {"source": source(config=False, index_error="gone"), "output": NINFER.model.output, "engine": engine(),
         "kept": True, "sha256": SHA, "size": 20 * GIB, "verify": ninfer_verify()}
    c = run(b)
    assert list(c) == ["model.paths", "model.convert_recipe", "model.container", "model.components",
                       "model.formats", "model.dflash2_tp2", "model.sha256"]
    assert all(x.status == "pass" for x in c.values())


def test_check_a_broken_source_stops_before_the_conversion():
    c = run(build(source=source(config=False), disk=None, convert_rc=None, convert_tail=None, verify=None,
                  sha256=None))
    assert list(c)[2:] == ["model.source"]
    assert (c["model.source"].status, c["model.source"].measured) == ("fail", "config.json missing")


def test_check_too_little_disk_stops_before_the_conversion():
    c = run(build(disk={"free_bytes": 10 * GIB, "need_bytes": 60 * GIB}, convert_rc=None, convert_tail=None,
                  verify=None, sha256=None))
    assert list(c)[2:] == ["model.source", "model.disk"]
    d = c["model.disk"]
    assert (d.status, d.value, d.op, d.limit, d.unit) == ("fail", 10, ">=", 60, "GiB")


def test_check_no_disk_figure_goes_straight_to_the_conversion():
    c = run(build(disk=None))
    assert list(c)[2:5] == ["model.source", "model.convert", "model.container"]


@pytest.mark.parametrize("tail,measured", [
    (["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'tools'"],
     "Traceback (most recent call last): | ModuleNotFoundError: No module named 'tools'"),
    ([], "exit 1"),
])
def test_check_a_failed_conversion_shows_its_last_lines_and_stops(tail, measured):
    c = run(build(convert_rc=1, convert_tail=tail, verify=None, sha256=None))
    assert list(c)[2:] == ["model.source", "model.disk", "model.convert"]
    cv = c["model.convert"]
    assert (cv.status, cv.pitfall, cv.measured) == ("fail", "P08", measured)
    assert "python3 -m tools.convert" in cv.hint


def test_check_a_conversion_with_an_empty_tail_shows_its_exit():
    assert run(build(convert_tail=[]))["model.convert"].measured == "exit 0"


def test_check_an_invalid_output_file_stops_at_verify():
    c = run(build(verify={"error": "artifact magic is not NInfer v2"}, sha256=None))
    assert list(c)[-1] == "model.verify"
    v = c["model.verify"]
    assert (v.status, v.measured, v.expected) == ("fail", "artifact magic is not NInfer v2", "ninfer")


def test_check_container_version_the_engine_does_not_read():
    c = run(build(verify=ninfer_verify(container_version=3), engine=engine(reads=[2])))["model.container"]
    assert (c.status, c.measured, c.expected) == ("fail", "v3", "one of v2")
    c = run(build(engine=engine(reads=[])))["model.container"]
    assert (c.status, c.expected) == ("fail", "one of (engine not built)")


@pytest.mark.parametrize("formats,ok,measured", [
    (["bf16", "fp8"], False, "bf16, fp8"), ([], False, "none"), (["nvfp4"], True, "nvfp4"),
])
def test_check_nvfp4_tensors(formats, ok, measured):
    c = run(build(verify=ninfer_verify(formats=formats)))["model.formats"]
    assert (c.status, c.measured) == ("pass" if ok else "fail", measured)


@pytest.mark.parametrize("eng,measured", [
    (engine(dflash2_tp2=False, shard_mapping_files=["src/shard_mapping.cpp", "src/tp.cpp"]),
     "no dflash2 branch in src/shard_mapping.cpp, src/tp.cpp"),
    (engine(dflash2_tp2=False, shard_mapping_files=[]), "no dflash2 branch in the source"),
])
def test_check_an_engine_without_tp2_dflash2_is_p09(eng, measured):
    c = run(build(engine=eng))["model.dflash2_tp2"]
    assert (c.status, c.pitfall, c.measured) == ("fail", "P09", measured)


@pytest.mark.parametrize("p", [
    model(NINFER, components=["text", "vision", "mtp"]),  # no DFlash2 drafter
    flags(NINFER, tp=1),  # one GPU: nothing to split
])
def test_check_dflash2_split_only_judged_for_dflash2_at_tp2(p):
    b = build(verify=ninfer_verify(components=p.model.components), engine=engine(dflash2_tp2=False))
    c = run(b, p)
    assert "model.dflash2_tp2" not in c and all(x.status == "pass" for x in c.values())


def test_check_gguf_in_full():
    b = build(output=LLAMA.model.output, verify=gguf_verify(), engine={"reads": []})
    c = run(b, LLAMA)
    assert list(c) == ["model.paths", "model.source", "model.disk", "model.convert", "model.tensors",
                       "model.architecture", "model.mtp", "model.sha256"]
    assert all(x.status == "pass" for x in c.values())
    assert c["model.architecture"].measured == "qwen38"
    assert c["model.mtp"].measured == "12 nextn tensors, qwen38.nextn_predict_layers = 1"


def test_check_gguf_without_an_architecture():
    c = run(build(verify=gguf_verify(architecture=None)), LLAMA)["model.architecture"]
    assert (c.status, c.measured) == ("fail", "no general.architecture")


@pytest.mark.parametrize("tensors,layers,ok", [(12, 1, True), (12, None, False), (12, 0, False), (0, 1, False)])
def test_check_gguf_mtp_needs_tensors_and_layers(tensors, layers, ok):
    c = run(build(verify=gguf_verify(mtp_tensors=tensors, nextn_predict_layers=layers)), LLAMA)["model.mtp"]
    assert (c.status, c.pitfall) == ("pass" if ok else "fail", "P19")


def test_check_gguf_mtp_only_judged_where_the_profile_asks_for_it():
    p = model(LLAMA, components=["text"])
    c = run(build(verify=gguf_verify(mtp_tensors=0, nextn_predict_layers=None)), p)
    assert "model.mtp" not in c and all(x.status == "pass" for x in c.values())


def test_check_sha256_not_recorded_fails():
    c = run(build(sha256=None))["model.sha256"]
    assert (c.status, c.measured, c.hint) == ("fail", None, "the digest was not recorded")


# ------------------------------------------------------------------------------------------ _source

@pytest.mark.parametrize("s,measured", [
    (source(index_error="/srv/models/Qwen3.8-27B/model.safetensors.index.json is missing", shards={}),
     "/srv/models/Qwen3.8-27B/model.safetensors.index.json is missing"),
    (source(shards={SHARD: {"present": True, "error": "header is not JSON", "truncated": True}}),
     f"{SHARD}: header is not JSON"),
    (source(shards={SHARD: {"present": True, "truncated": True, "missing_keys": []}}), f"{SHARD} truncated"),
    (source(shards={SHARD: {"present": True, "truncated": False, "missing_keys": ["lm_head.weight", "norm"]}}),
     f"{SHARD} lacks lm_head.weight, norm"),
    (source(shards={SHARD: {"present": False}}), f"{SHARD} missing (listed in the index)"),
])
def test_source_names_what_is_wrong(s, measured):
    c = mc._source(s)
    assert (c.id, c.status, c.measured) == ("model.source", "fail", measured)
    assert c.hint == f"download the source again into /srv/models/Qwen3.8-27B: {measured}"


def test_source_whole_passes():
    c = mc._source(source())
    assert (c.status, c.measured, c.value, c.unit) == ("pass", "2 shard(s), 54.0 GiB", 54, "GiB")


# ------------------------------------------------------------------------------------------ nvme

P_NVME = _SPARK  # model.nvme_paths = [TABLE]


@pytest.mark.parametrize("found,measured", [
    ({"error": "/proc/self/mountinfo is not readable"}, "could not determine: /proc/self/mountinfo is not readable"),
    (None, "could not determine: not read"),
])
def test_nvme_storage_not_read_is_one_unknown(found, measured):
    c = mc.nvme(found, P_NVME)
    assert [(x.id, x.status, x.pitfall) for x in c] == [("model.nvme", "fail", "P26")]
    assert c[0].measured == measured


def test_nvme_each_path_judged():
    found = {TABLE: {"path": TABLE, "exists": True, "mount_point": "/", "fstype": "ext4", "source": "/dev/nvme0n1p2",
                     "disk": "nvme0n1", "rotational": False, "nvme": True}}
    c = mc.nvme(found, P_NVME)
    assert [(x.id, x.status, x.measured) for x in c] == [(f"model.nvme.{TABLE}", "pass",
                                                           "ext4 /dev/nvme0n1p2 at /, disk nvme0n1")]
    assert mc.nvme(found, SPARK) == []


# -------------------------------------------------------------------------- reproved (the model gate)

IDENT = {"dev": 2049, "ino": 91, "size": 8632, "mtime_ns": 5, "ctime_ns": 6}
OUT = "/srv/models/qwen38-27b-nvfp4-dflash2.ninfer"


def hashed(**kw) -> dict:
    return {"model_build": {"output": OUT, "sha256": SHA, "size": 8632, "identity": dict(IDENT), **kw}}


def test_reproved_passes_the_unchanged_output():
    (c,) = mc.reproved(hashed(), {"path": OUT, "identity": dict(IDENT)}, NINFER)
    assert (c.id, c.status, c.measured) == ("model.output_unchanged", "pass", f"{OUT} unchanged since it was hashed")
    assert c.expected.startswith(f"the file hashed (sha256 {SHA[:12]}")


@pytest.mark.parametrize("fresh", [None, {"error": "permission denied"}])
def test_reproved_unreadable_now_is_unknown(fresh):
    (c,) = mc.reproved(hashed(), fresh, NINFER)
    assert c.status == "fail" and c.measured.startswith("could not determine")


@pytest.mark.parametrize("there", [True, False])
def test_reproved_an_hf_model_is_its_directory(there):
    (c,) = mc.reproved({"model_build": {"as_is": True}}, {"path": "/srv/models/x", "directory": there}, SPARK)
    assert c.status == ("pass" if there else "fail")
    assert c.measured == f"/srv/models/x is {'there' if there else 'not there any more'}"
    assert bool(c.hint) is not there


def test_reproved_an_output_gone_is_stale():
    (c,) = mc.reproved(hashed(), {"path": OUT, "identity": None}, NINFER)
    assert c.status == "fail" and c.measured == f"{OUT} is not there any more (moved or deleted since it was converted)"
    assert "up --from model" in c.hint


@pytest.mark.parametrize("rec", [{"identity": None}, {"sha256": None}])
def test_reproved_an_artifact_without_identity_and_sha256_is_stale(rec):
    (c,) = mc.reproved(hashed(**rec), {"path": OUT, "identity": dict(IDENT)}, NINFER)
    assert c.status == "fail" and c.measured.startswith(f"the artifact records no identity and sha256 for {OUT}")


@pytest.mark.parametrize("field", ["dev", "ino", "size", "mtime_ns", "ctime_ns"])
def test_reproved_each_field_of_the_identity_counts(field):
    (c,) = mc.reproved(hashed(), {"path": OUT, "identity": {**IDENT, field: IDENT[field] + 1}}, NINFER)
    assert c.status == "fail" and c.measured == (f"{OUT} changed since it was hashed ({field} {IDENT[field]} -> "
                                                 f"{IDENT[field] + 1})")
