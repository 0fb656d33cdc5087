"""An appender paused (SIGSTOP, a frozen VM) inside its append on PostgreSQL, holding the log's lock.

It had taken the lock and read what the append needs, and stopped before writing. PostgreSQL saw the
session in the middle of a pipeline, which no server timeout ends: every other appender of the log waited
on the lock until its timeout and raised `LogTimeout`, for as long as the process stayed paused. The read
now ends with a Sync, and each connection sets `idle_in_transaction_session_timeout` to half the log's
timeout: the server ends the paused session and the others append in time. The woken appender finds its
connection gone and appends again: its event is stored once. (An appender paused between sending its
writes and its COMMIT still holds the lock until it wakes: test_governed_paused_driver.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paused import pause

from .conftest import POSTGRES_URL
from .test_governed_eventlog import bound, ev

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

WORKER = str(Path(__file__).with_name("_paused_read_worker.py"))


def test_an_appender_paused_holding_the_log_lock_does_not_stop_the_others(
    log_name: str, tmp_path: Path
) -> None:
    log = bound(POSTGRES_URL, log_name, timeout=4.0)
    log.append(ev("first"))
    child = subprocess.Popen(
        [sys.executable, WORKER, POSTGRES_URL, log_name, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "in-append").exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child never reached its append"
            time.sleep(0.01)
        pause(child.pid)
        (tmp_path / "go").touch()  # it goes on only once woken
        began = time.monotonic()
        appended = log.append(ev("other", name="ship", seq=1))
        waited = time.monotonic() - began
        assert appended.created
        assert waited < 4.0, f"the append waited {waited:.1f} s for the paused session"
    finally:
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
    assert json.loads(out) == {"created": True, "id": "paused"}
    assert [e.id for e in log.read()] == ["first", "other", "paused"]
