"""A tool that cancels a task of its own and awaits it. The `CancelledError` it lets out (or that a library
inside it lets out) is its own error, not a cancellation of the call: before, it came out of
`await agent.run(...)` as a bare `CancelledError` to a caller no one had cancelled (which `asyncio.gather`,
a TaskGroup or `asyncio.run` take for the caller's own cancellation), with the attempt marker left
without a result. A side effect's call started and may have acted: its outcome is unknown and the drive
halts, as for any other exception the tool raises; a retry-safe tool's error goes back to the model.

A tool that catches that `CancelledError` and goes on working was closed a second later, as if it had
swallowed its call's cancellation: so was one whose own inner timeout had fired."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import json
import time
from typing import Any

import pytest

import bide
from bide._tools import _CLEANUP_GRACE
from bide.testing import Call, ScriptedModel, Turn, call, reply

HANG = 3600.0


async def _cancelled_child() -> asyncio.Task[None]:
    child = asyncio.create_task(asyncio.sleep(HANG))
    await asyncio.sleep(0)  # the child is running
    child.cancel()
    return child


def lets_out(fired: list[str]) -> Any:
    async def charge(cents: int) -> str:
        """Charge a card."""
        fired.append("charge")  # the request went out
        child = await _cancelled_child()
        await child  # its CancelledError is not caught
        return "charged"

    return charge


def journaled_result(store: bide.Store, run_id: str = "r") -> dict[str, Any]:
    """The result record of the run's first call, as journaled."""
    [entry] = [e for e in store.load(run_id) if e.key == "result:c0.0"]
    record: dict[str, Any] = json.loads(entry.data)
    return record


def drive(agent: bide.Agent, run_id: str = "r") -> Any:
    """`agent.run` under `asyncio.run`: what it returned, or the exception it raised (a CancelledError
    included, which the caller of a drive it never cancelled must never see)."""

    async def main() -> Any:
        try:
            return await agent.run(run_id, "go")
        except BaseException as exc:  # the test looks at whatever ended the drive
            return exc

    return asyncio.run(main())


@pytest.mark.parametrize("store_url", ["memory://", "sqlite"])
def test_a_side_effect_that_lets_its_childs_cancellation_out_halts_as_unknown(
    store_url: str, tmp_path: Any
) -> None:
    fired: list[str] = []
    url = f"sqlite:///{tmp_path / 'runs.db'}" if store_url == "sqlite" else store_url
    store = bide.open_store(url)
    tool = bide.Tool.from_function(lets_out(fired), timeout=0.5)  # resolve_halt waits for its deadline
    # No skew margin (one machine), as the resolution below is given: it waits at least the driver's.
    agent = bide.Agent(
        ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool], clock_skew=0
    )
    ended = drive(agent)
    assert isinstance(ended, bide.OutcomeUnknown), repr(ended)
    assert "CancelledError" in ended.cause and "nothing cancelled" in ended.cause
    assert ended.call_id == "c0.0" and ended.attempt == 0
    assert [e.key for e in store.load("r")][-1] == "attempt:c0.0:0"  # started: never voided
    # The next drive halts on the marker, and the effect does not fire again.
    again = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    halted = drive(again)
    assert isinstance(halted, bide.OutcomeUnknown) and "zero times or once" in str(halted)
    assert fired == ["charge"]
    # A person's resolution is taken once the call's deadline passed, and the run goes on.
    time.sleep(max(0.0, ended.deadline - time.time()) + 0.05)
    bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.failed("never charged"), clock_skew=0.0)
    resumed = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    assert resumed.run_sync("r", "go").output == "done"
    assert fired == ["charge"]
    store.close()


def test_a_stray_cancellation_is_not_voided_nor_retried_whatever_the_tool_declares() -> None:
    fired: list[str] = []
    tool = bide.Tool.from_function(
        lets_out(fired),
        timeout=30,
        not_started=(RuntimeError, ConnectionError),
        retry=bide.RetryPolicy(attempts=3, initial=0.01),
    )
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    assert isinstance(drive(agent), bide.OutcomeUnknown)
    assert fired == ["charge"]
    assert [e.key for e in store.load("r")][-1] == "attempt:c0.0:0"


@pytest.mark.parametrize("safety", [bide.ReadOnly, bide.Idempotent])
def test_a_retry_safe_tool_that_lets_its_childs_cancellation_out_fails_for_the_model(safety: Any) -> None:
    fired: list[str] = []
    tool = bide.Tool.from_function(lets_out(fired), timeout=30, safety=safety)
    model = ScriptedModel([call("charge", cents=5), reply("done")])
    store = bide.open_store("memory://")
    agent = bide.Agent(model, store=store, tools=[tool])
    ended = drive(agent)
    assert isinstance(ended, bide.RunResult) and ended.output == "done", repr(ended)
    result = journaled_result(store)
    assert result["is_error"] and "CancelledError" in result["result"]
    assert fired == ["charge"]


def test_parallel_calls_in_a_gather_are_not_taken_for_the_callers_cancellation() -> None:
    """Two drives in one `asyncio.gather`: the stray cancellation of one does not cancel the other."""
    fired: list[str] = []
    store = bide.open_store("memory://")

    async def slow(cents: int) -> str:
        """Charge a card, slowly."""
        await asyncio.sleep(0.2)
        return "charged"

    tools = [bide.Tool.from_function(lets_out(fired), timeout=30), bide.Tool.from_function(slow, timeout=30)]

    async def main() -> list[Any]:
        one = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=tools)
        two = bide.Agent(ScriptedModel([call("slow", cents=5), reply("done")]), store=store, tools=tools)
        return await asyncio.gather(one.run("a", "go"), two.run("b", "go"), return_exceptions=True)

    first, second = asyncio.run(main())
    assert isinstance(first, bide.OutcomeUnknown), repr(first)
    assert isinstance(second, bide.RunResult) and second.output == "done", repr(second)


def test_the_callers_cancellation_during_such_a_tool_still_cancels_the_drive() -> None:
    """The caller cancels the drive while the tool awaits its cancelled child: that is the caller's
    cancellation, and the drive ends in CancelledError (the call's outcome is unknown to the next drive)."""
    fired: list[str] = []
    reached = asyncio.Event()

    async def charge(cents: int) -> str:
        """Charge a card."""
        fired.append("charge")
        child = asyncio.create_task(asyncio.sleep(HANG))
        reached.set()
        try:
            await child  # the caller's cancellation cancels the child too
        finally:
            child.cancel()
        return "charged"

    store = bide.open_store("memory://")
    tool = bide.Tool.from_function(charge, timeout=30)

    async def main() -> Any:
        agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
        running = asyncio.ensure_future(agent.run("r", "go"))
        await reached.wait()
        running.cancel()
        try:
            return await running
        except BaseException as exc:  # the test looks at whatever ended the drive
            return exc

    ended = asyncio.run(main())
    assert isinstance(ended, asyncio.CancelledError), repr(ended)
    again = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    assert isinstance(drive(again), bide.OutcomeUnknown)
    assert fired == ["charge"]


def test_the_deadline_passing_while_the_tool_awaits_its_child_is_a_timeout() -> None:
    fired: list[str] = []

    async def charge(cents: int) -> str:
        """Charge a card."""
        fired.append("charge")
        await asyncio.create_task(asyncio.sleep(HANG))  # the deadline cancels the child with the call
        return "charged"

    store = bide.open_store("memory://")
    tool = bide.Tool.from_function(charge, timeout=0.2)
    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    ended = drive(agent)
    assert isinstance(ended, bide.OutcomeUnknown) and "timed out after 0.2s" in str(ended), repr(ended)
    assert fired == ["charge"]


@pytest.mark.parametrize("safety", [bide.SideEffect, bide.ReadOnly])
def test_a_tool_that_catches_its_childs_cancellation_and_goes_on_is_not_closed(safety: Any) -> None:
    """Catching the CancelledError of a task it cancelled is what asyncio asks of a tool: it was not
    cancelled, and may go on past the clean-up grace (it was closed there, and halted as timed out)."""
    work = _CLEANUP_GRACE + 0.5

    async def charge(cents: int) -> str:
        """Charge a card."""
        child = await _cancelled_child()
        with contextlib.suppress(asyncio.CancelledError):
            await child
        await asyncio.sleep(work)
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=30, safety=safety)
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    started = time.monotonic()
    ended = drive(agent)
    assert isinstance(ended, bide.RunResult), repr(ended)
    assert time.monotonic() - started >= work
    assert journaled_result(store)["result"] == "charged"


@pytest.mark.parametrize("safety", [bide.SideEffect, bide.ReadOnly])
def test_a_tool_whose_own_inner_timeout_fired_and_goes_on_is_not_closed(safety: Any) -> None:
    """Its own `asyncio.timeout` cancelled it, and took that back: it was not cancelled either."""
    work = _CLEANUP_GRACE + 0.5

    async def charge(cents: int) -> str:
        """Charge a card."""
        try:
            async with asyncio.timeout(0.05):  # the first host does not answer
                await asyncio.sleep(HANG)
        except TimeoutError:
            await asyncio.sleep(work)  # the second one does, slowly
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=30, safety=safety)
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    ended = drive(agent)
    assert isinstance(ended, bide.RunResult), repr(ended)
    assert journaled_result(store)["result"] == "charged"


def _cancelled_future_result() -> None:
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.cancel()
    future.result()  # concurrent.futures.CancelledError


def _asyncio_cancelled() -> None:
    raise asyncio.CancelledError  # a sync function that ran an event loop of its own, say


@pytest.mark.parametrize("raises", [_cancelled_future_result, _asyncio_cancelled])
@pytest.mark.parametrize("safety", [bide.SideEffect, bide.ReadOnly])
def test_a_synchronous_tool_that_raises_a_cancelled_error_does_not_cancel_the_drive(
    raises: Any, safety: Any
) -> None:
    """Raised in the tool's thread, either CancelledError came out of the thread's future as asyncio's, and
    so out of the drive."""
    fired: list[str] = []

    def charge(cents: int) -> str:
        """Charge a card."""
        fired.append("charge")
        raises()
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=30, safety=safety)
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("done")]), store=store, tools=[tool])
    ended = drive(agent)
    if safety is bide.SideEffect:
        assert isinstance(ended, bide.OutcomeUnknown), repr(ended)
        assert "CancelledError" in ended.cause
        assert [e.key for e in store.load("r")][-1] == "attempt:c0.0:0"
        again = bide.Agent(ScriptedModel([call("charge", cents=5)]), store=store, tools=[tool])
        assert isinstance(drive(again), bide.OutcomeUnknown)
    else:
        assert isinstance(ended, bide.RunResult) and ended.output == "done", repr(ended)
        assert journaled_result(store)["is_error"]
    assert fired == ["charge"]


# A tool's own asyncio.TaskGroup cancels the tool's task when a child fails (and on Python 3.11 and 3.12
# may leave that cancellation counted after the group ended). Before, that was taken for the caller's
# cancellation: the tool was closed a second later (a CancelledError to a caller that cancelled nothing),
# and a NotCalled it raised afterwards was turned into a CancelledError. Async tools now run in a task of
# their own, and only a cancellation of the task awaiting it (the caller's, the deadline's) is from outside.


async def _fails_soon() -> None:
    await asyncio.sleep(0.02)
    raise ConnectionError("primary down")


@pytest.mark.parametrize("safety", [bide.ReadOnly, bide.SideEffect])
def test_a_task_group_whose_child_failed_then_a_slow_fallback_completes(safety: Any) -> None:
    fired: list[str] = []

    async def lookup(n: int) -> str:
        """Look up, falling back to a slower source."""
        fired.append("lookup")
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(asyncio.sleep(HANG))
                group.create_task(_fails_soon())
        except* ConnectionError:
            pass
        await asyncio.sleep(_CLEANUP_GRACE + 0.3)  # longer than the grace a cancelled call has
        return "from fallback"

    store = bide.open_store("memory://")
    tool = bide.Tool.from_function(lookup, timeout=30, safety=safety)
    ended = drive(bide.Agent(ScriptedModel([call("lookup", n=1), reply("done")]), store=store, tools=[tool]))
    assert isinstance(ended, bide.RunResult) and ended.output == "done", repr(ended)
    assert journaled_result(store)["result"] == "from fallback"
    assert fired == ["lookup"]


def test_a_task_group_whose_sibling_cleans_up_slowly_ends_in_the_tools_own_error() -> None:
    fired: list[str] = []

    async def slow_to_close() -> None:
        try:
            await asyncio.sleep(HANG)
        finally:
            await asyncio.sleep(_CLEANUP_GRACE + 0.3)  # closing a connection, say

    async def charge(n: int) -> str:
        """Charge, asking two services at once."""
        fired.append("charge")
        async with asyncio.TaskGroup() as group:
            group.create_task(slow_to_close())
            group.create_task(_fails_soon())
        return "charged"

    store = bide.open_store("memory://")
    tool = bide.Tool.from_function(charge, timeout=30)
    ended = drive(bide.Agent(ScriptedModel([call("charge", n=1), reply("done")]), store=store, tools=[tool]))
    assert isinstance(ended, bide.OutcomeUnknown), repr(ended)
    assert "ExceptionGroup" in ended.cause
    assert fired == ["charge"]


def test_not_called_after_a_task_group_failed_voids_the_attempt() -> None:
    tries: list[int] = []

    async def order(n: int) -> str:
        """Order, after an inventory lookup."""
        tries.append(n)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(asyncio.sleep(HANG))
                group.create_task(_fails_soon())
        except* ConnectionError:
            raise bide.NotCalled("inventory lookup failed before anything was sent") from None
        return "ordered"

    store = bide.open_store("memory://")
    tool = bide.Tool.from_function(order, timeout=30)
    ended = drive(bide.Agent(ScriptedModel([call("order", n=1), reply("done")]), store=store, tools=[tool]))
    assert isinstance(ended, bide.ToolNotStarted), repr(ended)
    assert [e.key for e in store.load("r")][-2:] == ["attempt:c0.0:0", "not-started:c0.0:0"]


@pytest.mark.parametrize("safety", [bide.ReadOnly, bide.SideEffect])
def test_a_future_shared_with_a_call_whose_deadline_passed_is_not_this_calls_deadline(safety: Any) -> None:
    """Two calls of one turn await one future (a single-flight cache); the quick call's deadline cancels
    it, with bide's deadline message. The other call's deadline has not passed, and nobody cancelled the
    drive: the CancelledError it gets is its own error."""
    shared: dict[str, asyncio.Future[str]] = {}

    def token() -> asyncio.Future[str]:
        if "token" not in shared:
            shared["token"] = asyncio.get_running_loop().create_future()  # the refresh hangs
        return shared["token"]

    async def quick(n: int) -> str:
        """Quick."""
        return await token()

    async def slow(n: int) -> str:
        """Slow."""
        return await token()

    tools = [
        bide.Tool.from_function(quick, timeout=0.3, safety=bide.ReadOnly),
        bide.Tool.from_function(slow, timeout=30, safety=safety),
    ]
    turn = Turn(calls=(Call("quick", {"n": 1}), Call("slow", {"n": 2})))
    store = bide.open_store("memory://")
    ended = drive(bide.Agent(ScriptedModel([turn, reply("done")]), store=store, tools=tools))
    if safety is bide.SideEffect:
        assert isinstance(ended, bide.OutcomeUnknown) and "CancelledError" in ended.cause, repr(ended)
    else:
        assert isinstance(ended, bide.RunResult) and ended.output == "done", repr(ended)
        [entry] = [e for e in store.load("r") if e.key == "result:c0.1"]
        assert "CancelledError" in json.loads(entry.data)["result"]


# The other way round: the caller cancelled the drive, and a retry-safe tool swallowed it (returned, or
# turned it into an error of its own, as client libraries do). Before, that error or value went to the
# model and the drive went on: its next side effect fired after the caller had cancelled, and the caller
# never got its CancelledError (or its asyncio.timeout's TimeoutError).


def _search_that(behaves: str) -> Any:
    async def search(q: str) -> str:
        """Search."""
        try:
            await asyncio.sleep(HANG)
        except asyncio.CancelledError as exc:
            if behaves == "wraps":
                raise RuntimeError("search aborted") from exc
            return "partial hits"
        return "hits"

    return search


@pytest.mark.parametrize("behaves", ["wraps", "returns"])
@pytest.mark.parametrize("same_turn", [False, True])
@pytest.mark.parametrize("by", ["cancel", "timeout"])
def test_a_cancellation_a_retry_safe_tool_swallowed_still_stops_the_drive(
    behaves: str, same_turn: bool, by: str
) -> None:
    charged: list[int] = []

    async def charge(cents: int) -> str:
        """Charge a card."""
        charged.append(cents)
        return "charged"

    tools = [
        bide.Tool.from_function(_search_that(behaves), timeout=30, safety=bide.ReadOnly),
        bide.Tool.from_function(charge, timeout=30),
    ]
    if same_turn:
        both = Turn(calls=(Call("search", {"q": "x"}), Call("charge", {"cents": 5})))
        script: list[Any] = [both, reply("done")]
    else:
        script = [call("search", q="x"), call("charge", cents=5), reply("done")]
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel(script), store=store, tools=tools, max_parallel=1)

    async def main() -> BaseException | None:
        try:
            if by == "cancel":
                task = asyncio.ensure_future(agent.run("r", "go"))
                await asyncio.sleep(0.1)
                task.cancel()
                await task
            else:
                async with asyncio.timeout(0.1):
                    await agent.run("r", "go")
        except BaseException as exc:  # the test looks at what ended the drive
            return exc
        return None

    ended = asyncio.run(main())
    expected = asyncio.CancelledError if by == "cancel" else TimeoutError
    assert isinstance(ended, expected), repr(ended)
    assert charged == []
    assert "result:c0.0" in [e.key for e in store.load("r")]  # what the tool did is journaled
    # The next drive goes on from there: the search is not run again, the charge fires once.
    again = bide.Agent(ScriptedModel(script), store=store, tools=tools, max_parallel=1)
    assert again.run_sync("r", "go").output == "done"
    assert charged == [5]


class _LeakyModel(ScriptedModel):
    """A model whose client, like an asyncio.TaskGroup on Python 3.11 and 3.12 whose child failed after the
    group's body ended, leaves a cancellation of the drive's task counted that nobody asked for."""

    async def complete(self, request: bide.ModelRequest) -> bide.AssistantMessage:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)  # taken, never given back with uncancel()
        return await super().complete(request)


def test_a_cancellation_counted_by_something_else_than_a_tool_does_not_stop_the_drive() -> None:
    charged: list[int] = []

    async def charge(cents: int) -> str:
        """Charge a card."""
        charged.append(cents)
        return "charged"

    store = bide.open_store("memory://")
    model = _LeakyModel([call("charge", cents=5), reply("done")])
    agent = bide.Agent(model, store=store, tools=[bide.Tool.from_function(charge, timeout=30)])
    ended = drive(agent)
    assert isinstance(ended, bide.RunResult) and ended.output == "done", repr(ended)
    assert charged == [5]


def _cancel_soon(agent: bide.Agent) -> BaseException | None:
    """Drive run "r" and cancel the drive 0.1 s in: what ended it."""

    async def main() -> BaseException | None:
        task = asyncio.ensure_future(agent.run("r", "go"))
        await asyncio.sleep(0.1)
        task.cancel()
        try:
            await task
        except BaseException as exc:  # the test looks at what ended the drive
            return exc
        return None

    return asyncio.run(main())


def test_a_retry_policy_does_not_try_again_after_the_caller_cancelled() -> None:
    tries: list[int] = []

    async def fetch(q: str) -> str:
        """Fetch, through a client that turns a cancellation into a reset."""
        tries.append(1)
        try:
            await asyncio.sleep(HANG)
        except asyncio.CancelledError as exc:
            raise ConnectionResetError("reset") from exc
        return "fetched"

    tool = bide.Tool.from_function(
        fetch, timeout=30, safety=bide.ReadOnly, retry=bide.RetryPolicy(attempts=4, initial=0.01)
    )
    store = bide.open_store("memory://")
    model = ScriptedModel([call("fetch", q="x"), reply("done")])
    ended = _cancel_soon(bide.Agent(model, store=store, tools=[tool]))
    assert isinstance(ended, asyncio.CancelledError), repr(ended)
    assert tries == [1]


def test_a_call_in_doubt_after_the_callers_cancellation_is_that_cancellation() -> None:
    async def post(q: str) -> str:
        """Post, through a client that cannot tell whether a cancelled request went through."""
        try:
            await asyncio.sleep(HANG)
        except asyncio.CancelledError as exc:
            raise bide.CallInDoubt("the request may have been sent") from exc
        return "posted"

    tool = bide.Tool.from_function(post, timeout=30, safety=bide.Idempotent)
    store = bide.open_store("memory://")
    model = ScriptedModel([call("post", q="x"), reply("done")])
    ended = _cancel_soon(bide.Agent(model, store=store, tools=[tool]))
    assert isinstance(ended, asyncio.CancelledError), repr(ended)


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def test_an_async_tool_runs_in_a_task_named_as_the_drives_and_sees_the_callers_context() -> None:
    seen: list[tuple[str, str, bool]] = []

    async def look(q: str) -> str:
        """Look."""
        task = asyncio.current_task()
        assert task is not None
        seen.append((task.get_name(), REQUEST_ID.get(), task is drive_task[0]))
        REQUEST_ID.set("set by the tool")  # stays in its call
        return "seen"

    drive_task: list[asyncio.Task[Any] | None] = [None]
    agent = bide.Agent(
        ScriptedModel([call("look", q="x"), reply("done")]),
        store=bide.open_store("memory://"),
        tools=[bide.Tool.from_function(look, timeout=30, safety=bide.ReadOnly)],
    )

    async def main() -> str:
        drive_task[0] = asyncio.current_task()
        REQUEST_ID.set("req-7")
        await agent.run("r", "go")
        return REQUEST_ID.get()

    async def named() -> str:
        return await asyncio.create_task(main(), name="request-7")

    assert asyncio.run(named()) == "req-7"
    assert seen == [("request-7", "req-7", False)]
