"""The direct record encoders write exactly the bytes of the generic pydantic path.

`encode_record` builds the bytes of the hot record kinds directly; the generic definition is
`canonical_json(as_json(record))`, pydantic's JSON serialization of the record. Any difference would change
stored bytes, digests and audit leaves, so every field, including free-form JSON values and awkward strings,
is checked against it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bide._canonical import canonical_json, json_text
from bide._messages import AssistantMessage, ToolCall, Usage
from bide._records import (
    Attempt,
    End,
    GateRecord,
    Header,
    ModelTurn,
    NotStarted,
    Pause,
    Start,
    ToolResult,
    as_json,
    decode_record,
    encode_new_turn,
    encode_record,
)

text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
ints = st.integers(min_value=-(2**70), max_value=2**70)
scalars = st.none() | st.booleans() | ints | st.floats() | text
keys = text | st.integers(min_value=-5, max_value=5)
values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(keys, inner, max_size=3)
    ),
    max_leaves=8,
)
arguments = st.dictionaries(text, values, max_size=4)


def generic(record: Any) -> bytes:
    return canonical_json(as_json(record))


def calls() -> st.SearchStrategy[list[ToolCall]]:
    call = st.builds(ToolCall, id=text, name=text, arguments=arguments | text, call_id=text)
    return st.lists(call, max_size=3)


records = st.one_of(
    st.builds(Header, key=text, format=text),
    st.builds(Start, key=text, entry=text, input=text),
    st.builds(
        ModelTurn,
        key=text,
        turn=ints,
        model=text,
        message=st.builds(
            AssistantMessage,
            content=text,
            tool_calls=calls(),
            usage=st.none() | st.builds(Usage, input_tokens=ints, output_tokens=ints),
            finish_reason=text,
        ),
    ),
    st.builds(
        Attempt,
        key=text,
        call_id=text,
        tool=text,
        arguments=arguments,
        gen=ints,
        claim=text,
        attempted_at_ms=ints,
        deadline_ms=ints,
        by=st.sampled_from(["driver", "resolver"]),
    ),
    st.builds(
        ToolResult,
        key=text,
        call_id=text,
        tool=text,
        result=values,
        is_error=st.booleans(),
        safety=text,
        idempotency_key=st.none() | text,
        approval=values,
        reconciled=st.booleans(),
        evidence=values,
    ),
    st.builds(End, key=text, answer=text),
)


@settings(max_examples=400, deadline=None)
@given(records)
def test_direct_encoding_is_byte_identical_to_the_generic_path(record: Any) -> None:
    assert encode_record(record) == generic(record)


@settings(max_examples=100, deadline=None)
@given(records)
def test_directly_encoded_records_decode_to_themselves(record: Any) -> None:
    data = encode_record(record)
    back = decode_record(record.key, data)
    assert encode_record(back) == data
    assert json.loads(data)["kind"] == record.kind


turns = st.builds(
    ModelTurn,
    key=text,
    turn=ints,
    model=text,
    message=st.builds(
        AssistantMessage,
        content=text | st.just("lone \ud800"),
        tool_calls=calls(),
        finish_reason=text,
    ),
)


def journalable(turn: ModelTurn) -> bool:
    """The plain definition: everything the model wrote has a JSON form (json_text refuses NaN, infinities,
    foreign values and cycles; UTF-8 refuses lone surrogates)."""
    m = turn.message
    try:
        json_text([m.content, m.finish_reason, [[c.id, c.name, c.arguments] for c in m.tool_calls]]).encode()
    except (UnicodeError, ValueError, TypeError, RecursionError):
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(turns)
def test_a_new_turn_is_refused_exactly_when_it_has_no_json_form(turn: ModelTurn) -> None:
    """`encode_new_turn` checks a fresh turn by encoding it: it refuses what has no JSON form, and otherwise
    answers (and hands the journal's write) the bytes of the generic path."""
    if not journalable(turn):
        with pytest.raises((UnicodeError, ValueError, TypeError, RecursionError)):
            encode_new_turn(turn)
        return
    data = encode_new_turn(turn)
    assert data == generic(turn)
    assert encode_record(turn) is data  # the write that follows reuses the bytes


def test_odd_values_take_the_same_path() -> None:
    odd = [float("nan"), float("inf"), {1, 2}, (1, "é"), {3: "x", "a\u2028": ["\x00", '"\\']}, b"bytes"]
    for value in odd:
        rec = ToolResult(key="result:c0.0", call_id="c0.0", tool="t", safety="side_effect", result=value)
        assert encode_record(rec) == generic(rec)
        att = Attempt(
            key="attempt:c0.0:0",
            call_id="c0.0",
            tool="t",
            arguments={"v": value},
            gen=0,
            claim="x",
            attempted_at_ms=1,
            deadline_ms=2,
        )
        assert encode_record(att) == generic(att)


def test_subclassed_messages_and_other_kinds_use_the_generic_path() -> None:
    class Loud(AssistantMessage):
        volume: int = 11

    class Tagged(ToolCall):
        tag: str = "x"

    rec = ModelTurn(key="model:0", turn=0, message=Loud(content="hi"))
    assert encode_record(rec) == generic(rec)
    call = Tagged(id="1", name="n", arguments={"a": 1}, call_id="c0.0")
    rec = ModelTurn(key="model:0", turn=0, message=AssistantMessage(tool_calls=[call]))
    assert encode_record(rec) == generic(rec)
    for other in (
        NotStarted(key="not-started:c:0", call_id="c", gen=0, claim="x", reason="r"),
        Pause(key="pause:c", call_id="c", tool="t", reason="r"),
        GateRecord(key="approval:x", data={"a": [1, 2.5, None]}),
    ):
        assert encode_record(other) == generic(other)


def test_salts_are_never_handed_out_twice_across_threads_and_forks() -> None:
    import os
    import threading

    from bide._canonical import new_salt

    new_salt()  # the parent holds a block of random bytes now
    seen: list[str] = [new_salt() for _ in range(300)]
    lock = threading.Lock()

    def draw() -> None:
        mine = [new_salt() for _ in range(300)]
        with lock:
            seen.extend(mine)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the salts it would use
        os.write(write, "\n".join(new_salt() for _ in range(10)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        child = f.read().split("\n")
    seen.extend(new_salt() for _ in range(10))
    seen.extend(child)
    assert len(seen) == len(set(seen)) == 300 + 4 * 300 + 20


def test_model_turns_written_before_usage_existed_still_read() -> None:
    old = (
        b'{"key":"model:0","kind":"model_turn","message":{"content":"hi","role":"assistant","tool_calls":[]},'
        b'"model":"m","salt":"s","turn":0}'
    )
    rec = decode_record("model:0", old)
    assert isinstance(rec, ModelTurn)
    assert rec.message.usage is None and rec.message.finish_reason == ""
    new = ModelTurn(
        key="model:0",
        turn=0,
        message=AssistantMessage(
            content="hi", usage=Usage(input_tokens=3, output_tokens=4), finish_reason="stop"
        ),
    )
    back = decode_record("model:0", encode_record(new))
    assert isinstance(back, ModelTurn)
    assert (
        back.message.usage == Usage(input_tokens=3, output_tokens=4) and back.message.finish_reason == "stop"
    )


@settings(max_examples=150, deadline=None)
@given(values)
def test_a_tool_result_checked_once_is_journaled_and_shown_as_the_generic_path_writes_it(value: Any) -> None:
    """A tool's result is encoded once when it is checked (`journal_safe`); its result record and the
    model's tool message reuse that text, which must be what the generic path writes."""
    import asyncio

    import bide
    from bide.testing import ScriptedModel, call, reply

    @bide.tool  # a side effect: its result is checked in the drive, then journaled
    def give() -> Any:
        """Return the value."""
        return value

    model = ScriptedModel([call("give"), reply("done")])
    store = bide.open_store("memory://")
    asyncio.run(bide.Agent(model, store=store, tools=[give]).run("r", "go"))
    result = next(decode_record(e.key, e.data) for e in store.load("r") if e.key.startswith("result:"))
    assert isinstance(result, ToolResult)
    assert encode_record(result) == generic(result)
    stored = next(e.data for e in store.load("r") if e.key.startswith("result:"))
    assert stored == generic(result)
    shown = model.requests[1].messages[-1].content
    expected = result.result if isinstance(result.result, str) else canonical_json(result.result).decode()
    assert shown == expected
