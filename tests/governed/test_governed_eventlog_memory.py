"""The memory log's shortcuts keep the log's contract: `Event(...)` of plain fields is the event pydantic
validates (and anything else is judged by pydantic, with the same refusal), stored events share one
fields set without sharing changes to it, and the log's length and records read back exactly."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from govern.runtime._eventlog import Event, EventConflict, EventLog, InvalidInput, _invalid

DIGEST = "c" * 64
EVENTS = ("pay", "ship")
BASE: dict[str, Any] = {"id": "e1", "machine": DIGEST, "record": "r1", "event": "pay", "producer": "p"}


class _Text(str):
    """A str subclass: valid, but not the plain kind the shortcut takes."""


def _by_pydantic(data: dict[str, Any]) -> Event | InvalidInput:
    """What pydantic's own validation makes of `data` (bypassing `Event.__init__`), or its refusal as
    `Event(...)` reports it."""
    event = Event.__new__(Event)
    try:
        BaseModel.__init__(event, **data)
    except ValidationError as exc:
        return _invalid(exc, "Event")
    return event


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"deps": ()},
        {"deps": ("d1", "d2")},
        {"deps": ["d1", "d2"]},
        {"producer_seq": None},
        {"producer_seq": 0},
        {"producer_seq": 2**63 - 2},
        {"producer_seq": 5, "deps": ["d1"]},
        {"id": "x" * 200, "record": "order-7", "producer": "agent-12"},
        {"record": "commande-é"},  # not ASCII: pydantic judges it (valid)
        {"record": _Text("r2")},  # a str subclass: pydantic judges it (valid, stored as a plain str)
        {"deps": ("d1", "d1")},
        {"deps": "d1"},
        {"deps": ("",)},
        {"deps": ("d\x00",)},
        {"id": ""},
        {"id": "x" * 201},
        {"record": "r\x00"},
        {"record": "\ud800"},
        {"producer": 7},
        {"event": None},
        {"machine": "C" * 64},
        {"machine": "c" * 63},
        {"producer_seq": -1},
        {"producer_seq": 2**63 - 1},
        {"producer_seq": True},
        {"producer_seq": 1.0},
        {"producer_seq": "3"},
        {"extra": 1},
        {"log": "main"},
    ],
)
def test_event_is_what_pydantic_validates(changes: dict[str, Any]) -> None:
    data = BASE | changes
    expected = _by_pydantic(dict(data))
    if isinstance(expected, InvalidInput):
        with pytest.raises(InvalidInput) as refused:
            Event(**data)
        assert (refused.value.field, str(refused.value)) == (expected.field, str(expected))
        return
    event = Event(**data)
    assert event == expected and hash(event) == hash(expected) and repr(event) == repr(expected)
    assert event.__dict__ == expected.__dict__
    assert [type(v) for v in event.__dict__.values()] == [type(v) for v in expected.__dict__.values()]
    assert event.model_fields_set == expected.model_fields_set
    assert event.model_dump(exclude_unset=True) == expected.model_dump(exclude_unset=True)


def test_a_missing_field_is_refused_by_name() -> None:
    data = {k: v for k, v in BASE.items() if k != "record"}
    with pytest.raises(InvalidInput) as refused:
        Event(**data)
    assert refused.value.field == "record"


def _log() -> EventLog:
    log = EventLog("memory://")
    log.bind(DIGEST, events=EVENTS)
    return log


def test_stored_events_share_no_change_to_their_fields_set() -> None:
    log = _log()
    first = log.append(Event(**BASE)).event
    second = log.append(Event(**(BASE | {"id": "e2"}))).event
    copied = first.model_copy(update={"record": "r9"})
    copied.model_fields_set.add("anything")
    assert "anything" not in second.model_fields_set and "anything" not in first.model_fields_set
    assert copied.record == "r9" and first.record == "r1"


def test_memory_log_length_and_records_read_back_exactly() -> None:
    log = _log()
    assert log.length() == 0 and log.machine() == DIGEST and log.events() == EVENTS
    a = log.append(Event(**BASE)).event
    b = log.append(Event(**(BASE | {"id": "e2", "record": "r2", "deps": ["e1"]}))).event
    c = log.append(Event(**(BASE | {"id": "e3", "event": "ship"}))).event
    assert log.length() == 3 and [e.position for e in log.read()] == [0, 1, 2]
    assert b.after == (0,) and c.record_seq == 1 and c.producer_seq == 2
    assert log.read_record("r1") == [a, c]
    assert log.read_record("r1", through=1) == [a]
    assert log.read_record("r1", through=2) == [a, c]
    assert log.read_record("nothing") == []
    assert log.last_by_producer("p") == c
    # A refused append changes nothing, the length included.
    with pytest.raises(EventConflict):
        log.append(Event(**(BASE | {"event": "ship"})))
    assert log.length() == 3 and log.read() == [a, b, c]
    assert log.append(Event(**BASE)).created is False and log.length() == 3
