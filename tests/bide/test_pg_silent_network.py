"""A network path to PostgreSQL that goes silent while a request waits for its answer (a dead route, a NAT
entry that expired: no reset, no close ever comes). Without a bound the client waits for as long as the
operating system's TCP lets it, many minutes; the bide store and the govern event log give up after about
twice their timeout (libpq keepalives and tcp_user_timeout they set, bide._url.libpq_bounds) and report
the lost connection as they report any other.

The silence is real, not simulated by a proxy that keeps acknowledging: the client runs in a network
namespace of its own, joined to this one by a veth pair and a forwarding proxy, and the host end of the
pair is taken down while the client waits (the child: silent_network_child.py). Needs root for `ip netns`
(make test installs iproute2)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

import bide
from bide._url import libpq_bounds

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

PG_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CHILD = str(Path(__file__).resolve().parent / "silent_network_child.py")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _forward(listener: socket.socket, server: tuple[str, int], opened: list[socket.socket]) -> None:
    """Accept on `listener` and pipe each connection to `server` both ways, until the listener closes;
    every socket made goes into `opened`, for the fixture to close (a server session behind a silenced
    link would otherwise stay open as long as the test process)."""

    def pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)

    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        opened.append(client)
        upstream = socket.create_connection(server)
        opened.append(upstream)
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()


@dataclass
class SilentPath:
    """A PostgreSQL URL reachable only from inside `namespace`, and the link whose removal silences it."""

    namespace: str
    url: str
    link: str

    def go_silent(self) -> None:
        _ip("link", "set", self.link, "down")


@pytest.fixture
def silent_path() -> Iterator[SilentPath]:
    tag = uuid.uuid4().hex[:6]
    namespace, host_end, inner_end = f"bide{tag}", f"bd{tag}h", f"bd{tag}n"
    subnet = 16 + int(tag, 16) % 200
    host_ip, inner_ip = f"10.231.{subnet}.1", f"10.231.{subnet}.2"
    try:
        _ip("netns", "add", namespace)
    except subprocess.CalledProcessError as e:
        pytest.fail(f"cannot make a network namespace (this test needs root): {e.stderr.strip()}")
    listener = socket.socket()
    opened: list[socket.socket] = []
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", inner_end)
        _ip("link", "set", inner_end, "netns", namespace)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("netns", "exec", namespace, "ip", "addr", "add", f"{inner_ip}/30", "dev", inner_end)
        _ip("netns", "exec", namespace, "ip", "link", "set", inner_end, "up")
        listener.bind((host_ip, 0))
        listener.listen(16)
        server = sa.engine.make_url(PG_URL)
        upstream = (server.host or "127.0.0.1", server.port or 5432)
        threading.Thread(target=_forward, args=(listener, upstream, opened), daemon=True).start()
        url = server.set(host=host_ip, port=listener.getsockname()[1]).render_as_string(hide_password=False)
        yield SilentPath(namespace, url, host_end)
    finally:
        listener.close()
        for piped in opened:
            with contextlib.suppress(OSError):
                piped.shutdown(socket.SHUT_RDWR)  # (wakes the pipe threads blocked reading it)
            piped.close()
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def _write_after_silence(path: SilentPath, kind: str, timeout: float, name: str) -> dict[str, object]:
    """Run the child in the namespace; silence the path once it has written; return its outcome of the
    write after, or fail when it has none within 60 s (it waits for TCP to give up: many minutes)."""
    child = subprocess.Popen(
        ["ip", "netns", "exec", path.namespace, sys.executable, CHILD, kind, path.url, str(timeout), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        path.go_silent()
        child.stdin.write("go\n")
        child.stdin.flush()
        answered, _, _ = select.select([child.stdout], [], [], 60)
        assert answered, "the write still waits 60 s after the network went silent"
        outcome: dict[str, object] = json.loads(child.stdout.readline())
        return outcome
    finally:
        child.kill()
        child.wait()


def _drop_tables(*names: str) -> None:
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        for table in names:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    engine.dispose()


def test_a_store_whose_network_goes_silent_reports_the_lost_connection(silent_path: SilentPath) -> None:
    prefix = f"s{uuid.uuid4().hex[:8]}_"
    try:
        outcome = _write_after_silence(silent_path, "store", 4.0, prefix)
    finally:
        _drop_tables(f"{prefix}records", f"{prefix}runs")
    assert outcome["error"] == "StoreError", outcome
    assert "could not be restored within the store's busy timeout" in str(outcome["message"])
    assert float(str(outcome["seconds"])) < 20, outcome


def test_an_event_log_whose_network_goes_silent_reports_a_timeout(silent_path: SilentPath) -> None:
    outcome = _write_after_silence(silent_path, "log", 4.0, f"silent{uuid.uuid4().hex[:8]}")
    assert outcome["error"] == "LogTimeout", outcome
    assert float(str(outcome["seconds"])) < 20, outcome


def test_the_bounds_follow_the_timeout_and_an_option_in_the_url_wins() -> None:
    bounds = libpq_bounds({}, 30.0)
    assert bounds["connect_timeout"] == 30 and bounds["keepalives"] == 1
    # Silence is noticed after about the timeout: half of it idle, then three probes, or unacknowledged data.
    assert bounds["keepalives_idle"] + 3 * bounds["keepalives_interval"] <= 30
    assert bounds["tcp_user_timeout"] == 30_000
    assert libpq_bounds({}, 0.1)["connect_timeout"] == 2  # libpq's own floor
    given = libpq_bounds({"keepalives_idle": "7", "connect_timeout": "9"}, 30.0)
    assert "keepalives_idle" not in given and "connect_timeout" not in given and given["keepalives"] == 1


def test_the_kernel_holds_the_bounds_on_the_store_connection() -> None:
    """The options reach the socket: read back from the kernel on a live connection."""
    prefix = f"k{uuid.uuid4().hex[:8]}_"
    url = PG_URL + ("&" if "?" in PG_URL else "?") + "keepalives_idle=7"
    store = bide.SQLStore(url, table_prefix=prefix, busy_timeout=12.0)
    try:
        with store.engine.connect() as conn:
            fd = conn.connection.dbapi_connection.pgconn.socket  # type: ignore[union-attr]
            sock = socket.socket(fileno=os.dup(fd))
            try:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7  # the URL's
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 2
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 12_000
            finally:
                sock.close()
    finally:
        store.close()
        _drop_tables(f"{prefix}records", f"{prefix}runs")
