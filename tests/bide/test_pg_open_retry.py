"""Opening a PostgreSQL store rides over sessions the server ends while it opens (a backend terminated, a
server restarting), as a request does: the open is tried again on a new connection for up to the store's
busy timeout. A server that refuses connections is still reported at once, and every failure to open is
the driver's words on one line.

Before: one open in four failed while a loop terminated the store's backends every 30 ms ("cannot open
store ...: (psycopg.errors.AdminShutdown) ... [SQL: SELECT pg_catalog.pg_class.relname ...]", with
SQLAlchemy's parameters and link), where every request of an open store was sent again.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time

import psycopg
import pytest
import sqlalchemy as sa
from conftest import PG_URL

import bide

pytestmark = pytest.mark.postgres

PLAIN = PG_URL.replace("postgresql+psycopg://", "postgresql://")


def test_an_open_whose_sessions_are_terminated_is_tried_again(pg_prefix: str) -> None:
    app = f"bide_open_{pg_prefix}"
    url = f"{PLAIN}?application_name={app}"
    bide.SQLStore(url, table_prefix=pg_prefix).close()
    stop = threading.Event()
    killed = [0]

    def killer() -> None:
        with psycopg.connect(PLAIN, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (app,),
                ).fetchone()
                killed[0] += row[0] if row else 0
                time.sleep(0.03)

    thread = threading.Thread(target=killer)
    thread.start()
    failures: list[str] = []
    opens = 0
    try:
        # Opens until the loop has ended enough sessions (an open takes a few round trips now, so thirty of
        # them could all fall between two of its passes), at most 300.
        while killed[0] <= 10 and opens < 300:
            opens += 1
            try:
                store = bide.SQLStore(url, table_prefix=pg_prefix, create=False, busy_timeout=20)
            except bide.StoreError as exc:
                failures.append(str(exc))
            else:
                store.close()
    finally:
        stop.set()
        thread.join()
    assert killed[0] > 10, "the loop terminated too few sessions to test anything"
    assert failures == []


def test_a_server_that_refuses_connections_is_reported_at_once() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nobody listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(bide.StoreError, match="Connection refused") as failed:
        bide.SQLStore(f"postgresql://postgres@127.0.0.1:{port}/test", create=False, busy_timeout=20)
    assert time.monotonic() - started < 5
    assert "\n" not in str(failed.value) and "sqlalche.me" not in str(failed.value)


def test_a_server_that_is_not_there_on_a_unix_socket_is_reported_at_once() -> None:
    """psycopg words a socket with no server "connection is bad: connection to server on socket ... failed":
    it was taken for a session the server ended, and retried for the whole busy timeout."""
    started = time.monotonic()
    with pytest.raises(bide.StoreError, match="on socket"):
        bide.SQLStore("postgresql:///test?host=/nonexistent&port=5499", create=False, busy_timeout=20)
    assert time.monotonic() - started < 5


def test_a_failure_to_open_is_one_line_without_sqlalchemy_s_wrapper(pg_prefix: str) -> None:
    # A session whose transactions are read only cannot create the tables: a statement of the open fails,
    # every time. (A 1 ms statement timeout, tried before, failed only when the open took longer.)
    with pytest.raises(bide.StoreError) as failed:
        bide.SQLStore(f"{PLAIN}?options=-c%20default_transaction_read_only%3Don", table_prefix=pg_prefix)
    said = str(failed.value)
    assert "read-only transaction" in said, said
    assert "\n" not in said and "sqlalche.me" not in said and "[SQL:" not in said, said



class _StartingServer:
    """A PostgreSQL server that is still starting up for its first `refusals` logins: it answers each with the
    FATAL a starting server sends (57P03, "the database system is starting up", or another FATAL `said`),
    then forwards every later connection to the real server."""

    def __init__(
        self,
        refusals: int,
        server: tuple[str, int],
        said: tuple[bytes, bytes] = (b"57P03", b"the database system is starting up"),
    ) -> None:
        self.refusals = refusals
        self.said = said
        self.server = server
        self.refused = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refused < self.refusals:
                self.refused += 1
                threading.Thread(target=self._refuse, args=(client,), daemon=True).start()
            else:
                threading.Thread(target=self._forward, args=(client, self.server), daemon=True).start()

    @staticmethod
    def _read_packet(conn: socket.socket) -> bytes:
        head = conn.recv(4, socket.MSG_WAITALL)
        length = int.from_bytes(head, "big")
        return head + conn.recv(length - 4, socket.MSG_WAITALL)

    def _refuse(self, client: socket.socket) -> None:
        with client:
            packet = self._read_packet(client)
            if packet[4:8] in (b"\x04\xd2\x16\x2f", b"\x04\xd2\x16\x30"):  # SSL or GSS request: no
                client.sendall(b"N")
                self._read_packet(client)  # the startup packet
            code, message = self.said
            fields = b"SFATAL\x00VFATAL\x00C" + code + b"\x00M" + message + b"\x00\x00"
            client.sendall(b"E" + (len(fields) + 4).to_bytes(4, "big") + fields)

    @staticmethod
    def _forward(client: socket.socket, address: tuple[str, int]) -> None:
        server = socket.create_connection(address)

        def pump(a: socket.socket, b: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := a.recv(65536):
                    b.sendall(data)
            with contextlib.suppress(OSError):
                b.shutdown(socket.SHUT_WR)

        threading.Thread(target=pump, args=(server, client), daemon=True).start()
        pump(client, server)

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


@pytest.mark.parametrize(
    "said",
    [
        (b"57P03", b"the database system is starting up"),
        (b"53300", b"sorry, too many clients already"),
        (b"53300", b'too many connections for role "app"'),
    ],
    ids=["starting", "full", "role-limit"],
)
def test_an_open_the_server_refuses_for_a_moment_is_tried_again(
    pg_prefix: str, said: tuple[bytes, bytes]
) -> None:
    """A server starting or recovering refuses logins with "FATAL: the database system is starting up" for
    a moment after a restart. The open took that for a server refusing connections and failed at once, so a
    worker started beside a database restart died, where the store's requests ride over the restart. A
    server whose connection slots are all taken (53300) is waited for the same way: one frees as another
    session ends, and the requests of an open store already wait for it."""
    bide.SQLStore(PLAIN, table_prefix=pg_prefix).close()
    real = sa.engine.make_url(PLAIN)
    starting = _StartingServer(refusals=3, server=(real.host or "127.0.0.1", real.port or 5432), said=said)
    try:
        url = real.set(host="127.0.0.1", port=starting.port).render_as_string(hide_password=False)
        store = bide.SQLStore(url, table_prefix=pg_prefix, create=False, busy_timeout=20)
        store.close()
    finally:
        starting.close()
    assert starting.refused == 3


def test_an_open_the_server_never_lets_in_says_how_long_it_tried(pg_prefix: str) -> None:
    """A server whose slots stay taken (a role's CONNECTION LIMIT 0) is tried for the whole busy timeout,
    silently: the error at the end said only libpq's FATAL, so the wait looked like a hang. It says how many
    tries over how long."""
    bide.SQLStore(PLAIN, table_prefix=pg_prefix).close()
    real = sa.engine.make_url(PLAIN)
    full = _StartingServer(10**6, (real.host or "127.0.0.1", real.port or 5432),
                           said=(b"53300", b"sorry, too many clients already"))  # fmt: skip
    try:
        url = real.set(host="127.0.0.1", port=full.port).render_as_string(hide_password=False)
        with pytest.raises(bide.StoreError) as failed:
            bide.SQLStore(url, table_prefix=pg_prefix, create=False, busy_timeout=2)
    finally:
        full.close()
    said = str(failed.value)
    assert "too many clients already" in said and "the store's busy timeout" in said, said
    assert re.search(r"tried \d+ times over [1-3] s", said), said
