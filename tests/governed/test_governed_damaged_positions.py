"""A log whose positions an edit damaged at their ends (a row put below 0 or past the end with a gap, the
first event or the one before the last deleted, PostgreSQL's length edited): every append refuses it with
`LogCorrupted` and writes nothing, and its readers report it. Before, appends went on writing after the
damage: past a row at -1 (which no reader saw), or after a gap, at positions every read stopped before."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from govern.runtime._eventlog import Event, EventLog, LogCorrupted
from govern.runtime._replica import Replica

from .conftest import POSTGRES_URL
from .machines import order_log, order_machine
from .test_governed_hostile_log import edit, filled, new_event

_ROW = (
    'INSERT INTO govern_events ("log", "position", "event_id", "machine", "record", "record_seq", "event", '
    '"producer", "producer_seq", "deps", "after", "writer") '
    "VALUES (:log, {position}, 'edited', :machine, 'o9', 0, 'pay', 'q', 0, '[]', '[]', NULL)"
)
_DELETE = 'DELETE FROM govern_events WHERE "log" = :log AND "position" = {position}'

# (edit, how the refusal names the damage); the log holds positions 0 to 3 before the edit (`filled`).
DAMAGE = {
    "row-below-zero": (_ROW.format(position=-1), "it holds an event at position -1, below 0"),
    "row-past-the-end": (_ROW.format(position=10), "it holds an event at position 10"),  # (how: below)
    "first-deleted": (
        _DELETE.format(position=0),
        "it holds no event at position 0 (its first is at position 1)",
    ),
    "before-last-deleted": (_DELETE.format(position=2), "it holds an event at position 3 but none at 2"),
}
# SQLite keeps a number that is no integer in an integer column, PostgreSQL rounds it. (One past the last
# position is the log's length, which `_head_of` refuses already: "its length reads as 4.5".)
SQLITE_DAMAGE = {
    "row-below-zero": (_ROW.format(position=-0.5), "it holds an event at position -0.5, not an integer"),
}
# PostgreSQL keeps the log's length in its row: an edited one, or a last event deleted, shows beside it.
POSTGRES_DAMAGE = {
    "length-raised": (
        'UPDATE govern_logs SET "length" = 6 WHERE "name" = :log',
        "its length is 6, but its last event is at position 3",
    ),
    "last-deleted": (_DELETE.format(position=3), "its length is 4, but its last event is at position 2"),
}


def _rows(url: str, log: str) -> list[tuple[Any, ...]]:
    """Every row of the log's events, as the database holds them (read behind govern's back)."""
    sql = 'SELECT * FROM govern_events WHERE "log" = :log ORDER BY "event_id"'
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as raw:
            return list(raw.execute(sql, {"log": log}))
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), {"log": log})]
    finally:
        engine.dispose()


def _appends(log: EventLog) -> dict[str, Callable[[], object]]:
    digest = order_machine().digest
    return {
        "one": lambda: log.append(new_event()),
        "one-depending": lambda: log.append(new_event(deps=("e3",))),
        "again": lambda: log.append(
            Event(id="e0", machine=digest, record="o1", event="restock", producer="p")
        ),
        "batch": lambda: log.append_many([new_event(), new_event("b")]),
        "copied-batch": lambda: log.append_many(  # PostgreSQL: written with COPY, outside a pipeline
            [
                Event(id=f"c{i}", machine=digest, record=f"r{i}", event="restock", producer="q")
                for i in range(20)
            ]
        ),
    }


def _check_refused(url: str, name: str, sql: str, message: str) -> None:
    filled(url, name).close()
    edit(url, sql, log=name, machine=order_machine().digest)
    before = _rows(url, name)
    expected = rf"log '{name}' is damaged: {re.escape(message)}.*restore the log from a backup"
    log = order_log(url, name=name)
    try:
        for what, append in _appends(log).items():
            with pytest.raises(LogCorrupted, match=expected):
                append()
            assert _rows(url, name) == before, what
        for use in (log.length, log.machine, lambda: log.bind(order_machine())):
            with pytest.raises(LogCorrupted, match=expected):
                use()
        for read in (log.read, lambda: Replica(order_machine(), log).sync()):
            with pytest.raises(LogCorrupted):  # (the damage, or the gap or row a read meets first)
                read()
    finally:
        log.close()
    assert _rows(url, name) == before


@pytest.mark.parametrize(("sql", "message"), DAMAGE.values(), ids=DAMAGE.keys())
def test_an_append_refuses_a_log_damaged_at_the_ends_of_its_positions(
    log_url: str, log_name: str, sql: str, message: str
) -> None:
    _check_refused(log_url, log_name, sql, message)


@pytest.mark.parametrize(("sql", "message"), SQLITE_DAMAGE.values(), ids=SQLITE_DAMAGE.keys())
def test_an_append_refuses_an_sqlite_position_edited_to_no_integer(
    tmp_path: Path, sql: str, message: str
) -> None:
    _check_refused(f"sqlite:///{tmp_path}/events.db", "main", sql, message)


@pytest.mark.postgres
@pytest.mark.parametrize(("sql", "message"), POSTGRES_DAMAGE.values(), ids=POSTGRES_DAMAGE.keys())
def test_an_append_refuses_a_postgresql_length_apart_from_the_events(
    log_name: str, sql: str, message: str
) -> None:
    _check_refused(POSTGRES_URL, log_name, sql, message)


def test_the_row_past_the_end_is_named_as_each_database_sees_it(log_url: str, log_name: str) -> None:
    """SQLite derives the length from the last position (so the row is the last, after a gap); PostgreSQL
    keeps the length, which the row is past."""
    filled(log_url, log_name).close()
    edit(log_url, _ROW.format(position=10), log=log_name, machine=order_machine().digest)
    log = EventLog(log_url, name=log_name)
    try:
        sqlite = log_url.startswith("sqlite")
        with pytest.raises(LogCorrupted) as refused:
            log.length()
        shown = "at position 10 but none at 9" if sqlite else "at position 10, past its end (its length is 4)"
        assert shown in str(refused.value)
    finally:
        log.close()


@pytest.mark.parametrize(
    ("length", "first", "second", "last", "problem"),
    [
        (0, None, None, None, None),
        (0, None, None, -1, None),  # (SQLite gives the last as length - 1)
        (1, 0, None, 0, None),
        (2, 0, 0, 1, None),
        (5, 0, 3, 4, None),
        (1, None, None, None, "its length is 1, but it holds no events"),
        (0, 0, None, 0, "it holds an event at position 0, past its end (its length is 0)"),
        (2, -1, 0, 1, "it holds an event at position -1, below 0"),
        (5, 0, 2, 4, "it holds an event at position 4 but none at 3"),
        (5, 0, 2.5, 4, "it holds an event at position 2.5, not an integer"),
        (5, "0", 3, 4, "it holds an event at position '0', not an integer"),
    ],
)
def test_what_the_ends_of_a_logs_positions_tell(
    length: int, first: Any, second: Any, last: Any, problem: str | None
) -> None:
    from govern.runtime._eventlog import _span_problem  # (here: the other tests run without it)

    assert _span_problem(length, first, second, last) == problem


def test_a_gap_deeper_in_the_log_is_reported_by_reads_with_what_to_do(log_url: str, log_name: str) -> None:
    """An append cannot see it (it would have to count the log), so the reads that meet it say what only an
    edit makes and what to do, as the append's refusal does."""
    filled(log_url, log_name).close()
    edit(log_url, _DELETE.format(position=1), log=log_name)
    log = order_log(log_url, name=log_name)
    try:
        with pytest.raises(LogCorrupted, match=r"expected position 1, found 2; .*restore it from a backup"):
            log.read()
        with pytest.raises(LogCorrupted, match=r"lacks its event number 1; .*restore it from a backup"):
            log.read_record("o1")
    finally:
        log.close()
