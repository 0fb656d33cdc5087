"""`AuditedStore`: a store wrapper that keeps the audit tree (and the anchor) up to date on every append."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._store import Entry, HookedStore, Store
from ._anchor import ForkRefused
from ._log import AuditLog

__all__ = ["AuditedStore"]

_LOGGER = logging.getLogger("bide.audit")


class AuditedStore:
    """Wraps a store so that every append advances the run's audit tree (O(log n) per record) and, when
    `anchor` is true and the log has a key and a publisher, publishes a signed head of the new size.

    When the wrapped store has write hooks (`HookedStore` in bide/_store.py: SQLStore, MemoryStore) and
    the log keeps its hashes beside it, the tree advances inside the append's own transaction: tree and
    journal commit together, in one commit. Otherwise the tree is synced after the append commits.

    Anchoring (signing and publishing a head) happens only after the journal commit and never undoes it:
    a failure to advance the tree or to publish does not fail the append (the journal is the truth; the
    next append, `AuditLog.sync` or `AuditLog.sign_head` catches up). Each failure is passed to `on_error`
    (default: kept in `errors`, the latest 100). A head a `DirectoryPublisher` refuses because it forks from
    one of the run's heads anchored there (`ForkRefused`: the journal is not the one that was anchored) is
    such a failure too, and no later append catches up on it: by default it is also logged as an error
    (logger ``bide.audit``), at each append so refused. Give the wrapper to `bide.Agent(store=...)` like
    any store; everything else is passed through to the wrapped store. `close` unregisters the hook and
    closes the wrapped store.
    """

    def __init__(
        self,
        store: Store,
        log: AuditLog | None = None,
        *,
        anchor: bool = True,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.inner = store
        self.url: str = store.url
        self.durable: bool = store.durable
        self.log = log if log is not None else AuditLog(store)
        self.anchor = anchor
        self.errors: list[Exception] = []
        self._on_error = on_error
        # One anchoring per run at a time: a fixed set of locks, a run's chosen by its id, so that a
        # long-lived process holds no lock per run it ever wrote (two runs may share one: they then anchor
        # one after the other).
        self._locks = tuple(threading.Lock() for _ in range(64))
        # In the same transaction when the store can and the tree lives beside it (not another store's).
        self.in_transaction = isinstance(store, HookedStore) and self.log.store is store
        if self.in_transaction:
            store.add_write_hook(self.log.absorb, on_error=self._error)  # type: ignore[attr-defined]

    def _error(self, exc: Exception) -> None:
        if self._on_error is not None:
            self._on_error(exc)
            return
        self.errors = [*self.errors[-99:], exc]
        if isinstance(exc, ForkRefused):  # not a passing failure: every later head is refused too
            _LOGGER.error("the audit log's head was not anchored: %s", exc)

    @property
    def _anchors(self) -> bool:
        return self.anchor and self.log.key is not None and self.log.publisher is not None

    def _syncs(self, run_id: str) -> bool:
        """Whether an append of the run needs work after its commit: anchoring, or a tree the hook did not
        advance (no hook, or too far behind to catch up inside the write)."""
        return not self.in_transaction or self._anchors or run_id in self.log._behind

    def __getattr__(self, name: str) -> Any:
        # engine, table_prefix, and anything else a caller knows about the wrapped store
        return getattr(self.inner, name)

    def _after(self, run_id: str) -> None:
        lock = self._locks[hash(run_id) % len(self._locks)]
        with lock:  # one anchoring per run at a time, so heads are published in size order
            try:
                self.log.sync(run_id)  # a no-op read when the hook already advanced the tree
                if self._anchors:
                    self.log.sign_head(run_id)
            except Exception as exc:
                self._error(exc)

    def insert_many(self, run_id: str, items: Sequence[tuple[str, bytes]], **options: Any) -> list[Entry]:
        out = self.inner.insert_many(run_id, items, **options)
        if self._syncs(run_id) and any(e.inserted for e in out):
            self._after(run_id)
        return out

    async def ainsert_many(
        self, run_id: str, items: Sequence[tuple[str, bytes]], **options: Any
    ) -> list[Entry]:
        out = await self.inner.ainsert_many(run_id, items, **options)
        if self._syncs(run_id) and any(e.inserted for e in out):
            await asyncio.to_thread(self._after, run_id)
        return out

    def get(self, run_id: str, key: str) -> Entry | None:
        return self.inner.get(run_id, key)

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        return self.inner.load(run_id, after)

    def runs(
        self, *, prefix: str = "", after: str = "", limit: int = 500, open_only: bool = False
    ) -> list[str]:
        return self.inner.runs(prefix=prefix, after=after, limit=limit, open_only=open_only)

    async def aget(self, run_id: str, key: str) -> Entry | None:
        return await self.inner.aget(run_id, key)

    async def aload(self, run_id: str, after: int = 0) -> list[Entry]:
        return await self.inner.aload(run_id, after)

    def close(self) -> None:
        if self.in_transaction:
            self.inner.remove_write_hook(self.log.absorb)  # type: ignore[attr-defined]
            self.in_transaction = False
        self.inner.close()
