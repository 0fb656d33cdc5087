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
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer, ValidationError

from ._errors import UnreadableInput

__all__ = ["B64", "MAX_INPUT_BYTES", "Artifact", "b64", "parse_artifact", "strict_json"]

MAX_INPUT_BYTES = 256 * 1024 * 1024
"""The largest artifact read (256 MiB)."""


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


def strict_json(data: bytes, *, what: str = "input", max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """Parse JSON bytes strictly (see the module docstring); raises UnreadableInput."""
    if len(data) > max_bytes:
        raise UnreadableInput(f"{what} is {len(data)} bytes, over the {max_bytes}-byte limit")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableInput(f"{what} is not UTF-8: {exc}") from exc
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
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
    value = strict_json(bytes(data), what=what) if isinstance(data, (bytes, bytearray)) else data
    expected = model.model_fields["format"].default
    if not isinstance(value, dict):
        raise UnreadableInput(f"{what} is not a JSON object")
    got = value.get("format")
    if got != expected:
        read_by = _READ_BY.get(got) if isinstance(got, str) else None
        hint = f" (a file of that format is read by {read_by})" if read_by else ""
        raise UnreadableInput(f"{what} has format {got!r}; expected {expected!r}{hint}")
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
