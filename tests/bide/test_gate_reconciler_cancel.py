"""A gate or a reconciler that swallows its caller's cancellation (returns a decision anyway, or raises an
error of its own) must not let the drive act on what it gave. Before, a gate that approved after the caller
had cancelled the drive let the side effect fire, and a reconciler that answered "never started" let the
call be claimed and fired again, both after the caller had asked the drive to stop; the caller's
`CancelledError` (or its `asyncio.timeout`'s `TimeoutError`) never came. A tool that swallows its
cancellation is handled the same way (test_tool_child_cancel.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
import time
from typing import Any

import pytest
from test_bide_agent import RUN_INPUT, Ledger, _halt_by_losing_result, charge_script

import bide

HANG = 3600.0


def _gate_that(behaves: str, asked: list[str]) -> Any:
    class SlowApprover:
        """A gate whose decision takes a while (a request to a policy service)."""

        async def check(self, request: bide.GateRequest) -> Any:
            asked.append(request.call_id)
            if behaves == "answers":
                return bide.Approved("ok")
            try:
                await asyncio.sleep(HANG)
            except asyncio.CancelledError as exc:
                if behaves == "wraps":
                    raise RuntimeError("policy service request aborted") from exc
                return bide.Approved("approved while cancelled")
            return bide.Approved("ok")

    return SlowApprover()


def _cancelled_soon(agent: bide.Agent, by: str) -> BaseException | None:
    """Drive run "r", cancelled 0.1 s in (`task.cancel()`, or an `asyncio.timeout`): what ended it."""

    async def main() -> BaseException | None:
        try:
            if by == "cancel":
                task = asyncio.ensure_future(agent.run("r", RUN_INPUT))
                await asyncio.sleep(0.1)
                task.cancel()
                await task
            else:
                async with asyncio.timeout(0.1):
                    await agent.run("r", RUN_INPUT)
        except BaseException as exc:  # the test looks at what ended the drive
            return exc
        return None

    return asyncio.run(main())


@pytest.mark.parametrize("behaves", ["returns", "wraps"])
@pytest.mark.parametrize("by", ["cancel", "timeout"])
def test_a_gate_that_swallows_the_callers_cancellation_does_not_let_the_call_run(
    behaves: str, by: str
) -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    asked: list[str] = []
    tool = ledger.tool(gate=_gate_that(behaves, asked), timeout=30)
    ended = _cancelled_soon(bide.Agent(charge_script(), store=store, tools=[tool]), by)
    expected = asyncio.CancelledError if by == "cancel" else TimeoutError
    assert isinstance(ended, expected), repr(ended)
    assert asked == ["c0.0"]
    assert ledger.charges == []
    assert not any(e.key.startswith(("attempt:", "result:")) for e in store.load("r"))
    # The next drive asks the gate again, and the charge fires once.
    quick = ledger.tool(gate=_gate_that("answers", asked), timeout=30)
    again = bide.Agent(charge_script(), store=store, tools=[quick])
    assert again.run_sync("r", RUN_INPUT).answer == "done"
    assert asked == ["c0.0", "c0.0"] and len(ledger.charges) == 1


def test_a_gate_whose_own_code_cancels_its_task_does_not_stop_the_drive() -> None:
    """A cancellation the gate's own code makes of its task (as an asyncio.TaskGroup whose child failed does,
    and may leave counted on Python 3.11 and 3.12) is not the caller's."""

    class Leaky:
        async def check(self, request: bide.GateRequest) -> Any:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)  # taken, never given back with uncancel()
            return bide.Approved("ok")

    store = bide.open_store("memory://")
    ledger = Ledger()
    agent = bide.Agent(charge_script(), store=store, tools=[ledger.tool(gate=Leaky(), timeout=30)])
    assert agent.run_sync("r", RUN_INPUT).answer == "done"
    assert len(ledger.charges) == 1


def test_a_gate_runs_in_a_task_named_as_the_drives() -> None:
    names: list[str] = []

    class Naming:
        async def check(self, request: bide.GateRequest) -> Any:
            task = asyncio.current_task()
            assert task is not None
            names.append(task.get_name())
            return bide.Approved()

    async def main() -> str:
        store = bide.open_store("memory://")
        agent = bide.Agent(charge_script(), store=store, tools=[Ledger().tool(gate=Naming(), timeout=30)])
        drive = asyncio.create_task(agent.run("r", RUN_INPUT), name="drive-of-r")
        await drive
        return drive.get_name()

    assert [asyncio.run(main())] == names


def _reconciler_that(behaves: str, asked: list[str]) -> Any:
    async def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome | None:
        asked.append(attempt.call_id)
        try:
            await asyncio.sleep(HANG)  # a lookup in the payment provider's API
        except asyncio.CancelledError as exc:
            if behaves == "wraps":
                raise RuntimeError("ledger lookup aborted") from exc
            return bide.Outcome.not_started()  # what a lookup cut short may say: nothing found
        return None

    return reconcile


@pytest.mark.parametrize("behaves", ["returns", "wraps"])
@pytest.mark.parametrize("by", ["cancel", "timeout"])
def test_a_reconciler_that_swallows_the_callers_cancellation_is_not_acted_on(behaves: str, by: str) -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=0.01, fire=True)  # charged, its result lost
    asked: list[str] = []
    later = time.time() + 3600  # past the lost attempt's deadline: the reconciler is asked
    tool = ledger.tool(reconcile=_reconciler_that(behaves, asked))
    agent = bide.Agent(charge_script(), store=store, tools=[tool], clock=lambda: later)
    ended = _cancelled_soon(agent, by)
    expected = asyncio.CancelledError if by == "cancel" else TimeoutError
    assert isinstance(ended, expected), repr(ended)
    assert asked == ["c0.0"]
    assert len(ledger.charges) == 1  # not charged a second time on "not started"
    journaled = [e.key for e in store.load("r")]
    assert "result:c0.0" not in journaled and "attempt:c0.0:1" not in journaled

    # The next drive asks the reconciler again; this time it looks the charge up.
    async def finds(attempt: bide.AttemptInfo) -> bide.Outcome | None:
        asked.append(attempt.call_id)
        hit = any(c[2] == attempt.idempotency_key for c in ledger.charges)
        return bide.Outcome.succeeded("charged alice 500") if hit else bide.Outcome.not_started()

    tool = ledger.tool(reconcile=finds)
    again = bide.Agent(charge_script(), store=store, tools=[tool], clock=lambda: later)
    assert again.run_sync("r", RUN_INPUT).answer == "done"
    assert asked == ["c0.0", "c0.0"] and len(ledger.charges) == 1


async def _cancels_its_own_lookup(attempt: bide.AttemptInfo) -> bide.Outcome | None:
    lookup = asyncio.create_task(asyncio.sleep(HANG))
    await asyncio.sleep(0)
    lookup.cancel()
    await lookup
    return None


def _cancelled_future_in_its_thread(attempt: bide.AttemptInfo) -> bide.Outcome | None:
    # (asyncio passes the thread's concurrent.futures.CancelledError on as its own CancelledError)
    lookup: concurrent.futures.Future[bide.Outcome] = concurrent.futures.Future()
    lookup.cancel()
    return lookup.result()


@pytest.mark.parametrize("reconcile", [_cancels_its_own_lookup, _cancelled_future_in_its_thread])
def test_a_reconciler_that_raises_its_own_cancellation_halts_naming_it(reconcile: Any) -> None:
    """A CancelledError the reconciler raised when nothing cancelled the drive (a task of its own that it
    cancelled and awaited; in a thread, a future of its own that was cancelled) is its own failure, named in
    the halt: never a CancelledError out of a drive no one cancelled."""
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=0.01, fire=True)
    later = time.time() + 3600
    agent = bide.Agent(
        charge_script(), store=store, tools=[ledger.tool(reconcile=reconcile)], clock=lambda: later
    )
    with pytest.raises(bide.OutcomeUnknown) as halted:
        agent.run_sync("r", RUN_INPUT)
    assert "its reconciler raised" in str(halted.value) and "CancelledError" in str(halted.value)
    assert len(ledger.charges) == 1


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_gate_that_raises_a_cancelled_error_of_its_own_is_a_config_error(kind: str) -> None:
    """Not a CancelledError to a caller that cancelled nothing (which asyncio.gather, a TaskGroup and
    asyncio.run take for their own); the call does not run."""

    class OwnTask:
        async def check(self, request: bide.GateRequest) -> Any:
            lookup = asyncio.create_task(asyncio.sleep(HANG))
            await asyncio.sleep(0)
            lookup.cancel()
            await lookup
            return bide.Approved()

    class Synchronous:
        def check(self, request: bide.GateRequest) -> Any:
            raise asyncio.CancelledError

    store = bide.open_store("memory://")
    ledger = Ledger()
    gate = OwnTask() if kind == "async" else Synchronous()
    agent = bide.Agent(charge_script(), store=store, tools=[ledger.tool(gate=gate, timeout=30)])
    with pytest.raises(bide.ConfigError, match="the gate of tool 'charge_card' raised CancelledError"):
        agent.run_sync("r", RUN_INPUT)
    assert ledger.charges == []


def test_a_coroutine_a_sync_reconciler_hands_back_after_its_caller_cancelled_is_closed() -> None:
    """A synchronous reconciler still in its thread when the caller cancelled the drive returns a coroutine
    afterwards: it is closed where it lands, never started (it was left to the garbage collector, which
    warned that it was never awaited)."""
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=0.01, fire=True)
    handed: list[Any] = []
    looked_up: list[str] = []
    release = threading.Event()

    async def look_up(attempt: bide.AttemptInfo) -> bide.Outcome | None:
        looked_up.append(attempt.call_id)
        return bide.Outcome.not_started()

    def reconcile(attempt: bide.AttemptInfo) -> Any:
        release.wait(10)
        coroutine = look_up(attempt)
        handed.append(coroutine)
        return coroutine

    later = time.time() + 3600
    agent = bide.Agent(
        charge_script(), store=store, tools=[ledger.tool(reconcile=reconcile)], clock=lambda: later
    )
    threading.Timer(0.5, release.set).start()
    assert isinstance(_cancelled_soon(agent, "cancel"), asyncio.CancelledError)
    waited = time.monotonic() + 10
    while not handed and time.monotonic() < waited:
        time.sleep(0.01)
    assert len(handed) == 1
    assert inspect.getcoroutinestate(handed[0]) == inspect.CORO_CLOSED
    assert looked_up == [] and len(ledger.charges) == 1


async def _swallows_every_cancellation(seconds: float) -> None:
    """A wait that takes every cancellation back and goes on waiting (a retry loop catching everything)."""
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(ends - time.monotonic())


@pytest.mark.parametrize("kind", ["gate", "reconciler"])
@pytest.mark.parametrize("by", ["cancel", "timeout"])
def test_a_gate_or_reconciler_that_swallows_every_cancellation_is_closed_after_a_grace(
    kind: str, by: str
) -> None:
    """One that takes back every cancellation and goes on waiting held its drive, and the run's lease, for
    as long as it waited (forever, for some): the caller's cancellation never ended the drive. It is closed
    at the await it is on a second after the first cancellation, as a tool is, and the drive ends in the
    caller's CancelledError; the next drive asks it again."""
    store = bide.open_store("memory://")
    ledger = Ledger()
    asked: list[str] = []
    closed: list[str] = []

    async def stubborn() -> None:
        try:
            await _swallows_every_cancellation(HANG)
        finally:
            closed.append("finally")

    class Approver:
        async def check(self, request: bide.GateRequest) -> Any:
            asked.append(request.call_id)
            await stubborn()
            return bide.Approved("approved after all")

    async def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome | None:
        asked.append(attempt.call_id)
        await stubborn()
        return bide.Outcome.not_started()

    later = time.time() + 3600
    if kind == "gate":
        tool = ledger.tool(gate=Approver(), timeout=30)
        agent = bide.Agent(charge_script(), store=store, tools=[tool])
    else:
        _halt_by_losing_result(store, ledger, timeout=0.01, fire=True)
        tool = ledger.tool(reconcile=reconcile)
        agent = bide.Agent(charge_script(), store=store, tools=[tool], clock=lambda: later)
    began = time.monotonic()
    ended = _cancelled_soon(agent, by)
    took = time.monotonic() - began
    expected = asyncio.CancelledError if by == "cancel" else TimeoutError
    assert isinstance(ended, expected), repr(ended)
    cancelled = ended if by == "cancel" else ended.__context__
    assert "did not end within 1s of its cancellation" in str(cancelled)
    assert took < 30, took  # (a grace of 1 s after the cancellation at 0.1 s; not HANG)
    assert asked == ["c0.0"] and closed == ["finally"]
    assert len(ledger.charges) == (0 if kind == "gate" else 1)
    # The lease was freed: the next drive goes on at once, and asks again.
    if kind == "gate":
        tool = ledger.tool(gate=_gate_that("answers", asked), timeout=30)
        again = bide.Agent(charge_script(), store=store, tools=[tool])
    else:

        async def finds(attempt: bide.AttemptInfo) -> bide.Outcome | None:
            asked.append(attempt.call_id)
            return bide.Outcome.succeeded("charged alice 500")

        again = bide.Agent(
            charge_script(), store=store, tools=[ledger.tool(reconcile=finds)], clock=lambda: later
        )
    assert again.run_sync("r", RUN_INPUT).answer == "done"
    assert asked == ["c0.0", "c0.0"] and len(ledger.charges) == 1
