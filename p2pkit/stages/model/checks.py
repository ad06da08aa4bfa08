"""model: the source is complete, the output was converted (never overwritten), verified, and the
engine that was built can read it (P08, P09)."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.rules import engine_cmd
from p2pkit.rules.engines import ninfer
from p2pkit.rules.findings import (
    FAIL,
    PASS,
    Check,
    changed,
    failed,
    figure,
    judge,
    not_measured,
    reading,
    reads,
    unknown,
)

GIB = 1 << 30


def precheck(p: Profile) -> list[Check]:
    if p.model.format == "hf":  # served as it is (vLLM): only the source
        return [judge("model.paths", "model source set", bool(p.model.source), p.model.source or "(no source)",
                      "an HF-format directory", "set model.source to the model's directory")]
    out = [judge("model.paths", "model source and output set", bool(p.model.source and p.model.output),
                 f"{p.model.source or '(no source)'} -> {p.model.output or '(no output)'}", "both set",
                 "set model.source (an HF-format directory) and model.output")]
    return out + engine_cmd.engine(p).model_prechecks(p)


@reads("storage", given=("model_build",))
def check(f: dict, p: Profile) -> list[Check]:
    out = precheck(p) + nvme(f.get("storage"), p)
    missing = not_measured(f, "model_build", "model.build", "model converted", "doctor converts nothing",
                           "a run of `p2pkit up`")
    if missing:
        return [*out, missing]
    b = f["model_build"]
    if (first := _not_converted(b, p)) is not None:
        return [*out, first, *engine_cmd.engine(p).model_checks(b.get("engine_reads"), p)]
    if not b.get("kept"):
        out += _converted(b)
        if out[-1].status == FAIL:
            return out
    v = b.get("verify", {})
    if "error" in v:
        out.append(Check("model.verify", "output is a valid model file", FAIL, v["error"], p.model.format,
                         "the converted file is not what the engine reads: nothing was renamed into place; check "
                         "the engine commit and the convert recipe"))
        return out
    out += _ninfer_output(b, v, p) if p.model.format == "ninfer" else _gguf_output(v, p)
    out.append(Check("model.sha256", "artifact sha256 recorded", PASS if b.get("sha256") else FAIL,
                     b.get("sha256"), "a digest", "" if b.get("sha256") else "the digest was not recorded"))
    return out


def _not_converted(b: dict, p: Profile) -> Check | None:
    """A model served as it is (its source judged), one not converted yet, or an output p2pkit may not write."""
    if b.get("as_is"):
        return _source(b["source"])
    if b.get("missing"):
        return Check("model.output", "the converted model is there", FAIL, b["missing"], p.model.output,
                     "run `p2pkit up --from model`")
    if b.get("refused"):
        return Check("model.output_free", "the output is p2pkit's to write", FAIL, b["refused"],
                     "no file there, or the one p2pkit recorded",
                     "move the existing file away, or set model.output to a new path")
    return None


def _converted(b: dict) -> list[Check]:
    """This run's conversion: its source, its disk, the convert tool; up to the first that fails."""
    out = [_source(b["source"])]
    if out[-1].status == FAIL:
        return out
    d = b.get("disk")
    if d:
        out.append(figure("model.disk", "free disk for the conversion", d["free_bytes"] / GIB, ">=",
                          d["need_bytes"] / GIB, "GiB",
                          "free disk space under the output directory, or point model.output elsewhere",
                          context="free"))
        if out[-1].status == FAIL:
            return out
    tail = " | ".join(b.get("convert_tail", [])) or f"exit {b.get('convert_rc')}"
    out.append(judge("model.convert", "convert tool (run as a module from the engine source)",
                     b.get("convert_rc") == 0, tail,
                     "exit 0", "the convert tool failed: read its last lines above; it must run as "
                     "`python3 -m tools.convert` from the engine's source root", pitfall="P08"))
    return out


def _ninfer_output(b: dict, v: dict, p: Profile) -> list[Check]:
    """A NInfer container: the version the built engine reads, the components and formats asked for, DFlash2 at
    TP2 (P09)."""
    out = []
    reads = b.get("engine", {}).get("reads", [])
    out.append(judge("model.container", "container version the built engine reads",
                     v["container_version"] in reads, f"v{v['container_version']}",
                     f"one of {', '.join(f'v{r}' for r in reads) or '(engine not built)'}",
                     "convert with the engine commit you built (an engine reading the wrong version says "
                     "'artifact magic is not NInfer v2')"))
    missing = sorted(set(p.model.components) - set(v["components"]))
    out.append(judge("model.components", "components the profile asks for", not missing,
                     ", ".join(v["components"]), ", ".join(p.model.components),
                     f"missing {', '.join(missing)}: convert again with them"))
    out.append(judge("model.formats", "nvfp4 tensors present", "nvfp4" in v["formats"],
                     ", ".join(v["formats"]) or "none", "nvfp4", "use the nvfp4 convert recipe"))
    if "dflash2" in p.model.components and ninfer.tensor_parallel(p.serve.flags) == 2:
        eng = b.get("engine", {})
        out.append(judge("model.dflash2_tp2", "the engine splits DFlash2 at TP2", eng.get("dflash2_tp2", False),
                         "dflash2 branch in shard mapping" if eng.get("dflash2_tp2") else
                         f"no dflash2 branch in {', '.join(eng.get('shard_mapping_files', [])) or 'the source'}",
                         "a dflash2 branch", "an engine without TP2 DFlash2 crashes on this artifact at --tp 2: "
                         "pin an engine commit that has it", pitfall="P09"))
    return out


def _gguf_output(v: dict, p: Profile) -> list[Check]:
    """A GGUF file: its tensors, its architecture, its MTP layers where the profile asks for them (P19)."""
    out = [figure("model.tensors", "GGUF tensors present", v.get("tensor_count"), ">", 0, "count",
                  "the GGUF file holds no tensors", context="tensors"),
           judge("model.architecture", "GGUF names its architecture", bool(v.get("architecture")),
                 v.get("architecture") or "no general.architecture", "an architecture",
                 "the converter wrote no general.architecture: the engine cannot load it; convert again "
                 "with the engine's own converter")]
    if "mtp" in p.model.components:
        n_layers = v.get("nextn_predict_layers") or 0
        out.append(judge("model.mtp", "MTP/nextn layers present", v.get("mtp_tensors", 0) > 0 and n_layers > 0,
                         f"{v.get('mtp_tensors')} nextn tensors, {v.get('architecture')}.nextn_predict_layers = "
                         f"{v.get('nextn_predict_layers')}", "> 0 of both",
                         "convert with the MTP layers (nextn) included: the draft-mtp speculative type needs "
                         "them", "P19"))
    return out


def _source(s: dict) -> Check:
    problems = []
    if not s.get("config"):
        problems.append("config.json missing")
    if "index_error" in s:
        problems.append(s["index_error"])
    for name, sh in sorted(s.get("shards", {}).items()):
        if not sh.get("present"):
            problems.append(f"{name} missing (listed in the index)")
        elif sh.get("error"):
            problems.append(f"{name}: {sh['error']}")
        elif sh.get("truncated"):
            problems.append(f"{name} truncated")
        elif sh.get("missing_keys"):
            problems.append(f"{name} lacks {', '.join(sh['missing_keys'])}")
    want = "config.json, index, every shard whole"
    if not problems:
        return reading("model.source", "source model complete (HF layout)", PASS, s.get("total_bytes", 0) / GIB,
                       "GiB", want, text=f"{len(s.get('shards', {}))} shard(s), {{}}")
    return judge("model.source", "source model complete (HF layout)", False, "; ".join(problems), want,
                 f"download the source again into {s.get('path')}: {problems[0]}")


def nvme(found, p: Profile) -> list[Check]:
    """Each of model.nvme_paths exists on a local NVMe disk (P26)."""
    if not p.model.nvme_paths:
        return []
    if failed(found) or found is None:
        return [unknown("model.nvme", "on local NVMe", found or {"error": "not read"}, "local NVMe", pitfall="P26")]
    out = []
    for path in p.model.nvme_paths:
        x = found.get(path, {"error": "not read"})
        if failed(x):
            out.append(unknown(f"model.nvme.{path}", f"{path} on local NVMe", x, "local NVMe", pitfall="P26"))
            continue
        where = (f"{x['fstype']} {x['source']} at {x['mount_point']}" + (f", disk {x['disk']}" if x.get("disk") else "")
                 + (" (rotational)" if x.get("rotational") else ""))
        if not x["exists"]:
            out.append(Check(f"model.nvme.{path}", f"{path} on local NVMe", FAIL, f"missing (would be on {where})",
                             "a directory on local NVMe", "copy the table there first: vLLM mmaps it and reads it "
                             "at random", "P26"))
            continue
        out.append(judge(f"model.nvme.{path}", f"{path} on local NVMe", x["nvme"], where, "a local NVMe disk",
                         "random mmap reads of the n-gram table need local NVMe (30x read amplification "
                         "otherwise; a network filesystem is worse): copy it to the node's internal NVMe and point "
                         "model.nvme_paths and serve.env.VLLM_PLE_MMAP_DIR at the copy", pitfall="P26"))
    return out


def reproved(recorded: dict, now: dict | None, p: Profile) -> list[Check]:
    """What the model artifact claims, against the file now (status and the gate): the output it hashed is
    still there and the same file. Hashing a multi-GB model on every `status` is too slow, so the proof is the
    file's identity (device, inode, size, modification and change time) recorded with its sha256: a moved,
    replaced or rewritten file changes it, and no user can set a change time back; `verify model` reads the
    bytes again. An HF model served as it is: its directory is still there."""
    id_, title = "model.output_unchanged", "the model the stage hashed is there, unchanged"
    b = recorded.get("model_build") or {}
    if failed(now) or now is None:
        return [unknown(id_, title, now, "the file the stage hashed")]
    path = now.get("path")
    redo = ("run `p2pkit up --from model`: it proves the output again (its sha256 against p2pkit's record) and "
            "converts only where nothing is there")
    if b.get("as_is"):
        ok = now.get("directory")
        return [Check(id_, title, PASS if ok else FAIL, f"{path} is {'there' if ok else 'not there any more'}",
                      "the model directory", "" if ok else "put the model back, or point model.source at it")]
    want = f"the file hashed (sha256 {str(b.get('sha256'))[:12]}...), unchanged"
    if not now.get("identity"):
        return [Check(id_, title, FAIL, f"{path} is not there any more (moved or deleted since it was converted)",
                      want, redo)]
    if not b.get("identity") or not b.get("sha256"):
        return [Check(id_, title, FAIL, f"the artifact records no identity and sha256 for {path} (an earlier "
                      "p2pkit's, or not a conversion's)", want, redo)]
    moved = changed(b["identity"], now["identity"])
    if moved:
        return [Check(id_, title, FAIL, f"{path} changed since it was hashed ({'; '.join(moved)})", want, redo)]
    return [Check(id_, title, PASS, f"{path} unchanged since it was hashed", want)]
