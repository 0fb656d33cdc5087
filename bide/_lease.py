"""A drive's hold on its run's lease: renewed while it drives, freed when it stops.

Renewals of every drive of one event loop share one registry and one timer (like tool deadlines, see
bide/_deadline.py): a drive costs a heap entry and a dict entry, both tuples of atomic values (which the
garbage collector stops tracking), not objects of its own, so thousands of live runs add nothing to
collections. Most drives finish long before their first renewal (every third of the lease's ttl).

A synchronous tool that runs on past its deadline cannot be stopped. Its drive ends (the run halts), but
the lease must not be freed while the call may still act: `keep_overrun` renews it from a thread until
the call returns (every such call of the drive: calls of one turn run in parallel), journals the calls'
outcomes under the lease, and only then frees it.
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

from ._inflight import CallWindow
from ._journal import Journal
from ._records import Record
from ._store import Lease, Store

__all__ = ["Overrun", "hold_lease", "keep_overrun", "let_go"]

Overrun = tuple[CallWindow, Callable[[bool, Any], Record | None]]


def hold_lease(store: Store, lease: Lease, ttl: float, clock: Callable[[], float]) -> int:
    """Renew `lease` (held by the caller) every `ttl / 3` seconds from now on, in the running event loop,
    until `let_go` with the number returned."""
    loop = asyncio.get_running_loop()
    renewals: _Renewals | None = getattr(_LOCAL, "renewals", None)
    if renewals is None or renewals.loop is not loop:
        renewals = _LOCAL.renewals = _Renewals(loop)
    gid = renewals.join(store, ttl, clock)
    number = next(_NUMBERS)
    renewals.held[number] = (gid, lease.run_id, lease.holder, lease.token)
    renewals.push(number, ttl / 3)
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
    if ended:
        renewals.leave(entry[0])
        return None
    gid, run_id, holder, token = entry
    store, ttl, clock = renewals.leave(gid)
    lease = Lease(run_id, holder, token, 0)
    if overrun:
        threading.Thread(
            target=keep_overrun,
            args=(store, lease, ttl, clock, list(overrun)),
            name=f"bide-overrun:{run_id}",
            daemon=True,
        ).start()
        return None
    return _release(store, lease)


async def _release(store: Store, lease: Lease) -> None:
    with contextlib.suppress(Exception):  # a lease not freed only expires
        await store.arelease(lease.run_id, lease.holder, lease.token)


"""A synchronous call running past its deadline, and how its outcome becomes its result record."""


def keep_overrun(
    store: Store, lease: Lease, ttl: float, clock: Callable[[], float], overruns: list[Overrun]
) -> None:
    """Hold the run's lease while synchronous calls run on past their deadline, then journal what they
    returned (each `build` makes its call's record; None: its outcome stays unknown) and free the lease."""
    try:
        renew_at = time.monotonic() + ttl / 3
        for window, _ in overruns:
            assert window.done is not None
            while not window.done.wait(max(0.0, renew_at - time.monotonic())):
                now_ms = int(clock() * 1000)
                ttl_ms = int(ttl * 1000)
                renewed = store.lease(
                    lease.run_id, lease.holder, now_ms=now_ms, ttl_ms=ttl_ms, token=lease.token
                )
                if not renewed.held:
                    return
                renew_at = time.monotonic() + ttl / 3
        records = []
        for window, build in overruns:
            assert window.outcome is not None
            record = build(*window.outcome)
            if record is not None:
                records.append(record)
        if records:
            journal = Journal(store, lease.run_id).load()
            journal.fence = (lease.holder, lease.token)
            journal.write(records)
        store.release(lease.run_id, lease.holder, lease.token)
    except Exception:  # the store failed: the lease expires and the call stays halted for a decision
        return


class _Renewals:
    """The leases held by drives of one event loop, the renewals due, and one timer for the earliest.

    Drives of one (store, ttl, clock) share a group, named by a number in `groups`; a group lives while a
    lease of it is held, so a loop that used many stores keeps none of them once their drives are done.
    A held lease is an entry `(group, run id, holder, token)` in `held` under a number of its own; heap
    entries are `(when, number)`. Both are tuples of atomic values, untracked by the garbage collector.
    Entries of leases let go stay in the heap until they reach the top or the heap is rebuilt."""

    _SLACK = 128

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int]] = []
        self.held: dict[int, tuple[int, str, str, int]] = {}
        self.groups: dict[int, tuple[Store, float, Callable[[], float]]] = {}
        self.group_ids: dict[tuple[int, float, Callable[[], float]], int] = {}
        self.users: dict[int, int] = {}  # leases held per group
        self._next_group = 0
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.renewing: set[asyncio.Future[None]] = set()

    def join(self, store: Store, ttl: float, clock: Callable[[], float]) -> int:
        """The group of (store, ttl, clock), made if needed, with one more lease held. The group keeps the
        store alive, so its id names no other store while the group lives."""
        key = (id(store), ttl, clock)
        gid = self.group_ids.get(key)
        if gid is None:
            gid = self.group_ids[key] = self._next_group
            self._next_group += 1
            self.groups[gid] = (store, ttl, clock)
            self.users[gid] = 0
        self.users[gid] += 1
        return gid

    def leave(self, gid: int) -> tuple[Store, float, Callable[[], float]]:
        """One lease of group `gid` is let go: the group's (store, ttl, clock), dropped with its last."""
        group = self.groups[gid]
        left = self.users[gid] - 1
        if left:
            self.users[gid] = left
        else:
            del self.groups[gid], self.users[gid], self.group_ids[(id(group[0]), group[1], group[2])]
        return group

    def push(self, number: int, delay: float) -> None:
        heap = self.heap
        if len(heap) > 2 * len(self.held) + self._SLACK:
            heap[:] = [item for item in heap if item[1] in self.held]
            heapq.heapify(heap)
        when = self.loop.time() + delay
        heapq.heappush(heap, (when, number))
        if when < self.timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = when
            self.timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.timer, self.timer_at = None, math.inf
        heap, held = self.heap, self.held
        now = self.loop.time()
        while heap and (heap[0][0] <= now or heap[0][1] not in held):
            _, number = heapq.heappop(heap)
            entry = held.get(number)
            if entry is not None:
                # The loop keeps only weak references to tasks: hold each renewal until it is done.
                task = asyncio.ensure_future(self._renew(number, entry))
                self.renewing.add(task)
                task.add_done_callback(self.renewing.discard)
        if heap:
            self.timer_at = heap[0][0]
            self.timer = self.loop.call_at(self.timer_at, self._fire)

    async def _renew(self, number: int, entry: tuple[int, str, str, int]) -> None:
        gid, run_id, holder, token = entry
        group = self.groups.get(gid)
        if group is None:
            return  # let go (its group with it) between the timer and this task
        store, ttl, clock = group
        try:
            now_ms = int(clock() * 1000)
            renewed: Lease | None = await store.alease(
                run_id, holder, now_ms=now_ms, ttl_ms=int(ttl * 1000), token=token
            )
        except Exception:
            renewed = None  # the store hiccuped: try again sooner; the lease has two thirds left
        if number not in self.held or (renewed is not None and not renewed.held):
            return  # let go meanwhile, or taken over: every further write of the drive is refused
        self.push(number, ttl / (3 if renewed is not None else 9))


_LOCAL = threading.local()
_NUMBERS = itertools.count()  # the numbers of held leases, unique in the process (next() is atomic)
