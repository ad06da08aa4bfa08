"""Model files: safetensors headers and NInfer containers, parsed from bytes (no I/O here)."""

from __future__ import annotations

import json
import struct

NINFER_MAGIC = {b"NINFER\0\x02": 2, b"NINFER\0\x03": 3}


def safetensors_header(head: bytes) -> tuple[int, dict]:
    """(header length, header) from a file's first bytes: u64 LE length, then that much JSON."""
    if len(head) < 8:
        raise ValueError("shorter than the 8-byte header length")
    n = struct.unpack("<Q", head[:8])[0]
    if n > 100 << 20:
        raise ValueError(f"header length {n} is not plausible")
    if len(head) < 8 + n:
        raise ValueError("the header is truncated")
    return n, json.loads(head[8:8 + n])


def safetensors_data_end(header: dict) -> int:
    return max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)


def ninfer_container(head: bytes) -> dict:
    """Magic (v2 or v3), u64 LE JSON length, JSON header."""
    magic = head[:8]
    if magic not in NINFER_MAGIC:
        if magic.startswith(b"NINFER\0"):
            raise ValueError(f"unknown NInfer container version {magic[7]}")
        raise ValueError(f"not a NInfer container (magic {magic!r})")
    n = struct.unpack("<Q", head[8:16])[0]
    if len(head) < 16 + n:
        raise ValueError("the JSON header is truncated")
    return {"version": NINFER_MAGIC[magic], "header": json.loads(head[16:16 + n])}
