"""A `run_once` pass's drives are the worker's drives in flight, as `run_forever`'s are.

They were not registered as such: a listing of the same worker object (its `run_forever`, or another pass)
made while a pass's drive held a run's lease did not list the run, and once it answered after that drive
had parked the run, it dropped the park (the run was neither listed nor, as far as it knew, in flight): the
run was read and driven again, to halt a second time (logged and counted again). And a pass drove a run it
had listed although `run_forever` had taken it meanwhile: a wasted drive, which the lease refused."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from halting import Said, agent, halted, until, wait_in_thread

import bide
from bide._store import EVERY_LEASE_MS
from bide.testing import reply


@pytest.mark.parametrize("other", ["run_forever", "run_once"])
def test_a_listing_made_while_a_pass_drove_the_run_keeps_the_park_the_pass_made(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch, said: Said, other: str
) -> None:
    """A pass drives a halted run (to halt again: it needs a person); while its drive holds the run's lease,
    `other` (of the same worker) lists the runs, and that listing answers once the pass is over. The run is
    driven once: its park survives the answer, and later listings leave it alone."""
    halted(store, "h")
    worker = bide.Worker(store, agent(store, [reply("never asked")]), poll_interval=0.01)
    list_leases = store.expired_leases
    holding = threading.Event()  # the pass's drive holds the lease, about to release it
    late = threading.Event()  # a listing was made meanwhile, which did not list the run
    pass_over = threading.Event()
    listings: list[int] = []

    def late_listing(**options: Any) -> Any:
        found = list_leases(**options)
        if options["now_ms"] != EVERY_LEASE_MS:
            listings.append(len(found))
        if holding.is_set() and not late.is_set() and all(lease.run_id != "h" for lease in found):
            late.set()
            wait_in_thread(pass_over, "the pass")  # answered once the pass is over, its drive's park made
        return found

    release = store.arelease

    async def listed_then_release(run_id: str, holder: str, token: int) -> bool:
        if not holding.is_set():
            holding.set()
            await until(late.is_set, "a listing while the drive held the lease")
        return bool(await release(run_id, holder, token))

    monkeypatch.setattr(store, "expired_leases", late_listing)
    monkeypatch.setattr(store, "arelease", listed_then_release)

    async def serve() -> list[bide.PassReport]:
        a_pass = asyncio.create_task(worker.run_once())
        await until(holding.is_set, "the pass's drive holding the lease")
        if other == "run_forever":
            forever = asyncio.create_task(worker.run_forever())
            try:
                reports = [await a_pass]
                pass_over.set()
                at = len(listings)
                await until(lambda: len(listings) >= at + 10, "ten more listings")  # nothing changed since
            finally:
                worker.stop()
                await forever
            return reports
        second = asyncio.create_task(worker.run_once())
        reports = [await a_pass]
        pass_over.set()
        reports.append(await second)
        reports.append(await worker.run_once())  # a later pass: nothing changed since the halt
        return reports

    reports = asyncio.run(serve())
    assert late.is_set()
    assert reports[0].halted == 1, reports
    assert [report.driven for report in reports[1:]] == [0] * (len(reports) - 1), reports
    assert said.halts("h") == [said.halts("h")[0]], said.lines  # driven once, halted once
    assert bide.run_status(store, "h").status == "halted"


def test_a_pass_does_not_drive_a_run_that_run_forever_took_after_the_pass_listed_it(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch, said: Said
) -> None:
    """The pass lists `h` while `run_forever`, its one slot taken by `g`, has yet to take it; by the time the
    pass comes to drive `h`, `run_forever` is driving it (and holds its lease). The pass leaves it to that
    drive: it does not read or drive the run a second time (a drive the lease would refuse)."""
    halted(store, "g")
    halted(store, "h")
    worker = bide.Worker(store, agent(store, [reply("never asked")]), poll_interval=0.01, concurrency=1)
    list_leases = store.expired_leases
    g_held = threading.Event()  # run_forever's drive of g holds its lease (its one slot)
    pass_started = threading.Event()
    pass_listed = threading.Event()  # the pass's listing answered, with h (not taken yet)
    h_held = threading.Event()  # run_forever's drive of h holds its lease
    pass_over = threading.Event()

    def listing(**options: Any) -> Any:
        found = list_leases(**options)
        if pass_started.is_set() and not pass_listed.is_set():  # the pass's listing (run_forever waits)
            assert [lease.run_id for lease in found] == ["h"]  # g's lease is held by its drive
            pass_listed.set()
        elif options["now_ms"] == EVERY_LEASE_MS:  # the pass's count of live leases: h taken meanwhile
            wait_in_thread(h_held, "run_forever's drive of h")
        return found

    release = store.arelease

    async def release_in_turn(run_id: str, holder: str, token: int) -> bool:
        if run_id == "g":  # run_forever's slot is taken until the pass has listed h
            g_held.set()
            await until(pass_listed.is_set, "the pass's listing")
        else:  # the drive of h holds its lease until the pass is over
            h_held.set()
            await until(pass_over.is_set, "the pass")
        return bool(await release(run_id, holder, token))

    reads: list[str] = []  # the journals read from the take of h by run_forever until the pass was over
    load = store.aload

    async def read(run_id: str, after: int = 0) -> Any:
        if h_held.is_set() and not pass_over.is_set():  # (run_forever's drive of h waits in its release)
            reads.append(run_id)
        return await load(run_id, after)

    monkeypatch.setattr(store, "expired_leases", listing)
    monkeypatch.setattr(store, "arelease", release_in_turn)
    monkeypatch.setattr(store, "aload", read)

    async def serve() -> bide.PassReport:
        forever = asyncio.create_task(worker.run_forever())
        try:
            await until(g_held.is_set, "run_forever's drive of g")
            pass_started.set()
            report = await worker.run_once()
            pass_over.set()
            await until(lambda: said.halts("h"), "the halt of h")
        finally:
            worker.stop()
            await forever
        return report

    report = asyncio.run(serve())
    assert pass_listed.is_set() and h_held.is_set()
    assert report.skipped == 1 and report.driven == 0, report  # h: run_forever's drive had it
    assert "h" not in reads, reads  # the pass did not read h to drive it
    assert len(said.halts("g")) == 1 and len(said.halts("h")) == 1, said.lines
    assert bide.run_status(store, "h").status == "halted"
