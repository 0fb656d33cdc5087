"""Tool-call deadlines: one timer per event loop for every running call.

`asyncio.timeout` schedules one timer per use, and a cancelled timer stays in the loop's queue until it would
have fired or a clean-up pass removes it: with thousands of tool calls a second, most of that work is for
timers that never fire. Here every call of one event loop shares a heap of deadlines and a single timer set
for the earliest one. The behaviour is `asyncio.timeout`'s:

- When a call's deadline passes, its task is cancelled.
- The `CancelledError` that results comes out of `run_with_deadline` as `TimeoutError`, and the task's
  cancellation count is restored (`Task.uncancel`), unless someone else cancelled the task as well: then
  the `CancelledError` propagates.
- A call that swallows the cancellation and returns (or raises something else) has its result (or error)
  passed through.

The cancellation carries `DEADLINE_PASSED` as its message, so a tool can tell its own deadline from its
caller's cancellation (`ended_by_deadline`): a tool whose work goes on in a thread reports the first as
an outcome in doubt, and lets the second through.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["DEADLINE_PASSED", "ended_by_deadline", "run_with_deadline"]

T = TypeVar("T")

DEADLINE_PASSED = "bide: the tool call's deadline passed"


def ended_by_deadline(exc: BaseException) -> bool:
    """Whether `exc`, caught inside a tool, is the cancellation its own deadline sent (not its caller's)."""
    return isinstance(exc, asyncio.CancelledError) and exc.args[:1] == (DEADLINE_PASSED,)


class _Deadlines:
    """The deadlines of one event loop's running calls, and the one timer for the earliest of them."""

    # Tokens of finished calls stay in the heap until they reach its top or the heap is rebuilt; rebuild
    # when they outnumber the running calls by this much (amortized O(1) per call).
    _SLACK = 128

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int]] = []
        self.running: dict[int, asyncio.Task[Any]] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.tokens = itertools.count()
        # The timer runs in an empty context: it keeps no caller's context variables alive.
        self.context = contextvars.Context()

    def add(self, task: asyncio.Task[Any], when: float) -> int:
        token = next(self.tokens)
        self.running[token] = task
        heap = self.heap
        if len(heap) > 2 * len(self.running) + self._SLACK:
            heap[:] = [item for item in heap if item[1] in self.running]
            heapq.heapify(heap)
        heapq.heappush(heap, (when, token))
        if when < self.timer_at:
            self._arm(when)
        return token

    def finish(self, token: int) -> bool:
        """Forget a call; True when its deadline had passed (its task was cancelled by us)."""
        # Only the timer removes a running call's token, and only after cancelling its task.
        return self.running.pop(token, None) is None

    def _arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = when
        self.timer = self.loop.call_at(when, self._fire, context=self.context)

    def _fire(self) -> None:
        self.timer, self.timer_at = None, math.inf
        heap, running = self.heap, self.running
        now = self.loop.time() + _RESOLUTION  # asyncio runs a timer this early too
        while heap and (heap[0][0] <= now or heap[0][1] not in running):
            _, token = heapq.heappop(heap)
            task = running.pop(token, None)
            if task is not None:
                task.cancel(DEADLINE_PASSED)
        if heap:
            self._arm(heap[0][0])


_RESOLUTION = time.get_clock_info("monotonic").resolution
_LOCAL = threading.local()


def _deadlines(loop: asyncio.AbstractEventLoop) -> _Deadlines:
    # One thread runs one event loop at a time: remember the last one's deadlines (a finished loop's are
    # dropped when the thread runs its next loop).
    current: _Deadlines | None = getattr(_LOCAL, "deadlines", None)
    if current is None or current.loop is not loop:
        current = _LOCAL.deadlines = _Deadlines(loop)
    return current


async def run_with_deadline(awaitable: Awaitable[T], timeout: float | Callable[[], float]) -> T:
    """`await awaitable` in the current task, cancelled after `timeout` seconds with `asyncio.timeout`'s
    semantics (see the module docstring): TimeoutError when the deadline cancelled it. `timeout` may be a
    function answering the seconds left on another clock: it is read as the deadline is set, so time lost
    before (a paused process) is not given back."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("run_with_deadline must be awaited inside a task")
    loop = task.get_loop()
    deadlines = _deadlines(loop)
    cancelling = task.cancelling()
    # The loop's clock first: a pause between the two reads only sets the deadline earlier.
    now = loop.time()
    token = deadlines.add(task, now + (timeout() if callable(timeout) else timeout))
    try:
        value = await awaitable
    except BaseException as exc:
        if deadlines.finish(token):
            cancelled_by_us_only = task.uncancel() <= cancelling
            if cancelled_by_us_only and isinstance(exc, asyncio.CancelledError):
                raise TimeoutError from exc
        raise
    if deadlines.finish(token):
        task.uncancel()
    return value
