"""The shared event log: one total, dense, append-only order of governed events.

A log holds events for exactly one machine (by digest). Its promises:

- **Dense, stable positions.** The n-th event appended to a log gets position n (from 0), assigned in the
  same transaction that writes it; positions never change and never skip. Concurrent appenders in any
  number of processes (SQLite file or PostgreSQL) serialize on the log, so there are no gaps and no
  duplicates. A reader that ever sees a gap raises `LogCorrupted` instead of returning a shorter list, and
  an append refuses a log whose positions an edit damaged at their ends (`_check_span`), writing nothing.
- **Idempotent by event id.** Appending an id that is already in the log with the same content is a no-op
  that returns the existing position; the same id with different content raises `EventConflict`. So is
  a second event claiming a producer sequence number that another event already holds.
- **Causality is recorded.** An event names the ids it causally depends on; each must already be in the
  log, so the log order respects every declared dependency. Each event also gets `record_seq`, its dense
  position among the events of the same record, which lets a replica receiving events out of order know
  exactly which earlier events of a record it has not seen yet.
- **One machine, and only its events.** `bind` (or the first append of a handle opened with `machine=`)
  records the machine's digest and event names; an event for any other digest raises `MachineMismatch`
  (changing the machine is a migration to a new log, never an accident), and an event name the machine
  does not have raises `InvalidInput`: once in the append-only log it would stop every replica forever.
- **Exact outcomes.** Each append stores a token of the call with its events, so a retry after a commit
  whose acknowledgement was lost reports `created=True` for what the call wrote.
- **Bounded waits.** Every call finishes or raises within about `timeout` (at most twice it: the try
  under way when it runs out may take that long again); transient failures are retried until then
  (`_logretry`), and readers never take the write lock.

URLs: a plain path or ``sqlite:///path`` (SQLite file, WAL, fsync on commit), ``postgresql://...``
(psycopg driver), ``memory://`` (held in this process only, not durable: for tests and benchmarks;
``memory://`` alone is private to the handle, ``memory://space`` is shared by every handle opened with
that space and log name in the process); the forms are those of `bide.open_store`, parsed by the same
`bide._url.parse_store_url`, and a bad one raises `LogURLError` with a hint. Every backend runs the same
append algorithm (`_append`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import secrets
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _quote  # C: one JSON string, non-ASCII kept as is
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from sqlalchemy.engine import Connection, Engine

from bide._dbfile import OpenedFile, connect_existing, other_names
from bide._sql import lost_in_pipeline, out_of_pipeline, pipeline
from bide._url import libpq_bounds, server_keepalives, without_password

from .._errors import GovernError
from . import _logschema as schema
from ._logretry import Backoff, classify, server_full
from ._logschema import LogFormatError

if TYPE_CHECKING:
    from ..certificate._certificate import Certificate
    from ..certificate._composed import ComposedCertificate
    from ..certificate._symbolic import SymbolicCertificate
    from ..machine._machine import Machine

    #: What a log can be bound by: the machine, or any certificate of it (`govern.read_certificate`).
    MachineOrCertificate = Machine | Certificate | SymbolicCertificate | ComposedCertificate

__all__ = [
    "Appended",
    "Event",
    "EventConflict",
    "EventLog",
    "EventLogError",
    "InvalidInput",
    "LogCorrupted",
    "LogFormatError",
    "LogTimeout",
    "LogURLError",
    "LoggedEvent",
    "MachineMismatch",
    "MissingDependency",
]

_NAME_MAX = schema.NAME_MAX
_INT64_MAX = 2**63 - 1  # the largest number a log's database holds (signed 64-bit integers)
_SEQ_MAX = _INT64_MAX - 1  # a producer_seq + 1 must still fit the signed 64-bit counter
_DIGEST = re.compile(r"[0-9a-f]{64}")
_LEAF_TAG = b"govern.event.v1\n"
_T = TypeVar("_T")


class EventLogError(GovernError):
    """The event log refused a request or could not complete it; the message says what to do."""


class InvalidInput(EventLogError, ValueError):
    """A field of an event, or an argument of a log call, is not acceptable: wrong type, empty, too long,
    a NUL character, not Unicode text, out of range, or an event name the log's machine does not have.
    `.field` names it; nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class LogURLError(InvalidInput):
    """The event log URL names no place to keep events (`.field` is "url"); the message says what to write
    instead. The forms are those of `bide.open_store`: a file path, ``sqlite:///path``,
    ``postgresql://...`` (``pip install 'bide[postgres]'``), ``memory://``."""

    def __init__(self, message: str) -> None:
        super().__init__("url", message)


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


class LogTimeout(EventLogError):
    """An operation could not finish within the log's `timeout`: another session held the log's lock,
    every pooled connection was busy, a statement ran too long, or the database stayed unreachable.
    Nothing partial was written; appending the same events again is safe (the log is idempotent by id)."""


def _name_problem(value: object) -> str | None:
    if type(value) is str and 0 < len(value) <= _NAME_MAX and value.isascii() and "\x00" not in value:
        return None  # the common case, decided without encoding the text
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value or len(value) > _NAME_MAX:
        return f"must be a non-empty string of at most {_NAME_MAX} characters, got {len(value)} characters"
    if "\x00" in value:
        return "must not contain a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be Unicode text, but holds a lone surrogate"
    return None


def _check_name(field: str, value: object) -> str:
    problem = _name_problem(value)
    if problem is not None:
        raise InvalidInput(field, f"{problem}: {value!r}")
    assert isinstance(value, str)
    return value


def _number_problem(value: object, top: int = _INT64_MAX) -> str | None:
    """What is wrong with `value` as a stored number (a position, a record's number; at most `top`), or
    None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, not {type(value).__name__}"
    if not 0 <= value <= top:
        return f"must be between 0 and {top} (2**63 - {2**63 - top}), got {value}"
    return None


def _check_digest(field: str, value: object) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise InvalidInput(
            field, f"must be a machine digest (64 lowercase hex digits, machine.digest): {value!r}"
        )
    return value


def _invalid(exc: ValidationError, what: str) -> InvalidInput:
    """The first problem pydantic found, as an `InvalidInput` naming the field."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or what
    message = str(error["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
    return InvalidInput(where, f"{message}{more}")


def _unwrapped(exc: ValidationError, what: str) -> InvalidInput:
    """The `InvalidInput` of a `model_validate`: pydantic runs a model's own `__init__` inside it, and wraps
    the `InvalidInput` that raises as a value error of the whole model."""
    cause = exc.errors()[0].get("ctx", {}).get("error")
    return cause if isinstance(cause, InvalidInput) else _invalid(exc, what)


class Event(BaseModel):
    """One governed event as a producer submits it: which machine, which record, which event, by whom.

    `id` names the event forever (appending it again is a no-op); `producer_seq` numbers the producer's own
    events (None: the log numbers them, in log order); `deps` are ids of events this one causally
    depends on (they must already be in the log). Names are 1 to 200 characters of Unicode text without
    NUL; `machine` is a machine digest. Any other value raises `InvalidInput` naming the field.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    machine: str
    record: str
    event: str
    producer: str
    producer_seq: int | None = Field(default=None, ge=0)
    deps: tuple[str, ...] = ()

    def __init__(self, **data: Any) -> None:
        if type(self) is Event:
            fields = _plain_event(data)
            if fields is not None:
                _set_fields(self, fields, set(data))
                return
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _invalid(exc, type(self).__name__) from None

    @field_validator("id", "machine", "record", "event", "producer", mode="before")
    @classmethod
    def _names(cls, value: object, info: ValidationInfo) -> str:
        problem = _name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        if info.field_name == "machine" and not _DIGEST.fullmatch(str(value)):
            raise ValueError(f"must be a machine digest (64 lowercase hex digits, machine.digest): {value!r}")
        return str(value)

    @field_validator("producer_seq", mode="before")
    @classmethod
    def _seq(cls, value: object) -> object:
        if value is None:
            return None
        problem = _number_problem(value, _SEQ_MAX)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("deps", mode="before")
    @classmethod
    def _deps(cls, value: object) -> tuple[str, ...]:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ValueError(f"must be a list of event ids, not {type(value).__name__}")
        for dep in value:
            problem = _name_problem(dep)
            if problem is not None:
                raise ValueError(f"a dependency id {problem}: {dep!r}")
        if len(set(value)) != len(value):
            raise ValueError(f"lists an id twice: {list(value)}")
        return tuple(value)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with `update`, validated as a new event is (pydantic's own copy takes any value
        unchecked, and a replica or a log relies on an event's fields being what validation admits)."""
        if not update:
            return super().model_copy(deep=deep)
        return type(self)(**{**self.model_dump(), **update})

    @classmethod
    def model_validate(cls, obj: Any, **options: Any) -> Self:
        """An event from a dict (a transport's message, say); a bad one raises `InvalidInput` naming the
        field, as the constructor does, not pydantic's own error."""
        try:
            return super().model_validate(obj, **options)
        except ValidationError as exc:
            raise _unwrapped(exc, cls.__name__) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **options: Any) -> Self:
        """An event from its JSON; a bad one raises `InvalidInput` naming the field."""
        try:
            return super().model_validate_json(json_data, **options)
        except ValidationError as exc:
            raise _unwrapped(exc, cls.__name__) from None

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> Self:  # type: ignore[override]
        """An event from `values`, validated as a new event is: pydantic's own `model_construct` takes any
        value unchecked, and one event the log stored unchecked would break every read of the log."""
        return cls(**values)

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
    record, and `after`, the positions of its dependencies (each lower than `position`). Each of these
    numbers is an integer from 0 to 2**63 - 1, what a database's 64-bit column holds."""

    log: str
    producer_seq: int = Field(ge=0)
    position: int = Field(ge=0)
    record_seq: int = Field(ge=0)
    after: tuple[int, ...] = ()

    @field_validator("position", "record_seq", mode="before")
    @classmethod
    def _stored_number(cls, value: object) -> object:
        problem = _number_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("after", mode="before")
    @classmethod
    def _after(cls, value: object) -> tuple[int, ...]:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ValueError(f"must be a list of log positions, not {type(value).__name__}")
        for position in value:
            problem = _number_problem(position)
            if problem is not None:
                raise ValueError(f"a dependency's position {problem}")
        return tuple(value)

    def leaf(self) -> bytes:
        """The event's leaf in the log's RFC 6962 Merkle tree: a domain tag and the canonical JSON of every
        field (sorted keys, no whitespace, UTF-8)."""
        from bide._canonical import json_text  # the one canonical encoder of both packages

        return _LEAF_TAG + json_text(self.model_dump(mode="json")).encode("utf-8")


_LOGGED_FIELDS = frozenset(LoggedEvent.model_fields)
_EVENT_FIELDS = frozenset(Event.model_fields)


def _set_fields(model: BaseModel, fields: dict[str, Any], fields_set: set[str]) -> None:
    """Give `model` (made by `__new__`) its field values as pydantic stores them: what `model_construct`
    does for these models (they have no aliases, extras, private attributes or post-init hook), without
    that method's generic loop over the fields, which cost more than all the rest of an append's own
    Python. Tests compare the two, so a pydantic that stores a model differently is caught."""
    object.__setattr__(model, "__dict__", fields)
    object.__setattr__(model, "__pydantic_fields_set__", fields_set)
    object.__setattr__(model, "__pydantic_extra__", None)
    object.__setattr__(model, "__pydantic_private__", None)


def _plain_names(values: Iterable[object]) -> bool:
    """True when every value is a name in `_name_problem`'s common case (decided without encoding)."""
    for value in values:
        if type(value) is not str or not 0 < len(value) <= _NAME_MAX:
            return False
        if not value.isascii() or "\x00" in value:
            return False
    return True


def _plain_event(data: dict[str, Any]) -> dict[str, Any] | None:
    """The values `Event(**data)` stores when every field is of the common, plainly valid kind (ASCII
    names, a plain int or None, a tuple or list of distinct ids); None when any is not, and pydantic's
    validation then decides and says what is wrong. This costs a fraction of pydantic's calls to the
    Python validators; a test compares the two on valid and invalid inputs."""
    if not data.keys() <= _EVENT_FIELDS:
        return None
    try:
        fields = {
            "id": data["id"],
            "machine": data["machine"],
            "record": data["record"],
            "event": data["event"],
            "producer": data["producer"],
            "producer_seq": data.get("producer_seq"),
            "deps": data.get("deps", ()),
        }
    except KeyError:
        return None
    seq, deps = fields["producer_seq"], fields["deps"]
    if seq is not None and (type(seq) is not int or not 0 <= seq <= _SEQ_MAX):
        return None
    if type(deps) is not tuple:
        if type(deps) is not list:
            return None
        deps = fields["deps"] = tuple(deps)
    if deps and (not _plain_names(deps) or len(set(deps)) != len(deps)):
        return None
    machine = fields["machine"]
    names = (fields["id"], machine, fields["record"], fields["event"], fields["producer"])
    if not _plain_names(names) or (machine not in _DIGESTS_SEEN and not _is_digest(machine)):
        return None
    return fields


_DIGESTS_SEEN: set[str] = set()  # machine digests found well formed (a process sees a handful)


def _is_digest(value: str) -> bool:
    if not _DIGEST.fullmatch(value):
        return False
    if len(_DIGESTS_SEEN) < 64:
        _DIGESTS_SEEN.add(value)
    return True


# The fields set of every event `_trusted` makes: all of them. One set serves them all (a set per event
# was about a third of a stored event's memory); the models are frozen, so pydantic never adds to it, and a
# copy of a model gets a set of its own.
_ALL_LOGGED_FIELDS = set(_LOGGED_FIELDS)


def _trusted(fields: dict[str, Any]) -> LoggedEvent:
    """A `LoggedEvent` of fields that are already valid, every one given (see `_set_fields`)."""
    event = LoggedEvent.__new__(LoggedEvent)
    _set_fields(event, fields, _ALL_LOGGED_FIELDS)
    return event


@dataclass(frozen=True, slots=True)
class Appended:
    """The outcome of an append: the stored event and whether this call wrote it (False: it was already
    there before the call). A commit whose acknowledgement was lost is retried and resolved by reading
    the event's writer back, so `created` is exact even then."""

    event: LoggedEvent
    created: bool


@dataclass(frozen=True, slots=True)
class _Identity:
    """What a log handle knows of its machine: the digest, and the names of the machine's events (None
    when it was given a bare digest)."""

    digest: str
    events: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class _Head:
    """The log's row: its machine, length, and event names (None: bound by layout 1, names unknown)."""

    machine: str
    length: int
    events: tuple[str, ...] | None


_P = sa.bindparam
_events, _counters = schema.events, schema.counters
# Statements are built once: building SQLAlchemy expressions per call costs more than running them.
# SQLite (layout 3) keeps no length: it is the highest position + 1, one lookup in the primary key. A
# highest that is not an integer (text, a float: an edited row; SQLite orders text above every number, so
# one anywhere in the column is its max) is read as it is, for `_head_of` to refuse: `+ 1` would have made
# a number of '9x' and the append written on past a gap it made itself.
_SQLITE_ONE_PAST = (
    "(SELECT CASE typeof(m) WHEN 'integer' THEN m + 1 ELSE m END FROM (SELECT max({column}) AS m {rest}))"
)
_SQLITE_LENGTH = (
    "coalesce("
    + _SQLITE_ONE_PAST.format(column='"position"', rest='FROM govern_events WHERE "log" = {log}')
    + ", 0)"
)
# The ends of a log's positions, for `_check_span`: the lowest, the highest and the one below it, one
# lookup each in the primary key. A row edited in below 0 or past the end with a gap, a first event or the
# one before the last deleted (on PostgreSQL, which keeps the length apart, the last too) shows there; a
# gap deeper in the log is found by readers, which read every position (an append would have to count the
# log to find it).
_FIRST = '(SELECT min("position") FROM govern_events WHERE "log" = {log})'
_LAST = '(SELECT max("position") FROM govern_events WHERE "log" = {log})'
_SECOND = (
    '(SELECT "position" FROM govern_events WHERE "log" = {log} ORDER BY "position" DESC LIMIT 1 OFFSET 1)'
)
# Whether a log holds any event: asked only of a log without its row (a new one, or a damaged one).
_ANY_EVENT = 'SELECT 1 FROM govern_events WHERE "log" = :log LIMIT 1'
_Q_ANY_EVENT = sa.text(_ANY_EVENT)
# PostgreSQL: the rows the planner believes the events table holds (-1: never counted).
_Q_TUPLES_BELIEVED = sa.text("SELECT reltuples FROM pg_class WHERE oid = 'govern_events'::regclass")
_FIRST_LOOK = 500  # the log's length at which `_SqlBackend.grown` first looks at the statistics
# The statistics session's bounds (ms): it waits at most this long for a lock, and its ANALYZE runs at
# most this long, so a DDL queued behind it waits about as long as behind autovacuum's, which gives way
# after deadlock_timeout (1 s by default). Then it gives up, and tries again later.
_STATISTICS_LOCK_MS = 200
_STATISTICS_STATEMENT_MS = 2000
# Seconds before a round of statistics that gave up is tried again (doubling after each, up to the last).
_STATISTICS_RETRY_FIRST, _STATISTICS_RETRY_LAST = 1.0, 300.0
_SPAN_COLUMNS = (
    f'{_FIRST.format(log=":log")} AS "first", {_SECOND.format(log=":log")} AS "second", '
    f'{_LAST.format(log=":log")} AS "last"'
)
_Q_LOG = sa.text(
    f'SELECT "machine", "length", "events", {_SPAN_COLUMNS} FROM govern_logs WHERE "name" = :log'
)
_Q_LOG_SQLITE = sa.text(
    f'SELECT "machine", {_SQLITE_LENGTH.format(log=":log")} AS "length", "events", {_SPAN_COLUMNS} '
    'FROM govern_logs WHERE "name" = :log'
)
_Q_READ = (
    sa.select(_events)
    .where(_events.c.log == _P("log"), _events.c.position >= _P("start"))
    .order_by(_events.c.position)
    .limit(_P("limit"))
)
_Q_IDS = sa.select(_events).where(
    _events.c.log == _P("log"), _events.c.event_id.in_(_P("ids", expanding=True))
)
# `position + 0`, not `position`: SQLite would otherwise search the primary key by (log, position <= n),
# reading the whole log before `through`, where the (log, record, record_seq) index finds the record's
# events alone (a record of 50 events in a log of 50,000: 10.7 ms -> 1.1 ms, most of it decoding).
_Q_RECORD = (
    sa.select(_events)
    .where(
        _events.c.log == _P("log"),
        _events.c.record == _P("record"),
        _events.c.record_seq >= _P("start"),
        (_events.c.position + sa.literal_column("0")) <= _P("through"),
    )
    .order_by(_events.c.record_seq)
)
_Q_WRITER = sa.select(_events.c.writer).where(
    _events.c.log == _P("log"), _events.c.event_id == _P("event_id")
)
_Q_LAST_BY_PRODUCER = (
    sa.select(_events)
    .where(_events.c.log == _P("log"), _events.c.producer == _P("producer"))
    .order_by(_events.c.producer_seq.desc())
    .limit(1)
)


@dataclass(slots=True)  # not frozen: made once per append, and a frozen dataclass is slower to make
class _Seen:
    """What an append reads before it writes, under the log's lock: the log's row, the stored events
    among the call's own ids (in full: a repeated id is compared field by field), the positions of the
    stored events among the other ids it depends on, and the next producer and record numbers (0 for a
    key never seen)."""

    head: _Head
    known: dict[str, LoggedEvent]
    positions: dict[str, int]
    producer_next: dict[str, int]
    record_next: dict[str, int]


class _Tx(Protocol):
    """What the append algorithm needs from a backend, inside one exclusive transaction on the log."""

    def lock(self) -> _Head | None: ...
    def read(self, ids: list[str], deps: list[str], producers: list[str], records: list[str]) -> _Seen | None:
        """Take the log's lock and read what an append needs (`_Seen`); None: the log has no row yet."""
        ...

    def orphaned(self) -> bool:
        """Whether the log, which has no row, holds events all the same (its row was deleted)."""
        ...

    def create(self, machine: str, names: tuple[str, ...]) -> _Head: ...
    def set_events(self, names: tuple[str, ...]) -> None: ...
    def written_by(self, writer: str, ids: list[str]) -> set[str]: ...
    def holder(self, producer: str, seq: int) -> LoggedEvent | None: ...
    def write(self, events: list[LoggedEvent], length: int, writer: str) -> None: ...


class _Backend(Protocol):
    def transaction(self, body: Callable[[_Tx], _T], *, pipelined: bool = False, what: str = "append") -> _T:
        """Run `body` in one exclusive transaction on the log. `pipelined`: the body writes fewer than
        `_COPY_FROM` events, so a PostgreSQL backend may send its statements and the COMMIT without
        waiting for each answer (only a fetch waits). `what` names the operation in its errors."""
        ...

    def head(self) -> _Head | None: ...
    def read(self, start: int, limit: int) -> list[LoggedEvent]: ...
    def by_ids(self, ids: list[str]) -> dict[str, LoggedEvent]: ...
    def read_record(self, record: str, start: int, through: int) -> list[LoggedEvent]: ...
    def last_by_producer(self, producer: str) -> LoggedEvent | None: ...
    def writer_of(self, event_id: str) -> str | None: ...

    def grown(self, length: int) -> None:
        """Told, after an append, that the log now holds `length` events (see `_SqlBackend.grown`)."""
        ...

    def close(self) -> None: ...


_NO_LIMIT = 2**62
_ROOT_PAGE = 5000  # events `EventLog.root` reads at a time
DEFAULT_TIMEOUT = 30.0
DEFAULT_POOL_SIZE = 8


class EventLog:
    """A named, append-only log of governed events (see the module docstring for every promise). The
    default URL is the SQLite file ``govern-events.db`` in the working directory.

    `machine` (a `Machine` or its certificate) tells this handle the log's machine, so its first append
    binds an empty log; `bind()` does the same explicitly. `timeout` (seconds) bounds every wait of one
    call: a lock held by another session, a free pooled connection, a statement, and the retries of a
    dropped connection; past it the call raises `LogTimeout`. At most `pool_size` connections are open
    at once (SQLite and PostgreSQL); on SQLite, which writes one transaction at a time, the threads of
    a handle append through one of them in turn.

    Thread-safe; open one `EventLog` per process (or share one between up to `pool_size` threads). A
    handle opened before os.fork() works in the child as if opened there: the child opens connections of
    its own, and the parent keeps its (on SQLite, fork while none of the parent's threads is appending:
    see docs/governed-agents.md).
    """

    def __init__(
        self,
        url: str = "sqlite:///govern-events.db",
        *,
        name: str = "main",
        machine: MachineOrCertificate | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        self.url = url
        self.name = _check_name("name", name)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86_400:
            raise InvalidInput("timeout", f"must be a number of seconds in (0, 86400], got {timeout!r}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or not 1 <= pool_size <= 1000:
            raise InvalidInput("pool_size", f"must be an integer from 1 to 1000, got {pool_size!r}")
        self.timeout = float(timeout)
        self._identity = None if machine is None else _identity_of(machine, None)
        # Each append call's writer token (see `_append`): random per handle, numbered per call.
        self._writer_prefix = secrets.token_hex(8)
        self._calls = itertools.count()
        self._backend: _Backend
        from bide._url import StoreURLError, parse_store_url  # the one parser, shared with bide.open_store

        try:
            where = parse_store_url(url, what="event log")
        except StoreURLError as exc:
            raise LogURLError(str(exc)) from None
        if where.kind == "sqlite" and os.path.isdir(where.path):
            raise LogURLError(f"{where.path!r} is a directory; give the path of the event log's file")
        if where.kind == "memory":
            self._backend = _memory_backend(where.name, self.name)
        else:
            self._backend = _SqlBackend(where.sqlalchemy_url, self.name, self.timeout, pool_size)
            # A handle dropped without close() lets go of its sessions at once: its backend and engine sit in
            # a reference cycle, which kept them open until the next full garbage collection.
            weakref.finalize(self, _SqlBackend.release, self._backend).atexit = False
        self._shown_url = without_password(url)  # what messages name: the URL without its password
        _OPEN_LOGS.add(self)

    def __repr__(self) -> str:
        return f"EventLog({self._shown_url!r}, name={self.name!r})"

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
        return None if head is None else head.machine

    def events(self) -> tuple[str, ...] | None:
        """The names of the events of the log's machine (the only names an append accepts), or None
        for a log not bound yet or bound by an older govern that did not record them."""
        head = self._backend.head()
        return None if head is None else head.events

    def length(self) -> int:
        """How many events the log holds (the next position)."""
        head = self._backend.head()
        return 0 if head is None else head.length

    def read(self, start: int = 0, limit: int | None = None) -> list[LoggedEvent]:
        """The events at positions `start, start+1, …` (at most `limit`), in log order, with no gaps.

        Raises `LogCorrupted` if a position is missing, or if the read stops before the log's end (a damaged
        file ends a read early without an error): a reader never gets a shorter list silently.
        """
        _check_count("start", start)
        if limit is not None:
            _check_count("limit", limit)
        out = self._backend.read(start, _NO_LIMIT if limit is None else limit)
        for offset, event in enumerate(out):
            if event.position != start + offset:
                raise LogCorrupted(
                    f"log {self.name!r} has a gap: expected position {start + offset}, found "
                    f"{event.position}; positions never skip, so its database was edited or is damaged: "
                    "restore it from a backup"
                )
        if limit is None or len(out) < limit:
            self._check_ends_at(start + len(out))
        return out

    def _check_ends_at(self, end: int) -> None:
        """Raise `LogCorrupted` when the log holds events past `end` that a read ending there did not get:
        a damaged database file ends a read early, at the page it cannot read, without an error. (Events
        appended after the read began are found by reading on from `end`.)"""
        if self.length() <= end:
            return
        more = self._backend.read(end, 1)
        if not more or more[0].position != end:
            raise LogCorrupted(
                f"log {self.name!r} holds {self.length()} events, but a read stopped at position {end}: its "
                "database is damaged (on SQLite, `PRAGMA quick_check` says where); restore it from a backup"
            )

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
        _check_name("event_id", event_id)
        return self._backend.by_ids([event_id]).get(event_id)

    def _stored(self, ids: list[str]) -> dict[str, LoggedEvent]:
        """The stored events of these ids (names already checked, as a `LoggedEvent`'s are), by id: the
        events a replica compares redelivered copies with, in one read."""
        return self._backend.by_ids(ids)

    def read_record(self, record: str, *, through: int | None = None, start: int = 0) -> list[LoggedEvent]:
        """The events of one record in log order (those at positions <= `through`, when given; from its
        event number `start` on), with no gaps in their `record_seq`, which rises with their positions
        (else `LogCorrupted`). A reader that folded the record's first `start` events reads only the
        rest."""
        _check_name("record", record)
        _check_count("start", start)
        if through is not None:
            _check_count("through", through)
        out = self._backend.read_record(record, start, _NO_LIMIT if through is None else through)
        previous = -1
        for seq, event in enumerate(out, start):
            if event.record_seq != seq:
                raise LogCorrupted(
                    f"record {record!r} of log {self.name!r} lacks its event number {seq}; a record's "
                    "numbers never skip, so its database was edited or is damaged: restore it from a backup"
                )
            if event.position <= previous:
                raise LogCorrupted(
                    f"record {record!r} of log {self.name!r} holds its event number {seq} at position "
                    f"{event.position}, before its event number {seq - 1} (at position {previous}); a "
                    "record's numbers rise in log order, so its database was edited or is damaged: restore "
                    "it from a backup"
                )
            previous = event.position
        return out

    def last_by_producer(self, producer: str) -> LoggedEvent | None:
        """The producer's latest event (highest producer_seq), or None."""
        _check_name("producer", producer)
        return self._backend.last_by_producer(producer)

    def root(self, size: int | None = None) -> str:
        """The RFC 6962 Merkle root (hex) over the leaves (`LoggedEvent.leaf`) of the first `size` events
        (default: the log's `length()` when the call begins). Sign it with that size
        (`bide.audit.sign_head`) to commit to the log: while others append, read `size = log.length()`
        first and pass it, so that the size and the root you sign describe the same events. A replica
        built with `track_root=True` recomputes the root from the events it applied."""
        from bide.audit import EMPTY_ROOT, leaf_hash, node_hash  # here: only auditing needs bide

        if size is None:
            size = self.length()  # one definite size: appends made while the pages are read are not in it
        _check_count("size", size)
        # Page by page, keeping only the roots of the complete subtrees of the leaves so far (one per bit
        # of their count, largest first): memory O(log n), where a million events read at once took 2 GB.
        complete: list[tuple[int, bytes]] = []
        count = 0
        while count < size:
            want = min(_ROOT_PAGE, size - count)
            page = self.read(count, want)
            for event in page:
                leaves, node = 1, leaf_hash(event.leaf())
                while complete and complete[-1][0] == leaves:
                    leaves, node = 2 * leaves, node_hash(complete.pop()[1], node)
                complete.append((leaves, node))
            count += len(page)
            if len(page) < want:
                break
        if count != size:
            raise InvalidInput("size", f"log {self.name!r} holds {count} events, fewer than size={size}")
        if not complete:
            return EMPTY_ROOT.hex()
        # RFC 6962: the root joins the subtrees from the right (the largest power of two splits first).
        root = complete[-1][1]
        for _, left in reversed(complete[:-1]):
            root = node_hash(left, root)
        return root.hex()

    # -- writing -----------------------------------------------------------------------------------------

    def bind(self, machine: MachineOrCertificate | str, events: Iterable[str] | None = None) -> None:
        """Bind the log to a machine: a `Machine`, its certificate (any `govern.certify` makes or
        `govern.read_certificate` reads: table, symbolic or composed; binding by either is the same
        binding), or a machine digest with the machine's event names in `events`. An empty log records
        the digest and the names; a log bound to the same machine is left as it is (one bound by an
        older govern records the names now); a log bound to another machine raises `MachineMismatch`.
        Later appends on this handle use it too.

        A log already bound to the machine is confirmed by a read, without the log's write lock: a writer
        holding it (or paused inside an append) does not delay a bind that has nothing to write."""
        identity = _identity_of(machine, events)
        if not _bound_already(self.name, self._backend.head(), identity):
            self._backend.transaction(lambda tx: _bind(self.name, tx, identity), what="bind")
        self._identity = identity

    def append(self, event: Event) -> Appended:
        """Append one event (idempotent by id); see the module docstring for every rule it enforces."""
        if isinstance(event, Event):
            return self._append_items([event])[0]
        return self.append_many([event])[0]

    def append_many(self, events: Sequence[Event]) -> list[Appended]:
        """Append several events in order, in one transaction: all of them are stored or none is."""
        items: list[Event] = []
        for i, e in enumerate(events):
            if isinstance(e, Event):
                items.append(e)
            elif isinstance(e, Mapping):
                items.append(Event(**e))  # raises InvalidInput naming the field
            else:
                raise InvalidInput(f"events[{i}]", f"must be an Event or a mapping of its fields, not {e!r}")
        if not items:
            return []
        machines = {e.machine for e in items}
        if len(machines) != 1:
            raise MachineMismatch(f"one append mixes events of machines {sorted(machines)}")
        return self._append_items(items)

    def _append_items(self, items: list[Event], writer: str | None = None) -> list[Appended]:
        """`append_many` of events already known to be `Event`s of one machine (at least one). `writer`:
        the call's token (`_new_writer`), for a caller that asks `_wrote` after a failure; made here by
        default."""
        identity = self._identity
        if identity is not None and identity.events is not None and identity.digest == items[0].machine:
            _check_events(self.name, identity.events, items)  # refused before touching the database
        if writer is None:
            writer = self._new_writer()
        appended = self._backend.transaction(
            lambda tx: _append(self.name, tx, items, writer, identity), pipelined=len(items) < _COPY_FROM
        )
        self._backend.grown(max(a.event.position for a in appended) + 1)
        return appended

    def _forked(self) -> None:
        """In a child just forked: a writer token prefix of its own (else two children's calls would carry
        the same tokens, and each would take the other's writes for its own), and connections of its own."""
        self._writer_prefix = secrets.token_hex(8)
        if isinstance(self._backend, _SqlBackend):
            self._backend.forked()

    def _new_writer(self) -> str:
        """A token unique to one append call (at most 32 characters), stored with the events it writes."""
        return f"{self._writer_prefix}{next(self._calls):x}"

    def _wrote(self, writer: str, event_id: str) -> bool:
        """Whether the stored event `event_id` was written by the append call of token `writer`: after that
        call failed (a lost acknowledgement, a wait that ran out) it may have committed, or an earlier call
        may have written the event. Raises `EventLogError` when the log cannot be read."""
        _check_name("event_id", event_id)
        return self._backend.writer_of(event_id) == writer


_OPEN_LOGS: weakref.WeakSet[EventLog] = weakref.WeakSet()


def _forget_parent_connections() -> None:
    # Run in the child, before any of its threads: the handles it inherited stop using the parent's
    # connections (one child read another's answers on a shared PostgreSQL connection).
    for log in list(_OPEN_LOGS):
        log._forked()


os.register_at_fork(after_in_child=_forget_parent_connections)


def _check_count(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _NO_LIMIT:
        raise InvalidInput(field, f"must be an integer from 0 to 2**62 - 1, got {value!r}")


def _identity_of(machine: object, events: Iterable[str] | None) -> _Identity:
    """The digest and event names of `machine`: a Machine, a certificate, or a digest with `events`."""
    from ..certificate._certificate import Certificate
    from ..certificate._symbolic import SymbolicCertificate
    from ..machine._machine import Machine, rules_digest, symbolic_digest

    if isinstance(machine, Machine):
        if events is not None:
            raise InvalidInput("events", "give events only with a digest: a Machine knows its own events")
        return _Identity(machine.digest, _loggable(machine.events))
    if isinstance(machine, Certificate):
        if events is not None:
            raise InvalidInput("events", "give events only with a digest: a Certificate lists its events")
        return _Identity(_certified_digest(machine), _loggable(e.name for e in machine.model.machine.events))
    if isinstance(machine, SymbolicCertificate):  # a machine verified symbolically: no tables
        if events is not None:
            raise InvalidInput("events", "give events only with a digest: a Certificate lists its events")
        digest = symbolic_digest(rules_digest(machine.document()["machine"]))
        return _Identity(digest, _loggable(e.name for e in machine.model.machine.events))
    from ..certificate._composed import ComposedCertificate

    if isinstance(machine, ComposedCertificate):  # a machine built by components
        if events is not None:
            raise InvalidInput("events", "give events only with a digest: a Certificate lists its events")
        return _Identity(_composed_digest(machine), _loggable(e.name for e in machine.model.machine.events))
    if isinstance(machine, str):
        digest = _check_digest("machine", machine)
        if events is None:
            return _Identity(digest, None)  # enough to confirm a binding; not to make one
        if isinstance(events, (str, bytes)):
            raise InvalidInput("events", f"must be a list of event names, not one string: {events!r}")
        names = tuple(_check_name("events", e) for e in events)
        if not names or len(set(names)) != len(names):
            raise InvalidInput("events", f"must name each event of the machine once: {list(names)}")
        return _Identity(digest, names)
    raise InvalidInput(
        "machine",
        f"must be a govern.Machine, its certificate (govern.certify, govern.read_certificate) or a digest, "
        f"not {type(machine).__name__}",
    )


def _loggable(names: Iterable[str]) -> tuple[str, ...]:
    """A machine's event names, each one the log can store (a family's instance names can be long): one
    that cannot is refused when the log is bound, not at the first append."""
    out = tuple(names)
    for name in out:
        problem = _name_problem(name)
        if problem is not None:
            raise InvalidInput(
                "events",
                f"the machine's event {name[:60]!r}... {problem}, so no log can hold its events: shorten "
                "the event's (or its family's parameter values') names",
            )
    return out


def _certified_digest(certificate: Certificate) -> str:
    """The digest of the machine a certificate certifies (what `Machine.digest` gives for that machine),
    recomputed from the certificate's rules and tables."""
    import numpy as np

    from ..machine._machine import RawTables, machine_digest, rules_digest

    rules = certificate.document()["machine"]
    n, e = len(certificate.valid), len(rules["events"])
    repair = certificate.repair.astype(np.int32)
    raw = RawTables(
        certificate.valid.astype(bool), repair, certificate.apply.reshape(e, n).astype(np.int32), repair
    )
    return machine_digest(rules_digest(rules), raw)


def _composed_digest(certificate: ComposedCertificate) -> str:
    """The digest of the machine a composed certificate certifies (what `Machine.digest` gives)."""
    import numpy as np

    from ..machine._composed import composed_digest
    from ..machine._machine import RawTables, rules_digest

    parts = []
    for part in certificate.components:
        n, e = len(part.valid), len(part.model.machine.events)
        repair = part.repair.astype(np.int32)
        apply = part.apply.reshape(e, n).astype(np.int32)
        parts.append(RawTables(part.valid.astype(bool), repair, apply, repair))
    return composed_digest(rules_digest(certificate.document()["machine"]), parts)


def _bound_already(log: str, head: _Head | None, identity: _Identity) -> bool:
    """Whether a log whose row reads `head` is bound to `identity` already, so a bind has nothing to write.
    A log's machine never changes once recorded, nor do its event names once recorded, so a read is enough
    to confirm a binding or refuse another machine's; anything else is decided under the lock (`_bind`)."""
    if head is None or head.events is None:
        return False  # unbound, or bound by an older govern without the names: the bind writes
    _check_machine(log, head, identity.digest)
    return identity.events is None or set(head.events) == set(identity.events)


def _bind(log: str, tx: _Tx, identity: _Identity) -> None:
    head = tx.lock()
    if head is not None:
        _check_machine(log, head, identity.digest)
    if identity.events is None:
        if head is None or head.events is None:
            raise InvalidInput(
                "events",
                f"log {log!r} does not know its machine's event names yet, and a digest alone does not "
                "tell them: bind(machine) with the Machine or its Certificate, or bind(digest, events=...)",
            )
        return
    if head is None:
        # Another binder may have created the log's row meanwhile (on PostgreSQL, FOR UPDATE locks no row
        # that does not exist yet): the row that stands is the log's, and names its machine.
        head = tx.create(identity.digest, identity.events)
        _check_machine(log, head, identity.digest)
    if head.events is None:
        tx.set_events(identity.events)
    elif set(head.events) != set(identity.events):
        raise InvalidInput(
            "events",
            f"log {log!r} records the events {list(head.events)} for machine {head.machine}, not "
            f"{list(identity.events)}: the digest and the event names given do not belong together",
        )


_SHOWN_IDS = 5  # the ids an error message lists: an event may have any number of dependencies


def _some(ids: list[str]) -> str:
    """`ids` for an error message: the first few, and how many more there are."""
    if len(ids) <= _SHOWN_IDS:
        return str(ids)
    return f"{ids[:_SHOWN_IDS]} and {len(ids) - _SHOWN_IDS} more"


def _check_machine(log: str, head: _Head, machine: str) -> None:
    if head.machine != machine:
        raise MachineMismatch(
            f"log {log!r} holds events of machine {head.machine}, not {machine}: a machine change is a "
            "migration; open a new log for the new machine"
        )


@functools.lru_cache(maxsize=64)
def _allowed(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(names)


def _check_events(log: str, names: tuple[str, ...], items: list[Event]) -> None:
    allowed = _allowed(names)
    for event in items:
        if event.event not in allowed:
            raise InvalidInput(
                "event",
                f"event {event.id!r} names {event.event!r}, which the machine of log {log!r} does not have "
                f"(its events: {', '.join(names)}); nothing was appended",
            )


def _append(log: str, tx: _Tx, items: list[Event], writer: str, identity: _Identity | None) -> list[Appended]:
    """The append algorithm, the same on every backend; runs inside the backend's exclusive transaction.

    `writer` is a token unique to this append call, stored with every event it writes: when a commit's
    acknowledgement is lost and the call runs again, the events it finds under its own token are the ones
    it wrote, so `created` stays exact."""
    machine = items[0].machine
    if len(items) == 1:  # the common call: its keys without the de-duplication a batch needs
        (one,) = items
        ids, producers, records = [one.id], [one.producer], [one.record]
        deps = [d for d in one.deps if d != one.id]
    else:
        ids = list({e.id: None for e in items})
        own = set(ids)
        deps = list({d: None for e in items for d in e.deps if d not in own})
        producers = list({e.producer: None for e in items})
        records = list({e.record: None for e in items})
    seen = tx.read(ids, deps, producers, records)
    if seen is None:
        # (`create` refuses a log whose row was deleted, and so does this, before "not bound": events
        # without a row are a creator's that committed since the read, or a log whose row was deleted.)
        if identity is None or identity.events is None or identity.digest != machine:
            if not tx.orphaned():
                raise EventLogError(
                    f"log {log!r} is not bound to a machine yet, and this handle does not know machine "
                    f"{machine}: bind it first with log.bind(machine) (the Machine or its Certificate), or "
                    "open it with EventLog(url, machine=machine)"
                )
        else:
            tx.create(identity.digest, identity.events)
        seen = tx.read(ids, deps, producers, records)  # a concurrent creator may have appended first
        if seen is None:
            raise _orphaned(log)
    head = seen.head
    _check_machine(log, head, machine)
    names = head.events
    if names is None:
        if identity is None or identity.events is None or identity.digest != head.machine:
            raise EventLogError(
                f"log {log!r} was bound by an older govern that did not record its machine's event names, "
                "so it cannot check them: call log.bind(machine) once with the Machine or its Certificate "
                "(or open it with EventLog(url, machine=machine)) and append again"
            )
        tx.set_events(identity.events)
        names = identity.events
    _check_events(log, names, items)
    known = seen.known
    again = [e.id for e in items if e.id in known]
    mine = tx.written_by(writer, again) if again else set()
    producer_next, record_next = dict(seen.producer_next), dict(seen.record_next)
    producer_stored = seen.producer_next
    length = head.length
    fresh: dict[str, LoggedEvent] = {}
    numbered: dict[tuple[str, int], LoggedEvent] = {}  # the events of this call by (producer, seq)
    out: list[Appended] = []
    for event in items:
        event_id, producer, record = event.id, event.producer, event.record
        existing = fresh.get(event_id) or known.get(event_id)
        if existing is not None:
            if not existing.same_content(event):
                # A copy earlier in this call is not in the log: the call appends all of its events or none.
                twice = event_id in fresh
                where = "given twice in this call" if twice else f"already at position {existing.position}"
                raise EventConflict(
                    f"event id {event_id!r} is {where} with different content ({existing.event!r} on "
                    f"{existing.record!r} by {existing.producer!r}); an event id names one event forever"
                    + ("; nothing was appended" if twice else "")
                )
            out.append(Appended(existing, event_id in mine))
            mine.discard(event_id)  # a second copy in the same batch was not written by it
            continue
        seq = event.producer_seq
        if seq is None:
            seq = producer_next[producer]
            if seq > _SEQ_MAX:  # the stored counter must stay a signed 64-bit integer, on every backend
                raise InvalidInput(
                    "producer_seq",
                    f"producer {producer!r} has used its last sequence number ({_SEQ_MAX}); nothing was "
                    "appended: append its further events under another producer name",
                )
        holder = None
        if seq < producer_stored[producer]:
            holder = tx.holder(producer, seq)
        holder = holder or numbered.get((producer, seq))
        if holder is not None:
            raise EventConflict(
                f"producer {producer!r} already used sequence number {seq} for event {holder.id!r}; "
                "each producer numbers its events uniquely"
            )
        if seq >= producer_next[producer]:
            producer_next[producer] = seq + 1
        after: list[int] = []
        missing: list[str] = []
        event_deps = event.deps
        for dep in event_deps:
            found = fresh.get(dep) or known.get(dep)
            position = seen.positions.get(dep) if found is None else found.position
            if position is None:
                missing.append(dep)
            else:
                after.append(position)
        if missing:
            raise MissingDependency(
                f"event {event_id!r} depends on {_some(missing)}, which are not in log {log!r}; "
                "append dependencies first"
            )
        record_seq = record_next[record]
        # An append never gets near these, one event per number: only an edited log does.
        if length > _SEQ_MAX or record_seq > _SEQ_MAX:
            used = f"log {log!r}" if length > _SEQ_MAX else f"record {record!r} of log {log!r}"
            raise LogCorrupted(
                f"{used} has used its last number ({_SEQ_MAX}), which only an edited or damaged log "
                "does (each number is one appended event); nothing was appended: restore the log from a "
                "backup"
            )
        # Every field was validated when the Event was made, or computed here: no second validation.
        logged = _trusted(
            {
                "id": event_id,
                "machine": event.machine,
                "record": record,
                "event": event.event,
                "producer": producer,
                "producer_seq": seq,
                "deps": event_deps,
                "log": log,
                "position": length,
                "record_seq": record_seq,
                "after": tuple(sorted(after)) if len(after) > 1 else tuple(after),
            }
        )
        record_next[record] += 1
        length += 1
        fresh[event_id] = logged
        numbered[producer, seq] = logged
        out.append(Appended(logged, True))
    if fresh:
        tx.write(list(fresh.values()), length, writer)
    return out


# -- SQL backend (SQLite file, PostgreSQL) -------------------------------------------------------------------


def _engine(
    url: str, timeout: float, pool_size: int, sqlite_creator: Callable[[], Any]
) -> tuple[Engine, str]:
    """An engine for `url` (a SQLAlchemy URL from `bide._url.parse_store_url`), and its dialect ("sqlite" or
    "postgresql"). Every wait is bounded by `timeout`: the pool checkout, PostgreSQL's lock_timeout and
    statement_timeout, each connection attempt and a network gone silent (`libpq_bounds`), SQLite's busy
    timeout. SQLite connections come from `sqlite_creator`."""
    pool = {"pool_size": pool_size, "max_overflow": 0, "pool_timeout": timeout}
    ms = int(timeout * 1000)
    if url.startswith("postgresql"):
        return sa.create_engine(url, connect_args=_postgres_session(url, timeout), **pool), "postgresql"
    engine = sa.create_engine(url, creator=sqlite_creator, **pool)

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={ms}")
        cursor.execute("PRAGMA synchronous=FULL")  # (WAL: `_SqlBackend._use_wal`, once the file is a log)
        cursor.close()

    # The driver's own transaction handling would start a write transaction lazily, which lets two appenders
    # both read the old length: a writer takes the write lock with BEGIN IMMEDIATE before its first read. A
    # reader begins a deferred transaction instead: a WAL snapshot that never waits for writers.
    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql(
            "BEGIN" if conn.get_execution_options().get("govern_read") else "BEGIN IMMEDIATE"
        )

    return engine, "sqlite"


def _postgres_session(url: str, timeout: float) -> dict[str, Any]:
    """The driver's connect arguments for a PostgreSQL session of the log: the URL's own server options,
    then bounds on every wait (see `_engine`)."""
    ms = int(timeout * 1000)
    query = sa.engine.make_url(url).query
    # The URL's own server options (a search_path naming a tenant's schema, say) are kept, before ours.
    given = query.get("options", ())
    # A session idle in a transaction past half the timeout is ended by the server: a process paused
    # holding the log's lock frees it before the other writers' lock waits run out (see `_SqlTx.read`).
    # And the server's keepalives end the session of an appender whose host died or was cut off between
    # its writes and its COMMIT (waiting "active" on ClientRead, where no session timeout applies),
    # freeing the log's lock within about the timeout instead of the system's two hours.
    keepalives = [f"-c {name}={value}" for name, value in server_keepalives(timeout, given).items()]
    options = " ".join([*([given] if isinstance(given, str) else given), f"-c lock_timeout={ms}",
                        f"-c statement_timeout={ms}",
                        f"-c idle_in_transaction_session_timeout={max(1, ms // 2)}",
                        *keepalives])  # fmt: skip
    return {**libpq_bounds(query, timeout), "options": options}


# Driver-level SQL for the append transaction. SQLAlchemy's per-statement work (compiling the cache key,
# building result rows) cost several times what SQLite itself does, so the append runs on the driver's
# cursor, in as few statements as each database allows: on SQLite, BEGIN IMMEDIATE has already taken the
# lock and one statement reads everything the append needs; on PostgreSQL the lock (SELECT ... FOR UPDATE)
# comes first and one statement reads the rest, in a snapshot taken after the lock was granted. A list of
# keys is one parameter (a JSON array read by json_each on SQLite, an array on PostgreSQL), so a
# statement's text is the same whatever the number of keys: the driver parses it once and PostgreSQL
# prepares it once. Every column is quoted, since some ("position", "after", "key", "next") are words one
# of the databases reserves.
_EVENT_COLUMNS = (
    "log",
    "position",
    "event_id",
    "machine",
    "record",
    "record_seq",
    "event",
    "producer",
    "producer_seq",
    "deps",
    "after",
    "writer",
)
_READ_COLUMNS = _EVENT_COLUMNS[:-1]  # what a reader gets back (the writer token stays in the database)
_EVENT_SELECT = "SELECT " + ", ".join(f'"{c}"' for c in _READ_COLUMNS) + " FROM govern_events"
_ROWS_CHUNK = 80  # rows per multi-row INSERT: 80 * 12 parameters stay under SQLite's old limit of 999
_COPY_FROM = 16  # PostgreSQL writes a batch of at least this many events by COPY, a smaller one by INSERT


@dataclass(frozen=True, slots=True)
class _Dialect:
    """The SQL of the append transaction for one database."""

    name: str
    lock: str
    read: str
    create: str
    set_events: str
    written_by: str
    holder: str
    orphans: str


def _read_sql(dialect: str) -> str:
    """The statement that reads what an append needs (`_Seen`), as rows of one shape: a tag, then the
    columns of `_READ_COLUMNS`. Tags: 'h' the log's row (SQLite only: its length in "position", its
    machine, its event names in "deps", its first and second highest positions in "record_seq" and
    "producer_seq"), 'b' the ends of its positions (PostgreSQL only, whose length is the row's: the first,
    second highest and highest in "record_seq", "producer_seq" and "position"; `_check_span`), 'e' a stored
    event among the call's own ids, 'd' the position of a stored event among its other dependencies, 'p' /
    'r' the next number of a producer / record (the key in "event_id", the number in "position"; on
    PostgreSQL also its counter in "producer_seq" and the number before the counter's in "record_seq", if
    an event holds it: `_counter`, `_number_before`, `_check_counter`; on SQLite `_sqlite_next_number`).
    Each number is one to three index lookups, whatever the log's size (an `IN` over the pairs of the
    counters' key would scan every counter of the log)."""
    sqlite = dialect == "sqlite"
    log = ":log" if sqlite else "%(log)s"

    def stored(name: str) -> str:
        """The stored events whose ids are in the list parameter `name`, by a join driven by the list (on
        SQLite `IN (SELECT ...)` would first copy the list into a temporary index; json_each's own
        columns, key and value among them, are named unlike any column read here). On PostgreSQL each id
        is one lookup in the log's unique id index, as the server plans it once it has statistics on the
        tables (`_SqlBackend.grown`): with `= ANY(list)`, the generic plan it keeps for this prepared
        statement scanned every event of the log and compared each with the whole list (without
        statistics, the choice between the indexes that begin with "log" is the planner's guess)."""
        if sqlite:
            where = f'"log" = {log} AND "event_id" = k.value'
            return f"json_each(:{name}) AS k CROSS JOIN govern_events WHERE {where}"
        return (
            f"{each(name)} CROSS JOIN LATERAL ({_EVENT_SELECT} "
            f'WHERE "log" = {log} AND "event_id" = k.value LIMIT 1) AS stored'
        )

    def each(name: str) -> str:
        return f"json_each(:{name}) AS k" if sqlite else f"unnest(%({name})b::text[]) AS k(value)"

    def row(tag: str, **values: str) -> str:
        return f"SELECT '{tag}', " + ", ".join(values.get(c, "NULL") for c in _READ_COLUMNS)

    def numbered(kind: str, keys: str) -> str:
        if sqlite:
            return row(kind, position=_sqlite_next_number(log, kind, "k.value"), event_id="k.value") + (
                f" FROM {each(keys)}"
            )
        next_number = f'coalesce(c."next", {_highest(log, kind, "k.value")}, 0)'
        columns = {"record_seq": _number_before(log, kind), "producer_seq": 'c."next"'}
        return row(kind, position=next_number, event_id="k.value", **columns) + (
            f" FROM {each(keys)} LEFT JOIN LATERAL {_counter(log, kind)} AS c ON true"
        )

    parts = [
        row("e", **{c: f'"{c}"' for c in _READ_COLUMNS}) + f" FROM {stored('ids')}",
        row("d", position='"position"', event_id='"event_id"') + f" FROM {stored('deps')}",
        numbered("p", "producers"),
        numbered("r", "records"),
    ]
    first, second = _FIRST.format(log=log), _SECOND.format(log=log)
    if sqlite:
        length = _SQLITE_LENGTH.format(log=log)
        head = row(
            "h", position=length, machine='"machine"', deps='"events"', record_seq=first, producer_seq=second
        )
        parts.insert(0, f'{head} FROM govern_logs WHERE "name" = {log}')
    else:
        parts.append(row("b", position=_LAST.format(log=log), record_seq=first, producer_seq=second))
    return " UNION ALL ".join(parts)


def _counter(log: str, kind: str) -> str:
    """PostgreSQL: the counter of the producer (`kind` 'p') or record ('r') `k.value`, as a lateral
    subquery giving its next number as "next" (no row for a key without one, whose next number is then one
    past the highest stored, or 0). `LIMIT 1` keeps it one primary key lookup per key: a plain join may be
    planned as a scan of every counter of the log."""
    return (
        f'(SELECT "next" FROM govern_counters WHERE "log" = {log} AND "kind" = \'{kind}\' '
        'AND "key" = k.value LIMIT 1)'
    )


def _number_before(log: str, kind: str) -> str:
    """PostgreSQL: the number one below the counter `c."next"` of the producer or record `k.value` if an
    event of the key holds it, else NULL (also for no counter, or one of 0): one lookup in the key's
    unique index. Every event numbered from a counter leaves it one past the number it took, so a
    counter whose number before is not stored is ahead of the events (`_check_counter`)."""
    column, number = _NUMBERED[kind]
    return (
        f'CASE WHEN c."next" > 0 THEN (SELECT "{number}" FROM govern_events WHERE "log" = {log} AND '
        f'"{column}" = k.value AND "{number}" = c."next" - 1) END'
    )


def _sqlite_next_number(log: str, kind: str, key: str) -> str:
    """The next number of a producer (`kind` 'p') or record ('r') `key` on SQLite (layout 3, no
    counters): one past the highest number stored, or 0."""
    return f"coalesce({_highest(log, kind, key, sqlite=True)}, 0)"


# The column that names a producer ('p') or record ('r'), and the column of its numbers.
_NUMBERED = {"p": ("producer", "producer_seq"), "r": ("record", "record_seq")}


def _highest(log: str, kind: str, key: str, *, sqlite: bool = False) -> str:
    """One past the highest number stored for a producer or record `key` (NULL for none): the last entry
    of the key in its (log, producer, producer_seq) or (log, record, record_seq) index. On SQLite a
    highest that is not an integer is given as it is (see `_SQLITE_ONE_PAST`)."""
    column, number = _NUMBERED[kind]
    rest = f'FROM govern_events WHERE "log" = {log} AND "{column}" = {key}'
    if sqlite:
        return _SQLITE_ONE_PAST.format(column=f'"{number}"', rest=rest)
    return f'(SELECT max("{number}") + 1 {rest})'


# What a one-event append reads on SQLite, as one row: the log's length, machine and event names, the
# position of the event's id if it is stored already, the positions of its stored dependencies (a JSON
# object by id), the next numbers of its producer and record, and the log's first and second highest
# positions (`_check_span`: two more lookups, about 1.5 µs). `_read_sql` answers the general case
# in rows of many columns, most of them NULL, which cost more to build than this whole statement.
_SQLITE_READ_ONE = (
    f'SELECT {_SQLITE_LENGTH.format(log=":log")}, "machine", "events", '
    '(SELECT "position" FROM govern_events WHERE "log" = :log AND "event_id" = :id), '
    '(SELECT json_group_object(k.value, "position") FROM json_each(:deps) AS k CROSS JOIN govern_events '
    'WHERE "log" = :log AND "event_id" = k.value), '
    f"{_sqlite_next_number(':log', 'p', ':producer')}, {_sqlite_next_number(':log', 'r', ':record')}, "
    f'{_FIRST.format(log=":log")}, {_SECOND.format(log=":log")} FROM govern_logs WHERE "name" = :log'
)


def _dialect(name: str) -> _Dialect:
    def sql(text: str) -> str:
        return text if name == "sqlite" else text.replace("?", "%s")

    length = _SQLITE_LENGTH.format(log="?") if name == "sqlite" else '"length"'
    lock = f'SELECT "machine", {length}, "events" FROM govern_logs WHERE "name" = ?'
    written_by = 'SELECT "event_id" FROM govern_events WHERE "log" = ? AND "writer" = ? AND '
    written_by += (
        '"event_id" IN (SELECT value FROM json_each(?))'
        if name == "sqlite"
        else '"event_id" = ANY(%b::text[])'
    )
    return _Dialect(
        name=name,
        lock=sql(lock + (" FOR UPDATE" if name == "postgresql" else "")),
        read=_read_sql(name),
        create=sql(
            'INSERT INTO govern_logs ("name", "machine", "length", "events") VALUES (?, ?, 0, ?) '
            "ON CONFLICT DO NOTHING"
        ),
        set_events=sql('UPDATE govern_logs SET "events" = ? WHERE "name" = ?'),
        written_by=sql(written_by),
        holder=sql(f'{_EVENT_SELECT} WHERE "log" = ? AND "producer" = ? AND "producer_seq" = ?'),
        orphans=sql(_ANY_EVENT.replace(":log", "?")),
    )


_DIALECTS = {name: _dialect(name) for name in ("sqlite", "postgresql")}
# Arrays go as binary parameters (%b): psycopg dumps a text array by testing every element for quoting.
_PG_EVENT_ARRAYS = ", ".join(
    "%b::" + ("bigint[]" if c in ("position", "record_seq", "producer_seq") else "text[]")
    for c in _EVENT_COLUMNS
)
_PG_COPY_EVENTS = "COPY govern_events (" + ", ".join(f'"{c}"' for c in _EVENT_COLUMNS) + ") FROM STDIN"
# The log's new length and the counters in one statement (a data-modifying WITH): one round trip. A
# counter never moves back (`greatest`).
_PG_LENGTH_AND_COUNTERS = (
    'WITH grown AS (UPDATE govern_logs SET "length" = %s WHERE "name" = %s) '
    'INSERT INTO govern_counters ("log", "kind", "key", "next") '
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::bigint[]) "
    'ON CONFLICT ("log", "kind", "key") '
    'DO UPDATE SET "next" = greatest(govern_counters."next", excluded."next")'
)


def _json(keys: list[str]) -> str:
    """A list of keys as one SQLite parameter, read back by json_each: what `json.dumps(keys,
    ensure_ascii=False)` gives, without the encoder it builds per call (which cost more than the read)."""
    return "[" + ",".join(map(_quote, keys)) + "]"


class _SqlTx:
    """The append transaction on a driver cursor (sqlite3 or psycopg), inside `_SqlBackend._write`."""

    def __init__(self, cursor: Any, log: str, dialect: _Dialect, pipe: Any = None) -> None:
        self.cur = cursor
        self.log = log
        self.d = dialect
        self.sqlite = dialect.name == "sqlite"
        self.pipe = pipe  # PostgreSQL: the psycopg pipeline the transaction runs in, if it runs in one
        # PostgreSQL: the next producer ('p') and record ('r') numbers the read found, which the counters
        # `write` stores never fall below (for a key whose counter row is missing, one past its highest).
        self.read_next: dict[str, dict[str, int]] = {"p": {}, "r": {}}

    def lock(self) -> _Head | None:
        # On SQLite the log's id is given twice: the length is read from its events (layout 3).
        self.cur.execute(self.d.lock, (self.log, self.log) if self.sqlite else (self.log,))
        row = self.cur.fetchone()
        return None if row is None else _head_of(row[0], row[1], row[2])

    def read(self, ids: list[str], deps: list[str], producers: list[str], records: list[str]) -> _Seen | None:
        if self.sqlite and len(ids) == len(producers) == len(records) == 1:
            params = {"log": self.log, "id": ids[0], "deps": _json(deps), "producer": producers[0]}
            params["record"] = records[0]
            row = self.cur.execute(_SQLITE_READ_ONE, params).fetchone()
            if row is None:
                return None
            length, machine, names, stored, found, producer_next, record_next, first, second = row
            if stored is None:  # the id is new (a stored one is read in full below, with the rest)
                seen = _Seen(
                    _head_of(machine, length, names),
                    {},
                    {} if found == "{}" else _positions(json.loads(found)),
                    {producers[0]: _counted(producer_next, f"the next number of producer {producers[0]!r}")},
                    {records[0]: _counted(record_next, f"the next number of record {records[0]!r}")},
                )
                _check_span(self.log, seen.head.length, first, second, seen.head.length - 1)
                return seen
        head = None
        lists: Callable[[list[str]], Any] = _json if self.sqlite else list
        params = {
            "log": self.log,
            "ids": lists(ids),
            "deps": lists(deps),
            "producers": lists(producers),
            "records": lists(records),
        }
        if self.sqlite:  # BEGIN IMMEDIATE holds the lock: the log's row comes with the rest
            self.cur.execute(self.d.read, params)
        else:
            # In a pipeline, BEGIN, the lock and the read go out in one round trip: the server runs them
            # in order, so the read's snapshot is taken once the lock is held and sees every earlier
            # append. The answer is asked for with a Sync (not the Flush a fetch sends), so that while
            # this process works on it the server counts the session idle in a transaction, where
            # `idle_in_transaction_session_timeout` ends it if the process was paused: in the middle of
            # a pipeline nothing would, and it would hold the log's lock until it woke. (Leaving a
            # pipeline sends a Flush after its Sync, which disarms that timeout: a large append, which
            # writes with COPY outside any pipeline, sends the lock and the read one at a time.)
            if self.pipe is not None:
                locking = self.cur.connection.cursor()
                try:
                    locking.execute(self.d.lock, (self.log,))
                    self.cur.execute(self.d.read, params)
                    self.pipe.sync()
                    locked = locking.fetchone()
                finally:
                    locking.close()
            else:
                self.cur.execute(self.d.lock, (self.log,))
                locked = self.cur.fetchone()
                if locked is not None:
                    self.cur.execute(self.d.read, params)
            if locked is None:
                return None
            head = _head_of(locked[0], locked[1], locked[2])
        known: dict[str, LoggedEvent] = {}
        positions: dict[str, int] = {}
        numbers: dict[str, dict[str, int]] = {"p": {}, "r": {}}
        span: tuple[Any, Any, Any] = (None, None, None)  # first, second highest, highest position
        counted: list[tuple[str, str, Any, Any]] = []  # PostgreSQL: (kind, key, counter, number before it)
        for tag, *row in self.cur.fetchall():
            if tag == "e":
                event = _from_tuple(tuple(row))
                known[event.id] = event
            elif tag == "d":
                positions[str(row[2])] = _counted(row[1], f"the position of event {row[2]!r}")
            elif tag == "h":
                head = _head_of(row[3], row[1], row[9])
                span = (row[5], row[8], head.length - 1)
            elif tag == "b":
                span = (row[5], row[8], row[1])
            else:
                kind, key = "producer" if tag == "p" else "record", str(row[2])
                numbers[tag][key] = _counted(row[1], f"the next number of {kind} {key!r}")
                if not self.sqlite:
                    counted.append((kind, key, row[8], row[5]))
        if head is None:
            return None
        _check_span(self.log, head.length, *span)
        for kind, key, counter, before in counted:
            _check_counter(self.log, kind, key, counter, before)
        self.read_next = numbers
        return _Seen(head, known, positions, numbers["p"], numbers["r"])

    def orphaned(self) -> bool:
        self.cur.execute(self.d.orphans, (self.log,))
        return self.cur.fetchone() is not None

    def create(self, machine: str, names: tuple[str, ...]) -> _Head:
        if self.orphaned():
            # A row and its log's first events commit together: events without the row read a moment ago
            # are a creator's that committed since (PostgreSQL: FOR UPDATE waits on no row that does not
            # exist yet), unless the row is still missing.
            head = self.lock()
            if head is None:
                raise _orphaned(self.log)
            return head
        # A concurrent creator may have won: its row is the one that counts.
        self.cur.execute(self.d.create, (self.log, machine, json.dumps(list(names))))
        head = self.lock()
        assert head is not None
        return head

    def set_events(self, names: tuple[str, ...]) -> None:
        self.cur.execute(self.d.set_events, (json.dumps(list(names)), self.log))

    def written_by(self, writer: str, ids: list[str]) -> set[str]:
        self.cur.execute(self.d.written_by, (self.log, writer, _json(ids) if self.sqlite else ids))
        return {str(r[0]) for r in self.cur.fetchall()}

    def holder(self, producer: str, seq: int) -> LoggedEvent | None:
        self.cur.execute(self.d.holder, (self.log, producer, seq))
        row = self.cur.fetchone()
        return None if row is None else _from_tuple(row)

    def write(self, events: list[LoggedEvent], length: int, writer: str) -> None:
        """Store the events; on PostgreSQL also the log's new length and counters (SQLite, layout 3,
        derives both from the events' indexes)."""
        log = self.log
        rows = [
            (
                log,
                e.position,
                e.id,
                e.machine,
                e.record,
                e.record_seq,
                e.event,
                e.producer,
                e.producer_seq,
                _json_list(e.deps),
                _json_list(e.after),
                writer,
            )
            for e in events
        ]
        if self.sqlite:
            for i in range(0, len(rows), _ROWS_CHUNK):
                chunk = rows[i : i + _ROWS_CHUNK]
                self.cur.execute(_sqlite_insert(len(chunk)), list(itertools.chain.from_iterable(chunk)))
            return
        # A counter stands past every number stored for its key, not only the batch's: a producer that
        # numbers its own events may give one below its highest (after a counter row was deleted by hand,
        # a counter rebuilt from that number alone would hand out numbers already taken).
        floor = self.read_next
        nexts: dict[tuple[str, str], int] = {}
        for e in events:
            given = max(nexts.get(("p", e.producer), 0), e.producer_seq + 1)
            nexts["p", e.producer] = max(given, floor["p"].get(e.producer, 0))
            nexts["r", e.record] = max(e.record_seq + 1, floor["r"].get(e.record, 0))
        counters = [(log, kind, key, n) for (kind, key), n in nexts.items()]
        # COPY costs the server about half what INSERT ... unnest does (and is not allowed in a pipeline,
        # which a smaller append runs in).
        if len(rows) >= _COPY_FROM:
            with self.cur.copy(_PG_COPY_EVENTS) as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            self.cur.execute(_PG_INSERT_EVENTS, [list(column) for column in zip(*rows, strict=True)])
        self.cur.execute(
            _PG_LENGTH_AND_COUNTERS,
            [length, log, *(list(column) for column in zip(*counters, strict=True))],
        )


_COLUMNS = ", ".join(f'"{c}"' for c in _EVENT_COLUMNS)
_PG_INSERT_EVENTS = f"INSERT INTO govern_events ({_COLUMNS}) SELECT * FROM unnest({_PG_EVENT_ARRAYS})"


@functools.cache
def _sqlite_insert(rows: int) -> str:
    """The INSERT of `rows` events (its text made once per size: at most `_ROWS_CHUNK` of them)."""
    row = "(" + ", ".join("?" * len(_EVENT_COLUMNS)) + ")"
    return f"INSERT INTO govern_events ({_COLUMNS}) VALUES " + ", ".join([row] * rows)


def _json_list(values: tuple[Any, ...]) -> str:
    return json.dumps(list(values), separators=(",", ":")) if values else "[]"


def _counted(value: Any, what: str) -> int:
    """A number the database computed for an append (one past the highest stored, or a stored position),
    which must be an integer: a stored number of another type, or past 2**63 - 1 (SQLite makes a float
    of it), or below 0, was edited in, and raises `LogCorrupted`."""
    if type(value) is not int or value < 0:
        kind = "a negative number" if type(value) is int else "not an integer"
        raise LogCorrupted(
            f"{what} reads as {value!r}, {kind}: the log was edited or is damaged; nothing was "
            "appended: restore the log from a backup"
        )
    return value


def _check_counter(log: str, kind: str, key: str, counter: Any, before: Any) -> None:
    """Raise `LogCorrupted` when a PostgreSQL counter of a producer or record `key` (None for none) is ahead
    of its events: no event holds the number before it (`before` is None). The next append would number
    its event past a gap, at which every replica stops forever (a record's numbers never skip). A counter
    behind its events collides with a stored event instead (`_logretry`)."""
    if before is None and counter is not None and counter > 0:
        raise LogCorrupted(
            f"log {log!r} is damaged: the log's counters are ahead of its events (the counter of {kind} "
            f"{key!r} gives {counter} as its next number, but no event of it is numbered {counter - 1}): "
            "they were edited, or the events were restored apart from them; nothing was appended: restore "
            "the log from a backup"
        )


def _positions(found: dict[str, Any]) -> dict[str, int]:
    """The positions of stored dependencies by id, as SQLite's json_group_object gave them."""
    return {dep: _counted(position, f"the position of event {dep!r}") for dep, position in found.items()}


def _head_of(machine: Any, length: Any, events: Any) -> _Head:
    try:
        if type(length) is not int or not 0 <= length <= _INT64_MAX:
            # (SQLite makes a float of a length past 2**63 - 1, and gives a position edited to text as it
            # is: an edited last position)
            raise ValueError(
                f"its length reads as {length!r}, not a number of events (a position or the length was "
                "edited)"
            )
        names = None if events is None else _parse_names(str(events))
        return _Head(str(machine), length, names)
    except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        raise LogCorrupted(f"the log's row is unreadable: {exc}; restore the log from a backup") from exc


def _check_span(log: str, length: int, first: Any, second: Any, last: Any) -> None:
    """Raise `LogCorrupted` unless the ends of the log's positions are those of `length` dense events:
    the first (`first`) is 0, the last two (`second`, `last`) are length - 2 and length - 1 (None where
    there is no such event). Only an edit breaks this (`_FIRST`); an append after it would write where no
    read reaches, or past a row no read returns."""
    if first == 0 and second == length - 2 and last == length - 1:
        return  # a sound log of two events or more: decided without a call
    problem = _span_problem(length, first, second, last)
    if problem is not None:
        raise LogCorrupted(
            f"log {log!r} is damaged: {problem}, which only an edit of its database makes; nothing was "
            "written, and every append is refused: restore the log from a backup"
        )


def _span_problem(length: int, first: Any, second: Any, last: Any) -> str | None:
    """What `_check_span` finds wrong, or None (a log of fewer than two events)."""
    if first is None or last is None:
        return None if length == 0 else f"its length is {length}, but it holds no events"
    for position in (first, second, last):
        if position is not None and type(position) is not int:
            return f"it holds an event at position {position!r}, not an integer"
    if first < 0:
        return f"it holds an event at position {first}, below 0"
    if first > 0:
        return f"it holds no event at position 0 (its first is at position {first})"
    if last > length - 1:
        return f"it holds an event at position {last}, past its end (its length is {length})"
    if last < length - 1:
        return f"its length is {length}, but its last event is at position {last}"
    if length >= 2 and second != length - 2:
        return f"it holds an event at position {length - 1} but none at {length - 2}"
    return None


def _orphaned(log: str) -> LogCorrupted:
    """A log that holds events but has no row in govern_logs: its machine is unknown, so nothing may bind
    it again (another machine's events would follow its own)."""
    return LogCorrupted(
        f"log {log!r} holds events but its row in govern_logs is gone (deleted or damaged): its machine "
        "is unknown, and nothing was written; restore the log from a backup"
    )


_names_cache: dict[str, tuple[str, ...]] = {}


def _parse_names(text: str) -> tuple[str, ...]:
    """The event names stored with a log (parsed once per distinct text: every append reads them)."""
    names = _names_cache.get(text)
    if names is None:
        value = json.loads(text)
        if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
            raise ValueError(f"the machine's event names are not a list of strings: {text[:100]!r}")
        names = _names_cache[text] = tuple(value)
    return names


# PostgreSQL: the events of a list of ids, one lookup in the log's id index each. `IN (list)`, whose
# generic plan the server estimates without statistics as a quarter of the table for 50 ids, read every event
# of the log once psycopg prepared the statement (27 ms for 50 ids among 30,000 events; 0.2 ms so).
_Q_IDS_PG = sa.text(
    'SELECT stored.* FROM unnest(CAST(:ids AS text[])) AS k(value) CROSS JOIN LATERAL '
    f'({_EVENT_SELECT} WHERE "log" = :log AND "event_id" = k.value LIMIT 1) AS stored'
)


def _by_ids(conn: Connection, log: str, ids: list[str]) -> dict[str, LoggedEvent]:
    out: dict[str, LoggedEvent] = {}
    query = _Q_IDS_PG if conn.dialect.name == "postgresql" else _Q_IDS
    for i in range(0, len(ids), 500):
        for row in conn.execute(query, {"log": log, "ids": ids[i : i + 500]}):
            event = _from_row(row)
            out[event.id] = event
    return out


class _SqlBackend:
    """A log in a SQL database. Every call runs in one transaction and is retried, until the log's
    timeout, on the failures `_logretry.classify` calls retryable; writers take the log's lock
    (BEGIN IMMEDIATE, SELECT ... FOR UPDATE), readers take none."""

    def __init__(self, url: str, log: str, timeout: float, pool_size: int) -> None:
        self.log = log
        self.url = url
        self.timeout = timeout
        self.pool_size = pool_size
        # SQLite: the file's path, made absolute once (a later os.chdir must not move the log), and the file
        # itself once open (see bide/_dbfile.py).
        sqlite_path = sa.engine.make_url(url).database if url.startswith("sqlite") else None
        self._path = os.path.abspath(sqlite_path or "") if sqlite_path else ""
        self._file: OpenedFile | None = None
        self.engine, self.dialect = _engine(url, timeout, pool_size, self._open_sqlite)
        self._sql = _DIALECTS[self.dialect]
        errors: list[type[BaseException]] = [sa.exc.SQLAlchemyError, sqlite3.Error]
        psycopg = sys.modules.get("psycopg")  # imported by the engine when the URL names it
        if psycopg is not None:
            errors.append(psycopg.Error)
        self._errors = tuple(errors)
        self.where = without_password(self.engine.url.render_as_string(hide_password=True))
        # SQLite runs one write transaction at a time, so a handle writes through one connection of its
        # pool, kept checked out between appends and taken in turn under this lock: checking it out of
        # the pool and back in for every append cost as much as the append's own Python. A pool of one
        # connection keeps it in the pool, for the readers.
        self._writer: Any = None  # the kept connection, while no append is using it
        self._writer_lock = threading.Lock() if self.dialect == "sqlite" and pool_size > 1 else None
        # PostgreSQL: the log's length at which `grown` next looks at the planner's statistics.
        self._next_look: int | None = _FIRST_LOOK if self.dialect == "postgresql" else None
        self._gathering: threading.Thread | None = None  # the thread gathering them, if one was started
        # Set by close(): the thread connects no more, and the session it has is cancelled (`_gatherer`).
        self._gathering_stopped = threading.Event()
        self._gatherer: Any = None  # the thread's driver connection while it has one
        self._gatherer_lock = threading.Lock()
        # Set when an append was refused a connection for lack of server slots while the thread ran:
        # it ends its session (`_give_way`).
        self._gathering_yield = threading.Event()
        # A round that gave up is tried again by the first append at or after this time (`_gather_later`).
        self._gather_after = 0.0
        self._gather_wait = _STATISTICS_RETRY_FIRST
        linked = other_names(self._path, "the event log file") if self.dialect == "sqlite" else None
        if linked is not None:
            self.engine.dispose()
            raise EventLogError(f"cannot open the event log at {self.where}: {linked}")
        try:
            ready = self._run(lambda c: schema.check_open(c, self.where, self.dialect), "open", True)
            if not ready:
                self._run(lambda c: schema.prepare(c, self.dialect, self.where), "open", False)
            if self.dialect == "sqlite":
                self._use_wal()
                self._file = OpenedFile(self._path, "the event log file")
        except BaseException:
            self.engine.dispose()
            raise

    def _open_sqlite(self) -> sqlite3.Connection:
        """A connection to the log's SQLite file; once the log is open, only to the file it opened, never
        creating one (`EventLogError` when the file was deleted or replaced meanwhile)."""
        if self._file is None:
            return sqlite3.connect(self._path, timeout=self.timeout, check_same_thread=False)
        conn = connect_existing(self._file, self.timeout)
        if isinstance(conn, str):
            raise EventLogError(self._swapped(conn, committed=False))
        return conn

    def _swapped(self, what: str, *, committed: bool, reading: bool = False) -> str:
        if committed:
            done = (
                "this append committed into the old file and is lost with it (appending the same events "
                "again, once the file is back, is safe: the log is idempotent by id)"
            )
        elif reading:
            done = (
                "what this EventLog read came from the old file, not the log at the path; nothing more is "
                "read or written through it"
            )
        else:
            done = "nothing more is written through this EventLog"
        return (
            f"{what} while this process had it open: {done}. Stop every process using the log; then put the "
            "file back (or restore it from a backup with no process running) and open the log again"
        )

    def _check_file(self, raw: Any, *, committed: bool, reading: bool = False) -> None:
        """Raise `EventLogError` when the log's file, or the write-ahead log connection `raw` uses, is no
        longer at its path (see bide/_dbfile.py)."""
        swapped = None if self._file is None else self._file.swapped(raw.info)
        if swapped is not None:
            raise EventLogError(self._swapped(swapped, committed=committed, reading=reading))

    def _use_wal(self) -> None:
        """Switch the SQLite file, now known to be an event log, to WAL. The file keeps the mode, so every
        later connection uses it; switching before the schema check would change a file the check then
        refuses, which must be left as it was. (Outside a transaction: SQLite switches in none.)"""
        backoff = Backoff(self.timeout)
        while True:
            try:
                raw = self.engine.raw_connection()
                try:
                    driver: Any = raw.driver_connection
                    driver.execute("PRAGMA journal_mode=WAL")
                finally:
                    raw.close()
                return
            except self._errors as exc:
                kind, reason, _ = classify(exc)
                if kind == "retry" and backoff.wait():
                    continue
                raise self._error(kind, reason, "open", backoff.attempts) from exc

    def _run(self, body: Callable[[Connection], _T], what: str, read_only: bool) -> _T:
        backoff = Backoff(self.timeout)
        while True:
            try:
                with self.engine.connect() as conn:
                    if read_only:
                        conn.execution_options(govern_read=True)
                        if self.dialect == "postgresql":
                            # Each read statement its own transaction, over once the server has sent its
                            # rows: in one the client held open while it took in a large result (a whole
                            # log, a long record's history), the session counted as idle in a transaction,
                            # and the server ended it past half the timeout (see `_postgres_session`), on
                            # every retry. Nothing is lost: reads here see a snapshot per statement anyway.
                            conn.execution_options(isolation_level="AUTOCOMMIT")
                    try:
                        with conn.begin():
                            result = body(conn)
                        if read_only and self._file is not None:
                            # A replica reading a file that was replaced (a backup restored under it)
                            # would follow a log nobody appends to any more, without a word; writes check
                            # the file at their commit, reads once they have read.
                            self._check_file(conn.connection, committed=False, reading=True)
                        return result
                    except sa.exc.SQLAlchemyError as exc:
                        if classify(exc)[2]:
                            # The connection broke under the driver: never hand it out again.
                            conn.invalidate()
                        raise
            except sa.exc.SQLAlchemyError as exc:
                kind, reason, _ = classify(exc)
                if kind == "retry":
                    self._give_way(exc)
                    if backoff.wait():
                        continue
                raise self._error(kind, reason, what, backoff.attempts) from exc

    def _error(self, kind: str, reason: str, what: str, attempts: int) -> EventLogError:
        where = f"{what} on event log {self.log!r} at {self.where}"
        safe = (
            "; appending the same events again is safe (the log is idempotent by id)"
            if what == "append"
            else ""
        )
        if kind == "timeout" and "pool" in reason:
            return LogTimeout(
                f"{where}: all {self.pool_size} connections of this EventLog stayed busy for "
                f"{self.timeout:g} s; open it with a larger pool_size, share it among fewer threads, or "
                f"raise timeout{safe}"
            )
        if kind == "timeout":
            return LogTimeout(
                f"{where} waited longer than the log's timeout ({self.timeout:g} s): {reason}; another "
                "session holds the log's lock (look in pg_stat_activity for one 'idle in transaction', or "
                "one 'active' waiting on ClientRead whose client is gone) or the database is "
                f"overloaded{safe}"
            )
        if kind == "retry":
            return LogTimeout(
                f"{where} kept failing for {self.timeout:g} s ({attempts + 1} attempts): {reason}; the "
                f"database is unreachable, overloaded, or another session holds its write lock{safe}"
            )
        if kind == "refused":
            return LogURLError(f"{where} failed: {reason}; fix the URL")
        if kind == "corrupt":
            return LogCorrupted(
                f"{where} failed: {reason}; nothing was written: restore the log from a backup (or point it "
                "at its own file)"
            )
        return EventLogError(f"{where} failed: {reason}{safe}")

    def transaction(self, body: Callable[[_Tx], _T], *, pipelined: bool = False, what: str = "append") -> _T:
        return self._write(
            lambda cursor, pipe: body(_SqlTx(cursor, self.log, self._sql, pipe)), pipelined, what
        )

    def _write(self, body: Callable[[Any, Any], _T], pipelined: bool = False, what: str = "append") -> _T:
        """Run `body(cursor, pipe)` on a driver cursor in one write transaction (BEGIN IMMEDIATE on SQLite;
        on PostgreSQL psycopg begins one itself, or with `pipelined` the statements go out in the pipeline
        `pipe` (else None), and `body` must not COPY), retried like `_run`: the append's hot path, without
        SQLAlchemy's per-statement work."""
        backoff = Backoff(self.timeout)
        while True:
            try:
                return self._write_once(body, backoff, pipelined, what)
            except self._errors as exc:
                kind, reason, _ = classify(exc)
                if kind == "retry":
                    self._give_way(exc)
                    if backoff.wait():
                        continue
                raise self._error(kind, reason, what, backoff.attempts) from exc

    def _give_way(self, exc: BaseException) -> None:
        """When `exc` is the server refusing one of the pool's connections for lack of slots, end the
        statistics session, which may hold the slot the pool needs: its ANALYZE is cancelled, and gathered
        again later (the statistics only speed appends up; an append must not wait for them)."""
        gathering = self._gathering
        if gathering is None or not gathering.is_alive() or not server_full(exc):
            return
        self._gathering_yield.set()  # (a thread still connecting ends its session as soon as it has one)
        with self._gatherer_lock:
            if self._gatherer is not None:
                with contextlib.suppress(Exception):
                    self._gatherer.cancel_safe(timeout=min(self.timeout, 5.0))

    def _write_once(self, body: Callable[[Any, Any], _T], backoff: Backoff, pipelined: bool, what: str) -> _T:
        """One attempt of `_write`, on the kept writer connection (SQLite) or a pooled one. A failed
        attempt is rolled back and its connection goes back to the pool (a broken one is discarded)."""
        lock = self._writer_lock
        if lock is not None and not lock.acquire(timeout=backoff.remaining()):
            safe = "; appending the same events again is safe (the log is idempotent by id)"
            raise LogTimeout(
                f"{what} on event log {self.log!r} at {self.where}: other threads of this EventLog kept "
                f"appending for {self.timeout:g} s (a handle writes to SQLite through one connection, as "
                "SQLite runs one write transaction at a time); share it among fewer threads or raise "
                f"timeout{safe if what == 'append' else ''}"
            )
        try:
            raw = self._writer or self.engine.raw_connection()  # bounded by the pool's timeout
            self._writer = None
            kept = False
            try:
                driver: Any = raw.driver_connection
                cursor = driver.cursor()
                try:
                    if self.dialect == "sqlite":
                        cursor.execute("BEGIN IMMEDIATE")
                        result = body(cursor, None)
                        self._check_file(raw, committed=False)  # (rolled back below: nothing written)
                        cursor.execute("COMMIT")
                        self._check_file(raw, committed=True)
                    elif pipelined:
                        # A small append is two round trips: BEGIN, the lock and the read (whose answer
                        # it waits for), then the writes and the COMMIT. The BEGIN and COMMIT are the
                        # pipeline's own statements, on a connection in autocommit mode meanwhile:
                        # psycopg's would each wait for an answer of their own.
                        driver.autocommit = True
                        with pipeline(driver) as pipe:
                            cursor.execute("BEGIN")
                            result = body(cursor, pipe)
                            cursor.execute("COMMIT")
                        driver.autocommit = False
                    else:
                        result = body(cursor, None)
                        driver.commit()
                except BaseException as exc:
                    with contextlib.suppress(Exception):  # the first failure is the one to report
                        driver.rollback()
                    if self.dialect != "sqlite":
                        if not out_of_pipeline(driver):
                            raw.invalidate()  # never hand out a connection in pipeline or autocommit mode
                        lost = lost_in_pipeline(driver, exc)
                        if lost is not None:
                            raise lost from exc  # retried, as any lost connection
                    raise
                finally:
                    cursor.close()
                if lock is not None:
                    self._writer, kept = raw, True
                return result
            except self._errors as exc:
                if classify(exc)[2] and raw.is_valid:  # (a pipeline left busy was invalidated already)
                    raw.invalidate()  # the connection broke under the driver: never hand it out again
                raise
            finally:
                if not kept:
                    raw.close()
        finally:
            if lock is not None:
                lock.release()

    def _rows(self, statement: Any, params: dict[str, Any]) -> list[Any]:
        return self._run(lambda conn: list(conn.execute(statement, params)), "read", True)

    def head(self) -> _Head | None:
        query = _Q_LOG_SQLITE if self.dialect == "sqlite" else _Q_LOG
        rows = self._rows(query, {"log": self.log})
        if not rows and self._rows(_Q_ANY_EVENT, {"log": self.log}):
            # The row and the first events commit together: the log's first append committed between the
            # two reads, unless the row is still missing.
            rows = self._rows(query, {"log": self.log})
            if not rows:
                raise _orphaned(self.log)
        if not rows:
            return None
        row = rows[0]
        head = _head_of(row.machine, row.length, row.events)
        _check_span(self.log, head.length, row.first, row.second, row.last)
        return head

    def read(self, start: int, limit: int) -> list[LoggedEvent]:
        return [_from_row(r) for r in self._rows(_Q_READ, {"log": self.log, "start": start, "limit": limit})]

    def by_ids(self, ids: list[str]) -> dict[str, LoggedEvent]:
        return self._run(lambda conn: _by_ids(conn, self.log, ids), "read", True)

    def read_record(self, record: str, start: int, through: int) -> list[LoggedEvent]:
        rows = self._rows(_Q_RECORD, {"log": self.log, "record": record, "start": start, "through": through})
        return [_from_row(r) for r in rows]

    def last_by_producer(self, producer: str) -> LoggedEvent | None:
        rows = self._rows(_Q_LAST_BY_PRODUCER, {"log": self.log, "producer": producer})
        return _from_row(rows[0]) if rows else None

    def writer_of(self, event_id: str) -> str | None:
        rows = self._rows(_Q_WRITER, {"log": self.log, "event_id": event_id})
        return str(rows[0][0]) if rows and rows[0][0] is not None else None

    def grown(self, length: int) -> None:
        """PostgreSQL: once the log has grown past a mark (500 events, then 4 times the last mark), have
        the server gather statistics on the log's tables if what it believes they hold is less than half
        this log. An append's statements are prepared, and the generic plan the server keeps for each
        was made when the tables looked empty: all their indexes then cost the same, and it chose one
        that reads every event of the log for each key looked up (an append of 1,000 events into a log of
        20,000 took seconds, where it takes milliseconds). New statistics make it plan again. The
        server's autovacuum gathers them too, but only once a minute, and not at all where it is off.

        Done on a thread of its own, on a session of its own outside the pool, so that the append that
        passed the mark returns at once and no append waits for the ANALYZE, even with a pool of one
        connection; and that session never costs an append its connection: when the server refuses one
        of the pool's connections for lack of slots while it runs, it ends (`_give_way`). Never failing
        anything, it is skipped when the tables' statistics are current or when this user may not analyze
        the tables (the server then only warns), and it gives up, to try again on an append a while later
        (`_gather_later`), when the server has no slot for it, when another session holds a lock it would
        wait for more than 0.2 s, or when its ANALYZE runs more than 2 s (a DDL queued behind it waits no
        longer than that, as behind autovacuum's)."""
        if self._next_look is None or length < self._next_look or time.monotonic() < self._gather_after:
            return
        self._next_look = length * 4
        if self._gathering is not None and self._gathering.is_alive():
            return  # (one at a time: the next mark looks again)
        self._gathering_stopped.clear()  # (a handle used again after close() gathers again)
        self._gathering_yield.clear()
        self._gathering = threading.Thread(
            target=self._gather_statistics, args=(length,), name="govern-log-statistics", daemon=True
        )
        self._gathering.start()

    def _gather_statistics(self, length: int) -> None:
        # Its own session, opened and closed here, never one of the pool's: an ANALYZE that runs long (a
        # large table, or waiting its 0.2 s for a lock) would otherwise keep an append from a connection.
        # Any failure (no slot, a lock or statement timeout, cancelled by `_give_way`) is not reported:
        # the statistics only speed appends up; the round is tried again later.
        stopped = self._gathering_stopped
        if stopped.is_set():
            return
        gathered = False
        with contextlib.suppress(*self._errors, OSError):
            gathered = self._analyze_on_own_session(length)
        if not gathered and not stopped.is_set():
            self._gather_later(length)
        elif gathered:
            self._gather_wait = _STATISTICS_RETRY_FIRST

    def _analyze_on_own_session(self, length: int) -> bool:
        """Gather the statistics if the server's are stale, on a session opened and closed here; True when
        done (or not needed), False when it gave way to an append or to close()."""
        own = sa.create_engine(
            self.url, connect_args=_postgres_session(self.url, self.timeout), poolclass=sa.pool.NullPool
        )
        try:
            with own.begin() as conn:
                with self._gatherer_lock:
                    # Closed, or an append refused a connection, while this connected: nothing on the server.
                    if self._gathering_stopped.is_set() or self._gathering_yield.is_set():
                        return False
                    self._gatherer = conn.connection.driver_connection
                conn.execute(sa.text(f"SET LOCAL lock_timeout = {_STATISTICS_LOCK_MS}"))
                statement_ms = min(_STATISTICS_STATEMENT_MS, int(self.timeout * 1000))
                conn.execute(sa.text(f"SET LOCAL statement_timeout = {statement_ms}"))
                believed = conn.execute(_Q_TUPLES_BELIEVED).scalar()
                if self._gathering_yield.is_set():  # (an append refused a connection meanwhile)
                    return False
                if believed is None or believed < length / 2:
                    conn.execute(sa.text("ANALYZE govern_events, govern_counters"))
            return True
        finally:
            with self._gatherer_lock:
                self._gatherer = None
            own.dispose()

    def _gather_later(self, length: int) -> None:
        """A round of statistics gave up: the first append at or after a wait (1 s, doubling after each
        round that gives up, up to 5 minutes) tries again, whatever the mark."""
        self._next_look = length
        self._gather_after = time.monotonic() + self._gather_wait
        self._gather_wait = min(self._gather_wait * 2, _STATISTICS_RETRY_LAST)

    def release(self) -> None:
        """Close the connections of a handle that was dropped without close(), without waiting for the
        statistics thread (run by the garbage collector, in whatever thread dropped the handle)."""
        writer, self._writer = self._writer, None
        with contextlib.suppress(Exception):
            if writer is not None:
                writer.invalidate()  # closed at once, without a last round trip
            self._gathering_stopped.set()  # (it connects no more; one it has goes back to the pool)
            self.engine.dispose()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()  # back to the pool, which dispose() closes
        gathering = self._gathering
        if gathering is not None:
            gathering.join(self.timeout)  # (the statistics of a short-lived process's log are gathered too)
            if gathering.is_alive():
                # No session left behind: the thread connects no more, and a statement it still runs (an
                # ANALYZE held up past the log's timeout) is cancelled.
                self._gathering_stopped.set()
                with self._gatherer_lock:
                    if self._gatherer is not None:
                        with contextlib.suppress(Exception):
                            self._gatherer.cancel_safe(timeout=min(self.timeout, 5.0))
                gathering.join(min(self.timeout, 5.0))
        self.engine.dispose()

    def forked(self) -> None:
        """Leave the parent's connections to the parent, in a child just forked: it opens its own."""
        self._gathering = None  # (the parent's thread, which the child does not have)
        self._gatherer, self._gatherer_lock = None, threading.Lock()  # (its session, its lock maybe held)
        self._gathering_stopped = threading.Event()
        self._gathering_yield = threading.Event()
        if self._writer_lock is not None:
            self._writer_lock = threading.Lock()  # (another thread of the parent may have held it)
        if self.dialect == "sqlite":
            # The child's copies of the idle connections are closed here, before it opens any: left open,
            # they would share SQLite's per-process lock records with the child's own connections, which
            # would then not really hold the file's shared lock. Closing an idle WAL connection ends no
            # parent's transaction, and it checkpoints and deletes the -wal file only when it gets the
            # file's exclusive lock, which the open connections of the parent (or any process) deny it.
            self.close()
        else:
            # Closing a psycopg connection would end its session for the parent too; dropped, it is not
            # closed (psycopg finishes a connection only in the process that opened it).
            self.engine.dispose(close=False)


# -- memory backend (tests, benchmarks) ---------------------------------------------------------------------


@dataclass(eq=False)
class _MemoryLog:
    """One log held in process memory: the same contract, no durability. `head` is kept current: its
    length is always `len(events)`."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    head: _Head | None = None
    events: list[LoggedEvent] = field(default_factory=list)
    by_id: dict[str, LoggedEvent] = field(default_factory=dict)
    by_record: dict[str, list[LoggedEvent]] = field(default_factory=dict)
    by_producer_seq: dict[tuple[str, int], LoggedEvent] = field(default_factory=dict)
    producer_last: dict[str, LoggedEvent] = field(default_factory=dict)  # each producer's highest seq


_memory_logs: dict[tuple[str, str], _MemoryLog] = {}
_memory_lock = threading.Lock()


def _memory_backend(space: str, log: str) -> _MemoryBackend:
    if not space:
        return _MemoryBackend(_MemoryLog())
    with _memory_lock:
        return _MemoryBackend(_memory_logs.setdefault((space, log), _MemoryLog()))


class _MemoryTx:
    """The append transaction on a memory log: it runs under the log's lock (`_MemoryBackend`)."""

    def __init__(self, mem: _MemoryLog) -> None:
        self.mem = mem

    def orphaned(self) -> bool:
        return False  # (a memory log's events come only with its head)

    def lock(self) -> _Head | None:
        return self.mem.head

    def create(self, machine: str, names: tuple[str, ...]) -> _Head:
        self.mem.head = _Head(machine, len(self.mem.events), names)
        return self.mem.head

    def set_events(self, names: tuple[str, ...]) -> None:
        assert self.mem.head is not None
        self.mem.head = _Head(self.mem.head.machine, len(self.mem.events), names)

    def read(self, ids: list[str], deps: list[str], producers: list[str], records: list[str]) -> _Seen | None:
        mem = self.mem
        head = mem.head
        if head is None:
            return None
        by_id, producer_last, by_record = mem.by_id, mem.producer_last, mem.by_record
        known = {}
        for i in ids:
            event = by_id.get(i)
            if event is not None:
                known[i] = event
        positions = {}
        for d in deps:
            event = by_id.get(d)
            if event is not None:
                positions[d] = event.position
        producer_next = {}
        for p in producers:
            last = producer_last.get(p)
            producer_next[p] = 0 if last is None else last.producer_seq + 1
        record_next = {}
        for r in records:
            stored = by_record.get(r)
            record_next[r] = 0 if stored is None else len(stored)
        return _Seen(head, known, positions, producer_next, record_next)

    def written_by(self, writer: str, ids: list[str]) -> set[str]:
        # A memory transaction runs once and cannot lose its acknowledgement, so no event stored before it
        # was written by its own call: none of `ids` was. Writer tokens need not be kept.
        return set()

    def holder(self, producer: str, seq: int) -> LoggedEvent | None:
        return self.mem.by_producer_seq.get((producer, seq))

    def write(self, events: list[LoggedEvent], length: int, writer: str) -> None:
        mem = self.mem
        stored, by_id, by_record = mem.events, mem.by_id, mem.by_record
        by_producer_seq, producer_last = mem.by_producer_seq, mem.producer_last
        for e in events:
            assert e.position == len(stored)
            stored.append(e)
            by_id[e.id] = e
            history = by_record.get(e.record)
            if history is None:
                by_record[e.record] = [e]
            else:
                history.append(e)
            producer, seq = e.producer, e.producer_seq
            by_producer_seq[producer, seq] = e
            last = producer_last.get(producer)
            if last is None or seq > last.producer_seq:
                producer_last[producer] = e
        assert len(stored) == length and mem.head is not None
        mem.head = _Head(mem.head.machine, length, mem.head.events)


class _MemoryBackend:
    def __init__(self, mem: _MemoryLog) -> None:
        self.mem = mem
        self._tx = _MemoryTx(mem)  # it holds nothing of its own: one serves every transaction

    def transaction(self, body: Callable[[_Tx], _T], *, pipelined: bool = False, what: str = "append") -> _T:
        mem = self.mem
        with mem.lock:
            # A refused append leaves nothing behind: write() is its last step, and a binding made by
            # create() or set_events() before a refusal is undone here.
            head = mem.head
            try:
                return body(self._tx)
            except BaseException:
                mem.head = head
                raise

    def head(self) -> _Head | None:
        return self.mem.head  # replaced whole, never changed in place: no lock needed to read it

    def read(self, start: int, limit: int) -> list[LoggedEvent]:
        with self.mem.lock:
            return self.mem.events[start : start + min(limit, len(self.mem.events))]

    def by_ids(self, ids: list[str]) -> dict[str, LoggedEvent]:
        with self.mem.lock:
            return {i: self.mem.by_id[i] for i in ids if i in self.mem.by_id}

    def read_record(self, record: str, start: int, through: int) -> list[LoggedEvent]:
        with self.mem.lock:
            history = self.mem.by_record.get(record)
            if history is None:
                return []
            if history[-1].position <= through:
                return history[start:]
            return [e for e in history[start:] if e.position <= through]

    def last_by_producer(self, producer: str) -> LoggedEvent | None:
        with self.mem.lock:
            return self.mem.producer_last.get(producer)

    def writer_of(self, event_id: str) -> str | None:
        return None  # a memory append cannot fail after writing: no token is kept (see `written_by`)

    def grown(self, length: int) -> None:
        return None  # nothing plans its reads

    def close(self) -> None:
        return None


def _from_row(row: Any) -> LoggedEvent:
    return _from_tuple(tuple(getattr(row, c) for c in _EVENT_COLUMNS[:-1]))


def _from_tuple(row: tuple[Any, ...]) -> LoggedEvent:
    """A stored event from its columns in `_EVENT_COLUMNS` order (validated: a row is read back as an
    untrusted input, and a damaged one raises `LogCorrupted`)."""
    log, position, event_id, machine, record, record_seq, event, producer, producer_seq, deps, after = row
    try:
        # Each value as stored, never converted: an edited 1.5 or "2" is refused, not read as another number.
        return LoggedEvent(
            log=log,
            id=event_id,
            machine=machine,
            record=record,
            event=event,
            producer=producer,
            producer_seq=producer_seq,
            deps=_json_column("deps", deps),
            after=_json_column("after", after),
            position=position,
            record_seq=record_seq,
        )
    except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        raise LogCorrupted(
            f"unreadable event row at position {position!r} of log {log!r}: {exc}; restore the log from a "
            "backup"
        ) from exc


def _json_column(name: str, value: Any) -> Any:
    """The JSON text of a stored column, parsed (its shape is checked by `LoggedEvent`)."""
    if type(value) is not str:
        raise TypeError(f"{name} must be JSON text, not {type(value).__name__}")
    return json.loads(value)
