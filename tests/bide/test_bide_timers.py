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


MONTH = 30 * 86_400.0


class Ledger:
    """A side effect that notes each call: what a run fires after its wait."""

    def __init__(self) -> None:
        self.fired: list[str] = []
        ledger = self

        @bide.tool(timeout=5)
        def charge(customer: str) -> str:
            """Charge a customer."""
            ledger.fired.append(customer)
            return "charged"

        self.tool = charge


def month_script() -> list[object]:
    return [
        call("charge", customer="a"),
        call("wait", seconds=MONTH),
        call("charge", customer="b"),
        reply("done"),
    ]


def sleep_a_month(store: bide.Store, clock: FakeClock, ledger: Ledger, run_id: str) -> float:
    """A run that charged, then sleeps for 30 days on its timer (`timer:c1.0` journaled); its wake-up."""
    tools = [ledger.tool, bide.timer()]
    agent = bide.Agent(ScriptedModel(month_script()), store=store, tools=tools, clock=clock)
    with pytest.raises(bide.RunSleeping) as slept:
        agent.run_sync(run_id, "charge, wait a month, charge")
    assert ledger.fired == ["a"]
    timer = bide.Journal(store, run_id).load().get("timer:c1.0")
    assert isinstance(timer, bide.Timer) and timer.wake_at_ms / 1000 == slept.value.wake_at
    assert slept.value.wake_at == pytest.approx(clock.now + MONTH)
    return slept.value.wake_at


def test_a_journaled_timer_outlives_a_lower_max_seconds(store: bide.Store) -> None:
    """The app restarted with `bide.timer(max_seconds=86400)` (or an upgrade forced a lower bound): the
    resumed run validated the running 30-day wait again, journaled "invalid arguments" for it over its
    timer record, and went on to charge "b" a month early. The journaled wake-up wins; only a new call is
    checked against the new bound."""
    clock = FakeClock()
    ledger = Ledger()
    wake = sleep_a_month(store, clock, ledger, "m")
    model = ScriptedModel(month_script())  # a restarted app: the same script
    tools = [ledger.tool, bide.timer(max_seconds=86_400)]
    agent = bide.Agent(model, store=store, tools=tools, clock=clock)
    for advance in (0.0, 86_400.0, MONTH - 86_400.0 - 60):
        clock.now += advance
        with pytest.raises(bide.RunSleeping) as resumed:
            agent.run_sync("m", "charge, wait a month, charge")
        assert (resumed.value.wake_at, resumed.value.call_id, resumed.value.tool) == (wake, "c1.0", "wait")
        assert bide.run_status(store, "m").status == "sleeping"
    journal = bide.Journal(store, "m").load()
    assert not journal.has("result:c1.0") and ledger.fired == ["a"] and model.requests == []
    clock.now = wake + 1
    assert agent.run_sync("m", "charge, wait a month, charge").answer == "done"
    assert ledger.fired == ["a", "b"]
    assert len(model.requests) == 2  # asked only for the turns after the wait
    res = bide.Journal(store, "m").load().get("result:c1.0")
    assert isinstance(res, bide.ToolResult) and not res.is_error and res.result == f"waited until {iso(wake)}"
    # A new call is still held to the bound the tool has now: refused, no timer set.
    fresh = bide.Agent(ScriptedModel(month_script()), store=store, tools=tools, clock=clock)
    assert fresh.run_sync("n", "charge, wait a month, charge").answer == "done"
    journal = bide.Journal(store, "n").load()
    refused = journal.get("result:c1.0")
    assert isinstance(refused, bide.ToolResult) and refused.is_error
    assert "invalid arguments" in str(refused.result) and ledger.fired == ["a", "b", "a", "b"]
    assert not journal.has("timer:c1.0")


def test_a_journaled_timer_held_past_a_lower_max_seconds_can_be_cancelled(store: bide.Store) -> None:
    clock = FakeClock()
    ledger = Ledger()
    sleep_a_month(store, clock, ledger, "k")
    model = ScriptedModel(month_script())
    agent = bide.Agent(model, store=store, tools=[ledger.tool, bide.timer(max_seconds=86_400)], clock=clock)
    clock.now += 60
    with pytest.raises(bide.RunSleeping):
        agent.run_sync("k", "charge, wait a month, charge")
    assert bide.cancel_run(store, "k", reason="the customer called", clock=clock) is True
    clock.now += 60
    asyncio.run(bide.Worker(store, agent, clock=clock).run_once())
    assert bide.run_status(store, "k").status == "cancelled"
    result = agent.run_sync("k", "charge, wait a month, charge")
    assert (result.status, result.answer) == ("cancelled", "Cancelled: the customer called")
    assert ledger.fired == ["a"] and model.requests == []
    assert not bide.Journal(store, "k").load().has("result:c1.0")


class Stranger:
    """A side effect that took the timer's name: it must never run for the journaled timer's call."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        stranger = self

        @bide.tool(name="wait", timeout=5)
        def wait(seconds: float) -> str:
            """Something else called wait."""
            stranger.calls.append(seconds)
            return "did something else"

        self.tool = wait


@pytest.mark.parametrize("change", ["timer removed", "timer renamed", "another tool took its name"])
def test_a_journaled_timer_outlives_its_tool(store: bide.Store, change: str) -> None:
    """The timer tool gone from the agent (removed, renamed, or its name given to another tool): the
    resumed run journaled "unknown tool 'wait'" for the call over its timer record (or called the other
    tool), and went on to charge "b" at once. It sleeps until its journaled wake-up, then goes on."""
    clock = FakeClock()
    ledger = Ledger()
    wake = sleep_a_month(store, clock, ledger, "g")
    stranger = Stranger()
    tools: list[bide.Tool] = [ledger.tool]
    if change == "timer renamed":
        tools.append(bide.timer("pause", max_seconds=86_400))
    elif change == "another tool took its name":
        tools.append(stranger.tool)
    model = ScriptedModel(month_script())
    agent = bide.Agent(model, store=store, tools=tools, clock=clock)
    for advance in (0.0, MONTH - 60):
        clock.now += advance
        with pytest.raises(bide.RunSleeping) as resumed:
            agent.run_sync("g", "charge, wait a month, charge")
        assert (resumed.value.wake_at, resumed.value.call_id, resumed.value.tool) == (wake, "c1.0", "wait")
        assert bide.run_status(store, "g").status == "sleeping"
    assert not bide.Journal(store, "g").load().has("result:c1.0")
    assert ledger.fired == ["a"] and stranger.calls == [] and model.requests == []
    clock.now = wake + 1
    assert agent.run_sync("g", "charge, wait a month, charge").answer == "done"
    assert ledger.fired == ["a", "b"] and stranger.calls == []
    assert len(model.requests) == 2  # asked only for the turns after the wait
    res = bide.Journal(store, "g").load().get("result:c1.0")
    assert isinstance(res, bide.ToolResult) and not res.is_error and res.result == f"waited until {iso(wake)}"
    assert res.safety == "read_only"


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
    `bide show` exited 3 as if bide had a bug). The run is resumed the way a user must after the upgrade:
    with a timer this bide accepts, whose `max_seconds` is far below the journaled wait (that resumed run
    journaled "invalid arguments" for the call over its timer and finished at once)."""
    import subprocess
    import sys

    import bide._timers

    url, prefix = durable_store_spec
    store = bide.open_store(url, table_prefix=prefix)
    try:
        with monkeypatch.context() as earlier:
            earlier.setattr(bide._timers, "LIMIT_MAX_SECONDS", 1e17)  # the earlier bide, its first drive only
            old = bide.Agent(
                ScriptedModel([call("wait", seconds=1e15), reply("ok")]),
                store=store,
                tools=[bide.timer(max_seconds=1e16)],
            )
            with pytest.raises(bide.RunSleeping, match="1e\\+15 s after the Unix epoch") as first:
                old.run_sync("far", "wait")
        with pytest.raises(bide.ConfigError):
            bide.timer(max_seconds=1e16)  # this bide refuses the earlier timer: the app must lower it
        model = ScriptedModel([reply("ok")])
        agent = bide.Agent(model, store=store, tools=[bide.timer()])
        for _ in range(2):
            with pytest.raises(bide.RunSleeping, match="1e\\+15 s after the Unix epoch") as slept:
                agent.run_sync("far", "wait")
            assert slept.value.wake_at == first.value.wake_at
        assert slept.value.wake_at > 1e15 and model.requests == []
        assert not bide.Journal(store, "far").load().has("result:c0.0")
        assert bide.run_status(store, "far").status == "sleeping"
        command = [sys.executable, "-m", "bide._cli", "show", "--store", url, "--table-prefix", prefix, "far"]
        shown = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert "sleeping" in shown.stdout
        bide.cancel_run(store, "far", reason="too far")
        assert asyncio.run(bide.Worker(store, agent).run_once()).cancelled == 1
        assert bide.run_status(store, "far").status == "cancelled"
        assert model.requests == []
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
