"""The statistics a PostgreSQL event log has the server gather (`_SqlBackend.grown`) run on a session of
their own: that session must never cost an append its connection (on a server with exactly the pool's
slots free), must give way to another session's DDL as autovacuum's ANALYZE does, and a round that gave
up is tried again later. Each test runs in a database of its own, owned by a throwaway role whose
CONNECTION LIMIT stands for the server's free slots; an expression index whose function sleeps while a
flag table holds a row makes the ANALYZE as long as the test needs (ANALYZE evaluates it on every
sampled row)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import pytest
import sqlalchemy as sa
from governed.conftest import POSTGRES_URL
from governed.machines import order_machine

from govern.runtime import _eventlog
from govern.runtime._eventlog import Event, EventLog

pytestmark = pytest.mark.postgres

LOG_TIMEOUT = 60.0  # the log's timeout: long, so that only the statistics session's own bounds end it
WAIT = 60.0  # how long a test waits for a condition before it fails (generous: the machine is loaded)


@dataclass(frozen=True)
class Limited:
    """A database owned by a role of limited connections, and the superuser's way into it."""

    role: str
    database: str
    url: str  # the log's URL: the limited role
    admin: str  # a libpq URL of the superuser in the database

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def slow_analyze(self, on: bool) -> None:
        self.sql("INSERT INTO g7_slow VALUES (true)" if on else "DELETE FROM g7_slow")

    def analyzing(self) -> list[int]:
        """The backends of this database running an ANALYZE now."""
        rows = self.sql(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
            "AND query ILIKE 'ANALYZE%'"
        )
        return [int(str(row[0])) for row in rows]

    def believed(self) -> float:
        """The rows the planner believes govern_events holds (-1: never counted)."""
        rows = self.sql("SELECT reltuples FROM pg_class WHERE oid = 'govern_events'::regclass")
        return float(str(rows[0][0]))


def libpq(url: sa.engine.URL) -> str:
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def limited() -> Iterator[Limited]:
    suffix = uuid.uuid4().hex[:12]
    role, database = f"g7_role_{suffix}", f"g7_db_{suffix}"
    base = sa.engine.make_url(POSTGRES_URL)
    server = libpq(base)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 2")
        conn.execute(f"CREATE DATABASE {database} OWNER {role}")
    try:
        url = base.set(username=role, password=None, database=database).render_as_string(hide_password=False)
        made = Limited(role, database, url, libpq(base.set(database=database)))
        EventLog(url, name="made", machine=order_machine()).close()  # the tables, owned by the role
        for table in ("govern_events", "govern_counters", "govern_logs"):
            made.sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")  # only the log analyzes
        made.sql("CREATE TABLE g7_slow (slow boolean)")
        made.sql(f"GRANT SELECT ON g7_slow TO {role}")  # (ANALYZE evaluates the index as the tables' owner)
        made.sql(
            "CREATE FUNCTION g7_slow_text(value text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$ "
            "BEGIN IF EXISTS (SELECT 1 FROM public.g7_slow) THEN PERFORM pg_sleep(0.2); END IF; "
            "RETURN value; END $$"
        )
        made.sql("CREATE INDEX g7_slow_index ON govern_events (public.g7_slow_text(event_id))")
        yield made
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def events(n: int, start: int = 0) -> list[Event]:
    machine = order_machine()
    return [
        Event(
            id=f"e{i}",
            machine=machine.digest,
            record=f"order-{i % 50}",
            event=machine.events[i % len(machine.events)],
            producer="agent",
        )
        for i in range(start, start + n)
    ]


def wait_for(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT:g} s for {what}"
        time.sleep(0.05)


def start_a_long_analyze(log: EventLog, limited: Limited) -> int:
    """Grow the log past the first mark (500 events) with ANALYZE made slow: the statistics thread's
    ANALYZE then runs until its statement timeout. Returns its backend's pid."""
    log.append_many(events(499))
    limited.slow_analyze(True)
    log.append_many(events(1, 499))  # the 500th event: the statistics thread starts
    wait_for(limited.analyzing, "the statistics thread's ANALYZE to run")
    return limited.analyzing()[0]


def gathered_later(log: EventLog, limited: Limited) -> None:
    """The statistics that gave up are gathered by a later append (ANALYZE fast again by now)."""
    limited.slow_analyze(False)
    appended = iter(range(1000, 2000))

    def gathered() -> bool:
        log.append_many(events(1, next(appended)))
        return limited.believed() >= 250

    wait_for(gathered, "a later append to gather the statistics again")


def test_the_statistics_session_never_costs_an_append_its_connection(
    limited: Limited, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ANALYZE's own statement bound (2 s) out of the way: the session must give the slot up at once.
    monkeypatch.setattr(_eventlog, "_STATISTICS_STATEMENT_MS", 600_000, raising=False)
    log = EventLog(limited.url, machine=order_machine(), timeout=LOG_TIMEOUT, pool_size=1)
    try:
        analyze = start_a_long_analyze(log, limited)
        # The server now has exactly the pool's one slot for the role, and the pool must connect again
        # (as a pool that has not opened all its connections yet does): its session is ended.
        limited.sql(f"ALTER ROLE {limited.role} CONNECTION LIMIT 1")
        limited.sql(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{limited.role}' "
            f"AND pid <> {analyze}"
        )
        outcome: list[object] = []
        appending = threading.Thread(target=lambda: outcome.append(log.append_many(events(1, 500))))
        appending.start()
        appending.join(LOG_TIMEOUT / 2)  # the slow ANALYZE alone would hold the slot the whole timeout
        assert not appending.is_alive(), "the append waited for the statistics session's connection slot"
        assert len(outcome) == 1 and log.length() == 501
        limited.sql(f"ALTER ROLE {limited.role} CONNECTION LIMIT 2")
        gathered_later(log, limited)
    finally:
        log.close()


def test_a_ddl_does_not_wait_behind_the_statistics(limited: Limited) -> None:
    log = EventLog(limited.url, machine=order_machine(), timeout=LOG_TIMEOUT)
    try:
        start_a_long_analyze(log, limited)
        with psycopg.connect(limited.admin, autocommit=True) as conn:
            # Behind the slow ANALYZE for the log's whole timeout, this would run out of its lock wait.
            conn.execute(f"SET lock_timeout = {int(LOG_TIMEOUT / 2 * 1000)}")
            with conn.transaction():
                conn.execute("LOCK TABLE govern_events IN ACCESS EXCLUSIVE MODE")
        gathered_later(log, limited)
    finally:
        log.close()
