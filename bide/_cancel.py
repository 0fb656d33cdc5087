"""Cancelling a run: a durable request that its drive honours at the next turn boundary.

`cancel_run` journals a `run:cancel` record (any process may, without the run's lease: the request decides
nothing by itself), then takes the run's lease and frees it at once when nobody holds it, so that a worker
that left the run waiting (halted for a person, asleep, at a gate, an idle thread) reads it again at its
next poll. A drive checks for it before each model turn and before resuming a turn's calls; when
it finds one it ends the run with status "cancelled" and an answer that says so. A tool call already in
flight is not interrupted: it finishes (or halts) as it would have, and the cancel is honoured after it.
A halted run that is cancelled ends as cancelled at its next drive (a worker's or yours); the attempt
whose outcome was unknown stays in the journal, unresolved.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ._blocking import run_blocking
from ._errors import RunEnded, RunNotFound
from ._journal import Journal
from ._records import CANCEL_KEY, END_KEY, Cancel, End
from ._store import Store, aannounce

__all__ = ["acancel_run", "cancel_request", "cancel_run", "cancelled_answer"]


def cancelled_answer(request: Cancel) -> str:
    """The answer a cancelled run ends with."""
    return f"Cancelled: {request.reason}" if request.reason else "Cancelled."


def cancel_request(journal: Journal, *, reason: str = "", clock: Callable[[], float] = time.time) -> Cancel:
    """The cancel request to journal for the run `journal` has loaded. Raises `RunNotFound` for a run that
    does not exist and `RunEnded` for one that has ended."""
    if not journal.exists:
        raise RunNotFound(f"run {journal.run_id!r} does not exist in {journal.store.url}; nothing to cancel")
    end = journal.get(END_KEY)
    if isinstance(end, End):
        raise RunEnded(f"run {journal.run_id!r} has already ended ({end.status}); nothing to cancel")
    return Cancel(key=CANCEL_KEY, reason=reason, requested_at_ms=int(clock() * 1000))


async def acancel_run(
    store: Store, run_id: str, *, reason: str = "", clock: Callable[[], float] = time.time
) -> bool:
    """Async `cancel_run`."""
    journal = await Journal(store, run_id).aload()
    request = cancel_request(journal, reason=reason, clock=clock)
    stored, inserted = await journal.awrite_one(request)
    assert isinstance(stored, Cancel)
    if inserted:
        await aannounce(store, run_id)
    return inserted


def cancel_run(
    store: Store, run_id: str, *, reason: str = "", clock: Callable[[], float] = time.time
) -> bool:
    """Ask the run `run_id` to stop: journal a cancel request, honoured at its next turn boundary.

    Returns True when this call recorded the request, False when one was recorded already (the first
    reason stands). `clock` (Unix seconds) stamps the request: give the clock your agents run on. A worker
    that left the run waiting is told at once (the run's freed lease is taken and freed again); a driver
    holding the lease, even an expired one, is never fenced out by it. Raises `RunNotFound` for a run that
    does not exist and `RunEnded` for one that has ended. Refused (`ConfigError`) inside a running event
    loop: use `await acancel_run(...)` there.
    """
    cancel = lambda: acancel_run(store, run_id, reason=reason, clock=clock)  # noqa: E731
    return run_blocking(cancel, "cancel_run", "await acancel_run(...)")
