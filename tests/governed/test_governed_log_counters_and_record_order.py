"""A log edited by hand in ways the earlier checks let through: a PostgreSQL counter ahead of the events
(a counter edited up, or the events restored from an earlier snapshot than the counters), which had the
next append number its event past a gap that stopped every replica forever; and rows of one record swapped,
which `read_record` returned out of log order (and `event_tool` folded into a wrong state)."""

from __future__ import annotations

import pytest

from govern.runtime._agents import _consequence, _FoldedRecords
from govern.runtime._eventlog import Event, EventLog, LogCorrupted, LoggedEvent
from govern.runtime._replica import Replica
from govern.runtime._rules import delivery_rules

from .conftest import POSTGRES_URL
from .machines import order_log, order_machine
from .test_governed_hostile_log import edit, filled, new_event

# -- a PostgreSQL counter ahead of the events ---------------------------------------------------------------

_COUNTER_UP = 'UPDATE govern_counters SET "next" = "next" + 3 WHERE "log" = :log AND "kind" = :kind'
# An earlier snapshot of the events and the log's row, beside the counters' newer values: the last event
# (number 3 of record o1, of producer p) is gone, the counters still give 4.
_EVENTS_RESTORED_EARLIER = (
    'WITH gone AS (DELETE FROM govern_events WHERE "log" = :log AND "position" = 3) '
    'UPDATE govern_logs SET "length" = 3 WHERE "name" = :log'
)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("sql", "kind", "message"),
    [
        (_COUNTER_UP, "r", "record 'o1' gives 7 as its next number, but no event of it is numbered 6"),
        (_COUNTER_UP, "p", "producer 'p' gives 7 as its next number, but no event of it is numbered 6"),
        (_EVENTS_RESTORED_EARLIER, None, "gives 4 as its next number, but no event of it is numbered 3"),
    ],
    ids=["record-counter-up", "producer-counter-up", "events-restored-earlier"],
)
@pytest.mark.parametrize("batch", [1, 20], ids=["one", "copied"])
def test_a_postgresql_counter_ahead_of_its_events_is_a_corrupted_log(
    log_name: str, sql: str, kind: str | None, message: str, batch: int
) -> None:
    """The append was accepted with a record_seq (producer_seq) that skipped a number: read_record then
    refused the record, and every replica stopped at that event forever. It is refused as a corrupted log,
    nothing is written, and the log reads and folds as before."""
    filled(POSTGRES_URL, log_name).close()
    edit(POSTGRES_URL, sql, log=log_name, kind=kind)
    log = order_log(POSTGRES_URL, name=log_name)
    try:
        length = log.length()
        events = [new_event(f"new{i}") for i in range(batch)]
        with pytest.raises(LogCorrupted, match="the log's counters are ahead of its events") as refused:
            log.append_many(events)
        assert message in str(refused.value) and "restore the log from a backup" in str(refused.value)
        assert "again is safe" not in str(refused.value)
        assert all(log.get(e.id) is None for e in events) and log.length() == length
        assert [e.record_seq for e in log.read_record("o1")] == list(range(length))
        replica = Replica(order_machine(), log)
        assert replica.sync() == length
    finally:
        log.close()


@pytest.mark.postgres
def test_a_postgresql_counter_row_deleted_is_rebuilt_from_the_events(log_name: str) -> None:
    """A key without a counter row numbers on from its highest stored number: nothing there to be ahead."""
    filled(POSTGRES_URL, log_name).close()
    edit(POSTGRES_URL, 'DELETE FROM govern_counters WHERE "log" = :log', log=log_name)
    log = order_log(POSTGRES_URL, name=log_name)
    try:
        appended = log.append(new_event()).event
        assert (appended.position, appended.record_seq, appended.producer_seq) == (4, 4, 4)
        assert Replica(order_machine(), log).sync() == 5
    finally:
        log.close()


@pytest.mark.postgres
def test_a_counter_rebuilt_after_its_row_was_deleted_stands_past_every_stored_number(log_name: str) -> None:
    """The producer's counter row deleted by hand, then an event numbered by the producer below its highest:
    the counter was rebuilt from that number alone (6, with 10 stored), and the auto-numbered appends after
    it ran into 10, refused as a corrupted log. It stands past every stored number, as on SQLite."""
    log = order_log(POSTGRES_URL, name=log_name)
    digest = order_machine().digest
    try:
        log.append(Event(id="a", machine=digest, record="o1", event="restock", producer="p", producer_seq=0))
        log.append(Event(id="b", machine=digest, record="o1", event="pay", producer="p", producer_seq=10))
        edit(POSTGRES_URL, 'DELETE FROM govern_counters WHERE "log" = :log', log=log_name)
        log.append(Event(id="c", machine=digest, record="o1", event="restock", producer="p", producer_seq=5))
        appended = [log.append(new_event(f"n{i}")).event for i in range(6)]
        assert [e.producer_seq for e in appended] == [11, 12, 13, 14, 15, 16]
        assert [e.record_seq for e in log.read_record("o1")] == list(range(9))
    finally:
        log.close()


def test_producer_numbers_given_past_a_gap_are_not_a_counter_ahead(any_log_url: str, log_name: str) -> None:
    """A producer may number its own events with gaps: the counter then stands one past the highest number
    given, which an event holds, and the next appends go on from it."""
    log = order_log(any_log_url, name=log_name)
    digest = order_machine().digest
    try:
        log.append(Event(id="a", machine=digest, record="o1", event="restock", producer="p", producer_seq=10))
        log.append(Event(id="b", machine=digest, record="o1", event="pay", producer="p", producer_seq=3))
        log.append_many([new_event("c"), new_event("d")])
        assert [(e.id, e.producer_seq, e.record_seq) for e in log.read()] == [
            ("a", 10, 0),
            ("b", 3, 1),
            ("c", 11, 2),
            ("d", 12, 3),
        ]
    finally:
        log.close()


# -- rows of one record swapped by hand ----------------------------------------------------------------------

_MOVE = 'UPDATE govern_events SET "position" = {to} WHERE "log" = :log AND "position" = {at}'


def _swapped_log(url: str, log_name: str) -> EventLog:
    """`filled`'s log (record o1, numbers 0 to 3 at positions 0 to 3) with the events at positions 1 and 2
    swapped behind govern's back: number 1 at position 2, number 2 at position 1."""
    if url == "memory://":  # (no one edits a memory log: its record index is changed in its place)
        log = filled(url, log_name)
        history = log._backend.mem.by_record["o1"]  # type: ignore[attr-defined]
        for seq, position in ((1, 2), (2, 1)):
            history[seq] = LoggedEvent(**{**history[seq].model_dump(), "position": position})
        return log
    filled(url, log_name).close()
    for to, at in ((-1, 1), (1, 2), (2, -1)):
        edit(url, _MOVE.format(to=to, at=at), log=log_name)
    return order_log(url, name=log_name)


@pytest.mark.parametrize("url", ["memory://", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_read_record_refuses_a_record_whose_numbers_do_not_rise_with_its_positions(
    url: str, log_name: str, tmp_path: object
) -> None:
    """It sorted the record's events by number and checked only that the numbers had no gaps: the events
    came back out of log order, without an error."""
    url = {"sqlite": f"sqlite:///{tmp_path}/events.db", "postgres": POSTGRES_URL}.get(url, url)
    log = _swapped_log(url, log_name)
    expected = r"record 'o1' of log '.*' holds its event number 2 at position 1, before its event number 1 "
    expected += r"\(at position 2\); .*restore it from a backup"
    try:
        for through in (None, 2, 3):
            with pytest.raises(LogCorrupted, match=expected):
                log.read_record("o1", through=through)
        assert [e.id for e in log.read_record("o1", through=0)] == ["e0"]
    finally:
        log.close()


def test_event_tool_reports_no_state_for_a_record_swapped_by_hand(tmp_path: object, log_name: str) -> None:
    """`event_tool` folds the record's history to tell an event's effect: it folded the swapped events in
    number order, a history the log does not hold. It now reports the event recorded, its effect unknown."""
    log = _swapped_log(f"sqlite:///{tmp_path}/events.db", log_name)
    try:
        last = log.read()[3]
        reported = _consequence(delivery_rules(order_machine()), log, last, False, _FoldedRecords())
        assert reported["outcome"] == "recorded" and reported["state"] is None
        assert "holds its event number 2 at position 1" in reported["why"]
    finally:
        log.close()
