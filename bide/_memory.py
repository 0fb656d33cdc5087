"""The in-memory store: for tests and development. NOT DURABLE: everything is lost when the process exits."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence

from ._errors import ConfigError, StoreError
from ._store import (
    END_KEY,
    BlockingStore,
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
)

__all__ = ["MemoryStore"]


class MemoryStore(BlockingStore):
    """A `Store` kept in a dict, shared by every thread of one process. Not durable; never use it for work
    whose side effects matter across a crash.

    Once `close()` is called it refuses every request, as a SQL store does, with a `StoreError` (`lasting`)
    saying it is closed and nothing was written; only the threads finishing what a cancelled drive left
    (a synchronous call's late outcome, its run's lease) may use it until they are done, and the drives it
    stopped may free their runs' leases (see `Store.close`)."""

    durable = False

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.Lock()
        # Records are kept as (seq, key, data) tuples of atomic values, which the garbage collector stops
        # tracking: a store holding millions of records adds nothing to collection pauses.
        self._runs: dict[str, dict[str, tuple[int, str, bytes]]] = {}
        self._order: dict[str, list[tuple[int, str, bytes]]] = {}
        self._seq = 0
        # Leases as (holder, token, expires_ms): tuples of atomic values, untracked by the garbage collector
        # (a Lease is a tuple subclass, which it tracks for as long as the store keeps it).
        self._leases: dict[str, tuple[str, int, int]] = {}
        self._hooks = WriteHooks()
        self.hook_errors = self._hooks.errors
        self._closing = False  # close() was called: refused but to the threads it waits for
        self._closed = False  # ... and they are done: refused to everyone

    def close(self) -> None:
        """Refuse every later request (see the class); idempotent and never waits."""
        self._closing = True
        close_after_finishers(self, self._close_now)

    def _close_now(self) -> None:
        self._closed = True

    def _refuse_when_closed(self, what: str) -> None:
        if self._closing and (self._closed or not may_use_while_closing(self)):
            raise StoreError(
                f"store {self.url} is closed (its close() was called): {what} was refused, nothing was "
                "written. Open the store again (bide.open_store) for more work; a memory store's records "
                "are not in the new one",
                lasting=True,
            )

    def add_write_hook(self, hook: WriteHook, *, on_error: Callable[[Exception], None] | None = None) -> None:
        """Call `hook` after every insert that wrote records, under the store's lock (see `HookedStore` in
        bide/_store.py). The memory store cannot undo a hook's writes: a hook must leave its own state
        unchanged when it raises."""
        with self._lock:
            self._hooks.add(hook, on_error)

    def remove_write_hook(self, hook: WriteHook) -> None:
        with self._lock:
            self._hooks.remove(hook)

    def insert_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, bytes]],
        *,
        exclusive: bool = False,
        fence: Fence | None = None,
    ) -> list[Entry]:
        _check(run_id, items)
        if self._closing:  # (one attribute on the hot path)
            self._refuse_when_closed(f"insert on run {run_id!r}")
        out: list[Entry] = []
        with self._lock:
            if fence is not None:
                held = self._leases.get(run_id)
                if held is None or held[1] != fence[1] or held[0] != fence[0]:
                    refuse_fence(run_id, self._lease(run_id), fence)
            records = self._runs.get(run_id)
            if records is None:
                records = self._runs[run_id] = {}
                order = self._order[run_id] = []
            else:
                order = self._order[run_id]
            if records:
                if exclusive:
                    clash = []
                    for key, _ in items:  # a loop, not a comprehension: no function frame, on most writes
                        if key in records:
                            clash.append(Entry(*records[key]))
                    if clash:
                        return clash
                if END_KEY in records and any(key not in records for key, _ in items):
                    refuse_ended(run_id)
            seq = self._seq
            wrote = False
            try:
                for key, data in items:
                    existing = records.get(key)
                    if existing is not None:
                        out.append(Entry(*existing))
                        continue
                    seq += 1
                    # The store keeps its own bytes (a bytearray is copied); bytes are immutable already.
                    row = (seq, key, data if type(data) is bytes else bytes(data))
                    records[key] = row
                    order.append(row)
                    out.append(Entry(seq, key, row[2], True))
                    wrote = True
            finally:
                self._seq = seq  # every seq handed out stays used, whatever happens
            if wrote and self._hooks.hooks:
                self._run_hooks({run_id: [e for e in out if e.inserted]})
        return out

    def _run_hooks(self, written: dict[str, list[Entry]]) -> None:
        # Called with the lock held, right after the records were added (they are visible to nobody yet).
        for hook, on_error in self._hooks.hooks:
            txn = WriteTransaction(None, "memory", self._load_locked)
            try:
                hook(txn, written)
            except Exception as exc:
                txn._finish(committed=False)
                self._hooks.failed(on_error, exc)
                continue
            txn._finish(committed=True)

    def _load_locked(self, run_id: str, after: int = 0) -> list[Entry]:
        order = self._order.get(run_id, [])
        start = bisect.bisect_right(order, after, key=_row_seq) if after > 0 else 0
        return [Entry(*r) for r in order[start:]]

    def lease(self, run_id: str, holder: str, *, now_ms: int, ttl_ms: int, token: int = 0) -> Lease:
        # A closing store still renews the leases of drives whose calls run (a token given: see Store.close).
        if self._closing and (self._closed or not token):
            self._refuse_when_closed(f"lease on run {run_id!r}")
        with self._lock:
            lease = decide_lease(run_id, self._lease(run_id), holder, now_ms, ttl_ms, token)
            if lease.held:
                self._leases[run_id] = (holder, lease.token, lease.expires_ms)
        return lease

    def _lease(self, run_id: str) -> Lease | None:
        held = self._leases.get(run_id)
        return None if held is None else Lease(run_id, *held)

    def release(self, run_id: str, holder: str, token: int) -> bool:
        if self._closed:  # a closing store still frees the leases of the drives it stopped (see Store.close)
            self._refuse_when_closed(f"release on run {run_id!r}")
        with self._lock:
            current = self._leases.get(run_id)
            if current is None or current[0] != holder or current[1] != token:
                return False
            self._leases[run_id] = (holder, token, 0)
        return True

    def expired_leases(self, *, now_ms: int, after: str = "", limit: int = 500) -> list[Lease]:
        if self._closing:
            self._refuse_when_closed("listing the runs' leases")
        with self._lock:
            out = [
                Lease(r, *held, last_seq=self._order[r][-1][0])
                for r, held in self._leases.items()
                if r > after and held[2] <= now_ms and self._open(r)
            ]
        out.sort(key=_lease_run)
        return out[:limit]

    def _open(self, run_id: str) -> bool:
        """The run has records and no end (called with the lock held)."""
        records = self._runs.get(run_id)
        return records is not None and len(records) > 0 and END_KEY not in records

    def get(self, run_id: str, key: str) -> Entry | None:
        if self._closing:
            self._refuse_when_closed(f"get on run {run_id!r}")
        with self._lock:
            row = self._runs.get(run_id, {}).get(key)
        return None if row is None else Entry(*row)

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        if self._closing:
            self._refuse_when_closed(f"load on run {run_id!r}")
        with self._lock:
            order = self._order.get(run_id)
            if not order:
                return []
            # Records are in seq order: the ones after `after` are found by bisection, not a scan.
            rows = order[bisect.bisect_right(order, after, key=_row_seq) :] if after > 0 else list(order)
        return [Entry(*r) for r in rows]

    def runs(
        self, *, prefix: str = "", after: str = "", limit: int = 500, open_only: bool = False
    ) -> list[str]:
        if self._closing:
            self._refuse_when_closed("listing the runs")
        with self._lock:
            ids = sorted(
                r
                for r, records in self._runs.items()
                if r.startswith(prefix) and r > after and records and not (open_only and END_KEY in records)
            )
        return ids[:limit]


def _lease_run(lease: Lease) -> str:
    return lease.run_id


def _row_seq(row: tuple[int, str, bytes]) -> int:
    return row[0]


def _check(run_id: str, items: Sequence[tuple[str, bytes]]) -> None:
    if not run_id:
        raise ConfigError("run id must be a non-empty string")
    for key, data in items:
        if not key:
            raise ConfigError("record key must be a non-empty string")
        if type(data) is not bytes and not isinstance(data, (bytes, bytearray)):
            raise ConfigError(f"record data for {key!r} must be bytes, got {type(data).__name__}")
    if len(items) > 1:
        keys = dict(items)  # dict(): no comprehension frame
        if len(keys) != len(items):
            raise ConfigError("the keys of one insert_many call must be distinct")
        if END_KEY in keys and items[-1][0] != END_KEY:
            raise ConfigError(
                f"{END_KEY!r} must be the last record of an insert_many call: nothing is stored after a "
                "run's end (S8)"
            )
