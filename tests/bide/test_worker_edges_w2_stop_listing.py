"""A worker's stop does not wait for a listing under way: `stop()` (SIGTERM for `bide worker`) returned only
once the store had answered the listing of expired leases, which on a slow store (a database busy with
writers, a lock waited for) put the stop off by the listing's time. The listing's answer is abandoned."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import bide
from bide.testing import ScriptedModel, reply

REPO = Path(__file__).resolve().parents[2]


class StuckListing(bide.MemoryStore):
    """A memory store whose listings of expired leases wait until `unblock` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.listing = threading.Event()  # set once a listing waits
        self.unblock = threading.Event()

    def expired_leases(self, *, now_ms: int, after: str = "", limit: int = 500) -> list[bide.Lease]:
        self.listing.set()
        self.unblock.wait(60)
        return super().expired_leases(now_ms=now_ms, after=after, limit=limit)


async def until(event: threading.Event) -> None:
    deadline = time.monotonic() + 10
    while not event.is_set():
        assert time.monotonic() < deadline, "the worker never listed"
        await asyncio.sleep(0.01)


def test_stop_does_not_wait_for_a_listing_under_way_in_run_forever() -> None:
    store = StuckListing()
    worker = bide.Worker(store, bide.Agent(ScriptedModel([reply("x")]), store=store), poll_interval=0.01)

    async def serve() -> float:
        forever = asyncio.create_task(worker.run_forever())
        await until(store.listing)
        stopped = time.monotonic()
        worker.stop()
        await asyncio.wait_for(forever, 5)  # the listing waits for 60 s
        return time.monotonic() - stopped

    try:
        assert asyncio.run(serve()) < 2
        assert not store.unblock.is_set()  # (the listing was still waiting when the worker returned)
    finally:
        store.unblock.set()


def test_stop_does_not_wait_for_a_listing_under_way_in_run_once() -> None:
    store = StuckListing()
    worker = bide.Worker(store, bide.Agent(ScriptedModel([reply("x")]), store=store))

    async def one_pass() -> bide.PassReport:
        a_pass = asyncio.create_task(worker.run_once())
        await until(store.listing)
        worker.stop()
        return await asyncio.wait_for(a_pass, 5)

    try:
        report = asyncio.run(one_pass())
        assert report.driven == 0 and not store.unblock.is_set(), report
    finally:
        store.unblock.set()


APP = """
    import threading

    import bide
    from bide.testing import ScriptedModel, reply


    def build(store):
        def stuck(*, now_ms, after="", limit=500):
            print("listing", flush=True)
            threading.Event().wait(60)  # a store that does not answer for a minute
            return []

        store.expired_leases = stuck
        return bide.Agent(ScriptedModel([reply("x")]), store=store)
"""


def test_sigterm_stops_bide_worker_while_its_listing_waits(tmp_path: Path) -> None:
    """Through the command: the process exits 0 at once, without waiting for the listing's thread. (A
    listing that is a statement of a SQL store still holds the exit up to the busy timeout: the store's
    close waits for the statement it runs, which the worker never cancels; this listing is not one.)"""
    (tmp_path / "stuckapp.py").write_text(textwrap.dedent(APP))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO), env.get("PYTHONPATH", "")])
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    bide.open_store(url).close()  # (bide worker serves a store, never creates its file)
    command = [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", "stuckapp:build"]
    worker = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "listing"
        stopped = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
        assert code == 0, worker.stderr.read() if worker.stderr else ""
        assert time.monotonic() - stopped < 10
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
