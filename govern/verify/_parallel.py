"""Run independent numpy-heavy tasks on all cores (numpy releases the GIL in its array loops).

Used for per-event and per-invariant table work on large state spaces. Results come back in task
order and the first failing task, in that order, is the one whose error is raised, so errors are as
deterministic as in a serial run. Rules written as Python callables are always run serially.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["PARALLEL_MIN_STATES", "run_all"]

T = TypeVar("T")

#: Below this many states, thread hand-off costs more than it saves.
PARALLEL_MIN_STATES = 1 << 16

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _forget_pool_in_child() -> None:
    # A forked child inherits the pool object but not its threads; work submitted to it would
    # never run. Start a fresh pool on first use instead.
    global _pool, _lock
    _pool = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def _workers() -> int:
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return max(1, min(8, os.cpu_count() or 1))


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="govern")
        return _pool


def run_all(tasks: Sequence[Callable[[], T]], *, parallel: bool) -> list[T]:
    """Run `tasks` (on the pool when `parallel` and more than one core) and return their results
    in order; the first task (in order) that raised has its exception re-raised."""
    if not parallel or len(tasks) < 2 or _workers() < 2:
        return [t() for t in tasks]
    futures = [_get_pool().submit(t) for t in tasks]
    return [f.result() for f in futures]
