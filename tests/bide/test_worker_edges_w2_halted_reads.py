"""A run the worker halted itself (a side effect's outcome unknown, no reconciler: it needs a person) is
parked as the journal it read after the halt: it is not read again while its lease and latest record stay
as they were. It was read once more PARKED_RECHECK_S (30 s) later although nothing had changed. A record
written later has it read at the next pass, and a cancel request written while the worker's drive held
its lease has it ended as cancelled at the next pass (it waited for that recheck).

A run the worker halted itself is parked on the lease token and latest record its drive started from.
`run_forever` lists the runs again while a drive is in flight, and that listing skips the run: the park
read the latest listing's token, which no longer had the run, so the run was read and driven again at the
next poll although nothing had changed (and at every poll, when a journal read took longer than one)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from halting import Said, agent, halted, until

import bide
from bide._worker import PARKED_RECHECK_S
from bide.testing import reply


def test_a_run_the_worker_halted_is_not_read_again_until_it_changes(
    store: bide.Store, journal_reads: Callable[[bide.Store], list[str]]
) -> None:
    halted(store, "h")
    clock = [time.time()]
    worker = bide.Worker(store, agent(store, [reply("never asked")]), clock=lambda: clock[0], backoff=3600,
                         max_backoff=3600)  # fmt: skip
    reads = journal_reads(store)
    assert asyncio.run(worker.run_once()).halted == 1  # driven, to halt again: it needs a person
    assert "h" in reads
    reads.clear()
    for _ in range(4):  # past PARKED_RECHECK_S, several times: nothing changed, nothing read
        clock[0] += PARKED_RECHECK_S + 1
        assert asyncio.run(worker.run_once()).driven == 0
    assert reads == [], reads
    bide.Journal(store, "h").load().write([bide.GateRecord(key="note:later", data=1)])
    asyncio.run(worker.run_once())  # news: read at the next pass, without waiting for any recheck
    assert "h" in reads, reads
    assert bide.run_status(store, "h").status == "halted"


def test_a_cancel_request_written_while_the_worker_drove_the_run_ends_it_at_the_next_pass(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    halted(store, "h")
    clock = [time.time()]
    worker = bide.Worker(store, agent(store, [reply("never asked")]), clock=lambda: clock[0], backoff=3600,
                         max_backoff=3600)  # fmt: skip
    release = store.arelease
    requested: list[bool] = []

    async def cancel_then_release(run_id: str, holder: str, token: int) -> bool:
        # The drive holds the lease: the request is recorded and leaves the lease alone.
        if not requested:
            requested.append(await asyncio.to_thread(bide.cancel_run, store, run_id, reason="not needed"))
        return bool(await release(run_id, holder, token))

    monkeypatch.setattr(store, "arelease", cancel_then_release)
    assert asyncio.run(worker.run_once()).halted == 1
    assert requested == [True]
    monkeypatch.setattr(store, "arelease", release)
    report = asyncio.run(worker.run_once())  # the clock has not moved: no recheck is due
    assert report.cancelled == 1, report
    assert bide.run_status(store, "h").status == "cancelled"


def test_a_run_halted_while_listings_ran_during_its_drive_is_not_read_again(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    halted(store, "h")
    listings: list[int] = []
    list_leases = store.expired_leases

    def counted_listing(**options: Any) -> Any:
        found = list_leases(**options)
        listings.append(len(found))
        return found

    reads: list[tuple[str, int]] = []  # each read of a journal, and how many listings had run then
    load = store.aload

    async def read(run_id: str, after: int = 0) -> Any:
        reads.append((run_id, len(listings)))
        if len(reads) == 1:  # the drive's first read: the worker lists the runs twice meanwhile
            at = len(listings)
            await until(lambda: len(listings) >= at + 2, "listings during the drive")
        return await load(run_id, after)

    monkeypatch.setattr(store, "expired_leases", counted_listing)
    monkeypatch.setattr(store, "aload", read)
    said = Said()
    logging.getLogger("bide.worker").addHandler(said)
    worker = bide.Worker(store, agent(store, [reply("never asked")]), poll_interval=0.01)

    async def serve() -> int:
        forever = asyncio.create_task(worker.run_forever())
        try:
            await until(lambda: any(line.startswith("run h halted") for line in said.lines), "the halt")
            at_halt = len(listings)
            await until(lambda: len(listings) >= at_halt + 10, "ten more listings")
        finally:
            worker.stop()
            await forever
        return at_halt

    try:
        at_halt = asyncio.run(serve())
    finally:
        logging.getLogger("bide.worker").removeHandler(said)
    assert [line for line in said.lines if line.startswith("run h halted")] == [said.lines[0]], said.lines
    assert reads and reads[0] == ("h", reads[0][1])
    read_later = [at for run_id, at in reads if run_id == "h" and at > at_halt]
    assert read_later == [], (reads, at_halt)  # parked: its lease and journal are as its drive left them
    assert bide.run_status(store, "h").status == "halted"


def test_a_listing_that_ran_while_the_drive_held_the_lease_keeps_the_park_it_answers_after(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing made while the drive held the run's lease does not list the run (a live lease); when its
    answer comes after the drive ended (a loaded machine: its thread waits for a core), the run is neither
    listed nor in flight any more. Its parked state must survive that answer: dropped as a run that ended or
    that another driver holds, the run was read and driven again at the next poll, to halt a second time."""
    halted(store, "h")
    worker = bide.Worker(store, agent(store, [reply("never asked")]), poll_interval=0.01)
    list_leases = store.expired_leases
    late: list[bool] = []
    listings: list[int] = []

    def late_listing(**options: Any) -> Any:
        found = list_leases(**options)
        listings.append(len(found))
        if not late and all(lease.run_id != "h" for lease in found):  # made while the drive held the lease
            late.append(True)
            deadline = time.monotonic() + 30
            while worker.in_flight and time.monotonic() < deadline:  # answered once the drive ended
                time.sleep(0.005)
        return found

    release = store.arelease

    async def listed_then_release(run_id: str, holder: str, token: int) -> bool:
        # The drive holds the lease: a listing runs meanwhile, which does not list the run.
        await until(lambda: bool(late), "a listing while the drive held the lease")
        return bool(await release(run_id, holder, token))

    monkeypatch.setattr(store, "expired_leases", late_listing)
    monkeypatch.setattr(store, "arelease", listed_then_release)
    said = Said()
    logging.getLogger("bide.worker").addHandler(said)

    async def serve() -> None:
        forever = asyncio.create_task(worker.run_forever())
        try:
            await until(lambda: any(line.startswith("run h halted") for line in said.lines), "the halt")
            at = len(listings)
            await until(lambda: len(listings) >= at + 10, "ten more listings")  # nothing changed meanwhile
        finally:
            worker.stop()
            await forever

    try:
        asyncio.run(serve())
    finally:
        logging.getLogger("bide.worker").removeHandler(said)
    assert late == [True]
    assert [line for line in said.lines if line.startswith("run h halted")] == [said.lines[0]], said.lines
    assert bide.run_status(store, "h").status == "halted"
