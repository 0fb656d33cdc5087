"""An async tool that swallows its cancellation: the drive does not wait for it past its timeout and a short
clean-up grace. Before, a tool that caught `CancelledError` and went on waiting held its drive, the run's
lease and `asyncio.run` forever."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import bide
from bide._tools import _CLEANUP_GRACE
from bide.testing import ScriptedModel, call, reply

TIMEOUT = 0.3
# Far past the timeout and the grace: a drive still going then hangs (the old code never returned).
HANG = 20.0


def drive_in_thread(agent: bide.Agent, run_id: str) -> tuple[threading.Thread, list[Any]]:
    """Drive `run_id` in a daemon thread of its own (a hung drive must not hang the test run); the list
    gets the run's result or the exception it raised."""
    outcome: list[Any] = []

    def drive() -> None:
        try:
            outcome.append(asyncio.run(agent.run(run_id, "go")))
        except BaseException as exc:  # the test looks at whatever ended the drive
            outcome.append(exc)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    return thread, outcome


def stubborn(log: list[str]) -> Any:
    async def charge(cents: int) -> str:
        """Charge a card."""
        try:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    log.append("swallowed")
        finally:
            log.append("closed")

    return charge


@pytest.mark.parametrize("store_url", ["memory://", "sqlite"])
def test_a_side_effect_that_swallows_its_cancellation_halts_as_unknown_and_is_closed(
    store_url: str, tmp_path: Any
) -> None:
    log: list[str] = []
    url = f"sqlite:///{tmp_path / 'runs.db'}" if store_url == "sqlite" else store_url
    store = bide.open_store(url)
    tool = bide.Tool.from_function(stubborn(log), timeout=TIMEOUT)
    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    started = time.monotonic()
    thread, outcome = drive_in_thread(agent, "r")
    thread.join(HANG)
    assert not thread.is_alive(), "the drive hung on a tool that swallowed its cancellation"
    assert time.monotonic() - started >= TIMEOUT + _CLEANUP_GRACE * 0.9  # it had its grace to clean up
    [error] = outcome
    assert isinstance(error, bide.OutcomeUnknown) and "timed out after 0.3s" in str(error)
    assert log[0] == "swallowed" and log[-1] == "closed"  # cancelled at its deadline, closed after the grace
    # The run's lease was let go: a person's resolution is taken at once, and the run goes on.
    bide.resolve_halt(store, "r", error.call_id, outcome=bide.Outcome.failed("never charged"), clock_skew=0.0)
    resumed = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    assert resumed.run_sync("r", "go").output == "done"


def test_a_read_only_tool_that_swallows_its_cancellation_times_out_and_the_run_goes_on() -> None:
    log: list[str] = []
    tool = bide.Tool.from_function(stubborn(log), timeout=TIMEOUT, safety=bide.ReadOnly)
    model = ScriptedModel([call("charge", cents=5), reply("done")])
    agent = bide.Agent(model, store=bide.open_store("memory://"), tools=[tool])
    thread, outcome = drive_in_thread(agent, "r")
    thread.join(HANG)
    assert not thread.is_alive(), "the drive hung on a tool that swallowed its cancellation"
    [result] = outcome
    assert isinstance(result, bide.RunResult) and result.output == "done"
    assert log[-1] == "closed"


def test_a_tool_that_cleans_up_within_the_grace_is_not_closed() -> None:
    """The grace is for clean-up: a tool that awaits its clean-up after its deadline's cancellation and then
    ends runs its clean-up to the end (closing it early would leave a connection half shut). Before, the
    clean-up's first await was cancelled again, as if the tool had not been cancelled yet."""
    log: list[str] = []

    async def charge(cents: int) -> str:
        """Charge a card."""
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(_CLEANUP_GRACE / 5)
            log.append("cleaned up")
            raise
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=TIMEOUT)
    agent = bide.Agent(
        ScriptedModel([call("charge", cents=5), reply("done")]),
        store=bide.open_store("memory://"),
        tools=[tool],
    )
    thread, outcome = drive_in_thread(agent, "r")
    thread.join(HANG)
    assert not thread.is_alive()
    [error] = outcome
    assert isinstance(error, bide.OutcomeUnknown)
    assert log == ["cleaned up"]
