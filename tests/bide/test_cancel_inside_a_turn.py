"""A cancel request that arrives while a drive waits inside a turn (a reconciler's slow lookup, a retry
policy's pause) stops the call that was about to be tried again: it is not called, the call's result says
so, and the run ends cancelled at the turn's end, as docs/operations.md promises ("honoured at its next
turn boundary"). Before, the drive called the side effect again after the request was journaled."""

from __future__ import annotations

import asyncio
import time

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

    def agent() -> bide.Agent:
        tool = bide.Tool.from_function(charge, timeout=0.05, reconcile=find)
        model = ScriptedModel([call("charge", cents=5), reply("done")])
        return bide.Agent(model, store=store, tools=[tool], clock_skew=0.0)

    with pytest.raises(bide.OutcomeUnknown):
        agent().run_sync("r", "charge")
    time.sleep(0.1)  # past the attempt's deadline: the reconciler may decide

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
