"""PostgreSQL plans an append's lookups by the statistics it keeps on the log's tables. On tables created
empty, the generic plan it keeps for a prepared statement read every event of the log for each id looked
up (seconds for a batch of 1,000 in a log of 20,000 events): a growing log has the server gather them
again (`_SqlBackend.grown`). Each test runs in a database of its own, with autovacuum off on its tables,
so that only the log gathers statistics."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from govern.runtime._eventlog import _Q_IDS_PG, Event, EventLog, _read_sql

from .conftest import POSTGRES_URL
from .machines import order_machine

pytestmark = pytest.mark.postgres

TABLES = ("govern_events", "govern_counters", "govern_logs")


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh database (URL), its log tables made and their autovacuum off; dropped afterwards."""
    name = f"govern_stats_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    url = POSTGRES_URL.rsplit("/", 1)[0] + "/" + name
    try:
        EventLog(url, name="made", machine=order_machine()).close()
        with psycopg.connect(plain(url), autocommit=True) as conn:
            for table in TABLES:
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def events(n: int, start: int = 0, prefix: str = "e") -> list[Event]:
    machine = order_machine()
    return [
        Event(
            id=f"{prefix}{i}",
            machine=machine.digest,
            record=f"order-{i % 300}",
            event=machine.events[i % len(machine.events)],
            producer=f"agent-{i % 16}",
        )
        for i in range(start, start + n)
    ]


def believed(url: str) -> float:
    with psycopg.connect(plain(url)) as conn:
        row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'govern_events'::regclass").fetchone()
    assert row is not None
    return float(row[0])


def append_in_batches(log: EventLog, n: int) -> None:
    for start in range(0, n, 100):
        log.append_many(events(100, start))


def index_used_for_ids(url: str, log: str) -> set[str]:
    """The indexes the generic plan of the append's read uses to look the call's own ids up."""
    ids = [e.id for e in events(50, 10_000)]
    params = {"log": log, "ids": ids, "deps": [], "producers": ["agent-0"], "records": ["order-0"]}
    with psycopg.connect(plain(url)) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        cursor = conn.cursor()
        cursor.execute(_read_sql("postgresql"), params, prepare=True)  # prepares it
        plan = cursor.execute("EXPLAIN (FORMAT JSON) " + _read_sql("postgresql"), params).fetchone()
    assert plan is not None
    found: set[str] = set()
    todo = [plan[0][0]["Plan"]["Plans"][0]]  # the Append's first branch: the 'e' rows, by id
    while todo:
        node = todo.pop()
        if "Index Name" in node:
            found.add(node["Index Name"])
        todo.extend(node.get("Plans", []))
    return found


def by_ids_plan(url: str, log: str) -> set[str]:
    """The indexes the generic plan of `EventLog`'s lookup of 50 ids by id (`_Q_IDS_PG`) scans."""
    sql = _Q_IDS_PG.text.replace(":ids", "%(ids)s").replace(":log", "%(log)s")
    params = {"log": log, "ids": [f"e{i}" for i in range(50)]}
    with psycopg.connect(plain(url)) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(sql, params, prepare=True)
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params, prepare=True).fetchone()
    assert plan is not None
    found: set[str] = set()
    todo = [plan[0][0]["Plan"]]
    while todo:
        node = todo.pop()
        kind = node.get("Node Type", "")
        if "Scan" in kind and kind != "Function Scan":
            found.add(node.get("Index Name", kind))
        todo.extend(node.get("Plans", []))
    return found


def test_a_growing_log_has_the_server_gather_statistics_on_its_tables(database: str) -> None:
    assert believed(database) <= 0  # made empty, never analyzed since
    log = EventLog(database, name="grows", machine=order_machine())
    append_in_batches(log, 1200)
    log.close()  # (waits for the thread that gathers them)
    # Gathered at the first mark (500 events): the server now knows of hundreds of events.
    assert believed(database) >= 500
    # And the plan it keeps for the append's read looks each id up in the log's id index (before, the
    # index of producers, read whole for each id).
    assert index_used_for_ids(database, "grows") == {"govern_events_id"}


def test_statistics_already_current_are_not_gathered_again(database: str) -> None:
    log = EventLog(database, name="first", machine=order_machine())
    append_in_batches(log, 600)
    log.close()  # (waits for the thread that gathers them)
    gathered = believed(database)
    assert gathered >= 500
    # A second log in the same tables, past its own first mark: the server already believes the tables
    # hold more than half of it, so they are not analyzed again (which would count the 1,200 events).
    other = EventLog(database, name="second", machine=order_machine())
    for start in range(0, 600, 100):
        other.append_many(events(100, start, prefix="x"))
    other.close()
    assert believed(database) == gathered


def test_an_append_does_not_wait_for_a_session_that_holds_the_statistics_lock(database: str) -> None:
    # Another session holds a lock that ANALYZE needs (its own ANALYZE, in a transaction left open):
    # appends past the mark go on without the statistics, and without waiting for that session.
    log = EventLog(database, name="waits", machine=order_machine())
    append_in_batches(log, 400)
    holder = psycopg.connect(plain(database))
    holder.execute("ANALYZE govern_counters")  # takes the lock until the transaction ends
    done = threading.Event()

    def append_past_the_mark() -> None:
        for start in range(400, 700, 100):
            log.append_many(events(100, start))
        done.set()

    worker = threading.Thread(target=append_past_the_mark, daemon=True)
    worker.start()
    try:
        assert done.wait(30), "an append waited for another session's lock on the statistics"
    finally:
        holder.rollback()
        holder.close()
    worker.join(10)
    assert log.length() == 700
    log.close()


def test_a_user_who_may_not_analyze_the_tables_still_appends(database: str) -> None:
    role = f"govern_plain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(plain(database), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {', '.join(TABLES)}, govern_format TO {role}")
    try:
        as_role = database.replace("postgres@", f"{role}@", 1)
        log = EventLog(as_role, name="plain", machine=order_machine())
        append_in_batches(log, 5000)
        assert log.length() == 5000
        got = log._backend.by_ids([f"e{i}" for i in range(0, 5000, 100)])  # type: ignore[attr-defined]
        assert sorted(got) == sorted(f"e{i}" for i in range(0, 5000, 100))
        log.close()
        assert believed(database) <= 0  # the server refused to analyze for this user (it only warns)
        # Without statistics, a lookup of 50 ids by `IN (list)` was planned, once prepared, as a scan of every
        # event of the log (27 ms for 50 ids among 30,000 events); each id is one lookup in the id index
        # (0.2 ms).
        assert by_ids_plan(database, "plain") == {"govern_events_id"}
    finally:
        with psycopg.connect(plain(database), autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
