"""`bide.Worker` and `bide worker`: runs whose driver is gone are resumed from their journal.

In process on every store (a drive that failed, a halted run left to a person, a reconciler deciding a
crashed call, unknown agents, run_forever and stop), then across processes on SQLite and PostgreSQL: a
driver SIGKILLed at a random moment is resumed by `bide worker` in another process once its lease expires,
every charge lands exactly once, and two workers racing for the same runs resume each run once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import bide
from bide.testing import Fail, ScriptedModel, call, reply

HERE = Path(__file__).resolve().parent


class Crash(BaseException):
    """Stands in for the process dying in the window (after the effect, before its result)."""


def agent_with(
    store: bide.Store, script: list[Any], tools: list[bide.Tool], name: str = "a", **options: Any
) -> bide.Agent:
    return bide.Agent(ScriptedModel(script), store=store, tools=tools, name=name, lease_ttl=5.0, **options)


def behind() -> float:
    """A clock a minute behind: an agent on it records deadlines that have passed already on the wall clock
    (by which resolvers judge them), while its calls have all their timeout to start in (a sync tool
    starts only inside its window, once a worker thread picks it up: a short timeout, waited out, can
    close before that on a loaded machine)."""
    return time.time() - 60


def test_a_failed_drive_is_resumed_and_finished(store: bide.Store) -> None:
    first = agent_with(store, [Fail(bide.ModelError("model down")), reply("hello")], [])
    with pytest.raises(bide.ModelError):
        first.run_sync("r1", "hi")
    assert bide.run_status(store, "r1").status == "not_started"  # nothing journaled: nothing to resume

    model = ScriptedModel([call("note", text="x"), Fail(bide.ModelError("down")), reply("done")])

    @bide.tool(safety=bide.ReadOnly)
    def note(text: str) -> str:
        """Take a note."""
        return text

    agent = bide.Agent(model, store=store, tools=[note], name="a", lease_ttl=5.0)
    with pytest.raises(bide.ModelError):
        agent.run_sync("r2", "go")
    assert bide.run_status(store, "r2").status == "running"

    report = asyncio.run(bide.Worker(store, agent, backoff=0.01).run_once())
    assert (report.completed, report.failed) == (1, 0)
    assert bide.run_status(store, "r2").status == "completed"
    assert bide.run_status(store, "r2").answer == "done"
    again = asyncio.run(bide.Worker(store, agent).run_once())
    assert again.driven == 0  # an ended run is not listed


def test_a_halted_run_waits_for_a_person_then_goes_on(store: bide.Store) -> None:
    charges: list[int] = []

    @bide.tool(timeout=30)
    def charge(cents: int) -> str:
        """Charge a card."""
        charges.append(cents)
        if len(charges) == 1:
            raise Crash
        return "charged"

    agent = agent_with(store, [call("charge", cents=5), reply("paid")], [charge], clock=behind)
    with pytest.raises(Crash):
        agent.run_sync("h1", "pay")
    worker = bide.Worker(store, agent, backoff=0.01)
    first = asyncio.run(worker.run_once())
    assert (first.halted, first.completed) == (1, 0)
    second = asyncio.run(worker.run_once())
    assert second.driven == 0  # unchanged: still waiting for a person (parked, not read again)
    assert charges == [5]

    call_id = bide.run_status(store, "h1").call_id  # its deadline has passed (the agent's clock is behind)
    assert call_id is not None
    bide.resolve_halt(store, "h1", call_id, outcome=bide.Outcome.succeeded("charged"), clock_skew=0.0)
    third = asyncio.run(worker.run_once())
    assert third.completed == 1
    assert charges == [5]  # the effect fired once; the person's word stands in for its lost result


def test_a_run_another_driver_is_running_is_not_counted_as_halted(store: bide.Store) -> None:
    """Between a worker's listing and its read of the journal, another driver took the run and wrote the
    marker of the call it is running: the worker read "halted" from the journal alone, counted the run as
    needing a person (a cron job alerting on `halted` paged for nothing; 89 of 100 runs with 4 workers)
    and logged so. Now the drive tells: that driver's lease is live, so the run is waiting."""
    started, finish = threading.Event(), threading.Event()

    @bide.tool(timeout=30)
    def charge(cents: int) -> str:
        """Charge a card."""
        started.set()
        finish.wait(30)
        return "charged"

    def agent() -> bide.Agent:
        return agent_with(store, [call("charge", cents=5), reply("paid")], [charge])

    driver = threading.Thread(target=agent().run_sync, args=("busy", "pay"))
    driver.start()
    try:
        assert started.wait(10)
        assert bide.run_status(store, "busy").status == "halted"  # from the journal alone
        # A worker whose clock finds every lease expired: as if it had listed the run just before the
        # driver took it.
        worker = bide.Worker(store, agent(), backoff=0.01, clock=lambda: time.time() + 3600)
        report = asyncio.run(worker.run_once())
        assert (report.halted, report.waiting, report.completed) == (0, 1, 0), report
    finally:
        finish.set()
        driver.join()
    assert bide.run_status(store, "busy").status == "completed"


def test_a_reconciler_decides_a_crashed_call_when_the_worker_resumes(store: bide.Store) -> None:
    ledger: list[int] = []

    def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome:
        cents = attempt.arguments["cents"]
        if cents in ledger:
            return bide.Outcome.succeeded("charged", evidence="ledger")
        return bide.Outcome.not_started()

    @bide.tool(timeout=30, reconcile=reconcile)
    def charge(cents: int) -> str:
        """Charge a card."""
        ledger.append(cents)
        if len(ledger) == 1:
            raise Crash
        return "charged"

    def agent(**options: Any) -> bide.Agent:
        model = ScriptedModel([call("charge", cents=7), reply("paid")])
        return bide.Agent(model, store=store, tools=[charge], name="a", clock_skew=0, lease_ttl=5, **options)

    # The crashed drive's clock is behind: the deadline it recorded has passed on the worker's agent's clock,
    # so its reconciler decides the call at once.
    with pytest.raises(Crash):
        agent(clock=behind).run_sync("c1", "pay")
    worker = bide.Worker(store, agent(), backoff=0.01, max_backoff=0.02)
    deadline = time.time() + 10
    while bide.run_status(store, "c1").status != "completed":
        assert time.time() < deadline, bide.run_status(store, "c1")
        asyncio.run(worker.run_once())
        time.sleep(0.02)
    assert ledger == [7]


def test_runs_of_agents_the_worker_does_not_know_are_skipped(store: bide.Store) -> None:
    other = agent_with(store, [call("x"), Fail(bide.ModelError("down")), reply("ok")], [], name="other")
    with pytest.raises(bide.BideError):
        other.run_sync("u1", "go")
    mine = agent_with(store, [reply("ok")], [], name="mine")
    report = asyncio.run(bide.Worker(store, mine).run_once())
    assert report.driven == 0 and report.skipped == 1
    # Which run this worker leaves to another app's (only a count was reported): not one a person must act
    # on (on a store several apps share, exit 4 at every pass).
    assert report.unresumable == {} and report.other_agents == {"u1": "agent:other"}


def test_worker_refuses_agents_on_another_store(store: bide.Store) -> None:
    elsewhere = bide.open_store("memory://")
    agent = agent_with(elsewhere, [reply("ok")], [])
    with pytest.raises(bide.ConfigError, match="another store"):
        bide.Worker(store, agent)


def test_a_lookup_that_gives_an_agent_on_another_store_drives_nothing(store: bide.Store) -> None:
    """A lookup function's agent on another store started the run afresh there and fired its charge again
    (the run stayed unfinished in the worker's store): such a run is not driven, and the report says why."""
    charges: list[str] = []

    @bide.tool
    def charge(order: str) -> str:
        """Charge an order."""
        charges.append(order)
        return "charged"

    first = agent_with(store, [call("charge", order="o-1"), Fail(bide.ModelError("down"))], [charge], "pay")
    with pytest.raises(bide.ModelError):
        first.run_sync("pay-1", "charge o-1")
    script = [call("charge", order="o-1"), reply("done")]
    elsewhere = agent_with(bide.open_store("memory://"), script, [charge], "pay")
    report = asyncio.run(bide.Worker(store, lambda name: elsewhere if name == "pay" else None).run_once())
    assert charges == ["o-1"] and report.driven == 0 and report.skipped == 1
    assert "uses another store than the worker" in report.unresumable["pay-1"]
    assert bide.run_status(store, "pay-1").status == "running"
    resumer = agent_with(store, [call("charge", order="o-1"), reply("done")], [charge], "pay")
    assert asyncio.run(bide.Worker(store, lambda name: resumer).run_once()).completed == 1
    assert charges == ["o-1"]  # the journaled charge is replayed, never fired again


@pytest.mark.parametrize(
    "option",
    [
        {"concurrency": 0}, {"concurrency": 2.5}, {"concurrency": True}, {"poll_interval": float("nan")},
        {"poll_interval": float("inf")}, {"poll_interval": 1e-12}, {"backoff": float("nan")},
        {"max_backoff": -1.0}, {"grace": float("inf")}, {"backoff": 10.0, "max_backoff": 5.0},
    ],
)  # fmt: skip
def test_worker_refuses_options_it_cannot_keep(option: dict[str, Any]) -> None:
    """NaN and infinite durations were taken (a NaN backoff retried at once, an infinite poll looked once
    and never again), a poll of 1e-12 s spun on the store, and 2.5 drives at once became 2."""
    store = bide.open_store("memory://")
    agent = agent_with(store, [reply("ok")], [])
    name = list(option)[-1]
    with pytest.raises(bide.ConfigError, match=name):
        bide.Worker(store, agent, **option)


def test_run_forever_resumes_runs_and_stops_when_asked(store: bide.Store) -> None:
    @bide.tool(safety=bide.ReadOnly)
    def look() -> str:
        """Look."""
        return "seen"

    def agent(script: list[Any]) -> bide.Agent:
        return bide.Agent(ScriptedModel(script), store=store, tools=[look], name="a", lease_ttl=5.0)

    for run_id in ("f1", "f2", "f3"):
        with pytest.raises(bide.ModelError):
            agent([call("look"), Fail(bide.ModelError("down")), reply("ok")]).run_sync(run_id, "go")
    resumer = agent([call("look"), reply("ok")])

    async def scenario() -> None:
        worker = bide.Worker(store, resumer, poll_interval=0.01, backoff=0.01)
        forever = asyncio.create_task(worker.run_forever())
        deadline = time.time() + 10
        while any(bide.run_status(store, r).status != "completed" for r in ("f1", "f2", "f3")):
            assert time.time() < deadline
            await asyncio.sleep(0.02)
        worker.stop()
        await asyncio.wait_for(forever, 5)

    asyncio.run(scenario())


def test_runs_needing_nothing_never_starve_a_crashed_run_listed_after_them(store: bide.Store) -> None:
    """More idle threads and runs halted for a person than the worker drives at once, all listed before a
    crashed run (run ids sort them first): run_forever resumes the crashed run within a poll or two, and
    a halted run it parked is driven as soon as a person's resolution changes its lease, not at the next
    recheck."""

    @bide.tool(safety=bide.ReadOnly)
    def look() -> str:
        """Look."""
        return "seen"

    @bide.tool(timeout=30)
    async def wire() -> str:
        """Send a wire (its outcome is lost)."""
        raise ConnectionResetError("lost after sending")

    def agent(script: list[Any], **options: Any) -> bide.Agent:
        return bide.Agent(
            ScriptedModel(script), store=store, tools=[look, wire], name="a", lease_ttl=5.0, **options
        )

    for i in range(6):
        agent([reply("hello")]).thread(f"a-idle-{i}").send_sync("hi")
        with pytest.raises(bide.OutcomeUnknown):  # each wire's deadline has passed on the wall clock
            agent([call("wire"), reply("sent")], clock=behind).run_sync(f"b-halted-{i}", "pay")
    with pytest.raises(bide.ModelError):
        agent([call("look"), Fail(bide.ModelError("down"))]).run_sync("z-crashed", "go")

    async def scenario() -> None:
        worker = bide.Worker(store, agent([call("wire"), reply("done")]), concurrency=2, poll_interval=0.05)
        forever = asyncio.create_task(worker.run_forever())
        try:
            deadline = time.monotonic() + 5
            while bide.run_status(store, "z-crashed").status != "completed":
                assert time.monotonic() < deadline, "the crashed run was never resumed"
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)  # a few polls: every halted run is parked by now
            assert bide.run_status(store, "b-halted-0").status == "halted"
            call_id = bide.run_status(store, "b-halted-0").call_id
            assert call_id is not None
            outcome = bide.Outcome.succeeded("sent")
            await bide.aresolve_halt(store, "b-halted-0", call_id, outcome=outcome, clock_skew=0.0)
            deadline = time.monotonic() + 5  # the recheck of a parked run is 30 s away
            while bide.run_status(store, "b-halted-0").status != "completed":
                assert time.monotonic() < deadline, "the resolved run was not driven"
                await asyncio.sleep(0.02)
        finally:
            worker.stop()
            await asyncio.wait_for(forever, 10)

    asyncio.run(scenario())
    assert [bide.run_status(store, f"a-idle-{i}").status for i in range(6)] == ["idle"] * 6
    assert [bide.run_status(store, f"b-halted-{i}").status for i in range(1, 6)] == ["halted"] * 5


def test_a_cancel_request_ends_every_kind_of_waiting_run_at_the_workers_next_pass(store: bide.Store) -> None:
    """A worker leaves alone the runs that need nothing from it (an idle thread, a run halted for a person, a
    run asleep on a timer for a day) until their lease changes or PARKED_RECHECK_S (30 s) passes. A cancel
    request takes and frees the run's lease once recorded, so the worker's next pass ends each of them as
    cancelled, seconds before the recheck: it waited up to 30 s before. A second request is not recorded
    and tells nobody again."""

    @bide.tool(timeout=30)
    async def wire() -> str:
        """Send a wire (its outcome is lost)."""
        raise ConnectionResetError("lost after sending")

    def agent(script: list[Any], **options: Any) -> bide.Agent:
        tools = [wire, bide.timer()]
        return bide.Agent(ScriptedModel(script), store=store, tools=tools, name="a", lease_ttl=5.0, **options)

    agent([reply("hello")]).thread("idle").send_sync("hi")
    with pytest.raises(bide.OutcomeUnknown):  # the wire's deadline has passed on the wall clock
        agent([call("wire"), reply("sent")], clock=behind).run_sync("halted", "pay")
    with pytest.raises(bide.RunSleeping):
        agent([call("wait", seconds=86_400), reply("followed up")]).run_sync("asleep", "follow up tomorrow")
    runs = ["idle", "halted", "asleep"]
    assert [bide.run_status(store, r).status for r in runs] == ["idle", "halted", "sleeping"]

    started = time.monotonic()
    worker = bide.Worker(store, agent([reply("never asked")]), backoff=3600, max_backoff=3600)
    asyncio.run(worker.run_once())  # reads each, drives none to an end: it parks them
    assert asyncio.run(worker.run_once()).driven == 0  # no news: nothing read again
    for run in runs:
        assert bide.cancel_run(store, run, reason="not needed") is True
    report = asyncio.run(worker.run_once())
    assert [bide.run_status(store, r).status for r in runs] == ["cancelled"] * 3, report
    from bide._worker import PARKED_RECHECK_S

    assert time.monotonic() - started < PARKED_RECHECK_S  # (no recheck can have made the difference)
    assert asyncio.run(worker.run_once()).driven == 0


def test_a_parked_run_is_not_read_again_until_its_journal_or_lease_changes(
    store: bide.Store, journal_reads: Callable[[bide.Store], list[str]]
) -> None:
    """A worker read every run it parked (halted for a person, asleep on a timer, an idle thread) again every
    PARKED_RECHECK_S, for news written while a driver held the run's lease: with 50,000 halted runs that
    was 1,700 journal reads a second and a quarter of a core, doing nothing. The listing gives each run's
    latest record (`Lease.last_seq`): once read, a parked run is not read again while its lease and latest
    record stay as they were, however long; a record written without its lease is read at the next pass."""
    from bide._worker import PARKED_RECHECK_S

    @bide.tool(timeout=30)
    async def wire() -> str:
        """Send a wire (its outcome is lost)."""
        raise ConnectionResetError("lost after sending")

    def agent(script: list[Any], **options: Any) -> bide.Agent:
        tools = [wire, bide.timer()]
        return bide.Agent(ScriptedModel(script), store=store, tools=tools, name="a", **options)

    agent([reply("hello")]).thread("idle").send_sync("hi")
    with pytest.raises(bide.OutcomeUnknown):
        agent([call("wire"), reply("sent")], clock=behind).run_sync("halted", "pay")
    with pytest.raises(bide.RunSleeping):
        agent([call("wait", seconds=86_400), reply("done")]).run_sync("asleep", "follow up tomorrow")
    clock = [time.time()]
    worker = bide.Worker(store, agent([reply("never asked")]), clock=lambda: clock[0], backoff=3600,
                         max_backoff=3600)  # fmt: skip
    reads = journal_reads(store)
    asyncio.run(worker.run_once())  # the halted run is driven to halt again, then parked
    clock[0] += PARKED_RECHECK_S + 1
    asyncio.run(worker.run_once())  # read once more after its drive: parked as its journal is
    for number, run in enumerate(("idle", "halted", "asleep")):  # news written without the run's lease
        bide.Journal(store, run).load().write([bide.GateRecord(key=f"note:{number}", data=1)])
    reads.clear()
    asyncio.run(worker.run_once())  # at once, not PARKED_RECHECK_S after the park
    assert sorted(set(reads)) == ["asleep", "halted", "idle"], reads
    clock[0] += PARKED_RECHECK_S + 1
    asyncio.run(worker.run_once())  # the halted run, driven to halt again, is read once more
    reads.clear()
    for _ in range(3):
        clock[0] += 10 * PARKED_RECHECK_S
        assert asyncio.run(worker.run_once()).driven == 0
    assert reads == [], reads
    for run in ("idle", "halted", "asleep"):
        bide.Journal(store, run).load().write([bide.GateRecord(key="note:later", data=1)])
    asyncio.run(worker.run_once())
    assert sorted(set(reads)) == ["asleep", "halted", "idle"], reads
    assert [bide.run_status(store, r).status for r in ("idle", "halted", "asleep")] == [
        "idle", "halted", "sleeping"]  # fmt: skip


def test_a_slow_listing_is_followed_by_a_longer_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing reads every unfinished run: with tens of thousands halted for a person it takes a third of a
    second, and a worker polling every second spent a third of a core listing them. `run_forever` waits
    long enough after a listing for listings to take at most LISTING_SHARE of its time."""
    from bide._worker import LISTING_SHARE

    store = bide.open_store("memory://")
    worker = bide.Worker(store, bide.Agent(ScriptedModel([reply("x")]), store=store), poll_interval=0.01)
    listings: list[float] = []
    slow = 0.2

    def listing() -> tuple[list[str], set[str]]:
        listings.append(time.monotonic())
        time.sleep(slow)
        return [], set()

    monkeypatch.setattr(worker, "_list_runs_to_recover", listing)

    async def serve() -> None:
        forever = asyncio.create_task(worker.run_forever())
        await asyncio.sleep(2.0)
        worker.stop()
        await asyncio.wait_for(forever, 10)

    asyncio.run(serve())
    # Each listing takes `slow` and is followed by a wait of `slow` * 9: a second listing at about 2 s.
    assert 1 <= len(listings) <= 2, listings
    gaps = [b - a for a, b in itertools.pairwise(listings)]
    assert all(gap >= slow / LISTING_SHARE * 0.95 for gap in gaps), gaps


def test_listings_go_on_while_synchronous_calls_hold_every_thread_of_asyncios_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The listing ran in asyncio's default thread pool (6 threads on 2 CPUs), which synchronous tools share:
    with every thread held by calls, the worker could not list, and it counted the wait for a thread as
    listing time, then waited 10 s more: a run that crashed meanwhile was recovered 10 s late. Listings
    run on a thread of the worker's own, and only the store's time counts."""
    store = bide.open_store("memory://")
    worker = bide.Worker(store, bide.Agent(ScriptedModel([reply("x")]), store=store), poll_interval=0.05)
    listings: list[float] = []
    listing = worker._list_runs_to_recover

    def counted() -> tuple[list[str], set[str]]:
        listings.append(time.monotonic())
        return listing()

    monkeypatch.setattr(worker, "_list_runs_to_recover", counted)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        release = threading.Event()
        # Every thread of the default pool held, as by synchronous tools running long.
        held = [loop.run_in_executor(None, release.wait, 30) for _ in range(64)]
        forever = asyncio.create_task(worker.run_forever())
        await asyncio.sleep(1.5)
        release.set()
        worker.stop()
        await asyncio.wait_for(forever, 10)
        await asyncio.gather(*held)

    asyncio.run(serve())
    assert len(listings) >= 3, listings


# -- across processes -------------------------------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parents[1]), e.get("PYTHONPATH", "")])
    e["WORKER_LEDGER"] = str(tmp_path / "ledger.txt")
    e["WORKER_LEASE_TTL"] = "1.0"
    yield e


def worker_pass(url: str, prefix: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--table-prefix", prefix,
         "--app", "worker_app:build", "--once", "--json"],
        capture_output=True, text=True, env=env, cwd=HERE, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def ledger_lines(env: dict[str, str]) -> list[str]:
    path = Path(env["WORKER_LEDGER"])
    return path.read_text().splitlines() if path.exists() else []


def wait_for_first_charge(env: dict[str, str], runs: list[str]) -> None:
    """The driver to kill is mid-run: at least one charge of `runs` has landed."""
    deadline = time.time() + 60
    while not any(line.split()[0] in runs for line in ledger_lines(env)):
        assert time.time() < deadline, "the driver never charged"
        time.sleep(0.005)


def kill_driver_mid_run(url: str, prefix: str, runs: list[str], env: dict[str, str], *, after: float) -> None:
    """Drive `runs` in a child process and SIGKILL it `after` seconds past its first charge."""
    child = subprocess.Popen(
        [sys.executable, str(HERE / "worker_app.py"), url, prefix, ",".join(runs)],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == "driving"
    wait_for_first_charge(env, runs)
    time.sleep(after)
    child.send_signal(signal.SIGKILL)
    child.wait()


@pytest.mark.slow
def test_killed_driver_is_resumed_by_a_worker_in_another_process(
    durable_store_spec: tuple[str, str], env: dict[str, str]
) -> None:
    url, prefix = durable_store_spec
    rng = random.Random(1234)
    for trial in range(4):
        runs = [f"k{trial}-{i}" for i in range(6)]
        env["WORKER_MODEL_DELAY"] = "0.05"
        kill_driver_mid_run(url, prefix, runs, env, after=rng.uniform(0.0, 0.3))
        deadline = time.time() + 60
        store = bide.open_store(url, table_prefix=prefix)
        started = [r for r in runs if bide.run_status(store, r).status != "not_started"]
        while any(bide.run_status(store, r).status != "completed" for r in started):
            assert time.time() < deadline, "the worker did not finish the killed runs"
            worker_pass(url, prefix, env)
            time.sleep(0.2)
        store.close()
        lines = ledger_lines(env)
        for r in runs:
            fired = (lines.count(f"{r} 1"), lines.count(f"{r} 2"))
            assert fired == ((1, 1) if r in started else (0, 0)), (r, lines)


@pytest.mark.slow
def test_two_workers_racing_resume_each_run_once(
    durable_store_spec: tuple[str, str], env: dict[str, str]
) -> None:
    url, prefix = durable_store_spec
    runs = [f"race-{i}" for i in range(10)]
    env["WORKER_MODEL_DELAY"] = "0.02"
    kill_driver_mid_run(url, prefix, runs, env, after=0.0)
    time.sleep(1.1)  # the killed driver's leases expire
    store = bide.open_store(url, table_prefix=prefix)
    before = [r for r in runs if bide.run_status(store, r).status != "completed"]
    # A run killed before its first turn was journaled does not exist: no worker starts it (on a slow
    # machine the kill can come before some runs' first turn).
    never = [r for r in runs if bide.run_status(store, r).status == "not_started"]
    store.close()
    command = [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--table-prefix", prefix,
               "--app", "worker_app:build", "--once", "--json"]  # fmt: skip
    racers = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=HERE) for _ in "ab"]
    reports = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in racers]
    store = bide.open_store(url, table_prefix=prefix)
    unfinished = [r for r in runs if r not in never and bide.run_status(store, r).status != "completed"]
    finished_in_race = [r for r in before if r not in unfinished and r not in never]
    # Each run the race finished was finished by exactly one of the two workers.
    assert sum(r["completed"] for r in reports) == len(finished_in_race)
    # Whatever the race left (a run waiting on a reconciler's deadline), later passes finish.
    deadline = time.time() + 60
    while unfinished:
        assert time.time() < deadline, [bide.run_status(store, r) for r in unfinished]
        worker_pass(url, prefix, env)
        unfinished = [r for r in unfinished if bide.run_status(store, r).status != "completed"]
    lines = ledger_lines(env)
    for r in runs:
        fired = 0 if r in never else 1
        assert lines.count(f"{r} 1") == fired and lines.count(f"{r} 2") == fired, (r, lines)
    assert len(never) < len(runs)  # the kill came after the first charge: some run had started
    store.close()


def payer(store: bide.Store, clock: list[float], gate: Any) -> Callable[[], bide.Agent]:
    """A factory of the agent "payer" (on `clock`), whose model calls `wire` once behind `gate`."""

    @bide.tool(gate=gate)
    def wire(amount: int) -> str:
        """Wire money."""
        return f"sent {amount}"

    def agent() -> bide.Agent:
        model = ScriptedModel([call("wire", amount=5), reply("done")])
        return bide.Agent(model, store=store, tools=[wire], clock=lambda: clock[0], name="payer")

    return agent


def test_a_decision_at_an_approval_gate_is_acted_on_before_the_gates_backoff(store: bide.Store) -> None:
    """A run paused at a gate is consulted again with backoff (here hours), but read every
    PARKED_RECHECK_S: a cancel request that could not tell the worker (made at the wall clock, on which
    the run's lease is live: it leaves the lease alone) is acted on then, and so is a decision (which the
    next test shows acted on sooner)."""
    from bide._worker import PARKED_RECHECK_S
    from bide.approvals import ApprovalGate, submit_decision
    from bide.audit import SigningKey

    alice = SigningKey.generate()
    clock = [1_800_000_000.0]

    agent = payer(store, clock, ApprovalGate.k_of_n(1, {"alice": alice.public}))

    for run_id in ("approved", "cancelled"):
        with pytest.raises(bide.ApprovalPending):
            agent().run_sync(run_id, "pay")
    worker = bide.Worker(store, agent(), clock=lambda: clock[0], backoff=7200, max_backoff=7200)
    clock[0] += 60
    assert asyncio.run(worker.run_once()).waiting == 2  # consulted: still pending
    clock[0] += 5
    assert asyncio.run(worker.run_once()).driven == 0  # no news, backoff not over: nothing driven
    [call_id] = [r.call_id for r in bide.approvals.pending_approvals(store) if r.run_id == "approved"]
    submit_decision(store, "approved", call_id, alice, approve=True)
    bide.cancel_run(store, "cancelled", reason="not needed")
    clock[0] += PARKED_RECHECK_S + 1
    asyncio.run(worker.run_once())
    assert bide.run_status(store, "approved").status == "completed"
    assert bide.run_status(store, "cancelled").status == "cancelled"


def test_a_submitted_decision_is_acted_on_at_the_next_pass(store: bide.Store) -> None:
    """A decision changes the run's lease token (`submit_decision` takes and frees the lease), so the worker
    reads the waiting run at its next pass and drives it: not after its gate's backoff (here hours) nor its
    PARKED_RECHECK_S (the clock does not move). A pass without news drives nothing."""
    from bide.approvals import ApprovalGate, submit_decision
    from bide.audit import SigningKey

    alice = SigningKey.generate()
    clock = [1_800_000_000.0]

    agent = payer(store, clock, ApprovalGate.k_of_n(1, {"alice": alice.public}))

    with pytest.raises(bide.ApprovalPending):
        agent().run_sync("r", "pay")
    worker = bide.Worker(store, agent(), clock=lambda: clock[0], backoff=7200, max_backoff=7200)
    assert asyncio.run(worker.run_once()).waiting == 1  # consulted: still pending
    for _ in range(3):
        assert asyncio.run(worker.run_once()).driven == 0  # no news: nothing driven, whatever it read
    [pending] = bide.approvals.pending_approvals(store)
    submit_decision(store, "r", pending.call_id, alice, approve=True)
    assert asyncio.run(worker.run_once()).completed == 1
    assert bide.run_status(store, "r").status == "completed"


@pytest.mark.parametrize("when", ["right after the gate's drive", "during the gate's drive"])
def test_a_decision_submitted_around_the_workers_gate_drive_is_acted_on_at_the_next_pass(
    store: bide.Store, when: str
) -> None:
    """A decision that lands right after the worker's drive of the gate (its lease token changes before the
    worker's next listing, which must not take the changed token as the one to compare with), or while that
    drive runs (after the gate read the journal: the lease is live, so its token does not change, but the
    journal holds more records than the gate saw) is acted on at the next pass, not after the backoff."""
    from bide.approvals import ApprovalGate, submit_decision
    from bide.audit import SigningKey

    alice, bob = SigningKey.generate(), SigningKey.generate()
    clock = [1_800_000_000.0]
    inner = ApprovalGate.k_of_n(2, {"alice": alice.public, "bob": bob.public})
    bob_decides_now: list[bool] = []

    class BobDecidesMeanwhile:
        async def check(self, request: bide.GateRequest) -> bide.GateDecision:
            decision = await inner.check(request)
            if bob_decides_now:
                bob_decides_now.clear()
                submit_decision(store, request.run_id, request.call_id, bob, approve=True)
            return decision

    agent = payer(store, clock, BobDecidesMeanwhile())

    with pytest.raises(bide.ApprovalPending):
        agent().run_sync("r", "pay")
    [pending] = bide.approvals.pending_approvals(store)
    submit_decision(store, "r", pending.call_id, alice, approve=True)
    worker = bide.Worker(store, agent(), clock=lambda: clock[0], backoff=7200, max_backoff=7200)
    if when == "during the gate's drive":
        bob_decides_now.append(True)
    assert asyncio.run(worker.run_once()).waiting == 1  # consulted: 1 of 2
    if when == "right after the gate's drive":
        submit_decision(store, "r", pending.call_id, bob, approve=True)
    asyncio.run(worker.run_once())
    assert bide.run_status(store, "r").status == "completed"


def test_a_wall_clock_stepped_back_does_not_hold_up_a_backed_off_run(store: bide.Store) -> None:
    """A failed drive is retried after its backoff, measured on the worker's monotonic timer: an NTP step
    of the wall clock back by an hour made a 0.2 s backoff last an hour more (the deadline was on the wall
    clock). The lease listing still reads the wall clock, as the agents' leases are on it."""

    @bide.tool(safety=bide.ReadOnly)
    def note(text: str) -> str:
        """Take a note."""
        return text

    model = ScriptedModel(
        [call("note", text="x"), Fail(bide.ModelError("down")), Fail(bide.ModelError("down")), reply("done")]
    )
    agent = bide.Agent(model, store=store, tools=[note], name="a", lease_ttl=5.0)
    with pytest.raises(bide.ModelError):
        agent.run_sync("r", "go")
    worker = bide.Worker(store, agent, backoff=0.2, max_backoff=0.2)
    assert asyncio.run(worker.run_once()).failed == 1  # backed off for 0.1-0.2 s
    worker.clock = lambda: time.time() - 3600  # the wall clock stepped back by an hour
    time.sleep(0.25)
    report = asyncio.run(worker.run_once())
    assert (report.completed, report.skipped) == (1, 0), report
    assert bide.run_status(store, "r").status == "completed"


def test_a_store_failure_reading_one_run_again_does_not_cancel_the_passs_other_drives() -> None:
    """After a drive pauses at a gate the worker reads its journal again (to see when a decision comes);
    that read failing used to escape `run_once`, whose task group then cancelled every other drive in
    flight, an async side effect included (its run left halted for a person)."""
    store = bide.MemoryStore()
    failing = {"armed": False}
    read = store.aload

    async def flaky(run_id: str, after: int = 0) -> list[bide.Entry]:
        if failing["armed"] and run_id == "gated":
            failing["armed"] = False
            raise bide.StoreError("the connection was lost")
        return await read(run_id, after)

    store.aload = flaky  # type: ignore[method-assign]

    class Manager:
        async def check(self, request: Any) -> Any:
            failing["armed"] = True  # the worker's next read of this run fails
            return bide.Pending("a manager must approve")

    charges: list[int] = []

    @bide.tool
    async def charge(n: int) -> str:
        """Charge."""
        await asyncio.sleep(0.5)
        charges.append(n)
        return "charged"

    @bide.tool(gate=Manager())
    async def wire(n: int) -> str:
        """Wire."""
        return "wired"

    @bide.tool(safety=bide.ReadOnly)
    def peek() -> str:
        """Look."""
        return "seen"

    def agent(name: str, turns: list[Any], tool: bide.Tool) -> bide.Agent:
        return bide.Agent(ScriptedModel(turns), store=store, tools=[peek, tool], name=name)

    for name, tool in (("slow", charge), ("gated", wire)):  # each run's second model turn fails
        with pytest.raises(bide.ModelError):
            agent(name, [call("peek"), Fail(bide.ModelError("down"))], tool).run_sync(name, "go")
    resumers = [agent(name, [call("peek"), call(tool.name, n=1), reply("Done.")], tool) for name, tool in
                (("slow", charge), ("gated", wire))]  # fmt: skip (a scripted model answers by turn)
    report = asyncio.run(bide.Worker(store, resumers, concurrency=4).run_once())
    assert bide.run_status(store, "slow").status == "completed" and charges == [1]
    assert bide.run_status(store, "gated").status == "awaiting_approval"
    assert report.completed == 1 and report.waiting == 1


# -- `bide worker --once`: how the pass exits ---------------------------------------------------------------

ONCE_APP = '''"""The app of the `bide worker --once` exit-code tests: $WORKER_MODE says how its drives go."""
import os

import bide
from bide.testing import Fail, ScriptedModel, call, reply


@bide.tool
def charge(n: int) -> str:
    """Charge (one line in $WORKER_LEDGER per real fire)."""
    with open(os.environ["WORKER_LEDGER"], "a") as f:
        f.write(f"{n}\\n")
    return "charged"


def agent(store, last):
    model = ScriptedModel([call("charge", n=1), call("charge", n=2), last])
    return bide.Agent(model, store=store, tools=[charge], name="pay", output_type=int, output_retries=0)


def seed(store, run_id):
    """Start `run_id` and leave it to a worker: its model goes down after the first charge."""
    try:
        bide.Agent(ScriptedModel([call("charge", n=1), Fail(bide.ModelError("down"))]), store=store,
                   tools=[charge], name="pay", output_type=int).run_sync(run_id, "pay")
    except bide.ModelError:
        pass


def build(store):
    mode = os.environ.get("WORKER_MODE", "answers")
    if mode == "listing fails":
        def expired_leases(**kwargs):
            raise bide.StoreError("the connection was lost")

        store.expired_leases = expired_leases
    if mode == "model down":
        return agent(store, Fail(bide.ModelError("the model is down")))
    return agent(store, reply("not a number" if mode == "answer invalid" else "7"))
'''


@pytest.fixture
def once_app(tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """A SQLite store URL holding run `w1`, started by ONCE_APP's agent and left to a worker after one
    charge; the app is importable by `bide worker` run in `tmp_path`."""
    import importlib.util

    (tmp_path / "once_app.py").write_text(ONCE_APP)
    spec = importlib.util.spec_from_file_location("once_app", tmp_path / "once_app.py")
    assert spec is not None and spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    monkeypatch.setenv("WORKER_LEDGER", env["WORKER_LEDGER"])
    url = f"sqlite:///{tmp_path / 'once.db'}"
    store = bide.open_store(url)
    try:
        app.seed(store, "w1")
    finally:
        store.close()
    assert ledger_lines(env) == ["1"]
    return url


def worker_once(
    url: str, env: dict[str, str], cwd: Path, mode: str = "answers", *, wrap: list[str] | None = None
) -> tuple[int, dict[str, Any] | None, str]:
    """Run `bide worker --once --json` over ONCE_APP: its exit code, its JSON document (the pass's report, or
    the failure's when there was no pass; None: none) and stderr."""
    done = subprocess.run(
        [*(wrap or []), sys.executable, "-m", "bide._cli", "worker", "--store", url,
         "--app", "once_app:build", "--once", "--json"],
        capture_output=True, text=True, env=env | {"WORKER_MODE": mode}, cwd=cwd, timeout=120,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None, done.stderr


def test_worker_once_exits_6_when_the_store_cannot_be_written_and_the_next_pass_loses_nothing(
    once_app: str, env: dict[str, str], tmp_path: Path
) -> None:
    """Every drive of the pass failed because the store refused its writes (a read-only store file): the
    pass used to exit 0, as if the runs had been driven."""
    wrap: list[str] = []
    if os.geteuid() == 0:  # root writes read-only files: the worker runs without that privilege
        assert shutil.which("capsh"), "make test installs capsh (libcap2-bin): root writes read-only files"
        wrap = ["capsh", "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--", "-c",
                'exec "$@"', "--"]  # fmt: skip
    database = tmp_path / "once.db"
    database.chmod(0o444)
    try:
        code, report, errors = worker_once(once_app, env, tmp_path, wrap=wrap)
    finally:  # SQLite gave the -shm it created the database's mode: the operator's fix covers both
        for path in tmp_path.glob("once.db*"):
            path.chmod(0o644)
    assert code == 6, errors
    assert report is not None and (report["failed"], report["completed"]) == (1, 0), report
    assert report["errors"]["w1"].startswith("StoreError: ") and "readonly database" in report["errors"]["w1"]
    assert report["causes"] == {"w1": "store"}
    assert "bide worker: the store failed in 1 drive (run w1: StoreError: " in errors
    assert ledger_lines(env) == ["1"]  # the drive failed before the second charge
    code, report, errors = worker_once(once_app, env, tmp_path, wrap=wrap)
    assert (code, report and report["completed"]) == (0, 1), errors
    assert ledger_lines(env) == ["1", "2"]  # each charge once


def test_worker_json_without_once_is_a_usage_error(
    once_app: str, env: dict[str, str], tmp_path: Path
) -> None:
    """`--json` is the report of a `--once` pass: a worker serving until stopped never prints one, so the
    two are refused together (exit 2, before the store is opened) instead of serving silently."""
    done = subprocess.run(
        [sys.executable, "-m", "bide._cli", "worker", "--store", once_app,
         "--app", "once_app:build", "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "worker --json needs --once" in done.stderr
    assert json.loads(done.stdout)["reason"] == "usage error"
    assert ledger_lines(env) == ["1"]  # nothing was driven


def test_worker_once_exits_6_when_the_store_fails_listing_the_runs(
    once_app: str, env: dict[str, str], tmp_path: Path
) -> None:
    """A listing that fails used to escape the pass's task group as an ExceptionGroup: an internal error
    (exit 3, "this is a bug") instead of the store's failure."""
    code, report, errors = worker_once(once_app, env, tmp_path, "listing fails")
    assert report is not None, errors
    assert (code, report["exit_code"], report["reason"]) == (6, 6, "store failed"), errors
    why = "the store failed listing the runs to recover, so none was driven: the connection was lost"
    assert why in errors and report["message"].startswith(why)
    assert "internal error" not in errors and ledger_lines(env) == ["1"]


@pytest.mark.postgres
def test_a_listing_that_waits_out_a_lock_says_what_failed(pg_prefix: str) -> None:
    """Another session holds the runs table (a migration, VACUUM FULL) past the busy timeout: the worker's
    listing said "expired wrote nothing", an internal request name, and "wrote nothing" of a read."""
    import sqlalchemy as sa
    from conftest import PG_URL

    store = bide.SQLStore(PG_URL, table_prefix=pg_prefix, busy_timeout=1)
    locker = sa.create_engine(PG_URL).connect()
    transaction = locker.begin()
    locker.exec_driver_sql(f"LOCK TABLE {pg_prefix}runs IN ACCESS EXCLUSIVE MODE")
    try:
        with pytest.raises(bide.StoreError) as failed:
            store.expired_leases(now_ms=int(time.time() * 1000))
    finally:
        transaction.rollback()
        locker.close()
        store.close()
    said = str(failed.value)
    assert "listing the runs' leases failed" in said and "stayed locked" in said, said
    assert "wrote nothing" not in said and "expired" not in said, said


def test_worker_once_exits_1_when_a_drive_fails_otherwise_and_0_when_a_drive_ends_its_run(
    once_app: str, env: dict[str, str], tmp_path: Path
) -> None:
    """The model down is a failed drive (exit 1, retried at the next pass); a drive that ends its run as
    failed (its answer never validated: OutputInvalid) gave the run's outcome, as a halt does (exit 0)."""
    code, report, errors = worker_once(once_app, env, tmp_path, "model down")
    assert code == 1, errors
    assert report is not None and report["errors"] == {"w1": "ModelError: the model is down"}
    assert report["causes"] == {"w1": "error"}
    assert "bide worker: 1 drive failed (run w1: ModelError: the model is down)" in errors
    code, report, errors = worker_once(once_app, env, tmp_path, "answer invalid")
    assert code == 0, errors
    assert report is not None and report["errors"]["w1"].startswith("OutputInvalid: "), report
    assert report["causes"] == {"w1": "output"}
    assert "bide worker:" not in errors
    store = bide.open_store(once_app, create=False)
    try:
        assert bide.run_status(store, "w1").status == "failed"
    finally:
        store.close()
    assert ledger_lines(env) == ["1", "2"]


AHEAD_APP = """
import os, signal, sys, time
import bide
from bide.testing import ScriptedModel, call, reply


def ahead():
    return time.time() + 3600


@bide.tool(safety=bide.ReadOnly)
def note(text: str) -> str:
    \"\"\"Take a note.\"\"\"
    if os.environ.get("DIE"):
        os.kill(os.getpid(), signal.SIGKILL)  # the driver dies holding the run's lease
    return text


def agent(store):
    model = ScriptedModel([call("note", text="x"), reply("done")])
    return bide.Agent(model, store=store, tools=[note], name="a", lease_ttl=0.5, clock=ahead)


if __name__ == "__main__":
    agent(bide.open_store(sys.argv[1])).run_sync("r", "go")
"""


def test_a_worker_judges_leases_by_the_clock_its_agents_share(tmp_path: Path) -> None:
    """The agents stamp leases with their clock; a worker given none judged them by the wall clock, so the
    lease of a driver killed on a clock an hour ahead looked live for an hour and its run was not resumed.
    The worker takes the clock its agents share; agents with different clocks need one given."""
    (tmp_path / "ahead_app.py").write_text(AHEAD_APP)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    died = subprocess.run(
        [sys.executable, str(tmp_path / "ahead_app.py"), url], env=dict(os.environ, DIE="1"), timeout=60
    )
    assert died.returncode == -signal.SIGKILL
    sys.path.insert(0, str(tmp_path))
    try:
        import ahead_app
    finally:
        sys.path.remove(str(tmp_path))
    store = bide.open_store(url)
    try:
        worker = bide.Worker(store, ahead_app.agent(store), backoff=0.01, max_backoff=0.02)
        deadline = time.time() + 5
        while bide.run_status(store, "r").status != "completed":
            assert time.time() < deadline, bide.run_status(store, "r")
            asyncio.run(worker.run_once())
            time.sleep(0.05)
        assert worker.clock is ahead_app.ahead
        other = bide.Agent(ScriptedModel([reply("x")]), store=store, name="b")  # on the wall clock
        with pytest.raises(bide.ConfigError, match="different clocks"):
            bide.Worker(store, [ahead_app.agent(store), other])
        assert bide.Worker(store, [ahead_app.agent(store), other], clock=time.time).clock is time.time
        assert bide.Worker(store, other).clock is time.time

        @dataclasses.dataclass
        class Clock:  # a callable dataclass: unhashable (a set of clocks raised TypeError)
            offset: float

            def __call__(self) -> float:
                return time.time() + self.offset

        clock = Clock(0.0)
        same = [bide.Agent(ScriptedModel([reply("x")]), store=store, name=n, clock=clock) for n in "cd"]
        assert bide.Worker(store, same).clock is clock
    finally:
        store.close()


def test_a_run_ended_as_cancelled_is_counted_as_cancelled_and_a_halt_names_bide_resolve(
    store: bide.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A run the worker's drive ended as cancelled was reported (and logged) as "completed"; a halt's
    warning named only the library's `bide.resolve_halt(store, ...)`, where a worker's operator has a
    shell."""

    @bide.tool(timeout=30)
    async def wire() -> str:
        """Send a wire (its outcome is lost)."""
        raise ConnectionResetError("lost after sending")

    def agent(script: list[Any], **options: Any) -> bide.Agent:
        tools = [wire]
        return bide.Agent(ScriptedModel(script), store=store, tools=tools, name="a", lease_ttl=5.0, **options)

    caplog.set_level(logging.INFO, logger="bide.worker")
    agent([reply("hello")]).thread("idle").send_sync("hi")
    assert bide.cancel_run(store, "idle", reason="not needed") is True
    report = asyncio.run(bide.Worker(store, agent([reply("never asked")])).run_once())
    assert (report.completed, report.cancelled, report.driven) == (0, 1, 1), report
    assert bide.run_status(store, "idle").status == "cancelled"
    assert "run idle ended as cancelled" in caplog.text

    with pytest.raises(bide.OutcomeUnknown):  # the wire's deadline has passed on the wall clock
        agent([call("wire"), reply("sent")], clock=behind).run_sync("wired", "pay")
    assert asyncio.run(bide.Worker(store, agent([reply("never asked")])).run_once()).halted == 1
    prefix = getattr(store, "table_prefix", "bide_")
    given = "" if prefix == "bide_" else f" --table-prefix {prefix}"  # (`--`: a run id may start with "-")
    choices = "(--succeeded JSON | --failed MESSAGE | --not-started)"
    line = f"{given} {choices} --attempt 0 -- wired c0.0"
    assert line in caplog.text and "(from a shell: bide resolve --store " in caplog.text
    assert "run idle ended as cancelled: Cancelled: not needed" in caplog.text
