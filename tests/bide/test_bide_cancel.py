"""Cancellation: a durable request, honoured at the next turn boundary, never interrupting a call in flight.

On every store in process (with `cancel_check=0` a drive looks at every turn boundary); `bide cancel`
through a subprocess (exit codes); and a cancel from another process reaching a run driven in a child
process, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from paused import wait_until_paused
from pydantic import BaseModel

import bide
from bide.testing import Fail, ScriptedModel, call, reply

HERE = Path(__file__).resolve().parent


def test_a_cancelled_run_ends_cancelled_at_its_next_drive(store: bide.Store) -> None:
    model = ScriptedModel([call("look"), Fail(bide.ModelError("down")), reply("never")])

    @bide.tool(safety=bide.ReadOnly)
    def look() -> str:
        """Look."""
        return "seen"

    agent = bide.Agent(model, store=store, tools=[look])
    with pytest.raises(bide.ModelError):
        agent.run_sync("r", "go")
    assert bide.cancel_run(store, "r", reason="customer changed their mind") is True
    assert bide.cancel_run(store, "r", reason="again") is False  # the first reason stands
    asked = len(model.requests)
    result = agent.run_sync("r", "go")
    assert (result.status, result.answer) == ("cancelled", "Cancelled: customer changed their mind")
    assert len(model.requests) == asked  # the model was not asked again
    assert bide.run_status(store, "r").status == "cancelled"
    again = agent.run_sync("r", "go")
    assert again.replayed and again.status == "cancelled"
    with pytest.raises(bide.RunEnded):
        bide.cancel_run(store, "r")
    with pytest.raises(bide.RunNotFound):
        bide.cancel_run(store, "no-such-run")


class _PayArgs(BaseModel):
    to: str


@pytest.mark.parametrize("shape", ["object with async __call__", "function returning a coroutine"])
def test_a_drive_cancelled_while_an_awaitable_tool_waits_never_records_it_as_done(
    store: bide.Store, shape: str
) -> None:
    """A tool whose function hands back an awaitable (an object with `async def __call__`, or a plain
    function returning a coroutine) has not performed its effect until that awaitable is done: a drive
    cancelled while it waits leaves the outcome unknown (the next drive halts), never a success record. The
    drive is cancelled once the awaitable waits, not after a fixed time a loaded machine may take to get
    there (cancelled before the call started, the next drive would call it again)."""
    effects: list[str] = []
    waiting: list[bool] = []

    async def pay_now(args: _PayArgs) -> str:
        waiting.append(True)
        await asyncio.sleep(30)  # waits for a connection, say; the effect comes after
        effects.append(args.to)
        return f"paid {args.to}"

    class Payer:
        async def __call__(self, args: _PayArgs) -> str:
            return await pay_now(args)

    def payment(args: _PayArgs) -> Coroutine[Any, Any, str]:
        return pay_now(args)

    fn: Callable[[_PayArgs], Any] = Payer() if shape.startswith("object") else payment
    pay = bide.Tool(name="pay", description="Pay someone.", args=_PayArgs, fn=fn, timeout=60)

    def agent() -> bide.Agent:
        model = ScriptedModel([call("pay", to="acme"), reply("Paid.")])
        return bide.Agent(model, store=store, tools=[pay], lease_ttl=1)

    async def cancelled_drive() -> None:
        drive = asyncio.ensure_future(agent().run("r", "pay acme"))
        give_up = time.monotonic() + 60
        while not waiting:
            assert not drive.done() and time.monotonic() < give_up, "the awaitable never started"
            await asyncio.sleep(0.01)
        drive.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drive

    asyncio.run(cancelled_drive())
    deadline = time.monotonic() + 10
    while True:
        try:
            agent().run_sync("r", "pay acme")
        except bide.RunInFlight:  # the cancelled drive's lease, until it is freed or expires
            assert time.monotonic() < deadline
            time.sleep(0.1)
            continue
        except bide.OutcomeUnknown as halt:
            assert halt.call_id == "c0.0"
            break
        pytest.fail("the run went on as if the payment had been made")
    assert effects == []
    assert not bide.Journal(store, "r").load().has("result:c0.0")
    assert bide.run_status(store, "r").status == "halted"


def test_an_awaitable_a_sync_tool_returns_never_starts_once_its_window_closed(store: bide.Store) -> None:
    """The process pauses right after a synchronous tool function returned its coroutine (here the agent's
    clock jumps past the marker's deadline, as a pause does): another driver may already have resolved the
    call, so the coroutine must not take its first step. It never starts, and the outcome stays unknown
    (the function itself ran): the run halts. It used to get at least a millisecond, enough to act."""
    clock = [1_800_000_000.0]
    effects: list[str] = []

    async def pay_now(args: _PayArgs) -> str:
        effects.append(args.to)  # the effect is the coroutine's first step
        return f"paid {args.to}"

    def payment(args: _PayArgs) -> Coroutine[Any, Any, str]:
        clock[0] += 3600  # a pause lands here, after the function returned
        return pay_now(args)

    pay = bide.Tool(name="pay", description="Pay someone.", args=_PayArgs, fn=payment, timeout=5)
    model = ScriptedModel([call("pay", to="acme"), reply("Paid.")])
    agent = bide.Agent(model, store=store, tools=[pay], clock=lambda: clock[0])
    with pytest.raises(bide.OutcomeUnknown) as halted:
        agent.run_sync("r", "pay acme")
    assert halted.value.call_id == "c0.0"
    assert effects == []
    assert not bide.Journal(store, "r").load().has("result:c0.0")


@pytest.mark.parametrize("ends_by", ["cancel", "timeout"])
def test_a_coroutine_a_sync_tool_hands_back_after_its_drive_stopped_waiting_is_closed(ends_by: str) -> None:
    """A synchronous tool still in its thread when its drive stopped waiting (the caller cancelled, or the
    call's timeout passed) returns its coroutine afterwards: the coroutine is closed where it lands, and its
    work never starts. It was left to the garbage collector, which warned that it was never awaited."""
    effects: list[str] = []
    handed: list[Coroutine[Any, Any, str]] = []
    release = threading.Event()

    async def pay_now(args: _PayArgs) -> str:
        effects.append(args.to)
        return f"paid {args.to}"

    def payment(args: _PayArgs) -> Coroutine[Any, Any, str]:
        release.wait(10)  # a slow lookup before the payment; the drive stops waiting meanwhile
        coroutine = pay_now(args)
        handed.append(coroutine)
        return coroutine

    timeout = 0.2 if ends_by == "timeout" else 30
    pay = bide.Tool(name="pay", description="Pay someone.", args=_PayArgs, fn=payment, timeout=timeout)
    model = ScriptedModel([call("pay", to="acme"), reply("Paid.")])
    agent = bide.Agent(model, store=bide.open_store("memory://"), tools=[pay])

    async def cancelled_soon() -> None:
        task = asyncio.ensure_future(agent.run("r", "pay acme"))
        await asyncio.sleep(0.1)
        task.cancel()
        await task

    threading.Timer(0.5, release.set).start()
    if ends_by == "cancel":
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(cancelled_soon())
    else:
        with pytest.raises(bide.OutcomeUnknown):
            agent.run_sync("r", "pay acme")
    waited = time.monotonic() + 10
    while not handed and time.monotonic() < waited:
        time.sleep(0.01)
    assert len(handed) == 1
    assert inspect.getcoroutinestate(handed[0]) == inspect.CORO_CLOSED
    assert effects == []


def test_a_call_in_flight_finishes_and_the_next_turn_is_not_taken(store: bide.Store) -> None:
    charges: list[int] = []

    @bide.tool
    async def charge(cents: int) -> str:
        """Charge a card; the run is cancelled while the charge is in flight."""
        await bide.acancel_run(store, "c", reason="stop")
        await asyncio.sleep(0.01)
        charges.append(cents)
        return "charged"

    model = ScriptedModel([call("charge", cents=3), call("charge", cents=4), reply("done")])
    result = bide.Agent(model, store=store, tools=[charge], cancel_check=0).run_sync("c", "pay")
    assert result.status == "cancelled"
    assert charges == [3]  # the call in flight finished; the next turn's call never started
    assert len(model.requests) == 1
    journal = bide.Journal(store, "c").load()
    first = journal.get("result:c0.0")
    assert isinstance(first, bide.ToolResult) and first.result == "charged"  # its result is journaled


def test_a_cancel_never_ends_a_run_while_its_call_may_still_be_running(store: bide.Store) -> None:
    """A run halted on a side effect whose outcome is unknown, then cancelled: its next drive (the worker's)
    ended it as cancelled at once, although the call's deadline had not passed; a paused process still
    running the call then charged the card after the run said it was cancelled, and nothing could record
    it (`bide resolve` of an ended run is refused). The run ends only once the call cannot be running, with
    an answer that names the call whose outcome was never recorded."""

    class Crash(BaseException):
        pass

    fired: list[int] = []
    now = [time.time()]

    @bide.tool(timeout=60.0)
    def charge(cents: int) -> str:
        """Charge."""
        fired.append(cents)
        raise Crash

    def agent() -> bide.Agent:
        model = ScriptedModel([call("charge", cents=1), reply("ok")])
        return bide.Agent(model, store=store, tools=[charge], clock=lambda: now[0])

    with pytest.raises(Crash):
        agent().run_sync("h", "pay")
    assert bide.run_status(store, "h").status == "halted"
    bide.cancel_run(store, "h", reason="give up", clock=lambda: now[0])
    report = asyncio.run(bide.Worker(store, agent()).run_once())
    assert (report.completed, report.waiting) == (0, 1), report
    assert bide.run_status(store, "h").status == "halted"  # not ended: the call may still be running
    with pytest.raises(bide.RunInFlight, match=r"to cancel, but its call 'c0.0' \(charge\) may still be"):
        agent().run_sync("h", "pay")
    now[0] += 62.0  # past the call's deadline and the clock skew: it cannot be running any more
    report = asyncio.run(bide.Worker(store, agent()).run_once())
    assert (report.completed, report.cancelled) == (0, 1)
    status = bide.run_status(store, "h")
    assert status.status == "cancelled" and status.answer is not None
    assert status.answer.startswith("Cancelled: give up Call c0.0 (charge {\"cents\":1}) was attempted at")
    assert "its outcome was never recorded: it fired zero times or once" in status.answer
    assert fired == [1]


def test_a_cancel_waits_for_a_call_of_any_turn_and_asks_its_reconciler(store: bide.Store) -> None:
    """A resumed drive replays a run from its first turn and looked for calls in doubt in that turn only: a
    call of a later turn (after a lookup, say) was left behind by a run ended at once. Past the call's
    deadline, its reconciler decides it, as without the cancel (the answer said its outcome was never
    recorded, and none was)."""

    class Crash(BaseException):
        pass

    now = [time.time()]

    @bide.tool(safety=bide.ReadOnly)
    def look() -> str:
        """Look."""
        return "seen"

    @bide.tool(timeout=60.0, reconcile=lambda info: bide.Outcome.succeeded("charged (reconciled)"))
    def charge(cents: int) -> str:
        """Charge."""
        raise Crash

    def agent() -> bide.Agent:
        model = ScriptedModel([call("look"), call("charge", cents=1), reply("ok")])
        return bide.Agent(model, store=store, tools=[look, charge], clock=lambda: now[0])

    with pytest.raises(Crash):
        agent().run_sync("t", "pay")
    bide.cancel_run(store, "t", reason="stop", clock=lambda: now[0])
    with pytest.raises(bide.RunInFlight, match=r"its call 'c1.0' \(charge\) may still be running"):
        agent().run_sync("t", "pay")
    now[0] += 62.0
    result = agent().run_sync("t", "pay")
    assert (result.status, result.answer) == ("cancelled", "Cancelled: stop")
    recorded = bide.Journal(store, "t").load().get("result:c1.0")
    assert isinstance(recorded, bide.ToolResult) and recorded.result == "charged (reconciled)"


def test_a_reconciler_that_returns_no_outcome_does_not_keep_a_cancelled_run_from_ending(
    store: bide.Store,
) -> None:
    """Every drive raised the reconciler's ConfigError: the run could never end, cancelled or not."""

    class Crash(BaseException):
        pass

    now = [time.time()]

    @bide.tool(timeout=10.0, reconcile=lambda info: "yes")
    def charge(cents: int) -> str:
        """Charge."""
        raise Crash

    def agent() -> bide.Agent:
        model = ScriptedModel([call("charge", cents=1), reply("ok")])
        return bide.Agent(model, store=store, tools=[charge], clock=lambda: now[0])

    with pytest.raises(Crash):
        agent().run_sync("b", "pay")
    bide.cancel_run(store, "b", reason="stop", clock=lambda: now[0])
    now[0] += 100.0
    result = agent().run_sync("b", "pay")
    assert result.status == "cancelled" and "Call c0.0 (charge" in result.answer


def test_a_cancel_journals_a_result_this_process_knows(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool returned but its result's write failed: this process knows the result (the next drive
    journals it), and a cancel waited out the call's whole deadline, then said its outcome was unknown."""
    now = [time.time()]
    fired: list[int] = []

    @bide.tool(timeout=60.0)
    def charge(cents: int) -> str:
        """Charge."""
        fired.append(cents)
        return "charged"

    def agent() -> bide.Agent:
        model = ScriptedModel([call("charge", cents=1), reply("ok")])
        return bide.Agent(model, store=store, tools=[charge], clock=lambda: now[0])

    real = bide.Journal.awrite_one
    failing = [True]

    async def flaky(self: bide.Journal, record: Any) -> Any:
        if failing[0] and str(getattr(record, "key", "")).startswith("result:"):
            failing[0] = False
            raise bide.StoreError("simulated: the store failed at the result's write")
        return await real(self, record)

    monkeypatch.setattr(bide.Journal, "awrite_one", flaky)
    with pytest.raises(bide.BideError):
        agent().run_sync("k", "pay")
    assert not failing[0], "the result's write was not the one that failed"
    bide.cancel_run(store, "k", reason="stop", clock=lambda: now[0])
    result = agent().run_sync("k", "pay")  # within the call's deadline: nothing to wait for
    assert (result.status, result.answer) == ("cancelled", "Cancelled: stop")
    recorded = bide.Journal(store, "k").load().get("result:c0.0")
    assert isinstance(recorded, bide.ToolResult) and recorded.result == "charged"
    assert fired == [1]


def test_a_cancelled_run_whose_call_was_resolved_ends_with_its_result(store: bide.Store) -> None:
    """Resolved while the cancel waited, the call's result is journaled and the answer names no doubt."""

    class Crash(BaseException):
        pass

    @bide.tool(timeout=60.0)
    def charge(cents: int) -> str:
        """Charge."""
        raise Crash

    agent = bide.Agent(ScriptedModel([call("charge", cents=1), reply("ok")]), store=store, tools=[charge])
    with pytest.raises(Crash):
        agent.run_sync("h", "pay")
    bide.cancel_run(store, "h", reason="give up")
    late = time.time() + 62.0
    bide.resolve_halt(store, "h", "c0.0", outcome=bide.Outcome.succeeded("charged"), clock=lambda: late)
    result = agent.run_sync("h", "pay")
    assert (result.status, result.answer) == ("cancelled", "Cancelled: give up")


def _bide(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bide._cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=os.environ)


@pytest.mark.slow
def test_cancel_from_another_process_reaches_a_live_drive(durable_store_spec: tuple[str, str]) -> None:
    url, prefix = durable_store_spec
    child = subprocess.Popen(
        [sys.executable, str(HERE / "cancel_child.py"), url, prefix, "live"],
        stdout=subprocess.PIPE, text=True, env=os.environ,
    )  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == "started"
    time.sleep(0.3)
    done = _bide("cancel", "--store", url, "--table-prefix", prefix, "live", "--reason", "operator")
    assert done.returncode == 0, done.stderr
    assert "cancel requested" in done.stdout
    outcome = json.loads(child.stdout.readline())
    assert child.wait(timeout=60) == 0
    assert outcome["status"] == "cancelled" and outcome["answer"] == "Cancelled: operator"
    # It stopped at a turn boundary, long before the script's end (300 turns of 0.1 s: time enough for a
    # loaded machine to start the `bide cancel` process).
    assert outcome["turns"] < 300
    again = _bide("cancel", "--store", url, "--table-prefix", prefix, "live")
    assert again.returncode == 5 and "already ended" in again.stderr
    missing = _bide("cancel", "--store", url, "--table-prefix", prefix, "nobody")
    assert missing.returncode == 4 and "does not exist" in missing.stderr


def test_bide_cancel_tells_a_worker_that_parked_the_run(durable_store_spec: tuple[str, str]) -> None:
    """`bide cancel` takes and frees the run's lease once its request is recorded, as `bide.cancel_run`
    does: a worker that parked the halted run (it waits for a person) ends it at its next pass, not at its
    recheck 30 s later."""

    @bide.tool(timeout=30)
    async def charge(cents: int) -> str:
        """Charge (its outcome is lost)."""
        raise ConnectionResetError("lost after sending")

    url, prefix = durable_store_spec
    store = bide.open_store(url, table_prefix=prefix)
    try:
        # The call is attempted a minute ago: by the time of the cancel, its deadline has passed (a cancel
        # never ends a run while its call may still be running).
        offset = [-60.0]
        agent = bide.Agent(
            ScriptedModel([call("charge", cents=1), reply("ok")]), store=store, tools=[charge],
            clock=lambda: time.time() + offset[0],
        )  # fmt: skip
        with pytest.raises(bide.OutcomeUnknown):
            agent.run_sync("h", "pay")
        worker = bide.Worker(store, agent)
        assert asyncio.run(worker.run_once()).halted == 1  # parked: it waits for a person
        assert asyncio.run(worker.run_once()).driven == 0
        offset[0] = 0.0
        done = _bide("cancel", "--store", url, "--table-prefix", prefix, "h", "--reason", "give up")
        assert done.returncode == 0, done.stderr
        assert asyncio.run(worker.run_once()).cancelled == 1
        assert bide.run_status(store, "h").status == "cancelled"
    finally:
        store.close()


@pytest.mark.slow
def test_a_worker_never_ends_a_cancelled_run_under_a_paused_driver_still_in_its_call(
    durable_store_spec: tuple[str, str],
) -> None:
    """A driver paused inside a side effect, past its lease; a cancel; a worker's pass. The worker ended
    the run as cancelled at once, and the driver, woken, charged after it. Now the pass leaves the run
    (the call may still be running until its deadline, 6 s, plus the clock skew); once the deadline has
    passed, a pass ends it, naming the call whose outcome was never recorded. It fired once, in the driver."""
    url, prefix = durable_store_spec
    child = subprocess.Popen(
        [sys.executable, str(HERE / "cancel_paused_child.py"), url, prefix, "woken"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "CHARGE_TIMEOUT": "6"},
    )  # fmt: skip
    fired: list[int] = []

    @bide.tool(timeout=6)
    def charge(cents: int) -> str:
        """Charge a card (never here: the call is the paused driver's)."""
        fired.append(cents)
        return "charged"

    store = bide.open_store(url, table_prefix=prefix)
    model = ScriptedModel([call("charge", cents=500), reply("charged")])
    agent = bide.Agent(model, store=store, tools=[charge])
    try:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "fired"
            attempted = time.time()
            wait_until_paused(child.pid)
            time.sleep(2.5)  # its lease (1 s) has expired, past the clock skew margin
            assert bide.cancel_run(store, "woken", reason="stop")
            report = asyncio.run(bide.Worker(store, agent).run_once())
            assert (report.completed, report.waiting) == (0, 1), report
            assert bide.run_status(store, "woken").status != "cancelled"
        finally:
            os.kill(child.pid, signal.SIGCONT)
        assert child.wait(timeout=60) == 0  # its drive ends (its late write refused, or the run ended)
        time.sleep(max(0.0, attempted + 6 + 1 + 0.5 - time.time()))  # past the deadline and the skew
        asyncio.run(bide.Worker(store, agent).run_once())
        status = bide.run_status(store, "woken")
        assert status.status == "cancelled" and status.answer is not None
        journal = bide.Journal(store, "woken").load()
        results = [r for r in journal.records() if isinstance(r, bide.ToolResult)]
        if results:  # the woken driver journaled its result before the worker's pass took the lease
            assert results[0].result == "charged 500" and status.answer == "Cancelled: stop"
        else:
            assert "Call c0.0 (charge" in status.answer and "outcome was never recorded" in status.answer
        assert fired == []
    finally:
        store.close()


@pytest.mark.slow
def test_a_cancel_never_fences_out_a_paused_driver(durable_store_spec: tuple[str, str]) -> None:
    """A driver paused inside a side effect past its lease (1 s) and the clock skew margin (1 s) wakes up
    after `bide cancel` recorded its request: it journals the effect's result and ends the run cancelled.
    The cancel used to take the expired lease to tell workers, which fenced the driver out: its result was
    refused, and the run was left with an attempt and no result, for a person to resolve, although the
    effect had completed and nobody else drove the run."""
    url, prefix = durable_store_spec
    child = subprocess.Popen(
        [sys.executable, str(HERE / "cancel_paused_child.py"), url, prefix, "paused"],
        stdout=subprocess.PIPE, text=True, env=os.environ,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "fired"
        wait_until_paused(child.pid)
        time.sleep(2.5)  # its lease has expired, past the clock skew margin
        done = _bide("cancel", "--store", url, "--table-prefix", prefix, "paused", "--reason", "stop")
        assert done.returncode == 0, done.stderr
    finally:
        os.kill(child.pid, signal.SIGCONT)
    outcome = json.loads(child.stdout.readline())
    assert child.wait(timeout=60) == 0
    assert outcome == {"status": "cancelled", "answer": "Cancelled: stop"}
    store = bide.open_store(url, table_prefix=prefix)
    try:
        journal = bide.Journal(store, "paused").load()
        [result] = [r for r in journal.records() if isinstance(r, bide.ToolResult)]
        assert result.result == "charged 500" and not result.is_error
    finally:
        store.close()
