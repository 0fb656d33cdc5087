"""A run the worker halted itself (a side effect's outcome unknown, no reconciler: it needs a person) is
parked as the journal it read after the halt: it is not read again while its lease and latest record stay
as they were. It was read once more PARKED_RECHECK_S (30 s) later although nothing had changed. A record
written later has it read at the next pass, and a cancel request written while the worker's drive held
its lease has it ended as cancelled at the next pass (it waited for that recheck)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import bide
from bide._worker import PARKED_RECHECK_S
from bide.testing import ScriptedModel, call, reply


@bide.tool(timeout=30)
async def wire() -> str:
    """Send a wire (its outcome is lost)."""
    raise ConnectionResetError("lost after sending")


def agent(store: bide.Store, script: list[Any], **options: Any) -> bide.Agent:
    return bide.Agent(ScriptedModel(script), store=store, tools=[wire], name="a", lease_ttl=5.0, **options)


def halted(store: bide.Store, run_id: str) -> None:
    """Leave `run_id` halted for a person: its wire's deadline has passed on the wall clock (the drive's
    clock was a minute behind), and its outcome is unknown."""
    with pytest.raises(bide.OutcomeUnknown):
        agent(store, [call("wire"), reply("sent")], clock=lambda: time.time() - 60).run_sync(run_id, "pay")
    assert bide.run_status(store, run_id).status == "halted"


def counting_reads(store: bide.Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    load = store.aload

    def counted(run_id: str, after: int = 0) -> Any:
        reads.append(run_id)
        return load(run_id, after)

    monkeypatch.setattr(store, "aload", counted)
    return reads


def test_a_run_the_worker_halted_is_not_read_again_until_it_changes(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    halted(store, "h")
    clock = [time.time()]
    worker = bide.Worker(store, agent(store, [reply("never asked")]), clock=lambda: clock[0], backoff=3600,
                         max_backoff=3600)  # fmt: skip
    reads = counting_reads(store, monkeypatch)
    assert asyncio.run(worker.run_once()).halted == 1  # driven, to halt again: it needs a person
    assert "h" in reads
    reads.clear()
    for _ in range(4):  # past PARKED_RECHECK_S, several times: nothing changed, nothing read
        clock[0] += PARKED_RECHECK_S + 1
        assert asyncio.run(worker.run_once()).driven == 0
    assert reads == [], reads
    bide.Journal(store, "h").load().write([bide.GateRecord(key="note:later", data=1)])
    asyncio.run(worker.run_once())  # news: read at the next pass, without waiting for any recheck
    assert "h" in reads, reads
    assert bide.run_status(store, "h").status == "halted"


def test_a_cancel_request_written_while_the_worker_drove_the_run_ends_it_at_the_next_pass(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    halted(store, "h")
    clock = [time.time()]
    worker = bide.Worker(store, agent(store, [reply("never asked")]), clock=lambda: clock[0], backoff=3600,
                         max_backoff=3600)  # fmt: skip
    release = store.arelease
    requested: list[bool] = []

    async def cancel_then_release(run_id: str, holder: str, token: int) -> bool:
        # The drive holds the lease: the request is recorded and leaves the lease alone.
        if not requested:
            requested.append(await asyncio.to_thread(bide.cancel_run, store, run_id, reason="not needed"))
        return bool(await release(run_id, holder, token))

    monkeypatch.setattr(store, "arelease", cancel_then_release)
    assert asyncio.run(worker.run_once()).halted == 1
    assert requested == [True]
    monkeypatch.setattr(store, "arelease", release)
    report = asyncio.run(worker.run_once())  # the clock has not moved: no recheck is due
    assert report.cancelled == 1, report
    assert bide.run_status(store, "h").status == "cancelled"
