"""Hostile files: an event log edited by hand (with sqlite3, or SQL on PostgreSQL), another program's
database, and a machine file that is a pipe, a device or larger than memory. Each is refused with a govern
error saying what is wrong; none is read as something else, changed, crashed on, or waited on forever."""

from __future__ import annotations

import contextlib
import os
import random
import re
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import govern
from govern.model._space import available_memory
from govern.runtime._eventlog import Event, EventLog, InvalidInput, LogCorrupted, LogFormatError, LoggedEvent
from govern.runtime._replica import Replica

from .conftest import POSTGRES_URL
from .machines import order_log, order_machine

INT64_MAX = 2**63 - 1
NESTED = "[" * 100_000 + "]" * 100_000  # deeper than any JSON parser recurses


def filled(url: str, name: str = "main") -> EventLog:
    """A log of `order_machine` holding four events of record o1 by producer p, each depending on the one
    before: restock, pay, ship, restock (positions, record numbers and producer numbers 0 to 3)."""
    log = order_log(url, name=name)
    digest = order_machine().digest
    previous: list[str] = []
    for i, event in enumerate(["restock", "pay", "ship", "restock"]):
        log.append(Event(id=f"e{i}", machine=digest, record="o1", event=event, producer="p", deps=previous))
        previous = [f"e{i}"]
    return log


def edit(url: str, sql: str, **params: Any) -> None:
    """Run one statement on the log's database behind govern's back: sqlite3 on the file itself, or
    SQLAlchemy on PostgreSQL (the statement's :name parameters suit both)."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as raw, raw:
            raw.execute(sql, params)
        return
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(sql), params)
    finally:
        engine.dispose()


def new_event(event_id: str = "new", *, deps: tuple[str, ...] = ()) -> Event:
    return Event(
        id=event_id, machine=order_machine().digest, record="o1", event="pay", producer="p", deps=deps
    )


# -- another program's file is left as it was --------------------------------------------------------------


def _foreign(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        raw.execute("CREATE TABLE users (name TEXT)")
        raw.execute("INSERT INTO users VALUES ('ada')")


def _log_in_rollback_mode(path: Path, damage: str) -> None:
    """A log govern wrote, then put back in SQLite's default journal mode and damaged by `damage`."""
    filled(f"sqlite:///{path}").close()
    journal_mode(path, "delete")
    with contextlib.closing(sqlite3.connect(path)) as raw:
        raw.executescript(damage)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_foreign, "another application's database"),
        (
            lambda path: _log_in_rollback_mode(path, "DROP TABLE govern_counters; DROP TABLE govern_format;"),
            "only some of the event log's tables",
        ),
        (lambda path: _log_in_rollback_mode(path, "UPDATE govern_format SET version = 4"), "newer govern"),
    ],
    ids=["another-application", "some-tables", "newer-layout"],
)
def test_a_refused_sqlite_file_is_left_byte_for_byte(tmp_path: Path, make: Any, message: str) -> None:
    # governed-agents.md: such a file is "refused, and left as it was" (its journal mode included).
    path = tmp_path / "app.db"
    make(path)
    before = path.read_bytes()
    with pytest.raises(LogFormatError, match=message):
        EventLog(f"sqlite:///{path}")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal or -shm file beside it
    assert journal_mode(path) == "delete"


def _truncated(path: Path) -> None:
    filled(f"sqlite:///{path}").close()
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _garbage_page(path: Path) -> None:
    filled(f"sqlite:///{path}").close()
    with contextlib.closing(sqlite3.connect(path)) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(path, "r+b") as f:
        f.seek(4096)  # the second page: a table's root
        f.write(b"\xa5" * 4096)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_truncated, "the file is damaged"),
        (_garbage_page, "the file is damaged"),
        (lambda path: path.write_bytes(b"not a database, " * 1000), "the file is not a SQLite database"),
    ],
    ids=["truncated", "garbage-page", "not-sqlite"],
)
def test_a_damaged_sqlite_file_is_a_corrupted_log(tmp_path: Path, make: Any, message: str) -> None:
    """A damaged file was a plain `EventLogError` ("database disk image is malformed"), which a caller could
    not tell from a passing failure by its type."""
    path = tmp_path / "events.db"
    make(path)
    with pytest.raises(LogCorrupted, match=f"{message}.*restore the log from a backup"):
        log = EventLog(f"sqlite:///{path}")
        log.read()
        log.append(new_event())


def test_an_accepted_sqlite_log_uses_wal_from_its_first_open(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    log = filled(f"sqlite:///{path}")
    assert journal_mode(path) == "wal" and log.length() == 4
    # A log copied back in rollback mode goes to WAL again, and every handle goes on reading and appending.
    log.close()
    journal_mode(path, "delete")
    reader, writer = order_log(f"sqlite:///{path}"), order_log(f"sqlite:///{path}")
    assert reader.length() == 4 and journal_mode(path) == "wal"
    assert writer.append(new_event(deps=("e3",))).event.position == 4
    assert [e.id for e in reader.read(3)] == ["e3", "new"]


def journal_mode(path: Path, change: str | None = None) -> str:
    """The SQLite file's journal mode, after setting it to `change` when given."""
    with contextlib.closing(sqlite3.connect(path)) as raw:
        (mode,) = raw.execute("PRAGMA journal_mode" + (f"={change}" if change else "")).fetchone()
    return str(mode)


# -- edited rows are refused, never read as something else -------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "where"),
    [
        ('UPDATE govern_events SET "deps" = :value WHERE "log" = :log AND "position" = 2', "position 2"),
        ('UPDATE govern_events SET "after" = :value WHERE "log" = :log AND "position" = 2', "position 2"),
        ('UPDATE govern_logs SET "events" = :value WHERE "name" = :log', "the log's row is unreadable"),
    ],
    ids=["deps", "after", "events"],
)
def test_deeply_nested_json_in_a_row_is_a_corrupted_log(
    log_url: str, log_name: str, sql: str, where: str
) -> None:
    filled(log_url, log_name).close()
    edit(log_url, sql, value=NESTED, log=log_name)
    log = order_log(log_url, name=log_name)
    calls: list[Callable[[], object]] = [lambda: Replica(order_machine(), log).sync()]
    if "govern_logs" in sql:  # the log's row: read by every call that needs the log's length or events
        calls += [log.length, log.events, lambda: log.append(new_event())]
    else:  # the event at position 2: read by every call that reads it, a retried append of it too
        retry = Event(
            id="e2", machine=order_machine().digest, record="o1", event="ship", producer="p", deps=["e1"]
        )
        calls += [log.read, lambda: log.get("e2"), lambda: log.append(retry)]
    for call in calls:
        with pytest.raises(LogCorrupted, match=where):
            call()


ROW_EDITS = [
    ("deps", '"e1"', "a list of event ids, not str"),  # was read as the dependencies ('e', '1')
    ("deps", "[1]", "dependency id must be a string"),
    ("deps", '{"e1": 0}', "a list of event ids, not dict"),
    ("after", '"1"', "a list of log positions, not str"),  # was read as the position 1
    ("after", '["1"]', "must be an integer, not str"),
    ("after", "[1.5]", "must be an integer, not float"),
    ("after", f"[{2**63}]", "must be between 0 and"),
]
SQLITE_ROW_EDITS = [
    ("producer_seq", 1.5, "producer_seq: must be an integer, not float"),  # was read as 1
    ("record_seq", 1.5, "record_seq: must be an integer, not float"),
    ("record_seq", "one", "record_seq: must be an integer, not str"),
    ("deps", b'["e1"]', "deps must be JSON text, not bytes"),
]


@pytest.mark.parametrize(("column", "value", "message"), ROW_EDITS)
def test_a_row_value_of_the_wrong_type_is_a_corrupted_log(
    log_url: str, log_name: str, column: str, value: str, message: str
) -> None:
    _check_wrong_type(log_url, log_name, column, value, message)


@pytest.mark.parametrize(("column", "value", "message"), SQLITE_ROW_EDITS)
def test_a_sqlite_row_value_of_the_wrong_type_is_a_corrupted_log(
    tmp_path: Path, column: str, value: object, message: str
) -> None:
    _check_wrong_type(f"sqlite:///{tmp_path}/events.db", "main", column, value, message)


def _check_wrong_type(url: str, name: str, column: str, value: object, message: str) -> None:
    filled(url, name).close()
    edit(url, f'UPDATE govern_events SET "{column}" = :value WHERE "log" = :log AND "position" = 2',
         value=value, log=name)  # fmt: skip
    log = EventLog(url, name=name)
    expected = rf"unreadable event row at position 2 of log '{name}': .*{message}"
    for read in (log.read, lambda: log.read(2, 1), lambda: log.read_record("o1"), lambda: log.get("e2")):
        with pytest.raises(LogCorrupted, match=expected):
            read()
    with pytest.raises(LogCorrupted, match=expected):
        Replica(order_machine(), log).sync()


@pytest.mark.parametrize(
    ("sql", "deps", "message"),
    [
        # The highest producer number, read as 2.5 + 1: the next was numbered 3.
        (
            'UPDATE govern_events SET "producer_seq" = 3.5 WHERE "position" = 3',
            (),
            "next number of producer 'p'",
        ),
        (
            'UPDATE govern_events SET "record_seq" = 3.5 WHERE "position" = 3',
            (),
            "next number of record 'o1'",
        ),
        # A dependency's position, once stored as the new event's `after`.
        ('UPDATE govern_events SET "position" = 2.5 WHERE "position" = 2', ("e2",), "position of event 'e2'"),
    ],
    ids=["producer_seq", "record_seq", "position"],
)
def test_an_append_refuses_a_number_of_the_wrong_type(
    tmp_path: Path, sql: str, deps: tuple[str, ...], message: str
) -> None:
    path = tmp_path / "events.db"
    filled(f"sqlite:///{path}").close()
    edit(f"sqlite:///{path}", sql)
    log = order_log(f"sqlite:///{path}")
    for append in (
        lambda: log.append(new_event(deps=deps)),
        lambda: log.append_many([new_event(deps=deps), new_event("b")]),
    ):
        with pytest.raises(LogCorrupted, match=rf"{message} reads as .*, not an integer"):
            append()
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        assert raw.execute("SELECT count(*) FROM govern_events").fetchone() == (4,)


def test_an_append_refuses_a_next_number_edited_below_zero(log_url: str, log_name: str) -> None:
    """Only the upper bound was checked: a producer's numbers edited below zero (SQLite: the stored
    numbers, -10 to -7; PostgreSQL: the counter, -5) had the next append write its event with -6 (-5),
    after which every read() of the log refused that row."""
    filled(log_url, log_name).close()
    if log_url.startswith("sqlite"):
        edit(log_url, 'UPDATE govern_events SET "producer_seq" = "producer_seq" - 10 WHERE "log" = :log',
             log=log_name)  # fmt: skip (numbers -10 to -7)
    else:
        edit(log_url, "UPDATE govern_counters SET \"next\" = -5 WHERE \"log\" = :log AND \"kind\" = 'p'",
             log=log_name)  # fmt: skip
    log = order_log(log_url, name=log_name)
    try:
        with pytest.raises(LogCorrupted, match=r"number of producer 'p' reads as -\d, a negative number"):
            log.append(new_event())
        assert log.length() == 4
    finally:
        log.close()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("""UPDATE govern_events SET "position" = '9x' WHERE "position" = 1""", "its length reads as '9x'"),
        ("""UPDATE govern_events SET "position" = '3x' WHERE "position" = 3""", "its length reads as '3x'"),
        (
            """UPDATE govern_events SET "producer_seq" = '7z' WHERE "position" = 3""",
            "the next number of producer 'p' reads as '7z'",
        ),
        (
            """UPDATE govern_events SET "record_seq" = 'a' WHERE "position" = 0""",
            "the next number of record 'o1' reads as 'a'",
        ),
    ],
    ids=["position-past-the-end", "last-position", "producer_seq", "record_seq"],
)
def test_an_sqlite_number_edited_to_text_is_never_read_as_a_number(
    tmp_path: Path, sql: str, message: str
) -> None:
    """SQLite keeps text in an integer column, and the `+ 1` that gave the next number made a number of it:
    a position edited to '9x' gave a log of four events the length 10, and the next append wrote at
    position 10, making a gap itself; a producer number edited to '7z' numbered the producer's next event
    8. Now each is a corrupted log, and nothing is appended."""
    path = tmp_path / "events.db"
    filled(f"sqlite:///{path}").close()
    edit(f"sqlite:///{path}", sql)
    log = order_log(f"sqlite:///{path}")
    for append in (lambda: log.append(new_event()), lambda: log.append_many([new_event(), new_event("b")])):
        with pytest.raises(LogCorrupted, match=re.escape(message)):
            append()
    if sql.startswith('UPDATE govern_events SET "position"'):
        with pytest.raises(LogCorrupted, match=re.escape(message)):
            log.length()
    log.close()
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        assert raw.execute("SELECT count(*) FROM govern_events").fetchone() == (4,)


def test_a_log_whose_row_was_deleted_is_never_bound_again(log_url: str, log_name: str) -> None:
    """With its row in govern_logs gone, a log holding events reported length 0 and no machine, and any
    machine could bind it: another machine's events then followed its own. Now every use of it is a
    corrupted log, and nothing is written."""
    filled(log_url, log_name).close()
    edit(log_url, 'DELETE FROM govern_logs WHERE "name" = :log', log=log_name)
    registry = govern.Registry("other")
    flag = registry.bool("flag")
    registry.event("go", effect={flag: True})
    other = registry.build()
    gone = re.escape(f"log '{log_name}' holds events but its row in govern_logs is gone")
    log = EventLog(log_url, name=log_name, machine=other)
    for use in (
        log.length,
        log.machine,
        lambda: log.bind(other),
        lambda: log.bind(order_machine()),
        lambda: log.append(Event(id="x", machine=other.digest, record="r", event="go", producer="q")),
        lambda: log.append(new_event()),
    ):
        with pytest.raises(LogCorrupted, match=gone):
            use()
    log.close()
    engine = sa.create_engine(log_url)
    try:
        with engine.connect() as conn:
            count = conn.execute(
                sa.text('SELECT count(*) FROM govern_events WHERE "log" = :log'), {"log": log_name}
            ).scalar()
            rows = conn.execute(
                sa.text('SELECT count(*) FROM govern_logs WHERE "name" = :log'), {"log": log_name}
            ).scalar()
            assert (count, rows) == (4, 0)
    finally:
        engine.dispose()


# -- numbers past what a 64-bit column holds ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        # SQLite computes the next position or number past 2**63 - 1 as a float.
        (
            f'UPDATE govern_events SET "position" = {INT64_MAX} WHERE "position" = 3',
            "the log's row is unreadable",
        ),
        (
            f'UPDATE govern_events SET "record_seq" = {INT64_MAX} WHERE "position" = 3',
            "next number of record 'o1'",
        ),
        # One below: the next position is 2**63 - 1 exactly, which an append refuses to use. (The last two
        # events move together: a gap just below the last position is refused as damage before.)
        (
            f'UPDATE govern_events SET "position" = "position" + {INT64_MAX - 4} WHERE "position" >= 2',
            "log 'main' has used its last",
        ),
        (
            f'UPDATE govern_events SET "record_seq" = {INT64_MAX - 1} WHERE "position" = 3',
            "record 'o1' of log 'main' has used its last",
        ),
    ],
    ids=["position", "record_seq", "position-1", "record_seq-1"],
)
def test_an_sqlite_log_at_the_last_64_bit_number_refuses_appends(
    tmp_path: Path, sql: str, message: str
) -> None:
    path = tmp_path / "events.db"
    filled(f"sqlite:///{path}").close()
    edit(f"sqlite:///{path}", sql)
    log = order_log(f"sqlite:///{path}")
    for append in (lambda: log.append(new_event()), lambda: log.append_many([new_event(), new_event("b")])):
        with pytest.raises(LogCorrupted, match=message):
            append()
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        assert raw.execute("SELECT count(*) FROM govern_events").fetchone() == (4,)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("sql", "message"),
    [
        # The last two events move with the length: a length past the last event is refused as damage before.
        (
            'WITH moved AS (UPDATE govern_events SET "position" = "position" + (:top - 4) WHERE "log" = :log '
            'AND "position" >= 2) UPDATE govern_logs SET "length" = :top WHERE "name" = :log',
            "log '{log}' has used its last",
        ),
        # The last event of o1 moves with its counter: a counter past the record's last number is refused as
        # damage before.
        (
            'WITH moved AS (UPDATE govern_events SET "record_seq" = :top - 1 WHERE "log" = :log AND '
            '"position" = 3) UPDATE govern_counters SET "next" = :top WHERE "log" = :log AND kind = \'r\' '
            "AND key = 'o1'",
            "record 'o1' of log '{log}' has used its last",
        ),
    ],
    ids=["position", "record_seq"],
)
def test_a_postgresql_log_at_the_last_64_bit_number_refuses_appends(
    log_name: str, sql: str, message: str
) -> None:
    filled(POSTGRES_URL, log_name).close()
    edit(POSTGRES_URL, sql, top=INT64_MAX, log=log_name)
    log = order_log(POSTGRES_URL, name=log_name)
    with pytest.raises(LogCorrupted, match=message.format(log=log_name)):
        log.append(new_event())
    assert log.get("new") is None


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("sql", "message"),
    [
        # The log's length is checked against its last event before anything is numbered.
        (
            'UPDATE govern_logs SET "length" = 1 WHERE "name" = :log',
            "is damaged: it holds an event at position 3, past its end",
        ),
        (
            "UPDATE govern_counters SET \"next\" = 1 WHERE \"log\" = :log AND kind = 'r' AND key = 'o1'",
            "the log's counters are behind its events",
        ),
        (
            "UPDATE govern_counters SET \"next\" = 2 WHERE \"log\" = :log AND kind = 'p' AND key = 'p'",
            "the log's counters are behind its events",
        ),
    ],
    ids=["position", "record_seq", "producer_seq"],
)
@pytest.mark.parametrize("batch", [1, 20], ids=["one", "copied"])
def test_a_postgresql_counter_edited_below_its_events_is_a_corrupted_log(
    log_name: str, sql: str, message: str, batch: int
) -> None:
    """A counter edited down (or restored apart from the events) made the next append collide with a
    stored event: a raw duplicate-key EventLogError that said "appending the same events again is safe",
    which only failed the same way forever. It is a corrupted log, and nothing is written."""
    filled(POSTGRES_URL, log_name).close()
    edit(POSTGRES_URL, sql, log=log_name)
    log = order_log(POSTGRES_URL, name=log_name)
    try:
        events = [
            Event(id=f"new{i}", machine=order_machine().digest, record="o1", event="restock", producer="p")
            for i in range(batch)
        ]
        with pytest.raises(LogCorrupted, match=message) as refused:
            log.append_many(events)
        assert "again is safe" not in str(refused.value)
        # (read(0, 4): a read to the end checks the log's length, which the "position" edit damaged)
        assert all(log.get(e.id) is None for e in events) and len(log.read(0, 4)) == 4
    finally:
        log.close()


@pytest.mark.parametrize("field", ["position", "record_seq"])
def test_a_logged_event_holds_only_what_a_64_bit_column_holds(field: str) -> None:
    event = filled("memory://").read()[3]
    assert getattr(LoggedEvent(**{**event.model_dump(), field: INT64_MAX}), field) == INT64_MAX
    for value, message in [
        (INT64_MAX + 1, "must be between 0 and 9223372036854775807"),
        (-1, "must be between 0 and"),
        ("3", "must be an integer, not str"),
        (3.0, "must be an integer, not float"),
    ]:
        with pytest.raises(InvalidInput, match=f"{field}: {message}") as caught:
            LoggedEvent(**{**event.model_dump(), field: value})
        assert caught.value.field == field


def test_a_logged_events_dependency_positions_are_64_bit_integers() -> None:
    event = filled("memory://").read()[3]
    assert LoggedEvent(**{**event.model_dump(), "after": [INT64_MAX]}).after == (INT64_MAX,)
    for value, message in [
        ((INT64_MAX + 1,), "a dependency's position must be between 0 and 9223372036854775807"),
        ((-1,), "a dependency's position must be between 0 and"),
        (("2",), "a dependency's position must be an integer, not str"),
        ((True,), "a dependency's position must be an integer, not bool"),
        ("2", "must be a list of log positions, not str"),
    ]:
        with pytest.raises(InvalidInput, match=f"after: {message}"):
            LoggedEvent(**{**event.model_dump(), "after": value})
    with pytest.raises(InvalidInput, match="producer_seq: must be between 0 and"):
        LoggedEvent(**{**event.model_dump(), "producer_seq": INT64_MAX + 1})


# -- the format marker and the tables -----------------------------------------------------------------------


@pytest.mark.parametrize("version", ["'3a'", "3.5", "x'03'"])
def test_a_marker_version_that_is_no_integer_is_refused(tmp_path: Path, version: str) -> None:
    path = tmp_path / "events.db"
    filled(f"sqlite:///{path}").close()
    edit(f"sqlite:///{path}", f"UPDATE govern_format SET version = {version}")
    before = path.read_bytes()
    with pytest.raises(LogFormatError, match=r"format marker whose version is .*, not an integer"):
        EventLog(f"sqlite:///{path}")
    assert path.read_bytes() == before


@pytest.mark.parametrize("dropped", [["govern_counters"], ["govern_counters", "govern_logs"]])
def test_a_sqlite_log_without_its_marker_and_some_tables_is_refused_untouched(
    tmp_path: Path, dropped: list[str]
) -> None:
    path = tmp_path / "events.db"
    filled(f"sqlite:///{path}").close()
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        raw.executescript("".join(f"DROP TABLE {table};" for table in [*dropped, "govern_format"]))
        schema = sorted(raw.execute("SELECT type, name, sql FROM sqlite_master"))
    with pytest.raises(LogFormatError, match=rf"only some of the event log's tables .*{dropped[-1]}"):
        EventLog(f"sqlite:///{path}")
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        assert sorted(raw.execute("SELECT type, name, sql FROM sqlite_master")) == schema


@pytest.fixture
def own_postgres_database() -> Iterator[str]:
    """The URL of a PostgreSQL database of its own (the test database's tables are shared), dropped after."""
    database = f"govern_hostile_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {database}"))
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + "/" + database
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        admin.dispose()


@pytest.mark.postgres
def test_a_postgresql_log_without_its_marker_and_counters_is_refused_untouched(
    own_postgres_database: str,
) -> None:
    url = own_postgres_database
    filled(url).close()
    edit(url, "DROP TABLE govern_counters")
    edit(url, "DROP TABLE govern_format")
    with pytest.raises(
        LogFormatError, match=r"only some of the event log's tables .*govern_counters is not there"
    ):
        EventLog(url)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            assert set(sa.inspect(conn).get_table_names()) == {"govern_logs", "govern_events"}
    finally:
        engine.dispose()


# -- machine files that are no files ------------------------------------------------------------------------

# In a child process with its address space capped and a deadline, so that a load which blocks on a pipe or
# reads without end fails this test instead of hanging it or exhausting the machine's memory.
_LOAD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import govern
try:
    govern.Machine.load(sys.argv[1])
except govern.MachineFileError as exc:
    print("MachineFileError:", exc)
"""


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _larger_than_memory(path: Path) -> None:
    with path.open("wb") as f:  # sparse: no disk is used
        f.truncate(2 * available_memory() + (1 << 30))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_fifo, "not a regular file"),
        (_device, "not a regular file"),
        (_larger_than_memory, r"larger than [\d,]+ bytes: more than the memory left"),
    ],
    ids=["fifo", "dev-zero", "larger-than-memory"],
)
def test_a_machine_file_that_is_no_regular_file_or_too_large_is_refused(
    tmp_path: Path, make: Any, message: str
) -> None:
    path = tmp_path / "orders.govern"
    make(path)
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.startswith(f"MachineFileError: cannot read machine file {str(path)!r}: "), done.stderr[
        -2000:
    ]
    assert re.search(message, done.stdout), done.stdout


def test_a_machine_file_saved_by_rename_while_it_is_loaded_loads_whole(tmp_path: Path) -> None:
    """A writer replacing the machine file by rename (as a save does), with a larger one and back, while it
    is loaded: each load reads one whole file, old or new. (Taking the size of one file and the bytes of
    the next refused about one load in ten as a file that "grew while it was read".)"""
    import threading

    bigger = govern.Registry("bigger")
    a, b = bigger.int("a", 0, 200), bigger.int("b", 0, 50)
    bigger.event("inc_a", guard=a < 200, effect={a: a + 1})
    bigger.event("inc_b", guard=b < 50, effect={b: b + 1})
    machines = [order_machine(), bigger.build()]
    files = []
    for i, machine in enumerate(machines):
        machine.save(tmp_path / f"m{i}.govern")
        files.append((tmp_path / f"m{i}.govern").read_bytes())
    assert len(files[0]) != len(files[1])
    path, spare = tmp_path / "live.govern", tmp_path / "spare.govern"
    path.write_bytes(files[0])
    stop = threading.Event()

    def replace_again_and_again() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            spare.write_bytes(files[i % 2])
            os.replace(spare, path)

    writer = threading.Thread(target=replace_again_and_again)
    writer.start()
    try:
        digests = {m.digest for m in machines}
        for _ in range(300):
            assert govern.Machine.load(path).digest in digests
    finally:
        stop.set()
        writer.join()


def test_a_file_damaged_past_its_first_pages_never_reads_as_a_shorter_log(tmp_path: Path) -> None:
    """Bytes overwritten deep in the file: SQLite ends a read at the page it cannot read, without an error,
    and `read()`, iteration, `root()` and a replica's `sync()` took the first 50 of 3,000 events for the
    whole log. A read that stops before the log's length is `LogCorrupted`."""
    path = tmp_path / "events.db"
    url = f"sqlite:///{path}"
    log = order_log(url)
    digest = order_machine().digest
    events = [Event(id=f"e{i}", machine=digest, record=f"r{i % 50}", event="restock", producer="p")
              for i in range(3000)]  # fmt: skip
    log.append_many(events)
    log.close()
    with contextlib.closing(sqlite3.connect(path)) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    rng = random.Random(0)
    for offset in range(8192, len(data) - 4096, 4096 * 5):
        data[offset + 100 : offset + 400] = rng.randbytes(300)
    path.write_bytes(bytes(data))
    log = EventLog(url)
    try:
        for read in (log.read, lambda: list(log), log.root, lambda: Replica(order_machine(), log).sync()):
            with pytest.raises(LogCorrupted, match="damaged"):
                read()
    finally:
        log.close()


def test_one_id_twice_in_a_call_with_two_contents_is_not_called_stored(tmp_path: Path) -> None:
    """The conflict said the first copy was "already at position 0", of a log that held nothing: the call
    appends all of its events or none."""
    log = order_log(f"sqlite:///{tmp_path / 'events.db'}")
    digest = order_machine().digest
    first = Event(id="e1", machine=digest, record="o1", event="restock", producer="p")
    other = Event(id="e1", machine=digest, record="o2", event="restock", producer="p")
    try:
        with pytest.raises(govern.EventConflict, match=r"given twice in this call.*nothing was appended"):
            log.append_many([first, other])
        assert log.get("e1") is None and log.length() == 0
    finally:
        log.close()


def test_a_directory_or_a_missing_schema_is_a_url_to_fix(tmp_path: Path) -> None:
    """Both were a plain EventLogError with the database's words alone ("unable to open database file",
    "no schema has been selected to create in"), not saying what to do."""
    (tmp_path / "events.db").mkdir()
    with pytest.raises(govern.LogURLError, match="is a directory"):
        EventLog(f"sqlite:///{tmp_path / 'events.db'}").length()
    schema = f"nowhere_{uuid.uuid4().hex[:8]}"
    url = POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?") + f"options=-csearch_path%3D{schema}"
    with pytest.raises(govern.LogURLError, match="search_path names does not exist"):
        EventLog(url).close()
