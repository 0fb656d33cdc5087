"""SQL stores (SQLite and PostgreSQL) over SQLAlchemy, with group commit.

Every request (read or write) joins a batch, and a batch is one transaction; each caller is answered only
after that transaction has committed. Concurrent runs therefore share commits (group commit) without
weakening durability, and a lone caller is served at once. Batches are formed in two places:

- Async callers of a SQLite store: inside the event loop. All requests made before the loop gets back to
  its callbacks run as one transaction, synchronously (no thread hand-offs). The loop never waits for a
  lock: if another process holds SQLite's write lock, the batch moves to the store's thread. A batch of
  128 requests or more runs with CPython's cyclic garbage collector paused (`gc.disable()`, then
  `gc.enable()` if it was enabled), which spares thousands of runs in flight collections that free
  nothing (docs/performance.md).
- Everyone else (blocking callers, PostgreSQL): one thread per store object owns a connection and answers
  whatever is queued when it becomes free, in one transaction.

On SQLite a batch's inserts and loads run as a few multi-row statements rather than one per request (see
`SQLStore._apply_sqlite`); each request still gets exactly what it would get alone.

Tables (names carry the store's `table_prefix`, default ``bide_``):

- ``<prefix>records(run_id, key, seq, data)``: unique (run_id, key); unique seq per run. SQLite uses the
  rowid as seq (writers are serialized by the database lock, so rowid order is commit order). PostgreSQL
  takes seq numbers from ``<prefix>runs.next_seq`` under that row's lock, which it holds until commit, so
  each run's seq order is its commit order.
- ``<prefix>runs(run_id, next_seq, holder, token, expires_ms, ended)``: one row per run: listing, the per-run
  seq counter on PostgreSQL, the run's lease (S9) and whether it has ended (S8). Every insert reads its run's
  row in its own transaction (locked on PostgreSQL, under the database lock on SQLite) to check the fence
  and the end. A transaction that only grants, renews or releases leases is not synced to disk on commit
  (``synchronous=NORMAL`` on SQLite, set for that transaction alone; ``synchronous_commit=off`` on
  PostgreSQL): the next durable commit
  syncs it (the write-ahead log is one sequence), and a grant lost to a crash is harmless, because fences
  compare the holder's random id as well as the token, so nobody can write under a grant the store forgot.
  On PostgreSQL a grant or renewal is one upsert (``INSERT ... ON CONFLICT DO UPDATE ... WHERE ...
  RETURNING``) applying the rule `decide_lease` states; a refused one reads the live lease to answer who
  holds it. On SQLite the store reads the row, decides with `decide_lease` and writes.

A transaction that loses to another one (SQLite: the database was locked; PostgreSQL: a serialization
failure or deadlock) did nothing and is run again under the one retry policy, `bide.RetryPolicy`
(`_BATCH_RETRY`); errors are told apart by SQLite result code and SQLSTATE, not by their text. A lock held
elsewhere is waited for at most the store's busy timeout, on both databases (PostgreSQL: `lock_timeout`,
set on every connection), and is then reported: nothing was written. Inside the event loop nothing waits:
a locked database hands the batch to the store's thread.

A process paused inside a transaction (SIGSTOP, a frozen VM) holds its locks: its run's row, the run's
lease. On PostgreSQL every connection sets `idle_in_transaction_session_timeout` to half the busy timeout,
so the server ends such a session before the others' lock waits run out; and a pipelined batch sends a Sync
before it waits for an answer (`_SyncingCursor`), because the server arms that timeout only at a Sync: in
the middle of a pipeline a session counts as active, and a paused one would hold its locks until it woke.
The woken process finds its connection closed and sends the batch again (below). SQLite has no such
bound: its transactions are kept short, and a process paused inside one blocks writers until it wakes.

A PostgreSQL batch whose connection broke (a backend killed, a server restarting or failing over, an
acknowledgement lost on the way back) is sent again on a new connection, with growing pauses, until the
busy timeout. The lost try may have committed, so the answer of a resent batch counts what that try wrote
as its own (`_own`): an item stored with exactly the request's bytes was written by it (every journal
record carries 32 random bytes: equal bytes are the same record), and a lease held by the request's holder
(a random id per drive) was granted to it. Every record is fenced and insert-if-absent, so sending a batch
again never writes twice; its lock waits are bounded by what is left of the busy timeout. Past it, every
request of the batch is told that a write may or may not have committed.

Write hooks (`SQLStore.add_write_hook`, see `HookedStore` in bide/_store.py): in a transaction that
inserted records, after the inserts and before COMMIT, each hook is called with the transaction's cursor
inside its own SAVEPOINT. A hook that raises has its savepoint rolled back and its error reported; the
batch commits anyway. If even the savepoint cannot be rolled back (a broken connection), the batch is
retried without hooks: a hook never costs a write.

Extension point: `SQLStore.engine`, `SQLStore.metadata` and `SQLStore.table_prefix` are public, so another
component (the audit log) can add its own tables beside these with the same prefix and engine; their names
go in `_PREFIXED_NAMES`, which bounds a prefix's length on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import math
import operator
import os
import queue
import shlex
import sqlite3
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ._dbfile import (
    OpenedFile,
    connect_existing,
    not_a_database,
    other_names,
    out_of_reach,
    sqlite_uri,
    why_unwritable,
)
from ._errors import ConfigError, StoreError, StoreNotFound, WriteRefused
from ._memory import _check
from ._retry import RetryPolicy
from ._store import (
    END_KEY,
    Entry,
    Fence,
    Lease,
    WriteHook,
    WriteHooks,
    WriteTransaction,
    close_after_finishers,
    decide_lease,
    may_use_while_closing,
    refuse_ended,
    refuse_fence,
    written_by,
)
from ._url import (
    libpq_bounds,
    missing_database,
    refused_for_good,
    refused_option,
    refused_option_value,
    server_keepalives,
    without_password,
)

__all__ = ["SQLStore"]


def _from(after: int) -> int:
    """The least seq a load reads (loads read `seq >= _from(after)`): past `after`, or for a whole journal
    (after 0) the least seq a column holds. bide writes no record at seq 0 or below, but an edit can put
    one there, where `get` and an insert's key conflict see it: a whole load shows it too (the journal is
    then refused as damaged, and its export as edited), instead of a journal read without it."""
    return after + 1 if after > 0 else -(2**63)

_STOP = object()
_T = TypeVar("_T")

# Rows per multi-row statement of a SQLite batch (3 variables a row stays under SQLite's oldest variable
# limit, 999). Chunks are powers of two up to this, so a few statement texts serve every batch size and
# stay in the connection's statement cache.
_CHUNK = 256
_by_run_id = operator.attrgetter("run_id")
_entry_seq = operator.attrgetter("seq")


_LEASE_OPS = frozenset({"lease", "release"})
# A PostgreSQL batch writing more record bytes than this goes without the pipeline. In pipeline mode
# psycopg 3.3 can wait forever on a statement carrying several MB (seen from 6 MB of bytea[]: the client
# waiting in Pipeline.sync, the server session 'active', nothing left in either socket queue), and no
# timeout ends that wait; sent plainly, the same statement takes its time and returns. Beside sending that
# much, the plain path's two extra round trips cost nothing.
_PIPELINE_MAX_BYTES = 1 << 20


@dataclass(slots=True)
class _Refused:
    """The answer of an insert the store refused (S8, S10): the caller gets `error`, the batch goes on."""

    error: WriteRefused


class _FileGone(StoreError):
    """The store's file (or the write-ahead log a connection writes to) is no longer at the store's path:
    nothing more is written through this store object, for any request."""

    def __init__(self, message: str) -> None:
        super().__init__(message, lasting=True)


class _CommittedElsewhere(_FileGone):
    """A transaction committed, but into a store file (or write-ahead log) no longer at the store's path:
    its writes are lost with that file. Never run again: not as a batch, not request by request."""


class _ClosedUnder(_FileGone):
    """An in-loop connection was asked for after the store's close() closed it: none is opened again (a
    write would land after the close, on a connection nobody closes), and nothing of the batch ran."""


class _HooksBroken(Exception):
    """A hook's savepoint could not be rolled back or released: the transaction is lost; retry without
    hooks."""


class _Slot:
    """One connection, opened lazily and replaced after an error."""

    def __init__(self, store: SQLStore, *, in_loop: bool = False) -> None:
        self.store = store
        self.in_loop = in_loop
        self.raw: Any = None
        # Every slot's connection is also in this set of the store's, which its finalizer closes (see
        # SQLStore._finalizer).
        self.held = store._held
        # Held by the thread that owns an in-loop slot while it runs a batch on it: sqlite3 crashes the
        # process (SIGSEGV) when a connection is closed by another thread in the middle of a statement.
        self.using = threading.RLock()

    def get(self) -> Any:
        if self.raw is None or not self.raw.is_valid:  # (invalidated: see SQLStore._pipelined)
            if self.in_loop and self.store._closed:
                # (The store's thread serves, after the close, what was accepted before it: its own slot
                # may connect again; it is closed when that thread stops.)
                raise _ClosedUnder("closed")
            raw = self.store.engine.raw_connection()
            if self.store.dialect == "sqlite":
                driver: Any = raw.driver_connection
                driver.isolation_level = None
                if self.in_loop:
                    # Never wait for a lock inside the event loop: a busy database hands the batch to the
                    # store's thread, which waits with the full busy timeout.
                    driver.execute("PRAGMA busy_timeout=0")
            self.held.discard(self.raw)
            self.raw = raw
            self.held.add(raw)
        return self.raw

    def drop(self) -> None:
        raw, self.raw = self.raw, None
        self.held.discard(raw)
        if raw is not None:
            # The connection may be dead; it is discarded either way.
            with contextlib.suppress(Exception):
                raw.rollback()
            with contextlib.suppress(Exception):
                raw.invalidate()

    def close(self) -> None:
        raw, self.raw = self.raw, None
        self.held.discard(raw)
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.close()

    def forked(self) -> None:
        """In a child just forked: leave this slot's connection, a copy of one of the parent's, to the
        parent (see `SQLStore._forked`)."""
        raw, self.raw = self.raw, None
        self.held.discard(raw)
        if raw is None:
            return
        # Held by another thread of the parent at the fork: it was inside a transaction there.
        idle = self.using.acquire(blocking=False)
        if idle and self.store.dialect == "sqlite":
            # The child's copy of an idle connection is closed before the child opens any: left open, it
            # would share SQLite's per-process lock records with the child's own connections, which would
            # then not really hold the file's locks. Closing it ends nothing of the parent's (its locks are
            # its own), and it checkpoints and deletes the -wal file only when it gets the file's exclusive
            # lock, which the parent's open connections deny it.
            with contextlib.suppress(Exception):
                raw.close()
            return
        # Never closed, rolled back or returned to the pool here: on PostgreSQL that would end the parent's
        # session, or put a ROLLBACK on its wire; on SQLite, rolling back the copy of a transaction under
        # way would rewrite the shared -shm index under the parent's write. detach() stops SQLAlchemy from
        # rolling it back when it finds the connection unreferenced; psycopg ends a session only in the
        # process that opened it.
        with contextlib.suppress(Exception):
            raw.detach()
        if self.store.dialect == "sqlite":
            _LEFT_TO_PARENT.append(raw)  # never deallocated (which would close it) while the child runs

    def close_unless_used(self) -> None:
        """Close it now unless its thread is running a batch on it, which then closes it itself, having
        seen the store closed (`SQLStore._flush_local`)."""
        if self.using.acquire(blocking=False):
            try:
                self.close()
            finally:
                self.using.release()


# The stores open in this process, and the child's copies of SQLite connections a thread of the parent was
# using when it forked (see `_Slot.forked`).
_OPEN_STORES: weakref.WeakSet[SQLStore] = weakref.WeakSet()
_LEFT_TO_PARENT: list[Any] = []


class _LoopBatch(threading.local):
    """Per-thread state of the in-loop group commit used by async callers of SQLite stores."""

    def __init__(self) -> None:
        self.pending: list[_Request] = []
        self.scheduled = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.slot: _Slot | None = None


# The in-loop batches from this many requests on run with the garbage collector paused (see _flush_local):
# about where a batch allocates more objects than the collector's first threshold (700 by default).
_GC_PAUSE_BATCH = 128

_IDENT_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# Every table, index and constraint name bide makes under a store's table prefix, less the prefix: the
# store's (`SQLStore._tables`, `SQLStore._add_open_runs_index`; records_run_key on SQLite alone) and the
# audit log's (bide/audit/_hashes.py), which `bide-audit export` makes beside them months later. The longest
# bounds the prefix on PostgreSQL. Left out: the primary keys the server names (<table>_pkey), whose names
# it shortens to fit. tests/bide/test_pg_table_prefix_length.py checks this list against the database.
_PREFIXED_NAMES = (
    "records", "records_pk", "records_run_seq", "records_run_key", "runs", "runs_open",
    "audit_tiles", "audit_tiles_pk", "audit_tile_trees",
)  # fmt: skip
_PG_NAME_BYTES = 63  # PostgreSQL's longest identifier (NAMEDATALEN - 1): SQLAlchemy refuses longer names


@dataclass(slots=True)
class _Request:
    """One queued operation. Blocking callers wait on `future`; async callers get their answer through
    `afuture`, delivered on their event loop once per batch (one wake-up per loop, not one per request)."""

    run_id: str
    op: str  # "insert" | "get" | "load" | "runs" | "lease" | "release" | "expired"
    args: Any
    future: Future[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    afuture: asyncio.Future[Any] | None = None

    def named(self) -> str:
        """The request in an error message: `insert on run 'r1'`, or what a listing does."""
        listing = _LISTING_NAMES.get(self.op)
        if listing is not None:
            return listing
        return f"{self.op} on run {self.run_id!r}" if self.run_id else self.op

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.future is not None:
            if error is not None:
                self.future.set_exception(error)
            elif type(result) is _Refused:
                self.future.set_exception(result.error)
            else:
                self.future.set_result(result)


_Answer = tuple[asyncio.Future[Any], Any, BaseException | None]


def _deliver(answers: list[_Answer]) -> None:
    for fut, result, error in answers:
        if fut.cancelled():
            continue
        if error is not None:
            fut.set_exception(error)
        elif type(result) is _Refused:
            fut.set_exception(result.error)
        else:
            fut.set_result(result)


class SQLStore:
    """A durable `Store` in SQLite (one machine) or PostgreSQL (many processes and machines).

    SQLite runs in WAL mode with ``synchronous=FULL`` (a committed record survives power loss) and a busy
    timeout; it is for processes on one machine and one local disk (not NFS). On PostgreSQL the busy
    timeout bounds lock waits too, and how long a request whose connection broke is sent again (see the
    module docstring).
    """

    durable = True

    def __init__(
        self, url: str, *, table_prefix: str = "bide_", busy_timeout: float = 30.0, create: bool = True
    ) -> None:
        """Open the store at `url` (``sqlite:///path`` or ``postgresql://...``; see `open_store`), creating
        its tables if they are missing. With `create=False` nothing is created: a missing SQLite file or a
        database without this prefix's tables raise `StoreNotFound`, and the file or database is left as
        it was. A PostgreSQL database that does not exist raises `StoreNotFound` either way (bide creates
        tables, never databases). Tables made by an earlier bide are brought up to date either way."""
        if not table_prefix or not set(table_prefix) <= _IDENT_OK:
            raise ConfigError(f"table_prefix must be letters, digits and underscores, got {table_prefix!r}")
        self.url = url
        self._shown = without_password(url)  # for messages and thread names, which reach logs
        self.table_prefix = table_prefix
        sa_url = make_url(url)
        if sa_url.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
            sa_url = sa_url.set(drivername="postgresql+psycopg")
            self.dialect = "postgresql"
        elif sa_url.drivername in ("sqlite", "sqlite+pysqlite"):
            self.dialect = "sqlite"
            if not sa_url.database or sa_url.database == ":memory:":
                raise ConfigError(
                    "a SQLite store needs a file path (sqlite:///path/to/bide.db); use memory:// "
                    "for a throwaway store"
                )
        else:
            raise ConfigError(
                f"unsupported store URL {without_password(url)!r}: use memory://, sqlite:///path or "
                "postgresql://..."
            )
        if self.dialect == "postgresql" and table_prefix != table_prefix.lower():
            # The tables would be made under their quoted names, and every statement, which names them
            # unquoted, would look for the lower-case ones PostgreSQL folds such names to.
            raise ConfigError(
                f"on PostgreSQL a table_prefix must be lower case (unquoted names are folded to lower "
                f"case), got {table_prefix!r}: use {table_prefix.lower()!r}"
            )
        if self.dialect == "postgresql":
            _check_pg_prefix_length(table_prefix)
        self._busy_ms = _busy_ms(busy_timeout, self.dialect)
        self._server_keepalives = server_keepalives(self._busy_ms / 1000, sa_url.query.get("options", ()))
        self._file: OpenedFile | None = None  # SQLite: the file, once open (see bide/_dbfile.py)
        if self.dialect == "sqlite":
            # The path is made absolute once: a later os.chdir must not point new connections elsewhere.
            self._path = os.path.abspath(sa_url.database or "")
            sa_url = sa_url.set(database=self._path)
            creator = _weakly(self._open_sqlite)
            self.engine = sa.create_engine(sa_url, poolclass=sa.pool.NullPool, creator=creator)
            sa.event.listen(self.engine, "connect", _weakly(self._sqlite_pragmas))
        else:
            # libpq waits for a server that accepts and never answers, or for an answer on a path that went
            # silent, as long as the operating system lets it: minutes or forever. The busy timeout bounds
            # each connection attempt and a silent connection (libpq_bounds); options in the URL win.
            bounded: dict[str, int | str] = {**libpq_bounds(sa_url.query, busy_timeout)}
            given = sa_url.query.get("options", ())
            if not isinstance(given, str):
                # `options` given twice or more (one setting each) reaches libpq as one string, as the
                # event log joins them: SQLAlchemy would pass the tuple's repr, which the server refuses.
                bounded["options"] = " ".join(given)
            self.engine = sa.create_engine(sa_url, pool_pre_ping=True, pool_size=2, connect_args=bounded)
            sa.event.listen(self.engine, "connect", _weakly(self._postgresql_session))
        self.metadata = sa.MetaData()
        self.records_table, self.runs_table = self._tables()
        linked = other_names(self._path, "the store file") if self.dialect == "sqlite" else None
        if linked is not None:
            self.engine.dispose()
            raise StoreError(f"cannot open the store {without_password(url)}: {linked}", lasting=True)
        try:
            self._prepare_schema(create=create)
            if self.dialect == "sqlite":
                self._file = OpenedFile(self._path, "the store file")
        except BaseException:
            self.engine.dispose()
            raise
        p = table_prefix
        # A lease alone makes a runs row; a run exists (is listed) from its first record on.
        has_records = f"EXISTS (SELECT 1 FROM {p}records AS r WHERE r.run_id = {p}runs.run_id)"
        if self.dialect == "sqlite":
            # A record's bytes whatever the stored value's type: a row edited by hand as TEXT is read as
            # its bytes (then refused as damaged, like any edited record), not failed on as a store error.
            data = "CAST(data AS BLOB)"
            self._sql_run = f"INSERT OR IGNORE INTO {p}runs(run_id) VALUES (?)"
            self._sql_ins = f"INSERT OR IGNORE INTO {p}records(run_id, key, data) VALUES (?, ?, ?)"
            self._sql_get = f"SELECT seq, {data} FROM {p}records WHERE run_id = ? AND key = ?"
            self._sql_delete = f"DELETE FROM {p}records WHERE seq = ?"
            self._sql_load = (
                f"SELECT seq, key, {data} FROM {p}records WHERE run_id = ? AND seq >= ? ORDER BY seq"
            )
            self._sql_runs = (
                f"SELECT run_id FROM {p}runs WHERE run_id > ? AND substr(run_id, 1, ?) = ? AND {has_records} "
                "{open} ORDER BY run_id LIMIT ?"
            )
            # Multi-row forms for a batch, by row count (powers of two, see _CHUNK).
            self._sql_runs_many = {
                n: f"INSERT OR IGNORE INTO {p}runs(run_id) VALUES " + ", ".join(["(?)"] * n)
                for n in _chunk_sizes()
            }
            self._sql_ins_many = {
                n: f"INSERT OR IGNORE INTO {p}records(run_id, key, data) VALUES "
                + ", ".join(["(?, ?, ?)"] * n)
                for n in _chunk_sizes()
            }
            self._sql_inserted = f"SELECT seq, run_id, key FROM {p}records WHERE seq > ? AND seq <= ?"
            # Each q row is looked up in the (run_id, seq) index, so its records come in seq order; no ORDER
            # BY (a sort of every loaded record), the order is checked as the rows are read instead.
            self._sql_load_many = {
                n: f"WITH q(i, run_id, after) AS (VALUES {', '.join(['(?, ?, ?)'] * n)}) "
                f"SELECT q.i, r.seq, r.key, CAST(r.data AS BLOB) FROM q CROSS JOIN {p}records AS r "
                "ON r.run_id = q.run_id AND r.seq >= q.after"
                for n in _chunk_sizes()
            }
            self._sql_get_many = {
                n: f"WITH q(i, run_id, key) AS (VALUES {', '.join(['(?, ?, ?)'] * n)}) "
                f"SELECT q.i, r.seq, CAST(r.data AS BLOB) FROM q CROSS JOIN {p}records AS r "
                "ON r.run_id = q.run_id AND r.key = q.key"
                for n in _chunk_sizes()
            }
            self._sql_rows_many = {
                n: f"SELECT run_id, holder, token, expires_ms, ended FROM {p}runs WHERE run_id IN "
                f"({', '.join(['?'] * n)})"
                for n in _chunk_sizes()
            }
            # The insert requests of a batch that `_verdict` must look at: their run has ended, or their fence
            # (holder, token; NULL for none) is not the run's lease. The rest are admitted without a row.
            self._sql_admit_many = {
                n: f"WITH q(i, run_id, holder, token) AS (VALUES {', '.join(['(?, ?, ?, ?)'] * n)}) "
                f"SELECT q.i, r.run_id, r.holder, r.token, r.expires_ms, r.ended FROM q "
                f"LEFT JOIN {p}runs AS r ON r.run_id = q.run_id WHERE r.ended OR (q.holder IS NOT NULL AND "
                "(r.run_id IS NULL OR r.holder IS NOT q.holder OR r.token IS NOT q.token))"
                for n in _chunk_sizes()
                if n <= _CHUNK // 2
            }
            self._sql_end_many = {
                n: f"UPDATE {p}runs SET ended = 1 WHERE run_id IN ({', '.join(['?'] * n)})"
                for n in _chunk_sizes()
            }
            self._sql_lease_row = f"INSERT OR IGNORE INTO {p}runs(run_id) VALUES (?)"
            self._sql_lease_get = f"SELECT holder, token, expires_ms FROM {p}runs WHERE run_id = ?"
            # The leases a batch grants or renews, written in one statement per chunk (see _leases_sqlite).
            self._sql_lease_many = {
                n: f"INSERT INTO {p}runs(run_id, holder, token, expires_ms) VALUES "
                + ", ".join(["(?, ?, ?, ?)"] * n)
                + " ON CONFLICT (run_id) DO UPDATE SET holder = excluded.holder, token = excluded.token, "
                "expires_ms = excluded.expires_ms"
                for n in _chunk_sizes()
            }
        else:
            # An insert request in one statement (one round trip, whatever its size): lock the run's row
            # and reserve the request's seq numbers (the upsert, whose RETURNING is the row as locked), then
            # insert every absent item if the lease and the end allow it (what `_verdict` checks after, on
            # that row), answering the row and what was inserted.
            self._sql_write = (
                f"WITH run AS (INSERT INTO {p}runs(run_id, next_seq) VALUES (%(run)s, %(n)s) "
                f"ON CONFLICT (run_id) DO UPDATE SET next_seq = {p}runs.next_seq + EXCLUDED.next_seq "
                "RETURNING next_seq, holder, token, expires_ms, ended), "
                f"written AS (INSERT INTO {p}records(run_id, key, seq, data) "
                "SELECT %(run)s, u.key, run.next_seq - %(n)s + u.i, u.data "
                "FROM run, unnest(%(keys)s::text[], %(data)s::bytea[]) WITH ORDINALITY AS u(key, data, i) "
                "WHERE run.ended = 0 AND (%(holder)s::text IS NULL "
                "OR (run.holder = %(holder)s::text AND run.token = %(token)s::bigint)) "
                "ON CONFLICT (run_id, key) DO NOTHING RETURNING key, seq) "
                "SELECT run.holder, run.token, run.expires_ms, run.ended, "
                "(SELECT array_agg(key) FROM written), (SELECT array_agg(seq) FROM written) FROM run"
            )
            self._sql_lease_row = f"INSERT INTO {p}runs(run_id) VALUES (%s) ON CONFLICT (run_id) DO NOTHING"
            self._sql_lease_get = (
                f"SELECT holder, token, expires_ms FROM {p}runs WHERE run_id = %s FOR UPDATE"
            )
            self._sql_delete = f"DELETE FROM {p}records WHERE run_id = %s AND seq = ANY(%s::bigint[])"
            self._sql_get = f"SELECT seq, data FROM {p}records WHERE run_id = %s AND key = %s"
            self._sql_load = (
                f"SELECT seq, key, data FROM {p}records WHERE run_id = %s AND seq >= %s ORDER BY seq"
            )
            self._sql_runs = (
                f"SELECT run_id FROM {p}runs WHERE run_id > %s AND left(run_id, %s) = %s AND {has_records} "
                "{open} ORDER BY run_id LIMIT %s"
            )
        # Every run, or (`open_only`) the runs that have not ended.
        self._sql_open_runs = self._sql_runs.format(open="AND ended = 0")
        self._sql_runs = self._sql_runs.format(open="")
        ph = "?" if self.dialect == "sqlite" else "%s"
        self._sql_lease_set = (
            f"UPDATE {p}runs SET holder = {ph}, token = {ph}, expires_ms = {ph} WHERE run_id = {ph}"
        )
        self._sql_release = (
            f"UPDATE {p}runs SET expires_ms = 0 WHERE run_id = {ph} AND holder = {ph} AND token = {ph}"
            + ("" if self.dialect == "sqlite" else " RETURNING run_id")
        )
        # A run that never had a lease (holder NULL: its driver was a bide from before leases, which a crash
        # or an upgrade stopped) is listed too, as free: else no worker would ever resume it.
        # With the seq of each run's latest record (`Lease.last_seq`), found in the (run_id, seq) index.
        last_seq = f"(SELECT max(r.seq) FROM {p}records AS r WHERE r.run_id = {p}runs.run_id)"
        self._sql_expired = (
            f"SELECT run_id, COALESCE(holder, ''), token, expires_ms, {last_seq} FROM {p}runs WHERE "
            f"run_id > {ph} AND ended = 0 AND expires_ms <= {ph} AND {has_records} ORDER BY run_id LIMIT {ph}"
        )
        self._sql_end = f"UPDATE {p}runs SET ended = 1 WHERE run_id = {ph}"
        # The lease rule S9 (`decide_lease`) as one statement: grant (a new runs row, or a free or expired
        # lease asked for without a token: the token grows) or renew (the holder presenting the current
        # token), answering the token; no row back means another holder's live lease or a stale renewal,
        # read by `_sql_lease_get`.
        if self.dialect == "sqlite":
            run, holder, token, expires, now = ":run_id", ":holder", ":token", ":expires", ":now"
        else:
            names = ("run_id", "holder", "token", "expires", "now")
            run, holder, token, expires, now = (f"%({n})s" for n in names)
        renewal = f"({p}runs.holder = {holder} AND {p}runs.token = {token} AND {token} <> 0)"
        self._sql_lease_take = (
            f"INSERT INTO {p}runs(run_id, holder, token, expires_ms) VALUES ({run}, {holder}, 1, {expires}) "
            f"ON CONFLICT (run_id) DO UPDATE SET "
            f"token = CASE WHEN {renewal} THEN {p}runs.token ELSE {p}runs.token + 1 END, "
            f"holder = {holder}, expires_ms = {expires} "
            f"WHERE {renewal} OR {p}runs.holder IS NULL OR ({token} = 0 AND {p}runs.expires_ms <= {now}) "
            "RETURNING token"
        )
        # PostgreSQL takes the upsert (one round trip instead of three). SQLite reads, decides and writes: its
        # RETURNING buffers the row in a temporary table, and in-process statements cost no round trip, so
        # three plain statements measured no slower than the upsert.
        self._lease_upsert = self.dialect != "sqlite"
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._held: set[Any] = set()  # the connections the slots hold (see _Slot)
        self._worker_slot = _Slot(self)
        self._local = _LoopBatch()
        # The in-loop connections, each with the thread that uses it (see _flush_local).
        self._slots: list[tuple[weakref.ref[threading.Thread], _Slot]] = []
        self._closed = False
        self._closing = False  # close() was called: only the threads it waits for may still use it
        # Requests put in the queue, and answered by the store's thread: equal when it has nothing in hand.
        self._queued = 0
        self._served = 0
        self.commits = 0  # transactions committed by this store object (for benchmarks)
        self._known_runs: set[str] = set()  # SQLite: runs whose runs row is committed
        self._hooks = WriteHooks()
        self.hook_errors = self._hooks.errors
        self._fork_held: list[_Slot] = []  # (see _hold_for_fork)
        self._when_dropped = self._finalizer()
        _OPEN_STORES.add(self)

    def _finalizer(self) -> weakref.finalize[Any, SQLStore]:
        """What frees a store dropped without `close()` once it is collected: its thread stops and its
        connections close. Nothing it holds leads back to the store (the engine's creator and listeners
        and the thread hold it weakly), so a forgotten store is collected, where it used to keep its thread
        and its sessions for the life of the process."""
        held = (self._queue, self.engine, self._held, self._shown)
        dropped = weakref.finalize(self, _let_go_of_dropped, *held)
        dropped.atexit = False  # a store still open at exit is left as before: its thread is a daemon
        return dropped

    # -- schema -------------------------------------------------------------------------------------------

    def _open_sqlite(self) -> sqlite3.Connection:
        """A connection to the store's file (connections are per thread; check_same_thread=False only so
        close() can close them all). Once the store is open, only to the file it opened, never creating
        one: a store file deleted or replaced meanwhile raises `StoreError`."""
        if self._file is None:
            return sqlite3.connect(self._path, timeout=self._busy_ms / 1000, check_same_thread=False)
        conn = connect_existing(self._file, self._busy_ms / 1000)
        if isinstance(conn, str):
            raise _FileGone(self._swapped(conn))
        return conn

    def _swapped(self, what: str, *, committed: bool = False) -> str:
        done = (
            "this write committed into the old file and is lost with it"
            if committed
            else "nothing more is written through this store object"
        )
        return (
            f"{what} while this process had it open: {done}. Stop every process using the store; then put "
            "the file back (or restore it from a backup with no process running) and open the store again"
        )

    def _check_file(self, raw: Any, *, committed: bool) -> None:
        """Raise `_FileGone` (`_CommittedElsewhere` after a commit) when the store's file, or the
        write-ahead log connection `raw` writes to, is no longer at its path (see bide/_dbfile.py)."""
        swapped = None if self._file is None else self._file.swapped(raw.info)
        if swapped is not None:
            error = _CommittedElsewhere if committed else _FileGone
            raise error(self._swapped(swapped, committed=committed))

    def _sqlite_pragmas(self, dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        cur.close()

    def _tables(self) -> tuple[sa.Table, sa.Table]:
        p = self.table_prefix
        text = sa.String(collation="C") if self.dialect == "postgresql" else sa.String()
        if self.dialect == "sqlite":
            records = sa.Table(
                f"{p}records",
                self.metadata,
                sa.Column("seq", sa.Integer, primary_key=True),
                sa.Column("run_id", text, nullable=False),
                sa.Column("key", text, nullable=False),
                sa.Column("data", sa.LargeBinary, nullable=False),
                sa.UniqueConstraint("run_id", "key", name=f"{p}records_run_key"),
                sa.Index(f"{p}records_run_seq", "run_id", "seq"),
            )
        else:
            records = sa.Table(
                f"{p}records",
                self.metadata,
                sa.Column("run_id", text, nullable=False),
                sa.Column("key", text, nullable=False),
                sa.Column("seq", sa.BigInteger, nullable=False),
                sa.Column("data", sa.LargeBinary, nullable=False),
                sa.PrimaryKeyConstraint("run_id", "key", name=f"{p}records_pk"),
                sa.UniqueConstraint("run_id", "seq", name=f"{p}records_run_seq"),
            )
        runs = sa.Table(
            f"{p}runs",
            self.metadata,
            sa.Column("run_id", text, primary_key=True),
            sa.Column("next_seq", sa.BigInteger, nullable=False, server_default="0"),
            *_lease_columns(),
        )
        return records, runs

    def _postgresql_session(self, dbapi_conn: Any, _record: Any) -> None:
        # A lock held elsewhere (a session idle in a transaction, a LOCK TABLE) is waited for as long as a
        # SQLite store waits for its file: the busy timeout, then the request fails (wrote nothing).
        # A session paused inside a transaction is ended by the server before those waits run out (see the
        # module docstring).
        # Both in one round trip, outside a transaction (no BEGIN, no COMMIT): every round trip of an open
        # is one more chance for a server ending sessions to end this one.
        # The server's keepalives end the session of a driver whose host died or was cut off mid-transaction,
        # freeing its locks within about the busy timeout (`server_keepalives`).
        keepalives = "".join(f"; SET {name} = {value}" for name, value in self._server_keepalives.items())
        dbapi_conn.autocommit = True
        try:
            dbapi_conn.execute(
                f"SET lock_timeout = {self._busy_ms}; "
                f"SET idle_in_transaction_session_timeout = {max(1, self._busy_ms // 2)}{keepalives}"
            )
        finally:
            if not dbapi_conn.closed:
                dbapi_conn.autocommit = False

    def _prepare_schema(self, *, create: bool) -> None:
        if self.dialect != "postgresql":
            self._prepare_schema_once(create=create)
            return
        # A session the server ended while the store opened (a killed backend, a restart), or a login it
        # refused while starting or with every connection slot taken, is opened again, as a request would
        # be sent again, for up to the busy timeout; a server that refuses connections is reported at once.
        began = time.monotonic()
        until = began + self._busy_ms / 1000
        tries = 0
        while True:
            try:
                self._prepare_schema_once(create=create)
                return
            except (StoreError, sa.exc.DBAPIError) as exc:
                cause = exc.__cause__ if isinstance(exc, StoreError) else exc
                if cause is None or not _session_ended(cause):
                    raise
                pause = _RECONNECT.wait(tries)
                tries += 1
                if time.monotonic() + pause >= until:
                    if type(exc) is not StoreError or tries == 1:
                        raise
                    # Said, or the wait (up to the busy timeout, silent) looks like a hang that ended.
                    raise StoreError(
                        f"{exc} (tried {tries} times over {time.monotonic() - began:.0f} s, the store's busy "
                        "timeout: the server went on refusing or ending the session)"
                    ) from cause
                time.sleep(pause)

    def _prepare_schema_once(self, *, create: bool) -> None:
        if self.dialect == "postgresql" and self._connect_once():
            return
        if not create:
            self._require_schema()

        # Several processes may open a new database at once; losing the CREATE race is fine: try again.
        def prepare() -> None:
            self._refuse_foreign_tables()
            if create:
                self.metadata.create_all(self.engine, checkfirst=True)
            self._add_lease_columns()
            self._add_open_runs_index()

        try:
            _SCHEMA_RETRY.run_sync(prepare, _schema_race)
        except sa.exc.DBAPIError as exc:
            where = without_password(self.url)
            if _lock_timeout(exc):
                raise StoreError(
                    f"cannot open the store {where}: its tables stayed locked by another session past the "
                    f"busy timeout ({self._busy_ms / 1000:g} s); find that session (pg_stat_activity: one "
                    "'idle in transaction', one 'active' waiting on ClientRead, or one holding LOCK TABLE) "
                    "and end it"
                ) from exc
            if self.dialect == "sqlite":
                raise StoreError(
                    f"cannot open the store {where}: {_first_line(exc)}{why_unwritable(self._path, exc)}"
                ) from exc
            raise StoreError(f"cannot create bide tables in {where}: {_first_line(exc)}") from exc

    def _connect_once(self) -> bool:
        """Connect to PostgreSQL before the tables are looked at: a database that does not exist raises
        `StoreNotFound` and an option value libpq refuses `StoreURLError`; any other failure is the
        store's (`StoreError`). True when the store is already as this version of bide makes it (its two
        tables with their columns, and the open-runs index), which is all an open of an existing store
        needs to know, asked in one query: an open is then a few round trips, short enough to get through
        a server that ends sessions often (a server restarting, a pooler recycling them), where the
        catalogue reads below, one round trip each, took 40 ms."""
        where = without_password(self.url)
        try:
            with self.engine.connect() as conn:
                return self._pg_schema_current(conn)
        except sa.exc.DBAPIError as exc:
            database = missing_database(exc.orig)
            if database is not None:
                raise StoreNotFound(
                    f'no bide store at {where}: the database "{database}" does not exist, and bide creates '
                    f"tables, never databases: create it (e.g. createdb {shlex.quote(database)}) or name an "
                    "existing database",
                    missing="database",
                ) from exc
            refused = refused_option(self.url, self.engine.url.query, str(exc.orig))
            if refused is not None:
                raise refused from exc
            # The driver's words on one line, without SQLAlchemy's wrapper and its link.
            said = " ".join(line.strip() for line in str(exc.orig).splitlines() if line.strip())
            login = refused_for_good(exc.orig)
            if login is not None:
                said = f"the server refuses this login ({login}); fix the user or password in the URL"
            raise StoreError(f"cannot connect to the store {where}: {said}") from exc

    def _pg_schema_current(self, conn: sa.Connection) -> bool:
        """True when the tables this store reads and writes are there as ordinary tables holding every
        column it uses, with the open-runs index; False sends the open through the full checks (which
        name what is wrong) and the creation of what is missing."""
        records, runs = self.records_table.name, self.runs_table.name
        index = f"{self.table_prefix}runs_open"
        rows = conn.exec_driver_sql(
            "SELECT c.relname, c.relkind, c.oid, a.attname, "
            "(SELECT i.indrelid FROM pg_catalog.pg_index AS i WHERE i.indexrelid = c.oid) "
            "FROM pg_catalog.pg_class AS c "
            "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_catalog.pg_attribute AS a "
            "ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "WHERE c.relname IN (%(records)s, %(runs)s, %(index)s) AND n.nspname <> 'pg_catalog' "
            "AND pg_catalog.pg_table_is_visible(c.oid)",
            {"records": records, "runs": runs, "index": index},
        ).all()
        kinds: dict[str, str] = {}
        columns: dict[str, set[str]] = {}
        oids: dict[str, int] = {}
        indexed_table = None
        for name, kind, oid, column, table in rows:
            kinds[name], oids[name] = kind, oid
            columns.setdefault(name, set()).add(column)
            if name == index:
                indexed_table = table
        wanted = {
            records: {"run_id", "key", "seq", "data"},
            runs: {"run_id", "next_seq"} | {c.name for c in _lease_columns()},
        }
        return (
            all(kinds.get(name) == "r" and need <= columns[name] for name, need in wanted.items())
            and kinds.get(index) == "i"
            and indexed_table == oids[runs]
        )

    def _require_schema(self) -> None:
        """Raise `StoreNotFound` unless the database holds this prefix's tables, changing nothing: a SQLite
        file is read through a read-only connection of its own (the store's connections would switch it to
        WAL mode, and a missing file would be created)."""
        names = (self.records_table.name, self.runs_table.name)
        where = without_password(self.url)
        if self.dialect == "sqlite":
            path = self.engine.url.database or ""
            where = repr(path)
            reach = out_of_reach(path)
            if reach is not None:  # raised from the refusal, which says it lasts (bide._cli_common)
                raise StoreError(f"cannot open the store {where}: {reach}") from _denied(path)
            if not os.path.isfile(path):
                what = not_a_database(path) or "the file does not exist"  # a directory, a pipe, or nothing
                raise StoreNotFound(f"no bide store at {where}: {what}", missing="file")
            # SQLite matches table names without regard to ASCII case: so does this check.
            tables = {_ascii_lower(name) for name in _sqlite_tables(path, where)}
            found = {name for name in names if _ascii_lower(name) in tables}
        else:
            try:
                with self.engine.connect() as conn:
                    inspector = sa.inspect(conn)
                    found = {name for name in names if inspector.has_table(name)}
            except sa.exc.DBAPIError as exc:
                raise StoreError(f"cannot open the store {where}: {_first_line(exc)}") from exc
        missing = [name for name in names if name not in found]
        if missing:
            raise StoreNotFound(
                f"no bide store at {where}: the database has no table {' or '.join(missing)} (is the table "
                f"prefix {self.table_prefix!r} the store's?)",
                missing="tables",
            )

    def _refuse_foreign_tables(self) -> None:
        """Raise `StoreNotFound`, creating nothing, when a table of this prefix's names is there without the
        columns bide reads and writes (another program's table): the store opened, added its other table
        beside it, and failed at the first run ("no such column")."""
        inspector = sa.inspect(self.engine)
        needs = {self.records_table.name: ("run_id", "key", "seq", "data"), self.runs_table.name: ("run_id",)}
        views = {_ascii_lower(name) for name in inspector.get_view_names()}
        with contextlib.suppress(NotImplementedError):  # PostgreSQL lists its materialized views apart
            views.update(_ascii_lower(name) for name in inspector.get_materialized_view_names())
        for name, columns in needs.items():
            if _ascii_lower(name) in views:
                raise StoreNotFound(
                    f"no bide store at {without_password(self.url)}: {name} is a view, not bide's table "
                    "(bide writes to it): give bide a table prefix of its own (table_prefix=, "
                    "--table-prefix) or another database; nothing was created",
                    missing="tables",
                )
            if not inspector.has_table(name):
                continue
            have = {c["name"] for c in inspector.get_columns(name)}
            lacking = [c for c in columns if c not in have]
            if lacking:
                lacked = f"column{'s' if len(lacking) > 1 else ''} {', '.join(lacking)}"
                raise StoreNotFound(
                    f"no bide store at {without_password(self.url)}: its table {name} is not bide's (it "
                    f"lacks bide's {lacked}): give bide a table prefix of its own (table_prefix=, "
                    "--table-prefix) or another database; nothing was created",
                    missing="tables",
                )

    def _add_lease_columns(self) -> None:
        """Give a runs table made by an earlier bide its lease and end columns, marking the runs that
        ended (S8 holds for them too)."""
        p = self.table_prefix
        have = {c["name"] for c in sa.inspect(self.engine).get_columns(f"{p}runs")}
        missing = [c for c in _lease_columns() if c.name not in have]
        if not missing:
            return
        with self.engine.begin() as conn:
            for column in missing:
                kind = column.type.compile(dialect=self.engine.dialect)
                server = column.server_default
                default = "" if server is None else f" NOT NULL DEFAULT {server.arg}"  # type: ignore[attr-defined]
                conn.exec_driver_sql(f"ALTER TABLE {p}runs ADD COLUMN {column.name} {kind}{default}")
            conn.exec_driver_sql(
                f"UPDATE {p}runs SET ended = 1 WHERE run_id IN "
                f"(SELECT run_id FROM {p}records WHERE key = '{END_KEY}')"
            )

    def _add_open_runs_index(self) -> None:
        """Index the runs that have not ended: a partial index, so that what reads only those (a worker's
        poll, `expired_leases`, `runs(open_only=True)`) costs as many as are open, not as many runs as the
        store ever kept (400,000 ended runs took 70 ms per poll on SQLite, and grew with every run). Made
        once, for new and earlier stores alike; looked up first, since `CREATE INDEX IF NOT EXISTS` locks
        the table on PostgreSQL even when the index is there. Best effort: a store that cannot take it now
        (a file this user may only read, a table locked past the busy timeout) opens as it did before, its
        reads of the open runs slower, and the next open tries again."""
        p = self.table_prefix
        name = f"{p}runs_open"
        if name in {index["name"] for index in sa.inspect(self.engine).get_indexes(f"{p}runs")}:
            return
        with contextlib.suppress(sa.exc.DBAPIError), self.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS {name} ON {p}runs (run_id) WHERE ended = 0")

    # -- public blocking API --------------------------------------------------------------------------------

    def insert_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, bytes]],
        *,
        exclusive: bool = False,
        fence: Fence | None = None,
    ) -> list[Entry]:
        _check(run_id, items)
        args = (_private_copy(items), exclusive, fence)
        result: list[Entry] = self._submit(run_id, "insert", args).result()
        return result

    def lease(self, run_id: str, holder: str, *, now_ms: int, ttl_ms: int, token: int = 0) -> Lease:
        result: Lease = self._submit(run_id, "lease", (holder, now_ms, ttl_ms, token)).result()
        return result

    def release(self, run_id: str, holder: str, token: int) -> bool:
        result: bool = self._submit(run_id, "release", (holder, token)).result()
        return result

    def expired_leases(self, *, now_ms: int, after: str = "", limit: int = 500) -> list[Lease]:
        result: list[Lease] = self._submit("", "expired", (now_ms, after, limit)).result()
        return result

    def get(self, run_id: str, key: str) -> Entry | None:
        result: Entry | None = self._submit(run_id, "get", key).result()
        return result

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        result: list[Entry] = self._submit(run_id, "load", _from(after)).result()
        return result

    def runs(
        self, *, prefix: str = "", after: str = "", limit: int = 500, open_only: bool = False
    ) -> list[str]:
        result: list[str] = self._submit("", "runs", (prefix, after, limit, open_only)).result()
        return result

    # -- public async API ----------------------------------------------------------------------------------

    # Plain functions returning the request's future (no coroutine per call); they must be called from
    # a running event loop, like any coroutine would be awaited in one.

    def ainsert_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, bytes]],
        *,
        exclusive: bool = False,
        fence: Fence | None = None,
    ) -> asyncio.Future[list[Entry]]:
        _check(run_id, items)
        return self._asubmit(run_id, "insert", (_private_copy(items), exclusive, fence))

    def alease(
        self, run_id: str, holder: str, *, now_ms: int, ttl_ms: int, token: int = 0
    ) -> asyncio.Future[Lease]:
        return self._asubmit(run_id, "lease", (holder, now_ms, ttl_ms, token))

    def arelease(self, run_id: str, holder: str, token: int) -> asyncio.Future[bool]:
        return self._asubmit(run_id, "release", (holder, token))

    def aget(self, run_id: str, key: str) -> asyncio.Future[Entry | None]:
        return self._asubmit(run_id, "get", key)

    def aload(self, run_id: str, after: int = 0) -> asyncio.Future[list[Entry]]:
        return self._asubmit(run_id, "load", _from(after))

    def close(self) -> None:
        # Closed for every caller now, but released once the keepers of synchronous calls a cancelled
        # drive left running are done with it (their late outcomes journaled, their runs' leases freed).
        self._closing = True
        close_after_finishers(self, self._close_now)

    def _close_now(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._when_dropped.detach()  # closed here, not by the garbage collector
            thread = self._thread
            idle = self._queued == self._served
            if thread is not None:
                # Under the lock, as every request is put: the stop comes after each request accepted and
                # before any other (one put after it would wait for an answer for ever).
                self._queue.put(_STOP)
        for _, slot in self._slots:
            slot.close_unless_used()
        current = threading.current_thread()
        # An atexit handler (in the main thread, stopped once the interpreter joined its other threads) would
        # not have a thread started now waited for, and Python 3.12 refuses to start one: it waits here.
        at_exit = current is threading.main_thread() and not current.is_alive()
        if thread is None or idle or at_exit:
            if thread is not None and thread is not current:
                thread.join()  # idle, it stops at once
            self.engine.dispose()
            return

        # The store's thread is running a batch accepted before the close: a write waiting for a lock held
        # elsewhere, or for a lost connection to come back, is answered within the busy timeout (each such
        # batch in turn). Waiting for it here would hold up the caller (an event loop) that long; a thread
        # of its own waits, not a daemon, so that the end of the process waits for the answers too.
        def when_served() -> None:
            thread.join()
            self.engine.dispose()

        try:
            threading.Thread(target=when_served, name="bide-store-close").start()
        except RuntimeError:  # the interpreter is shutting down, and Python 3.12 starts no thread then
            if thread is not current:  # (a write hook that closed the store runs in its thread)
                thread.join()
            self.engine.dispose()

    def _hold_for_fork(self) -> None:
        """Before os.fork(), on SQLite: wait for the batches running on this store's connections and start
        no other until `_release_after_fork`, so that no thread of the parent is inside SQLite for this
        store as the child is made. A child copies a running transaction it must neither close (rolling
        the copy back rewrites the -shm index under the parent's commit) nor keep (its lock records
        refuse every write of the child's own connections), and a mutex SQLite held there, which
        nothing in the child releases: its first connection waited for ever."""
        held: list[_Slot] = []
        while True:
            with self._lock:
                slots = [self._worker_slot, *(slot for _, slot in self._slots)]
            for slot in slots:
                if slot not in held:
                    # Never while holding the store's lock: a batch takes it (after its commit) to finish.
                    slot.using.acquire()
                    held.append(slot)
            self._lock.acquire()
            if all(slot in held for slot in (self._worker_slot, *(slot for _, slot in self._slots))):
                break
            self._lock.release()  # a thread made its in-loop connection meanwhile: wait for it too
        self._fork_held = held

    def _release_after_fork(self) -> None:
        """In the parent, once forked: let the batches `_hold_for_fork` held back run."""
        held, self._fork_held = self._fork_held, []
        self._lock.release()
        for slot in held:
            slot.using.release()

    def _forked(self) -> None:
        """In a child just forked: forget the parent's thread, queue, requests in hand, locks and
        connections, so that the store works here as if opened here, on connections of its own, while
        the parent keeps its. What holds in any process stays: the runs known to have a runs row (their
        rows were committed), the write hooks, closed or not."""
        slots = [self._worker_slot, *(slot for _, slot in self._slots)]
        self._fork_held = []
        self._lock = threading.Lock()  # (another thread of the parent may have held it)
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._when_dropped.detach()  # (the parent's queue and connections are the parent's)
        self._held = set()
        if not self._closed:  # (closed before the fork: closed here too, and dropped with no warning)
            self._when_dropped = self._finalizer()
        self._queued = self._served = 0
        self._worker_slot = _Slot(self)
        self._local = _LoopBatch()
        self._slots = []
        for slot in slots:
            slot.forked()
        # Pooled connections (PostgreSQL) are dropped unclosed: closing one would end the parent's session.
        self.engine.dispose(close=False)

    def interrupt(self) -> None:
        """Cancel the statements this store's connections are running now (PostgreSQL: a cancel request to
        the server; SQLite: sqlite3's interrupt); their callers get a `StoreError`. For a caller that gave
        up waiting on them (Ctrl-C): a write among them may or may not have committed."""
        with self._lock:
            slots = [self._worker_slot, *(slot for _, slot in self._slots)]
        for slot in slots:
            raw = slot.raw
            if raw is None:
                continue
            with contextlib.suppress(Exception):  # a connection closing meanwhile has nothing to cancel
                driver: Any = raw.driver_connection
                if self.dialect == "postgresql":
                    driver.cancel()
                else:
                    driver.interrupt()

    def add_write_hook(self, hook: WriteHook, *, on_error: Callable[[Exception], None] | None = None) -> None:
        """Call `hook` in every transaction that inserts records, before its COMMIT, in a savepoint (see
        `HookedStore` in bide/_store.py)."""
        with self._lock:
            self._hooks.add(hook, on_error)

    def remove_write_hook(self, hook: WriteHook) -> None:
        with self._lock:
            self._hooks.remove(hook)

    def __repr__(self) -> str:
        return f"SQLStore({self._shown!r}, table_prefix={self.table_prefix!r})"

    # -- the writer thread ---------------------------------------------------------------------------------

    def _refuse_when_closed(self, req: _Request) -> None:
        # A closing store still frees the leases of the drives it stopped, and renews those of the drives
        # whose calls still run (see Store.close): a lease renewal carries the lease's token, a new one none.
        if self._closed or (
            self._closing and not _lets_go_or_renews(req) and not may_use_while_closing(self)
        ):
            raise self._closed_error(req)

    def _closed_error(self, req: _Request) -> StoreError:
        """The refusal of `req`, made after (or answered after) the store's close() was called."""
        what = req.named()
        return StoreError(
            f"store {self._shown} is closed (its close() was called): {what} was refused, nothing was "
            "written. Open the store again (bide.open_store) for more work; a run whose drive was still "
            "using it resumes from its journal when run again",
            lasting=True,
        )

    def _closed_under(self, req: _Request) -> StoreError:
        """The answer of `req`, whose batch was cut short by the store's close()."""
        what = req.named()
        return StoreError(
            f"store {self._shown}: {what} failed: the store was closed (its close() was called) while it "
            f"ran; {_doubt([req])}. Open the store again (bide.open_store) and run again what was using it",
            lasting=True,
        )

    def _enqueue(self, req: _Request) -> None:
        if self._closing:  # (one attribute on the hot path; closing comes before closed)
            self._refuse_when_closed(req)
        with self._lock:
            if self._closed:
                raise self._closed_error(req)
            if not self._when_dropped.alive:
                # Collected, then used by the finalizer of an object collected with it (a __del__, run after
                # the store's own): its thread stops, and would leave the request waiting for ever.
                raise _dropped_error(self._shown, req)
            if self._thread is None:
                name = f"bide-store:{self._shown}"
                serving = (weakref.ref(self), self._queue, self._shown)
                self._thread = threading.Thread(target=_serve, args=serving, name=name, daemon=True)
                self._thread.start()
            # Under the lock: ordered with the stop a close puts (see _close_now).
            self._queue.put(req)
            self._queued += 1

    def _submit(self, run_id: str, op: str, args: Any) -> Future[Any]:
        req = _Request(run_id, op, args, future=Future())
        self._enqueue(req)
        assert req.future is not None
        return req.future

    def _asubmit(self, run_id: str, op: str, args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        req = _Request(run_id, op, args, loop=loop, afuture=fut)
        if self.dialect != "sqlite":
            self._enqueue(req)
            return fut
        # SQLite, async caller: group commit inside the event loop. Every request made before the loop
        # gets back to its callbacks joins one transaction, run synchronously (no thread hand-offs; the loop
        # is blocked for the commit, a fraction of a millisecond per batch).
        if self._closing:
            self._refuse_when_closed(req)
        state = self._local
        if state.loop is not loop:
            # A new event loop on this thread: whatever the old one left queued has no caller any more.
            state.loop, state.pending, state.scheduled = loop, [], False
        state.pending.append(req)
        if not state.scheduled:
            state.scheduled = True
            loop.call_soon(self._flush_local, state, loop)
        return fut

    def _flush_local(self, state: _LoopBatch, loop: asyncio.AbstractEventLoop) -> None:
        """Run the requests made in this loop since the last flush as one batch (`loop`: the running loop,
        passed along because asking asyncio for it costs a getpid system call)."""
        batch, state.pending = state.pending, []
        state.scheduled = False
        if self._closed:
            # Asked for before the close, flushed after it: this loop's connection is closed (by close(), or
            # here: close() leaves one its thread was using).
            if state.slot is not None:
                with state.slot.using:
                    state.slot.close()
            self._answer([(r, None, self._closed_error(r)) for r in batch], loop)
            return
        try:
            # One connection for every batch: SQLite empties a connection's page cache whenever another
            # connection has written since its last transaction, so a second one (say, for leases) would
            # read the pages it touches again each time.
            slot = state.slot
            if slot is None:
                slot = state.slot = _Slot(self, in_loop=True)
                with self._lock:
                    # The connections of threads that ended are closed here, when a new thread comes: an
                    # application that calls run_sync from short-lived threads (one per request) held two
                    # file descriptors per thread it ever had, until "too many open files".
                    live: list[tuple[weakref.ref[threading.Thread], _Slot]] = []
                    ended: list[_Slot] = []
                    for user, kept in self._slots:
                        thread = user()
                        if thread is not None and thread.is_alive():
                            live.append((user, kept))
                        else:
                            ended.append(kept)
                    self._slots = [*live, (weakref.ref(threading.current_thread()), slot)]
                for gone in ended:
                    with gone.using:  # (held off while a fork copies it, see _hold_for_fork)
                        gone.close()
            # A large batch pauses the cyclic garbage collector (the loop's thread is blocked for it anyway):
            # everything it allocates (rows, entries, answers, the callbacks that wake the runs) is in use
            # until the runs take their answers, so a collection in the middle frees nothing and only
            # promotes these objects to older generations, whose full collections rescan every live run.
            paused = len(batch) >= _GC_PAUSE_BATCH and gc.isenabled()
            if paused:
                gc.disable()
            try:
                with slot.using:
                    self._run_batch(batch, slot, loop)
            finally:
                if paused:
                    gc.enable()
            if self._closed:  # closed meanwhile, from another thread, which left this connection open
                with slot.using:
                    slot.close()
        except BaseException as exc:  # never leave a caller waiting on a future nobody will settle
            self._answer(
                [
                    (r, None, _caused(StoreError(f"store {self._shown} failed: {exc!r}"), exc))
                    for r in batch
                    if r.afuture is not None and not r.afuture.done()
                ],
                loop,
            )
            if not isinstance(exc, Exception):
                raise

    def _answer(
        self,
        answers: list[tuple[_Request, Any, BaseException | None]],
        here: asyncio.AbstractEventLoop | None,
    ) -> None:
        """Settle `answers`: the futures of `here` (the running loop, None in the store's thread) at once,
        those of other loops through their own loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Answer]] = {}
        mine: list[_Answer] = []
        for req, result, error in answers:
            fut = req.afuture
            if fut is not None and req.loop is here:
                mine.append((fut, result, error))
            elif fut is not None and req.loop is not None:
                by_loop.setdefault(req.loop, []).append((fut, result, error))
            else:
                req.settle(result, error)
        _deliver(mine)
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is waiting
                loop.call_soon_threadsafe(_deliver, items)

    def _answer_all(
        self, batch: list[_Request], results: list[Any], here: asyncio.AbstractEventLoop | None
    ) -> None:
        """Answer a committed batch: the futures of `here`, the running loop, at once (the common, in-loop
        case), everyone else through `_answer`."""
        rest: list[tuple[_Request, Any, BaseException | None]] = []
        for req, res in zip(batch, results, strict=True):
            fut = req.afuture
            if fut is not None and req.loop is here:
                if fut.cancelled():
                    continue
                if type(res) is _Refused:
                    fut.set_exception(res.error)
                else:
                    fut.set_result(res)
            else:
                rest.append((req, res, None))
        if rest:
            self._answer(rest, here)

    def _serve_batch(self, first: _Request) -> bool:
        """Run `first` and the requests queued behind it as one batch in the store's thread; True when the
        stop a close puts came after them."""
        batch: list[_Request] = [first]
        stop = False
        while len(batch) < 4096:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is _STOP:
                stop = True
                break
            batch.append(nxt)
        slot = self._worker_slot
        try:
            # (Held while the batch runs: a child forked meanwhile leaves this connection alone.)
            with slot.using:
                self._run_batch(batch, slot, None)
        except BaseException as exc:  # never leave a caller waiting on a dead thread
            self._answer(
                [
                    (r, None, _caused(StoreError(f"store {self._shown} failed: {exc!r}"), exc))
                    for r in batch
                    if not (r.future and r.future.done()) and not (r.afuture and r.afuture.done())
                ],
                None,
            )
        finally:
            self._served += len(batch)
        return stop

    def _run_batch(
        self, batch: list[_Request], slot: _Slot, here: asyncio.AbstractEventLoop | None, lock_ms: int = 0
    ) -> None:
        """Run `batch` on `slot` and answer it (`here`: the running event loop, None in the store's
        thread). `lock_ms` (PostgreSQL): wait at most that long for a lock, and once, on a batch whose
        requests already waited out the busy timeout together (see `_fail`)."""
        # Sorting by run id gives every transaction the same lock order on PostgreSQL (no deadlocks);
        # requests in one batch are concurrent, so their relative order is free.
        batch.sort(key=_by_run_id)
        hooks = True
        started = 0.0
        # PostgreSQL: a try that lost its connection may have committed. The batch is sent again until the
        # busy timeout (`resent`, see `_own`), its lock waits bounded by what is left of it.
        resent = False
        reconnect_until = 0.0

        def attempt() -> list[Any]:
            nonlocal hooks, started
            started = time.monotonic()
            wait_ms = max(1, int((reconnect_until - started) * 1000)) if resent else lock_ms
            try:
                return self._transaction(batch, slot.get(), hooks=hooks, lock_timeout_ms=wait_ms)
            except _HooksBroken:
                slot.drop()
                hooks = False  # the journal write goes ahead without them; derived data catches up later
                raise
            except Exception:
                slot.drop()
                raise

        def classify(exc: BaseException) -> bool:
            if isinstance(exc, _HooksBroken):
                return True
            # The event loop never waits for a lock: a busy database hands the batch to the store's thread.
            if slot.in_loop or not _retryable(exc) or (lock_ms and _lock_timeout(exc)):
                return False
            # A lock held through the whole busy timeout will not clear in the next few milliseconds: say so
            # now rather than wait that long again for every retry (8 tries of 30 s by default). A lock
            # reported at once (a write racing another one in WAL mode, a serialization failure or deadlock on
            # PostgreSQL) is worth trying again.
            return time.monotonic() - started < 0.9 * self._busy_ms / 1000

        reconnects = 0
        while True:
            try:
                results = _BATCH_RETRY.run_sync(attempt, classify)
                break
            except Exception as exc:
                if self.dialect == "sqlite" or not connection_lost(exc):
                    self._fail(batch, slot, here, exc)
                    return
                now = time.monotonic()
                if not resent:
                    resent, reconnect_until = True, now + self._busy_ms / 1000
                pause = _RECONNECT.wait(reconnects)
                reconnects += 1
                if now + pause >= reconnect_until:
                    # The requests share the lost connection: none is worth trying alone.
                    error = StoreError(
                        f"store {self._shown}: the connection to the database was lost and could not be "
                        f"restored within the store's busy timeout ({self._busy_ms / 1000:g} s, {reconnects} "
                        f"tries); {_doubt(batch)}; run it again once the database answers ({exc})"
                    )
                    self._answer([(r, None, _caused(error, exc)) for r in batch], here)
                    return
                time.sleep(pause)
        if resent:
            results = [_own(req, res) for req, res in zip(batch, results, strict=True)]
        self._answer_all(batch, results, here)

    def _fail(
        self, batch: list[_Request], slot: _Slot, here: asyncio.AbstractEventLoop | None, exc: Exception
    ) -> None:
        """Answer `batch`, whose transaction failed with `exc` (not a lost connection) after its retries."""
        if isinstance(exc, _ClosedUnder):  # its connection was closed before any statement of it ran
            self._answer([(req, None, self._closed_error(req)) for req in batch], here)
            return
        if slot.in_loop and self._closed:
            # (Closed while the batch ran, by a write hook of its own: whatever it failed with says no more.)
            self._answer([(req, None, self._closed_under(req)) for req in batch], here)
            return
        if isinstance(exc, _FileGone):
            # The store's own refusal (its file gone or replaced): the same for every request, and a batch
            # that committed into the old file must not be run again request by request.
            answers: list[tuple[_Request, Any, BaseException | None]] = []
            for req in batch:
                what = req.named()
                said = f"{what}: {exc}" if isinstance(exc, _CommittedElsewhere) else f"{what} failed: {exc}"
                gone = StoreError(f"store {self._shown}: {said}", lasting=True)
                answers.append((req, None, _caused(gone, exc)))
            self._answer(answers, here)
            return
        if slot.in_loop and _retryable(exc):
            for req in batch:  # another process holds the write lock: wait for it off the loop
                try:
                    self._enqueue(req)
                except StoreError as closed:  # the store is closing: refused, nothing was written
                    self._answer([(req, None, closed)], here)
            return
        if self.dialect != "sqlite" and _lock_timeout(exc) and batch[0].run_id != batch[-1].run_id:
            # PostgreSQL locks rows, not the database: one run's row held elsewhere (a session paused in a
            # transaction, an operator's SELECT ... FOR UPDATE) made the whole batch wait out the busy
            # timeout. Each run's requests go again on their own, waiting briefly: the others commit, and
            # only the run whose row is held fails as the batch did. (Sorted by run: its requests are
            # adjacent.)
            start = 0
            for end in range(1, len(batch) + 1):
                if end == len(batch) or batch[end].run_id != batch[start].run_id:
                    self._run_batch(batch[start:end], slot, here, lock_ms=_SPLIT_LOCK_MS)
                    start = end
            return
        if _retryable(exc):
            # Every try lost to another transaction and did nothing; trying each request alone would only
            # wait as long again for each of them.
            why = (
                f"the database stayed locked by another connection past the busy timeout "
                f"({self._busy_ms / 1000:g} s)"
                if self.dialect == "sqlite" or _lock_timeout(exc)
                else f"it lost to concurrent transactions {_BATCH_RETRY.attempts} times"
            )
            said = _first_line(exc)

            def lost(req: _Request) -> StoreError:
                # Each request's own: one error for the batch named its first run to every caller.
                did = "failed" if req.op in _LISTINGS else "wrote nothing"  # a listing only reads
                return _caused(
                    StoreError(
                        f"store {self._shown}: {req.named()} {did}: {why}; run it again (or find the "
                        f"process holding the database) ({said})"
                    ),
                    exc,
                )

            self._answer([(r, None, lost(r)) for r in batch], here)
            return
        if len(batch) > 1:
            # Isolate the failing request: answer the others in their own transactions.
            for req in batch:
                self._run_batch([req], slot, here)
            return
        req = batch[0]
        what = req.named()
        code = getattr(getattr(exc, "orig", None) or exc, "sqlite_errorcode", None)
        # Only for what a file that cannot be written causes: not a trigger's abort on a full disk, say.
        unwritable = self.dialect == "sqlite" and code is not None and code & 0xFF in _SQLITE_UNWRITABLE
        hint = why_unwritable(self._path, exc) if unwritable else ""
        # SQLite refuses a write to a read-only file before it writes anything: no doubt to leave.
        refused = unwritable and code is not None and code & 0xFF == _SQLITE_READONLY
        doubt = "nothing was written" if refused else _doubt(batch)
        # The driver's words without SQLAlchemy's wrapper (a connection that could not be made comes wrapped).
        driver_error = getattr(exc, "orig", None) or exc
        error = StoreError(f"store {self._shown}: {what} failed; {doubt}: {driver_error}{hint}")
        self._answer([(req, None, _caused(error, exc))], here)

    def _transaction(
        self, batch: list[_Request], raw: Any, *, hooks: bool = True, lock_timeout_ms: int = 0
    ) -> list[Any]:
        """Run `batch` as one transaction on `raw` (PostgreSQL: waiting at most `lock_timeout_ms` for a lock
        when it is not 0)."""
        writes = False
        leases = False
        payload = 0
        for r in batch:
            if r.op == "insert":
                writes = True
                if self.dialect != "sqlite":
                    payload += sum(len(data) for _, data in r.args[0])
            elif r.op in _LEASE_OPS:
                leases = True
        # Lease-only transactions need not be synced (see the module docstring).
        lazy = leases and not writes
        pipelined = payload <= _PIPELINE_MAX_BYTES and not (writes and hooks and self._hooks.hooks)
        if self.dialect != "sqlite" and pipelined:
            return self._pipelined(batch, raw, lazy=lazy, writes=writes, lock_timeout_ms=lock_timeout_ms)
        toggle = lazy and self.dialect == "sqlite"
        # SQLite: the driver's own cursor (the pool's wrapper adds a Python call per transaction).
        cur = (raw.dbapi_connection if self.dialect == "sqlite" else raw).cursor()
        hooked: list[WriteTransaction] = []
        try:
            if self.dialect == "sqlite":
                if toggle:
                    cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute("BEGIN IMMEDIATE" if writes or leases else "BEGIN")
            else:
                if lazy:
                    cur.execute("SET LOCAL synchronous_commit TO OFF")
                if lock_timeout_ms:
                    cur.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
            new_runs: set[str] = set()
            if self.dialect == "sqlite":
                # One runs row per run (for listing): written once, outside any savepoint, and remembered
                # only after the commit.
                known = self._known_runs  # membership tests need no lock (each is atomic)
                missing = {r.run_id for r in batch if r.op == "insert" and r.run_id not in known}
                if missing:
                    rids = list(missing)
                    for start, size in _chunks(len(rids)):
                        cur.execute(self._sql_runs_many[size], rids[start : start + size])
                    new_runs = missing
                results = self._apply_sqlite(cur, batch)
                if leases:
                    # A lease writes the runs row too: the run's first insert need not. (A grant is not
                    # synced, but a crash that loses it loses every later record of the run with it: the
                    # write-ahead log is one sequence.)
                    new_runs = new_runs | {r.run_id for r in batch if r.op == "lease"}
            else:
                results = [self._apply(cur, req) for req in batch]
            if writes and hooks and self._hooks.hooks:
                hooked = self._run_hooks(cur, batch, results)
            if self.dialect == "sqlite":
                if writes or leases or any(r.op in _LISTINGS for r in batch):
                    # (Rolled back below: nothing reaches the file.) A listing too: an idle worker polls
                    # only those, and would go on reading a file moved away while new runs wait in another.
                    self._check_file(raw, committed=False)
                cur.execute("COMMIT")
                if toggle:
                    # Not suppressed: an error here drops the connection (see _run_batch), so a connection
                    # left at NORMAL never commits a record.
                    cur.execute("PRAGMA synchronous=FULL")
            else:
                raw.commit()
        except BaseException:
            for txn in hooked:
                txn._finish(committed=False)
            try:
                if self.dialect == "sqlite":
                    cur.execute("ROLLBACK")
                else:
                    raw.rollback()
            except Exception:
                pass
            if toggle:
                with contextlib.suppress(Exception):  # a broken connection is dropped by the caller
                    cur.execute("PRAGMA synchronous=FULL")
            raise
        finally:
            cur.close()
        for txn in hooked:
            txn._finish(committed=True)
        if self.dialect == "sqlite" and (writes or leases):
            self._check_file(raw, committed=True)
        if writes:
            self.commits += 1
        if new_runs:
            with self._lock:
                if len(self._known_runs) > 100_000:
                    self._known_runs.clear()
                self._known_runs |= new_runs
        return results

    def _pipelined(
        self, batch: list[_Request], raw: Any, *, lazy: bool, writes: bool, lock_timeout_ms: int = 0
    ) -> list[Any]:
        """Run a PostgreSQL `batch` (without write hooks, which may COPY) as one transaction in a pipeline:
        statements go out without waiting for their answers, and only a statement whose answer the batch
        needs waits, so BEGIN travels with the first such statement and COMMIT with whatever follows the
        last one. A one-request write is two round trips (four without the pipeline)."""
        driver = raw.driver_connection
        cur = driver.cursor()
        # psycopg waits for the answer to a BEGIN and a COMMIT of its own: in autocommit mode, ours are
        # statements of the pipeline like the rest.
        driver.autocommit = True
        try:
            with pipeline(driver) as pipe:
                cur.execute("BEGIN")
                if lazy:
                    cur.execute("SET LOCAL synchronous_commit TO OFF")
                if lock_timeout_ms:
                    cur.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
                syncing = _SyncingCursor(cur, pipe)
                results = [self._apply(syncing, req) for req in batch]
                cur.execute("COMMIT")
            driver.autocommit = False
        except BaseException as exc:
            with contextlib.suppress(Exception):
                driver.rollback()
            # After an Exception the caller drops the connection; after anything else (Ctrl-C) it is kept,
            # so one still in pipeline or autocommit mode is discarded here.
            if not out_of_pipeline(driver) and not isinstance(exc, Exception):
                raw.invalidate()
            lost = lost_in_pipeline(driver, exc)
            if lost is not None:
                raise lost from exc
            raise
        finally:
            cur.close()
        if writes:
            self.commits += 1
        return results

    def _run_hooks(self, cur: Any, batch: list[_Request], results: list[Any]) -> list[WriteTransaction]:
        pairs = zip(batch, results, strict=True)
        written = written_by(
            [(r.run_id, res) for r, res in pairs if r.op == "insert" and type(res) is not _Refused]
        )
        if not written:
            return []

        def load(run_id: str, after: int = 0) -> list[Entry]:
            cur.execute(self._sql_load, (run_id, _from(after)))
            return [Entry(int(s), k, bytes(d)) for s, k, d in cur.fetchall()]

        done: list[WriteTransaction] = []
        for hook, on_error in self._hooks.hooks:
            txn = WriteTransaction(cur, self.dialect, load)
            try:
                cur.execute("SAVEPOINT bide_hook")
            except Exception as exc:
                raise _HooksBroken(str(exc)) from exc
            try:
                hook(txn, written)
            except Exception as exc:
                try:
                    cur.execute("ROLLBACK TO SAVEPOINT bide_hook")
                    cur.execute("RELEASE SAVEPOINT bide_hook")
                except Exception as broken:
                    txn._finish(committed=False)
                    for earlier in done:
                        earlier._finish(committed=False)
                    self._hooks.failed(on_error, exc)
                    raise _HooksBroken(str(broken)) from broken
                txn._finish(committed=False)
                self._hooks.failed(on_error, exc)
                continue
            try:
                cur.execute("RELEASE SAVEPOINT bide_hook")
            except Exception as broken:
                for t in (*done, txn):
                    t._finish(committed=False)
                self._hooks.failed(on_error, broken)
                raise _HooksBroken(str(broken)) from broken
            done.append(txn)
        return done

    def _apply_sqlite(self, cur: Any, batch: list[_Request]) -> list[Any]:
        """The results of a SQLite batch, in batch order: all inserts in multi-row statements, then all
        loads in multi-row statements, then the rest one by one. The requests of one batch are concurrent,
        so any order is theirs; inserts first lets a read see the writes requested before it."""
        results: list[Any] = [None] * len(batch)
        inserts: list[int] = []
        loads: list[int] = []
        leases: list[int] = []
        gets: list[int] = []
        others: list[int] = []
        for i, req in enumerate(batch):
            op = req.op
            if op == "insert":
                inserts.append(i)
            elif op == "load":
                loads.append(i)
            elif op in _LEASE_OPS:
                leases.append(i)
            elif op == "get":
                gets.append(i)
            else:
                others.append(i)
        late: list[int] = []
        if inserts:
            inserts, late = self._admit_sqlite(cur, batch, inserts, results)
        # Leases before loads: a load requested with a lease sees the journal as of the grant.
        if leases:
            self._leases_sqlite(cur, batch, leases, results)
        if inserts and not self._insert_batch_sqlite(cur, batch, inserts, results):
            # Two requests insert the same key: their order decides the winner, so run them one by one.
            for i in inserts:
                results[i] = self._apply(cur, batch[i])
        ended: list[str] = []  # the runs this batch ended (S8), marked in one statement per chunk
        for i in inserts:
            for e in results[i]:  # a plain loop: cheaper than any() over a generator, 3 times a run
                if e.key == END_KEY:
                    if e.inserted:
                        ended.append(batch[i].run_id)
                    break
        if len(ended) == 1:
            cur.execute(self._sql_end, (ended[0],))
        elif ended:
            for start, size in _chunks(len(ended)):
                cur.execute(self._sql_end_many[size], ended[start : start + size])
        if late:
            self._apply_late(cur, batch, late, results)
        if loads:
            self._load_batch_sqlite(cur, batch, loads, results)
        if len(gets) == 1:
            results[gets[0]] = self._apply(cur, batch[gets[0]])
        elif gets:
            self._get_batch_sqlite(cur, batch, gets, results)
        for i in others:
            results[i] = self._apply(cur, batch[i])
        return results

    def _leases_sqlite(self, cur: Any, batch: list[_Request], leases: list[int], results: list[Any]) -> None:
        """Answer the lease and release requests `leases` (indexes into `batch`): the grants and renewals
        of distinct runs in two statements per chunk (read every row, decide each with `decide_lease`,
        write the leases held), which the batch's write lock makes atomic; the rest one by one, in order."""
        grants = [i for i in leases if batch[i].op == "lease"]
        rids = [batch[i].run_id for i in grants]
        if len(grants) != len(leases) or (len(rids) > 1 and len(set(rids)) != len(rids)):
            # A release, or two requests on one run: their order decides the answers.
            for i in leases:
                results[i] = self._apply(cur, batch[i])
            return
        rows: dict[str, tuple[Any, ...]] = {}
        for start, size in _chunks(len(rids)):
            cur.execute(self._sql_rows_many[size], rids[start : start + size])
            for row in cur.fetchall():
                rows[row[0]] = row
        params: list[Any] = []
        for i in grants:
            run_id = batch[i].run_id
            holder, now_ms, ttl_ms, token = batch[i].args
            row = rows.get(run_id)
            held = row is not None and row[1] is not None
            current = Lease(run_id, row[1], int(row[2]), int(row[3])) if held and row else None
            lease = results[i] = decide_lease(run_id, current, holder, now_ms, ttl_ms, token)
            if lease.held:
                params += (run_id, holder, lease.token, lease.expires_ms)
        for start, size in _chunks(len(params) // 4, _CHUNK // 2):  # 4 variables a row: under 999
            cur.execute(self._sql_lease_many[size], params[4 * start : 4 * (start + size)])

    def _admit_sqlite(
        self, cur: Any, batch: list[_Request], inserts: list[int], results: list[Any]
    ) -> tuple[list[int], list[int]]:
        """The insert requests (indexes into `batch`) the store accepts now, and those it decides only after
        the others ran (`_apply_late`): a request for a run that an earlier request of the batch ends. The
        refused ones (a stale fence, S10; a new record for an ended run, S8) get their answer in `results`.

        The statement returns only the requests whose run has ended or whose fence does not match: none,
        usually, so a batch builds no row tuples for the runs that pass (they would cost the garbage
        collector more than the lookup)."""
        params: list[Any] = []
        last: dict[str, int] = {}  # each run's latest insert request so far
        late: list[int] = []
        for i in inserts:
            req = batch[i]
            rid = req.run_id
            fence = req.args[2]
            earlier = last.get(rid)
            last[rid] = i
            if earlier is not None and (earlier in late or _has_end(batch[earlier].args[0])):
                late.append(i)  # the run may have ended by then: decided after the batch's inserts
            elif fence is None:
                params += (i, rid, None, None)
            else:
                params += (i, rid, fence[0], fence[1])
        flagged: dict[int, tuple[Any, ...] | None] = {}
        for start, size in _chunks(len(params) // 4, _CHUNK // 2):  # 4 variables a row: under 999
            cur.execute(self._sql_admit_many[size], params[4 * start : 4 * (start + size)])
            for i, run_id, *row in cur.fetchall():
                flagged[i] = None if run_id is None else tuple(row)
        if not flagged and not late:
            return inserts, late
        admitted: list[int] = []
        for i in inserts:
            if i not in flagged:
                if not late or i not in late:
                    admitted.append(i)
                continue
            verdict = self._verdict(cur, batch[i], flagged[i])
            if verdict is None:
                admitted.append(i)
            else:
                results[i] = verdict
        return admitted, late

    def _apply_late(self, cur: Any, batch: list[_Request], late: list[int], results: list[Any]) -> None:
        """Run the inserts `_admit_sqlite` put off, one by one in batch order, each checked against its run's
        row as the batch has left it."""
        for i in late:
            req = batch[i]
            cur.execute(self._sql_rows_many[1], (req.run_id,))
            row = cur.fetchone()
            verdict = self._verdict(cur, req, None if row is None else tuple(row[1:]))
            if verdict is not None:
                results[i] = verdict
                continue
            out = results[i] = self._apply(cur, req)
            if any(e.inserted and e.key == END_KEY for e in out):
                cur.execute(self._sql_end, (req.run_id,))

    def _verdict(self, cur: Any, req: _Request, row: tuple[Any, ...] | None) -> Any:
        """None to go on with insert `req`, or its whole answer: `_Refused`, or the stored entries when the
        run has ended and the request adds nothing. `row` is the run's (holder, token, expires_ms, ended)."""
        items, exclusive, fence = req.args
        run_id = req.run_id
        try:
            if fence is not None and (row is None or row[0] != fence[0] or row[1] != fence[1]):
                held = row is not None and row[0] is not None
                lease = Lease(run_id, row[0], int(row[1]), int(row[2])) if held and row else None
                refuse_fence(run_id, lease, fence)
            if row is None or not row[3]:
                return None
            stored = [self._read(cur, run_id, key) for key, _ in items]
            present = [e for e in stored if e is not None]
            if len(present) == len(stored) or (exclusive and present):
                return present
            refuse_ended(run_id)
        except WriteRefused as exc:
            return _Refused(exc)
        return None

    def _insert_batch_sqlite(
        self, cur: Any, batch: list[_Request], inserts: list[int], results: list[Any]
    ) -> bool:
        """Run the insert requests `inserts` (indexes into `batch`) as multi-row INSERT OR IGNORE statements
        and put their results in `results`; False (nothing done) when two of them share a (run, key)."""
        params: list[Any] = []
        # Keys per run, kept only for runs with more than one insert request in the batch (rare).
        seen: dict[str, Any] = {}
        for i in inserts:
            req = batch[i]
            rid = req.run_id
            items = req.args[0]
            earlier = seen.get(rid)
            if earlier is None:
                seen[rid] = items
            else:
                if type(earlier) is not set:
                    earlier = seen[rid] = {k for k, _ in earlier}
                for key, _ in items:
                    if key in earlier:
                        return False
                    earlier.add(key)
            for key, data in items:
                params += (rid, key, data)
        # The seq of every row, in params order (0: the key existed; SQLite's own rowids start at 1). A new
        # row's rowid is one above the table's largest (the rule seq order rests on, see the module
        # docstring), so the rows one statement inserts have consecutive seqs, in VALUES order, ending at
        # lastrowid: no RETURNING needed (it costs about 1 us a row).
        seqs: list[int] = []
        clean = True
        sql = self._sql_ins_many
        for start, size in _chunks(len(params) // 3):
            chunk = params[3 * start : 3 * (start + size)]
            cur.execute(sql[size], chunk)
            got = cur.rowcount
            if got == size:
                last = cur.lastrowid
                seqs += range(last - size + 1, last + 1)
                continue
            clean = False
            new: dict[tuple[str, str], int] = {}
            if got > 0:
                last = cur.lastrowid
                cur.execute(self._sql_inserted, (last - got, last))
                new = {(rid, key): seq for seq, rid, key in cur.fetchall()}
                if len(new) != got:
                    raise StoreError(f"{got} records inserted but {len(new)} read back")
            seqs += [new.get((chunk[k], chunk[k + 1]), 0) for k in range(0, 3 * size, 3)]
        it = iter(seqs)
        if clean:
            for i in inserts:
                results[i] = [Entry(next(it), k, d, True) for k, d in batch[i].args[0]]
            return True
        for i in inserts:
            req = batch[i]
            rid = req.run_id
            items, exclusive, _ = req.args
            out: list[Entry] = []
            conflict = False
            for key, data in items:
                seq = next(it)
                if not seq:
                    out.append(self._existing(cur, rid, key, data))
                    conflict = True
                else:
                    out.append(Entry(seq, key, data, True))
            if conflict and exclusive:
                # All or nothing, as in _insert_all_or_none_sqlite: undo this request's own inserts.
                mine = [(e.seq,) for e in out if e.inserted]
                if mine:
                    cur.executemany(self._sql_delete, mine)
                out = [e for e in out if not e.inserted]
            results[i] = out
        return True

    def _load_batch_sqlite(
        self, cur: Any, batch: list[_Request], loads: list[int], results: list[Any]
    ) -> None:
        """Answer the load requests `loads` (indexes into `batch`) with multi-row statements."""
        if len(loads) == 1:
            results[loads[0]] = self._apply(cur, batch[loads[0]])
            return
        params: list[Any] = []
        for q, i in enumerate(loads):
            req = batch[i]
            params += (q, req.run_id, req.args)
            results[i] = []
        sql = self._sql_load_many
        unordered = False
        for start, size in _chunks(len(loads)):
            cur.execute(sql[size], params[3 * start : 3 * (start + size)])
            for q, seq, key, data in cur.fetchall():
                out = results[loads[q]]
                if out and out[-1].seq > seq:
                    unordered = True
                out.append(Entry(seq, key, bytes(data)))
        if unordered:
            for i in loads:
                results[i].sort(key=_entry_seq)

    def _get_batch_sqlite(self, cur: Any, batch: list[_Request], gets: list[int], results: list[Any]) -> None:
        """Answer the get requests `gets` (indexes into `batch`; results None until found) with multi-row
        statements (a drive looks for a cancel request at its turn boundaries: many at once)."""
        params: list[Any] = []
        for q, i in enumerate(gets):
            req = batch[i]
            params += (q, req.run_id, req.args)
        sql = self._sql_get_many
        for start, size in _chunks(len(gets)):
            cur.execute(sql[size], params[3 * start : 3 * (start + size)])
            for q, seq, data in cur.fetchall():
                i = gets[q]
                results[i] = Entry(int(seq), batch[i].args, bytes(data))

    def _apply(self, cur: Any, req: _Request) -> Any:
        if req.op == "insert":
            items, exclusive, fence = req.args
            if self.dialect == "sqlite":  # admitted by _admit_sqlite already
                if not exclusive:
                    return self._insert(cur, req.run_id, items)
                return self._insert_all_or_none_sqlite(cur, req.run_id, items)
            # The run's row is locked until commit: its seq numbers, lease and end hold for the transaction.
            holder, token = (None, None) if fence is None else fence
            keys = [key for key, _ in items]
            params = {"run": req.run_id, "n": len(items), "keys": keys, "data": [d for _, d in items]}
            cur.execute(self._sql_write, {**params, "holder": holder, "token": token})
            *row, keys_in, seqs_in = cur.fetchone()
            verdict = self._verdict(cur, req, tuple(row))
            if verdict is not None:
                return verdict  # nothing was inserted: the statement checked the same row
            inserted = dict(zip(keys_in or (), seqs_in or (), strict=True))
            out = self._stored_pg(cur, req.run_id, items, inserted)
            if exclusive and not all(e.inserted for e in out):
                # All or nothing, as on SQLite: the run's row is locked until commit (every insert locks
                # it first), so nobody inserted meanwhile: delete what this request inserted. The same
                # effect as a savepoint rolled back, without two round trips on the common path.
                mine = [e.seq for e in out if e.inserted]
                if mine:
                    cur.execute(self._sql_delete, (req.run_id, mine))
                return [e for e in out if not e.inserted]
            if any(e.inserted and e.key == END_KEY for e in out):
                cur.execute(self._sql_end, (req.run_id,))
            return out
        if req.op == "lease":
            return self._lease(cur, req.run_id, *req.args)
        if req.op == "release":
            holder, token = req.args
            cur.execute(self._sql_release, (req.run_id, holder, token))
            if self.dialect == "sqlite":
                return cur.rowcount == 1
            return cur.fetchone() is not None  # RETURNING: in a pipeline, rowcount waits for a sync
        if req.op == "expired":
            now_ms, after, limit = req.args
            cur.execute(self._sql_expired, (after, now_ms, limit))
            return [Lease(r, h, int(t), int(e), False, int(q)) for r, h, t, e, q in cur.fetchall()]
        if req.op == "get":
            cur.execute(self._sql_get, (req.run_id, req.args))
            row = cur.fetchone()
            return None if row is None else Entry(int(row[0]), req.args, bytes(row[1]))
        if req.op == "load":
            cur.execute(self._sql_load, (req.run_id, req.args))
            return [Entry(int(s), k, bytes(d)) for s, k, d in cur.fetchall()]
        prefix, after, limit, open_only = req.args
        cur.execute(self._sql_open_runs if open_only else self._sql_runs, (after, len(prefix), prefix, limit))
        return [r[0] for r in cur.fetchall()]

    def _lease(self, cur: Any, run_id: str, holder: str, now_ms: int, ttl_ms: int, token: int) -> Lease:
        """Grant, renew or answer the run's lease (S9): in one statement on PostgreSQL, else read, decide and
        write."""
        expires = now_ms + ttl_ms
        if self._lease_upsert:
            params = {"run_id": run_id, "holder": holder, "token": token, "expires": expires, "now": now_ms}
            cur.execute(self._sql_lease_take, params)
            row = cur.fetchone()
            if row is not None:
                return Lease(run_id, holder, int(row[0]), expires, True)
            cur.execute(self._sql_lease_get, (run_id,))
            row = cur.fetchone()
            return Lease(run_id, row[0], int(row[1]), int(row[2]), False)
        cur.execute(self._sql_lease_row, (run_id,))
        cur.execute(self._sql_lease_get, (run_id,))
        row = cur.fetchone()
        current = None if row[0] is None else Lease(run_id, row[0], int(row[1]), int(row[2]))
        lease = decide_lease(run_id, current, holder, now_ms, ttl_ms, token)
        if lease.held:
            cur.execute(self._sql_lease_set, (holder, lease.token, lease.expires_ms, run_id))
        return lease

    def _insert(self, cur: Any, run_id: str, items: Sequence[tuple[str, bytes]]) -> list[Entry]:
        """SQLite: insert each absent item."""
        out: list[Entry] = []
        for key, data in items:
            cur.execute(self._sql_ins, (run_id, key, data))
            if cur.rowcount == 1:
                out.append(Entry(int(cur.lastrowid), key, data, True))
            else:
                out.append(self._existing(cur, run_id, key, data))
        return out

    def _stored_pg(
        self, cur: Any, run_id: str, items: Sequence[tuple[str, bytes]], inserted: dict[str, int]
    ) -> list[Entry]:
        """PostgreSQL: the entries of an insert request, given the seq numbers of the items it inserted (by
        key); an item already stored is read back."""
        out: list[Entry] = []
        for key, data in items:  # (the keys of one request are distinct: `_check`)
            seq = inserted.get(key)
            if seq is not None:
                out.append(Entry(int(seq), key, data, True))
            else:
                out.append(self._existing(cur, run_id, key, data))
        return out

    def _insert_all_or_none_sqlite(
        self, cur: Any, run_id: str, items: Sequence[tuple[str, bytes]]
    ) -> list[Entry]:
        # The transaction holds SQLite's write lock (BEGIN IMMEDIATE), so nobody else can insert meanwhile:
        # insert, and on a conflict delete what this request inserted. Same effect as a savepoint rolled
        # back, without two extra statements on the common path; the deleted seq numbers were never seen.
        out = self._insert(cur, run_id, items)
        if all(e.inserted for e in out):
            return out
        mine = [(e.seq,) for e in out if e.inserted]
        if mine:
            cur.executemany(self._sql_delete, mine)
        return [e for e in out if not e.inserted]

    def _read(self, cur: Any, run_id: str, key: str) -> Entry | None:
        cur.execute(self._sql_get, (run_id, key))
        row = cur.fetchone()
        return None if row is None else Entry(int(row[0]), key, bytes(row[1]))

    def _existing(self, cur: Any, run_id: str, key: str, data: bytes) -> Entry:
        cur.execute(self._sql_get, (run_id, key))
        row = cur.fetchone()
        if row is None:
            raise StoreError(f"record {key!r} of run {run_id!r} conflicted but cannot be read back")
        return Entry(int(row[0]), key, bytes(row[1]), False)


class _SyncingCursor:
    """A psycopg cursor in a pipeline whose fetches send a Sync first: the answer costs the same round trip,
    and the server then waits for the next statement "idle in transaction", where its
    `idle_in_transaction_session_timeout` ends a session whose process was paused, rather than in the
    middle of the pipeline, where no timeout ends it."""

    __slots__ = ("_cur", "_pipe")

    def __init__(self, cur: Any, pipe: Any) -> None:
        self._cur = cur
        self._pipe = pipe

    def execute(self, sql: str, params: Any = None) -> None:
        self._cur.execute(sql, params)

    def fetchone(self) -> Any:
        self._pipe.sync()
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        self._pipe.sync()
        rows: list[Any] = self._cur.fetchall()
        return rows


# The shortest busy timeout on PostgreSQL: its lock_timeout reads 0 as "wait forever", and a store ends
# sessions idle inside a transaction after half the busy timeout, which at a few milliseconds ends healthy
# sessions between two statements of a write (at 10 ms, every creation of the tables failed).
_PG_BUSY_MIN_S = 0.1
_BUSY_MAX_S = (2**31 - 1) / 1000


def _serve(store_ref: weakref.ref[SQLStore], requests: queue.SimpleQueue[Any], shown: str) -> None:
    """The store's thread: answer the requests queued in batches, until the stop its close puts (or its
    finalizer, once a store dropped without close() is collected). It holds the store only while a batch
    runs, never while it waits for one."""
    while True:
        first = requests.get()
        store = store_ref()
        if store is None:
            # Collected (its finalizer closed its connections): a request still queued had no caller holding
            # the store; it is answered all the same.
            _refuse_orphans(first, requests, shown)
            return
        if first is _STOP or store._serve_batch(first):
            break
        del store  # (not held while waiting for the next request)
    slot = store._worker_slot
    with slot.using:
        slot.close()


def _refuse_orphans(first: Any, requests: queue.SimpleQueue[Any], shown: str) -> None:
    """Answer `first` and every request still in `requests` of a store that was collected."""
    orphans = [first]
    with contextlib.suppress(queue.Empty):
        while True:
            orphans.append(requests.get_nowait())
    for req in orphans:
        if not isinstance(req, _Request):
            continue
        error = _dropped_error(shown, req)
        if req.afuture is not None and req.loop is not None:
            answer: list[_Answer] = [(req.afuture, None, error)]
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody is waiting
                req.loop.call_soon_threadsafe(_deliver, answer)
        else:
            req.settle(None, error)


def _dropped_error(shown: str, req: _Request) -> StoreError:
    """The refusal of `req`, made to a store that was dropped without close() and collected."""
    return StoreError(
        f"store {shown} was dropped without close() and collected before it ran {req.named()}: nothing "
        "was written. Keep the store (and close it) for as long as requests to it are pending",
        lasting=True,
    )


def _let_go_of_dropped(
    requests: queue.SimpleQueue[Any], engine: sa.Engine, held: set[Any], shown: str
) -> None:
    """A store dropped without close() was collected: stop its thread (when it has one) and close its
    connections, those its threads held and those in its pool (no thread is using them: a batch holds the
    store), with a `ResourceWarning`, as for a file left open."""
    requests.put(_STOP)
    for raw in list(held):
        with contextlib.suppress(Exception):  # (run by the garbage collector: nothing to raise to)
            raw.invalidate()  # closed at once, without a last round trip
    held.clear()
    with contextlib.suppress(Exception):
        engine.dispose()
    # Last: under a filter that makes warnings errors (python -W error, pytest's filterwarnings), it raises,
    # and what it would have cut short stayed held (a thread and PostgreSQL sessions for good).
    warnings.warn(
        f"the store {shown} was never closed: its connections are closed now that it was collected; "
        "call its close() when done with it",
        ResourceWarning,
        stacklevel=1,
    )


def _weakly(method: Callable[..., _T]) -> Callable[..., _T]:
    """`method`, called through a weak reference to its store: what the store's engine keeps (its
    connection creator, its listeners) must not keep the store alive (see `SQLStore._finalizer`)."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> _T:
        bound = ref()
        if bound is None:
            raise StoreError("the store was dropped without close() and collected: open it again")
        return bound(*args)

    return call


def _hold_sqlite_stores() -> None:
    # (Reversed in the parent in the opposite order; the child drops what is held with the rest.)
    for store in list(_OPEN_STORES):
        if store.dialect == "sqlite":
            store._hold_for_fork()
            _HELD_FOR_FORK.append(store)


def _release_sqlite_stores() -> None:
    while _HELD_FOR_FORK:
        _HELD_FOR_FORK.pop()._release_after_fork()


def _forget_parents() -> None:
    # Run in the child, before any of its threads: the stores it inherited stop waiting on the parent's
    # thread, which the child does not have (its first call hung), and stop using the parent's connections.
    _HELD_FOR_FORK.clear()
    for store in list(_OPEN_STORES):
        store._forked()


_HELD_FOR_FORK: list[SQLStore] = []
os.register_at_fork(
    before=_hold_sqlite_stores, after_in_parent=_release_sqlite_stores, after_in_child=_forget_parents
)


def _busy_ms(busy_timeout: float, dialect: str) -> int:
    """The busy timeout in milliseconds; `ConfigError` for a value no lock wait can use."""
    if (
        isinstance(busy_timeout, bool)
        or not isinstance(busy_timeout, int | float)
        or not math.isfinite(busy_timeout)
        or busy_timeout < 0
    ):
        raise ConfigError(
            "busy_timeout is the seconds a request waits for a lock (0 or more, finite), got "
            f"{busy_timeout!r}"
        )
    if busy_timeout > _BUSY_MAX_S:
        # SQLite took a larger one for 0, no wait at all; PostgreSQL refused it at connect.
        raise ConfigError(
            f"busy_timeout must be at most {_BUSY_MAX_S:.3f} s (about 24.8 days), got {busy_timeout!r}: "
            "SQLite and PostgreSQL keep it in milliseconds, as a 32-bit number"
        )
    if dialect == "postgresql" and busy_timeout < _PG_BUSY_MIN_S:
        raise ConfigError(
            f"on PostgreSQL busy_timeout must be at least {_PG_BUSY_MIN_S:g} s, got {busy_timeout!r}: "
            "PostgreSQL takes a lock timeout of 0 for no limit, and the store ends a session idle in a "
            "transaction after half of it"
        )
    return int(busy_timeout * 1000)


def _lease_columns() -> list[sa.Column[Any]]:
    """The runs table's lease (S9) and end (S8) columns."""
    return [
        sa.Column("holder", sa.String, nullable=True),
        sa.Column("token", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("expires_ms", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("ended", sa.Integer, nullable=False, server_default="0"),
    ]


def _has_end(items: Sequence[tuple[str, bytes]]) -> bool:
    for key, _ in items:  # noqa: SIM110 (a loop: no generator, on a rare path)
        if key == END_KEY:
            return True
    return False


def _private_copy(items: Sequence[tuple[str, bytes]]) -> Sequence[tuple[str, bytes]]:
    """The items as the store keeps them until committed: (str, bytes) tuples are immutable and kept as they
    are, and so is a tuple of them (what the journal sends: one object fewer per queued request); anything
    else is copied."""
    if type(items) is tuple:
        for it in items:  # a loop: cheaper than all() over a generator, for every write
            if type(it) is not tuple or type(it[1]) is not bytes:
                break
        else:
            return items
    return [it if type(it) is tuple and type(it[1]) is bytes else (it[0], bytes(it[1])) for it in items]


# SQLite's primary result codes for another connection holding a lock (SQLITE_BUSY, SQLITE_LOCKED), and
# PostgreSQL's SQLSTATEs for a transaction aborted by a conflict (serialization failure, deadlock): the
# transaction did nothing and may be run again.
_SQLITE_BUSY = frozenset({5, 6})
_SQLITE_READONLY = 8  # SQLITE_READONLY: the write was refused before anything was written
# SQLite's result codes for a file that cannot be written: PERM, READONLY, IOERR, FULL, CANTOPEN.
_SQLITE_UNWRITABLE = frozenset({3, 8, 10, 13, 14})
# The requests that list runs (a worker's poll): checked against a store file moved away, as writes are.
_LISTINGS = frozenset({"expired", "runs"})
_LISTING_NAMES = {"expired": "listing the runs' leases", "runs": "listing the runs"}
# Serialization failure, deadlock, and a lock wait that ran out (`lock_timeout`, the store's busy timeout).
_PG_CONFLICT = frozenset({"40001", "40P01", "55P03"})
# The server ended the session: admin shutdown, crash shutdown, cannot connect now, and a session left idle
# in a transaction past `idle_in_transaction_session_timeout` (a paused process: see the module docstring).
_PG_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03", "25P03"})

# The one retry policy (bide.RetryPolicy) for store transactions. A SQLite connection has already waited up
# to its busy timeout before it reports a lock, so the waits here are short; PostgreSQL conflicts clear as
# soon as the other transaction ends.
_BATCH_RETRY = RetryPolicy(attempts=8, initial=0.002, maximum=0.25)
# How long each run's requests wait for a lock when a PostgreSQL batch that waited out the busy timeout on one
# run's row is split by run (see `_fail`).
_SPLIT_LOCK_MS = 200
_SCHEMA_RETRY = RetryPolicy(attempts=5, initial=0.01, maximum=0.2)
# The waits between tries of a PostgreSQL batch whose connection was lost (a server restarting, a failover);
# the store's busy timeout, not a count, ends them.
_RECONNECT = RetryPolicy(initial=0.01, maximum=0.5)


def _ascii_lower(name: str) -> str:
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _check_pg_prefix_length(table_prefix: str) -> None:
    """Raise `ConfigError` when a name bide makes under `table_prefix` (`_PREFIXED_NAMES`) would be longer
    than PostgreSQL allows: refused at open, before the store or, months later, the audit log fails."""
    longest = max(_PREFIXED_NAMES, key=len)
    allowed = _PG_NAME_BYTES - len(longest)
    if len(table_prefix) > allowed:  # letters, digits and underscores: one byte each
        whose = " (an audit log table, made by bide-audit export)" if longest.startswith("audit_") else ""
        raise ConfigError(
            f"on PostgreSQL a table_prefix may be at most {allowed} characters, got {len(table_prefix)} "
            f"({table_prefix!r}): PostgreSQL refuses names of more than {_PG_NAME_BYTES} bytes, and bide "
            f"makes {table_prefix}{longest}{whose} under this prefix, "
            f"{len(table_prefix) + len(longest)} bytes. A store an earlier bide made under a longer prefix: "
            "rename its tables and indexes to a shorter one (ALTER TABLE ... RENAME TO ...; ALTER INDEX ... "
            "RENAME TO ...), then give that prefix"
        )


def _sqlite_tables(path: str, where: str) -> set[str]:
    """The tables of the SQLite database at `path`, read without writing anything (not even a journal)."""
    uri = sqlite_uri(os.path.abspath(path), "ro")
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.DatabaseError as exc:
        if exc.sqlite_errorname == "SQLITE_NOTADB":
            raise StoreNotFound(
                f"no bide store at {where}: the file is not a database", missing="file"
            ) from None
        hint = why_unwritable(path, exc)
        raise StoreError(f"cannot read the SQLite database {where}: {exc}{hint}") from exc
    return {name for (name,) in rows}


@contextlib.contextmanager
def pipeline(driver: Any) -> Iterator[Any]:
    """`driver.pipeline()` of a psycopg connection, except that psycopg does not log its own failure to
    leave pipeline mode after an error raised in the block: that error (the connection was lost, say) is
    what the caller reports, and psycopg's warning would only repeat it on stderr, once per connection a
    server restart cuts. Other pipelines, the application's own, keep their warning."""
    with driver.pipeline() as pipe:
        _QUIET_PIPELINES.add(pipe)
        yield pipe


class _QuietPipelines(logging.Filter):
    """Drops psycopg's "error ignored terminating" warning for the pipelines `pipeline` opened."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            record.msg == "error ignored terminating %r: %s"
            and isinstance(args, tuple)
            and bool(args)
            and args[0] in _QUIET_PIPELINES
        )


_QUIET_PIPELINES: weakref.WeakSet[Any] = weakref.WeakSet()
logging.getLogger("psycopg").addFilter(_QuietPipelines())


def out_of_pipeline(driver: Any) -> bool:
    """Whether a psycopg connection whose pipelined transaction failed (and was rolled back) is back to how
    connections are handed out: out of pipeline mode, idle, autocommit off (else it must be discarded: it
    could commit statement by statement)."""
    if driver.pgconn.pipeline_status:
        return False
    try:
        driver.autocommit = False  # refused unless the connection is idle
    except Exception:
        return False
    return True


def lost_in_pipeline(driver: Any, exc: BaseException) -> Exception | None:
    """psycopg's report of a lost connection (an `OperationalError`) for an error other than that, raised on
    a connection that broke meanwhile; else None. In a pipeline, a statement whose answer never came can
    surface as the stale result of an earlier one ("the last operation didn't produce records")."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error) or isinstance(exc, psycopg.OperationalError):
        return None
    if not driver.broken:
        return None
    lost: Exception = psycopg.OperationalError(f"the connection to the server was lost ({exc})")
    return lost


def connection_lost(exc: BaseException) -> bool:
    """True when `exc` (a DBAPI error, or SQLAlchemy's wrapper of one) says the connection to PostgreSQL
    broke or could not be made, for a reason that may pass: SQLSTATE class 08, a server shutting down or
    starting (57P01-57P03), a session ended for idling in a transaction (25P03), or a psycopg
    `OperationalError` or `InterfaceError` without SQLSTATE (the connection broke under the driver, or
    connecting failed), unless the server refuses this login for good (no such database or role, a wrong
    password) or libpq refuses one of its options."""
    orig = getattr(exc, "orig", None) or exc
    state = getattr(orig, "sqlstate", None)
    if isinstance(state, str):
        return state.startswith("08") or state in _PG_SESSION_ENDED
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(orig, (psycopg.OperationalError, psycopg.InterfaceError)):
        return False
    return (
        missing_database(orig) is None
        and refused_for_good(orig) is None
        and refused_option_value(str(orig)) is None
    )


def _own(req: _Request, result: Any) -> Any:
    """The answer of `req`, sent again after a try lost its connection (maybe after its commit), as if the
    first try had been answered: an item found stored with this request's bytes was written by that try
    (every journal record carries 32 random bytes, so nobody else writes them), and a lease found held by
    this request's holder (a random id per drive) was granted by it."""
    if req.op == "insert" and type(result) is list:
        sent = dict(req.args[0])
        return [
            e if e.inserted or sent.get(e.key) != e.data else Entry(e.seq, e.key, e.data, True)
            for e in result
        ]
    if req.op == "lease" and not result.held and result.holder == req.args[0]:
        return result._replace(held=True)
    return result


def _doubt(batch: list[_Request]) -> str:
    """What a failed `batch` may have left: only an insert or a lease change writes."""
    if any(r.op == "insert" or r.op in _LEASE_OPS for r in batch):
        return "a write may or may not have committed"
    return "nothing was written"


def _retryable(exc: BaseException) -> bool:
    """True when `exc` (a DBAPI error, or SQLAlchemy's wrapper of one) says the transaction lost to another
    one and did nothing: a lock held elsewhere, a serialization failure or a deadlock."""
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _SQLITE_BUSY
    return getattr(orig, "sqlstate", None) in _PG_CONFLICT


_NOT_CONNECTED = ("connection to server", "could not connect to server", "connection failed:")
# The server's words for a login it refuses while it starts, recovers or shuts down (`FATAL: ...`).
_SERVER_STARTING = (
    "the database system is starting up",
    "the database system is not yet accepting connections",
    "the database system is in recovery mode",
    "the database system is shutting down",
)
# The server's words for a login refused because its connection slots (53300: all of them, those left
# for superusers, or a role's or a database's CONNECTION LIMIT) are taken: one frees as a session ends.
_SERVER_FULL = (
    "sorry, too many clients already",
    "remaining connection slots are reserved",
    "too many connections for role",
    "too many connections for database",
)


def _session_ended(exc: BaseException) -> bool:
    """True when `exc` says PostgreSQL ended a session it had accepted (a terminated backend, a server
    shutting down or starting, a connection broken after it was made), not that it refused one."""
    orig = getattr(exc, "orig", None) or exc
    state = getattr(orig, "sqlstate", None)
    if isinstance(state, str):
        return state in _PG_SESSION_ENDED or state in ("08003", "08006")
    # Without a SQLSTATE ("server closed the connection unexpectedly"), a connection that could not be made
    # is told by libpq's words for it ("connection to server at/on socket ... failed", "could not connect"):
    # that one is not retried.
    said = str(orig)
    if any(words in said for words in _SERVER_STARTING + _SERVER_FULL):
        # A server starting or recovering (57P03, or shutting down: 57P01), or one whose connection slots
        # are all taken (53300), refuses the login with these words, and no SQLSTATE reaches the driver:
        # it will accept one once it is up, or once another session ends.
        return True
    if "server closed the connection unexpectedly" in said:
        # Accepted, then ended (a backend terminated as its session started): libpq says "connection
        # failed" for it too, but the server is there and another try may well get through.
        return connection_lost(exc)
    return connection_lost(exc) and not any(words in said for words in _NOT_CONNECTED)


def _lets_go_or_renews(req: _Request) -> bool:
    """A lease's release, or its renewal by its holder (a token given): what a closing store still serves."""
    return req.op == "release" or (req.op == "lease" and req.args[3] != 0)


def _denied(path: str) -> PermissionError | None:
    """The refusal to let this user reach the file `path` that `out_of_reach` found: the operating system's
    own for a directory on the way, or one made for the file's mode (not opened to see: it may be a pipe)."""
    try:
        os.stat(path)
    except PermissionError as exc:
        return exc
    except OSError:
        return None
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)


def _caused(error: StoreError, exc: BaseException) -> StoreError:
    """`error`, to be handed to a caller rather than raised here, as if raised `from exc`: the driver's
    error it reports stays readable (`__cause__`), as for every error raised while handling one."""
    error.__cause__ = exc
    return error


def _first_line(exc: BaseException) -> str:
    """The driver's words, without SQLAlchemy's wrapper and without the statement PostgreSQL quotes."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _lock_timeout(exc: BaseException) -> bool:
    """True when `exc` is PostgreSQL's lock wait running out (55P03: the store's busy timeout passed)."""
    return getattr(getattr(exc, "orig", None) or exc, "sqlstate", None) == "55P03"


def _schema_race(exc: BaseException) -> bool:
    """Creating the tables failed, maybe because another process created them at the same moment: retry
    (not after a lock wait that ran out: that would only wait as long again)."""
    return isinstance(exc, sa.exc.DBAPIError) and not _lock_timeout(exc)


def _chunk_sizes() -> list[int]:
    return [1 << i for i in range(_CHUNK.bit_length())]


def _chunks(n: int, cap: int = _CHUNK) -> list[tuple[int, int]]:
    """(start, size) pieces of n rows: sizes are powers of two, at most `cap`, largest first."""
    if n == 1:
        return [(0, 1)]  # a lone request: the common case of a quiet store
    out: list[tuple[int, int]] = []
    pos = 0
    while pos < n:
        size = min(cap, 1 << ((n - pos).bit_length() - 1))
        out.append((pos, size))
        pos += size
    return out
