"""Byte-exact encodings a certificate is made of: canonical JSON, strict JSON reading, compact tables.

Every function here is total on its input and either returns the one canonical value or raises
`CertificateUnreadable` naming what is wrong; nothing is repaired or guessed. The encodings are
specified in docs/certificate.md so that an independent checker can reproduce them byte for byte.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from bide._canonical import json_text

from ._errors import CertificateUnreadable

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_NESTING",
    "canonical_json",
    "decode_table",
    "encode_table",
    "nesting_depth",
    "parse_strict_json",
]

#: Largest certificate `govern check` reads unless told otherwise (bytes on disk).
DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024

#: Deepest nesting of arrays and objects a certificate may have (the document itself is level 1). The
#: certificate models are read and written back by pydantic, which gives up near 255 levels; refusing
#: deeper documents here, before anything recursive sees them, keeps that a clear "unreadable".
MAX_NESTING: Final = 240

#: Element types a table may have, with their little-endian numpy dtype.
_DTYPES: Final[dict[str, np.dtype[Any]]] = {"u8": np.dtype("<u1"), "i32le": np.dtype("<i4")}

# Fixed so that the same table always compresses to the same bytes (the digest covers them).
_ZLIB_LEVEL: Final = 9


def canonical_json(value: Any) -> bytes:
    """The canonical UTF-8 bytes of a JSON value: keys sorted by code point, no spaces, integers only.

    Raises `ValueError` for floats, NaN, or strings that cannot be UTF-8 (lone surrogates); the
    certificate format has none of these, so meeting one is a bug in the caller.
    """
    _reject_floats(value)
    return json_text(value).encode("utf-8")  # the one canonical encoder of both packages


def _reject_floats(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            raise ValueError("the certificate format has no floating-point numbers")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise CertificateUnreadable(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def _no_float(text: str) -> Any:
    raise CertificateUnreadable(
        f"a number with a fraction or exponent ({text}) appears; only integers are allowed"
    )


def _no_constant(text: str) -> Any:
    raise CertificateUnreadable(f"{text} is not JSON")


def parse_strict_json(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Parse `data` as one JSON value, refusing anything the certificate format does not allow.

    Refused: more than `max_bytes` bytes, invalid UTF-8, a byte-order mark, duplicate object keys,
    non-integer numbers, NaN/Infinity, trailing data, nesting deeper than `MAX_NESTING`, and any text that is
    not exactly the canonical encoding of what it parses to (followed by one newline).
    """
    if len(data) > max_bytes:
        raise CertificateUnreadable(
            f"the file is {len(data)} bytes, over the {max_bytes}-byte limit (raise it with --max-size)"
        )
    if not data:
        raise CertificateUnreadable("the file is empty")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise CertificateUnreadable(f"the file is not UTF-8 (byte {exc.start})") from None
    if text.startswith("\ufeff"):
        raise CertificateUnreadable("the file starts with a byte-order mark; certificates have none")
    try:
        value = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_float=_no_float, parse_constant=_no_constant
        )
    except json.JSONDecodeError as exc:
        raise CertificateUnreadable(
            f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg} (truncated or edited?)"
        ) from None
    except RecursionError:
        raise CertificateUnreadable("the JSON is nested too deeply to read") from None
    except ValueError as exc:  # for example an integer with more digits than Python will convert
        # Python's own message ends with advice for programmers (sys.set_int_max_str_digits): cut it.
        raise CertificateUnreadable(f"not readable JSON: {str(exc).partition('; use sys.')[0]}") from None
    _check_nesting(value)
    try:
        expected = canonical_json(value) + b"\n"
    except (ValueError, UnicodeEncodeError):
        raise CertificateUnreadable("the JSON holds a string that is not valid Unicode") from None
    except RecursionError:
        raise CertificateUnreadable("the JSON is nested too deeply to read") from None
    if expected != data:
        position = next(
            (i for i, (a, b) in enumerate(zip(expected, data, strict=False)) if a != b),
            min(len(expected), len(data)),
        )
        raise CertificateUnreadable(
            "the file is not in canonical form (sorted keys, no whitespace, one final newline); "
            f"first difference at byte {position}. Certificates must not be reformatted."
        )
    return value


def _check_nesting(value: Any) -> None:
    """Refuse a value nested deeper than `MAX_NESTING`."""
    if nesting_depth(value) > MAX_NESTING:
        raise CertificateUnreadable(
            f"the JSON is nested more than {MAX_NESTING} levels deep, the format's limit"
        )


def nesting_depth(value: Any) -> int:
    """How many arrays and objects deep `value` nests: 0 for a string or a number, 1 for `[]` or `[1]`, 2
    for `[[1]]` (walked without recursion). A certificate may nest at most `MAX_NESTING` levels; the writer
    and the reader both measure with this function."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def encode_table(values: npt.ArrayLike, dtype: str) -> str:
    """Encode a flat integer array: little-endian `dtype` elements, zlib level 9, standard base64."""
    array = np.ascontiguousarray(np.asarray(values), dtype=_DTYPES[dtype])
    raw = array.tobytes()
    return base64.b64encode(zlib.compress(raw, _ZLIB_LEVEL)).decode("ascii")


def decode_table(text: str, dtype: str, length: int, *, what: str) -> npt.NDArray[np.int64]:
    """Decode what `encode_table` wrote, requiring exactly `length` elements.

    Refuses non-canonical base64 (characters outside the alphabet, missing or extra padding,
    non-zero padding bits), a corrupt or truncated zlib stream, data after the stream, and a
    decompressed size other than `length` elements; decompression stops as soon as it would exceed
    that size, so a small file cannot expand into a large allocation.
    """
    element = _DTYPES[dtype]
    try:
        packed = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise CertificateUnreadable(f"{what}: not valid base64") from None
    if base64.b64encode(packed).decode("ascii") != text:
        raise CertificateUnreadable(f"{what}: base64 is not in canonical form")
    expected = length * element.itemsize
    stream = zlib.decompressobj()
    try:
        raw = stream.decompress(packed, expected + 1)
    except zlib.error as exc:
        raise CertificateUnreadable(f"{what}: compressed data is corrupt ({exc})") from None
    if len(raw) > expected:
        raise CertificateUnreadable(f"{what}: decompresses to more than the {length} elements declared")
    if not stream.eof:
        raise CertificateUnreadable(f"{what}: compressed data is truncated")
    if stream.unused_data:
        raise CertificateUnreadable(f"{what}: data after the end of the compressed stream")
    if len(raw) != expected:
        raise CertificateUnreadable(
            f"{what}: holds {len(raw) // element.itemsize} elements, the machine needs {length}"
        )
    decoded: npt.NDArray[np.int64] = np.frombuffer(raw, dtype=element).astype(np.int64)
    return decoded
