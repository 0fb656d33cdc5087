"""The runs that have not ended are indexed on their own, so that what reads only those (a worker's poll,
`expired_leases`, `runs(open_only=True)`, `bide pending`) costs as many as are open: before, every poll
scanned every run the store ever kept (400,000 ended runs: 70 ms a poll on SQLite, growing with each run).

A store made by an earlier bide, without the index, is given it when opened; a read-only one still opens
and reads (more slowly). On PostgreSQL the index is looked up before it is made: `CREATE INDEX IF NOT
EXISTS` alone takes a lock on the runs table that waits for every write in flight, on every open.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import PG_URL, drop_prefix
from store_places import WITHOUT_ROOTS_REACH

import bide
from bide._sql import SQLStore
from bide.testing import ScriptedModel, reply


def _indexes(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[1] for row in conn.execute("PRAGMA index_list(bide_runs)")}


def _earlier_store(path: Path, runs: int) -> None:
    """A store with `runs` ended runs and one open run, whose runs table has no open-runs index (as an
    earlier bide left it)."""
    store = bide.open_store(f"sqlite:///{path}")
    try:
        agent = bide.Agent(ScriptedModel([reply("hi")] * runs), store=store)
        for i in range(runs):
            agent.run_sync(f"ended-{i}", "hi")
        bide.Journal(store, "open").load().write([bide.Start(key="run:start", entry="agent:x", input="go")])
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP INDEX bide_runs_open")
    assert "bide_runs_open" not in _indexes(path)


def test_the_poll_reads_the_open_runs_index_not_every_run(tmp_path: Path) -> None:
    path = tmp_path / "bide.db"
    store = SQLStore(f"sqlite:///{path}")
    try:
        with sqlite3.connect(path) as conn:
            for sql, args in [(store._sql_expired, ("", 0, 10)), (store._sql_open_runs, ("", 0, "", 10))]:
                plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args)]
                assert any("USING INDEX bide_runs_open" in step for step in plan), plan
    finally:
        store.close()


@pytest.mark.parametrize("create", [True, False])
def test_an_earlier_store_is_given_the_index_and_answers_the_same(tmp_path: Path, create: bool) -> None:
    path = tmp_path / "bide.db"
    _earlier_store(path, runs=3)
    store = bide.open_store(f"sqlite:///{path}", create=create)
    try:
        assert "bide_runs_open" in _indexes(path)
        assert list(store.runs(open_only=True)) == ["open"]
        assert sorted(store.runs()) == ["ended-0", "ended-1", "ended-2", "open"]
    finally:
        store.close()


def test_a_read_only_earlier_store_opens_without_the_index(tmp_path: Path) -> None:
    """`bide pending` (which reads the open runs) and `bide runs` on a store file the user may only read:
    the index cannot be made, and the commands answer anyway."""
    path = tmp_path / "bide.db"
    _earlier_store(path, runs=2)
    wrap = WITHOUT_ROOTS_REACH if os.geteuid() == 0 else []
    path.chmod(0o444)
    try:
        answers = [
            subprocess.run([*wrap, "bide", command, "--store", f"sqlite:///{path}"], capture_output=True,
                           text=True, timeout=120)
            for command in ("pending", "runs")
        ]  # fmt: skip
    finally:
        path.chmod(0o644)
    pending, runs = answers
    assert pending.returncode == 0 and "No run is waiting at a gate" in pending.stdout, pending
    assert runs.returncode == 0 and all(run in runs.stdout for run in ("open", "ended-0", "ended-1")), runs
    assert "bide_runs_open" not in _indexes(path)


@pytest.mark.postgres
def test_opening_a_postgresql_store_does_not_wait_for_writes_in_flight() -> None:
    """A session in the middle of a write on the runs table (as every driver's is, many times a second):
    opening another store must not wait for it (here a 5 s busy timeout, so that a loaded machine's slow
    open is not taken for a wait)."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    SQLStore(PG_URL, table_prefix=prefix).close()
    engine = sa.create_engine(PG_URL)
    try:
        with engine.connect() as writer:
            transaction = writer.begin()
            writer.exec_driver_sql(f"INSERT INTO {prefix}runs(run_id) VALUES ('in-flight')")
            began = time.monotonic()
            SQLStore(PG_URL, table_prefix=prefix, busy_timeout=5.0).close()
            assert time.monotonic() - began < 4.0
            transaction.rollback()
        with engine.connect() as conn:
            query = "SELECT count(*) FROM pg_indexes WHERE indexname = %(name)s"
            assert conn.exec_driver_sql(query, {"name": f"{prefix}runs_open"}).scalar() == 1
    finally:
        engine.dispose()
        drop_prefix(PG_URL, prefix)
