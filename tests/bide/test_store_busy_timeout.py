"""A store's busy timeout is checked when the store is made. Before, PostgreSQL took 0 (or anything under a
millisecond) as "wait forever" for a lock (a write behind another session's row lock hung), a few
milliseconds ended healthy sessions as idle in a transaction, NaN and infinity raised bare Python errors,
a day or more could not connect at all ("setsockopt(TCP_KEEPIDLE) failed: Invalid argument"), and past
2^31 - 1 milliseconds SQLite waited not at all (PostgreSQL refused it at connect)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest
from conftest import PG_URL

import bide
from bide._url import libpq_bounds

PLAIN = PG_URL.replace("postgresql+psycopg://", "postgresql://")


@pytest.mark.parametrize("value", [-1, -0.5, float("nan"), float("inf"), True, "3", None])
def test_a_busy_timeout_no_wait_can_use_is_refused_before_anything_is_created(
    value: object, tmp_path: Path
) -> None:
    path = tmp_path / "bide.db"
    with pytest.raises(bide.ConfigError, match="busy_timeout is the seconds a request waits for a lock"):
        bide.SQLStore(f"sqlite:///{path}", busy_timeout=value)  # type: ignore[arg-type]
    assert not path.exists()


@pytest.mark.parametrize("value", [2_147_483.648, 1e7, 10**12])
def test_a_busy_timeout_past_what_sqlite_keeps_is_refused(value: float, tmp_path: Path) -> None:
    """SQLite keeps it in milliseconds as a 32-bit number: a larger one became 0, no wait at all for a lock
    (the opposite of what was asked)."""
    path = tmp_path / "bide.db"
    with pytest.raises(bide.ConfigError, match=r"busy_timeout must be at most 2147483\.647 s"):
        bide.SQLStore(f"sqlite:///{path}", busy_timeout=value)
    assert not path.exists()


def _takes_the_longest_busy_timeout(store: bide.SQLStore) -> None:
    try:
        assert store.insert_many("r", [("a", b"1")])[0].inserted
    finally:
        store.close()


def test_sqlite_takes_the_longest_busy_timeout(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    _takes_the_longest_busy_timeout(bide.SQLStore(url, busy_timeout=2_147_483.647))


@pytest.mark.postgres
def test_postgresql_takes_the_longest_busy_timeout(pg_prefix: str) -> None:
    _takes_the_longest_busy_timeout(bide.SQLStore(PG_URL, table_prefix=pg_prefix, busy_timeout=2_147_483.647))


@pytest.mark.postgres
@pytest.mark.parametrize("value", [0, 0.0004, 0.01, 0.099])
def test_postgresql_refuses_a_busy_timeout_under_a_tenth_of_a_second(value: float, pg_prefix: str) -> None:
    with pytest.raises(bide.ConfigError, match=r"on PostgreSQL busy_timeout must be at least 0\.1 s"):
        bide.SQLStore(PG_URL, table_prefix=pg_prefix, busy_timeout=value)
    with psycopg.connect(PLAIN) as conn:
        row = conn.execute("SELECT to_regclass(%s)", (f"{pg_prefix}runs",)).fetchone()
    assert row == (None,)  # nothing was created


def test_sqlite_takes_zero_as_do_not_wait(tmp_path: Path) -> None:
    """On SQLite 0 keeps its meaning: a request meeting a lock fails at once."""
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.SQLStore(url, busy_timeout=0)
    try:
        assert store.insert_many("r", [("a", b"1")])[0].inserted
    finally:
        store.close()


@pytest.mark.postgres
def test_the_shortest_postgresql_busy_timeout_bounds_a_lock_wait(pg_prefix: str) -> None:
    """At the minimum, a write behind another session's row lock fails after about that long, having
    written nothing, instead of waiting for the lock as long as it is held."""
    store = bide.SQLStore(PG_URL, table_prefix=pg_prefix, busy_timeout=0.1)
    try:
        assert store.insert_many("r", [("a", b"1")])[0].inserted
        with psycopg.connect(PLAIN) as holder:
            holder.execute(f"SELECT * FROM {pg_prefix}runs WHERE run_id = 'r' FOR UPDATE")
            failed: list[BaseException] = []
            started = time.monotonic()
            writer = threading.Thread(target=lambda: _capture(failed, store, "r"))
            writer.start()
            writer.join(timeout=20)
            took = time.monotonic() - started
            holder.rollback()
        assert not writer.is_alive(), "the write waited for the lock as long as it was held"
        assert failed and isinstance(failed[0], bide.StoreError) and "wrote nothing" in str(failed[0])
        assert took < 15
        assert [e.key for e in store.load("r")] == ["a"]
    finally:
        store.close()


def _capture(failed: list[BaseException], store: bide.SQLStore, run_id: str) -> None:
    try:
        store.insert_many(run_id, [("b", b"2")])
    except BaseException as exc:  # the test looks at what ended the write
        failed.append(exc)


def test_a_long_busy_timeout_keeps_the_socket_options_linux_takes() -> None:
    bounds = libpq_bounds((), 10 * 86_400)
    assert bounds["keepalives_idle"] <= 32_767 and bounds["keepalives_interval"] <= 32_767
    assert bounds["tcp_user_timeout"] <= 2**31 - 1
    assert bounds["connect_timeout"] == 10 * 86_400


@pytest.mark.postgres
def test_a_store_with_a_day_long_busy_timeout_opens_and_writes(pg_prefix: str) -> None:
    store = bide.SQLStore(PG_URL, table_prefix=pg_prefix, busy_timeout=86_400)
    try:
        assert store.insert_many("r", [("a", b"1")])[0].inserted
    finally:
        store.close()
