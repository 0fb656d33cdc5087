"""Canonical JSON: the one byte encoding of every journal record.

Sorted keys, no whitespace, UTF-8 (no ASCII escaping), no NaN or infinities. Equal values encode to equal
bytes, which is what digests, salts and audit leaves rely on.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import os
import threading
from typing import Any

__all__ = ["canonical_json", "digest", "new_salt"]


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> bytes:
    """Encode a JSON value canonically (sorted keys, compact separators, UTF-8)."""
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        from ._errors import ConfigError

        raise ConfigError(f"value is not JSON-encodable: {exc}") from exc
    return text.encode("utf-8")


def digest(value: Any) -> str:
    """SHA-256 hex digest of the canonical JSON encoding of `value`."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


class _Entropy(threading.local):
    """Bytes from os.urandom, read in blocks and handed out once each (per thread, so never twice)."""

    block = b""
    pos = 0


_ENTROPY = _Entropy()
_BLOCK = 4096


def _forget_entropy() -> None:
    # A forked child must not hand out the bytes its parent will hand out too.
    global _ENTROPY
    _ENTROPY = _Entropy()


os.register_at_fork(after_in_child=_forget_entropy)


def new_salt() -> str:
    """32 fresh random bytes, base64: every record carries one so equal records hash differently."""
    pool = _ENTROPY
    pos = pool.pos
    if pos + 32 > len(pool.block):
        pool.block, pos = os.urandom(_BLOCK), 0
    pool.pos = pos + 32
    return binascii.b2a_base64(pool.block[pos : pos + 32], newline=False).decode("ascii")
