"""The store port: append-only named byte records per run.

A store keeps, for each run id, records `(seq, key, data)`. Its whole contract (checked by the conformance
suite in tests/bide/test_store_conformance.py, run against every store):

- **S1 insert-if-absent, one winner.** At most one record per (run id, key). Concurrent inserts from any
  threads or processes have exactly one winner, and every inserter gets the winner's record back.
- **S2 commit order.** `seq` is opaque and strictly increases, per run, in commit order; every `load` returns
  a prefix of that order (gaps in the numbers are allowed, holes in visibility are not).
- **S3 durable on return.** When `insert_many` returns, the records are committed (for SQL stores: on disk,
  fsynced). When it raises, each record is either absent or complete; nothing is half-written. Retrying
  the same bytes is safe.
- **S4 read-your-writes** and monotonic reads within a store object.
- **S5 byte fidelity.** `data` comes back exactly as written, every byte.
- **S6 immutable.** Records are never updated or deleted by bide.
- **S7 exclusive batches.** `insert_many(..., exclusive=True)` inserts all its records or none (when any
  key exists), so a record can be written only together with the record it depends on.

Every method has a blocking form (safe to call from any thread) and an async form (for the agent loop). The
async forms return awaitables, not necessarily coroutines: `await` them, or schedule them with
`asyncio.ensure_future` (not `create_task`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["BlockingStore", "Entry", "Store"]


@dataclass(frozen=True, slots=True)
class Entry:
    """A stored record. `inserted` is True when this very call wrote it (False when the key existed, even
    with the same bytes)."""

    seq: int
    key: str
    data: bytes
    inserted: bool = False


@runtime_checkable
class Store(Protocol):
    """The port every store implements (see the module docstring for the contract S1-S6)."""

    url: str
    durable: bool

    def insert_many(
        self, run_id: str, items: Sequence[tuple[str, bytes]], *, exclusive: bool = False
    ) -> list[Entry]:
        """Insert each (key, data) that is absent, in order and in one transaction; return the winners.

        With `exclusive=True` the items are inserted all together or not at all: if any key exists, nothing
        is inserted and only the entries of the keys that exist are returned (all with inserted=False).
        """
        ...

    def get(self, run_id: str, key: str) -> Entry | None:
        """The record stored under `key`, or None."""
        ...

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        """Every record of the run with seq > after, in seq order."""
        ...

    def runs(self, *, prefix: str = "", after: str = "", limit: int = 500) -> list[str]:
        """Run ids with at least one record, in byte order, starting after `after`, at most `limit`."""
        ...

    # The async forms return awaitables: a coroutine (`async def`) or, as SQLStore does, a future, which
    # spares every waiting run one coroutine object.

    def ainsert_many(
        self, run_id: str, items: Sequence[tuple[str, bytes]], *, exclusive: bool = False
    ) -> Awaitable[list[Entry]]:
        """Async `insert_many`; concurrent callers may be committed together in one transaction."""
        ...

    def aget(self, run_id: str, key: str) -> Awaitable[Entry | None]:
        """Async `get`."""
        ...

    def aload(self, run_id: str, after: int = 0) -> Awaitable[list[Entry]]:
        """Async `load`."""
        ...

    def close(self) -> None:
        """Release connections and threads. Idempotent."""
        ...


class BlockingStore:
    """Base for stores whose every operation is fast and in-process: the async forms call the blocking
    ones directly (no thread hop), so subclasses write only `insert_many`, `get`, `load`, `runs`."""

    def insert_many(
        self, run_id: str, items: Sequence[tuple[str, bytes]], *, exclusive: bool = False
    ) -> list[Entry]:
        raise NotImplementedError

    def get(self, run_id: str, key: str) -> Entry | None:
        raise NotImplementedError

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        raise NotImplementedError

    async def ainsert_many(
        self, run_id: str, items: Sequence[tuple[str, bytes]], *, exclusive: bool = False
    ) -> list[Entry]:
        return self.insert_many(run_id, items, exclusive=exclusive)

    async def aget(self, run_id: str, key: str) -> Entry | None:
        return self.get(run_id, key)

    async def aload(self, run_id: str, after: int = 0) -> list[Entry]:
        return self.load(run_id, after)

    def close(self) -> None:
        return None
