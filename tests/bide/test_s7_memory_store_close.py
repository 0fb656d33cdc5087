"""`close()` of a memory store did nothing: writes, reads and leases went on working after it, unlike the
SQLite and PostgreSQL stores, so a program tested on `memory://` could use a store after closing it and
only fail in production. A closed memory store now refuses every request as they do: `StoreError`
(`lasting`), saying it is closed and that nothing was written."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import bide
from bide.testing import ScriptedModel, call, reply


async def _awaited(request: Callable[[], Awaitable[Any]]) -> Any:
    return await request()  # made in the loop: a SQL store's async requests need one running


REQUESTS: dict[str, Callable[[bide.Store], Any]] = {
    "insert": lambda s: s.insert_many("r", [("b", b"2")]),
    "get": lambda s: s.get("r", "a"),
    "load": lambda s: s.load("r"),
    "runs": lambda s: s.runs(),
    "lease": lambda s: s.lease("r", "me", now_ms=0, ttl_ms=1000),
    "release": lambda s: s.release("r", "me", 1),
    "expired_leases": lambda s: s.expired_leases(now_ms=0),
    "ainsert": lambda s: asyncio.run(_awaited(lambda: s.ainsert_many("r", [("b", b"2")]))),
    "aload": lambda s: asyncio.run(_awaited(lambda: s.aload("r"))),
}


@pytest.fixture(params=["memory", "sqlite"])
def closed_store(request: pytest.FixtureRequest, tmp_path: Path) -> bide.Store:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    store.insert_many("r", [("a", b"1")])
    store.close()
    return store


@pytest.mark.parametrize("request_name", sorted(REQUESTS))
def test_a_closed_store_refuses_every_request_saying_so(closed_store: bide.Store, request_name: str) -> None:
    with pytest.raises(bide.StoreError) as refused:
        REQUESTS[request_name](closed_store)
    assert refused.value.lasting
    message = str(refused.value)
    assert "is closed (its close() was called)" in message and "nothing was written" in message
    assert "Open the store again (bide.open_store)" in message


def test_a_closed_memory_store_is_closed_for_good_and_close_is_idempotent() -> None:
    store = bide.MemoryStore()
    store.close()
    store.close()
    with pytest.raises(bide.StoreError, match="insert on run 'r' was refused"):
        store.insert_many("r", [("a", b"1")])


def test_a_drive_on_a_closed_memory_store_fails_without_calling_anything() -> None:
    calls: list[int] = []

    @bide.tool
    def charge(amount: int) -> str:
        """Charge (a side effect)."""
        calls.append(amount)
        return "charged"

    store = bide.MemoryStore()
    agent = bide.Agent(ScriptedModel([call("charge", amount=5), reply("done")]), store=store, tools=[charge])
    store.close()
    with pytest.raises(bide.StoreError, match="is closed"):
        agent.run_sync("r", "charge 5")
    assert calls == []
