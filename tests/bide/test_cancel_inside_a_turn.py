"""A cancel request that arrives while a drive waits inside a turn (a reconciler's slow lookup, a retry
policy's pause) stops the call that was about to be tried again: it is not called, the call's result says
so, and the run ends cancelled at the turn's end, as docs/operations.md promises ("honoured at its next
turn boundary"). Before, the drive called the side effect again after the request was journaled."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import bide
from bide.testing import ScriptedModel, call, reply


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> bide.Store:
    if request.param == "memory":
        return bide.open_store("memory://")
    return bide.open_store(f"sqlite:///{tmp_path}/runs.db")


def test_a_cancel_during_a_slow_reconciler_stops_the_call_it_would_try_again(store: bide.Store) -> None:
    fired: list[int] = []
    looking = asyncio.Event()
    answer = asyncio.Event()

    async def find(info: bide.AttemptInfo) -> bide.Outcome:
        looking.set()
        await answer.wait()
        return bide.Outcome.not_started()  # the system of record never saw the first attempt

    async def charge(cents: int) -> str:
        """Charge a card."""
        fired.append(cents)
        if len(fired) == 1:
            raise RuntimeError("the connection dropped after the request was sent")
        return "charged"

    def agent(**options: Any) -> bide.Agent:
        tool = bide.Tool.from_function(charge, timeout=30, reconcile=find)
        model = ScriptedModel([call("charge", cents=5), reply("done")])
        return bide.Agent(model, store=store, tools=[tool], clock_skew=0.0, **options)

    # The first drive's clock runs a minute behind: the deadline its marker records has passed already on
    # the next drive's clock, so the reconciler may decide at once; the call had all its 30 s to start (a
    # short timeout, waited out, could close before the call started on a loaded machine).
    with pytest.raises(bide.OutcomeUnknown):
        agent(clock=lambda: time.time() - 60).run_sync("r", "charge")

    async def scenario() -> bide.RunResult:
        drive = asyncio.ensure_future(agent().run("r", "charge"))
        await looking.wait()
        assert await bide.acancel_run(store, "r", reason="the customer called back")
        answer.set()
        return await drive

    result = asyncio.run(scenario())
    assert fired == [5]  # the first attempt only
    assert result.status == "cancelled" and result.answer == "Cancelled: the customer called back"
    [res] = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.ToolResult)]
    assert res.is_error and "not called" in str(res.result) and "cancelled" in str(res.result)


def test_a_cancel_during_a_retry_policys_pause_stops_the_next_try(store: bide.Store) -> None:
    fired: list[int] = []
    pausing = asyncio.Event()

    async def charge(cents: int) -> str:
        """Charge a card."""
        fired.append(cents)
        pausing.set()
        raise bide.NotCalled("the gateway refused the connection")

    tool = bide.Tool.from_function(charge, retry=bide.RetryPolicy(attempts=3, initial=0.3, jitter=False))
    model = ScriptedModel([call("charge", cents=5), reply("done")])
    agent = bide.Agent(model, store=store, tools=[tool])

    async def scenario() -> bide.RunResult:
        drive = asyncio.ensure_future(agent.run("r", "charge"))
        await pausing.wait()
        assert await bide.acancel_run(store, "r", reason="stop")
        return await drive

    result = asyncio.run(scenario())
    assert fired == [5]  # no try after the request
    assert result.status == "cancelled" and result.answer == "Cancelled: stop"
    [res] = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.ToolResult)]
    assert res.is_error and "not called" in str(res.result)


class _FailingLoads(bide.MemoryStore):
    """A memory store whose reads fail once `broken` is set (a database gone away mid-drive)."""

    broken = False

    def load(self, run_id: str, after: int = 0) -> list[bide.Entry]:
        if self.broken:
            raise bide.StoreError("the database went away")
        return super().load(run_id, after)


def test_a_halt_stands_when_the_store_fails_while_the_drive_checks_whether_it_is_stale() -> None:
    """A drive that halts reads the journal once more (another driver may have decided the call under a
    newer attempt, making the halt stale). When that read fails, the halt is what the caller gets: it needs
    a person, not a retry of a store error."""
    store = _FailingLoads()

    async def charge(cents: int) -> str:
        """Charge a card."""
        store.broken = True
        raise RuntimeError("the connection dropped after the request was sent")

    tool = bide.Tool.from_function(charge)
    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    with pytest.raises(bide.OutcomeUnknown) as halt:
        agent.run_sync("r", "charge")
    assert halt.value.call_id == "c0.0" and halt.value.__cause__ is None
    store.broken = False
    with pytest.raises(bide.OutcomeUnknown):  # the marker is journaled: the next drive halts on it too
        bide.Agent(ScriptedModel([]), store=store, tools=[tool]).run_sync("r", "charge")
