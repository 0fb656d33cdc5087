"""One event loop held up by other work (a blocking call in a callback, a slow sync reconciler): a
claimed async call never goes on past its deadline, and a reconciler's lookup does not hold up the loop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import bide
from bide.testing import ScriptedModel, call, reply


def test_an_async_call_held_up_past_its_deadline_by_a_busy_loop_does_not_go_on_to_its_effect() -> None:
    """The tool waits at awaits that are ready at once; the loop is then blocked past the call's deadline.
    asyncio runs ready steps before the timers that came due meanwhile, so the tool went on to its effect
    after its deadline (when another process may already have decided the call and fired it). It is
    cancelled at that await instead, and the run halts on an unknown outcome, the effect not fired. The
    block is timed from the call's start (its deadline is at most the 1 s timeout later), not from the
    drive's, and the timeout leaves a loaded machine room to start the call: with a block timed from the
    drive's start and a 0.3 s window, a slow start made the call ToolNotStarted instead."""
    fired: list[str] = []

    async def charge(cents: int) -> str:
        """Charge a card."""
        started = time.monotonic()
        # The loop is busy for 1.2 s from its next step: past the deadline (at most 1 s after the start)
        # and the tool's wait (1.1 s).
        asyncio.get_running_loop().call_soon(time.sleep, 1.2)
        until = started + 1.1
        while time.monotonic() < until:
            await asyncio.sleep(0)
        fired.append("charged")
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=1.0)
    agent = bide.Agent(
        ScriptedModel([call("charge", cents=5), reply("done")]),
        store=bide.open_store("memory://"),
        tools=[tool],
    )

    with pytest.raises(bide.OutcomeUnknown, match=r"timed out after 1s"):
        asyncio.run(agent.run("r", "charge"))
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

    def agent(**options: Any) -> bide.Agent:
        tool = bide.Tool.from_function(charge, timeout=30, reconcile=find)
        model = ScriptedModel([call("charge", cents=5), reply("done")])
        return bide.Agent(model, store=store, tools=[tool], clock_skew=0.0, **options)

    # The first drive's clock runs a minute behind: the deadline its marker records has passed already on
    # the next drive's clock, so the reconciler may decide at once; the call had all its 30 s to start (a
    # synchronous call starts only inside its window, once a worker thread picks it up).
    with pytest.raises(bide.OutcomeUnknown):
        agent(clock=lambda: time.time() - 60).run_sync("r", "charge")

    async def scenario() -> bide.RunResult:
        async def other_work() -> None:
            await asyncio.sleep(0.05)
            other_work_ran.set()

        other = asyncio.ensure_future(other_work())
        result = await agent().run("r", "charge")
        await other
        return result

    assert asyncio.run(scenario()).answer == "done"


def test_a_call_cancelled_past_its_window_ends_in_an_unknown_outcome_whatever_its_clean_up_does() -> None:
    """The wall clock steps past the call's deadline (the loop's timer is not due yet) while the tool waits
    in a TaskGroup, whose clean-up swallows later cancellations and re-raises the first: the call ends in
    TimeoutError, so the run halts on an unknown outcome (a bare CancelledError escaped `agent.run`, as if
    the caller had cancelled it)."""
    offset = [0.0]

    async def charge(cents: int) -> str:
        """Charge a card."""

        async def child() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                await asyncio.sleep(0)
                raise

        async with asyncio.TaskGroup() as group:
            group.create_task(child())
            await asyncio.sleep(0)
            offset[0] = 100.0
            await asyncio.sleep(0)
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=30)
    store = bide.open_store("memory://")
    model = ScriptedModel([call("charge", cents=5), reply("done")])
    agent = bide.Agent(model, store=store, tools=[tool], clock=lambda: time.time() + offset[0])
    with pytest.raises(bide.OutcomeUnknown, match="timed out"):
        asyncio.run(agent.run("r", "charge"))


def test_what_a_synchronous_tool_hands_back_may_be_any_awaitable() -> None:
    """A sync tool may return its real work as any awaitable, a generator-based coroutine included (it has
    no `__await__` of its own): it runs, inside the call's window, and its value is the call's result."""
    import types

    @types.coroutine
    def later() -> Any:
        yield from asyncio.sleep(0).__await__()
        return "charged later"

    def charge(cents: int) -> Any:
        """Charge a card."""
        return later()

    tool = bide.Tool.from_function(charge, timeout=5)
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    assert agent.run_sync("r", "charge").answer == "done"
    result = bide.Journal(store, "r").load().get("result:c0.0")
    assert isinstance(result, bide.ToolResult) and result.result == "charged later"
