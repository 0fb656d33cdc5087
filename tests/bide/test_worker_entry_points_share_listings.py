"""`run_once` and `run_forever` of one worker: each drive goes by the listing that started it.

A pass drove a run its listing gave even when `run_forever` had driven and parked it since (the pass's drive
had waited for its turn): a wasted read, and a park or wait made from the pass's older listing, which did not
hold, so the run was read again at the next poll. And a drive took its run's lease token from the latest
listing, whichever entry point made it: one made while the drive was about to start did not list the run (in
flight), so the drive parked it with no token, and the run was read again at the next poll."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from halting import Said, halted, until, wait_in_thread, wire

import bide
from bide._store import EVERY_LEASE_MS
from bide.testing import ScriptedModel, call, reply


def agent(store: bide.Store, script: list[Any]) -> bide.Agent:
    """halting.py's agent "a", with a timer too."""
    return bide.Agent(ScriptedModel(script), store=store, tools=[wire, bide.timer()], name="a", lease_ttl=5.0)


def sleeping(store: bide.Store, run_id: str) -> None:
    """Leave `run_id` asleep for an hour on a durable timer."""
    with pytest.raises(bide.RunSleeping):
        agent(store, [call("wait", seconds=3600), reply("woke")]).run_sync(run_id, "wait")
    assert bide.run_status(store, run_id).status == "sleeping"


def reads_from(store: bide.Store, start: threading.Event, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run ids of the store's journal reads (`aload`) made once `start` is set."""
    reads: list[str] = []
    load = store.aload

    def read(run_id: str, after: int = 0) -> Any:
        if start.is_set():
            reads.append(run_id)
        return load(run_id, after)

    monkeypatch.setattr(store, "aload", read)
    return reads


@pytest.mark.parametrize("kind", ["halted", "sleeping"])
def test_a_pass_does_not_drive_a_run_that_run_forever_parked_after_the_pass_listed_it(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch, said: Said, kind: str
) -> None:
    """The pass lists `h` while `run_forever`, its one slot taken by `g`, has yet to take it; before the pass
    comes to drive `h`, `run_forever` has driven it (to halt: it needs a person; or to sleep on: its timer
    is not due) and parked it. The pass leaves it to that drive: it does not read the run, and what that
    drive decided holds for later listings."""
    halted(store, "g")
    if kind == "halted":
        halted(store, "h")
    else:
        sleeping(store, "h")
    worker = bide.Worker(store, agent(store, [reply("never asked")]), poll_interval=0.01, concurrency=1)
    list_leases = store.expired_leases
    g_held = threading.Event()  # run_forever's drive of g holds its lease (its one slot)
    pass_started = threading.Event()
    pass_listed = threading.Event()  # the pass's listing answered, with h (not taken yet)
    h_taken = threading.Event()  # run_forever's drive of h took its lease
    h_done = threading.Event()  # and it is over, the pass yet to drive h
    listings: list[int] = []  # run_forever's listings after the pass

    def listing(**options: Any) -> Any:
        found = list_leases(**options)
        if pass_started.is_set() and not pass_listed.is_set():  # the pass's listing (run_forever waits)
            assert [lease.run_id for lease in found] == ["h"]  # g's lease is held by its drive
            pass_listed.set()
        elif options["now_ms"] == EVERY_LEASE_MS:  # the pass's count of live leases: h driven meanwhile
            wait_in_thread(h_taken, "run_forever's drive of h")
            deadline = time.monotonic() + 30
            while worker.in_flight:
                assert time.monotonic() < deadline, "timed out waiting for run_forever's drive of h to end"
                time.sleep(0.005)
            h_done.set()
        elif h_done.is_set():
            listings.append(len(found))
        return found

    release = store.arelease

    async def in_turn(run_id: str, holder: str, token: int) -> bool:
        if run_id == "g":  # run_forever's slot is taken until the pass has listed h
            g_held.set()
            await until(pass_listed.is_set, "the pass's listing")
        else:
            h_taken.set()
        return bool(await release(run_id, holder, token))

    monkeypatch.setattr(store, "expired_leases", listing)
    monkeypatch.setattr(store, "arelease", in_turn)
    reads = reads_from(store, h_done, monkeypatch)

    async def serve() -> bide.PassReport:
        forever = asyncio.create_task(worker.run_forever())
        try:
            await until(g_held.is_set, "run_forever's drive of g")
            pass_started.set()
            report = await worker.run_once()
            await until(lambda: len(listings) >= 10, "ten listings after the pass")  # nothing changed since
        finally:
            worker.stop()
            await forever
        return report

    report = asyncio.run(serve())
    assert pass_listed.is_set() and h_done.is_set()
    assert report.skipped == 1 and report.driven == 0, report  # h: run_forever's drive decided
    assert reads == [], reads  # neither the pass nor a later listing read h again
    assert len(said.halts("g")) == 1 and len(said.halts("h")) == (kind == "halted"), said.lines
    assert bide.run_status(store, "h").status == kind


def test_a_drive_parks_its_run_as_its_own_listing_gave_it(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch, said: Said
) -> None:
    """A pass lists `h` and starts its drive, whose first step comes late (a busy event loop); meanwhile
    `run_forever` lists the runs, without `h` (in flight). The drive halts the run and parks it with the
    lease token the pass listed: later listings leave it alone."""
    halted(store, "h")
    worker = bide.Worker(store, agent(store, [reply("never asked")]), poll_interval=0.01)
    list_leases = store.expired_leases
    forever_started = threading.Event()
    forever_listings: list[list[str]] = []  # run_forever's listings, from its start on

    def listing(**options: Any) -> Any:
        found = list_leases(**options)
        if forever_started.is_set():
            forever_listings.append([lease.run_id for lease in found])
        return found

    pass_over = threading.Event()
    monkeypatch.setattr(store, "expired_leases", listing)
    reads = reads_from(store, pass_over, monkeypatch)
    h_waits = asyncio.Event()  # the pass's drive of h is in flight, its first step not taken
    listed_meanwhile = asyncio.Event()

    def late_first_step(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Task[Any]:
        async def first_step() -> Any:
            task = asyncio.current_task()
            if task is not None and task.get_name() == "bide-worker:h" and not h_waits.is_set():
                h_waits.set()
                await listed_meanwhile.wait()
            return await coro

        return asyncio.Task(first_step(), loop=loop, **options)

    async def serve() -> bide.PassReport:
        asyncio.get_running_loop().set_task_factory(late_first_step)
        a_pass = asyncio.create_task(worker.run_once())
        await h_waits.wait()
        forever_started.set()
        forever = asyncio.create_task(worker.run_forever())
        try:
            # Its second listing began: the first answered (a listing ends before the next begins).
            await until(lambda: len(forever_listings) >= 2, "run_forever's listing")
            listed_meanwhile.set()
            report = await a_pass
            pass_over.set()
            at = len(forever_listings)
            await until(lambda: len(forever_listings) >= at + 10, "ten listings after the pass")
        finally:
            worker.stop()
            await forever
        return report

    report = asyncio.run(serve())
    assert forever_listings[0] == ["h"]  # listed by the store, left out by run_forever: in flight
    assert report.halted == 1, report
    assert reads == [], reads  # no later listing read h again
    assert len(said.halts("h")) == 1, said.lines
    assert bide.run_status(store, "h").status == "halted"
