"""A `bide worker --once` stopped before the store answered its listing of the runs, and the stop messages.

1. Such a pass reported "resumed 0 runs ..." and exited 0, as if the store had been read and held nothing
   to do: it says the listing never answered (plain report, `--json`'s `"listed": false`) and exits 130.
2. What a stop signal makes the worker say is true in the state it is said in:
   a. a listing answered at once after the stop (no lock waited for) was announced as "the statement under
      way" the exit waits for, although the exit was not held up: said only once a statement does wait;
   b. the third signal said "without waiting for the calls still running" when what it left was the store's
      answer to a statement;
   c. the first signal under `--once` spoke of the pass's drives while the pass was still listing.

Each worker is a real `python -m bide._cli worker` process taking real signals. The app either holds the
store's listing statement in the store's own thread (`HELD_APP`: the worker sees a statement under way that
the test lets go when it chooses), or the test locks the store's tables on PostgreSQL (a real lock wait)."""

from __future__ import annotations

import contextlib
import json
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import PG_URL, drop_prefix
from worker_process import WorkerProcess, wait_until

import bide

LISTING = "stopping while this pass lists the runs to recover: it drives none of them"
WAITING = "waiting for the store to answer the statement under way"
NOT_LISTED = "resumed no run: the pass was stopped before the store answered its listing of the runs"

# Every listing statement (`expired_leases`) is held in the store's thread, inside its transaction, until the
# file RELEASE exists (or, with RELEASE "closing", until the worker closes the store): to the worker, a
# statement under way that the store has not answered yet.
HELD_APP = '''
import os
import sys
import time

import bide
from bide.testing import ScriptedModel, reply

RELEASE = {release!r}


def build(store):
    apply = store._apply

    def held(cur, req):
        if req.op == "expired":
            print("listing", file=sys.stderr, flush=True)
            while not (store._closing if RELEASE == "closing" else os.path.exists(RELEASE)):
                time.sleep(0.005)
        return apply(cur, req)

    store._apply = held
    return bide.Agent(ScriptedModel([reply("done")]), store=store, name="a")
'''

PLAIN_APP = '''
import bide
from bide.testing import ScriptedModel, reply


def build(store):
    return bide.Agent(ScriptedModel([reply("done")]), store=store, name="a")
'''


class Worker(WorkerProcess):
    """The worker on the store `url` whose tables are named with `prefix`."""

    def __init__(self, tmp_path: Path, source: str, url: str, prefix: str, *extra: str) -> None:
        super().__init__(tmp_path, source, url, "--table-prefix", prefix, *extra)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    bide.open_store(url).close()  # (bide worker serves a store, never creates its file)
    return url, "bide_"


@pytest.fixture
def pg_store() -> Iterator[tuple[str, str]]:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    bide.open_store(PG_URL, table_prefix=prefix).close()
    yield PG_URL, prefix
    drop_prefix(PG_URL, prefix)


@contextlib.contextmanager
def tables_locked(prefix: str) -> Iterator[Callable[[], None]]:
    """Every table of the PostgreSQL store `prefix` locked against reads too, by a session of the test's,
    until the yielded function is called."""
    engine = sa.create_engine(PG_URL)
    conn = engine.connect()
    transaction = conn.begin()
    tables = conn.exec_driver_sql(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND starts_with(tablename, %(p)s)",
        {"p": prefix},
    ).scalars().all()
    assert tables
    conn.exec_driver_sql(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
    try:
        yield transaction.rollback
    finally:
        conn.close()
        engine.dispose()


def waits_for_a_lock(prefix: str) -> bool:
    engine = sa.create_engine(PG_URL)
    try:
        with engine.connect() as conn:
            query = (
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE NOT l.granted AND starts_with(c.relname, %(p)s)"
            )
            return bool(conn.exec_driver_sql(query, {"p": prefix}).scalar())
    finally:
        engine.dispose()


# -- 1. a pass stopped before its listing answered ----------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_a_pass_stopped_while_its_listing_is_unanswered_says_so_and_exits_130(
    tmp_path: Path, sqlite_store: tuple[str, str], as_json: bool
) -> None:
    release = tmp_path / "release"
    url, prefix = sqlite_store
    extra = ("--once", "--json") if as_json else ("--once",)
    worker = Worker(tmp_path, HELD_APP.format(release=str(release)), url, prefix, *extra)
    try:
        worker.says("listing")
        worker.signal_then_wait_for(signal.SIGTERM, LISTING)
        release.touch()  # the store answers the listing now: too late, nobody reads it
        code, out = worker.ended()
    finally:
        release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 130, errors
    assert "Traceback" not in errors, errors
    assert "stopped before the store answered its listing" in errors, errors
    if as_json:
        report = json.loads(out)
        assert report["listed"] is False and report["driven"] == 0, report
    else:
        assert out.startswith(NOT_LISTED), out
        assert "resumed 0 runs" not in out, out


@pytest.mark.postgres
@pytest.mark.parametrize("as_json", [False, True])
def test_a_pass_stopped_while_its_listing_waits_for_a_postgres_lock_says_so_and_exits_130(
    tmp_path: Path, pg_store: tuple[str, str], as_json: bool
) -> None:
    url, prefix = pg_store
    extra = ("--once", "--json") if as_json else ("--once",)
    with tables_locked(prefix) as release:
        worker = Worker(tmp_path, PLAIN_APP, url, prefix, *extra)
        try:
            wait_until(lambda: waits_for_a_lock(prefix), "the listing to wait for the lock")
            worker.signal_then_wait_for(signal.SIGTERM, LISTING)
            worker.says(WAITING)  # the lock is still held: the statement does wait
            release()
            code, out = worker.ended()
        finally:
            worker.kill()
    errors = worker.stderr()
    assert code == 130, errors
    if as_json:
        report = json.loads(out)
        assert report["listed"] is False and report["leased"] == 0, report
    else:
        assert out.startswith(NOT_LISTED), out


def test_a_pass_that_listed_reports_listed_true_and_exits_0(
    tmp_path: Path, sqlite_store: tuple[str, str]
) -> None:
    url, prefix = sqlite_store
    worker = Worker(tmp_path, PLAIN_APP, url, prefix, "--once", "--json")
    try:
        code, out = worker.ended()
    finally:
        worker.kill()
    assert code == 0, worker.stderr()
    report = json.loads(out)
    assert report["listed"] is True and report["driven"] == 0, report


# -- 2. stop messages true in the state they are said in ----------------------------------------------------


def test_the_first_signal_of_a_listing_pass_says_it_stops_listing_not_waits_for_drives(
    tmp_path: Path, sqlite_store: tuple[str, str]
) -> None:
    release = tmp_path / "release"
    url, prefix = sqlite_store
    worker = Worker(tmp_path, HELD_APP.format(release=str(release)), url, prefix, "--once")
    try:
        worker.says("listing")
        worker.signal_then_wait_for(signal.SIGINT, "bide worker: stopping")
        release.touch()
        worker.ended()
    finally:
        release.touch()
        worker.kill()
    errors = worker.stderr()
    assert LISTING in errors, errors
    assert "drives finish" not in errors and "cancels them" not in errors, errors


@pytest.mark.parametrize("third", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_the_third_signal_names_the_store_statement_it_stops_waiting_for(
    tmp_path: Path, sqlite_store: tuple[str, str], third: int
) -> None:
    release = tmp_path / "release"  # never created while the worker runs: the statement stays unanswered
    url, prefix = sqlite_store
    worker = Worker(tmp_path, HELD_APP.format(release=str(release)), url, prefix, "--once")
    try:
        worker.says("listing")
        worker.signal_then_wait_for(signal.SIGTERM, WAITING)
        worker.signal_then_wait_for(signal.SIGTERM, "this pass is cancelled")
        worker.process.send_signal(third)
        code, out = worker.ended()
    finally:
        release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 128 + third, errors
    assert out == ""
    assert "exiting now, without waiting for the store to answer the statement under way" in errors, errors
    assert "calls" not in errors, errors  # no tool call was running


@pytest.mark.postgres
def test_the_third_signal_names_the_store_statement_waiting_for_a_postgres_lock(
    tmp_path: Path, pg_store: tuple[str, str]
) -> None:
    url, prefix = pg_store
    with tables_locked(prefix):
        worker = Worker(tmp_path, PLAIN_APP, url, prefix)  # serving: the second signal does not end it
        try:
            wait_until(lambda: waits_for_a_lock(prefix), "the listing to wait for the lock")
            worker.signal_then_wait_for(signal.SIGTERM, WAITING)
            worker.signal_then_wait_for(signal.SIGTERM, "still waiting for the store before exiting")
            worker.process.send_signal(signal.SIGTERM)
            code, _ = worker.ended()  # the lock is still held
        finally:
            worker.kill()
    errors = worker.stderr()
    assert code == 128 + signal.SIGTERM, errors
    assert "exiting now, without waiting for the store to answer the statement under way" in errors, errors


@pytest.mark.postgres
@pytest.mark.parametrize("once", [False, True])
def test_a_signal_during_a_listing_answered_at_once_says_no_wait_for_a_statement(
    tmp_path: Path, pg_store: tuple[str, str], once: bool
) -> None:
    """The listing is under way when the signal lands, and the store answers it as soon as the worker
    closes the store (no lock is waited for): the exit is not held up, and nothing says it is."""
    url, prefix = pg_store
    worker = Worker(tmp_path, HELD_APP.format(release="closing"), url, prefix, *(["--once"] if once else []))
    try:
        worker.says("listing")
        worker.process.send_signal(signal.SIGTERM)
        code, _ = worker.ended()
    finally:
        worker.kill()
    errors = worker.stderr()
    assert code == (130 if once else 0), errors
    assert "statement under way" not in errors and "waiting for the store" not in errors, errors
    assert "Traceback" not in errors, errors
