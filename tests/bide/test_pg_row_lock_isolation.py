"""PostgreSQL locks rows, not the database: one run's row held by another session keeps only that run from
writing.

A store batches the requests of every run its process drives into one transaction. When another session
held one run's row (an operator's SELECT ... FOR UPDATE, a bide process paused inside a transaction on that
run) past the busy timeout, the whole batch failed and every run in it got the error about that one run: a
driver whose side effect had fired lost its result, and the run was left halted for a person. Now the
batch is tried again run by run, and only the run whose row is held fails.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from conftest import PG_URL, drop_prefix

import bide
from bide._sql import SQLStore

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def _hold(prefix: str, run_id: str, held: threading.Event, release: threading.Event) -> None:
    with psycopg.connect(PG_URL.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute(f"SELECT * FROM {prefix}runs WHERE run_id = %s FOR UPDATE", (run_id,))
        held.set()
        release.wait(timeout=60)


def test_a_row_held_elsewhere_fails_only_its_own_run() -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    store = SQLStore(PG_URL, table_prefix=prefix, busy_timeout=2.0)
    try:
        for run in ("blocker", "locked", "free"):
            store.insert_many(run, [("start", b"{}")])
        # The store's thread is kept busy on "blocker" (its row held for 0.7 s) while the writes of
        # "locked" and "free" queue up behind it: they go to the database together, in one batch.
        blocker_held, blocker_release = threading.Event(), threading.Event()
        locked_held, locked_release = threading.Event(), threading.Event()
        holders = [
            threading.Thread(target=_hold, args=(prefix, "blocker", blocker_held, blocker_release)),
            threading.Thread(target=_hold, args=(prefix, "locked", locked_held, locked_release)),
        ]
        for holder in holders:
            holder.start()
        assert blocker_held.wait(30) and locked_held.wait(30)
        outcomes: dict[str, Any] = {}

        def write(run: str) -> None:
            try:
                outcomes[run] = store.insert_many(run, [("result", b'{"ok": true}')])
            except bide.StoreError as exc:
                outcomes[run] = exc

        with ThreadPoolExecutor(3) as pool:
            pool.submit(write, "blocker")
            time.sleep(0.3)  # the store's thread waits on the blocker's row now
            pool.submit(write, "locked")
            pool.submit(write, "free")
            time.sleep(0.4)
            blocker_release.set()
        locked_release.set()
        for holder in holders:
            holder.join()
        assert not isinstance(outcomes["blocker"], Exception), outcomes["blocker"]
        assert not isinstance(outcomes["free"], Exception), outcomes["free"]
        assert isinstance(outcomes["locked"], bide.StoreError), outcomes["locked"]
        assert "run 'locked'" in str(outcomes["locked"]) and "past the busy timeout" in str(
            outcomes["locked"]
        )
        assert [e.key for e in store.load("free")] == ["start", "result"]
        assert [e.key for e in store.load("locked")] == ["start"]
    finally:
        store.close()
        drop_prefix(PG_URL, prefix)
