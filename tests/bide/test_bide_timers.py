"""Durable timers (`bide.timer`): the wake-up time is journaled once, a resumed run waits only for what is
left, a long wait pauses the run (`RunSleeping`) and a worker wakes it when it is due."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import bide
from bide._when import iso, when
from bide.testing import ScriptedModel, call, reply


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def script(seconds: float) -> list[object]:
    return [call("wait", seconds=seconds), reply("followed up")]


def test_a_short_wait_happens_in_the_drive(store: bide.Store) -> None:
    agent = bide.Agent(ScriptedModel(script(0.05)), store=store, tools=[bide.timer(inline=1.0)])
    started = time.time()
    result = agent.run_sync("s", "follow up")
    assert result.answer == "followed up"
    journal = bide.Journal(store, "s").load()
    timer = journal.get("timer:c0.0")
    assert isinstance(timer, bide.Timer)
    assert timer.wake_at_ms / 1000 >= started + 0.05
    res = journal.get("result:c0.0")
    assert isinstance(res, bide.ToolResult) and str(res.result).startswith("waited until ")
    assert time.time() >= timer.wake_at_ms / 1000  # it really waited


def test_a_long_wait_sleeps_and_never_starts_again_from_zero(store: bide.Store) -> None:
    clock = FakeClock()
    model = ScriptedModel(script(3600))
    agent = bide.Agent(model, store=store, tools=[bide.timer()], clock=clock)
    with pytest.raises(bide.RunSleeping) as first:
        agent.run_sync("l", "follow up")
    wake = clock.now + 3600
    assert first.value.wake_at == pytest.approx(wake)
    # The distance on the agent's clock, the time said once (it was measured on the machine's clock, the
    # time printed twice).
    said = str(first.value)
    assert when(wake, clock.now) in said and said.count(iso(wake)) == 1
    status = bide.run_status(store, "l")
    assert (status.status, status.call_id, status.tool) == ("sleeping", "c0.0", "wait")
    clock.now += 1800
    with pytest.raises(bide.RunSleeping) as second:
        agent.run_sync("l", "follow up")
    assert second.value.wake_at == pytest.approx(wake)  # the journaled time, not another hour from now
    clock.now = wake + 1
    result = agent.run_sync("l", "follow up")
    assert result.answer == "followed up"
    assert len(model.requests) == 2  # the first turn was asked once, the answer once


def test_the_timer_is_validated_like_any_tool(store: bide.Store) -> None:
    model = ScriptedModel([call("wait", seconds=-5), reply("ok")])
    result = bide.Agent(model, store=store, tools=[bide.timer()]).run_sync("v", "x")
    assert result.answer == "ok"
    res = bide.Journal(store, "v").load().get("result:c0.0")
    assert isinstance(res, bide.ToolResult) and res.is_error  # the model is told; no timer is set
    with pytest.raises(bide.ConfigError):
        bide.timer(inline=-1)


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0, -1.0, True, 1e16, "60"])
def test_a_timer_allows_waits_whose_wake_up_a_date_can_hold(bad: object) -> None:
    """max_seconds is a positive number up to a century: with 1e16 (or infinity) a model's wait woke in a
    year no date can hold, and every drive of its run failed on it, for good."""
    from bide._timers import LIMIT_MAX_SECONDS

    with pytest.raises(bide.ConfigError, match="max_seconds must be a positive number"):
        bide.timer(max_seconds=bad)  # type: ignore[arg-type]
    assert bide.timer(max_seconds=LIMIT_MAX_SECONDS).max_seconds == LIMIT_MAX_SECONDS


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 10**400, -1, True, "1", 1e16])
def test_a_timer_waits_inline_for_a_number_of_seconds_a_date_can_hold(bad: object) -> None:
    """inline=10**400 raised OverflowError, and inline=inf was taken: every wait, up to a year, slept inside
    the drive."""
    with pytest.raises(bide.ConfigError, match="inline must be a number of seconds from 0 to"):
        bide.timer(inline=bad)  # type: ignore[arg-type]
    assert bide.timer(inline=0).inline == 0.0


def test_a_wake_up_past_the_year_9999_journaled_earlier_sleeps_and_can_be_cancelled(
    durable_store_spec: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal an earlier bide wrote (it allowed such a timer) holds a wake-up no date can hold: its run
    sleeps, `bide show` shows it, and a cancel ends it (every drive failed on formatting the time, and
    `bide show` exited 3 as if bide had a bug)."""
    import subprocess
    import sys

    import bide._timers

    url, prefix = durable_store_spec
    store = bide.open_store(url, table_prefix=prefix)
    try:
        monkeypatch.setattr(bide._timers, "LIMIT_MAX_SECONDS", 1e17)  # the earlier bide
        tool = bide.timer(max_seconds=1e16)
        model = ScriptedModel([call("wait", seconds=1e15), reply("ok")])
        agent = bide.Agent(model, store=store, tools=[tool])
        for _ in range(2):
            with pytest.raises(bide.RunSleeping, match="1e\\+15 s after the Unix epoch") as slept:
                agent.run_sync("far", "wait")
        assert slept.value.wake_at > 1e15
        assert bide.run_status(store, "far").status == "sleeping"
        command = [sys.executable, "-m", "bide._cli", "show", "--store", url, "--table-prefix", prefix, "far"]
        shown = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert "sleeping" in shown.stdout
        bide.cancel_run(store, "far", reason="too far")
        assert asyncio.run(bide.Worker(store, agent).run_once()).completed == 1
        assert bide.run_status(store, "far").status == "cancelled"
    finally:
        store.close()


def test_a_worker_wakes_a_sleeping_run_when_it_is_due(store: bide.Store) -> None:
    agent = bide.Agent(ScriptedModel(script(0.6)), store=store, tools=[bide.timer(inline=0.0)], name="a")
    with pytest.raises(bide.RunSleeping) as slept:
        agent.run_sync("w", "follow up")
    wake = slept.value.wake_at

    async def scenario() -> float:
        worker = bide.Worker(store, agent, poll_interval=0.05)
        forever = asyncio.create_task(worker.run_forever())
        deadline = time.time() + 20
        while bide.run_status(store, "w").status != "completed":
            assert time.time() < deadline
            await asyncio.sleep(0.01)
        done = time.time()
        worker.stop()
        await asyncio.wait_for(forever, 5)
        return done

    done_at = asyncio.run(scenario())
    assert done_at >= wake  # woken after its time, not before


@pytest.mark.slow
def test_a_sleeping_run_survives_a_restart(durable_store_spec: tuple[str, str], tmp_path: Path) -> None:
    url, prefix = durable_store_spec
    first = bide.open_store(url, table_prefix=prefix)
    agent = bide.Agent(ScriptedModel(script(1.0)), store=first, tools=[bide.timer(inline=0.0)], name="a")
    with pytest.raises(bide.RunSleeping) as slept:
        agent.run_sync("r", "follow up")
    first.close()  # the process goes away; only the journal remains
    again = bide.open_store(url, table_prefix=prefix)
    resumed = bide.Agent(ScriptedModel(script(1.0)), store=again, tools=[bide.timer(inline=0.0)], name="a")
    with pytest.raises(bide.RunSleeping) as still:
        resumed.run_sync("r", "follow up")
    assert still.value.wake_at == pytest.approx(slept.value.wake_at)
    time.sleep(max(0.0, slept.value.wake_at - time.time()) + 0.05)
    assert resumed.run_sync("r", "follow up").answer == "followed up"
    again.close()


def test_a_worker_ends_a_cancelled_sleeping_run_at_its_recheck_not_at_the_wake_up(store: bide.Store) -> None:
    """A cancel request that could not tell the worker (made here at the wall clock, on which the run's
    lease, stamped on the agent's clock, is still live: as when a driver holds it, so the request leaves the
    lease alone): a sleeping run is read again every PARKED_RECHECK_S (it used to be left alone until its
    timer, a day here), and the cancel ends it."""
    from bide._worker import PARKED_RECHECK_S

    clock = FakeClock()
    model = ScriptedModel(script(86_400))
    agent = bide.Agent(model, store=store, tools=[bide.timer()], clock=clock, name="a")
    with pytest.raises(bide.RunSleeping):
        agent.run_sync("c", "follow up tomorrow")
    worker = bide.Worker(store, agent, clock=clock)
    clock.now += 60  # the drive's lease has long expired
    assert asyncio.run(worker.run_once()).waiting == 1  # driven: still sleeping
    clock.now += 5
    assert asyncio.run(worker.run_once()).driven == 0  # its timer is not due: nothing to drive
    bide.cancel_run(store, "c", reason="the customer called")
    clock.now += PARKED_RECHECK_S + 1
    asyncio.run(worker.run_once())
    assert bide.run_status(store, "c").status == "cancelled"


def test_a_worker_forgets_the_runs_it_no_longer_lists(store: bide.Store) -> None:
    """A worker keeps a little state per run it backs off or parks (a sleeping run's wake-up time here). A
    run finished by another driver is no longer listed, and its state goes at the next pass: it stayed for
    good before, one entry per such run over a worker's whole life."""
    clock = FakeClock()
    model = ScriptedModel(script(3600) * 20)
    agent = bide.Agent(model, store=store, tools=[bide.timer()], clock=clock, name="a")
    for i in range(20):
        with pytest.raises(bide.RunSleeping):
            agent.run_sync(f"s{i}", "follow up")
    worker = bide.Worker(store, agent, clock=clock)
    report = asyncio.run(worker.run_once())
    assert report.waiting == 20 and len(worker._state) == 20
    clock.now += 3601
    for i in range(15):  # woken and finished by another process's drive, not by this worker
        assert agent.run_sync(f"s{i}", "follow up").answer == "followed up"
    asyncio.run(worker.run_once())
    assert sorted(worker._state) == []  # the 5 left were due: driven and finished by this pass
    assert [bide.run_status(store, f"s{i}").status for i in range(20)] == ["completed"] * 20


def test_a_worker_drives_a_timer_due_on_the_wall_clock_after_the_clock_jumped_forward(
    store: bide.Store,
) -> None:
    """The worker waits on its monotonic timer, which a wall clock stepped forward (NTP) or a machine resumed
    from suspend does not move: a timer read as an hour away, then due on the wall clock, was left sleeping
    for the hour. It is driven at the next pass."""
    offset = [0.0]

    def wall() -> float:
        return time.time() + offset[0]

    agent = bide.Agent(ScriptedModel(script(3600)), store=store, tools=[bide.timer()], clock=wall, name="a")
    with pytest.raises(bide.RunSleeping):
        agent.run_sync("j", "follow up in an hour")
    worker = bide.Worker(store, agent)
    worker.clock = wall  # the worker's wall clock; its own waits stay on the monotonic timer
    offset[0] = 60  # the drive's lease has expired
    assert asyncio.run(worker.run_once()).waiting == 1  # read: an hour to go
    offset[0] = 3700  # the wall clock jumps forward past the wake-up
    assert asyncio.run(worker.run_once()).completed == 1
    assert bide.run_status(store, "j").status == "completed"
