"""JSON Schemas of p2pkit's documents: one file per kind of `--json` document (NAME.schema.json,
NAME being the document's `kind`), and the profile's, made from the profile's own definition so
it cannot drift from what `p2pkit profile validate` accepts. docs/json.md says how versions change."""

from __future__ import annotations

import json
import typing
from dataclasses import MISSING, fields
from pathlib import Path

HERE = Path(__file__).parent
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def kinds() -> list[str]:
    return sorted(p.name.removesuffix(".schema.json") for p in HERE.glob("*.schema.json"))


def load(kind: str) -> dict | None:
    p = HERE / f"{kind}.schema.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _json_type(tp) -> dict:
    origin = typing.get_origin(tp) or tp
    return {str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
            bool: {"type": "boolean"}, list: {"type": "array"}, dict: {"type": "object"}}.get(origin, {})


def _limits(path: str, s: dict) -> str:
    """The sizes `profile validate` holds a key to (core/config.py, docs/profile-limits.md), into its schema:
    maxLength counts characters, which are never more than the UTF-8 bytes the limit counts."""
    from p2pkit.core import config

    kind = s.get("type")
    if kind == "string":
        s["maxLength"] = config.STRING_MAX
        return f"(at most {config.STRING_MAX} bytes)"
    if kind == "array":
        s["maxItems"] = config.ITEMS_MAX
        return f"(at most {config.ITEMS_MAX} items of at most {config.STRING_MAX} bytes)"
    if kind != "object":
        return ""
    value = config.table_value_max(path, "")
    s.update(maxProperties=config.ITEMS_MAX, propertyNames={"maxLength": config.NAME_MAX},
             additionalProperties={"maxLength": value, "minimum": config.INT_RANGE[0],
                                   "maximum": config.INT_RANGE[1], "maxItems": config.ITEMS_MAX})
    text = (f"(at most {config.ITEMS_MAX} entries, names of at most {config.NAME_MAX} bytes, integers signed 64-bit, "
            f"strings of at most {config.STRING_MAX} bytes)")
    if path == "serve.flags":  # a flag takes one value
        s["additionalProperties"]["type"] = ["string", "integer", "number", "boolean"]
    if path in ("serve.env", "serve.flags"):
        what = "NAME=value" if path == "serve.env" else "value"
        text = (f"(at most {config.ITEMS_MAX} entries, names of at most {config.NAME_MAX} bytes, integers signed "
                f"64-bit; each {what} with its NUL at most {config.MAX_ARG_STRLEN} bytes, the kernel's MAX_ARG_STRLEN "
                f"for one string execve hands the engine, E2BIG beyond; [serve.env] and [serve.flags] together at "
                f"most {config.ARG_MAX_FLOOR - config.ENGINE_RESERVE} bytes of the {config.ARG_MAX_FLOOR} execve "
                "always gives, strings, NULs and pointers counted)")
    return text


def profile_schema() -> dict:
    """The profile TOML's schema: sections, keys, types, patterns, choices, ranges, required keys."""
    from p2pkit.core import config

    sections = {}
    for sec, cls in config.SECTIONS.items():
        hints = typing.get_type_hints(cls)
        props, required = {}, []
        for fl in fields(cls):
            m, s = fl.metadata, _json_type(hints[fl.name])
            limit = _limits(f"{sec}.{fl.name}", s)
            if m.get("expect") or limit:
                s["description"] = " ".join(x for x in (m.get("expect"), limit) if x)
            if m.get("pattern"):
                s["pattern"] = config.pattern_of(m)
            if m.get("choices"):
                s["enum"] = list(m["choices"])
            if m.get("lo") is not None:
                s["minimum"] = m["lo"]
            if m.get("hi") is not None:
                s["maximum"] = m["hi"]
            if m.get("item_pattern"):
                s["items"] = {"type": "string", "pattern": m["item_pattern"]}
            if fl.default is not MISSING and isinstance(fl.default, str | int | float | bool):
                s["default"] = fl.default
            if fl.default is MISSING and fl.default_factory is MISSING:
                required.append(fl.name)
            props[fl.name] = s
        sections[sec] = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return {"$schema": DRAFT, "$id": "p2pkit:profile", "title": "a p2pkit profile (TOML)", "type": "object",
            "properties": sections, "additionalProperties": False,
            "required": [s for s, v in sections.items() if v["required"]]}
