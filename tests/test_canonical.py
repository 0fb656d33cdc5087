"""One canonical JSON encoder serves both packages (bide/_canonical.py), its bytes did not change, and they
are exactly RFC 8785 (JCS) inside the domain the module docstring states."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bide._canonical import canonical_json as bide_canonical
from bide._canonical import json_text
from govern.certificate._certificate import check_certificate
from govern.certificate._encoding import canonical_json as certificate_canonical
from govern.model._expr import canonical_json as rules_canonical
from govern.runtime._eventlog import _LEAF_TAG, LoggedEvent

ROOT = Path(__file__).resolve().parents[1]
SAFE_INT = 2**53 - 1


def _before(value: Any) -> bytes:
    """The encoding every copy used before they were merged (the format's definition in docs)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode()


def _jcs_string(text: str) -> str:
    # RFC 8785 section 3.2.2.2: ECMAScript JSON.stringify string serialization.
    named = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}
    out = []
    for ch in text:
        if ch in named:
            out.append(named[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be")


def jcs(value: Any) -> str:
    """An independent RFC 8785 encoder for values without floats (integers within the safe range)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        assert -SAFE_INT <= value <= SAFE_INT
        return str(value)  # ECMAScript Number-to-String of a safe integer is its plain decimal
    if isinstance(value, str):
        return _jcs_string(value)
    if isinstance(value, list):
        return "[" + ",".join(jcs(v) for v in value) + "]"
    assert isinstance(value, dict)
    members = sorted(value.items(), key=lambda kv: _utf16(kv[0]))  # sorted by UTF-16 code units
    return "{" + ",".join(_jcs_string(k) + ":" + jcs(v) for k, v in members) + "}"


# Text without lone surrogates; keys also without U+E000..U+FFFF (the one place code point and UTF-16
# orders differ is an astral character against one of those).
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_KEYS = st.text(
    st.characters(blacklist_categories=("Cs",)).filter(lambda c: not 0xE000 <= ord(c) <= 0xFFFF), max_size=6
)
JCS_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-SAFE_INT, SAFE_INT) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)
ANY_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JCS_VALUES)
def test_inside_the_stated_domain_the_bytes_are_rfc_8785(value: Any) -> None:
    expected = jcs(value).encode("utf-8")
    assert bide_canonical(value) == expected
    assert certificate_canonical(value) == expected
    assert rules_canonical(value) == expected


@settings(max_examples=300, deadline=None)
@given(ANY_VALUES)
def test_the_bytes_did_not_change(value: Any) -> None:
    assert bide_canonical(value) == _before(value) == rules_canonical(value)


def test_a_pinned_value_keeps_its_bytes() -> None:
    value = {"z": [1, -2, 2**64], "a": "caf\u00e9 \u2028 \x01\n\"\\", "\U0001f600": None, "b": True}
    pinned = (
        b'{"a":"caf\xc3\xa9 \xe2\x80\xa8 \\u0001\\n\\"\\\\","b":true,'
        b'"z":[1,-2,18446744073709551616],"\xf0\x9f\x98\x80":null}'
    )
    assert bide_canonical(value) == pinned == rules_canonical(value)
    assert json_text(value).encode() == pinned


def test_event_leaves_use_the_same_encoder() -> None:
    event = LoggedEvent(
        id="e\u00e9", machine="a" * 64, record="r", event="pay", producer="p", producer_seq=0, log="main",
        position=3, record_seq=0, after=(1, 2),
    )
    assert event.leaf() == _LEAF_TAG + _before(event.model_dump(mode="json"))


def test_committed_certificates_keep_their_bytes_and_verify() -> None:
    files = sorted((ROOT / "certs").glob("*.govern-cert.json"))
    assert files
    for path in files:
        data = path.read_bytes()
        assert certificate_canonical(json.loads(data)) + b"\n" == data, path.name
        check_certificate(data)
