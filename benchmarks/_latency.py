"""A network with latency, on loopback: the benchmarks' way to measure a database as if it were across a
data centre (imported by the scripts beside it; not a benchmark itself)."""

from __future__ import annotations

import argparse
import queue
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit


class DelayingProxy:
    """A TCP proxy on loopback to `target` that delivers each chunk `delay` seconds after it arrived, in
    both directions: a network with that one-way latency (chunks sent together stay together, as on a
    real link; nothing is serialized behind a sleep)."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target, self.delay = target, delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._relay(client, server)
            self._relay(server, client)

    def _relay(self, source: socket.socket, sink: socket.socket) -> None:
        due: queue.Queue[tuple[float, bytes] | None] = queue.Queue()

        def receive() -> None:
            try:
                while data := source.recv(65536):
                    due.put((time.monotonic() + self.delay, data))
            except OSError:
                pass
            due.put(None)

        def deliver() -> None:
            while (item := due.get()) is not None:
                wait = item[0] - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                try:
                    sink.sendall(item[1])
                except OSError:
                    break
            for s in (source, sink):
                s.close()

        threading.Thread(target=receive, daemon=True).start()
        threading.Thread(target=deliver, daemon=True).start()

    def url(self, url: str) -> str:
        """`url` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        here = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{user}@{here}" if user else here))

    def close(self) -> None:
        self.listener.close()


def proxied(url: str, delay_ms: float) -> tuple[DelayingProxy, str]:
    """A `DelayingProxy` of `delay_ms` each way in front of the server of database `url`, and `url` through
    it."""
    parts = urlsplit(url)
    proxy = DelayingProxy((parts.hostname or "127.0.0.1", parts.port or 5432), delay_ms / 1000)
    return proxy, proxy.url(url)


def round_trip_ms(url: str) -> float:
    """The median time of a `SELECT 1` on PostgreSQL database `url` (50 of them), in ms."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        times = []
        for _ in range(50):
            t = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1000


def add_latency_option(parser: argparse.ArgumentParser, what: str) -> None:
    """The scripts' `--latency-ms` (0.5 by default; 0 skips): `what` is measured through the proxy too."""
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.5,
        help=f"also {what} through a proxy adding this latency each way (0: skip; default 0.5)",
    )
