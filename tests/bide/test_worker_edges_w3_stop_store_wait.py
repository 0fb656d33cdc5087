"""A stopped `bide worker` whose dropped listing still waits in the store (a PostgreSQL table locked by
another session) exits once the store answered it. That wait moved to the store's close and the end of
the interpreter, after the worker had put back the signals' default actions: a second SIGTERM or SIGHUP
killed it (exit -15, -1), a second SIGINT raised KeyboardInterrupt at the interpreter's exit (a traceback,
exit 0), and nothing said what the worker waited for. It waits with its own handlers on, says so, and
takes a second signal as documented (`--once` exits 130 without its report) and a third too (exit at
once, 128 plus the signal)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
import sqlalchemy as sa
from conftest import PG_URL

import bide

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]
WAITING = "waiting for the store to answer the statement under way"

APP = '''
import bide
from bide.testing import ScriptedModel, reply


def build(store):
    return bide.Agent(ScriptedModel([reply("done")]), store=store, name="a")
'''


@contextlib.contextmanager
def tables_locked(prefix: str) -> Iterator[Callable[[], None]]:
    """Every table of the store `prefix` locked against reads too, until the yielded function is called."""
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


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Worker:
    """`bide worker` on the store `prefix`, its stderr read as it comes."""

    def __init__(self, tmp_path: Path, prefix: str, *extra: str) -> None:
        (tmp_path / "lockapp.py").write_text(APP)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO), env.get("PYTHONPATH", "")])
        command = [sys.executable, "-m", "bide._cli", "worker", "--store", PG_URL, "--table-prefix", prefix,
                   "--app", "lockapp:build", *extra]  # fmt: skip
        self.process = subprocess.Popen(
            command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.said: list[str] = []
        self.out: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.process.stderr, self.said), (self.process.stdout, self.out))
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def stderr(self) -> str:
        return "".join(self.said)

    def signal_then_wait_for(self, signum: int, words: str) -> None:
        """Send `signum` once the worker said what the one before made it say (two pending at once would be
        one), then wait until it says `words`."""
        self.process.send_signal(signum)
        wait_until(lambda: words in self.stderr(), f"the worker to say {words!r}")

    def ended(self) -> tuple[int, str]:
        """The exit code, and what it wrote to stdout."""
        code = self.process.wait(timeout=60)
        for reader in self.readers:
            reader.join(10)
        return code, "".join(self.out)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def store_prefix(pg_prefix: str) -> str:
    bide.open_store(PG_URL, table_prefix=pg_prefix).close()
    return pg_prefix


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_second_signal_while_a_pass_waits_for_the_store_exits_130(
    tmp_path: Path, store_prefix: str, second: int
) -> None:
    with tables_locked(store_prefix) as release:
        worker = Worker(tmp_path, store_prefix, "--once")
        try:
            wait_until(lambda: waits_for_a_lock(store_prefix), "the listing to wait for the lock")
            worker.signal_then_wait_for(signal.SIGTERM, WAITING)
            worker.signal_then_wait_for(second, "this pass is cancelled")
            assert worker.process.poll() is None  # still waiting for the store's answer
            release()
            code, out = worker.ended()
        finally:
            worker.kill()
    errors = worker.stderr()
    assert code == 130, errors
    assert out == ""  # no report
    assert "the pass was cancelled by a second signal" in errors and "Traceback" not in errors, errors


def test_a_second_signal_while_a_serving_worker_waits_for_the_store_still_exits_0(
    tmp_path: Path, store_prefix: str
) -> None:
    with tables_locked(store_prefix) as release:
        worker = Worker(tmp_path, store_prefix)
        try:
            wait_until(lambda: waits_for_a_lock(store_prefix), "the listing to wait for the lock")
            worker.signal_then_wait_for(signal.SIGTERM, WAITING)
            worker.signal_then_wait_for(signal.SIGTERM, "still waiting for the store before exiting")
            assert worker.process.poll() is None
            release()
            code, _ = worker.ended()
        finally:
            worker.kill()
    assert code == 0, worker.stderr()


def test_a_third_signal_while_the_worker_waits_for_the_store_exits_at_once(
    tmp_path: Path, store_prefix: str
) -> None:
    with tables_locked(store_prefix):
        worker = Worker(tmp_path, store_prefix, "--once")
        try:
            wait_until(lambda: waits_for_a_lock(store_prefix), "the listing to wait for the lock")
            worker.signal_then_wait_for(signal.SIGHUP, WAITING)
            worker.signal_then_wait_for(signal.SIGHUP, "a third SIGINT, SIGTERM or SIGHUP exits at once")
            worker.process.send_signal(signal.SIGHUP)
            code, _ = worker.ended()  # the lock is still held
        finally:
            worker.kill()
    errors = worker.stderr()
    assert code == 128 + signal.SIGHUP, errors
    assert "exiting now" in errors, errors


def test_a_pass_stopped_once_says_it_waits_for_the_store_then_reports(
    tmp_path: Path, store_prefix: str
) -> None:
    with tables_locked(store_prefix) as release:
        worker = Worker(tmp_path, store_prefix, "--once", "--json")
        try:
            wait_until(lambda: waits_for_a_lock(store_prefix), "the listing to wait for the lock")
            worker.signal_then_wait_for(signal.SIGTERM, WAITING)
            release()
            code, out = worker.ended()
        finally:
            worker.kill()
    # Its listing never answered: the report says so, and the pass exits 130 (not 0, "nothing to do").
    assert code == 130, worker.stderr()
    assert '"driven": 0' in out and '"listed": false' in out, out
