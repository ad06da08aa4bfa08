"""model: check the source, convert it with the engine's own tool run as a module from the
engine's source root (P08), write to a temporary name and rename at the end, verify what came
out, record its sha256. An existing output p2pkit did not write is never overwritten."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from p2pkit.core import config, safefs, writers
from p2pkit.core.artifacts import CorruptArtifact, atomic_write, read_json
from p2pkit.core.output import follow_cmd
from p2pkit.host import model as hm
from p2pkit.host import system
from p2pkit.parse import artifact as pa
from p2pkit.rules import engine_cmd
from p2pkit.rules.engine_cmd import binary

HEADROOM = 1.10


def source_ok(src: dict) -> bool:
    return src.get("config") and "index_error" not in src and all(
        s.get("present") and not s.get("truncated") and not s.get("missing_keys") and not s.get("error")
        for s in src["shards"].values())


def convert_argv(ctx, src: str, tmp: str) -> list[str]:
    """The engine's own converter, run as a module from its source root (P08), writing exactly `tmp`."""
    return engine_cmd.engine(ctx.profile).convert_argv(ctx.profile, ctx.host, src, tmp)


def verify_file(ctx, path: Path) -> dict:
    p = ctx.profile
    if p.model.format == "ninfer":
        try:
            c = pa.ninfer_container(hm.read_head(path))
        except (ValueError, OSError) as e:
            return {"error": str(e)}
        h = c["header"]
        return {"container_version": c["version"], "components": h.get("components", []),
                "tensor_count": len(h.get("tensors", [])),
                "formats": sorted({t.get("format") for t in h.get("tensors", []) if t.get("format")})}
    r = hm.open_gguf(path)
    if isinstance(r, dict):
        return r
    names = [t.name for t in r.tensors]
    arch = _gguf_field(r, "general.architecture")
    return {"tensor_count": len(names), "formats": sorted({t.tensor_type.name for t in r.tensors}),
            "architecture": arch, "nextn_predict_layers": _gguf_field(r, f"{arch}.nextn_predict_layers"),
            "mtp_tensors": sum(1 for n in names if "nextn" in n or ".mtp" in n)}


def _gguf_field(reader, key: str):
    """A GGUF metadata value (string or number), or None when the file has no such key."""
    f = reader.fields.get(key)
    if f is None:
        return None
    v = f.contents()
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def engine_support(ctx) -> dict:
    p, host = ctx.profile, ctx.host
    out: dict = {}
    exe = host.path(binary(p))
    if exe.is_file():
        r = host.runner.run([str(exe), "--version"], check=False, timeout=60)
        out["reads"] = sorted({int(v) for v in re.findall(r"\bv(\d+)\b", r.stdout)})
    src = host.path(p.engine.build_dir) / "src"
    mapping = [f for f in src.rglob("*shard*") if f.is_file()] if src.is_dir() else []
    out["dflash2_tp2"] = any("dflash2" in f.read_text(errors="replace") for f in mapping)
    out["shard_mapping_files"] = [str(f.relative_to(host.path(p.engine.build_dir))) for f in mapping]
    return out


def leaves_its_directory(host, path: str, under: str | None = None) -> str | None:
    """model.output must stay in the models directory (`under`, config.models_dir; its own directory
    by default) once links are followed (config.leads_out): a symlink that leads elsewhere is refused
    here too, at the write (the CLI refused it when it loaded the profile)."""
    why = config.leads_out(host.realpath, path, under or os.path.dirname(path))
    return why and (f"{why}: p2pkit writes a model only inside the directory the profile names; remove the link "
                    "or point model.output at the real place")


def existing(ctx, res: dict) -> dict:
    """Read-only: the output on disk is the one p2pkit recorded (sha256), and what it holds."""
    m, host = ctx.profile.model, ctx.host
    out = host.path(m.output)
    record_file = ctx.store.dir / "model-output.json"
    rec = _record(record_file)
    # `verify` reads the whole file again (ctx.options["full_hash"]); `up` trusts the cache's file identity
    digest = hm.sha256_cached(host, out, ctx.store.dir / "sha256-cache.json", fresh=bool(ctx.options.get("full_hash")))
    if rec.get("path") == m.output and rec.get("sha256") == digest:
        res.update(kept=True, sha256=digest, size=out.stat().st_size, identity=system.file_identity(out),
                   verify=verify_file(ctx, out))
    else:
        res["refused"] = (f"{m.output} exists and is not the artifact p2pkit wrote (or it changed since); "
                          "p2pkit never overwrites a model")
    return res


def as_is(ctx) -> dict:
    """An HF-format model the engine (vLLM) loads as it is: nothing is converted; the source is proven."""
    p = ctx.profile
    src = p.model.source
    out = {"source": hm.hf_source(ctx.host, src), "output": src, "as_is": True}
    reads = engine_cmd.engine(p).model_facts(ctx.host, p)  # what the built engine can serve of it (vLLM's CPU heads)
    return {**out, "engine_reads": reads} if reads else out


def act(ctx) -> dict:
    if ctx.profile.model.format == "hf":
        ctx.options["model_build"] = as_is(ctx)
        return {"convert": None, "output": ctx.profile.model.source}
    ctx.options["model_build"] = convert(ctx)
    return {"convert": ctx.options["model_build"].get("convert_argv"), "output": ctx.profile.model.output}


def measure(ctx, acted: dict | None = None) -> dict:
    """What the stage just converted, or (verify, doctor) what is on disk now."""
    built = ctx.options.pop("model_build", None)
    if built is not None:
        return {"model_build": built}
    if ctx.profile.model.format == "hf":
        return {"model_build": as_is(ctx)}
    p, host = ctx.profile, ctx.host
    res: dict = {"source": hm.hf_source(host, p.model.source), "output": p.model.output,
                 "engine": engine_support(ctx)}
    if host.path(p.model.output).exists():
        return {"model_build": existing(ctx, res)}
    res["missing"] = f"{p.model.output} has not been converted"
    return {"model_build": res}


def convert(ctx) -> dict:
    p, host = ctx.profile, ctx.host
    m = p.model
    res: dict = {"source": hm.hf_source(host, m.source), "output": m.output, "engine": engine_support(ctx)}
    out = host.path(m.output)
    record_file = ctx.store.dir / "model-output.json"
    cache = ctx.store.dir / "sha256-cache.json"
    escape = leaves_its_directory(host, m.output, config.models_dir(p))
    if escape:
        res["refused"] = escape
        return res
    aside = _changed_aside(ctx, out, record_file, cache)
    if aside:
        res["moved_aside"] = aside
    if out.exists():
        return existing(ctx, res)
    tmp = out.with_name(f".{out.name}.partial")
    if finish_interrupted(ctx, tmp, out, record_file, cache):
        res["finished_interrupted"] = f"{tmp.name} was converted, verified and recorded by a run that stopped " \
                                      "before its rename: renamed now"
        return existing(ctx, res)
    if not source_ok(res["source"]):
        return res
    need = int(res["source"]["total_bytes"] * HEADROOM)
    free = system.free_bytes(host, str(Path(m.output).parent))
    res["disk"] = {"free_bytes": free, "need_bytes": need}
    if free < need:
        return res
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in (tmp, Path(f"{tmp}.conversion.json")):
        stale.unlink(missing_ok=True)
    argv = convert_argv(ctx, str(host.path(m.source)), str(tmp))
    res["convert_argv"] = argv
    log = safefs.write_text(ctx.store.dir / "logs/model.log", "")  # never through a link (issue 40)
    with ctx.out.working(f"[model] converting {m.source} -> {m.output}", log=str(log), follow=follow_cmd("model")):
        r = host.runner.run(argv, check=False, cwd=host.path(p.engine.build_dir), timeout=24 * 3600,
                            output_log=log)
    res["convert_rc"] = r.returncode
    res["convert_tail"] = (r.stderr or r.stdout).strip().splitlines()[-4:]
    if r.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        return res
    res["verify"] = verify_file(ctx, tmp)
    if "error" in res["verify"]:
        tmp.unlink(missing_ok=True)  # a broken conversion never takes the model's name
        return res
    # The record first, the rename last: a run killed in between leaves no output and a partial file
    # the record vouches for (the next run renames it), one killed after it an output it recognises.
    res["sha256"] = hm.sha256_cached(host, tmp, cache, progress=_progress(ctx))
    res["size"] = tmp.stat().st_size
    atomic_write(record_file, writers.json_text({"path": m.output, "sha256": res["sha256"], "size": res["size"],
                                                 "partial": tmp.name}).encode())
    _rename(tmp, out, cache, res["sha256"])
    res["identity"] = system.file_identity(out)  # after the rename (it moves the change time): what status re-proves
    return res


def _changed_aside(ctx, out: Path, record_file: Path, cache: Path) -> str | None:
    """The model p2pkit converted (its record names this output) that no longer holds the bytes it recorded (an
    edit, a truncation): moved aside under a name of its own, kept and named, so that it is converted again
    (issue 48 item 3: `up` stopped at "p2pkit never overwrites a model" and the host stayed broken). A file
    p2pkit did not record is never touched. What was done, or None."""
    rec = _record(record_file) if out.is_file() else {}
    if rec.get("path") != ctx.profile.model.output:
        return None
    if hm.sha256_cached(ctx.host, out, cache) == rec.get("sha256"):
        return None
    aside = out.with_name(f"{out.name}.changed-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    os.rename(out, aside)
    said = (f"{ctx.profile.model.output} no longer matches the sha256 p2pkit recorded when it converted it "
            f"({rec.get('sha256', '?')[:12]}...): moved aside to {aside} (kept) and converted again")
    ctx.out.warn(f"[model] {said}")
    return said


def _rename(tmp: Path, out: Path, cache: Path, digest: str) -> None:
    side = Path(f"{tmp}.conversion.json")
    if side.is_file():
        os.replace(side, Path(f"{out}.conversion.json"))
    os.replace(tmp, out)
    hm.remember_sha256(out, cache, digest)  # the same bytes under their final name: no second hash


def _record(record_file: Path) -> dict:
    """The model record: {} when there is none; a broken one is an error naming it and the fix."""
    rec = read_json(record_file, "the model record", f"remove {record_file} and run `p2pkit up --from model "
                    "--force`: p2pkit then treats an existing output as not its own and refuses it")
    if rec is not None and not (isinstance(rec, dict) and isinstance(rec.get("path"), str)
                                and isinstance(rec.get("sha256"), str)):
        raise CorruptArtifact(f"the model record {record_file} is not a p2pkit model record (path, sha256)",
                              hint=f"remove {record_file} and run `p2pkit up --from model --force`")
    return rec or {}


def finish_interrupted(ctx, tmp: Path, out: Path, record_file: Path, cache: Path) -> bool:
    """A partial file whose record was written (a run killed before its rename): rename it when its
    digest is still the recorded one. Anything else about it is left to the normal path."""
    if not tmp.is_file():
        return False
    rec = _record(record_file)
    if rec.get("path") != ctx.profile.model.output or rec.get("partial") != tmp.name:
        return False
    if hm.sha256_cached(ctx.host, tmp, cache) != rec.get("sha256"):
        return False
    _rename(tmp, out, cache, rec["sha256"])
    return True


def _progress(ctx):
    if not ctx.out.err.is_terminal or ctx.out.json_mode:
        return None
    from rich.progress import Progress

    bar = Progress(transient=True, console=ctx.out.err)
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("sha256", total=total)
        bar.update(task, completed=done)
        if done >= total:
            bar.stop()
    return update
