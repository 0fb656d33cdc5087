"""One event loop held up by other work (a blocking call in a callback, a slow sync reconciler): a
claimed async call never goes on past its deadline, and a reconciler's lookup does not hold up the loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import bide
from bide.testing import ScriptedModel, call, reply


def test_an_async_call_held_up_past_its_deadline_by_a_busy_loop_does_not_go_on_to_its_effect() -> None:
    """The tool waits at awaits that are ready at once; the loop is then blocked past the call's deadline.
    asyncio runs ready steps before the timers that came due meanwhile, so the tool went on to its effect
    after its deadline (when another process may already have decided the call and fired it). It is
    cancelled at that await instead, and the run halts on an unknown outcome, the effect not fired."""
    fired: list[str] = []

    async def charge(cents: int) -> str:
        """Charge a card."""
        until = time.monotonic() + 0.4
        while time.monotonic() < until:
            await asyncio.sleep(0)
        fired.append("charged")
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=0.3)
    agent = bide.Agent(
        ScriptedModel([call("charge", cents=5), reply("done")]),
        store=bide.open_store("memory://"),
        tools=[tool],
    )

    async def scenario() -> None:
        asyncio.get_running_loop().call_later(0.1, time.sleep, 0.5)  # past the deadline and the tool's wait
        await agent.run("r", "charge")

    with pytest.raises(bide.OutcomeUnknown, match=r"timed out after 0\.3s"):
        asyncio.run(scenario())
    assert fired == []


def test_a_slow_sync_reconciler_does_not_hold_up_the_event_loop() -> None:
    """A plain-function reconciler (an HTTP lookup, say) runs in a worker thread: the loop's other work goes
    on meanwhile (here it is what the lookup waits for; on the loop, the lookup would wait in vain, and so
    would every lease renewal and deadline of the loop's other drives)."""
    other_work_ran = threading.Event()
    store = bide.open_store("memory://")

    def find(attempt: bide.AttemptInfo) -> bide.Outcome | None:
        if other_work_ran.wait(5):
            return bide.Outcome.succeeded("charged", evidence="the ledger has the key")
        return None

    def charge(cents: int) -> str:
        """Charge a card."""
        raise RuntimeError("the connection dropped after the request was sent")

    def agent() -> bide.Agent:
        tool = bide.Tool.from_function(charge, timeout=0.05, reconcile=find)
        model = ScriptedModel([call("charge", cents=5), reply("done")])
        return bide.Agent(model, store=store, tools=[tool], clock_skew=0.0)

    with pytest.raises(bide.OutcomeUnknown):
        agent().run_sync("r", "charge")
    time.sleep(0.1)  # past the attempt's deadline: the reconciler may decide

    async def scenario() -> bide.RunResult:
        async def other_work() -> None:
            await asyncio.sleep(0.05)
            other_work_ran.set()

        other = asyncio.ensure_future(other_work())
        result = await agent().run("r", "charge")
        await other
        return result

    assert asyncio.run(scenario()).answer == "done"
