"""The event log at its edges: names the machine does not have, bad input, dropped connections, lost commit
acknowledgements, held locks, an exhausted pool, foreign or newer databases, and lost counter rows."""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import bide
import govern
from bide.testing import ScriptedModel, reply
from bide.testing import call as model_call
from govern.runtime._agents import event_id_for, event_tool
from govern.runtime._eventlog import (
    Event,
    EventLog,
    EventLogError,
    InvalidInput,
    LogFormatError,
    LogTimeout,
    MachineMismatch,
)

from .conftest import POSTGRES_URL
from .machines import order_machine
from .test_governed_agents import call_tool
from .test_governed_eventlog import DIGEST, EVENTS, bound, ev


def test_an_event_name_the_machine_lacks_is_refused_on_every_store(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    log.append(ev("a"))
    with pytest.raises(InvalidInput, match="names 'shipp', which the machine") as refused:
        log.append(ev("b", name="shipp", seq=1))
    assert refused.value.field == "event" and isinstance(refused.value, govern.GovernError)
    # A batch holding one such event stores none of it.
    with pytest.raises(InvalidInput, match="shipp"):
        log.append_many([ev("c", seq=2), ev("d", name="shipp", seq=3)])
    if not any_log_url.startswith("memory"):
        # Another handle that was told nothing about the machine refuses it too: the log knows its events.
        other = EventLog(any_log_url, name=log_name)
        assert other.events() == EVENTS
        with pytest.raises(InvalidInput, match="shipp"):
            other.append(ev("e", name="shipp", seq=4))
        assert other.append(ev("f", name="ship", seq=5)).created
    assert [e.id for e in log.read()] == ["a"] + (["f"] if not any_log_url.startswith("memory") else [])


def test_a_log_learns_its_events_from_a_machine_or_its_certificate() -> None:
    machine = order_machine()
    certified = EventLog("memory://")
    certified.bind(govern.certify(machine))
    assert certified.machine() == machine.digest and certified.events() == machine.events
    certified.bind(machine)  # the same machine: nothing changes
    pay = Event(id="p", machine=machine.digest, record="o1", event="pay", producer="clerk")
    assert certified.append(pay).created
    with pytest.raises(MachineMismatch):
        certified.bind(DIGEST, events=EVENTS)
    with pytest.raises(InvalidInput, match="do not belong together"):
        certified.bind(machine.digest, events=["pay"])

    unbound = EventLog("memory://")
    with pytest.raises(EventLogError, match="not bound to a machine yet"):
        unbound.append(pay)
    with pytest.raises(InvalidInput, match="event names") as refused:
        unbound.bind(machine.digest)  # a bare digest cannot say which events exist
    assert refused.value.field == "events"
    assert unbound.length() == 0 and unbound.machine() is None
    assert EventLog("memory://", machine=machine).append(pay).created  # the handle knows: it binds


BAD_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("id", {"id": b"bytes-id"}),
    ("id", {"id": ""}),
    ("id", {"id": "x" * 201}),
    ("record", {"record": "o\x00rder"}),
    ("record", {"record": "order-\ud800"}),
    ("producer", {"producer": 7}),
    ("machine", {"machine": "x"}),
    ("machine", {"machine": "A" * 64}),
    ("producer_seq", {"producer_seq": 2**63 - 1}),
    ("producer_seq", {"producer_seq": -1}),
    ("producer_seq", {"producer_seq": "5"}),
    ("deps", {"deps": ["a", "a"]}),
    ("deps", {"deps": [b"a"]}),
    ("deps", {"deps": "a"}),
    ("extra", {"extra": 1}),
]


@pytest.mark.parametrize(
    ("field", "change"), BAD_EVENTS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_EVENTS)]
)
def test_bad_event_fields_are_refused_naming_the_field(
    any_log_url: str, log_name: str, field: str, change: dict[str, Any]
) -> None:
    fields: dict[str, Any] = {"id": "e1", "machine": DIGEST, "record": "o1", "event": "pay", "producer": "p"}
    fields |= change
    with pytest.raises(InvalidInput) as refused:
        Event(**fields)
    assert refused.value.field == field and str(refused.value).startswith(f"{field}:")
    log = bound(any_log_url, log_name)
    with pytest.raises(InvalidInput) as refused:
        log.append_many([fields])  # type: ignore[list-item]  # a plain mapping is validated the same way
    assert refused.value.field == field
    assert log.length() == 0


def test_the_largest_producer_number_and_any_unicode_round_trip(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    top = log.append(ev("top", record="日本-🚀", producer="ç", seq=2**63 - 2)).event
    assert log.read() == [top] and top.producer_seq == 2**63 - 2 and top.record == "日本-🚀"
    assert log.last_by_producer("ç") == top


def test_a_producer_past_its_last_number_is_refused_and_the_log_stays_readable(
    any_log_url: str, log_name: str
) -> None:
    """After the largest producer number, an event the log would number itself is refused on every store
    (SQLite stored 2**63 - 1 and then could not read its own log back; memory went on to 2**63)."""
    log = bound(any_log_url, log_name)
    top = log.append(ev("top", producer="p", seq=2**63 - 2)).event
    for attempt in range(2):
        with pytest.raises(InvalidInput, match="used its last sequence number") as refused:
            log.append(Event(id=f"next-{attempt}", machine=DIGEST, record="o1", event="pay", producer="p"))
        assert refused.value.field == "producer_seq"
    other = log.append(Event(id="other", machine=DIGEST, record="o1", event="ship", producer="q")).event
    assert log.read() == [top, other] and log.last_by_producer("p") == top
    if any_log_url != "memory://":  # a memory:// log is private to its handle
        assert EventLog(any_log_url, name=log_name).read() == [top, other]  # a fresh handle reads it too


def test_a_machine_whose_event_names_no_log_can_hold_is_refused_when_bound(any_log_url: str) -> None:
    """A family's instance names can pass 200 characters: the machine builds, but no log can store its
    events. That is said when a log is bound to it, not at the first append an agent makes."""
    registry = govern.Registry("long")
    x = registry.int("x", 0, 3)
    family = "set_the_value_of_the_counter_" * 8
    registry.event(family, params={"v": [0, 1]}, effect=lambda v: {x: v})
    registry.event("reset", effect={x: 0})
    registry.ordered()
    machine = registry.build()
    with pytest.raises(InvalidInput, match="no log can hold its events") as refused:
        EventLog(any_log_url, machine=machine)
    assert refused.value.field == "events"
    log = EventLog(any_log_url, name=f"long-{uuid.uuid4().hex[:8]}")
    with pytest.raises(InvalidInput, match="no log can hold its events"):
        log.bind(machine)
    with pytest.raises(InvalidInput, match="no log can hold its events"):
        event_tool(machine, log, "reset")
    assert log.length() == 0


def test_bad_read_arguments_are_refused_naming_the_argument(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    for call, field in (
        (lambda: log.get(b"a"), "event_id"),  # type: ignore[arg-type]
        (lambda: log.get("a\x00"), "event_id"),
        (lambda: log.read(-1), "start"),
        (lambda: log.read(0, -5), "limit"),
        (lambda: log.read_record("o1", through=-1), "through"),
        (lambda: log.read_record(""), "record"),
        (lambda: log.last_by_producer("\ud800"), "producer"),
        (lambda: log.root(3), "size"),
    ):
        with pytest.raises(InvalidInput) as refused:
            call()
        assert refused.value.field == field
    # A count past the range says the range, not only ">= 0".
    for call, field in (
        (lambda: log.read(2**62), "start"),
        (lambda: log.read(0, 2**62), "limit"),
        (lambda: log.read_record("o1", through=2**62), "through"),
    ):
        with pytest.raises(InvalidInput, match=r"from 0 to 2\*\*62 - 1, got 4611686018427387904") as refused:
            call()
        assert refused.value.field == field
    assert log.read(2**62 - 1) == []
    with pytest.raises(InvalidInput) as refused:
        EventLog(any_log_url, name=log_name, timeout=0)
    assert refused.value.field == "timeout"
    with pytest.raises(InvalidInput) as refused:
        EventLog(any_log_url, name=log_name, pool_size=0)
    assert refused.value.field == "pool_size"


def test_a_failing_read_is_an_event_log_error_not_a_driver_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/events.db"
    log = bound(url)
    log.append(ev("a"))
    with sqlite3.connect(tmp_path / "events.db") as raw:
        raw.execute("DROP TABLE govern_events")
    for call in (
        lambda: log.get("a"),
        log.read,
        lambda: log.read_record("o1"),
        lambda: log.append(ev("b", seq=1)),
    ):
        with pytest.raises(EventLogError, match="no such table: govern_events"):
            call()


# -- the format marker ------------------------------------------------------------------------------------

LAYOUT_1 = """
CREATE TABLE govern_logs (
    name VARCHAR(200) PRIMARY KEY, machine VARCHAR(200) NOT NULL, length BIGINT NOT NULL);
CREATE TABLE govern_events (
    log VARCHAR(200) NOT NULL, position BIGINT NOT NULL, event_id VARCHAR(200) NOT NULL,
    machine VARCHAR(200) NOT NULL, record VARCHAR(200) NOT NULL, record_seq BIGINT NOT NULL,
    event VARCHAR(200) NOT NULL, producer VARCHAR(200) NOT NULL, producer_seq BIGINT NOT NULL,
    deps TEXT NOT NULL, after TEXT NOT NULL, PRIMARY KEY (log, position),
    CONSTRAINT govern_events_id UNIQUE (log, event_id),
    CONSTRAINT govern_events_record UNIQUE (log, record, record_seq),
    CONSTRAINT govern_events_producer UNIQUE (log, producer, producer_seq));
CREATE TABLE govern_counters (
    log VARCHAR(200) NOT NULL, kind VARCHAR(1) NOT NULL, key VARCHAR(200) NOT NULL, next BIGINT NOT NULL,
    PRIMARY KEY (log, kind, key));
"""


@pytest.mark.parametrize("how", ["deleted", "moved", "replaced", "its write-ahead log deleted"])
def test_a_log_file_gone_or_replaced_while_open_refuses_appends(tmp_path: Path, how: str) -> None:
    """Before, appends went on into the unlinked file and said `created`, and the next connection made an
    empty log at the path: appends whose events nobody would read again, reported as done."""
    path = tmp_path / "events.db"
    log = bound(f"sqlite:///{path}")
    other = tmp_path / "other.db"
    bound(f"sqlite:///{other}").close()
    try:
        for i in range(3):
            log.append(ev(f"e{i}", seq=i))
        if how == "deleted":
            path.unlink()
        elif how == "moved":
            path.rename(tmp_path / "moved.db")
        elif how == "replaced":
            other.replace(path)
        else:
            Path(f"{path}-wal").unlink()
        said = {
            "replaced": "was replaced by another file",
            "its write-ahead log deleted": "events.db-wal' of the event log file .* was deleted",
        }.get(how, "was deleted or moved away")
        for i in range(3, 5):
            with pytest.raises(EventLogError, match=said):
                log.append(ev(f"e{i}", seq=i))
    finally:
        log.close()
    if how == "deleted":
        assert not path.exists()
    if how == "moved":
        # Put back beside its write-ahead log, the log holds what was appended before, and nothing after.
        (tmp_path / "moved.db").rename(path)
    if how in ("moved", "replaced"):
        assert {e.id for e in bound(f"sqlite:///{path}").read()}.isdisjoint({"e3", "e4"})
    if how == "moved":
        assert [e.id for e in bound(f"sqlite:///{path}").read()] == ["e0", "e1", "e2"]


@pytest.mark.parametrize("how", ["moved", "replaced"])
def test_a_replica_reading_a_log_file_gone_or_replaced_is_told_so(tmp_path: Path, how: str) -> None:
    """Only writes checked the file: a replica whose log file was replaced (a backup restored under it) or
    moved away went on reading the old file, applied nothing new and saved checkpoints of it, while the
    agents appended to the file at the path."""
    machine = order_machine()
    path, other = tmp_path / "events.db", tmp_path / "other.db"

    def event(i: int, name: str) -> Event:
        return Event(id=f"{path.stem}-{i}", machine=machine.digest, record="o1", event=name, producer="p")

    writer = EventLog(f"sqlite:///{path}", machine=machine)
    writer.append(event(0, "restock"))
    writer.close()
    writer = EventLog(f"sqlite:///{other}", machine=machine)
    writer.append_many([event(i, name) for i, name in enumerate(["pay", "restock", "ship"])])
    writer.close()
    reader = EventLog(f"sqlite:///{path}", machine=machine)
    try:
        replica = govern.Replica(machine, reader)
        assert replica.sync() == 1
        if how == "moved":
            path.rename(tmp_path / "moved.db")
        else:
            other.replace(path)
        said = "was deleted or moved away" if how == "moved" else "was replaced by another file"
        with pytest.raises(EventLogError, match=f"{said}.*what this EventLog read came from the old file"):
            replica.sync()
        with pytest.raises(EventLogError, match=said):
            reader.length()
        with pytest.raises(EventLogError, match=said):
            reader.read()
        assert replica.position == 1  # nothing of the old file applied meanwhile
    finally:
        reader.close()
    if how == "replaced":
        fresh = govern.Replica(machine, EventLog(f"sqlite:///{path}", machine=machine))
        assert fresh.sync() == 3 and fresh.state("o1")["status"] == "shipped"


def test_a_layout_1_log_is_upgraded_and_asks_for_its_events_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as raw:
        raw.executescript(LAYOUT_1)
        raw.execute("INSERT INTO govern_logs VALUES ('main', ?, 1)", (DIGEST,))
        raw.execute(
            "INSERT INTO govern_events VALUES ('main', 0, 'a', ?, 'o1', 0, 'pay', 'p', 0, '[]', '[]')",
            (DIGEST,),
        )
        raw.execute("INSERT INTO govern_counters VALUES ('main', 'p', 'p', 1), ('main', 'r', 'o1', 1)")
    log = EventLog(str(path))
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT format, version FROM govern_format").fetchall() == [
            ("govern-event-log", 3)
        ]
    assert [e.id for e in log.read()] == ["a"] and log.events() is None
    with pytest.raises(EventLogError, match="older govern"):
        log.append(ev("b", seq=1))
    log.bind(DIGEST, events=EVENTS)
    b = log.append(ev("b", seq=1)).event
    assert (b.position, b.record_seq) == (1, 1)
    assert EventLog(str(path)).events() == EVENTS  # recorded for every later handle


# Layout 2 exactly as govern wrote it before layout 3 (SQLAlchemy's DDL, a rowid table), with two logs.
LAYOUT_2 = """
CREATE TABLE govern_format (
    format VARCHAR(200) NOT NULL, version INTEGER NOT NULL, PRIMARY KEY (format));
CREATE TABLE govern_logs (
    name VARCHAR(200) NOT NULL, machine VARCHAR(200) NOT NULL, length BIGINT NOT NULL, events TEXT,
    PRIMARY KEY (name));
CREATE TABLE govern_events (
    log VARCHAR(200) NOT NULL, position BIGINT NOT NULL, event_id VARCHAR(200) NOT NULL,
    machine VARCHAR(200) NOT NULL, record VARCHAR(200) NOT NULL, record_seq BIGINT NOT NULL,
    event VARCHAR(200) NOT NULL, producer VARCHAR(200) NOT NULL, producer_seq BIGINT NOT NULL,
    deps TEXT NOT NULL, "after" TEXT NOT NULL, writer VARCHAR(32), PRIMARY KEY (log, position),
    CONSTRAINT govern_events_id UNIQUE (log, event_id),
    CONSTRAINT govern_events_record UNIQUE (log, record, record_seq),
    CONSTRAINT govern_events_producer UNIQUE (log, producer, producer_seq));
CREATE TABLE govern_counters (
    log VARCHAR(200) NOT NULL, kind VARCHAR(1) NOT NULL, "key" VARCHAR(200) NOT NULL, next BIGINT NOT NULL,
    PRIMARY KEY (log, kind, "key"));
INSERT INTO govern_format VALUES ('govern-event-log', 2);
"""


def _layout_2_file(path: Path) -> None:
    """A layout 2 SQLite file as govern wrote it: logs 'main' (events a, b, c) and 'other' (event a)."""
    names = '["pay", "ship", "cancel"]'
    with sqlite3.connect(path) as raw:
        raw.executescript(LAYOUT_2)
        raw.execute(
            "INSERT INTO govern_logs VALUES ('main', ?, 3, ?), ('other', ?, 1, ?)", (DIGEST, names) * 2
        )
        rows = [
            ("main", 0, "a", "o1", 0, "pay", "p", 0, "[]", "[]", "w1"),
            ("main", 1, "b", "o2", 0, "ship", "p", 5, '["a"]', "[0]", "w1"),
            ("main", 2, "c", "o1", 1, "ship", "q", 0, '["a"]', "[0]", "w2"),
            ("other", 0, "a", "o1", 0, "cancel", "p", 0, "[]", "[]", "w3"),
        ]
        raw.executemany(
            "INSERT INTO govern_events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(log, pos, i, DIGEST, *rest) for log, pos, i, *rest in rows],
        )
        raw.execute(
            "INSERT INTO govern_counters VALUES ('main', 'p', 'p', 6), ('main', 'p', 'q', 1), "
            "('main', 'r', 'o1', 2), ('main', 'r', 'o2', 1), ('other', 'p', 'p', 1), ('other', 'r', 'o1', 1)"
        )


def test_a_layout_2_sqlite_log_moves_to_layout_3_and_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "layout2.db"
    _layout_2_file(path)
    log = EventLog(str(path))
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT format, version FROM govern_format").fetchall() == [
            ("govern-event-log", 3)
        ]
        (table,) = raw.execute("SELECT sql FROM sqlite_master WHERE name = 'govern_events'").fetchone()
        assert table.rstrip().endswith("WITHOUT ROWID")
        assert raw.execute("SELECT count(*) FROM govern_counters").fetchone() == (0,)
        tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"govern_format", "govern_logs", "govern_events", "govern_counters"}
    # Everything reads as before.
    assert log.length() == 3 and log.events() == EVENTS and log.machine() == DIGEST
    stored = log.read()
    assert [(e.id, e.position, e.record_seq, e.producer_seq, e.after) for e in stored] == [
        ("a", 0, 0, 0, ()),
        ("b", 1, 0, 5, (0,)),
        ("c", 2, 1, 0, (0,)),
    ]
    assert [e.id for e in log.read_record("o1")] == ["a", "c"]
    assert log.last_by_producer("p") == stored[1] and log.get("c") == stored[2]
    assert EventLog(str(path), name="other").read()[0].event == "cancel"
    # Appends go on from the stored numbers, and the old events still de-duplicate and conflict.
    assert not log.append(ev("a")).created
    with pytest.raises(govern.EventConflict, match="already used sequence number 5"):
        log.append(ev("d", seq=5))
    d = log.append(Event(id="d", machine=DIGEST, record="o1", event="pay", producer="p")).event
    assert (d.position, d.record_seq, d.producer_seq) == (3, 2, 6)
    e = log.append(Event(id="e", machine=DIGEST, record="o3", event="pay", producer="q", deps=["b"])).event
    assert (e.position, e.record_seq, e.producer_seq, e.after) == (4, 0, 1, (1,))
    assert EventLog(str(path)).length() == 5  # a later handle finds layout 3 ready
    other = EventLog(str(path), name="other")
    assert other.append(ev("b", seq=1)).event.position == 1


_OPEN_AND_APPEND = """
import sys, time
from pathlib import Path
from govern.runtime._eventlog import Event, EventLog
path, go, me, digest = sys.argv[1:5]
while not Path(go).exists():
    time.sleep(0.001)
log = EventLog(path)
for k in range(10):
    log.append(Event(id=f"{me}-{k}", machine=digest, record=f"o-{me}", event="pay", producer=me))
print(log.length())
"""


@pytest.mark.slow
def test_processes_opening_a_layout_2_file_at_once_upgrade_it_once(tmp_path: Path) -> None:
    """Four processes open the same layout 2 file at the same moment and append: one upgrades it, the
    others wait for it (the opener lock) and find layout 3 ready; nothing is lost or numbered twice."""
    path = tmp_path / "layout2.db"
    _layout_2_file(path)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AND_APPEND, str(path), str(go), f"w{i}", DIGEST],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    time.sleep(0.5)  # every process is waiting for the signal
    go.touch()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT version FROM govern_format").fetchall() == [(3,)]
        tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"govern_format", "govern_logs", "govern_events", "govern_counters"}
    stored = EventLog(str(path)).read()
    assert [e.position for e in stored] == list(range(43))
    assert [e.id for e in stored[:3]] == ["a", "b", "c"]
    for i in range(4):
        mine = [e for e in stored if e.producer == f"w{i}"]
        assert [e.id for e in mine] == [f"w{i}-{k}" for k in range(10)]
        assert [(e.producer_seq, e.record_seq) for e in mine] == [(k, k) for k in range(10)]
    assert EventLog(str(path), name="other").length() == 1


def test_the_marker_names_the_layout_of_each_kind_of_database(log_url: str, log_name: str) -> None:
    # SQLite moved to layout 3; PostgreSQL stays at 2, so an older govern can still share the database.
    log = bound(log_url, log_name)
    log.append(ev("a"))
    engine = sa.create_engine(log_url)
    with engine.connect() as conn:
        marker = conn.execute(sa.text("SELECT format, version FROM govern_format")).all()
    engine.dispose()
    assert marker == [("govern-event-log", 3 if log_url.startswith("sqlite") else 2)]
    assert log.length() == 1 and EventLog(log_url, name=log_name).length() == 1


def test_another_applications_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "crm.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    with pytest.raises(
        LogFormatError, match=r"another application's database \(it holds the tables customers\)"
    ):
        EventLog(str(path))
    with sqlite3.connect(path) as raw:
        tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"customers"}
    not_a_database = tmp_path / "notes.db"
    not_a_database.write_text("shopping list: milk, eggs\n" * 100)
    with pytest.raises(EventLogError, match="not a database"):
        EventLog(str(not_a_database))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_another_programs_table_named_govern_format_is_refused_untouched(tmp_path: Path, kind: str) -> None:
    """A table of that name without the marker's columns raised the database's own "no such column" as a
    plain EventLogError, not `LogFormatError` (governed-agents.md, "The format marker")."""
    create = "CREATE TABLE govern_format (id INTEGER PRIMARY KEY, note TEXT)"
    if kind == "sqlite":
        path = tmp_path / "other.db"
        with sqlite3.connect(path) as raw:
            raw.execute(create)
            raw.execute("CREATE TABLE invoices (id INTEGER)")
        before = path.read_bytes()
        with pytest.raises(LogFormatError, match="govern_format without the format marker's columns"):
            EventLog(str(path))
        assert path.read_bytes() == before
        return
    schema = f"other_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        conn.exec_driver_sql(create.replace("govern_format", f"{schema}.govern_format"))
    try:
        with pytest.raises(LogFormatError, match="govern_format without the format marker's columns"):
            EventLog(f"{POSTGRES_URL}?options=-csearch_path%3D{schema}")
        with admin.connect() as conn:
            query = "SELECT table_name FROM information_schema.tables WHERE table_schema = %(schema)s"
            assert conn.exec_driver_sql(query, {"schema": schema}).all() == [("govern_format",)]
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ("UPDATE govern_format SET version = 4", "layout 4, written by a newer govern"),
        ("UPDATE govern_format SET format = 'someone-else'", "format 'someone-else'"),
        ("DROP TABLE govern_events", "only some of the event log's tables"),
    ],
)
def test_a_newer_or_foreign_layout_is_refused(tmp_path: Path, update: str, message: str) -> None:
    path = tmp_path / "events.db"
    bound(str(path)).append(ev("a"))
    with sqlite3.connect(path) as raw:
        raw.execute(update)
        if update.startswith("DROP"):
            raw.execute("DROP TABLE govern_format")
    with pytest.raises(LogFormatError, match=message):
        EventLog(str(path))


@pytest.mark.parametrize("table", ["govern_events", "govern_logs", "govern_counters"])
def test_a_marker_beside_only_some_of_the_tables_is_refused_untouched(tmp_path: Path, table: str) -> None:
    # governed-agents.md, "The format marker": only some of the tables is refused, and nothing is changed,
    # also when the marker row is intact (the open check reads the table list with the marker).
    path = tmp_path / "events.db"
    bound(str(path)).append(ev("a"))
    with sqlite3.connect(path) as raw:
        raw.execute(f"DROP TABLE {table}")
        before = sorted(raw.execute("SELECT type, name FROM sqlite_master"))
    with pytest.raises(LogFormatError, match=rf"only some of the event log's tables .*{table}"):
        EventLog(str(path))
    with sqlite3.connect(path) as raw:
        assert sorted(raw.execute("SELECT type, name FROM sqlite_master")) == before


@pytest.mark.postgres
def test_a_marker_beside_only_some_of_the_tables_is_refused_on_postgresql() -> None:
    # A database of its own: the test database's tables are shared with every other test.
    database = f"govern_partial_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {database}"))
    url = POSTGRES_URL.rsplit("/", 1)[0] + "/" + database
    own = sa.create_engine(url)
    try:
        bound(url, "partial").append(ev("a"))
        with own.begin() as conn:
            conn.execute(sa.text("DROP TABLE govern_events"))
        with pytest.raises(LogFormatError, match=r"only some of the event log's tables .*govern_events"):
            EventLog(url, name="partial")
        with own.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
        assert tables == {"govern_format", "govern_logs", "govern_counters"}
    finally:
        own.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        admin.dispose()


def test_lost_counter_rows_are_rebuilt_from_the_events(log_url: str, log_name: str) -> None:
    log = bound(log_url, log_name)
    log.append_many([Event(id=i, machine=DIGEST, record="o1", event="pay", producer="p") for i in "ab"])
    engine = sa.create_engine(log_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM govern_counters WHERE log = :log"), {"log": log_name})
    engine.dispose()
    c = log.append(Event(id="c", machine=DIGEST, record="o1", event="pay", producer="p")).event
    assert (c.position, c.record_seq, c.producer_seq) == (2, 2, 2)


# -- waits, pools, dropped connections ----------------------------------------------------------------


@contextmanager
def log_lock_held(url: str, log_name: str) -> Iterator[None]:
    """Another session holds the log's write lock in an open transaction (and does nothing)."""
    if url.startswith("sqlite"):
        raw = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        raw.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            raw.rollback()
            raw.close()
        return
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1 FROM govern_logs WHERE name = :n FOR UPDATE"), {"n": log_name})
        try:
            yield
        finally:
            conn.rollback()
    engine.dispose()


def test_a_held_lock_bounds_writers_and_never_blocks_readers(log_url: str, log_name: str) -> None:
    log = bound(log_url, log_name, timeout=1)
    log.append(ev("a"))
    with log_lock_held(log_url, log_name):
        with pytest.raises(LogTimeout, match="appending the same events again is safe"):
            log.append(ev("b", seq=1))
        # Readers take no lock: a WAL snapshot on SQLite, a plain read on PostgreSQL.
        assert log.length() == 1 and [e.id for e in log.read()] == ["a"]
        assert log.get("a") is not None and log.read_record("o1")[0].id == "a"
    assert log.append(ev("b", seq=1)).created


def test_a_bound_log_is_bound_again_without_waiting_for_its_lock(log_url: str, log_name: str) -> None:
    """Binding a log already bound to the machine writes nothing, so it must not wait for the write lock: an
    agent's tools are built (`event_tool` binds its log) while another session holds it, even past its
    timeout. Another machine is refused as ever."""
    machine = order_machine()
    log = EventLog(log_url, name=log_name, timeout=0.5)
    log.bind(machine)
    with log_lock_held(log_url, log_name):
        assert event_tool(machine, log, "pay").name == "pay"
        log.bind(govern.certify(machine))
        EventLog(log_url, name=log_name, timeout=0.5).bind(machine.digest)  # a new handle, by digest alone
        with pytest.raises(MachineMismatch, match="a machine change is a migration"):
            log.bind(DIGEST, events=EVENTS)
    assert log.machine() == machine.digest and log.events() == machine.events


def test_a_bind_that_must_write_waits_for_the_lock_and_names_the_bind(log_url: str, log_name: str) -> None:
    """A log bound by an older govern (no event names recorded) is written to by a bind: that bind takes
    the lock, and its timeout names the bind, not an append."""
    machine = order_machine()
    log = EventLog(log_url, name=log_name, timeout=0.5)
    log.bind(machine)
    engine = sa.create_engine(log_url)
    with engine.begin() as conn:
        conn.execute(sa.text('UPDATE govern_logs SET "events" = NULL WHERE "name" = :n'), {"n": log_name})
    engine.dispose()
    assert log.events() is None
    with log_lock_held(log_url, log_name):
        with pytest.raises(LogTimeout, match=f"^bind on event log '{log_name}'") as timed_out:
            log.bind(machine)
        assert "appending" not in str(timed_out.value)
    log.bind(machine)
    assert log.events() == machine.events


def test_an_exhausted_pool_is_a_clear_timeout(log_url: str, log_name: str) -> None:
    log = bound(log_url, log_name, timeout=0.5, pool_size=1)
    taken = log._backend.engine.connect()  # type: ignore[attr-defined]  # hold the only connection
    try:
        with pytest.raises(LogTimeout, match="all 1 connections of this EventLog stayed busy"):
            log.length()
    finally:
        taken.close()
    assert log.length() == 0


def test_a_busy_sqlite_write_connection_is_a_clear_timeout(tmp_path: Path, log_name: str) -> None:
    """A SQLite handle appends through one kept connection, one thread at a time: a thread that waits for
    it longer than the timeout is told so, and readers meanwhile use the pool's other connections."""
    log = bound(f"sqlite:///{tmp_path}/events.db", log_name, timeout=0.5, pool_size=2)
    log.append(ev("a"))
    backend: Any = log._backend  # type: ignore[attr-defined]
    with backend._writer_lock:  # another thread's append, holding the write connection
        with pytest.raises(LogTimeout, match="other threads of this EventLog kept appending"):
            log.append(ev("b", seq=1))
        assert log.length() == 1 and log.get("a") is not None
    assert log.append(ev("b", seq=1)).created
    pool = backend.engine.pool
    log.close()
    assert pool.checkedout() == 0  # the kept connection went back to the pool, which closed it


def test_more_threads_than_connections_wait_their_turn(log_url: str, log_name: str) -> None:
    log = bound(log_url, log_name, pool_size=2)
    failures: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for i in range(5):
                log.append(
                    Event(id=f"t{w}-{i}", machine=DIGEST, record=f"r{i}", event="pay", producer=f"t{w}")
                )
                log.length()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert [e.position for e in log.read()] == list(range(50))


def _wrapped(orig: BaseException) -> sa.exc.DBAPIError:
    """A driver error as SQLAlchemy hands it over: its `connection_invalidated` flag left False, as it was
    for the failures the flag missed."""
    return sa.exc.OperationalError("SELECT 1", {}, orig, connection_invalidated=False)


def test_failures_are_classified_by_what_the_driver_reports() -> None:
    import psycopg
    import psycopg.errors

    from govern.runtime._logretry import classify

    admin = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    assert classify(_wrapped(admin))[::2] == ("retry", True)
    assert classify(_wrapped(psycopg.OperationalError("cannot exit pipeline mode while busy")))[::2] == (
        "retry",
        True,
    )
    assert classify(_wrapped(psycopg.errors.SerializationFailure("could not serialize")))[::2] == (
        "retry",
        False,
    )
    assert classify(_wrapped(psycopg.errors.DeadlockDetected("deadlock detected")))[::2] == ("retry", False)
    assert classify(_wrapped(psycopg.errors.ConnectionFailure("connection failure")))[::2] == ("retry", True)
    assert classify(_wrapped(psycopg.errors.LockNotAvailable("lock timeout")))[0] == "timeout"
    assert classify(_wrapped(psycopg.errors.QueryCanceled("statement timeout")))[0] == "timeout"
    assert classify(_wrapped(psycopg.errors.UniqueViolation("duplicate key")))[0] == "fail"
    assert classify(_wrapped(sqlite3.OperationalError("database is locked")))[::2] == ("retry", False)
    assert classify(_wrapped(sqlite3.OperationalError("no such table: govern_events")))[0] == "fail"
    assert classify(sa.exc.TimeoutError("QueuePool limit of size 1 overflow 0 reached"))[0] == "timeout"
    # A rollback that fails after a dropped connection carries the drop in its chain.
    try:
        try:
            raise _wrapped(admin)
        except sa.exc.DBAPIError:
            raise sa.exc.ResourceClosedError("This Connection is closed") from None
    except sa.exc.ResourceClosedError as chained:
        chained.__context__ = _wrapped(admin)
        assert classify(chained)[0] == "retry"


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("url", "error", "said"),
    [
        (
            "postgresql+psycopg://postgres@127.0.0.1:5432/govern_absent_db",
            EventLogError,
            'no database "govern_absent_db": create it (createdb govern_absent_db)',
        ),
        (
            "postgresql+psycopg://govern_absent_role@127.0.0.1:5432/test",
            EventLogError,
            'refuses this login (connection failed: connection to server at "127.0.0.1", port 5432 failed: '
            'FATAL:  role "govern_absent_role" does not exist): fix the URL\'s user or password',
        ),
        (
            f"{POSTGRES_URL}?sslmode=bogus",
            govern.LogURLError,
            'libpq refuses the value of its option sslmode (invalid sslmode value: "bogus")',
        ),
    ],
)
def test_a_connection_refused_for_good_is_told_at_once_not_retried(
    url: str, error: type[EventLogError], said: str
) -> None:
    """A database or role the server does not have, or an option value libpq refuses, is the URL's to fix:
    the log says so on its first try, instead of retrying for its whole timeout and calling the database
    unreachable or overloaded (a LogTimeout, which is what a server that does not answer still gets)."""
    with pytest.raises(error) as refused:
        EventLog(url, machine=order_machine(), timeout=5)
    assert not isinstance(refused.value, LogTimeout)
    assert said in str(refused.value) and "kept failing" not in str(refused.value)
    with pytest.raises(LogTimeout, match="kept failing"):
        EventLog("postgresql+psycopg://postgres@127.0.0.1:1/test", machine=order_machine(), timeout=0.2)


def _application_url(app: str, port: int | None = None) -> str:
    base = POSTGRES_URL if port is None else f"postgresql+psycopg://postgres@127.0.0.1:{port}/test"
    return f"{base}?application_name={app}&sslmode=disable"


@contextmanager
def backends_killed(app: str, every: float) -> Iterator[list[int]]:
    """Terminate a PostgreSQL backend of application `app` every `every` seconds, in a thread; the yielded
    list holds the number of backends killed so far and the number of rounds the killer has made."""
    stop = threading.Event()
    kills = [0, 0]

    def killer() -> None:
        engine = sa.create_engine(POSTGRES_URL)
        # One backend per round, at random: every connection gets killed sooner or later, and retries still
        # make progress on a loaded machine (killing all of them every few ms would starve every attempt).
        query = sa.text(
            "SELECT count(pg_terminate_backend(pid)) FROM (SELECT pid FROM pg_stat_activity "
            "WHERE application_name = :app ORDER BY random() LIMIT 1) AS victim"
        )
        with engine.connect() as conn:
            while not stop.is_set():
                kills[0] += int(conn.execute(query, {"app": app}).scalar() or 0)
                conn.commit()
                kills[1] += 1
                time.sleep(every)
        engine.dispose()

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        yield kills
    finally:
        stop.set()
        thread.join()


@pytest.mark.postgres
@pytest.mark.slow
def test_appends_and_reads_survive_killed_backends(log_name: str) -> None:
    app = f"govern-test-{uuid.uuid4().hex[:8]}"
    log = bound(_application_url(app), log_name)
    failures: list[BaseException] = []
    created: list[bool] = []

    def writer(w: int, kills: list[int]) -> None:
        try:
            for i in range(0, 60, 3):
                batch = [
                    Event(id=f"w{w}-{j}", machine=DIGEST, record=f"r{j % 4}", event="pay", producer=f"w{w}")
                    for j in range(i, i + 3)
                ]
                created.extend(a.created for a in log.append_many(batch))
                assert log.get(f"w{w}-{i}") is not None
                log.read_record(f"r{i % 4}")
                # Each batch waits for a round of the killer: the appends span its kills however fast
                # they are (a fast log finished before ten kills).
                seen = kills[1]
                give_up = time.monotonic() + 5
                while kills[1] == seen and time.monotonic() < give_up:
                    time.sleep(0.002)
        except BaseException as exc:
            failures.append(exc)

    with backends_killed(app, every=0.03) as kills:
        threads = [threading.Thread(target=writer, args=(w, kills)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == [], failures[0]
    assert kills[0] >= 10, "the killer must actually have dropped connections"
    stored = log.read()
    assert [e.position for e in stored] == list(range(240)) and len({e.id for e in stored}) == 240
    assert created.count(True) == 240, "each event is reported created by exactly the call that wrote it"


@pytest.mark.postgres
def test_a_lost_pipelined_connection_is_not_reported_twice_by_psycopg(
    log_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A small append (a pipeline) meeting a backend the server terminated is retried, and psycopg's own
    warning about the pipeline it could not close ("error ignored terminating <psycopg.Pipeline [BAD]>")
    is not logged: it reached stderr once per cut connection."""
    app = f"govern-quiet-{uuid.uuid4().hex[:8]}"
    log = bound(_application_url(app), log_name)
    caplog.set_level(logging.WARNING, logger="psycopg")
    engine = sa.create_engine(POSTGRES_URL)
    try:
        for i in range(3):
            assert log.append(ev(f"quiet-{i}", record=f"r{i}", seq=i)).created
            with engine.connect() as conn:
                killed = conn.execute(
                    sa.text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = :app"
                    ),
                    {"app": app},
                ).scalar()
                conn.commit()
            assert killed
    finally:
        engine.dispose()
    assert [e.id for e in log.read()] == ["quiet-0", "quiet-1", "quiet-2"]
    assert not [r for r in caplog.records if "error ignored terminating" in r.getMessage()]


class CommitDropper:
    """A TCP proxy to PostgreSQL that, when armed, forwards the COMMIT of a transaction that wrote events
    and then cuts the connection before the acknowledgement comes back: the commit lands, the client
    sees a dropped connection."""

    # The COMMIT psycopg sends: a simple query, or in a pipeline (a small append's) an extended-protocol
    # Parse message whose statement name is empty.
    COMMITS = (b"Q\x00\x00\x00\x0bCOMMIT\x00", b"\x00COMMIT\x00")
    WRITE = b"INSERT INTO govern_events"

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = 0
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", 5432))
            cut = threading.Event()  # set: nothing more reaches the client
            threading.Thread(target=self._upstream, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, cut), daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        wrote = False
        try:
            while data := client.recv(65536):
                wrote = wrote or self.WRITE in data
                commits = any(c in data for c in self.COMMITS)
                if self.armed and wrote and commits:
                    self.armed -= 1
                    cut.set()
                    self.dropped += 1
                    server.sendall(data)
                    time.sleep(0.3)  # the server commits; its answer is never relayed
                    break
                server.sendall(data)
                if commits:
                    wrote = False
        except OSError:
            pass
        for s in (client, server):
            s.close()

    def _downstream(self, server: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        try:
            while (data := server.recv(65536)) and not cut.is_set():
                client.sendall(data)
        except OSError:
            pass
        if cut.is_set():
            client.close()

    def close(self) -> None:
        self.listener.close()


@pytest.mark.postgres
def test_a_lost_commit_acknowledgement_is_resolved_by_reading_the_writer_back(log_name: str) -> None:
    proxy = CommitDropper()
    try:
        log = bound(_application_url("govern-proxy", proxy.port), log_name)
        log.append(ev("a"))
        proxy.armed = 1
        b = log.append(ev("b", seq=1))
        assert proxy.dropped == 1
        assert b.created and b.event.position == 1  # this call's commit landed: it wrote b
        assert not log.append(ev("b", seq=1)).created
        assert [e.id for e in log.read()] == ["a", "b"]

        tool_log = EventLog(_application_url("govern-proxy", proxy.port), name=f"{log_name}-tool")
        tool = event_tool(order_machine(), tool_log, "pay")
        proxy.armed = 1
        result = call_tool(tool, "run-1", "c0.0")
        assert proxy.dropped == 2
        assert result["newly_recorded"] is True and result["outcome"] == "applied"
        assert tool_log.length() == 1
    finally:
        proxy.close()


@contextmanager
def counters_refused(log_name: str, key: str) -> Iterator[None]:
    """A trigger that makes PostgreSQL refuse log `log_name`'s counter row for record `key`: an append of
    an event on that record fails at its last statement, after its events were written."""
    function, trigger = f"refuse_{uuid.uuid4().hex[:8]}", f"refuse_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(POSTGRES_URL)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.\"log\" = '{log_name}' AND NEW.\"key\" = '{key}' THEN "
            "RAISE EXCEPTION 'counter refused by the test'; END IF; RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            f"CREATE TRIGGER {trigger} BEFORE INSERT ON govern_counters FOR EACH ROW "
            f"EXECUTE FUNCTION {function}()"
        )
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TRIGGER {trigger} ON govern_counters")
            conn.exec_driver_sql(f"DROP FUNCTION {function}()")
        engine.dispose()


@pytest.mark.postgres
def test_a_refused_small_append_hands_its_connection_back_as_it_came(log_name: str) -> None:
    """A small append runs as a pipeline on a connection switched to autocommit (two round trips). When the
    server refuses its last statement, nothing is stored, and the connection goes back to the pool out of
    pipeline and autocommit mode: a batch appended on it next is still one transaction (in autocommit its
    events, written before the refused statement, would stay)."""
    log = bound(POSTGRES_URL, log_name, pool_size=1)  # one connection: the refused append's serves the rest
    log.append(ev("a"))
    with counters_refused(log_name, "refused-record"):
        with pytest.raises(EventLogError, match="counter refused by the test"):
            log.append(ev("b", record="refused-record", seq=1))
        assert [e.id for e in log.read()] == ["a"]
        with pytest.raises(EventLogError, match="counter refused by the test"):
            log.append_many([ev("c", seq=1), ev("d", record="refused-record", seq=2)])
        batch = [ev(f"e{i}", record=f"o{i}", seq=2 + i) for i in range(20)]
        with pytest.raises(EventLogError, match="counter refused by the test"):  # 21 events: not pipelined
            log.append_many([*batch, ev("f", record="refused-record", seq=22)])
        assert [e.id for e in log.read()] == ["a"]
        assert log.append(ev("g", seq=1)).created
    assert [e.id for e in log.read()] == ["a", "g"]
    assert log.append_many(batch)[0].created
    assert log.length() == 22


@pytest.mark.postgres
@pytest.mark.slow
def test_agents_are_told_the_truth_while_their_backends_are_killed(log_name: str, tmp_path: Path) -> None:
    """Agent processes record events while their log connections are killed: every call is journaled
    as a success, and the log holds exactly one event per call (a call told "failed" would be retried
    by its model, recording a non-idempotent event twice)."""
    app = f"govern-test-{uuid.uuid4().hex[:8]}"
    log_url = _application_url(app)
    EventLog(log_url, name=log_name).bind(order_machine())
    store_url = f"sqlite:///{tmp_path}/journal.db"  # the journals stay up: only the log's backends die
    runs = [f"{log_name}-agent{i}" for i in range(3)]
    worker = Path(__file__).with_name("_agent_worker.py")
    with backends_killed(app, every=0.03) as kills:
        procs = [
            subprocess.Popen(
                [sys.executable, str(worker), store_url, log_url, log_name, run, str(i), "20"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i, run in enumerate(runs)
        ]
        outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0 and out.strip() == "done", err[-2000:]
    assert kills[0] >= 5, "the killer must actually have dropped connections"
    stored = EventLog(POSTGRES_URL, name=log_name).read()
    store = bide.open_store(store_url)
    for run in runs:
        calls = [r for r in bide.Journal(store, run).load().records() if isinstance(r, bide.ToolResult)]
        assert len(calls) == 20 and [r.result for r in calls if r.is_error] == []
        expected = {event_id_for(run, r.call_id, r.tool, r.result["record"]) for r in calls}
        assert expected == {e.id for e in stored if e.producer == run}
    store.close()
    assert len(stored) == 60 and [e.position for e in stored] == list(range(60))


@contextmanager
def _write_lock_held(path: Path, seconds: float) -> Iterator[None]:
    """Another process holds the SQLite file's write lock for `seconds` (a slow or paused writer)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE'); print('held', flush=True)\n"
            "time.sleep(float(sys.argv[2])); c.execute('COMMIT')\n",
            str(path),
            str(seconds),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.wait(timeout=60)


@pytest.mark.parametrize("tool_timeout", [None, 2.0])
def test_the_model_is_never_told_a_call_failed_while_its_event_may_still_be_appended(
    tmp_path: Path, tool_timeout: float | None
) -> None:
    """A writer holds the log's lock for 3 s. With the tool's own timeout (from the log's, 10 s), the append
    waits and the model is told it succeeded. With a timeout lowered below what the log may take (2 s),
    bide's timeout ends the call while its thread waits to append: the call is in doubt (the drive stops,
    nothing journaled), and the next drive finds the event the thread committed. Before, the first fix
    refused "too little time left" calls with "nothing was appended", which an earlier drive paused inside
    its append (or a process frozen past the timeout) could make false: the model called again and the log
    recorded the intent twice."""
    machine = order_machine()
    path = tmp_path / "events.db"
    log = EventLog(f"sqlite:///{path}", machine=machine, timeout=10)
    tool = event_tool(machine, log, "restock")
    assert tool.timeout >= 5 * 2 * log.timeout  # five log calls at most, each within twice its timeout
    if tool_timeout is not None:
        tool.timeout = tool_timeout
    store = bide.open_store("memory://")

    def drive() -> None:
        model = ScriptedModel([model_call("restock", record="o1"), reply("done")])
        bide.Agent(model, store=store, tools=[tool]).run_sync("run", "restock o1")

    with _write_lock_held(path, 3.0):
        if tool_timeout is None:
            drive()
        else:
            with pytest.raises(bide.CallInDoubt, match=r"may still commit \(this tool's timeout, 2 s"):
                drive()
            records = bide.Journal(store, "run").load().records()
            assert not [r for r in records if isinstance(r, bide.ToolResult)]  # nothing journaled
    time.sleep(2.0)  # the append left running in a worker thread commits once the lock is free
    if tool_timeout is not None:
        assert len(log.read()) == 1
        drive()  # the next drive calls again with the same event id: found, not appended again
    (result,) = [r for r in bide.Journal(store, "run").load().records() if isinstance(r, bide.ToolResult)]
    events = log.read()
    assert not result.is_error and [e.id for e in events] == [result.result["event_id"]]
    assert result.result["newly_recorded"] is (tool_timeout is None)


def test_a_drive_cancelled_while_its_append_waits_is_cancelled_not_in_doubt(tmp_path: Path) -> None:
    """A call ended by bide's timeout is in doubt; one whose drive is cancelled (a worker stopping) is
    cancelled: the first fix told them apart by a half-second margin before the timeout, so a cancellation
    0.3 s before a 1.5 s timeout ended the drive in CallInDoubt ("the tool's timeout ended the call")."""
    machine = order_machine()
    path = tmp_path / "events.db"
    log = EventLog(f"sqlite:///{path}", machine=machine, timeout=10)
    tool = event_tool(machine, log, "restock")
    tool.timeout = 1.5
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([model_call("restock", record="o1"), reply("done")]), store=store,
                       tools=[tool])  # fmt: skip

    async def cancelled_after(seconds: float) -> BaseException | None:
        drive = asyncio.ensure_future(agent.run("run", "restock o1"))
        await asyncio.sleep(seconds)
        drive.cancel()
        try:
            await drive
        except BaseException as exc:  # what the drive ended with is the finding
            return exc
        return None

    with _write_lock_held(path, 3.0):
        ended = asyncio.run(cancelled_after(1.2))
    assert isinstance(ended, asyncio.CancelledError), repr(ended)


@pytest.mark.postgres
def test_a_postgresql_urls_own_server_options_are_kept() -> None:
    """`?options=-csearch_path=...` puts a tenant's log in its own schema, as it puts bide's store there; the
    log's own lock and statement timeouts used to replace the URL's options, so two tenants' logs silently
    shared the public schema."""
    schema = f"tenant_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    try:
        log = EventLog(f"{POSTGRES_URL}?options=-csearch_path%3D{schema}", machine=order_machine())
        try:
            log.append(Event(id="e1", machine=order_machine().digest, record="o1", event="pay", producer="p"))
            assert log.length() == 1
        finally:
            log.close()
        with admin.connect() as conn:
            found = conn.exec_driver_sql(
                "SELECT table_schema FROM information_schema.tables WHERE table_name = 'govern_events' "
                "AND table_schema = %(schema)s",
                {"schema": schema},
            ).all()
        assert found == [(schema,)]
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()
