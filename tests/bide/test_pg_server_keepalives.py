"""The server's side of a connection that goes silent: a driver or appender whose host died, or was cut off,
between its writes and its COMMIT leaves its session waiting "active" on ClientRead, where neither the lock
nor the idle-in-transaction timeout applies, holding its locks (a run's row, the event log's lock) until
the server's kernel gives up on the connection: two hours by the system's default keepalive. Every session
of a bide store and of a govern event log asks the server to probe a silent client within about its busy
timeout (`bide._url.server_keepalives`), so those locks are freed in about that time."""

from __future__ import annotations

import pytest
from conftest import PG_URL

import bide
import govern
from bide._url import server_keepalives

pytestmark = pytest.mark.postgres

SETTINGS = ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")


def test_the_server_probes_a_silent_client_within_about_the_wait() -> None:
    assert server_keepalives(30) == {"tcp_keepalives_idle": 15, "tcp_keepalives_interval": 5,
                                     "tcp_keepalives_count": 3}  # fmt: skip
    for wait in (0.1, 2, 7.5, 30, 600, 10**6):
        k = server_keepalives(wait)
        probed = k["tcp_keepalives_idle"] + k["tcp_keepalives_interval"] * k["tcp_keepalives_count"]
        assert probed <= max(2, wait) * 1.5 + 3 and 1 <= k["tcp_keepalives_idle"] <= 32767


def _shown(conn: object) -> dict[str, int]:
    return {name: int(conn.exec_driver_sql(f"SHOW {name}").scalar_one()) for name in SETTINGS}  # type: ignore[attr-defined]


def test_a_store_session_asks_the_server_to_probe_it(pg_prefix: str) -> None:
    store = bide.SQLStore(PG_URL, table_prefix=pg_prefix, busy_timeout=10)
    try:
        with store.engine.connect() as conn:
            assert _shown(conn) == server_keepalives(10)
    finally:
        store.close()


def test_an_event_log_session_asks_the_server_to_probe_it() -> None:
    log = govern.EventLog(PG_URL, name="keepalives-check", timeout=12)
    try:
        with log._backend.engine.connect() as conn:  # type: ignore[attr-defined]
            assert _shown(conn) == server_keepalives(12)
    finally:
        log.close()


def test_keepalives_the_urls_own_options_set_are_left_to_them(pg_prefix: str) -> None:
    """A URL whose server options set a keepalive had it overridden by the store's and the log's own."""
    url = f"{PG_URL}?options=-c%20tcp_keepalives_idle%3D600%20-c%20search_path%3Dpublic"
    store = bide.SQLStore(url, table_prefix=pg_prefix, busy_timeout=10)
    log = govern.EventLog(url, name="keepalives-check", timeout=10)
    try:
        for engine in (store.engine, log._backend.engine):  # type: ignore[attr-defined]
            with engine.connect() as conn:
                shown = _shown(conn)
            assert shown["tcp_keepalives_idle"] == 600
            assert shown["tcp_keepalives_interval"] == server_keepalives(10)["tcp_keepalives_interval"]
    finally:
        store.close()
        log.close()


def test_options_given_twice_reach_the_server_on_a_store_and_a_log(pg_prefix: str) -> None:
    """A URL giving `options` twice (one setting each) failed to open a bide store: SQLAlchemy handed libpq
    the pair's repr, which the server refused ("invalid command-line argument"); the event log joined them.
    Both keep both settings now, and the keepalive one of them sets."""
    url = f"{PG_URL}?options=-c%20tcp_keepalives_idle%3D600&options=-c%20work_mem%3D4321kB"
    store = bide.SQLStore(url, table_prefix=pg_prefix, busy_timeout=10)
    log = govern.EventLog(url, name="keepalives-check", timeout=10)
    try:
        for engine in (store.engine, log._backend.engine):  # type: ignore[attr-defined]
            with engine.connect() as conn:
                assert _shown(conn)["tcp_keepalives_idle"] == 600
                assert conn.exec_driver_sql("SHOW work_mem").scalar_one() == "4321kB"
    finally:
        store.close()
        log.close()
