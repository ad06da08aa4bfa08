"""The model source directory (HF layout) and files on disk, read through the host root."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from p2pkit.core import safefs
from p2pkit.core.errors import ProbeError
from p2pkit.host import Host
from p2pkit.parse import artifact as pa


def hf_source(host: Host, path: str) -> dict:
    d = host.path(path)
    out: dict = {"path": path, "config": (d / "config.json").is_file(), "shards": {}}
    idx = d / "model.safetensors.index.json"
    if not idx.is_file():
        out["index_error"] = f"{path}/model.safetensors.index.json is missing"
        return out
    try:
        weight_map = json.loads(idx.read_text())["weight_map"]
    except (ValueError, KeyError) as e:
        out["index_error"] = f"model.safetensors.index.json is not readable: {e}"
        return out
    expected: dict[str, set] = {}
    for tensor, shard in weight_map.items():
        expected.setdefault(shard, set()).add(tensor)
    total = 0
    for shard, keys in sorted(expected.items()):
        f = d / shard
        s: dict = {"present": f.is_file()}
        if f.is_file():
            size = f.stat().st_size
            total += size
            try:
                with open(f, "rb") as fh:
                    head = fh.read(8)
                    n = int.from_bytes(head, "little") if len(head) == 8 else 0
                    head += fh.read(min(n, 100 << 20))
                n, header = pa.safetensors_header(head)
                got = {k for k in header if k != "__metadata__"}
                s.update(size=size, missing_keys=sorted(keys - got)[:5], extra_keys=sorted(got - keys)[:5],
                         truncated=size < 8 + n + pa.safetensors_data_end(header))
            except (ValueError, OSError) as e:
                s.update(size=size, error=str(e), truncated=True)
        out["shards"][shard] = s
    out["total_bytes"] = total
    return out


def _cache_key(path: Path, st: os.stat_result) -> str:
    """A file as the sha256 cache knows it: path, size, modification and change time, inode. A file replaced
    with one of the same size and a mtime set back (`touch -d`) has another inode or change time: hashed again."""
    return f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}"


def _read_cache(cache_file: Path) -> dict:
    """The digest cache p2pkit keeps in the state directory; {} where there is none or it is not p2pkit's plain
    file of a record's size (a link, a FIFO: never read through, never waited on; issue 48 item 4)."""
    try:
        cache = json.loads(safefs.read_bytes(cache_file))
    except (OSError, ValueError, safefs.LinkRefused):
        return {}
    return cache if isinstance(cache, dict) else {}


def sha256_cached(host: Host, path: Path, cache_file: Path, progress=None, fresh: bool = False) -> str:
    """sha256 of a large file, streamed; cached by its identity (_cache_key) so an unchanged file is not
    re-read; `fresh` reads it whole whatever the cache says (`verify`: bytes rotted in place keep every stat)."""
    st = path.stat()
    key = _cache_key(path, st)
    cache = _read_cache(cache_file)
    if key in cache and not fresh:
        return cache[key]
    h = hashlib.sha256()
    done = 0
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            h.update(view[:n])
            done += n
            if progress:
                progress(done, st.st_size)
    digest = h.hexdigest()
    remember_sha256(path, cache_file, digest)
    return digest


def remember_sha256(path: Path, cache_file: Path, digest: str) -> None:
    """Record a digest already known for `path` (a file renamed into place keeps size and mtime)."""
    st = path.stat()
    cache = _read_cache(cache_file)
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{path}:")}
    cache[_cache_key(path, st)] = digest
    safefs.atomic_write(cache_file, json.dumps(cache, indent=1).encode(), fsync=False)  # a link there replaced


def read_head(path: Path, n: int = 64 << 20) -> bytes:
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
            if len(head) == 16:
                length = int.from_bytes(head[8:16], "little")
                head += fh.read(min(length, n))
            return head
    except OSError as e:
        raise ProbeError(f"the model file {path}", e.strerror or str(e)) from e


TP_QUANT_KV_GUARD = "simultaneous use of SPLIT_MODE_TENSOR and KV cache quantization"  # llama.cpp before #23792


def open_gguf(path: Path):
    """A GGUF file through the gguf package's reader, or {"error": ...} (no package, not readable)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return {"error": "reading GGUF needs the gguf package: pip install gguf"}
    try:
        return GGUFReader(str(path))
    except Exception as e:  # the reader raises plain ValueErrors and struct errors on bad files
        return {"error": f"not a readable GGUF file: {e}"}


def _gguf_shape(path: Path) -> dict:
    r = open_gguf(path)
    if isinstance(r, dict):
        return r

    def val(key: str):
        f = r.fields.get(key)
        if f is None:
            return None
        v = f.contents()
        return v.decode() if isinstance(v, bytes) else v
    arch = val("general.architecture")
    layers, heads = val(f"{arch}.block_count"), val(f"{arch}.attention.head_count")
    kvh = val(f"{arch}.attention.head_count_kv") or heads
    emb = val(f"{arch}.embedding_length")
    hd = emb // heads if emb and heads else None
    return {"arch": arch, "layers": layers, "kv_heads": kvh, "head_dim_k": val(f"{arch}.attention.key_length") or hd,
            "head_dim_v": val(f"{arch}.attention.value_length") or hd,
            "draft_layers": val(f"{arch}.nextn_predict_layers") or 0,
            "context_length": val(f"{arch}.context_length")}


def _hf_shape(host: Host, source: str) -> dict:
    try:
        c = json.loads(host.read(f"{source.rstrip('/')}/config.json", "the model's config.json"))
    except ValueError as e:
        return {"error": f"{source}/config.json is not JSON: {e}"}
    c = c.get("text_config", c)
    heads = c.get("num_attention_heads")
    hd = c.get("head_dim") or (c["hidden_size"] // heads if c.get("hidden_size") and heads else None)
    return {"layers": c.get("num_hidden_layers"), "kv_heads": c.get("num_key_value_heads") or heads,
            "head_dim_k": hd, "head_dim_v": hd,
            "draft_layers": c.get("num_nextn_predict_layers") or c.get("mtp_num_hidden_layers") or 0,
            "context_length": c.get("max_position_embeddings")}


def model_shape(host: Host, profile, draft: str | None = None) -> dict:
    """What the fit check needs of the model: its size in bytes (what loading puts in VRAM) and the
    shape of its KV cache (layers, KV heads, head dims, draft layers); with `draft`, the separate draft model
    the engine is given (its engine module names it: engine_cmd.draft_model), read the same way."""
    m = profile.model
    fmt = m.format
    if fmt == "gguf":
        path = host.path(m.output)
        if not path.is_file():
            return {"error": f"{m.output} does not exist yet (the model stage writes it)"}
        shape = {**_gguf_shape(path), "weights_bytes": path.stat().st_size}
    else:
        shape = _hf_shape(host, m.source)
        if fmt == "hf":
            shape["weights_bytes"] = hf_source(host, m.source).get("total_bytes") or 0
        else:  # the converted artifact (with its .part volumes); before the model stage, its source's size
            out = host.path(m.output)
            shape["weights_bytes"] = (sum(x.stat().st_size for x in out.parent.glob(out.name + "*")
                                          if not x.name.endswith(".json")) if out.parent.is_dir() else 0) or \
                hf_source(host, m.source).get("total_bytes") or 0
    if "error" in shape:
        return shape
    missing = [k for k in ("layers", "kv_heads", "head_dim_k", "head_dim_v") if not shape.get(k)]
    if missing or not shape.get("weights_bytes"):
        return {"error": f"the model does not say its {', '.join(missing) or 'size'}"}
    out = {k: int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for k, v in shape.items()}
    if draft:  # llama-server loads a draft model it is given (-md), drafting on or off: its weights and KV count
        dpath = host.path(str(draft))
        d = {**_gguf_shape(dpath), "weights_bytes": dpath.stat().st_size} if dpath.is_file() else \
            {"error": f"the draft model {draft} does not exist"}
        out["draft_model"] = {"path": str(draft), **d}
    return out


def tp_quant_kv_refused(host: Host, build_dir: str) -> bool | None:
    """Whether the llama.cpp tree predates PR #23792 (tensor split refuses quantized KV); None when
    the tree is not there to read."""
    src = host.path(build_dir) / "src"
    if not src.is_dir():
        return None
    return any(TP_QUANT_KV_GUARD in x.read_text(errors="replace") for x in src.glob("llama*.cpp"))
