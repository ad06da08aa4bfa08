"""Secrets: environment values whose name looks like one (TOKEN, KEY, SECRET, PASSWORD) or that
the profile marks (serve.secret_env). They go only to a root-owned 0600 file the engine's unit
reads (EnvironmentFile= is read by systemd as root, before it drops to User=), and every output
p2pkit makes (the terminal, JSON, artifacts, logs) shows them as <redacted>.
"""

from __future__ import annotations

import re
import threading
from typing import Any

SECRET_WORDS = {"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "APIKEY", "CREDENTIAL", "CREDENTIALS"}
REDACTED = "<redacted>"
_mu = threading.Lock()
_values: set[str] = set()


def is_secret(name: str, marked: tuple[str, ...] | list[str] = ()) -> bool:
    """HF_TOKEN, api-key, DB_PASSWORD: the name's last word (split at _ - .) names a secret; not
    max-num-batched-tokens, long-prefill-token-threshold or HF_TOKEN_PATH."""
    return name in marked or re.split(r"[_\-.]", name.upper())[-1] in SECRET_WORDS


def split_env(env: dict[str, str], marked: tuple[str, ...] | list[str] = ()) -> tuple[dict, dict]:
    """(plain, secret) parts of an environment table."""
    plain = {k: v for k, v in env.items() if not is_secret(k, marked)}
    return plain, {k: v for k, v in env.items() if k not in plain}


def register(value: Any) -> None:
    """From now on, `value` is redacted wherever p2pkit prints or writes it."""
    text = str(value)
    if len(text) >= 3:  # a one- or two-character "secret" would redact half of every line
        with _mu:
            _values.add(text)


def redact(text: str) -> str:
    if not _values or not isinstance(text, str):
        return text
    for v in sorted(_values, key=len, reverse=True):
        if v in text:
            text = text.replace(v, REDACTED)
    return text


def redact_doc(doc: Any) -> Any:
    if not _values:
        return doc
    if isinstance(doc, str):
        return redact(doc)
    if isinstance(doc, dict):
        return {redact(k) if isinstance(k, str) else k: redact_doc(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [redact_doc(v) for v in doc]
    return doc
