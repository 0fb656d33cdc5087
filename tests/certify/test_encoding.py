"""Canonical JSON, strict reading and the compact table encoding."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from govern.certificate._encoding import canonical_json, decode_table, encode_table, parse_strict_json
from govern.certificate._errors import CertificateUnreadable

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_canonical_encoding_round_trips_and_is_unique(value: Any) -> None:
    data = canonical_json(value) + b"\n"
    assert parse_strict_json(data) == value
    # Any other spelling of the same value (indentation, key order, ASCII escapes) is refused.
    for other in (json.dumps(value, indent=1), json.dumps(value, ensure_ascii=True, sort_keys=True),
                  json.dumps(value, separators=(", ", ": "), sort_keys=True)):
        spelled = other.encode() + b"\n"
        if spelled != data:
            with pytest.raises(CertificateUnreadable):
                parse_strict_json(spelled)


def test_canonical_json_is_sorted_compact_utf8() -> None:
    assert canonical_json({"b": [1, "é"], "a": None}) == '{"a":null,"b":[1,"é"]}'.encode()
    with pytest.raises(ValueError):
        canonical_json({"x": 1.5})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"a":1,"a":2}\n', "duplicate key"),
        (b'{"a":1.0}\n', "only integers"),
        (b'{"a":1e3}\n', "only integers"),
        (b'{"a":NaN}\n', "not JSON"),
        (b'{"a":1}', "canonical"),
        (b'{"a":1}\n\n', "canonical"),
        (b' {"a":1}\n', "canonical"),
        (b'{"a":-0}\n', "canonical"),
        (b'{"a":1', "not valid JSON"),
        (b"", "empty"),
        (b'\xef\xbb\xbf{"a":1}\n', "byte-order mark"),
        (b'{"a":"\xff"}\n', "not UTF-8"),
        (b'{"a":"\\ud800"}\n', "not valid Unicode"),
        (b"[" * 100000 + b"]" * 100000 + b"\n", "nested too deeply"),
        (b'{"a":' + b"9" * 5000 + b"}\n", r"not readable JSON: .*5000 digits$"),  # no Python advice
    ],
)
def test_strict_reader_refuses(data: bytes, message: str) -> None:
    with pytest.raises(CertificateUnreadable, match=message):
        parse_strict_json(data)


def test_size_cap_is_enforced_before_parsing() -> None:
    data = canonical_json({"a": "x" * 1000}) + b"\n"
    assert parse_strict_json(data, max_bytes=len(data))
    with pytest.raises(CertificateUnreadable, match="over the 1000-byte limit"):
        parse_strict_json(data, max_bytes=1000)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=300))
def test_int32_tables_round_trip(values: list[int]) -> None:
    text = encode_table(values, "i32le")
    assert decode_table(text, "i32le", len(values), what="t").tolist() == values
    assert encode_table(np.array(values), "i32le") == text  # deterministic


def test_table_layout_is_little_endian_int32_zlib_base64() -> None:
    text = encode_table([1, -2, 258], "i32le")
    raw = zlib.decompress(base64.b64decode(text))
    assert raw == b"".join(v.to_bytes(4, "little", signed=True) for v in (1, -2, 258))
    assert zlib.decompress(base64.b64decode(encode_table([0, 1, 1], "u8"))) == b"\x00\x01\x01"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not base64!", "not valid base64"),
        (_b64(zlib.compress(b"\x00" * 12))[:-4], "base64|truncated|corrupt"),
        (_b64(zlib.compress(b"\x00" * 12) + b"\x00\x00\x00"), "after the end"),
        (_b64(zlib.compress(b"\x00" * 8)), "holds 2 elements"),
        (_b64(zlib.compress(b"\x00" * 16)), "more than the 3 elements"),
        (_b64(b"\x00\x01garbage-not-zlib"), "corrupt"),
        (_b64(zlib.compress(b"\x00" * 12)[:-3]), "truncated|corrupt"),
        (_b64(zlib.compress(b"\x00" * 12)).rstrip("=") + "", "base64"),
    ],
)
def test_table_decoder_refuses(text: str, message: str) -> None:
    with pytest.raises(CertificateUnreadable, match=message):
        decode_table(text, "i32le", 3, what="tables.repair")


def test_table_decoder_refuses_non_canonical_base64() -> None:
    text = _b64(zlib.compress(b"\x00" * 12))
    # Find a sibling spelling with non-zero padding bits that decodes to the same bytes.
    if text.endswith("="):
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        stem = text.rstrip("=")
        pad = text[len(stem):]
        index = alphabet.index(stem[-1])
        sibling = stem[:-1] + alphabet[index + 1] + pad
        assert base64.b64decode(sibling) == base64.b64decode(text)
        with pytest.raises(CertificateUnreadable, match="canonical"):
            decode_table(sibling, "i32le", 3, what="t")


def test_decompression_bomb_is_cut_off() -> None:
    bomb = _b64(zlib.compress(b"\x00" * 50_000_000, 9))
    assert len(bomb) < 100_000
    with pytest.raises(CertificateUnreadable, match="more than the 3 elements"):
        decode_table(bomb, "i32le", 3, what="t")
