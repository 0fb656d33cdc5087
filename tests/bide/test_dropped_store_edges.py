"""The edges of a SQL store dropped without `close()` (see test_dropped_store_lets_go.py).

- Dropped under a filter that makes warnings errors (``python -W error``, pytest's ``filterwarnings =
  error``): its `ResourceWarning` was given first, raised, and cut short the rest of its finalizer, which
  left its thread waiting for ever and its PostgreSQL sessions open, as before stores were collected.
- Closed before a fork, then dropped in the child: the child's copy got a finalizer of its own, which
  warned that a store its parent had closed was never closed.
- Used again after its finalizer ran, by the finalizer (a ``__del__``) of an object collected with it,
  which the garbage collector runs after the store's: the request went to a thread that had stopped, and
  its caller waited for ever (here, inside the collection, which then no thread of the process ran again).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import warnings
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_URL
from forked import fork, wait_all
from held import collect_until, open_files, pg_sessions

import bide


def _held(url: str, tag: str) -> int:
    """What the process holds of the store at `url`: sessions (PostgreSQL) or file descriptors (SQLite)."""
    if url.startswith("sqlite"):
        return open_files(url.removeprefix("sqlite:///"))
    return pg_sessions(PG_URL, tag)


def _used(url: str, prefix: str) -> bide.Store:
    """A store used from plain code (its thread) and from an event loop."""
    store = bide.open_store(url, table_prefix=prefix)
    store.insert_many("r", [("k", b"v")])

    async def from_a_loop() -> None:
        await store.ainsert_many("a", [("k", b"v")])

    asyncio.run(from_a_loop())
    return store


def _its_thread(url: str) -> threading.Thread:
    (thread,) = [t for t in threading.enumerate() if t.name == f"bide-store:{url}"]
    return thread


def test_a_dropped_store_lets_go_when_warnings_are_errors(
    tagged_store_url: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, prefix, tag = tagged_store_url
    gc.collect()  # (stores other tests dropped are collected now, not below)
    raised: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: raised.append(unraisable.exc_value))
    store = _used(url, prefix)
    thread = _its_thread(url)
    assert _held(url, tag) > 0
    dropped = weakref.ref(store)
    del store
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        collect_until(lambda: dropped() is None)
    # The warning was raised (the garbage collector reports it as unraisable) ...
    assert [e for e in raised if isinstance(e, ResourceWarning) and tag in str(e)]
    # ... after the store let go of everything.
    thread.join(5)
    assert not thread.is_alive()
    assert _held(url, tag) == 0


def test_a_store_closed_before_a_fork_is_dropped_in_the_child_without_a_warning(
    tagged_store_url: tuple[str, str, str], tmp_path: Path
) -> None:
    url, prefix, tag = tagged_store_url
    store = _used(url, prefix)
    store.close()
    gc.collect()  # (nothing else is left for the child's collection)

    def child() -> None:
        nonlocal store
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            store.close()  # (closed already: nothing to do)
            del store
            gc.collect()
        mine = [w.message for w in seen if issubclass(w.category, ResourceWarning) and tag in str(w.message)]
        assert not mine, mine

    errors = tmp_path / "child-errors"
    wait_all([fork(child, errors)], [errors], timeout=60)
    del store


class _Keeper:
    """An object in a reference cycle with a store (its write hook is a method of it), whose `__del__` keeps
    the store: collected with it, it runs after the store's finalizer, and may use the store again."""

    def __init__(self, store: bide.Store, kept: list[Any]) -> None:
        self.store = store
        self.kept = kept
        store.add_write_hook(self.hook)  # type: ignore[attr-defined]

    def hook(self, txn: Any, written: Mapping[str, Sequence[bide.Entry]], /) -> None:
        pass

    def __del__(self) -> None:
        self.kept.append(self.store)


def test_a_store_used_after_its_finalizer_ran_refuses_the_request(
    tagged_store_url: tuple[str, str, str],
) -> None:
    url, prefix, tag = tagged_store_url
    gc.collect()
    kept: list[Any] = []
    _Keeper(_used(url, prefix), kept)
    thread = _its_thread(url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        collect_until(lambda: bool(kept))
    (store,) = kept
    thread.join(5)  # its finalizer stopped its thread
    assert not thread.is_alive()
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            store.insert_many("r", [("k2", b"v")])
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    writer = threading.Thread(target=write, daemon=True)  # (a hang fails the test, not the run)
    writer.start()
    writer.join(10)
    assert not writer.is_alive(), "the write waited for a store thread that had stopped"
    (refused,) = outcome
    assert isinstance(refused, bide.StoreError) and "collected" in str(refused), refused
    assert refused.lasting
    store.close()
    kept.clear()
    assert _held(url, tag) == 0
    again = bide.open_store(url, table_prefix=prefix)
    try:
        assert [e.key for e in again.load("r")] == ["k"]  # nothing was written
    finally:
        again.close()
