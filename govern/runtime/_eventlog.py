"""The shared event log: one total, dense, append-only order of governed events.

A log holds events for exactly one machine (by digest). Its promises:

- **Dense, stable positions.** The n-th event appended to a log gets position n (from 0), assigned in the
  same transaction that writes it; positions never change and never skip. Concurrent appenders in any
  number of processes (SQLite file or PostgreSQL) serialize on the log, so there are no gaps and no
  duplicates. A reader that ever sees a gap raises `LogCorrupted` instead of returning a shorter list.
- **Idempotent by event id.** Appending an id that is already in the log with the same content is a no-op
  that returns the existing position; the same id with different content raises `EventConflict`. So is
  a second event claiming a producer sequence number that another event already holds.
- **Causality is recorded.** An event names the ids it causally depends on; each must already be in the
  log, so the log order respects every declared dependency. Each event also gets `record_seq`, its dense
  position among the events of the same record, which lets a replica receiving events out of order know
  exactly which earlier events of a record it has not seen yet.
- **One machine.** The first event (or `bind`) fixes the log's machine digest; an event for any other
  digest raises `MachineMismatch`: changing the machine is a migration to a new log, never an accident.

URLs: a plain path or ``sqlite:///path`` (SQLite file, WAL, fsync on commit), ``postgresql://...``
(psycopg driver), ``memory://`` (held in this process only, not durable: for tests and benchmarks;
``memory://`` alone is private to the handle, ``memory://space`` is shared by every handle opened with
that space and log name in the process). Every backend runs the same append algorithm (`_append`).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection, Engine

from .._errors import GovernError

__all__ = [
    "Appended",
    "Event",
    "EventConflict",
    "EventLog",
    "EventLogError",
    "LogCorrupted",
    "LoggedEvent",
    "MachineMismatch",
    "MissingDependency",
]

_NAME_MAX = 200
_RETRIES = 60
_LEAF_TAG = b"govern.event.v1\n"
_T = TypeVar("_T")


class EventLogError(GovernError):
    """The event log refused a request or could not complete it; the message says what to do."""


class EventConflict(EventLogError, ValueError):
    """An event id (or a producer's sequence number) is already in the log with different content.

    Event ids name one event forever: derive a fresh id for a new event.
    """


class MachineMismatch(EventLogError, ValueError):
    """The event (or replica) is for a machine other than the one the log is bound to.

    A log holds events of one machine; changing the machine is a migration: open a new log.
    """


class MissingDependency(EventLogError, ValueError):
    """An event depends on an event id that is not in the log yet; append the dependency first."""


class LogCorrupted(EventLogError):
    """The stored log breaks its own contract (a gap in positions, an unreadable row).

    Nothing was skipped: stop, and restore the store from a backup or investigate the writer.
    """


def _check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not value or len(value) > _NAME_MAX:
        raise ValueError(f"{kind} must be a non-empty string of at most {_NAME_MAX} characters: {value!r}")
    return value


class Event(BaseModel):
    """One governed event as a producer submits it: which machine, which record, which event, by whom.

    `id` names the event forever (appending it again is a no-op); `producer_seq` numbers the producer's own
    events (None: the log numbers them, in log order); `deps` are ids of events this one causally
    depends on (they must already be in the log).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    machine: str
    record: str
    event: str
    producer: str
    producer_seq: int | None = Field(default=None, ge=0)
    deps: tuple[str, ...] = ()

    @field_validator("id", "machine", "record", "event", "producer")
    @classmethod
    def _names(cls, value: str, info: ValidationInfo) -> str:
        return _check_name(str(info.field_name), value)

    @field_validator("deps")
    @classmethod
    def _deps(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for dep in value:
            _check_name("a dependency id", dep)
        if len(set(value)) != len(value):
            raise ValueError(f"deps lists an id twice: {list(value)}")
        return value

    def same_content(self, other: Event) -> bool:
        """True when `other` is the same event: every field equal (dependency order is irrelevant, and a
        producer_seq left to the log matches whatever number the log gave)."""
        return (
            self.id == other.id
            and self.machine == other.machine
            and self.record == other.record
            and self.event == other.event
            and self.producer == other.producer
            and (
                self.producer_seq is None
                or other.producer_seq is None
                or self.producer_seq == other.producer_seq
            )
            and sorted(self.deps) == sorted(other.deps)
        )


class LoggedEvent(Event):
    """An event as the log holds it: the `log` it is in, its `position` there, `record_seq` within its
    record, and `after`, the positions of its dependencies (each lower than `position`)."""

    log: str
    producer_seq: int = Field(ge=0)
    position: int = Field(ge=0)
    record_seq: int = Field(ge=0)
    after: tuple[int, ...] = ()

    def leaf(self) -> bytes:
        """The event's leaf in the log's RFC 6962 Merkle tree: a domain tag and the canonical JSON of every
        field (sorted keys, no whitespace, UTF-8)."""
        body = json.dumps(
            self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        return _LEAF_TAG + body.encode("utf-8")


@dataclass(frozen=True, slots=True)
class Appended:
    """The outcome of an append: the stored event and whether this call wrote it (False: already there)."""

    event: LoggedEvent
    created: bool


_metadata = sa.MetaData()

_logs = sa.Table(
    "govern_logs",
    _metadata,
    sa.Column("name", sa.String(_NAME_MAX), primary_key=True),
    sa.Column("machine", sa.String(_NAME_MAX), nullable=False),
    sa.Column("length", sa.BigInteger, nullable=False),
)

_events = sa.Table(
    "govern_events",
    _metadata,
    sa.Column("log", sa.String(_NAME_MAX), primary_key=True),
    sa.Column("position", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("event_id", sa.String(_NAME_MAX), nullable=False),
    sa.Column("machine", sa.String(_NAME_MAX), nullable=False),
    sa.Column("record", sa.String(_NAME_MAX), nullable=False),
    sa.Column("record_seq", sa.BigInteger, nullable=False),
    sa.Column("event", sa.String(_NAME_MAX), nullable=False),
    sa.Column("producer", sa.String(_NAME_MAX), nullable=False),
    sa.Column("producer_seq", sa.BigInteger, nullable=False),
    sa.Column("deps", sa.Text, nullable=False),
    sa.Column("after", sa.Text, nullable=False),
    sa.UniqueConstraint("log", "event_id", name="govern_events_id"),
    sa.UniqueConstraint("log", "record", "record_seq", name="govern_events_record"),
    sa.UniqueConstraint("log", "producer", "producer_seq", name="govern_events_producer"),
)

# The next producer_seq / record_seq per key, kept with the events in the same transaction: reading
# MAX(...) per key would scan every earlier event of the key on some planners.
_counters = sa.Table(
    "govern_counters",
    _metadata,
    sa.Column("log", sa.String(_NAME_MAX), primary_key=True),
    sa.Column("kind", sa.String(1), primary_key=True),
    sa.Column("key", sa.String(_NAME_MAX), primary_key=True),
    sa.Column("next", sa.BigInteger, nullable=False),
)

# Statements are built once: building SQLAlchemy expressions per call costs more than running them.
_P = sa.bindparam
_Q_LOG = sa.select(_logs.c.machine, _logs.c.length).where(_logs.c.name == _P("log"))
_Q_LOG_LOCK = _Q_LOG.with_for_update()
_Q_READ = (
    sa.select(_events)
    .where(_events.c.log == _P("log"), _events.c.position >= _P("start"))
    .order_by(_events.c.position)
    .limit(_P("limit"))
)
_Q_IDS = sa.select(_events).where(
    _events.c.log == _P("log"), _events.c.event_id.in_(_P("ids", expanding=True))
)
_Q_RECORD = (
    sa.select(_events)
    .where(_events.c.log == _P("log"), _events.c.record == _P("record"), _events.c.position <= _P("through"))
    .order_by(_events.c.record_seq)
)
_Q_LAST_BY_PRODUCER = (
    sa.select(_events)
    .where(_events.c.log == _P("log"), _events.c.producer == _P("producer"))
    .order_by(_events.c.producer_seq.desc())
    .limit(1)
)
_Q_HOLDER = sa.select(_events).where(
    _events.c.log == _P("log"), _events.c.producer == _P("producer"), _events.c.producer_seq == _P("seq")
)
_Q_COUNTERS = sa.select(_counters.c.key, _counters.c.next).where(
    _counters.c.log == _P("log"),
    _counters.c.kind == _P("kind"),
    _counters.c.key.in_(_P("keys", expanding=True)),
)
_S_INSERT = sa.insert(_events)
_S_LENGTH = sa.update(_logs).where(_logs.c.name == _P("log")).values(length=_P("length"))


class _Tx(Protocol):
    """What the append algorithm needs from a backend, inside one exclusive transaction on the log."""

    def lock(self, machine: str) -> tuple[str, int]: ...
    def by_ids(self, ids: list[str]) -> dict[str, LoggedEvent]: ...
    def producer_next(self, producers: list[str]) -> dict[str, int]: ...
    def record_next(self, records: list[str]) -> dict[str, int]: ...
    def holder(self, producer: str, seq: int) -> LoggedEvent | None: ...
    def write(self, events: list[LoggedEvent], length: int) -> None: ...


class _Backend(Protocol):
    def transaction(self, body: Callable[[_Tx], _T]) -> _T: ...
    def head(self) -> tuple[str, int] | None: ...
    def read(self, start: int, limit: int) -> list[LoggedEvent]: ...
    def by_ids(self, ids: list[str]) -> dict[str, LoggedEvent]: ...
    def read_record(self, record: str, through: int) -> list[LoggedEvent]: ...
    def last_by_producer(self, producer: str) -> LoggedEvent | None: ...
    def close(self) -> None: ...


_NO_LIMIT = 2**62


class EventLog:
    """A named, append-only log of governed events (see the module docstring for every promise). The
    default URL is the SQLite file ``govern-events.db`` in the working directory.

    Thread-safe; open one `EventLog` per process (or share one between threads).
    """

    def __init__(self, url: str = "sqlite:///govern-events.db", *, name: str = "main") -> None:
        self.url = url
        self.name = _check_name("the log name", name)
        self._backend: _Backend
        if isinstance(url, str) and url.startswith("memory://"):
            self._backend = _memory_backend(url[len("memory://") :], self.name)
        else:
            self._backend = _SqlBackend(url, self.name)

    def __repr__(self) -> str:
        return f"EventLog({self.url!r}, name={self.name!r})"

    @property
    def in_memory(self) -> bool:
        """True for a ``memory://`` log: held by this process only, gone when it exits."""
        return isinstance(self._backend, _MemoryBackend)

    def close(self) -> None:
        """Release the database connections (a memory log stays available to other handles)."""
        self._backend.close()

    # -- reading -----------------------------------------------------------------------------------------

    def machine(self) -> str | None:
        """The digest of the machine this log is bound to, or None before the first event."""
        head = self._backend.head()
        return None if head is None else head[0]

    def length(self) -> int:
        """How many events the log holds (the next position)."""
        head = self._backend.head()
        return 0 if head is None else head[1]

    def read(self, start: int = 0, limit: int | None = None) -> list[LoggedEvent]:
        """The events at positions `start, start+1, …` (at most `limit`), in log order, with no gaps.

        Raises `LogCorrupted` if a position is missing: a reader never gets a shorter list silently.
        """
        if start < 0 or (limit is not None and limit < 0):
            raise ValueError(f"start and limit must be >= 0, got {start}, {limit}")
        out = self._backend.read(start, _NO_LIMIT if limit is None else limit)
        for offset, event in enumerate(out):
            if event.position != start + offset:
                raise LogCorrupted(
                    f"log {self.name!r} has a gap: expected position {start + offset}, found {event.position}"
                )
        return out

    def __iter__(self) -> Iterator[LoggedEvent]:
        start = 0
        while True:
            page = self.read(start, 1000)
            yield from page
            if len(page) < 1000:
                return
            start += len(page)

    def get(self, event_id: str) -> LoggedEvent | None:
        """The stored event with this id, or None."""
        return self._backend.by_ids([event_id]).get(event_id)

    def read_record(self, record: str, *, through: int | None = None) -> list[LoggedEvent]:
        """The events of one record in log order (those at positions <= `through`, when given), with no
        gaps in their `record_seq`."""
        out = self._backend.read_record(record, _NO_LIMIT if through is None else through)
        for seq, event in enumerate(out):
            if event.record_seq != seq:
                raise LogCorrupted(f"record {record!r} of log {self.name!r} lacks its event number {seq}")
        return out

    def last_by_producer(self, producer: str) -> LoggedEvent | None:
        """The producer's latest event (highest producer_seq), or None."""
        return self._backend.last_by_producer(producer)

    def root(self, size: int | None = None) -> str:
        """The RFC 6962 Merkle root (hex) over the leaves (`LoggedEvent.leaf`) of the first `size` events
        (default: all). Sign it (`bide.audit.sign_head`) to commit to the log; a replica built with
        `track_root=True` recomputes it from the events it applied."""
        from bide.audit import MerkleTree  # here: only auditing needs bide

        events = self.read(0, size)
        if size is not None and len(events) != size:
            raise ValueError(f"log {self.name!r} holds {len(events)} events, fewer than size={size}")
        return MerkleTree(e.leaf() for e in events).root().hex()

    # -- writing -----------------------------------------------------------------------------------------

    def bind(self, machine_digest: str) -> None:
        """Bind an empty log to a machine digest (no-op if bound to it already; else `MachineMismatch`)."""
        _check_name("the machine digest", machine_digest)
        self._backend.transaction(
            lambda tx: _check_machine(self.name, tx.lock(machine_digest), machine_digest)
        )

    def append(self, event: Event) -> Appended:
        """Append one event (idempotent by id); see the module docstring for every rule it enforces."""
        return self.append_many([event])[0]

    def append_many(self, events: Sequence[Event]) -> list[Appended]:
        """Append several events in order, in one transaction: all of them are stored or none is."""
        items = [e if isinstance(e, Event) else Event.model_validate(e) for e in events]
        if not items:
            return []
        machines = {e.machine for e in items}
        if len(machines) != 1:
            raise MachineMismatch(f"one append mixes events of machines {sorted(machines)}")
        return self._backend.transaction(lambda tx: _append(self.name, tx, items))


def _check_machine(log: str, head: tuple[str, int], machine: str) -> int:
    if head[0] != machine:
        raise MachineMismatch(
            f"log {log!r} holds events of machine {head[0]}, not {machine}: a machine change is a migration; "
            "open a new log for the new machine"
        )
    return head[1]


def _append(log: str, tx: _Tx, items: list[Event]) -> list[Appended]:
    """The append algorithm, the same on every backend; runs inside the backend's exclusive transaction."""
    length = _check_machine(log, tx.lock(items[0].machine), items[0].machine)
    known = tx.by_ids(sorted({e.id for e in items} | {d for e in items for d in e.deps}))
    producer_next = tx.producer_next(sorted({e.producer for e in items}))
    producer_stored = dict(producer_next)
    record_next = tx.record_next(sorted({e.record for e in items}))
    fresh: dict[str, LoggedEvent] = {}
    out: list[Appended] = []
    for event in items:
        existing = fresh.get(event.id) or known.get(event.id)
        if existing is not None:
            if not existing.same_content(event):
                raise EventConflict(
                    f"event id {event.id!r} is already at position {existing.position} with different "
                    f"content ({existing.event!r} on {existing.record!r} by {existing.producer!r}); "
                    "an event id names one event forever"
                )
            out.append(Appended(existing, False))
            continue
        seq = producer_next[event.producer] if event.producer_seq is None else event.producer_seq
        holder = None
        if seq < producer_stored[event.producer]:
            holder = tx.holder(event.producer, seq)
        holder = holder or next(
            (f for f in fresh.values() if f.producer == event.producer and f.producer_seq == seq), None
        )
        if holder is not None:
            raise EventConflict(
                f"producer {event.producer!r} already used sequence number {seq} for event {holder.id!r}; "
                "each producer numbers its events uniquely"
            )
        producer_next[event.producer] = max(producer_next[event.producer], seq + 1)
        after: list[int] = []
        missing: list[str] = []
        for dep in event.deps:
            found = fresh.get(dep) or known.get(dep)
            if found is None:
                missing.append(dep)
            else:
                after.append(found.position)
        if missing:
            raise MissingDependency(
                f"event {event.id!r} depends on {missing}, which are not in log {log!r}; "
                "append dependencies first"
            )
        logged = LoggedEvent(
            log=log,
            id=event.id,
            machine=event.machine,
            record=event.record,
            event=event.event,
            producer=event.producer,
            producer_seq=seq,
            deps=event.deps,
            position=length,
            record_seq=record_next[event.record],
            after=tuple(sorted(after)),
        )
        record_next[event.record] += 1
        length += 1
        fresh[event.id] = logged
        out.append(Appended(logged, True))
    if fresh:
        tx.write(list(fresh.values()), length)
    return out


# -- SQL backend (SQLite file, PostgreSQL) -------------------------------------------------------------------


def _engine(url: str) -> tuple[Engine, str]:
    """An engine for `url`, and its dialect ("sqlite" or "postgresql")."""
    if not isinstance(url, str) or not url:
        raise EventLogError(
            "an event log URL is required (a file path, sqlite:///..., postgresql://..., memory://)"
        )
    if url.startswith(("postgresql://", "postgres://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("postgresql"):
        return sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4), "postgresql"
    if "://" not in url:
        url = "sqlite:///" + url
    if not url.startswith("sqlite"):
        raise EventLogError(
            f"unsupported event log URL {url!r}: use a file path, sqlite:///, postgresql://, memory://"
        )
    engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    # The driver's own transaction handling would start a write transaction lazily, which lets two appenders
    # both read the old length; BEGIN IMMEDIATE takes the write lock before the first read instead.
    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine, "sqlite"


def _transient(exc: sa.exc.DBAPIError) -> bool:
    text = str(exc.orig).lower() if exc.orig is not None else str(exc).lower()
    code = getattr(exc.orig, "sqlstate", None)
    return (
        "database is locked" in text
        or "database table is locked" in text
        or code in {"40001", "40P01", "23505"}
        or exc.connection_invalidated
    )


class _SqlTx:
    def __init__(self, conn: Connection, log: str, dialect: str) -> None:
        self.conn = conn
        self.log = log
        self.dialect = dialect

    def lock(self, machine: str) -> tuple[str, int]:
        query = _Q_LOG_LOCK if self.dialect == "postgresql" else _Q_LOG
        row = self.conn.execute(query, {"log": self.log}).first()
        if row is None:
            insert = (pg_dialect.insert if self.dialect == "postgresql" else sqlite_dialect.insert)(_logs)
            insert = insert.values(name=self.log, machine=machine, length=0).on_conflict_do_nothing()
            self.conn.execute(insert)
            row = self.conn.execute(query, {"log": self.log}).first()
            assert row is not None
        return str(row.machine), int(row.length)

    def by_ids(self, ids: list[str]) -> dict[str, LoggedEvent]:
        return _by_ids(self.conn, self.log, ids)

    def producer_next(self, producers: list[str]) -> dict[str, int]:
        return self._next("p", producers)

    def record_next(self, records: list[str]) -> dict[str, int]:
        return self._next("r", records)

    def _next(self, kind: str, keys: list[str]) -> dict[str, int]:
        """For each key, the next number to give (0 for a key never seen)."""
        found: dict[str, int] = {}
        for i in range(0, len(keys), 500):
            params = {"log": self.log, "kind": kind, "keys": keys[i : i + 500]}
            for key, nxt in self.conn.execute(_Q_COUNTERS, params):
                found[str(key)] = int(nxt)
        return {k: found.get(k, 0) for k in keys}

    def holder(self, producer: str, seq: int) -> LoggedEvent | None:
        row = self.conn.execute(_Q_HOLDER, {"log": self.log, "producer": producer, "seq": seq}).first()
        return None if row is None else _from_row(row)

    def write(self, events: list[LoggedEvent], length: int) -> None:
        self.conn.execute(_S_INSERT, [_to_row(self.log, e) for e in events])
        self.conn.execute(_S_LENGTH, {"log": self.log, "length": length})
        nexts: dict[tuple[str, str], int] = {}
        for e in events:
            assert e.producer_seq is not None
            nexts["p", e.producer] = max(nexts.get(("p", e.producer), 0), e.producer_seq + 1)
            nexts["r", e.record] = e.record_seq + 1
        insert = (pg_dialect.insert if self.dialect == "postgresql" else sqlite_dialect.insert)(_counters)
        # A producer number given explicitly may be lower than the counter: never move a counter back.
        keep = sa.func.greatest if self.dialect == "postgresql" else sa.func.max
        upsert = insert.on_conflict_do_update(
            index_elements=["log", "kind", "key"], set_={"next": keep(_counters.c.next, insert.excluded.next)}
        )
        rows = [{"log": self.log, "kind": k, "key": key, "next": n} for (k, key), n in nexts.items()]
        self.conn.execute(upsert, rows)


def _by_ids(conn: Connection, log: str, ids: list[str]) -> dict[str, LoggedEvent]:
    out: dict[str, LoggedEvent] = {}
    for i in range(0, len(ids), 500):
        for row in conn.execute(_Q_IDS, {"log": log, "ids": ids[i : i + 500]}):
            event = _from_row(row)
            out[event.id] = event
    return out


class _SqlBackend:
    def __init__(self, url: str, log: str) -> None:
        self.url = url
        self.log = log
        self.engine, self.dialect = _engine(url)
        for attempt in range(3):
            try:
                _metadata.create_all(self.engine, checkfirst=True)
                break
            except sa.exc.DBAPIError as exc:
                # Another process may have created the tables between the check and the create.
                if attempt == 2:
                    raise EventLogError(f"cannot open the event log at {url!r}: {exc.orig}") from exc
                time.sleep(0.05 * (attempt + 1))

    def transaction(self, body: Callable[[_Tx], _T]) -> _T:
        delay = 0.001
        for attempt in range(_RETRIES):
            try:
                with self.engine.begin() as conn:
                    return body(_SqlTx(conn, self.log, self.dialect))
            except sa.exc.DBAPIError as exc:
                if not _transient(exc) or attempt == _RETRIES - 1:
                    raise EventLogError(
                        f"event log {self.log!r} at {self.url!r} failed: {exc.orig}; nothing was appended "
                        "by the failed transaction, so retrying the same events is safe"
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.1)
        raise AssertionError("unreachable")

    def _query(self, statement: Any, params: dict[str, Any]) -> list[Any]:
        try:
            with self.engine.connect() as conn:
                return list(conn.execute(statement, params))
        except sa.exc.DBAPIError as exc:
            raise EventLogError(f"event log {self.log!r} at {self.url!r}: read failed: {exc.orig}") from exc

    def head(self) -> tuple[str, int] | None:
        rows = self._query(_Q_LOG, {"log": self.log})
        return None if not rows else (str(rows[0].machine), int(rows[0].length))

    def read(self, start: int, limit: int) -> list[LoggedEvent]:
        return [_from_row(r) for r in self._query(_Q_READ, {"log": self.log, "start": start, "limit": limit})]

    def by_ids(self, ids: list[str]) -> dict[str, LoggedEvent]:
        with self.engine.connect() as conn:
            return _by_ids(conn, self.log, ids)

    def read_record(self, record: str, through: int) -> list[LoggedEvent]:
        rows = self._query(_Q_RECORD, {"log": self.log, "record": record, "through": through})
        return [_from_row(r) for r in rows]

    def last_by_producer(self, producer: str) -> LoggedEvent | None:
        rows = self._query(_Q_LAST_BY_PRODUCER, {"log": self.log, "producer": producer})
        return _from_row(rows[0]) if rows else None

    def close(self) -> None:
        self.engine.dispose()


# -- memory backend (tests, benchmarks) ---------------------------------------------------------------------


@dataclass(eq=False)
class _MemoryLog:
    """One log held in process memory: the same contract, no durability."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    machine: str | None = None
    events: list[LoggedEvent] = field(default_factory=list)
    by_id: dict[str, LoggedEvent] = field(default_factory=dict)
    by_record: dict[str, list[LoggedEvent]] = field(default_factory=dict)
    by_producer_seq: dict[tuple[str, int], LoggedEvent] = field(default_factory=dict)
    producer_max: dict[str, int] = field(default_factory=dict)


_memory_logs: dict[tuple[str, str], _MemoryLog] = {}
_memory_lock = threading.Lock()


def _memory_backend(space: str, log: str) -> _MemoryBackend:
    if not space:
        return _MemoryBackend(_MemoryLog())
    with _memory_lock:
        return _MemoryBackend(_memory_logs.setdefault((space, log), _MemoryLog()))


class _MemoryTx:
    def __init__(self, mem: _MemoryLog) -> None:
        self.mem = mem

    def lock(self, machine: str) -> tuple[str, int]:
        if self.mem.machine is None:
            self.mem.machine = machine
        return self.mem.machine, len(self.mem.events)

    def by_ids(self, ids: list[str]) -> dict[str, LoggedEvent]:
        return {i: self.mem.by_id[i] for i in ids if i in self.mem.by_id}

    def producer_next(self, producers: list[str]) -> dict[str, int]:
        return {p: self.mem.producer_max.get(p, -1) + 1 for p in producers}

    def record_next(self, records: list[str]) -> dict[str, int]:
        return {r: len(self.mem.by_record.get(r, ())) for r in records}

    def holder(self, producer: str, seq: int) -> LoggedEvent | None:
        return self.mem.by_producer_seq.get((producer, seq))

    def write(self, events: list[LoggedEvent], length: int) -> None:
        mem = self.mem
        for e in events:
            assert e.producer_seq is not None and e.position == len(mem.events)
            mem.events.append(e)
            mem.by_id[e.id] = e
            mem.by_record.setdefault(e.record, []).append(e)
            mem.by_producer_seq[e.producer, e.producer_seq] = e
            mem.producer_max[e.producer] = max(mem.producer_max.get(e.producer, -1), e.producer_seq)
        assert len(mem.events) == length


class _MemoryBackend:
    def __init__(self, mem: _MemoryLog) -> None:
        self.mem = mem

    def transaction(self, body: Callable[[_Tx], _T]) -> _T:
        mem = self.mem
        with mem.lock:
            # A refused append leaves nothing behind: write() is its last step, and the binding made by
            # lock() is undone here.
            machine = mem.machine
            try:
                return body(_MemoryTx(mem))
            except BaseException:
                mem.machine = machine
                raise

    def head(self) -> tuple[str, int] | None:
        with self.mem.lock:
            return None if self.mem.machine is None else (self.mem.machine, len(self.mem.events))

    def read(self, start: int, limit: int) -> list[LoggedEvent]:
        with self.mem.lock:
            return self.mem.events[start : start + min(limit, len(self.mem.events))]

    def by_ids(self, ids: list[str]) -> dict[str, LoggedEvent]:
        with self.mem.lock:
            return {i: self.mem.by_id[i] for i in ids if i in self.mem.by_id}

    def read_record(self, record: str, through: int) -> list[LoggedEvent]:
        with self.mem.lock:
            return [e for e in self.mem.by_record.get(record, ()) if e.position <= through]

    def last_by_producer(self, producer: str) -> LoggedEvent | None:
        with self.mem.lock:
            top = self.mem.producer_max.get(producer)
            return None if top is None else self.mem.by_producer_seq[producer, top]

    def close(self) -> None:
        return None


def _to_row(log: str, e: LoggedEvent) -> dict[str, Any]:
    return {
        "log": log,
        "position": e.position,
        "event_id": e.id,
        "machine": e.machine,
        "record": e.record,
        "record_seq": e.record_seq,
        "event": e.event,
        "producer": e.producer,
        "producer_seq": e.producer_seq,
        "deps": json.dumps(list(e.deps), separators=(",", ":")),
        "after": json.dumps(list(e.after), separators=(",", ":")),
    }


def _from_row(row: Any) -> LoggedEvent:
    try:
        deps = json.loads(row.deps)
        return LoggedEvent(
            log=row.log,
            id=row.event_id,
            machine=row.machine,
            record=row.record,
            event=row.event,
            producer=row.producer,
            producer_seq=int(row.producer_seq),
            deps=tuple(deps),
            after=tuple(json.loads(row.after)),
            position=int(row.position),
            record_seq=int(row.record_seq),
        )
    except (ValueError, TypeError) as exc:
        raise LogCorrupted(f"unreadable event row at position {row.position}: {exc}") from exc
