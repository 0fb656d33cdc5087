"""The store port: append-only named byte records per run.

A store keeps, for each run id, records `(seq, key, data)`. Its whole contract (checked by the conformance
suite in tests/bide/test_bide_store.py, run against every store):

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
- **S8 sealed at the end.** Once a run holds its `run:end` record, an insert that would add a record to it
  raises `RunEnded` and writes nothing (keys that exist are answered as usual: that adds nothing). Within
  one call `run:end` must be the last record (else `ConfigError`), and concurrent inserts answer as if
  run one at a time: none adds a record after an end another one wrote.
- **S9 leases.** Each run has at most one lease: a holder id, an expiry (Unix ms, the caller's clock) and a
  fencing token. `lease` grants it when it is free (never granted, released, or expired), renews it for
  the holder presenting the current token, and otherwise answers who holds it. Every grant to a new holder
  takes a token greater than every earlier one of the run. `release` frees it (the token stays).
  `expired_leases` lists the runs not ended whose lease is not live (for a recovery worker), each with the
  seq of its latest record (`Lease.last_seq`). A lease alone does not make a run: `runs` and
  `expired_leases` list only runs with records.
- **S10 fencing.** `insert_many(..., fence=(holder, token))` writes only while the run's lease is that
  holder's with that token (expired or not: nobody has taken it over); otherwise it raises `LeaseLost` and
  writes nothing. Checked in the write's own transaction.

Write hooks (optional; `SQLStore` and `MemoryStore` have them, see `HookedStore`): a store may call
functions inside each write transaction, after its inserts and before its commit, so that data derived from
the records (the audit tree) commits together with them. A hook never fails or undoes a write: its own
writes are rolled back (a savepoint) and its error is reported, and the journal write commits anyway.

Every method has a blocking form (safe to call from any thread) and an async form (for the agent loop). The
async forms return awaitables, not necessarily coroutines: `await` them, or schedule them with
`asyncio.ensure_future` (not `create_task`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ._canonical import new_claim
from ._errors import LeaseLost, RunEnded, StoreError

__all__ = [
    "BlockingStore",
    "Entry",
    "Fence",
    "HookedStore",
    "Lease",
    "Store",
    "WriteHook",
    "WriteTransaction",
]

END_KEY = "run:end"  # the record that seals a run (S8); the journal defines it, the store enforces it
EVERY_LEASE_MS = 2**62  # expired_leases at this instant lists every lease of an unfinished run

Fence = tuple[str, int]
"""(holder, token) of a lease, carried by a fenced write (S10)."""


@dataclass(slots=True)
class Entry:
    """A stored record. `inserted` is True when this very call wrote it (False when the key existed, even
    with the same bytes; a SQL store that sent the call again after its connection broke counts what the
    lost try wrote as this call's)."""

    seq: int
    key: str
    data: bytes
    inserted: bool = False


class Lease(NamedTuple):
    """A run's lease as the store answered it. `held` is True when the caller holds it after the call
    (granted or renewed); otherwise `holder`, `token` and `expires_ms` describe the live lease of someone
    else. `expires_ms` is Unix milliseconds on the clock of the caller that granted or renewed it."""

    run_id: str
    holder: str
    token: int
    expires_ms: int
    held: bool = False
    #: In `expired_leases`: the seq of the run's latest record, which grows with every record written to
    #: the run, so that a worker tells a run that changed from one that did not without reading its journal
    #: (-1: the store does not say).
    last_seq: int = -1


@runtime_checkable
class Store(Protocol):
    """The port every store implements (see the module docstring for the contract S1-S6)."""

    url: str
    durable: bool

    def insert_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, bytes]],
        *,
        exclusive: bool = False,
        fence: Fence | None = None,
    ) -> list[Entry]:
        """Insert each (key, data) that is absent, in order and in one transaction; return the winners.

        With `exclusive=True` the items are inserted all together or not at all: if any key exists, nothing
        is inserted and only the entries of the keys that exist are returned (all with inserted=False).
        With `fence`, the write happens only under that lease (S10). Raises `RunEnded` (S8).
        """
        ...

    def lease(self, run_id: str, holder: str, *, now_ms: int, ttl_ms: int, token: int = 0) -> Lease:
        """Grant (`token` 0), renew (`token` is the holder's current one) or refuse the run's lease (S9):
        a renewal with a token that is no longer current is refused, even when the lease is free."""
        ...

    def release(self, run_id: str, holder: str, token: int) -> bool:
        """Free the lease if `holder` holds it with `token`; True when it did."""
        ...

    def expired_leases(self, *, now_ms: int, after: str = "", limit: int = 500) -> list[Lease]:
        """Runs without `run:end` whose lease is not live at `now_ms` (expired or released), by run id."""
        ...

    def get(self, run_id: str, key: str) -> Entry | None:
        """The record stored under `key`, or None."""
        ...

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        """Every record of the run with seq > after, in seq order (after 0: every record it holds)."""
        ...

    def runs(
        self, *, prefix: str = "", after: str = "", limit: int = 500, open_only: bool = False
    ) -> list[str]:
        """Run ids with at least one record, in byte order, starting after `after`, at most `limit`; with
        `open_only`, only runs that have not ended (no `run:end` record: not completed, failed or
        cancelled)."""
        ...

    # The async forms return awaitables: a coroutine (`async def`) or, as SQLStore does, a future, which
    # spares every waiting run one coroutine object.

    def ainsert_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, bytes]],
        *,
        exclusive: bool = False,
        fence: Fence | None = None,
    ) -> Awaitable[list[Entry]]:
        """Async `insert_many`; concurrent callers may be committed together in one transaction."""
        ...

    def alease(
        self, run_id: str, holder: str, *, now_ms: int, ttl_ms: int, token: int = 0
    ) -> Awaitable[Lease]:
        """Async `lease`. A load requested after it (without awaiting it first) sees the journal as of the
        grant or later."""
        ...

    def arelease(self, run_id: str, holder: str, token: int) -> Awaitable[bool]:
        """Async `release`."""
        ...

    def aget(self, run_id: str, key: str) -> Awaitable[Entry | None]:
        """Async `get`."""
        ...

    def aload(self, run_id: str, after: int = 0) -> Awaitable[list[Entry]]:
        """Async `load`."""
        ...

    def close(self) -> None:
        """Release connections and threads. Idempotent, and never waits: while synchronous calls that a
        cancelled drive left running still have their outcomes to journal through the store, it is
        released once they are done (in a thread of its own, which the end of the process waits for).
        A SQL store serves the requests it had taken in when close() was called (queued for its thread,
        or in a transaction: each write waiting for a lock held elsewhere commits or fails within the busy
        timeout, one after another, and the store is released after them; at the interpreter's exit
        close() waits for that). Requests an event loop had not sent yet, and every later one, are refused
        with a `StoreError` (`lasting`) saying it is closed and nothing was written. The memory store refuses
        them the same way. Except one: a drive of this process that the close stops (its next request is
        refused) frees its run's lease on the way out, so that another process may take the run at once; the
        store is released once such drives have let go, or `HANDOVER_S` (5 s) after close() at most. Until
        then the closing store also renews the leases its drives hold, and while a synchronous call of one
        of them runs in its thread it is not released at all: the drive, and past the call's deadline its
        keeper, keep the run's lease renewed until the call returns, so that no other driver takes the run
        (and calls again) meanwhile. A keeper journals the outcome of a call that ran past its deadline; a
        call that returned in time is its drive's to journal, which the closing store refuses like any of the
        drive's writes: the drive raises the `StoreError` naming what the call returned, the process keeps
        it (its next drive of the run journals it), and another driver halts on the call (its reconciler, or
        a person, decides it). A drive whose async call has not returned
        when the store is released leaves its lease to expire (its ttl): it is never freed while a side
        effect of the drive may be under way."""
        ...


class WriteTransaction:
    """What a write hook sees of the transaction it runs in.

    - `cursor`: the transaction's DBAPI cursor (SQL stores; None for the memory store). Statements run on it
      commit or roll back with the records. The hook must not commit, roll back or close it.
    - `dialect`: "sqlite", "postgresql" or "memory".
    - `load(run_id, after)`: the run's records with seq > after as this transaction sees them (its own
      inserts included), in seq order.
    - `on_commit(fn)`: call `fn()` once the transaction has committed (never if it rolls back, or if this
      hook's writes are undone). Keep in-memory caches of what the hook wrote up to date here, not before.
    - `on_rollback(fn)`: call `fn()` if the hook's writes are undone (its savepoint or the transaction rolled
      back).
    """

    __slots__ = ("_load", "_on_commit", "_on_rollback", "cursor", "dialect")

    def __init__(self, cursor: Any, dialect: str, load: Callable[[str, int], list[Entry]]) -> None:
        self.cursor = cursor
        self.dialect = dialect
        self._load = load
        self._on_commit: list[Callable[[], None]] = []
        self._on_rollback: list[Callable[[], None]] = []

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        return self._load(run_id, after)

    def on_commit(self, fn: Callable[[], None]) -> None:
        self._on_commit.append(fn)

    def on_rollback(self, fn: Callable[[], None]) -> None:
        self._on_rollback.append(fn)

    def _finish(self, committed: bool) -> None:
        """Run the callbacks for the outcome (called by the store, once); their errors are not the
        writer's."""
        fns = self._on_commit if committed else self._on_rollback
        self._on_commit, self._on_rollback = [], []
        for fn in fns:
            try:
                fn()
            except Exception:  # a cache callback must never fail a committed write
                continue


class WriteHook(Protocol):
    """`hook(txn, written)`: called inside each write transaction that inserted records, after the inserts
    and before the commit, with `{run_id: [the entries this transaction inserted, in seq order]}` (do not
    mutate it). Its writes on `txn.cursor` commit with the records or not at all; if it raises, they are
    undone and the error is reported, and the records commit anyway. Runs with the store's write lock held
    (SQLite's database lock; each written run's seq lock on PostgreSQL; the memory store's lock): per run,
    hooks see the records in commit order. Keep it short; it delays every writer."""

    def __call__(self, txn: WriteTransaction, written: Mapping[str, Sequence[Entry]], /) -> None: ...


@runtime_checkable
class HookedStore(Store, Protocol):
    """A store that runs write hooks (see `WriteHook`)."""

    hook_errors: list[Exception]
    """The latest errors of hooks registered without `on_error` (at most 100)."""

    def add_write_hook(self, hook: WriteHook, *, on_error: Callable[[Exception], None] | None = None) -> None:
        """Call `hook` in every write transaction from now on. A hook that raises has its writes undone and
        its error passed to `on_error` (default: appended to `hook_errors`); the write itself commits."""
        ...

    def remove_write_hook(self, hook: WriteHook) -> None:
        """Stop calling `hook` (no effect if it is not registered)."""
        ...


class WriteHooks:
    """The registered hooks of one store and what befalls their errors (shared by the store classes)."""

    __slots__ = ("errors", "hooks")

    def __init__(self) -> None:
        # A tuple, replaced on change: writers iterate it without a lock.
        self.hooks: tuple[tuple[WriteHook, Callable[[Exception], None] | None], ...] = ()
        self.errors: list[Exception] = []

    def add(self, hook: WriteHook, on_error: Callable[[Exception], None] | None) -> None:
        self.hooks = (*self.hooks, (hook, on_error))

    def remove(self, hook: WriteHook) -> None:
        self.hooks = tuple(h for h in self.hooks if h[0] != hook)

    def failed(self, on_error: Callable[[Exception], None] | None, exc: Exception) -> None:
        if on_error is None:
            self.errors[:] = [*self.errors[-99:], exc]
            return
        try:
            on_error(exc)
        except Exception as again:  # the callback's own failure is kept rather than failing the write
            self.errors[:] = [*self.errors[-99:], again]


def written_by(runs: Sequence[tuple[str, Sequence[Entry]]]) -> dict[str, list[Entry]]:
    """`{run_id: inserted entries in seq order}` from (run id, entries returned) pairs of one transaction."""
    out: dict[str, list[Entry]] = {}
    for run_id, entries in runs:
        new = [e for e in entries if e.inserted]
        if new:
            out.setdefault(run_id, []).extend(new)
    for new in out.values():
        new.sort(key=_seq)
    return out


# Threads that finish what a drive left to them (a synchronous call's late outcome to journal, then its
# run's lease to free), by the id of the store they write to and of each store it wraps. They are not
# daemons, so the end of the process waits for them; a store closed before they were done refused their
# writes: the outcome was lost (the run halted for a person) or the lease left held for lease_ttl.
_FINISHERS: dict[int, list[threading.Thread | Finishing]] = {}
_CLOSING: dict[int, threading.Thread] = {}  # the deferred close of each store waiting for its finishers
_FINISHERS_LOCK = threading.Lock()


class Finishing:
    """Work a store's deferred close waits for although no thread of its own does it yet: a synchronous
    call from its start until it returned to its drive or was handed to a thread that journals its outcome
    (a close() called as the drive is cancelled, before it hands the call on). Waited for as long as the call
    runs in its thread (`calling`: the drive keeps the run's lease renewed meanwhile, and past the call's
    deadline a keeper does, which a closed store could not serve: another driver would take the run and
    could call again), then `HANDOVER_S` at most: a drive hands the call on as soon as its event loop runs
    it, and one whose loop was dropped never will (waiting longer only kept the process from ending)."""

    __slots__ = ("_done", "_running")

    def __init__(self, running: Callable[[], bool] | None = None) -> None:
        self._done = threading.Event()
        self._running = running

    def calling(self) -> bool:
        """Whether the call is running in its thread now (not returned)."""
        return self._running is not None and not self._done.is_set() and self._running()

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def done(self) -> None:
        self._done.set()


HANDOVER_S = 5.0
_CALL_LOOK_S = 0.1  # how often a deferred close looks whether a synchronous call it waits for has returned


def finish_before_close(store: object, *threads: threading.Thread | Finishing) -> None:
    """Have `close()` of `store` (or of a store it wraps, its `inner`) wait for `threads`, which may go on
    using it after its close was called."""
    with _FINISHERS_LOCK:
        while store is not None:
            kept = _FINISHERS.setdefault(id(store), [])
            kept[:] = [t for t in kept if t.is_alive()]
            kept.extend(threads)
            store = getattr(store, "inner", None)


# Drives of this process that hold a run's lease through a store, by the id of the store and of each store
# it wraps. A close() called while some do is carried out once they have let go (at most `HANDOVER_S`
# later): a drive it stops (its next request is refused) frees its run's lease on the way out, which a
# closing store still serves, so a restart elsewhere need not wait out the lease's ttl. The drive frees it
# only when no call of its own may still be running (bide._lease.let_go); else the lease is kept to its ttl.
_DRIVING: dict[int, int] = {}
_DRIVES_LET_GO = threading.Condition(threading.Lock())


def driving(store: object, change: int) -> None:
    """Count a drive that took (`change` 1) or let go of (-1: its lease freed, or left to expire) a run's
    lease through `store`, for the close of `store` (and of the stores it wraps) to wait for."""
    with _DRIVES_LET_GO:
        while store is not None:
            key = id(store)
            left = _DRIVING.get(key, 0) + change
            if left > 0:
                _DRIVING[key] = left
            else:
                _DRIVING.pop(key, None)
            store = getattr(store, "inner", None)
        if change < 0:
            _DRIVES_LET_GO.notify_all()


def _wait_for_drives(key: int, until: float) -> None:
    """Wait until no drive holds a lease through the store `key`, or until the monotonic time `until`."""
    with _DRIVES_LET_GO:
        _DRIVES_LET_GO.wait_for(lambda: key not in _DRIVING, max(0.0, until - time.monotonic()))


def finishers_running(store: object) -> bool:
    """Whether threads `finish_before_close` registered for `store` still run: synchronous calls that ran on
    past their drive, whose outcomes are still to be journaled (the end of the process waits for them)."""
    with _FINISHERS_LOCK:
        kept = _FINISHERS.get(id(store), ())
        return any(isinstance(t, threading.Thread) and t.is_alive() for t in kept)


def may_use_while_closing(store: object) -> bool:
    """Whether this thread may still use `store` after its `close()` was called: it is one of the threads
    the deferred close waits for. Everyone else is told the store is closed."""
    me = threading.current_thread()
    with _FINISHERS_LOCK:
        return me in _FINISHERS.get(id(store), ())


def close_after_finishers(store: object, close: Callable[[], None]) -> None:
    """Run `close` (a store's own closing) now, or, while threads `finish_before_close` registered for
    `store` still run (some registered later too) or drives hold a lease through it (`driving`: for at most
    `HANDOVER_S`), in a thread of its own once they are done. Never waited for here: a close called on an
    event loop would hold the loop up for as long as the slowest call, and one called from the thread of
    the very call a finisher waits for would wait for ever. (Not a daemon either: the end of the process
    waits for it, as for the finishers.)"""
    key = id(store)
    me = threading.current_thread()
    with _FINISHERS_LOCK:
        if key in _CLOSING:
            return  # a close is waiting for them already: it closes the store
        finishing = any(t.is_alive() and t is not me for t in _FINISHERS.get(key, ()))
        if not finishing and key not in _DRIVING:  # (a drive counted after this look finds the store closed)
            _FINISHERS.pop(key, None)
            pending = False
        else:
            pending = True

            def when_done() -> None:
                handover = time.monotonic() + HANDOVER_S
                try:
                    _wait_for_drives(key, handover)  # the drives this close stops free their leases
                    while True:
                        with _FINISHERS_LOCK:
                            now = time.monotonic()
                            if any(isinstance(t, Finishing) and t.calling() for t in _FINISHERS.get(key, ())):
                                # A synchronous call still runs: its lease must stay renewable until it
                                # returns, and its drive needs a moment after that to hand it on.
                                handover = max(handover, now + HANDOVER_S)
                            past = now >= handover
                            alive = [
                                t
                                for t in _FINISHERS.get(key, ())
                                if t.is_alive() and t is not me and not (past and isinstance(t, Finishing))
                            ]
                            if not alive:
                                _FINISHERS.pop(key, None)
                                break
                        for waited in alive:
                            if isinstance(waited, Finishing):
                                # (woken to look again while a call runs: its return extends the handover)
                                waited.join(min(_CALL_LOOK_S, max(0.0, handover - time.monotonic())))
                            else:
                                waited.join()
                    close()
                finally:
                    with _FINISHERS_LOCK:
                        _CLOSING.pop(key, None)

            _CLOSING[key] = threading.Thread(target=when_done, name="bide-store-close")
            try:
                _CLOSING[key].start()
            except RuntimeError:  # the interpreter is shutting down, and starts no thread: close now
                del _CLOSING[key]
                pending = False
    if not pending:
        close()


def _forget_parents_finishers() -> None:
    # In a child just forked: the finishers, drives and deferred closes registered are the parent's threads
    # and calls, which the child does not have (its close waited HANDOVER_S for them, or was skipped as under
    # way already), and the lock may have been held by another thread of the parent (the child hung on it).
    global _FINISHERS_LOCK, _DRIVES_LET_GO
    _FINISHERS_LOCK = threading.Lock()
    _FINISHERS.clear()
    _CLOSING.clear()
    _DRIVES_LET_GO = threading.Condition(threading.Lock())
    _DRIVING.clear()


os.register_at_fork(after_in_child=_forget_parents_finishers)


def decide_lease(
    run_id: str, current: Lease | None, holder: str, now_ms: int, ttl_ms: int, token: int
) -> Lease:
    """The lease rule S9, shared by every store: `current` is the stored lease (None: never granted).
    Returns the lease to store and answer (`held` True), or the stored one (`held` False): another
    holder's live lease, or a renewal (`token` given) of a token that is no longer current. A renewal
    never takes a lease again once it was taken over or freed: that holder's drive has lost it (its
    writes are refused), and a fresh grant to it would only keep the run from every other driver."""
    if current is not None and token and current.holder == holder and current.token == token:
        return Lease(run_id, holder, token, now_ms + ttl_ms, True)  # a renewal
    if current is None or (not token and current.expires_ms <= now_ms):
        top = current.token if current is not None else 0
        return Lease(run_id, holder, top + 1, now_ms + ttl_ms, True)  # granted, with a new token
    return Lease(run_id, current.holder, current.token, current.expires_ms, False)


def taking_lease(now: float, ttl: float, clock_skew: float) -> tuple[int, int]:
    """The `now_ms` and `ttl_ms` to ask a store for a fresh lease with (token 0) at `now` on the caller's
    clock: a lease for `ttl` seconds from `now`, granted over another holder's only once that one's expiry
    is `clock_skew` seconds past on this clock. Expiries are written on their holder's clock: a holder
    whose clock is behind this one by up to `clock_skew` is still live on its own clock until then (taken
    at its bare expiry, it lost its lease within a renewal period, and a synchronous call it keeps the lease
    for while it overruns was then decided by another driver and fired again)."""
    margin = int(clock_skew * 1000)
    return int(now * 1000) - margin, int(ttl * 1000) + margin


# An announcement takes only a lease that was freed (or never granted), never a held one, live or expired:
# an expired holder may be a driver that is only paused, and a new token would fence it out of its own run,
# turning a side effect it saw complete into one nobody knows the outcome of (a worker takes an expired lease
# over anyway). So it asks "at time 0", when no held lease has expired yet, for 5 s from then: a lease left by
# an announcer that died between its two calls has expired already, on every clock.
_ANNOUNCE_NOW_MS, _ANNOUNCE_TTL_MS = 0, 5000


def announce(store: Store, run_id: str) -> None:
    """Take the run's lease and free it at once, so that its token changes: a worker lists runs by their
    lease and reads a run it left waiting (parked for a person, asleep, at a gate) again as soon as its token
    changes, instead of at its next recheck. A run whose lease is held, live or expired, is left alone (its
    driver sees the news itself, or a worker takes the expired lease over); a store that fails here only
    delays the worker (the news is journaled already)."""
    holder = new_claim()
    try:
        lease = store.lease(run_id, holder, now_ms=_ANNOUNCE_NOW_MS, ttl_ms=_ANNOUNCE_TTL_MS)
        if lease.held:
            store.release(run_id, holder, lease.token)
    except StoreError:
        pass


async def aannounce(store: Store, run_id: str) -> None:
    """Async `announce`."""
    holder = new_claim()
    try:
        lease = await store.alease(run_id, holder, now_ms=_ANNOUNCE_NOW_MS, ttl_ms=_ANNOUNCE_TTL_MS)
        if lease.held:
            await store.arelease(run_id, holder, lease.token)
    except StoreError:
        pass


def refuse_fence(run_id: str, current: Lease | None, fence: Fence) -> None:
    """Raise `LeaseLost` unless `current` is the lease `fence` names (S10)."""
    if current is None or (current.holder, current.token) != fence:
        now = "no lease" if current is None else f"token {current.token}"
        raise LeaseLost(
            f"run {run_id!r}: write refused, the writer's lease (token {fence[1]}) was taken over ({now} "
            "now); another driver is driving the run. Load it again to see where it stands"
        )


def refuse_ended(run_id: str) -> None:
    """Raise `RunEnded` (S8)."""
    raise RunEnded(
        f"run {run_id!r} has ended (it has its {END_KEY!r} record): nothing more is appended to it"
    )


def _seq(e: Entry) -> int:
    return e.seq


class BlockingStore:
    """Base for stores whose every operation is fast and in-process: the async forms call the blocking
    ones directly (no thread hop), so subclasses write only `insert_many`, `get`, `load`, `runs`."""

    def insert_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, bytes]],
        *,
        exclusive: bool = False,
        fence: Fence | None = None,
    ) -> list[Entry]:
        raise NotImplementedError

    def get(self, run_id: str, key: str) -> Entry | None:
        raise NotImplementedError

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        raise NotImplementedError

    def lease(self, run_id: str, holder: str, *, now_ms: int, ttl_ms: int, token: int = 0) -> Lease:
        raise NotImplementedError

    def release(self, run_id: str, holder: str, token: int) -> bool:
        raise NotImplementedError

    def expired_leases(self, *, now_ms: int, after: str = "", limit: int = 500) -> list[Lease]:
        raise NotImplementedError

    async def ainsert_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, bytes]],
        *,
        exclusive: bool = False,
        fence: Fence | None = None,
    ) -> list[Entry]:
        return self.insert_many(run_id, items, exclusive=exclusive, fence=fence)

    async def alease(
        self, run_id: str, holder: str, *, now_ms: int, ttl_ms: int, token: int = 0
    ) -> Lease:
        return self.lease(run_id, holder, now_ms=now_ms, ttl_ms=ttl_ms, token=token)

    async def arelease(self, run_id: str, holder: str, token: int) -> bool:
        return self.release(run_id, holder, token)

    async def aget(self, run_id: str, key: str) -> Entry | None:
        return self.get(run_id, key)

    async def aload(self, run_id: str, after: int = 0) -> list[Entry]:
        return self.load(run_id, after)

    def close(self) -> None:
        return None
