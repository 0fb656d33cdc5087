"""Canonical JSON: the one byte encoding of both packages.

bide's journal records, approval digests and audit leaves, and govern's certificates, rules digests,
expression digests and event-log leaves are all encoded by `json_text` here: object keys sorted by code
point, no whitespace, UTF-8 (no ASCII escaping; only `"`, `\\` and control characters below U+0020 are
escaped, as `\\b \\f \\n \\r \\t` or `\\u00xx`), integers in plain decimal, no NaN or infinities. Equal
values encode to equal bytes, which is what digests, salts and audit leaves rely on.

Not RFC 8785 (JCS), on purpose (docs/certificate.md, "Canonical JSON and RFC 8785"): JCS writes numbers
as ECMAScript doubles, so an integer beyond 2^53 could not round-trip, and it sorts keys by UTF-16 code
unit; adopting it would silently change the bytes, hence the digests, of existing journals whose records
hold such values. For every value without floats, with integers within +-(2^53 - 1), and with object keys
that do not mix characters above U+FFFF with characters from U+E000 to U+FFFF, the bytes are exactly
those of RFC 8785, so a JCS library in another language reproduces them; every certificate and audit
artifact format is inside that domain (tests/test_canonical.py checks the equality against an
independent JCS encoder).
"""

from __future__ import annotations

import hashlib
import json
import os
from binascii import b2a_base64 as _b64
from typing import Any

__all__ = ["canonical_json", "digest", "json_text", "new_claim", "new_salt", "utf8_text"]


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The same encoding as _ENCODER, made once: JSONEncoder.encode builds a new C encoder on every call. Without
# a markers dict (which one encoder shared by threads could not keep consistent), a cyclic value ends in
# RecursionError instead of ValueError.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODER = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(None, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, False)
)


def json_text(value: Any) -> str:
    """The canonical JSON text of a JSON value; raises TypeError, ValueError (NaN, infinities) or
    RecursionError (a cycle) for anything else."""
    if _C_ENCODER is not None:
        return "".join(_C_ENCODER(value, 0))
    return _ENCODER.encode(value)


# The last value `checked_json_text` encoded and its text: a tool's result is encoded once, to check that the
# journal can hold it (bide._tools.journal_safe), and its result record and the model's tool message reuse
# that text (`known_json_text`). One tuple, replaced whole, so a thread reads a value with its own text; it
# holds the value, so no other object can have that identity while it is here. The values are the JSON copies
# journal_safe makes, never changed after.
_LAST_TEXT: tuple[object, str] = (object(), "")


def checked_json_text(value: Any) -> str:
    """`json_text(value)`, remembered for `known_json_text(value)` until the next call."""
    global _LAST_TEXT
    text = json_text(value)
    _LAST_TEXT = (value, text)
    return text


def known_json_text(value: object) -> str | None:
    """The text `checked_json_text` gave for this very object when it was the last one encoded, else None."""
    last = _LAST_TEXT
    return last[1] if last[0] is value else None


def canonical_json(value: Any) -> bytes:
    """Encode a JSON value canonically (sorted keys, compact separators, UTF-8)."""
    try:
        text = json_text(value)
    except (TypeError, ValueError, RecursionError) as exc:
        from ._errors import ConfigError

        raise ConfigError(f"value is not JSON-encodable: {exc}") from exc
    return text.encode("utf-8")


def digest(value: Any) -> str:
    """SHA-256 hex digest of the canonical JSON encoding of `value`."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


# Salts and claims are made 128 at a time from one os.urandom read and handed out by list.pop(), which is
# atomic: each is handed out once, to one caller, whatever the threads.
_SALTS: list[str] = []
_CLAIMS: list[str] = []
_BATCH = 128


def _forget_pools() -> None:
    # A forked child must not hand out the values its parent will hand out too.
    _SALTS.clear()
    _CLAIMS.clear()


os.register_at_fork(after_in_child=_forget_pools)


def new_salt() -> str:
    """32 fresh random bytes, base64: every record carries one so equal records hash differently."""
    while True:
        try:
            return _SALTS.pop()
        except IndexError:
            block = os.urandom(32 * _BATCH)
            _SALTS.extend([_b64(block[i : i + 32], newline=False).decode() for i in range(0, len(block), 32)])


def new_claim() -> str:
    """16 fresh random bytes, hex: the claim id of one side-effect attempt."""
    while True:
        try:
            return _CLAIMS.pop()
        except IndexError:
            text = os.urandom(16 * _BATCH).hex()
            _CLAIMS.extend([text[i : i + 32] for i in range(0, len(text), 32)])


def utf8_text(text: str) -> str:
    """`text` with each lone surrogate written as its backslash escape: text UTF-8 (hence a journal, a
    file or a terminal) can hold. Messages quoting what came from outside (a file name, a server's error)
    pass through it."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
