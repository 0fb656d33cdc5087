"""Strict reading of portable artifacts: the file a person reads is exactly the data verified.

Refused: input that is not the artifact's one spelling (compact JSON, members in documented order, an
optional final newline; so no byte of a file can change without changing what is verified), input over the
size cap, invalid UTF-8, duplicate keys at any depth, NaN/Infinity, escaped lone surrogates, unknown or
missing members, wrong JSON types (no coercion: "1" is not 1, true is not 1), and byte strings that are not
canonical standard base64 with padding.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer, ValidationError

from ._errors import UnreadableInput

__all__ = ["B64", "MAX_INPUT_BYTES", "Artifact", "ObjectCheck", "b64", "parse_artifact", "strict_json"]

MAX_INPUT_BYTES = 256 * 1024 * 1024
"""The largest artifact read (256 MiB)."""

ObjectCheck = Callable[[dict[str, Any]], None]
"""Called with each JSON object as soon as it is parsed (innermost first, in document order); raises to stop
reading."""

# Python keeps each JSON value in 30 to 100 bytes of memory: input holding a value every few bytes (`[[],[],`,
# `0.0,0.0,`) takes 10 to 30 times its size to parse. Counted over the whole input (by its commas, brackets
# and braces, which whitespace padding elsewhere in the file cannot thin out), no artifact of a megabyte or
# more that can be valid holds a value more often than about every 40 bytes (an audit path's base64 hashes
# take 47 bytes each); larger inputs denser than one every 32 are refused unparsed, which bounds what any
# input can cost to a few times its size.
_DENSITY_CHECKED_FROM = 1024 * 1024
_MIN_BYTES_PER_VALUE = 32


# One character outside the Basic Multilingual Plane (an emoji) makes Python keep the whole decoded text at 4
# bytes a character: a large, otherwise ASCII input then takes twice the memory (678 MB against 294 MB for
# 64 MiB). Inside a JSON string, the only place such a character may be, its \u escape pair is the same
# character: escaped before decoding, the text stays at 1 or 2 bytes a character. Not worth it when such
# characters are most of the input (each escape is 12 bytes).
_ASTRAL = re.compile(rb"[\xf0-\xf4][\x80-\xbf]{3}")
_ASTRAL_LEADS = tuple(bytes([lead]) for lead in range(0xF0, 0xF5))


def _escape_astral(data: bytes) -> bytes:
    """`data` with each character outside the BMP written as its JSON escape pair, when that saves memory."""
    if len(data) < _DENSITY_CHECKED_FROM:
        return data
    leads = sum(data.count(lead) for lead in _ASTRAL_LEADS)  # counted in C: nothing allocated
    if leads == 0 or leads * 24 > len(data):
        return data
    return _ASTRAL.sub(_escape_pair, data)


def _escape_pair(match: re.Match[bytes]) -> bytes:
    try:
        point = ord(match.group().decode("utf-8")) - 0x10000
    except UnicodeDecodeError:  # not UTF-8 (overlong, past U+10FFFF): left for the decoder to refuse
        return match.group()
    return b"\\u%04x\\u%04x" % (0xD800 + (point >> 10), 0xDC00 + (point & 0x3FF))


def b64(data: bytes) -> str:
    """Standard base64 with padding: the one spelling of bytes in every artifact."""
    return base64.b64encode(data).decode("ascii")


def _unb64(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise ValueError("expected a base64 string")
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"invalid base64: {exc}") from exc
    if b64(raw) != value:
        raise ValueError("non-canonical base64")
    return raw


B64 = Annotated[bytes, BeforeValidator(_unb64), PlainSerializer(b64, return_type=str)]
"""Bytes carried as canonical base64 text."""


class Artifact(BaseModel):
    """Base of every portable artifact model: frozen, strict types, unknown members refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @classmethod
    def _object_check(cls, what: str) -> ObjectCheck | None:
        """What checks the artifact's JSON objects while `parse_artifact` reads `what` (None: nothing)."""
        return None

    def to_json(self) -> bytes:
        """The artifact's one spelling: compact UTF-8 JSON, members in documented order, then a newline."""
        return self.model_dump_json().encode("utf-8") + b"\n"


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise UnreadableInput(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise UnreadableInput(f"{name} is not JSON")


def _check_text(value: Any) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise UnreadableInput("a JSON string holds an escaped lone surrogate") from exc
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def strict_json(
    data: bytes,
    *,
    what: str = "input",
    max_bytes: int = MAX_INPUT_BYTES,
    check_object: ObjectCheck | None = None,
) -> Any:
    """Parse JSON bytes strictly (see the module docstring); raises UnreadableInput. `check_object` sees each
    object as it is parsed (what it raises propagates), so that input can be refused before all of it is
    held in memory."""
    if len(data) > max_bytes:
        raise UnreadableInput(f"{what} is {len(data)} bytes, over the {max_bytes}-byte limit")
    try:
        text = _escape_astral(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableInput(f"{what} is not UTF-8: {exc}") from exc
    try:
        hook = _pairs if check_object is None else _checked_pairs(check_object)
        value = json.loads(text, object_pairs_hook=hook, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise UnreadableInput(f"{what} is not JSON: {exc}") from exc
    except ValueError as exc:  # an integer longer than Python converts (4,300 digits by default)
        # Python's own message ends with advice for programmers (sys.set_int_max_str_digits): cut it.
        why = str(exc).partition("; use sys.")[0]
        raise UnreadableInput(f"{what} holds a number too long to read: {why}") from exc
    except RecursionError as exc:
        raise UnreadableInput(f"{what} is nested too deeply") from exc
    _check_text(value)
    return value


def _checked_pairs(check: ObjectCheck) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        value = _pairs(items)
        check(value)
        return value

    return pairs


def _check_density(data: bytes, what: str) -> None:
    if len(data) < _DENSITY_CHECKED_FROM:
        return
    values = data.count(b",") + data.count(b"[") + data.count(b"{")
    if values * _MIN_BYTES_PER_VALUE > len(data):
        raise UnreadableInput(
            f"{what} is not an artifact bide wrote: it holds a JSON value every {len(data) / values:.1f} "
            f"bytes on average, and none is denser than one every {_MIN_BYTES_PER_VALUE} (reading it would "
            "take many times its size in memory); ask the sender for the file `bide-audit export` wrote"
        )


M = TypeVar("M", bound=Artifact)

# Which command reads each artifact, for a file given to another one (an evidence package to `verify`).
_READ_BY = {
    "bide.audit.proof.v1": "`bide-audit verify`",
    "bide.audit.evidence.v1": "`bide-audit verify-evidence` and `verify-approvals`",
    "bide.audit.sth.v1": "`bide-audit verify-consistency`, as OLD_HEAD or NEW_HEAD",
    "bide.audit.consistency.v1": "`bide-audit verify-consistency`, as PROOF",
}


def parse_artifact(model: type[M], data: bytes | Any, *, what: str = "input") -> M:
    """Read an artifact of `model`'s format from JSON bytes (or an already strictly parsed value).

    The `format` member is checked first, so a file of another kind is named as such.
    """
    if isinstance(data, (bytes, bytearray)):
        _check_density(bytes(data), what)
        value = strict_json(bytes(data), what=what, check_object=model._object_check(what))
    else:
        value = data
    expected = model.model_fields["format"].default
    if not isinstance(value, dict):
        raise UnreadableInput(f"{what} is not a JSON object")
    got = value.get("format")
    if got != expected:
        read_by = _READ_BY.get(got) if isinstance(got, str) else None
        hint = f" (a file of that format is read by {read_by})" if read_by else ""
        shown = repr(got) if len(repr(got)) <= 100 else repr(got)[:100] + "... (cut)"
        raise UnreadableInput(f"{what} has format {shown}; expected {expected!r}{hint}")
    try:
        parsed = model.model_validate(value, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise UnreadableInput(f"{what} is malformed at {where}: {first['msg']}") from exc
    if isinstance(data, (bytes, bytearray)) and bytes(data) not in (canon := parsed.to_json(), canon[:-1]):
        raise UnreadableInput(f"{what} is not in canonical form (compact JSON, members in the documented "
                              "order, as bide writes it); it was edited or re-encoded")
    return parsed
