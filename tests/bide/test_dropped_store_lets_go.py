"""A SQL store dropped without `close()` lets go of what it holds once it is collected.

It used to be kept for the life of the process: its thread held it (waiting for requests), and its engine
held it (the connection creator and listeners were its methods, and SQLAlchemy keeps the pool of a
connection checked out, as the store's connections stay, from a registry of its own). A service that
opened a store per request and forgot to close it grew by a thread, file descriptors and PostgreSQL
sessions per request, until "too many clients". Now it is collected like any object, closes its
connections, stops its thread and says so with a `ResourceWarning`, as a file left open does.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
import weakref

import pytest
from conftest import PG_URL
from held import collect_until, open_files, pg_sessions

import bide
from bide.testing import ScriptedModel, call, reply


async def _remember(note: str) -> str:
    """Note something (a tool that changes the world)."""
    return f"noted {note}"


NOTE = bide.Tool.from_function(_remember)


def _store_threads(url: str) -> list[threading.Thread]:
    """The live threads of the stores at `url` (a URL no other test's store has)."""
    return [t for t in threading.enumerate() if t.name == f"bide-store:{url}"]


def _used_and_dropped(url: str, prefix: str) -> weakref.ref[bide.Store]:
    """Open a store, run an agent with a tool on it, synchronously and asynchronously, read a journal from
    plain code (so that both the store's thread and an event loop's connection are in use), and drop the
    store unclosed."""
    store = bide.open_store(url, table_prefix=prefix)
    model = ScriptedModel([call("_remember", note="a"), reply("done")] * 2)
    agent = bide.Agent(model, store=store, tools=[NOTE])
    assert agent.run_sync("sync-run", "go").answer == "done"
    assert asyncio.run(agent.run("async-run", "go")).answer == "done"
    assert bide.Journal(store, "sync-run").load().records()  # a blocking read: the store's thread
    return weakref.ref(store)


def test_a_store_dropped_without_close_is_collected_and_lets_go_of_its_connections(
    tagged_store_url: tuple[str, str, str],
) -> None:
    url, prefix, tag = tagged_store_url
    dropped = _used_and_dropped(url, prefix)
    held = dropped()
    assert held is not None
    path = held.url.removeprefix("sqlite:///")
    if url.startswith("sqlite"):
        assert open_files(path) > 0
    else:
        assert pg_sessions(PG_URL, tag) > 0
    [thread] = _store_threads(url)
    del held

    with pytest.warns(ResourceWarning, match="was never closed") as seen:
        collect_until(lambda: dropped() is None)
    assert [w for w in seen if url in str(w.message)]

    thread.join(5)
    assert not thread.is_alive()  # its thread stopped
    if url.startswith("sqlite"):
        assert open_files(path) == 0
    else:
        assert pg_sessions(PG_URL, tag) == 0
    # Nothing was lost: the runs it journaled are there for the next store object.
    again = bide.open_store(url, table_prefix=prefix)
    try:
        for run_id in ("sync-run", "async-run"):
            records = bide.Journal(again, run_id).load().records()
            assert [r for r in records if isinstance(r, bide.ToolResult)]
    finally:
        again.close()


def test_a_closed_store_is_collected_without_a_warning(tagged_store_url: tuple[str, str, str]) -> None:
    url, prefix, tag = tagged_store_url
    dropped = _used_and_dropped(url, prefix)
    held = dropped()
    assert held is not None
    held.close()
    del held
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        collect_until(lambda: dropped() is None)
    # (Stores other tests dropped may be collected here too, with their own warning.)
    assert not [w for w in seen if issubclass(w.category, ResourceWarning) and url in str(w.message)]
    if not url.startswith("sqlite"):
        assert pg_sessions(PG_URL, tag) == 0


def test_a_store_still_referenced_keeps_working_across_collections(
    tagged_store_url: tuple[str, str, str],
) -> None:
    url, prefix, _ = tagged_store_url
    store = bide.open_store(url, table_prefix=prefix)
    try:
        agent = bide.Agent(ScriptedModel([call("_remember", note="a"), reply("done")] * 3), store=store,
                           tools=[NOTE])  # fmt: skip
        assert agent.run_sync("r1", "go").answer == "done"
        del agent
        gc.collect()
        model = ScriptedModel([call("_remember", note="b"), reply("done")])
        again = bide.Agent(model, store=store, tools=[NOTE])
        assert again.run_sync("r2", "go").answer == "done"
        assert asyncio.run(again.run("r2", "go")).answer == "done"  # read back, not run again
    finally:
        store.close()
