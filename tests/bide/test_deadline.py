"""Tool-call deadlines (bide._deadline): asyncio.timeout's behaviour with one timer per event loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bide._deadline import _Deadlines, _deadlines, ended_by_deadline, run_with_deadline

SHORT = 0.02  # a deadline that passes while the test waits
LONG = 60.0  # a deadline that never passes during a test


async def _hang() -> None:
    await asyncio.Event().wait()


async def _value(v: Any) -> Any:
    return v


async def _swallow() -> str:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        return "swallowed"
    return "woken"


def test_a_call_past_its_deadline_raises_timeout_error_and_leaves_the_task_uncancelled() -> None:
    async def main() -> int:
        with pytest.raises(TimeoutError):
            await run_with_deadline(_hang(), SHORT)
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0)  # a leftover cancellation would be delivered here
        return task.cancelling()

    assert asyncio.run(main()) == 0


def test_a_call_within_its_deadline_returns_its_value() -> None:
    assert asyncio.run(run_with_deadline(_value(7), LONG)) == 7


def test_an_outside_cancellation_propagates_as_cancelled_error() -> None:
    async def main() -> None:
        task = asyncio.create_task(run_with_deadline(_hang(), LONG))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(main())


def test_an_outside_cancellation_after_the_deadline_is_not_turned_into_a_timeout() -> None:
    async def slow_cleanup() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(LONG)  # the deadline cancelled us; cleaning up takes a while
            raise

    async def main() -> None:
        task = asyncio.create_task(run_with_deadline(slow_cleanup(), SHORT))
        await asyncio.sleep(SHORT * 3)  # the deadline has passed: the call is in its cleanup
        assert not task.done()
        task.cancel()  # and now someone else cancels it too
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(main())


def test_a_call_that_swallows_the_cancellation_keeps_its_result() -> None:
    async def main() -> tuple[str, int]:
        value = await run_with_deadline(_swallow(), SHORT)
        task = asyncio.current_task()
        assert task is not None
        return value, task.cancelling()

    assert asyncio.run(main()) == ("swallowed", 0)


def test_an_earlier_deadline_rearms_the_shared_timer() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        long_call = asyncio.create_task(run_with_deadline(_hang(), LONG))
        await asyncio.sleep(0)
        start = loop.time()
        with pytest.raises(TimeoutError):
            await run_with_deadline(_hang(), SHORT)
        long_call.cancel()
        return loop.time() - start

    assert asyncio.run(main()) < LONG / 10


def test_finished_calls_do_not_pile_up_and_one_timer_serves_every_call() -> None:
    async def main() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        scheduled_before = len(loop._scheduled)  # type: ignore[attr-defined]
        for i in range(5000):
            assert await run_with_deadline(_value(i), LONG) == i
        deadlines = _deadlines(loop)
        return len(deadlines.heap), len(loop._scheduled) - scheduled_before, len(deadlines.running)  # type: ignore[attr-defined]

    heap, timers, running = asyncio.run(main())
    assert running == 0
    assert heap <= _Deadlines._SLACK + 1
    assert timers <= 1


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.sampled_from(["finish", "hang", "swallow", "finish-late-deadline"]),
        min_size=1,
        max_size=30,
    )
)
def test_many_calls_at_once_each_get_their_own_outcome(kinds: list[str]) -> None:
    """Whatever mix runs at once in one loop, each call's outcome is asyncio.timeout's outcome for it."""

    async def one(i: int, kind: str) -> Any:
        if kind == "finish":
            return await run_with_deadline(_value(i), SHORT * 50)
        if kind == "finish-late-deadline":
            return await run_with_deadline(_value(i), LONG)
        if kind == "hang":
            return await run_with_deadline(_hang(), SHORT)
        return await run_with_deadline(_swallow(), SHORT)

    async def main() -> list[Any]:
        return await asyncio.gather(*(one(i, k) for i, k in enumerate(kinds)), return_exceptions=True)

    outcomes = asyncio.run(main())
    for i, (kind, got) in enumerate(zip(kinds, outcomes, strict=True)):
        if kind.startswith("finish"):
            assert got == i
        elif kind == "hang":
            assert isinstance(got, TimeoutError)
        else:
            assert got == "swallowed"


def test_a_tool_tells_its_own_deadline_from_its_callers_cancellation() -> None:
    """govern's event tool, whose append goes on in a thread, reports a call its deadline ended as in doubt
    and lets a caller's cancellation through; it told the two apart by the time left (a margin before the
    timeout), which a cancellation in that margin, or a pause before the tool's first step, defeated. The
    deadline's cancellation carries its own message."""
    seen: list[bool] = []

    async def tool() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError as exc:
            seen.append(ended_by_deadline(exc))
            raise

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await run_with_deadline(tool(), 0.01)
        cancelled = asyncio.ensure_future(run_with_deadline(tool(), 10))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled

    asyncio.run(main())
    assert seen == [True, False]
