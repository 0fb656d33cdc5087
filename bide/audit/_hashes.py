"""Where a run's Merkle hashes live: beside the journal, in the same store.

For SQL stores, two tables next to the journal's (same engine, same table prefix), in *tiles* (the idea
of Go's tlog tiles): only every TILE_HEIGHT-th level of the tree is stored, and every other node is
recomputed from the stored level below it when read.

- ``<prefix>audit_tiles(run_id, level, tile, hashes)``: level is 0, 7, 14, ... (a multiple of
  TILE_HEIGHT = 7); node (level, idx), covering leaves [idx * 2^level, (idx + 1) * 2^level), is the 32
  bytes at offset 32 * (idx mod 128) of tile idx div 128 of that level. A full tile holds 128 hashes
  (4 KiB): the bottom row of one subtree of height 7. A tile only grows. About n/128 rows and n * 32 bytes
  for n records: half the bytes of storing every level, in rows that fill database pages.
- ``<prefix>audit_tile_trees(run_id, size, last_seq)``: how many records the tree holds, and the store seq
  of the last one.

A node at level 7g + r (0 < r < 7) is the root of 2^r consecutive stored hashes of level 7g, all in one
tile: reading it costs 2^r - 1 node hashes. A proof reads one tile per 7 levels (3 rows at a million
records) in one query and hashes at most 120 nodes per tile; an append hashes at most 2k + log n nodes for k
records and writes one row per stored level it touches, in one transaction.

The tables are a cache of the journal. `AuditLog.sync` writes them in transactions of its own that do not
wait for the disk (a crash may lose the latest ones; the next sync recomputes exactly the same hashes from
the immutable journal); `AuditLog.absorb`, a store write hook, writes them inside the journal's own
transaction (see `absorb`), so they commit with the records they cover. Databases
written by earlier versions also hold ``<prefix>audit_strips`` and ``<prefix>audit_trees`` (every level
stored, 64 hashes per row): they are no longer read (the tree is rebuilt from the journal on first use)
and can be dropped.

For the memory store, a `MerkleTree` per run in memory (shared by every `AuditLog` on that store object).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import sqlalchemy as sa

from .._dbfile import why_unwritable
from .._errors import StoreError
from .._retry import RetryPolicy
from .._sql import _SQLITE_BUSY, _first_line, _lock_timeout
from .._store import Entry, WriteTransaction
from .._url import without_password
from ._formats import journal_leaf
from ._merkle import Coord, _tiles
from ._tree import MerkleTree

__all__ = ["AuditTablesDamaged", "HashBackend", "MemoryHashes", "SQLHashes", "backend_for"]


class AuditTablesDamaged(StoreError):
    """The audit tables hold what no append writes (a tile missing or cut short, a value of the wrong
    type, a negative size): edited behind bide. A StoreError where the journal's writes meet it; an
    export reports it as the damage it is (`JournalDamaged`)."""


_CREATE_RETRIES = RetryPolicy(attempts=5, initial=0.01, maximum=0.2)
_LEAF_PREFIX = b"\x00" + journal_leaf(b"")  # RFC 6962: a leaf hash is SHA-256(0x00 || leaf data)


def _leaf_hash(record_bytes: bytes) -> bytes:
    """The leaf hash of one stored journal record (the tree's leaf for it)."""
    return hashlib.sha256(_LEAF_PREFIX + record_bytes).digest()


def _leaf_hashes(records: Iterable[bytes]) -> list[bytes]:
    """`_leaf_hash` of each record (one comprehension: no function call per record on bulk syncs)."""
    sha, prefix = hashlib.sha256, _LEAF_PREFIX
    return [sha(prefix + data).digest() for data in records]


class HashBackend(Protocol):
    """Stores the complete-subtree hashes of each run's tree."""

    def state(self, run_id: str) -> tuple[int, int]:
        """(size, last absorbed store seq) of the run's tree; (0, 0) when it has none. May be this object's
        last known state when another writer has advanced the tree since: `extend` from it is then refused."""
        ...

    def read(self, run_id: str, coords: Sequence[Coord]) -> list[bytes]:
        """Stored hashes by (level, index)."""
        ...

    def extend(
        self, run_id: str, size: int, last_seq: int, leaves: Sequence[bytes], new_last_seq: int
    ) -> bool:
        """Append leaf hashes to a tree of `size` leaves; False (nothing written) if the tree is no longer
        of that size (another writer got there first)."""
        ...

    def absorb(self, txn: WriteTransaction, run_id: str, entries: Sequence[Entry]) -> bool:
        """Inside the store's write transaction `txn`: advance the run's tree over `entries` (the records
        `txn` inserted, in seq order), first catching up from the journal if the tree is behind. False
        (nothing written) when it is more than CATCH_UP records behind: that is left to `sync`, so a write
        transaction never hashes a whole backlog."""
        ...


class MemoryHashes:
    """Hashes in memory (for the memory store; lost with the process, like the journal itself)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trees: dict[str, tuple[MerkleTree, int]] = {}

    def tree(self, run_id: str) -> MerkleTree:
        with self._lock:
            return self._trees.get(run_id, (MerkleTree(), 0))[0]

    def state(self, run_id: str) -> tuple[int, int]:
        with self._lock:
            tree, seq = self._trees.get(run_id, (None, 0))
            return (0 if tree is None else tree.size), seq

    def read(self, run_id: str, coords: Sequence[Coord]) -> list[bytes]:
        with self._lock:
            tree = self._trees[run_id][0]
            return tree.read(coords)

    def extend(
        self, run_id: str, size: int, last_seq: int, leaves: Sequence[bytes], new_last_seq: int
    ) -> bool:
        with self._lock:
            tree, seq = self._trees.get(run_id, (MerkleTree(), 0))
            if tree.size != size or seq != last_seq:
                return False
            for leaf in leaves:
                tree.append_hash(leaf)
            self._trees[run_id] = (tree, new_last_seq)
            return True

    def absorb(self, txn: WriteTransaction, run_id: str, entries: Sequence[Entry]) -> bool:
        """Advance the run's tree over the records `txn` inserted (catching up on any before them)."""
        with self._lock:
            tree, seq = self._trees.get(run_id, (MerkleTree(), 0))
            if seq >= entries[-1].seq:
                return True
            todo = txn.load(run_id, seq)
            if len(todo) > CATCH_UP + len(entries):
                return False
            # Hashed before any change: a failure leaves the tree as it was.
            leaves = _leaf_hashes([e.data for e in todo])
            for leaf in leaves:
                tree.append_hash(leaf)
            self._trees[run_id] = (tree, todo[-1].seq)
            return True


def new_levels(
    frontier: Sequence[bytes], size: int, leaves: Sequence[bytes]
) -> dict[int, tuple[int, list[bytes]]]:
    """The nodes created by appending `leaves` to a tree of `size` leaves, per level: level -> (index of the
    first new node, new hashes in index order). `frontier` holds the hashes of `_tiles(0, size)` (the
    right edge's complete subtrees, left to right): a new parent whose left child is old takes it there."""
    sha = hashlib.sha256
    edge = {lv: h for (lv, _), h in zip(_tiles(0, size), frontier, strict=True)}
    out: dict[int, tuple[int, list[bytes]]] = {}
    cur, first, level = list(leaves), size, 0
    while cur:
        out[level] = (first, cur)
        row, start = ([edge[level], *cur], first - 1) if first & 1 else (cur, first)
        cur = [sha(b"\x01" + row[k] + row[k + 1]).digest() for k in range(0, len(row) - 1, 2)]
        first, level = start >> 1, level + 1
    return out


CATCH_UP = 10_000
"""At most this many records behind, a tree catches up inside a write transaction (`absorb`); further
behind, it is left to `AuditLog.sync` (a few milliseconds of hashing per thousand records)."""

TILE_HEIGHT = 7
"""Levels per tile: levels 0, 7, 14, ... are stored; the levels in between are recomputed when read."""
TILE_WIDTH = 1 << TILE_HEIGHT
"""Hashes per full tile: stored node (level, idx) is bytes [32 * (idx % TILE_WIDTH), +32) of tile
idx // TILE_WIDTH of its level."""


def _stored(level: int) -> bool:
    return level % TILE_HEIGHT == 0


def _tail_keys(size: int) -> list[tuple[int, int]]:
    """The (level, tile) of each stored level's partially filled last tile in a tree of `size` leaves."""
    return [
        (lv, (size >> lv) // TILE_WIDTH)
        for lv in range(0, size.bit_length(), TILE_HEIGHT)
        if (size >> lv) % TILE_WIDTH
    ]


def _source(level: int, index: int) -> tuple[int, int, int, int]:
    """Where node (level, index) comes from: (stored level, tile, byte offset, byte length) of the 2^r
    stored hashes whose subtree it is (r = level mod TILE_HEIGHT; one hash when r is 0)."""
    r = level % TILE_HEIGHT
    first = index << r
    return level - r, first // TILE_WIDTH, (first % TILE_WIDTH) * 32, 32 << r


def _fold_row(blob: bytes) -> bytes:
    """The root of the complete subtree whose bottom row is `blob` (2^r hashes, concatenated)."""
    sha = hashlib.sha256
    while len(blob) > 32:
        blob = b"".join([sha(b"\x01" + blob[k : k + 64]).digest() for k in range(0, len(blob), 64)])
    return blob


class SQLHashes:
    """Hashes in two tables beside a SQL store's journal (see the module docstring)."""

    def __init__(self, engine: sa.engine.Engine, table_prefix: str) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        md = sa.MetaData()
        p = table_prefix
        text = sa.String(collation="C") if self.dialect == "postgresql" else sa.String()
        self.tiles = sa.Table(
            f"{p}audit_tiles",
            md,
            sa.Column("run_id", text, nullable=False),
            sa.Column("level", sa.SmallInteger, nullable=False),
            sa.Column("tile", sa.BigInteger, nullable=False),
            sa.Column("hashes", sa.LargeBinary, nullable=False),
            sa.PrimaryKeyConstraint("run_id", "level", "tile", name=f"{p}audit_tiles_pk"),
            sqlite_with_rowid=False,
        )
        self.trees = sa.Table(
            f"{p}audit_tile_trees",
            md,
            sa.Column("run_id", text, primary_key=True),
            sa.Column("size", sa.BigInteger, nullable=False),
            sa.Column("last_seq", sa.BigInteger, nullable=False),
        )
        # Two processes creating the tables at once: the loser's CREATE fails and the next look finds them.
        # (Not after a lock wait: each try already waited the store's busy timeout.)
        try:
            _CREATE_RETRIES.run_sync(
                lambda: md.create_all(engine, checkfirst=True),
                lambda exc: isinstance(exc, sa.exc.DBAPIError) and not _locked(exc),
            )
        except sa.exc.DBAPIError as exc:
            if _locked(exc):
                raise self._failed(exc.orig or exc, "create") from exc
            # A store this user may only read (an auditor's copy, a read-only file): the audit log keeps its
            # hashes beside the journal, so it needs to write there once.
            where = without_password(engine.url.render_as_string(hide_password=True))
            said = _first_line(exc)
            hint = why_unwritable(engine.url.database or "") if self.dialect == "sqlite" else ""
            raise StoreError(
                f"cannot create the audit log's hash tables in {where}: {said}{hint}; the audit log keeps "
                "its hashes beside the journal, so it needs to write to the store once (export from a "
                "writable copy of it)"
            ) from exc
        self._lock = threading.Lock()
        self._conn: Any = None  # a DBAPI connection (through the engine's pool)
        self._pid = os.getpid()  # the process whose connection `_conn` is
        # Held out of the pool between calls, the connection would outlive the store's close (a disposed
        # engine closes only the connections checked in): a server session left open per closed store.
        sa.event.listen(engine, "engine_disposed", _let_go_on_dispose(weakref.ref(self)))
        # Per run: (size, last_seq) -> the right edge and partial tiles of that tree, as last committed by
        # this object. Used only while the stored state and partial tiles are still those (see `_plan`).
        self._edges: dict[str, _Edges] = _RecentEdges()
        # Raw SQL through the driver: SQLAlchemy's per-row parameter processing costs more than the
        # database itself on the hot paths (a proof's one read, a sync's bulk write).
        q = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        self._q, self._p = q, p
        self._sql_state = f"SELECT size, last_seq FROM {p}audit_tile_trees WHERE run_id = {q}"
        # A tile only grows: rewriting it keeps every byte already stored (checked before the write).
        self._sql_put = (
            f"INSERT INTO {p}audit_tiles (run_id, level, tile, hashes) VALUES ({q}, {q}, {q}, {q}) "
            "ON CONFLICT (run_id, level, tile) DO UPDATE SET hashes = excluded.hashes"
        )
        self._sql_new_tree = (
            f"INSERT INTO {p}audit_tile_trees (run_id, size, last_seq) VALUES ({q}, 0, 0) "
            "ON CONFLICT DO NOTHING"
        )
        # The tree's state and whether the journal holds records it has not absorbed below seq `first`.
        self._sql_state_gap = (
            f"SELECT t.size, t.last_seq, EXISTS (SELECT 1 FROM {p}records r WHERE r.run_id = t.run_id "
            f"AND r.seq > t.last_seq AND r.seq < {q}) FROM {p}audit_tile_trees t WHERE t.run_id = {q}"
        )
        self._sql_far_behind = (
            f"SELECT 1 FROM {p}records WHERE run_id = {q} AND seq > {q} ORDER BY seq LIMIT 1 OFFSET {q}"
        )
        self._sql_before = f"SELECT 1 FROM {p}records WHERE run_id = {q} AND seq < {q} LIMIT 1"
        self._sql_advance = (
            f"UPDATE {p}audit_tile_trees SET size = {q}, last_seq = {q} "
            f"WHERE run_id = {q} AND size = {q} AND last_seq = {q}"
        )

    def _sql_read(self, n: int) -> str:
        q = self._q
        values = ", ".join([f"({q}, {q})"] * n)
        # A tile's bytes whatever the stored value's type (SQLite): one edited to TEXT is read as its bytes
        # and judged as any tile is, not failed on by the driver's UTF-8 decoding as a store error.
        hashes = "CAST(h.hashes AS BLOB)" if self.dialect == "sqlite" else "h.hashes"
        return (
            f"WITH wanted(level, tile) AS (VALUES {values}) SELECT h.level, h.tile, {hashes} "
            f"FROM wanted JOIN {self._p}audit_tiles h ON h.run_id = {q} AND h.level = wanted.level "
            "AND h.tile = wanted.tile"
        )

    def _connection(self) -> Any:
        # One DBAPI connection, reused: opening a SQLite connection per proof would dominate its cost, and
        # the driver's own cursor costs a fraction of SQLAlchemy's per-statement overhead on the hot paths.
        if self._pid != os.getpid():
            self._forget_inherited()
        if self._conn is None:
            raw = self.engine.raw_connection()
            try:
                if self.dialect == "sqlite":  # see `extend`; per connection, closed with it (no pooling)
                    cur = raw.cursor()
                    cur.execute("PRAGMA synchronous=NORMAL")
                    cur.close()
                    raw.commit()
            except BaseException:
                raw.invalidate()
                raise
            self._conn = raw
        return self._conn

    def _forget_inherited(self) -> None:
        """In a forked child: drop the parent's connection untouched. Closing it, or letting the pool
        reset it, would speak on the parent's session (PostgreSQL) or file locks (SQLite); it is kept
        referenced so that no finalizer ever does."""
        self._pid = os.getpid()
        if self._conn is not None:
            _INHERITED.append(self._conn)
            self._conn = None

    def _let_go(self) -> None:
        """The engine was disposed (the store closed, or forgot its parent's connections in a forked
        child): close the connection held, for real (back in the disposed pool it would stay open)."""
        if self._pid != os.getpid():
            # Run by the store's fork handler, in the child before any other of its threads: a thread of
            # the parent may have held the lock as the child was made.
            self._lock = threading.Lock()
            self._forget_inherited()
            return
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(Exception):  # a broken connection is discarded either way
                    conn.invalidate()

    def _drop(self) -> None:
        """Discard the connection after an error (it may be broken); the next call opens another."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a broken connection is discarded either way
                conn.rollback()
            conn.invalidate()

    def _query(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Rows of one read, outside any transaction left open. Called with the lock held."""
        conn = self._connection()
        try:
            cur = conn.cursor()
            cur.execute(sql, params)
            rows = cur.fetchall()
            cur.close()
            conn.rollback()
        except BaseException as exc:
            self._drop()
            if isinstance(exc, self.engine.dialect.loaded_dbapi.Error):
                raise self._failed(exc, "read") from exc
            raise
        return list(rows)

    def _failed(self, exc: BaseException, what: str) -> StoreError:
        """The store's error for a driver error `exc` met while reading, writing or creating the hash
        tables: the store failed (a lock held past the busy timeout, a lost connection), not bide."""
        where = without_password(self.engine.url.render_as_string(hide_password=True))
        if _locked(exc):
            return StoreError(
                f"store {where}: the audit log could not {what} its hash tables: the database stayed locked "
                "by another connection past the busy timeout; run it again (or find the process holding the "
                f"database) ({_first_line(exc)})"
            )
        return StoreError(
            f"store {where}: the audit log could not {what} its hash tables: {_first_line(exc)}; run it "
            "again once the database answers (the hashes are derived from the journal: nothing is lost)"
        )

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def state(self, run_id: str) -> tuple[int, int]:
        with self._lock:
            # This object's last append is the state unless another writer advanced the tree since; then
            # the next `extend` from it is refused (the size check), the cache dropped, and this re-read.
            cached = self._edges.get(run_id)
            if cached is not None:
                return cached[0]
            rows = self._query(self._sql_state, (run_id,))
        return (0, 0) if not rows else _tree_state(run_id, rows[0][0], rows[0][1])

    def _fetch_tiles(self, run_id: str, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        wanted = list(dict.fromkeys(keys))
        got: dict[tuple[int, int], bytes] = {}
        with self._lock:
            for start in range(0, len(wanted), 400):
                chunk = wanted[start : start + 400]
                params: list[Any] = [x for c in chunk for x in c]
                params.append(run_id)
                for lv, t, v in self._query(self._sql_read(len(chunk)), params):
                    got[(int(lv), int(t))] = _tile_bytes(run_id, lv, t, v)
        return got

    def read(self, run_id: str, coords: Sequence[Coord]) -> list[bytes]:
        return self._read_from(self._fetch_tiles, run_id, coords)

    @staticmethod
    def _read_from(
        fetch: Callable[[str, Sequence[tuple[int, int]]], dict[tuple[int, int], bytes]],
        run_id: str,
        coords: Sequence[Coord],
    ) -> list[bytes]:
        if not coords:
            return []
        sources = [_source(lv, i) for lv, i in coords]
        tiles = fetch(run_id, [(lv, t) for lv, t, _, _ in sources])
        out = []
        for (lv, t, at, length), coord in zip(sources, coords, strict=True):
            row = tiles.get((lv, t), b"")[at : at + length]
            if len(row) != length:
                raise AuditTablesDamaged(
                    f"audit hashes of run {run_id!r} are missing node {coord}; the audit tables are damaged"
                )
            out.append(_fold_row(row))
        return out

    def _plan(
        self,
        run_id: str,
        size: int,
        last_seq: int,
        leaves: Sequence[bytes],
        new_last_seq: int,
        fetch: Callable[[str, Sequence[tuple[int, int]]], dict[tuple[int, int], bytes]],
    ) -> tuple[list[tuple[str, int, int, bytes]], _Edges]:
        """The tile rows to write to append `leaves` to the tree of `size` leaves, and the cache entry of the
        tree after it (to be kept only once those rows have committed)."""
        # The right edge and each stored level's partial last tile are all an append needs. The tails are
        # read at every append (one row per stored level: at most 127 hashes each, 3 rows at a million
        # records): together they cover every leaf, so they equal this object's copy from its previous
        # append only if the tree is the one it wrote. A tree rebuilt meanwhile (a journal restored or
        # rewritten, then re-hashed elsewhere) to the same size and last seq differs there, and its edge is
        # then taken from the tails read, not from this object's memory of a history that is gone. (A tree
        # that grows elsewhere during this append is refused by the size check in the transaction.)
        tails = fetch(run_id, _tail_keys(size))
        cached = self._edges.get(run_id)
        if cached is not None and cached[0] == (size, last_seq) and cached[2] == tails:
            edge = cached[1]  # saves folding up to 120 hashes per stored level
        else:
            tiles = _tiles(0, size)
            # Every edge node lies in a tail tile (the tails cover the leaves right to left): no second read.
            edge = {
                lv: h
                for (lv, _), h in zip(
                    tiles, self._read_from(lambda _rid, _keys: tails, run_id, tiles), strict=True
                )
            }
        frontier = [edge[lv] for lv, _ in _tiles(0, size)]
        levels = new_levels(frontier, size, leaves)
        rows: list[tuple[str, int, int, bytes]] = []
        for lv, (first, hashes) in levels.items():
            if not _stored(lv):
                continue
            idx, at = first, 0
            while at < len(hashes):
                tile, offset = divmod(idx, TILE_WIDTH)
                take = min(TILE_WIDTH - offset, len(hashes) - at)
                keep = tails.get((lv, tile), b"")[: offset * 32] if offset else b""
                if len(keep) != offset * 32:
                    raise AuditTablesDamaged(f"audit tile {(lv, tile)} of run {run_id!r} is damaged")
                rows.append((run_id, lv, tile, keep + b"".join(hashes[at : at + take])))
                idx, at = idx + take, at + take
        new_size = size + len(leaves)
        new_edge = {lv: (levels[lv][1][-1] if lv in levels else edge[lv]) for lv, _ in _tiles(0, new_size)}
        live = set(_tail_keys(new_size))
        new_tails = {k: v for k, v in tails.items() if k in live}
        for _, lv, tile, blob in rows:
            if (lv, tile) in live:
                new_tails[(lv, tile)] = blob
        return rows, ((new_size, new_last_seq), new_edge, new_tails)

    def extend(
        self, run_id: str, size: int, last_seq: int, leaves: Sequence[bytes], new_last_seq: int
    ) -> bool:
        rows, after = self._plan(run_id, size, last_seq, leaves, new_last_seq, self._fetch_tiles)
        with self._lock:
            conn = self._connection()
            try:
                cur = conn.cursor()
                # The tree is derived from the journal: a crash that loses its last commits loses nothing
                # (the next sync recomputes the same hashes), so its commits need not wait for the disk.
                # PostgreSQL: only for this transaction (the pooled connection may later serve the journal).
                if self.dialect == "postgresql":
                    cur.execute("SET LOCAL synchronous_commit = off")
                if size == 0:
                    cur.execute(self._sql_new_tree, (run_id,))
                cur.execute(self._sql_advance, (size + len(leaves), new_last_seq, run_id, size, last_seq))
                if cur.rowcount != 1:
                    cur.close()
                    conn.rollback()
                    self._edges.pop(run_id, None)
                    return False
                if rows:
                    cur.executemany(self._sql_put, rows)
                cur.close()
                conn.commit()
            except BaseException as exc:
                self._edges.pop(run_id, None)
                self._drop()
                if isinstance(exc, self.engine.dialect.loaded_dbapi.Error):
                    raise self._failed(exc, "write") from exc
                raise
            self._edges[run_id] = after
        return True

    def absorb(self, txn: WriteTransaction, run_id: str, entries: Sequence[Entry]) -> bool:
        """Advance the run's tree over `entries` (just inserted by `txn`) in that same transaction, first
        catching up from the journal if the tree is behind (see `HashBackend.absorb`). The cache follows
        only once `txn` has committed."""
        cur = txn.cursor
        first = entries[0].seq

        def fetch(rid: str, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
            return _fetch_with(cur, self._sql_read, rid, keys)

        for _ in range(5):
            cur.execute(self._sql_state_gap, (first, run_id))
            row = cur.fetchone()
            if row is None:
                size, last_seq = 0, 0
                cur.execute(self._sql_before, (run_id, first))
                behind = cur.fetchone() is not None
            else:
                (size, last_seq), behind = _tree_state(run_id, row[0], row[1]), bool(row[2])
            if last_seq >= entries[-1].seq:
                return True  # absorbed already (another hook on the same tables)
            if behind:
                cur.execute(self._sql_far_behind, (run_id, last_seq, CATCH_UP + len(entries)))
                if cur.fetchone() is not None:
                    return False
            todo = txn.load(run_id, last_seq) if behind else entries
            rows, after = self._plan(
                run_id, size, last_seq, _leaf_hashes([e.data for e in todo]), todo[-1].seq, fetch
            )
            if size == 0:
                cur.execute(self._sql_new_tree, (run_id,))
            cur.execute(self._sql_advance, (after[0][0], after[0][1], run_id, size, last_seq))
            if cur.rowcount == 1:
                break
            # PostgreSQL: a sync on another connection advanced the tree since the read; read it again.
        else:
            raise StoreError(f"audit tree of run {run_id!r} keeps changing under this transaction")
        if rows:
            cur.executemany(self._sql_put, rows)
        edges = self._edges
        txn.on_commit(lambda: edges.__setitem__(run_id, after))
        return True


_Edges = tuple[tuple[int, int], dict[int, bytes], dict[tuple[int, int], bytes]]

# How many runs' edges one SQLHashes keeps: a long-lived process appends to ever more runs, and a run no
# longer written to must not pin its edges for the life of the process.
_EDGES_KEPT = 1024


class _RecentEdges(dict[str, _Edges]):
    """The edges of the `_EDGES_KEPT` runs stored most recently; a run whose edges were dropped has them
    read again from its tiles at its next append."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()  # a commit callback may store edges outside SQLHashes's own lock

    def __setitem__(self, run_id: str, edges: _Edges) -> None:
        with self._lock:
            self.pop(run_id, None)  # to the end: the most recent
            super().__setitem__(run_id, edges)
            while len(self) > _EDGES_KEPT:
                try:
                    oldest = next(iter(self))
                except RuntimeError:  # a pop elsewhere changed the dict between the two steps: look again
                    continue
                self.pop(oldest, None)


def _fetch_with(
    cur: Any, sql_read: Callable[[int], str], run_id: str, keys: Sequence[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """Tiles by (level, tile), read on the cursor of an open transaction."""
    wanted = list(dict.fromkeys(keys))
    got: dict[tuple[int, int], bytes] = {}
    for start in range(0, len(wanted), 400):
        chunk = wanted[start : start + 400]
        params: list[Any] = [x for c in chunk for x in c]
        params.append(run_id)
        cur.execute(sql_read(len(chunk)), params)
        for lv, t, v in cur.fetchall():
            got[(int(lv), int(t))] = _tile_bytes(run_id, lv, t, v)
    return got


def _tree_state(run_id: str, size: object, last_seq: object) -> tuple[int, int]:
    """A tree row's (size, last seq), as only an append writes them (`AuditTablesDamaged` otherwise)."""
    if not (isinstance(size, int) and isinstance(last_seq, int) and size >= 0 and last_seq >= 0):
        raise AuditTablesDamaged(
            f"the audit tree of run {run_id!r} records size {size!r} and last seq {last_seq!r}, which no "
            "append writes; the audit tables are damaged"
        )
    return size, last_seq


def _tile_bytes(run_id: str, level: object, tile: object, value: object) -> bytes:
    """A tile row's hashes, which an append writes as bytes (`AuditTablesDamaged` otherwise)."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise AuditTablesDamaged(
            f"audit tile {(level, tile)} of run {run_id!r} holds {type(value).__name__}, not bytes; the "
            "audit tables are damaged"
        )
    return bytes(value)


def _let_go_on_dispose(hashes: weakref.ref[SQLHashes]) -> Callable[[sa.engine.Engine], None]:
    def disposed(engine: sa.engine.Engine) -> None:
        found = hashes()
        if found is not None:
            found._let_go()

    return disposed


# Connections a forked child inherited from its parent: never closed nor finalized here (see
# `SQLHashes._forget_inherited`).
_INHERITED: list[Any] = []

_memory_backends: weakref.WeakKeyDictionary[Any, MemoryHashes] = weakref.WeakKeyDictionary()
_sql_backends: weakref.WeakKeyDictionary[Any, SQLHashes] = weakref.WeakKeyDictionary()
_backends_lock = threading.Lock()


def backend_for(store: Any) -> HashBackend:
    """The hash backend kept beside `store`: SQL tables for a store exposing `engine` and `table_prefix`
    (bide's SQL stores), memory otherwise."""
    with _backends_lock:
        engine = getattr(store, "engine", None)
        if isinstance(engine, sa.engine.Engine):
            found = _sql_backends.get(store)
            if found is None:
                found = SQLHashes(engine, str(getattr(store, "table_prefix", "bide_")))
                _sql_backends[store] = found
            return found
        mem = _memory_backends.get(store)
        if mem is None:
            mem = MemoryHashes()
            _memory_backends[store] = mem
        return mem


def _locked(exc: BaseException) -> bool:
    """Whether `exc` (a driver error, or SQLAlchemy's wrapper of one) is a lock wait that ran out: SQLite's
    busy or locked, PostgreSQL's lock_timeout (55P03)."""
    orig = getattr(exc, "orig", None) or exc
    if isinstance(orig, sqlite3.Error):
        return (getattr(orig, "sqlite_errorcode", None) or 0) & 0xFF in _SQLITE_BUSY
    return _lock_timeout(orig)
