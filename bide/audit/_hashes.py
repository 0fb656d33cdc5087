"""Where a run's Merkle hashes live: beside the journal, in the same store.

For SQL stores, two tables next to the journal's (same engine, same table prefix):

- ``<prefix>audit_strips(run_id, level, strip, hashes)``: the complete-subtree hashes of one level, 64 per
  row: node (level, idx), covering leaves [idx * 2^level, (idx + 1) * 2^level), is the 32 bytes at offset
  32 * (idx mod 64) of strip idx div 64. About 2n/64 rows for n records; a strip only ever grows.
- ``<prefix>audit_trees(run_id, size, last_seq)``: how many records the tree holds, and the store seq of
  the last one.

The tables are a cache of the journal: their commits do not wait for the disk (a crash may lose the
latest ones; the next sync recomputes exactly the same hashes from the immutable journal).

For the memory store, a `MerkleTree` per run in memory (shared by every `AuditLog` on that store object).
Appending k records hashes at most 2k + log n nodes, reads O(log n) strips and writes O(k/64 + log n)
strips in one transaction; a proof reads O(log n) strips in one query.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import sqlalchemy as sa

from .._errors import StoreError
from ._merkle import Coord, _tiles
from ._tree import MerkleTree

__all__ = ["HashBackend", "MemoryHashes", "SQLHashes", "backend_for"]


class HashBackend(Protocol):
    """Stores the complete-subtree hashes of each run's tree."""

    def state(self, run_id: str) -> tuple[int, int]:
        """(size, last absorbed store seq) of the run's tree; (0, 0) when it has none."""
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


STRIP = 64
"""Nodes per stored strip: (level, idx) is bytes [32 * (idx % STRIP), +32) of strip idx // STRIP."""


def _tail_keys(size: int) -> list[tuple[int, int]]:
    """The (level, strip) of each level's partially filled last strip in a tree of `size` leaves."""
    return [(lv, (size >> lv) // STRIP) for lv in range(size.bit_length()) if (size >> lv) % STRIP]


class SQLHashes:
    """Hashes in two tables beside a SQL store's journal (see the module docstring)."""

    def __init__(self, engine: sa.engine.Engine, table_prefix: str) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        md = sa.MetaData()
        p = table_prefix
        text = sa.String(collation="C") if self.dialect == "postgresql" else sa.String()
        self.hashes = sa.Table(
            f"{p}audit_strips",
            md,
            sa.Column("run_id", text, nullable=False),
            sa.Column("level", sa.SmallInteger, nullable=False),
            sa.Column("strip", sa.BigInteger, nullable=False),
            sa.Column("hashes", sa.LargeBinary, nullable=False),
            sa.PrimaryKeyConstraint("run_id", "level", "strip", name=f"{p}audit_strips_pk"),
            sqlite_with_rowid=False,
        )
        self.trees = sa.Table(
            f"{p}audit_trees",
            md,
            sa.Column("run_id", text, primary_key=True),
            sa.Column("size", sa.BigInteger, nullable=False),
            sa.Column("last_seq", sa.BigInteger, nullable=False),
        )
        for attempt in range(5):
            try:
                md.create_all(engine, checkfirst=True)
                break
            except sa.exc.DBAPIError:
                if attempt == 4:
                    raise
        self._lock = threading.Lock()
        self._conn: sa.engine.Connection | None = None
        self._edges: dict[str, tuple[tuple[int, int], dict[int, bytes], dict[tuple[int, int], bytes]]] = {}
        # Raw SQL through the driver: SQLAlchemy's per-row parameter processing costs more than the
        # database itself on the hot paths (a proof's one read, a sync's bulk write).
        q = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        self._q, self._p = q, p
        self._sql_state = f"SELECT size, last_seq FROM {p}audit_trees WHERE run_id = {q}"
        # A strip only grows: rewriting it keeps every byte already stored (checked before the write).
        self._sql_put = (
            f"INSERT INTO {p}audit_strips (run_id, level, strip, hashes) VALUES ({q}, {q}, {q}, {q}) "
            "ON CONFLICT (run_id, level, strip) DO UPDATE SET hashes = excluded.hashes"
        )
        self._sql_new_tree = (
            f"INSERT INTO {p}audit_trees (run_id, size, last_seq) VALUES ({q}, 0, 0) ON CONFLICT DO NOTHING"
        )
        self._sql_advance = (
            f"UPDATE {p}audit_trees SET size = {q}, last_seq = {q} "
            f"WHERE run_id = {q} AND size = {q} AND last_seq = {q}"
        )

    def _sql_read(self, n: int) -> str:
        q = self._q
        values = ", ".join([f"({q}, {q})"] * n)
        return (
            f"WITH wanted(level, strip) AS (VALUES {values}) SELECT h.level, h.strip, h.hashes "
            f"FROM wanted JOIN {self._p}audit_strips h ON h.run_id = {q} AND h.level = wanted.level "
            "AND h.strip = wanted.strip"
        )

    def _connection(self) -> sa.engine.Connection:
        # One connection reused for reads: opening a SQLite connection per proof would dominate its cost.
        if self._conn is None or self._conn.closed:
            conn = self.engine.connect()
            # The tree is derived from the journal: a crash that loses its last commits loses nothing
            # (the next sync recomputes the same hashes), so its commits need not wait for the disk.
            if self.dialect == "sqlite":
                conn.exec_driver_sql("PRAGMA synchronous=NORMAL")
            elif self.dialect == "postgresql":
                conn.exec_driver_sql("SET synchronous_commit = off")
            conn.commit()
            self._conn = conn
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def state(self, run_id: str) -> tuple[int, int]:
        with self._lock:
            conn = self._connection()
            try:
                row = conn.exec_driver_sql(self._sql_state, (run_id,)).first()
            finally:
                conn.rollback()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def _strips(self, run_id: str, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        wanted = list(dict.fromkeys(keys))
        got: dict[tuple[int, int], bytes] = {}
        if not wanted:
            return got
        with self._lock:
            conn = self._connection()
            try:
                for start in range(0, len(wanted), 400):
                    chunk = wanted[start : start + 400]
                    params: list[Any] = [x for c in chunk for x in c]
                    params.append(run_id)
                    for lv, st, v in conn.exec_driver_sql(self._sql_read(len(chunk)), tuple(params)):
                        got[(int(lv), int(st))] = bytes(v)
            finally:
                conn.rollback()
        return got

    def read(self, run_id: str, coords: Sequence[Coord]) -> list[bytes]:
        if not coords:
            return []
        strips = self._strips(run_id, [(lv, i // STRIP) for lv, i in coords])
        out = []
        for lv, i in coords:
            at = (i % STRIP) * 32
            h = strips.get((lv, i // STRIP), b"")[at : at + 32]
            if len(h) != 32:
                raise StoreError(
                    f"audit hashes of run {run_id!r} are missing node {(lv, i)}; the audit tables are damaged"
                )
            out.append(h)
        return out

    def extend(
        self, run_id: str, size: int, last_seq: int, leaves: Sequence[bytes], new_last_seq: int
    ) -> bool:
        # The right edge and each level's partial last strip are all an append needs. This object keeps
        # them from its previous append of this run; a tree that grew elsewhere meanwhile is read afresh
        # (and if it grows elsewhere during this append, the size check in the transaction refuses it).
        cached = self._edges.get(run_id)
        if cached is not None and cached[0] == (size, last_seq):
            edge, tails = cached[1], cached[2]
        else:
            tiles = _tiles(0, size)
            edge = {lv: h for (lv, _), h in zip(tiles, self.read(run_id, tiles), strict=True)}
            tails = self._strips(run_id, _tail_keys(size))
        frontier = [edge[lv] for lv, _ in _tiles(0, size)]
        levels = new_levels(frontier, size, leaves)
        rows: list[tuple[str, int, int, bytes]] = []
        for lv, (first, hashes) in levels.items():
            idx, at = first, 0
            while at < len(hashes):
                strip, offset = divmod(idx, STRIP)
                take = min(STRIP - offset, len(hashes) - at)
                keep = tails.get((lv, strip), b"")[: offset * 32] if offset else b""
                if len(keep) != offset * 32:
                    raise StoreError(f"audit strip {(lv, strip)} of run {run_id!r} is damaged")
                rows.append((run_id, lv, strip, keep + b"".join(hashes[at : at + take])))
                idx, at = idx + take, at + take
        with self._lock:
            conn = self._connection()
            try:
                if size == 0:
                    conn.exec_driver_sql(self._sql_new_tree, (run_id,))
                done = conn.exec_driver_sql(
                    self._sql_advance, (size + len(leaves), new_last_seq, run_id, size, last_seq)
                )
                if done.rowcount != 1:
                    conn.rollback()
                    self._edges.pop(run_id, None)
                    return False
                if rows:
                    conn.exec_driver_sql(self._sql_put, rows)
                conn.commit()
            except BaseException:
                self._edges.pop(run_id, None)
                conn.rollback()
                raise
            new_size = size + len(leaves)
            new_edge = {
                lv: (levels[lv][1][-1] if lv in levels else edge[lv]) for lv, _ in _tiles(0, new_size)
            }
            new_tails = dict(tails)
            for _, lv, strip, blob in rows:
                new_tails[(lv, strip)] = blob
            live = set(_tail_keys(new_size))
            self._edges[run_id] = (
                (new_size, new_last_seq),
                new_edge,
                {k: v for k, v in new_tails.items() if k in live},
            )
        return True


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
