"""The model source directory (HF layout) and files on disk, read through the host root."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from p2pkit.errors import ProbeError
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


def sha256_cached(host: Host, path: Path, cache_file: Path, progress=None) -> str:
    """sha256 of a large file, streamed; cached by (size, mtime) so an unchanged file is not re-read."""
    st = path.stat()
    key = f"{path}:{st.st_size}:{st.st_mtime_ns}"
    cache = {}
    if cache_file.is_file():
        try:
            cache = json.loads(cache_file.read_text())
        except ValueError:
            cache = {}
    if key in cache:
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
    try:
        cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    except ValueError:
        cache = {}
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{path}:")}
    cache[f"{path}:{st.st_size}:{st.st_mtime_ns}"] = digest
    tmp = cache_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1))
    os.replace(tmp, cache_file)


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
