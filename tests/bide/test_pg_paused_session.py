"""A process paused (SIGSTOP, a frozen VM) inside a store transaction on PostgreSQL, holding its run's row.

Its lease request had been answered and the process stopped before the COMMIT went out. PostgreSQL saw
the session in the middle of a pipeline, which no server timeout ends, so every other driver of the run
waited on the row's lock until its busy timeout and failed with `StoreError`, for as long as the process
stayed paused. A pipelined batch now sends a Sync before it waits for an answer, and each connection sets
`idle_in_transaction_session_timeout` to half the busy timeout: the server ends the paused session, and the
other driver gets the lease in time. The woken process finds its connection gone, sends its request again
and is told the truth: another holder has the lease. (SQLite has no such bound: a process paused inside a
transaction holds the database's write lock until it wakes; docs/guarantee.md says so.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import PG_URL, drop_prefix
from paused import pause

from bide._sql import SQLStore

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

CHILD = str(Path(__file__).with_name("paused_lease_child.py"))


def test_a_session_paused_inside_its_lease_transaction_does_not_block_the_run(tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    SQLStore(PG_URL, table_prefix=prefix).close()
    child = subprocess.Popen(
        [sys.executable, CHILD, PG_URL, prefix, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    store = SQLStore(PG_URL, table_prefix=prefix, busy_timeout=4.0)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "in-lease").exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child never took the lease"
            time.sleep(0.01)
        pause(child.pid)
        (tmp_path / "go").touch()  # it goes on to its COMMIT only once woken
        began = time.monotonic()
        later = int(time.time() * 1000) + 10_000  # past the paused holder's lease
        second = store.lease("r", "second", now_ms=later, ttl_ms=60_000)
        waited = time.monotonic() - began
        assert second.held and second.holder == "second"
        assert waited < 4.0, f"the lease waited {waited:.1f} s for the paused session"
    finally:
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
    try:
        answer = json.loads(out)
        assert answer == {"held": False, "holder": "second"}  # never granted: it is told who holds it
        third = store.lease("r", "third", now_ms=later, ttl_ms=1_000)
        assert not third.held and third.holder == "second"
    finally:
        store.close()
        drop_prefix(PG_URL, prefix)
