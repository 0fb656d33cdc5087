"""An event log handle dropped without `close()` lets go of its database connections at once.

Its SQL backend and the backend's engine sit in a reference cycle (the engine's connection creator is the
backend's), so a dropped handle kept its pooled PostgreSQL sessions and SQLite file handles open until the
next full garbage collection, which a quiet process may not run for a long time. The garbage collector is
off in these tests: what is let go of is let go of when the last reference goes.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from governed.conftest import POSTGRES_URL
from held import open_files, pg_sessions

from govern.runtime._eventlog import Event, EventLog

DIGEST = "d" * 64  # the machine the logs are bound to (a digest: no machine is needed to append)


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _used(url: str, name: str) -> None:
    """Open a log, append an event and read the log back, and drop the handle unclosed."""
    log = EventLog(url, name=name)
    log.bind(DIGEST, events=("restock",))
    log.append(Event(id=f"{name}-e1", machine=DIGEST, event="restock", record="o1", producer="p"))
    assert [e.id for e in log.read()] == [f"{name}-e1"]


@pytest.mark.postgres
def test_a_dropped_postgresql_log_ends_its_sessions_at_once(collector_off: None) -> None:
    tag = f"dropped-log-{uuid.uuid4().hex[:8]}"
    name = f"dropped{uuid.uuid4().hex[:8]}"
    _used(f"{POSTGRES_URL}?application_name={tag}", name)
    assert pg_sessions(POSTGRES_URL, tag) == 0
    log = EventLog(POSTGRES_URL, name=name)  # nothing was lost
    try:
        assert [e.id for e in log.read()] == [f"{name}-e1"]
    finally:
        log.close()


def test_a_dropped_sqlite_log_closes_its_file_at_once(collector_off: None, tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    _used(f"sqlite:///{path}", "main")
    assert open_files(path) == 0
    log = EventLog(f"sqlite:///{path}")
    try:
        assert open_files(path) > 0  # (the count sees what a live handle holds)
        assert [e.id for e in log.read()] == ["main-e1"]
    finally:
        log.close()
