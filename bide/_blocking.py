"""The blocking twins of bide's async calls (`run_sync`, `send_sync`, `resolve_halt`, `cancel_run`).

A twin runs its coroutine to the end with `asyncio.run`, which cannot run inside an event loop (an async
function, a Jupyter cell). Asked there, a twin refuses with a `ConfigError` naming the async call to await
instead, before the coroutine is made: no "coroutine was never awaited" warning follows the error.

A twin returns once the synchronous tools its drive started have returned (asyncio.run waits for their
threads) and their outcomes are journaled (a call that ran past its deadline is recorded by a keeper
thread): the caller may close the store or exit right after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ._errors import ConfigError
from ._lease import join_keepers

__all__ = ["run_blocking"]

T = TypeVar("T")


def run_blocking(make: Callable[[], Coroutine[Any, Any, T]], name: str, instead: str) -> T:
    """`asyncio.run(make())`, or `ConfigError` inside a running event loop (`name` is the blocking call,
    `instead` what to await there)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop runs in this thread
        pass
    else:
        raise ConfigError(
            f"{name} cannot run inside an event loop (an async function, Jupyter); use {instead} there"
        )
    # Outside the `except`: an error of the run would carry "RuntimeError: no running event loop" as its
    # context, printed above its own traceback. The coroutine is made only now.
    try:
        return asyncio.run(make())
    finally:
        join_keepers()
