"""A drive's hold on its run's lease: renewed while it drives, freed when it stops.

Renewals of every drive of one event loop share one timer (like tool deadlines, see bide/_deadline.py): a
drive costs a heap entry, not a timer of its own, and most drives finish long before their first renewal
(every third of the lease's ttl).

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

__all__ = ["LeaseKeeper", "Overrun", "keep_overrun"]


class LeaseKeeper:
    """Holds `lease` for one drive: renews it every `ttl / 3` seconds until `stop`."""

    __slots__ = ("clock", "ended", "lease", "renewals", "store", "token", "ttl")

    def __init__(self, store: Store, lease: Lease, ttl: float, clock: Callable[[], float]) -> None:
        self.store = store
        self.lease = lease
        self.ttl = ttl
        self.clock = clock
        self.ended = False  # the run ended: nothing can be written to it, no need to free the lease
        self.renewals = _renewals(asyncio.get_running_loop())
        self.token = self.renewals.add(self, ttl / 3)

    async def renew(self) -> None:
        lease = self.lease
        try:
            now_ms = int(self.clock() * 1000)
            renewed = await self.store.alease(
                lease.run_id, lease.holder, now_ms=now_ms, ttl_ms=int(self.ttl * 1000), token=lease.token
            )
        except Exception:
            renewed = None  # the store hiccuped: try again sooner; the lease has two thirds left
        if self.token < 0 or (renewed is not None and not renewed.held):
            return  # stopped meanwhile, or taken over: every further write of the drive is refused
        self.token = self.renewals.add(self, self.ttl / (3 if renewed is not None else 9))

    def stop(self, overrun: Sequence[Overrun] | None = None) -> Awaitable[Any] | None:
        """Stop renewing; free the lease (the awaitable returned), unless the run ended or synchronous
        calls of the drive run on past their deadline (`overrun`: then a thread keeps the lease until they
        return)."""
        self.renewals.drop(self.token)
        self.token = -1
        if self.ended:
            return None
        lease = self.lease
        if overrun:
            threading.Thread(
                target=keep_overrun,
                args=(self.store, lease, self.ttl, self.clock, list(overrun)),
                name=f"bide-overrun:{lease.run_id}",
                daemon=True,
            ).start()
            return None
        return _release(self.store, lease)


async def _release(store: Store, lease: Lease) -> None:
    with contextlib.suppress(Exception):  # a lease not freed only expires
        await store.arelease(lease.run_id, lease.holder, lease.token)


Overrun = tuple[CallWindow, Callable[[bool, Any], Record | None]]
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
    """The renewals due in one event loop, and one timer for the earliest of them. Heap entries are
    (when, token) tuples of atomic values (untracked by the garbage collector); stopped keepers leave
    their entries behind until they reach the top or the heap is rebuilt."""

    _SLACK = 128

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int]] = []
        self.keepers: dict[int, LeaseKeeper] = {}
        self.tokens = itertools.count()
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.renewing: set[asyncio.Future[None]] = set()

    def add(self, keeper: LeaseKeeper, delay: float) -> int:
        token = next(self.tokens)
        self.keepers[token] = keeper
        heap = self.heap
        if len(heap) > 2 * len(self.keepers) + self._SLACK:
            heap[:] = [item for item in heap if item[1] in self.keepers]
            heapq.heapify(heap)
        when = self.loop.time() + delay
        heapq.heappush(heap, (when, token))
        if when < self.timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = when
            self.timer = self.loop.call_at(when, self._fire)
        return token

    def drop(self, token: int) -> None:
        self.keepers.pop(token, None)

    def _fire(self) -> None:
        self.timer, self.timer_at = None, math.inf
        heap, keepers = self.heap, self.keepers
        now = self.loop.time()
        while heap and (heap[0][0] <= now or heap[0][1] not in keepers):
            _, token = heapq.heappop(heap)
            keeper = keepers.pop(token, None)
            if keeper is not None:
                # The loop keeps only weak references to tasks: hold each renewal until it is done.
                task = asyncio.ensure_future(keeper.renew())
                self.renewing.add(task)
                task.add_done_callback(self.renewing.discard)
        if heap:
            self.timer_at = heap[0][0]
            self.timer = self.loop.call_at(self.timer_at, self._fire)


_LOCAL = threading.local()


def _renewals(loop: asyncio.AbstractEventLoop) -> _Renewals:
    current: _Renewals | None = getattr(_LOCAL, "renewals", None)
    if current is None or current.loop is not loop:
        current = _LOCAL.renewals = _Renewals(loop)
    return current
