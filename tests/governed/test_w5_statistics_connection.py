"""The thread that has PostgreSQL gather statistics on the log's tables (`_SqlBackend.grown`) runs its
ANALYZE on a session of its own, never on one of the log's pooled connections: with `pool_size=1`, an
append made while that ANALYZE runs does not wait for it."""

from __future__ import annotations

import time

import psycopg

from govern.runtime._eventlog import EventLog

from .machines import order_machine
from .test_eventlog_planner_statistics import append_in_batches, believed, database, events, plain

__all__ = ["database"]  # (the fixture: a fresh database per test)

GATE = 4242  # the advisory lock key the test holds to keep the log's ANALYZE running

# An index whose expression, evaluated by ANALYZE on each sampled row, waits while the test holds the
# advisory lock: an ANALYZE that stays running (a large table) without waiting on any lock of the tables
# (which its 0.2 s lock_timeout would end). Appends evaluate it too, and pass at once.
GATED_INDEX = f"""
CREATE FUNCTION analyze_gate(t text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF current_query() ILIKE 'analyze%' THEN
        WHILE NOT pg_try_advisory_lock_shared({GATE}) LOOP
            PERFORM pg_sleep(0.01);
        END LOOP;
        PERFORM pg_advisory_unlock_shared({GATE});
    END IF;
    RETURN t;
END $$;
CREATE INDEX analyze_gate_index ON govern_events (analyze_gate(event_id));
"""


def running_analyze(conn: psycopg.Connection) -> int | None:
    """The backend pid of a session running the log's ANALYZE, if one is."""
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
        "AND query LIKE 'ANALYZE govern_events%'"
    ).fetchone()
    return None if row is None else int(row[0])


def test_an_append_does_not_wait_for_the_statistics_thread_with_a_pool_of_one(database: str) -> None:
    with psycopg.connect(plain(database), autocommit=True) as admin:
        admin.execute(GATED_INDEX)
        assert believed(database) <= 0  # (still never counted: the log gathers statistics at 500 events)
        admin.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        log = EventLog(database, name="one", machine=order_machine(), pool_size=1, timeout=10)
        try:
            append_in_batches(log, 500)  # past the first mark: its ANALYZE starts, held at the gate
            deadline = time.monotonic() + 10
            while (analyzing := running_analyze(admin)) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert analyzing is not None, "the log did not start gathering statistics at 500 events"
            # The pool's one connection is free for this append while that ANALYZE runs: it returns with
            # the ANALYZE still running (before, it waited for the pooled connection the ANALYZE held, until
            # the ANALYZE's statement_timeout ended it, or raised LogTimeout).
            log.append_many(events(100, 500))
            assert running_analyze(admin) == analyzing
            assert log.length() == 600
            admin.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
            deadline = time.monotonic() + 10
            while running_analyze(admin) is not None and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            admin.execute("SELECT pg_advisory_unlock_all()")
            log.close()
    assert believed(database) >= 500  # gathered all the same, on the thread's own session


def thread_sessions(conn: psycopg.Connection) -> list[str]:
    """The queries of this database's other sessions that the statistics thread may have left."""
    rows = conn.execute(
        "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND (query LIKE 'ANALYZE govern_events%' OR query LIKE '%reltuples%')"
    ).fetchall()
    return [str(q) for (q,) in rows]


def test_close_cancels_a_running_analyze_and_leaves_no_session(database: str) -> None:
    with psycopg.connect(plain(database), autocommit=True) as admin:
        admin.execute(GATED_INDEX)
        admin.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        log = EventLog(database, name="one", machine=order_machine(), timeout=2)
        try:
            append_in_batches(log, 500)
            deadline = time.monotonic() + 10
            while running_analyze(admin) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert running_analyze(admin) is not None
            started = time.monotonic()
            log.close()  # the ANALYZE is still held at the gate past the timeout: close() cancels it
            took = time.monotonic() - started
            # Before, close() waited its whole timeout for the thread and returned with the session still
            # running the ANALYZE on the server until the ANALYZE's statement_timeout.
            assert took < 5, f"close() took {took:.1f}s"
            assert thread_sessions(admin) == []
        finally:
            admin.execute("SELECT pg_advisory_unlock_all()")

