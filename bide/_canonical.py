"""Canonical JSON: the one byte encoding of every journal record.

Sorted keys, no whitespace, UTF-8 (no ASCII escaping), no NaN or infinities. Equal values encode to equal
bytes, which is what digests, salts and audit leaves rely on.
"""

from __future__ import annotations

import hashlib
import json
import os
from binascii import b2a_base64 as _b64
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


# Salts are made 128 at a time from one os.urandom read and handed out by list.pop(), which is atomic:
# every salt is handed out once, to one caller, whatever the threads.
_SALTS: list[str] = []
_BATCH = 128


def _forget_salts() -> None:
    # A forked child must not hand out the salts its parent will hand out too.
    _SALTS.clear()


os.register_at_fork(after_in_child=_forget_salts)


def new_salt() -> str:
    """32 fresh random bytes, base64: every record carries one so equal records hash differently."""
    while True:
        try:
            return _SALTS.pop()
        except IndexError:
            block = os.urandom(32 * _BATCH)
            _SALTS.extend([_b64(block[i : i + 32], newline=False).decode() for i in range(0, len(block), 32)])
