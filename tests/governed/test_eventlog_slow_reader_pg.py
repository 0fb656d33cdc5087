"""A PostgreSQL log's reads whose client takes a while to take in the rows.

Each session of the log sets `idle_in_transaction_session_timeout` to half the log's timeout, for an
appender paused holding the log's lock. Reads ran in a transaction too, which the client held open while it
turned the rows into objects: a read of a whole large log, or of a long record's history, that took the
client past half the timeout had its session ended by the server, on every retry, and raised `LogTimeout`
blaming the database. A read statement is its own transaction now, over once the server has sent its rows.

The slow client is a listener that sleeps after each read statement, longer than half the timeout (what
taking in millions of rows costs); the server's view is checked meanwhile from another session.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from govern.runtime._eventlog import EventLog

from .conftest import POSTGRES_URL
from .test_governed_eventlog import bound, ev

pytestmark = [pytest.mark.postgres]

TIMEOUT = 1.0
SLOW = 0.7  # past half the timeout, within it


@pytest.fixture
def slow_log(log_name: str) -> Iterator[tuple[EventLog, list[str]]]:
    """A bound log with three events whose reads' client takes SLOW seconds after each statement; the list
    gets the server's state of the reading session, seen from another session during each such pause."""
    log = bound(POSTGRES_URL, log_name, timeout=TIMEOUT)
    log.append_many([ev("e1"), ev("e2", seq=1), ev("e3", seq=2)])
    states: list[str] = []
    engine = log._backend.engine  # type: ignore[attr-defined]
    plain = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")

    def slow(conn: sa.Connection, cursor: Any, *_: Any) -> None:
        if not conn.get_execution_options().get("govern_read"):
            return
        pid = conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
        time.sleep(SLOW / 2)
        with psycopg.connect(plain, autocommit=True) as watcher:
            row = watcher.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        states.append(row[0] if row else "gone")
        time.sleep(SLOW / 2)

    sa.event.listen(engine, "after_cursor_execute", slow)
    try:
        yield log, states
    finally:
        sa.event.remove(engine, "after_cursor_execute", slow)
        log.close()


def test_a_read_whose_client_is_slow_to_take_its_rows_is_not_ended_by_the_server(
    slow_log: tuple[EventLog, list[str]],
) -> None:
    log, states = slow_log
    assert [e.id for e in log.read()] == ["e1", "e2", "e3"]
    assert [e.id for e in log.read_record("o1")] == ["e1", "e2", "e3"]
    found = log.get("e2")
    assert found is not None and found.id == "e2"
    assert log.length() == 3
    # The reading session was idle, not idle in a transaction the server would end, while the rows were
    # taken in.
    assert states and set(states) == {"idle"}, states


def test_a_connection_that_served_a_read_goes_back_to_the_pool_as_it_was(
    slow_log: tuple[EventLog, list[str]],
) -> None:
    """Reads run in autocommit: the connections checked out afterwards (by the appends too) are not, so
    an append's writes and its COMMIT stay one transaction."""
    log, _ = slow_log
    engine = log._backend.engine  # type: ignore[attr-defined]
    modes: list[bool] = []

    def checked_out(dbapi_connection: Any, *_: Any) -> None:
        modes.append(dbapi_connection.autocommit)

    log.read()
    sa.event.listen(engine, "checkout", checked_out)
    try:
        for n in range(3, 6):
            log.append(ev(f"e{n + 1}", seq=n))
            log.read()
    finally:
        sa.event.remove(engine, "checkout", checked_out)
    assert [e.id for e in log.read()] == ["e1", "e2", "e3", "e4", "e5", "e6"]
    # Every checkout, an append's or a read's, finds the connection out of autocommit.
    assert len(modes) >= 6 and not any(modes), modes
