"""What this process knows about its own side-effect claims, and the window a claimed call may start in.

Kept per process (not per store object): a claim id is 128 random bits, so it names one attempt in every
store at once.

- *Never started*: the attempt marker may be committed but this process did not call the tool (the marker
  write raised or was cancelled). A later drive in this process voids such a marker instead of halting;
  any other process halts on it (it cannot know). Lost on exit, which only costs a halt instead of a retry.
- *Returned*: this process called the tool and knows what it returned, but journaling its result failed
  (the store was down, locked past its timeout, or full). A later drive in this process journals that
  result instead of halting; any other process halts on the call. Lost on exit, like the above.
- *Running*: the tool is running in this process now, possibly past its deadline (a synchronous tool's
  thread cannot be stopped). Resolution of such a call is refused in this process.

`CallWindow` is the start rule: a claimed call may start only before the deadline its marker recorded,
checked at the moment it really starts (after the marker committed, and in the worker thread for a
synchronous tool), and runs with the time that is left.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ._errors import NotCalled

__all__ = [
    "CallWindow",
    "forget_claims",
    "forget_returned",
    "never_started",
    "remember_returned",
    "remember_unstarted",
    "returned",
    "running",
]

_MAX_UNSTARTED = 4096
_UNSTARTED: dict[str, None] = {}
_MAX_RETURNED = 4096
# claim -> the result record of the attempt holding it, which this process has not seen journaled
_RETURNED: dict[str, Any] = {}
_RUNNING: dict[str, CallWindow] = {}
_LOCK = threading.Lock()


def remember_unstarted(claim: str) -> None:
    """This process wrote (or tried to write) the marker holding `claim` and did not call the tool."""
    with _LOCK:
        if len(_UNSTARTED) >= _MAX_UNSTARTED:
            _UNSTARTED.pop(next(iter(_UNSTARTED)))  # forgetting one only costs a halt instead of a retry
        _UNSTARTED[claim] = None


def never_started(claim: str) -> bool:
    """True when this process knows the attempt holding `claim` never called its tool."""
    return claim in _UNSTARTED


def forget_started(claim: str) -> None:
    with _LOCK:
        _UNSTARTED.pop(claim, None)


def forget_claims() -> None:
    """Drop what this process knows of its claims, never started or returned (tests use it to simulate a
    restart)."""
    with _LOCK:
        _UNSTARTED.clear()
        _RETURNED.clear()


def remember_returned(claim: str, result: Any) -> None:
    """The attempt holding `claim` called its tool, and `result` is the record of what it returned: kept
    until `forget_returned`, once the record is journaled."""
    with _LOCK:
        if claim not in _RETURNED and len(_RETURNED) >= _MAX_RETURNED:
            _RETURNED.pop(next(iter(_RETURNED)))  # forgetting one only costs a halt instead of a record
        _RETURNED[claim] = result


def returned(claim: str) -> Any:
    """The result record of the attempt holding `claim` when this process called its tool and has not seen
    the record journaled; None otherwise."""
    return _RETURNED.get(claim)


def forget_returned(claim: str) -> None:
    with _LOCK:
        _RETURNED.pop(claim, None)


def running(claim: str) -> CallWindow | None:
    """The window of the call holding `claim` if its tool is running in this process now."""
    return _RUNNING.get(claim)


class CallWindow:
    """The window of one claimed call: it may start only before `deadline` (Unix seconds on `clock`).

    `start()` is called where the tool really starts and answers the seconds left, or raises `NotCalled`
    (the window closed, or the caller gave up on it with `abandon()` first). A call started in a worker
    thread (`threaded()` first) counts as running in this process until `finish()`, which keeps what it
    returned or raised in `outcome` and sets `done`. An async call needs none of that: it is cancelled at
    the deadline.
    """

    __slots__ = ("claim", "clock", "deadline", "done", "outcome", "state", "tool")

    def __init__(self, tool: str, claim: str, deadline: float, clock: Callable[[], float]) -> None:
        self.tool = tool
        self.claim = claim
        self.deadline = deadline
        self.clock = clock
        self.state = "waiting"  # -> "started" | "abandoned"
        self.done: threading.Event | None = None
        self.outcome: tuple[bool, Any] | None = None  # (returned normally, value or exception)

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def threaded(self) -> None:
        """The call will run in a worker thread: track it as running while it runs."""
        self.done = threading.Event()

    def start(self) -> float:
        if self.done is None:  # an async call, started in the event loop's own thread
            left = self.deadline - self.clock()
            if left <= 0:
                self.state = "abandoned"
                raise self._closed(left)
            self.state = "started"
            return left
        with _LOCK:
            if self.state == "abandoned":
                raise NotCalled(f"tool {self.tool!r} was given up on before it started")
            left = self.deadline - self.clock()
            if left <= 0:
                self.state = "abandoned"
                raise self._closed(left)
            self.state = "started"
            if self.claim:
                _RUNNING[self.claim] = self
        return left

    def _closed(self, left: float) -> NotCalled:
        return NotCalled(
            f"tool {self.tool!r} could not start inside its window: the deadline its attempt marker "
            f"recorded passed {-left:.3f} s before it could start"
        )

    def abandon(self) -> bool:
        """Make sure the call never starts if it has not yet; True when it never started."""
        with _LOCK:
            if self.state == "waiting":
                self.state = "abandoned"
            return self.state == "abandoned"

    def running(self) -> bool:
        """True while a started threaded call has not returned."""
        return self.state == "started" and self.done is not None and not self.done.is_set()

    def finish(self, returned: bool, value: Any) -> None:
        with _LOCK:
            self.outcome = (returned, value)
            _RUNNING.pop(self.claim, None)
        if self.done is not None:
            self.done.set()
