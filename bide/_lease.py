"""A drive's hold on its run's lease: renewed while it drives, freed when it stops.

Renewals of every drive of one event loop share one registry and one timer (like tool deadlines, see
bide/_deadline.py): a drive costs two dict entries, a tuple of atomic values (which the garbage collector
stops tracking) and a float, not objects of its own, so thousands of live runs add nothing to collections.
Most drives finish long before their first renewal (every third of the lease's ttl): a hold and its let
go touch no heap, and the timer only when none is armed.

A synchronous tool that runs on past its deadline cannot be stopped. Its drive ends (the run halts), but
the lease must not be freed while the call may still act. `record_when_done` journals the call's outcome
from a thread as soon as it returns, under the drive's lease, also while the drive still runs (its other
calls of the turn, which run in parallel): a result is journaled as soon as its call returns, so a crash
after that finds it. Once the drive has ended, `keep_overrun` renews the lease from a thread until every
such call of the drive is recorded, and only then frees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ._canonical import canonical_json
from ._inflight import CallWindow, forget_returned, remember_returned
from ._journal import Journal
from ._records import Record, ToolResult
from ._store import Fence, Lease, Store, driving, finish_before_close
from ._telemetry import LOGGER

__all__ = [
    "Overrun",
    "free_lease",
    "free_unfreed",
    "hold_lease",
    "join_keepers",
    "keep_overrun",
    "let_go",
    "record_when_done",
]


class Overrun:
    """A synchronous call of a drive running on past its deadline: the thread that journals its outcome
    when it returns (`recorded`: it did, or the outcome was unknown and there was nothing to journal)."""

    __slots__ = ("recorded", "writer")

    def __init__(self, writer: threading.Thread) -> None:
        self.writer = writer
        self.recorded = False


def record_when_done(
    store: Store,
    run_id: str,
    fence: Fence | None,
    window: CallWindow,
    build: Callable[[bool, Any], Record | None],
) -> Overrun:
    """Journal the outcome of the call of `window` as soon as it returns (`build` makes its record from what
    it returned or raised; None: the outcome stays unknown), from a thread, under the drive's `fence`. A
    refused or failed write leaves the call halted for a decision (and `recorded` False)."""
    assert window.done is not None  # a call running in a worker thread

    def record() -> None:
        assert window.done is not None
        window.done.wait()
        assert window.outcome is not None
        made = None
        try:
            made = build(*window.outcome)
            if made is not None:
                journal = Journal(store, run_id)
                journal.fence = fence
                journal.write([made])
        except Exception as exc:  # a store failure, or another driver holds the run now (writes are fenced)
            if made is not None:
                # Kept, as a drive keeps a result it could not journal: the next drive here journals it.
                remember_returned(window.claim, made)
                LOGGER.warning(
                    "run %s: %s, but its result could not be journaled (%s); this process keeps it until a "
                    "drive of the run journals it. If this process ends first, the run halts on the call "
                    "with OutcomeUnknown: resolve it with that outcome (bide resolve, or bide.resolve_halt)",
                    run_id,
                    _what_returned(made),
                    exc,
                )
            return
        if made is not None:
            forget_returned(window.claim)
        overrun.recorded = True

    # Not a daemon: a process that ends normally waits for it, so the outcome is journaled.
    overrun = Overrun(threading.Thread(target=record, name=f"bide-overrun-result:{run_id}"))
    overrun.writer.start()
    return overrun


def _what_returned(made: Record) -> str:
    """What a call that ran past its deadline returned, for a log line: its result's JSON, cut at 500
    characters (the result record itself when it is not a tool's result)."""
    if not isinstance(made, ToolResult):
        return f"a call that ran past its deadline ended with {type(made).__name__} {made.key!r}"
    text = canonical_json(made.result).decode()
    shown = text if len(text) <= _SHOWN_MAX else text[:_SHOWN_MAX] + f"... ({len(text)} characters)"
    what = "an error " if made.is_error else ""
    return f"call {made.call_id!r} ({made.tool}), which ran past its deadline, returned {what}{shown}"


_SHOWN_MAX = 500


def hold_lease(store: Store, lease: Lease, ttl: float, clock: Callable[[], float]) -> int:
    """Renew `lease` (held by the caller) every `ttl / 3` seconds from now on, in the running event loop,
    until `let_go` with the number returned. A close of `store` meanwhile waits for the let go (briefly:
    see `Store.close`), so that the drive it stops frees the lease."""
    loop = asyncio.get_running_loop()
    renewals: _Renewals | None = getattr(_LOCAL, "renewals", None)
    if renewals is None or renewals.loop is not loop:
        renewals = _LOCAL.renewals = _Renewals(loop)
    group = renewals.last
    if group is None or group.store_id != id(store) or group.ttl != ttl or group.clock_id != id(clock):
        group = renewals.join(store, ttl, clock)
    group.store, group.clock = store, clock  # an idle group holds neither
    group.users += 1
    number = next(_NUMBERS)
    renewals.held[number] = (group.gid, lease.run_id, lease.holder, lease.token)
    driving(store, 1)
    when = group.due[number] = renewals.time() + group.period
    if when < renewals.timer_at:
        renewals.arm(when)
    return number


def let_go(held: int, *, ended: bool, overrun: Sequence[Overrun] | None = None) -> Awaitable[Any] | None:
    """Stop renewing the lease `held` (from `hold_lease`, in this event loop) and free it (the awaitable
    returned), unless the run `ended` (nothing can be written to it any more) or synchronous calls of the
    drive run on past their deadline (`overrun`: then a thread keeps the lease until they return)."""
    renewals: _Renewals | None = getattr(_LOCAL, "renewals", None)
    # Numbers are unique in the process: another loop's registry (this thread ran another loop since,
    # which cannot happen while a drive of this one is live) holds no entry under ours.
    entry = None if renewals is None else renewals.held.pop(held, None)
    if entry is None or renewals is None:
        return None
    gid, run_id, holder, token = entry
    group = renewals.groups[gid]
    store, clock = group.store, group.clock
    group.due.pop(held, None)  # not there while it is being renewed or waits for a retry
    group.users -= 1
    if not group.users:  # an idle group keeps neither its store nor its clock (see _Group)
        group.store = group.clock = None
        if group is not renewals.last:
            renewals.drop(group)
    assert store is not None and clock is not None  # held by the group while it had a lease
    if ended:
        driving(store, -1)
        return None
    ttl = group.ttl
    lease = Lease(run_id, holder, token, 0)
    if overrun:
        # The close of the store waits for the keeper (a finisher) instead of this drive.
        driving(store, -1)
        # Not a daemon: a process that ends normally waits for it, so the outcome is journaled.
        keeper = threading.Thread(
            target=keep_overrun,
            args=(store, lease, ttl, clock, list(overrun)),
            name=f"bide-overrun:{run_id}",
        )
        keeper.start()
        finish_before_close(store, keeper, *(o.writer for o in overrun))
        kept = getattr(_LOCAL, "keepers", None)
        if kept is None:
            kept = _LOCAL.keepers = []
        kept[:] = [k for k in kept if k.is_alive()]
        kept.append(keeper)
        return None
    return _free_and_let_close(store, lease)


async def _free_and_let_close(store: Store, lease: Lease) -> None:
    """`free_lease`, then let a close of `store` waiting for this drive go on."""
    try:
        await free_lease(store, lease)
    finally:
        driving(store, -1)


def join_keepers() -> None:
    """Wait until every overrun keeper started from this thread has journaled its calls' outcomes (the
    calls have returned: a blocking drive waits for its tool threads), so a caller that then closes its
    store or exits loses none of them."""
    kept: list[threading.Thread] = getattr(_LOCAL, "keepers", None) or []
    while kept:
        kept.pop().join()


# The leases of drives that ended in this process while their store failed, so that freeing them failed
# too, by run. Another process has to wait for such a lease to expire; a drive of the same run in this
# process, which knows their drive is over, frees it first (`free_unfreed`), through whichever store object
# it uses, however its URL is spelled. A release names the lease's holder and token, so it frees nothing
# on another database holding the same run id, or once another driver took the run over: such a lease is
# kept for a few later drives (one on its own database, say). Without that, "run the run
# again here once the store answers" (a result this process keeps) met RunInFlight, named "another driver",
# for up to lease_ttl.
_UNFREED: dict[str, list[tuple[int, Lease]]] = {}  # per run: (releases tried that freed nothing, lease)
_UNFREED_TRIES = 3  # then forgotten: taken over, or on a database this process no longer drives it on


async def free_lease(store: Store, lease: Lease) -> None:
    """Free `lease` (its run, holder and token) if it is still held so; a store that fails leaves it to
    expire, or to the next drive of the run in this process (`free_unfreed`)."""
    try:
        await store.arelease(lease.run_id, lease.holder, lease.token)
    except Exception:  # a lease not freed only expires
        _UNFREED.setdefault(lease.run_id, []).append((0, lease))


async def free_unfreed(store: Store, run_id: str) -> None:
    """Free the leases earlier drives of `run_id` in this process left held because their store failed as
    they ended (a no-op where that holder and token do not hold the run on `store`)."""
    if run_id not in _UNFREED:  # the common case: one dict lookup a drive
        return
    left = []
    for tries, lease in _UNFREED.pop(run_id, []):
        try:
            freed = await store.arelease(lease.run_id, lease.holder, lease.token)
        except Exception:
            freed = False
        if not freed and tries + 1 < _UNFREED_TRIES:
            left.append((tries + 1, lease))
    if left:
        _UNFREED.setdefault(run_id, []).extend(left)


def keep_overrun(
    store: Store, lease: Lease, ttl: float, clock: Callable[[], float], overruns: list[Overrun]
) -> None:
    """Hold the run's lease while synchronous calls run on past their deadline, until each one's outcome is
    journaled (`record_when_done`), then free the lease."""
    run_id, holder, token, ttl_ms = lease.run_id, lease.holder, lease.token, int(ttl * 1000)
    renew_at = time.monotonic() + ttl / 3
    for overrun in overruns:
        while True:
            overrun.writer.join(max(0.0, renew_at - time.monotonic()))
            if not overrun.writer.is_alive():
                break
            try:
                renewed = store.lease(run_id, holder, now_ms=int(clock() * 1000), ttl_ms=ttl_ms, token=token)
            except Exception:
                # A dropped connection or a restarting server: try again soon, as the drive's renewer does.
                # Giving up would let the lease lapse while the call still runs, and another driver's
                # reconciler could then decide it never happened and call it again.
                renew_at = time.monotonic() + ttl / 9
                continue
            if not renewed.held:
                return  # another driver holds the run now: its writes are fenced off from ours
            renew_at = time.monotonic() + ttl / 3
    if not all(overrun.recorded for overrun in overruns):
        return  # the store failed: the lease expires and the call stays halted for a decision
    with contextlib.suppress(Exception):  # a lease not freed only expires
        store.release(lease.run_id, lease.holder, lease.token)


class _Group:
    """The leases held of one (store, ttl, clock) in one event loop, and when each one's renewal is due.

    A group is named by the ids of its store and clock, and holds them only while a lease of it is held:
    the last group used stays, idle, for the next hold (most drives of a loop share one), without keeping
    its store alive.

    Every lease waits `period` from its hold or its last renewal, in loop time, which never goes back: in
    the order they were put in `due`, renewals are due in order too, so a hold or a let go is a dict
    insertion or deletion (no heap), and the earliest due is the first entry."""

    __slots__ = ("clock", "clock_id", "due", "gid", "period", "store", "store_id", "ttl", "users")

    def __init__(self, gid: int, store: Store, ttl: float, clock: Callable[[], float]) -> None:
        self.gid = gid
        self.store: Store | None = store
        self.store_id = id(store)
        self.ttl = ttl
        self.clock: Callable[[], float] | None = clock
        self.clock_id = id(clock)
        self.period = ttl / 3
        self.users = 0  # leases held
        self.due: dict[int, float] = {}  # number of a held lease -> loop time its renewal is due

    def rename(self, store: Store, ttl: float, clock: Callable[[], float]) -> None:
        """Make this idle group (no lease held, so nothing due) the group of (store, ttl, clock)."""
        self.store, self.store_id = store, id(store)
        self.clock, self.clock_id = clock, id(clock)
        self.ttl, self.period = ttl, ttl / 3


class _Renewals:
    """The leases held by drives of one event loop, the renewals due, and one timer for the earliest.

    Drives of one (store, ttl, clock) share a `_Group`, named by a number in `groups`; a group holds its
    store while a lease of it is held (only the last one used stays once idle, holding no store), so a
    loop that used many stores keeps none of them once their drives are done.
    A held lease is an entry `(group, run id, holder, token)` in `held` under a number of its own, a tuple
    of atomic values untracked by the garbage collector. A renewal that failed is tried again sooner, from
    `retries` (a heap of `(when, number)`): entries of leases let go stay there until they reach the top."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # The default loop's time is the monotonic clock: read it without a call of Python code per hold.
        self.time = time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time
        self.held: dict[int, tuple[int, str, str, int]] = {}
        self.groups: dict[int, _Group] = {}
        self.group_ids: dict[tuple[int, float, int], int] = {}  # (store id, ttl, clock id) -> group
        self.last: _Group | None = None  # the group of the last hold, kept while idle (see _Group)
        self._next_group = 0
        self.retries: list[tuple[float, int]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.renewing: set[asyncio.Future[None]] = set()

    def join(self, store: Store, ttl: float, clock: Callable[[], float]) -> _Group:
        """The group of (store, ttl, clock), made if needed, now the last one used. While a group holds its
        store and clock, their ids name no other objects; an idle one holds neither (any object with the
        same ids may take it)."""
        last = self.last
        idle = last if last is not None and not last.users else None
        key = (id(store), ttl, id(clock))
        gid = self.group_ids.get(key)
        if gid is not None:
            group = self.groups[gid]
            if idle is not None and idle is not group:
                self.drop(idle)
        elif idle is not None:
            # The idle last group serves the new key: a loop whose drives each bring a store of their own
            # (a memory store per run, say) renames one group instead of dropping it and making another.
            # Nothing refers to an idle group's number: it holds no lease, and a renewal task still running
            # for one of its former leases finds that lease's number gone from `held` (numbers are never
            # reused) before it looks at the group.
            del self.group_ids[(idle.store_id, idle.ttl, idle.clock_id)]
            idle.rename(store, ttl, clock)
            self.group_ids[key] = idle.gid
            group = idle
        else:
            gid = self.group_ids[key] = self._next_group
            self._next_group += 1
            group = self.groups[gid] = _Group(gid, store, ttl, clock)
        self.last = group
        return group

    def drop(self, group: _Group) -> None:
        """Forget the idle `group`."""
        del self.groups[group.gid], self.group_ids[(group.store_id, group.ttl, group.clock_id)]

    def arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = when
        self.timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.timer, self.timer_at = None, math.inf
        now = self.time()
        first = math.inf
        for group in self.groups.values():
            due = group.due
            ready = []
            for number, when in due.items():
                if when > now:
                    first = min(first, when)
                    break
                ready.append(number)
            for number in ready:
                del due[number]
                self._start(number)
        retries, held = self.retries, self.held
        while retries and (retries[0][0] <= now or retries[0][1] not in held):
            _, number = heapq.heappop(retries)
            if number in held:
                self._start(number)
        if retries:
            first = min(first, retries[0][0])
        if first < math.inf:
            self.arm(first)

    def _start(self, number: int) -> None:
        # The loop keeps only weak references to tasks: hold each renewal until it is done.
        task = asyncio.ensure_future(self._renew(number, self.held[number]))
        self.renewing.add(task)
        task.add_done_callback(self.renewing.discard)

    async def _renew(self, number: int, entry: tuple[int, str, str, int]) -> None:
        gid, run_id, holder, token = entry
        group = self.groups.get(gid)
        if group is None or group.store is None or group.clock is None or number not in self.held:
            return  # let go between the timer and this task (its group may be idle)
        try:
            now_ms = int(group.clock() * 1000)
            renewed: Lease | None = await group.store.alease(
                run_id, holder, now_ms=now_ms, ttl_ms=int(group.ttl * 1000), token=token
            )
        except Exception:
            renewed = None  # the store hiccuped: try again sooner; the lease has two thirds left
        if number not in self.held or (renewed is not None and not renewed.held):
            return  # let go meanwhile, or taken over: every further write of the drive is refused
        if renewed is not None:
            when = group.due[number] = self.time() + group.period  # later than every entry before it
        else:
            when = self.time() + group.ttl / 9
            heapq.heappush(self.retries, (when, number))
        if when < self.timer_at:
            self.arm(when)


_LOCAL = threading.local()
_NUMBERS = itertools.count()  # the numbers of held leases, unique in the process (next() is atomic)
