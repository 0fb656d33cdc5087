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
import os
import sys
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import PG_URL
from forked import fork, wait_all
from pg_tables import drop_prefixed_tables

import bide


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def tagged_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(url, table prefix, tag): on PostgreSQL the store's sessions carry the tag as application_name; either
    URL names this test's store alone (in warnings, in thread names)."""
    tag = f"edges-{uuid.uuid4().hex[:8]}"
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / tag}.db", prefix, tag
    else:
        yield f"{PG_URL}?application_name={tag}", prefix, tag
        drop_prefixed_tables(PG_URL, prefix)


def _sessions(tag: str) -> int:
    engine = sa.create_engine(PG_URL, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :tag")
            return int(conn.execute(query, {"tag": tag}).scalar_one())
    finally:
        engine.dispose()


def _open_files(path: str) -> int:
    names = {path, f"{path}-wal", f"{path}-shm"}
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") in names
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
    return count


def _held(url: str, tag: str) -> int:
    """What the process holds of the store at `url`: sessions (PostgreSQL) or file descriptors (SQLite)."""
    return _open_files(url.removeprefix("sqlite:///")) if url.startswith("sqlite") else _sessions(tag)


def _used(url: str, prefix: str) -> bide.Store:
    """A store used from plain code (its thread) and from an event loop."""
    store = bide.open_store(url, table_prefix=prefix)
    store.insert_many("r", [("k", b"v")])

    async def from_a_loop() -> None:
        await store.ainsert_many("a", [("k", b"v")])

    asyncio.run(from_a_loop())
    return store


def collect_until(done: Callable[[], bool]) -> None:
    """Collect garbage until `done()`: the store's thread holds the store for a moment after it answered
    the last request (it ends the batch), and the store is collected only once it let go."""
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "the store was never collected"
        gc.collect()
        time.sleep(0.01)


def _its_thread(url: str) -> threading.Thread:
    (thread,) = [t for t in threading.enumerate() if t.name == f"bide-store:{url}"]
    return thread


def test_a_dropped_store_lets_go_when_warnings_are_errors(
    tagged_url: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, prefix, tag = tagged_url
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
    tagged_url: tuple[str, str, str], tmp_path: Path
) -> None:
    url, prefix, tag = tagged_url
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


def test_a_store_used_after_its_finalizer_ran_refuses_the_request(tagged_url: tuple[str, str, str]) -> None:
    url, prefix, tag = tagged_url
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
