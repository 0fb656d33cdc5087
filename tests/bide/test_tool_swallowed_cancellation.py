"""An async tool that swallows its cancellation: the drive does not wait for it past its timeout and a short
clean-up grace. Before, a tool that caught `CancelledError` and went on waiting held its drive, the run's
lease and `asyncio.run` forever."""

from __future__ import annotations

import asyncio
import contextlib
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


def test_a_side_effect_that_swallows_its_deadlines_cancellation_does_not_go_on_to_its_effect() -> None:
    """Past its window a call is cut once more at its next step: a tool that swallows the deadline's
    cancellation and goes on to its request (another process may have decided the call by then) gets a
    CancelledError there instead, and the effect does not fire."""
    fired: list[str] = []

    async def charge(cents: int) -> str:
        """Charge a card."""
        with contextlib.suppress(asyncio.CancelledError):  # swallowed: go on to the request anyway
            await asyncio.sleep(3600)
        await asyncio.sleep(0.2)  # the request, sent past the deadline
        fired.append("charged")
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=TIMEOUT)
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    thread, outcome = drive_in_thread(agent, "r")
    thread.join(HANG)
    assert not thread.is_alive()
    [error] = outcome
    assert isinstance(error, bide.OutcomeUnknown)
    assert fired == []


@pytest.mark.parametrize("safety", [bide.ReadOnly, bide.SideEffect])
def test_the_callers_cancellation_of_a_swallowing_tool_ends_the_drive_as_cancelled(safety: Any) -> None:
    """Cancelled by its caller inside its window, a tool that swallows it is closed a grace later and the
    drive ends in CancelledError: not after the tool's whole timeout, and not as a timeout the run goes
    on from (a read-only call's error went back to the model, which was asked again)."""
    log: list[str] = []
    tool = bide.Tool.from_function(stubborn(log), timeout=30, safety=safety)
    model = ScriptedModel([call("charge", cents=5), reply("done")])
    agent = bide.Agent(model, store=bide.open_store("memory://"), tools=[tool])
    outcome: list[Any] = []

    async def cancel_soon() -> None:
        drive = asyncio.ensure_future(agent.run("r", "go"))
        await asyncio.sleep(0.1)
        drive.cancel()
        try:
            outcome.append(await drive)
        except BaseException as exc:  # the test looks at whatever ended the drive
            outcome.append(exc)

    thread = threading.Thread(target=lambda: asyncio.run(cancel_soon()), daemon=True)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), "the drive waited for the tool's timeout"
    [ended] = outcome
    assert isinstance(ended, asyncio.CancelledError), ended
    assert log == ["swallowed", "closed"]


def test_a_wall_clock_stepped_back_during_the_call_still_closes_a_swallowing_tool() -> None:
    """The deadline's timer runs on the event loop's monotonic clock, the window on the agent's wall clock:
    stepped back 2 s (an NTP step) during the call, the window was still open when the timer cancelled
    the tool, and the grace never started. It starts at the first cancellation, whatever the clock says."""
    offset = [0.0]
    log: list[str] = []

    async def charge(cents: int) -> str:
        """Charge a card."""
        asyncio.get_running_loop().call_later(0.1, offset.__setitem__, 0, -2.0)
        return str(await stubborn(log)(cents))

    tool = bide.Tool.from_function(charge, timeout=TIMEOUT)
    model = ScriptedModel([call("charge", cents=5), reply("done")])
    agent = bide.Agent(
        model, store=bide.open_store("memory://"), tools=[tool], clock=lambda: time.time() + offset[0]
    )
    thread, outcome = drive_in_thread(agent, "r")
    thread.join(HANG)
    assert not thread.is_alive(), "the drive hung on a tool that swallowed its cancellation"
    [error] = outcome
    assert isinstance(error, bide.OutcomeUnknown)
    assert log == ["swallowed", "closed"]


@pytest.mark.parametrize("raised", ["NotCalled", "a declared not_started error", "ToolError"])
def test_a_side_effect_that_turns_its_deadline_into_another_error_is_an_unknown_outcome(
    raised: str,
) -> None:
    """The tool sent its request, then, cancelled at its deadline, raised an error of its own (as client
    libraries that wrap cancellations do): a NotCalled or a declared not-started error voided the attempt
    and the next drive fired the effect again (twice in all; inside one drive with a retry policy). The
    call timed out: its outcome is unknown, and it fires once."""
    fired: list[str] = []

    async def transfer(to: str) -> str:
        """Send money."""
        fired.append(to)  # the request went out
        try:
            await asyncio.sleep(HANG)  # the bank's answer; the deadline cancels the wait
        except asyncio.CancelledError:
            if raised == "NotCalled":
                raise bide.NotCalled("aborted") from None
            if raised == "ToolError":
                raise bide.ToolError("the bank did not answer") from None
            raise ConnectionRefusedError("connection closed") from None
        return "sent"

    tool = bide.Tool.from_function(
        transfer,
        timeout=TIMEOUT,
        not_started=(ConnectionRefusedError,),
        retry=bide.RetryPolicy(attempts=3, initial=0.01),
    )
    store = bide.open_store("memory://")
    for said in ("timed out after", "it fired zero times or once"):  # the drive, then the next one
        model = ScriptedModel([call("transfer", to="acme"), reply("done")])
        with pytest.raises(bide.OutcomeUnknown, match=said):
            bide.Agent(model, store=store, tools=[tool]).run_sync("r", "pay acme")
    assert fired == ["acme"]
    assert [e.key for e in store.load("r")][-1] == "attempt:c0.0:0"  # never voided


@pytest.mark.parametrize("cancelled_by", ["the window (a busy loop past the deadline)", "the caller"])
def test_a_side_effect_that_turns_any_cancellation_into_a_not_started_error_is_not_voided(
    cancelled_by: str,
) -> None:
    """The same wrapping, when the cancellation is not the deadline's timer: the loop busy past the deadline
    (the window cuts the call before the timer runs), or the caller cancelling the drive. The declared
    not-started error voided the attempt, and the retry policy fired the effect again in the same drive."""

    class Aborted(Exception):
        """A client library's "connection aborted", raised for any cancellation."""

    fired: list[str] = []
    response: list[asyncio.Future[str]] = []

    async def charge() -> str:
        """Charge a card."""
        fired.append("charge")  # the request went out
        response.append(asyncio.get_running_loop().create_future())
        try:
            return await response[0]
        except asyncio.CancelledError:
            raise Aborted("connection aborted") from None

    tool = bide.Tool.from_function(
        charge, timeout=TIMEOUT, not_started=(Aborted,), retry=bide.RetryPolicy(attempts=2, initial=0.01)
    )
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([call("charge"), reply("done")]), store=store, tools=[tool])

    async def drive() -> None:
        running = asyncio.ensure_future(agent.run("r", "charge"))
        while not response:
            await asyncio.sleep(0.01)
        if cancelled_by == "the caller":
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
        else:
            await asyncio.sleep(0.02)
            time.sleep(TIMEOUT + 0.2)  # the loop is busy past the deadline; the answer came meanwhile
            response[0].set_result("charged")
            with pytest.raises(bide.OutcomeUnknown, match="timed out"):
                await running

    asyncio.run(drive())
    assert fired == ["charge"]
    assert [e.key for e in store.load("r")][-1] == "attempt:c0.0:0"  # never voided


@pytest.mark.parametrize("raised", ["NotCalled", "a declared not_started error", "ToolError"])
def test_a_side_effects_own_inner_timeout_is_not_taken_for_its_cancellation(raised: str) -> None:
    """The tool's own `asyncio.timeout` cancels it too, and takes that back before the tool goes on: what it
    raises then is its own word. A first version of the rule above took any cancellation thrown into the
    tool for one from outside, and halted for a person a call that provably never started."""

    class Refused(Exception):
        """The connection was refused: nothing was sent."""

    async def send(to: str) -> str:
        """Send money."""
        try:
            async with asyncio.timeout(0.05):  # connecting, before anything is sent
                await asyncio.sleep(HANG)
        except TimeoutError:
            if raised == "NotCalled":
                raise bide.NotCalled("could not connect") from None
            if raised == "ToolError":
                raise bide.ToolError("the bank is unreachable") from None
            raise Refused("refused") from None
        return "sent"

    tool = bide.Tool.from_function(send, timeout=5.0, not_started=(Refused,))
    store = bide.open_store("memory://")
    model = ScriptedModel([call("send", to="acme"), reply("done")])
    agent = bide.Agent(model, store=store, tools=[tool])
    if raised == "ToolError":
        assert agent.run_sync("r", "pay acme").answer == "done"  # the model was told
        return
    with pytest.raises(bide.ToolNotStarted):
        agent.run_sync("r", "pay acme")
    assert [e.key for e in store.load("r")][-1] == "not-started:c0.0:0"  # voided: the next drive may call it


def test_a_side_effect_that_takes_back_its_deadlines_cancellation_is_still_unknown() -> None:
    """The tool catches its deadline's cancellation, takes it back with `uncancel()` (what asyncio asks of
    code that suppresses one) and raises a declared not-started error: the cancellation count no longer
    showed it, the attempt was voided, and the next drive fired again. Its deadline's message still does."""
    fired: list[str] = []

    async def charge() -> str:
        """Charge a card."""
        fired.append("charge")
        try:
            await asyncio.sleep(HANG)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
            raise ConnectionError("aborted") from None
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=TIMEOUT, not_started=(ConnectionError,))
    store = bide.open_store("memory://")
    for _ in range(2):
        model = ScriptedModel([call("charge"), reply("done")])
        with pytest.raises(bide.OutcomeUnknown):
            bide.Agent(model, store=store, tools=[tool]).run_sync("r", "charge")
    assert fired == ["charge"]
