"""What this process holds of a database, and waiting for the garbage collector to let go of it: the
tests of stores and event logs dropped without close() count PostgreSQL sessions by the
`application_name` their URL gave, and SQLite file descriptors by path."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable

import sqlalchemy as sa


def pg_sessions(database_url: str, tag: str) -> int:
    """How many sessions of the server at `database_url` carry the application_name `tag`."""
    engine = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :tag")
            return int(conn.execute(query, {"tag": tag}).scalar_one())
    finally:
        engine.dispose()


def open_files(path: str | os.PathLike[str]) -> int:
    """How many of this process's file descriptors are open on the SQLite file `path` or its -wal and -shm
    files."""
    names = {os.fspath(path), f"{os.fspath(path)}-wal", f"{os.fspath(path)}-shm"}
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") in names
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
    return count


def collect_until(done: Callable[[], bool], *, timeout: float = 10.0) -> None:
    """Collect garbage until `done()`: a store's thread holds the store for a moment after it answered the
    last request (it ends the batch), and the store is collected only once it let go."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "what was dropped was never collected"
        gc.collect()
        time.sleep(0.01)
