"""Canonical JSON: the one byte encoding of every journal record.

Sorted keys, no whitespace, UTF-8 (no ASCII escaping), no NaN or infinities. Equal values encode to equal
bytes, which is what digests, salts and audit leaves rely on.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import os
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


def new_salt() -> str:
    """32 fresh random bytes, base64: every record carries one so equal records hash differently."""
    return binascii.b2a_base64(os.urandom(32), newline=False).decode("ascii")
