"""A drive whose lease was granted and whose journal load then failed (a statement timeout, a lock held too
long) or was cancelled frees the lease at once: nobody drives the run, and a drive a moment later must not
be refused with RunInFlight for the lease's whole ttl (docs/guarantee.md: a drive "frees it when it stops
without finishing the run"). And a first request that fails leaves no asyncio "Future exception was never
retrieved" report beside the StoreError (bide prints nothing unless the application configures logging)."""

from __future__ import annotations

import asyncio
import gc
import logging
import sqlite3
from pathlib import Path

import pytest

import bide
from bide.testing import ScriptedModel, reply


class _DirectLoadFails(bide.MemoryStore):
    """Answered directly by the drive (its async methods are BlockingStore's): its next load fails."""

    fail_next = False

    def load(self, run_id: str, after: int = 0) -> list[bide.Entry]:
        if self.fail_next:
            self.fail_next = False
            raise bide.StoreError("load failed: canceling statement due to statement timeout")
        return super().load(run_id, after)


class _AsyncLoadFails(_DirectLoadFails):
    """The same, with an async load of its own (awaited by the drive after its lease request)."""

    async def aload(self, run_id: str, after: int = 0) -> list[bide.Entry]:
        await asyncio.sleep(0)
        return self.load(run_id, after)


@pytest.mark.parametrize("kind", [_DirectLoadFails, _AsyncLoadFails])
def test_a_lease_granted_before_a_failed_load_is_freed(kind: type[_DirectLoadFails]) -> None:
    store = kind()
    store.fail_next = True

    def agent() -> bide.Agent:
        return bide.Agent(ScriptedModel([reply("done")]), store=store, lease_ttl=30)

    with pytest.raises(bide.StoreError):
        agent().run_sync("r", "hi")
    assert agent().run_sync("r", "hi").answer == "done"  # not RunInFlight for 30 s


def test_a_lease_granted_before_a_cancelled_load_is_freed() -> None:
    loading = asyncio.Event()
    slow = asyncio.Event()

    class Slow(_AsyncLoadFails):
        async def aload(self, run_id: str, after: int = 0) -> list[bide.Entry]:
            loading.set()
            await slow.wait()  # never set: the drive is cancelled while it waits
            return []

    store = Slow()

    async def scenario() -> str:
        drive = asyncio.ensure_future(bide.Agent(ScriptedModel([]), store=store).run("r", "hi"))
        await loading.wait()
        drive.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drive
        return store.lease("r", "another", now_ms=0, ttl_ms=1000).holder

    assert asyncio.run(scenario()) == "another"


def test_a_first_request_that_fails_leaves_no_unretrieved_future(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "locked.db"
    bide.open_store(f"sqlite:///{path}").close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    store = bide.SQLStore(f"sqlite:///{path}", busy_timeout=0.2)
    try:
        store.load("warm-up")  # the store's thread runs, as in any process that used the store before
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            for i in range(3):
                with pytest.raises(bide.StoreError):
                    bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync(f"r{i}", "hello")
                gc.collect()
        assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        store.close()
