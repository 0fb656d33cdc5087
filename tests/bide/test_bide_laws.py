"""Property tests: canonical encoding laws, record round trips, and the store against a dict model."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import bide

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_canonical_json_is_a_fixed_point(value: Any) -> None:
    data = bide.canonical_json(value)
    assert bide.canonical_json(json.loads(data)) == data
    assert data.decode("utf-8")  # valid UTF-8
    assert b"\n" not in data or "\n" in json.dumps(value)  # no whitespace added (only inside strings)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=6), json_values, max_size=6), st.randoms())
def test_canonical_json_ignores_key_order(obj: dict[str, Any], rnd: Any) -> None:
    items = list(obj.items())
    rnd.shuffle(items)
    assert bide.canonical_json(dict(items)) == bide.canonical_json(obj)


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=20), json_values, st.booleans())
def test_records_round_trip(call_id: str, result: Any, is_error: bool) -> None:
    rec = bide.ToolResult(
        key=f"result:{call_id}",
        call_id=call_id,
        tool="t",
        result=result,
        is_error=is_error,
        safety="read_only",
    )
    data = bide.encode_record(rec)
    back = bide.decode_record(rec.key, data)
    assert back == rec and bide.encode_record(back) == data
    other = bide.ToolResult(
        key=rec.key, call_id=call_id, tool="t", result=result, is_error=is_error, safety="read_only"
    )
    assert bide.encode_record(other) != data  # fresh salt: equal records, different bytes


ops = st.lists(
    st.tuples(
        st.lists(
            st.tuples(st.sampled_from("abcdef"), st.binary(max_size=8)),
            min_size=1,
            max_size=3,
            unique_by=lambda t: t[0],
        ),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)


def check_against_model(
    store: bide.Store, run_id: str, program: list[tuple[list[tuple[str, bytes]], bool]]
) -> None:
    model: dict[str, bytes] = {}
    order: list[str] = []
    for items, exclusive in program:
        out = store.insert_many(run_id, items, exclusive=exclusive)
        if exclusive and any(k in model for k, _ in items):
            assert {e.key for e in out} == {k for k, _ in items if k in model}
            assert all(not e.inserted and e.data == model[e.key] for e in out)
            continue
        for (key, data), entry in zip(items, out, strict=True):
            fresh = key not in model
            if fresh:
                model[key] = data
                order.append(key)
            assert entry.data == model[key]
            assert entry.inserted == fresh
    loaded = store.load(run_id)
    assert [e.key for e in loaded] == order
    assert {e.key: e.data for e in loaded} == model


@settings(max_examples=60, deadline=None)
@given(ops)
def test_memory_store_matches_model(program: list[tuple[list[tuple[str, bytes]], bool]]) -> None:
    check_against_model(bide.open_store("memory://"), "run", program)


def test_sqlite_store_matches_model(tmp_path: Path) -> None:
    store = bide.open_store(f"sqlite:///{tmp_path / 'laws.db'}")

    @settings(max_examples=40, deadline=None)
    @given(ops)
    def check(program: list[tuple[list[tuple[str, bytes]], bool]]) -> None:
        check_against_model(store, uuid.uuid4().hex, program)

    try:
        check()
    finally:
        store.close()
