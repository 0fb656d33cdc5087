"""bide's PostgreSQL store across a lost connection: a batch whose connection broke (a backend killed, a
server restarting, an acknowledgement that never came back) is sent again on a new connection until the
store's busy timeout, and answered as if the first try had been: a write the lost try committed is the
caller's own (inserted), a lease it granted is held. So a one-tool run rides over the loss of any of its
commits' acknowledgements and its side effect fires once; past the busy timeout the caller is told that a
write may or may not have committed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from conftest import PG_URL, drop_prefix

import bide
from bide.testing import ScriptedModel, call, reply

pytestmark = pytest.mark.postgres

PLAIN_URL = PG_URL.replace("postgresql+psycopg://", "postgresql://")
# The server's CommandComplete for a COMMIT: sent once the transaction has committed.
COMMITTED = b"C\x00\x00\x00\x0bCOMMIT\x00"


class AckDropper:
    """A TCP proxy to the PostgreSQL server that, when armed with `arm(k)`, relays nothing of the server's
    answer holding the k-th COMMIT's acknowledgement from then on and cuts that connection: the transaction
    committed, the client sees its connection break. `stop_upstream()` refuses every new connection;
    `go_silent()` cuts every connection and accepts new ones without ever answering (a frozen server)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.commits = 0  # acknowledgements relayed or dropped
        self.cut_at = 0  # the commit number whose acknowledgement is dropped (0: none)
        self.dropped = 0
        self.refuse = False
        self.silent = False
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, application: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/test?application_name={application}"

    def arm(self, k: int) -> None:
        with self.lock:
            self.cut_at = self.commits + k

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refuse:
                client.close()
                continue
            if self.silent:
                with self.lock:
                    self.sockets.append(client)
                continue
            server = socket.create_connection(("127.0.0.1", 5432))
            with self.lock:
                self.sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        try:
            while data := source.recv(65536):
                if from_server and COMMITTED in data:
                    with self.lock:
                        self.commits += data.count(COMMITTED)
                        cut = self.cut_at and self.commits >= self.cut_at
                        if cut:
                            self.cut_at = 0
                            self.dropped += 1
                    if cut:
                        break
                sink.sendall(data)
        except OSError:
            pass
        _cut(source, sink)

    def stop_upstream(self) -> None:
        self.refuse = True
        with self.lock:
            _cut(*self.sockets)

    def go_silent(self) -> None:
        self.silent = True
        with self.lock:
            _cut(*self.sockets)
            self.sockets = []

    def close(self) -> None:
        self.stop_upstream()
        self.listener.close()


def _cut(*sockets: socket.socket) -> None:
    """Close `sockets` so that both ends see it at once (a close alone waits for the other thread's recv)."""
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"rc{uuid.uuid4().hex[:10]}_"
    yield name
    drop_prefix(PG_URL, name)


def _agent(store: bide.Store, fired: list[str], delay: float = 0.0) -> bide.Agent:
    @bide.tool
    def charge(customer: str) -> str:
        """Charge a customer."""
        fired.append(bide.current_call().idempotency_key)
        return f"charged {customer}"

    model = ScriptedModel([call("charge", customer="alice"), reply("done")], delay=delay)
    return bide.Agent(model, store=store, tools=[charge])


def _commits_of_one_run(prefix: str) -> int:
    proxy = AckDropper()
    store = bide.open_store(proxy.url("probe"), table_prefix=prefix)
    try:
        before = proxy.commits
        _agent(store, []).run_sync(f"probe-{uuid.uuid4().hex[:6]}", "charge alice")
        return proxy.commits - before
    finally:
        store.close()
        proxy.close()


def test_a_run_rides_over_a_lost_acknowledgement_of_each_of_its_commits(prefix: str) -> None:
    count = _commits_of_one_run(prefix)
    # The lease grant (with the first load), the first write (with the attempt marker), the tool's
    # result, the final turn with the run's end.
    assert count >= 4, count
    for k in range(1, count + 1):
        proxy = AckDropper()
        store = bide.open_store(proxy.url(f"rc-{k}"), table_prefix=prefix)
        fired: list[str] = []
        run_id = f"lost-ack-{k}"
        try:
            proxy.arm(k)
            result = _agent(store, fired).run_sync(run_id, "charge alice")
        finally:
            store.close()
            proxy.close()
        assert proxy.dropped == 1, k
        assert result.answer == "done" and not result.replayed, k
        assert len(fired) == 1, (k, fired)
        check = bide.open_store(PG_URL, table_prefix=prefix)
        try:
            records = bide.Journal(check, run_id).load().records()
            assert bide.run_status(check, run_id).status == "completed"
        finally:
            check.close()
        attempts = [r for r in records if isinstance(r, bide.Attempt)]
        results = [r for r in records if isinstance(r, bide.ToolResult)]
        assert len(attempts) == 1 and [r.result for r in results] == ["charged alice"], (k, records)


def _terminate(application: str) -> int:
    with psycopg.connect(PLAIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            (application,),
        ).fetchone()
    return int(row[0]) if row else 0


def test_runs_complete_while_their_backends_are_killed_and_fire_once(prefix: str) -> None:
    """300 runs at once on one store (their model answers in 0.2 s) while the store's backend is killed
    every 0.1 s, once it committed something since the last kill: every run completes and every side
    effect fired once (before, a killed backend failed the runs its batch served). (On a slow machine a
    batch of 300 runs takes longer than 0.1 s: killed at a fixed pace, it would be resent forever.)"""
    application = f"rc-kill-{uuid.uuid4().hex[:6]}"
    store = bide.open_store(f"{PG_URL}?application_name={application}", table_prefix=prefix)
    assert isinstance(store, bide.SQLStore)
    fired: list[str] = []
    stop = threading.Event()
    kills = [0]

    def killer() -> None:
        seen = store.commits
        while not stop.wait(0.1):
            give_up = time.monotonic() + 5
            while store.commits == seen and time.monotonic() < give_up and not stop.wait(0.005):
                pass
            seen = store.commits
            kills[0] += _terminate(application)

    async def everything() -> list[bide.RunResult[str]]:
        agents = [_agent(store, fired, 0.2) for _ in range(300)]
        return await asyncio.gather(*(a.run(f"kill-{i}", "charge alice") for i, a in enumerate(agents)))

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        results = asyncio.run(everything())
    finally:
        stop.set()
        thread.join()
        store.close()
    assert kills[0] >= 3, kills
    assert [r.answer for r in results] == ["done"] * 300
    assert len(fired) == 300 and len(set(fired)) == 300


def test_past_the_busy_timeout_a_lost_connection_is_reported_with_its_doubt(prefix: str) -> None:
    proxy = AckDropper()
    store = bide.SQLStore(proxy.url("rc-down"), table_prefix=prefix, busy_timeout=1.0)
    try:
        assert store.insert_many("r", [("a", b"1")])[0].inserted
        proxy.stop_upstream()  # the server is gone, and stays gone
        started = time.monotonic()
        lost = "could not be restored within the store's busy timeout"
        with pytest.raises(bide.StoreError, match=lost) as e:
            store.insert_many("r", [("b", b"2")])
        took = time.monotonic() - started
        assert "a write may or may not have committed" in str(e.value)
        with pytest.raises(bide.StoreError, match="nothing was written"):
            store.load("r")
    finally:
        store.close()
        proxy.close()
    assert 0.5 <= took < 5, took


def _raised_within(seconds: float, fn: Callable[[], object]) -> BaseException | None:
    """What `fn` raised, run in a thread that must end within `seconds` (a hang fails, not blocks)."""
    raised: list[BaseException | None] = [None]

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            raised[0] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return raised[0]


def test_a_server_that_never_answers_is_reported_within_the_busy_timeout(prefix: str) -> None:
    """libpq alone waits forever for a server that accepts a connection and never answers (a frozen
    server, a half-open firewall): the store bounds each connect attempt by its busy timeout."""
    proxy = AckDropper()
    try:
        proxy.go_silent()
        error = _raised_within(
            10, lambda: bide.SQLStore(proxy.url("rc-frozen-open"), table_prefix=prefix, busy_timeout=1)
        )
        assert isinstance(error, bide.StoreError) and "cannot connect to the store" in str(error)
        proxy.silent = False
        store = bide.SQLStore(proxy.url("rc-frozen"), table_prefix=prefix, busy_timeout=1.0)
        try:
            assert store.insert_many("r", [("a", b"1")])[0].inserted
            proxy.go_silent()  # the connection breaks, and every new one hangs
            error = _raised_within(10, lambda: store.insert_many("r", [("b", b"2")]))
            assert isinstance(error, bide.StoreError)
            assert "could not be restored within the store's busy timeout" in str(error)
        finally:
            store.close()
    finally:
        proxy.close()


def test_a_connect_timeout_in_the_url_wins_over_the_busy_timeout(prefix: str) -> None:
    proxy = AckDropper()
    try:
        proxy.go_silent()
        url = proxy.url("rc-url-timeout") + "&connect_timeout=3"
        started = time.monotonic()
        error = _raised_within(10, lambda: bide.SQLStore(url, table_prefix=prefix, busy_timeout=0.1))
        assert isinstance(error, bide.StoreError) and "cannot connect to the store" in str(error)
        assert time.monotonic() - started > 2.5
    finally:
        proxy.close()


def test_a_write_resent_after_its_commit_is_the_callers_and_a_lease_its_holders(prefix: str) -> None:
    """The store-level rule on its own: each kind of request, its acknowledgement dropped once."""
    proxy = AckDropper()
    store = bide.open_store(proxy.url("rc-unit"), table_prefix=prefix)
    try:
        now = int(time.time() * 1000)
        proxy.arm(1)
        lease = store.lease("u", "holder-1", now_ms=now, ttl_ms=60_000)
        fence = ("holder-1", lease.token)
        assert proxy.dropped == 1 and lease.held and lease.holder == "holder-1"
        proxy.arm(1)
        entries = store.insert_many("u", [("x", b"x1"), ("y", b"y1")], exclusive=True, fence=fence)
        assert proxy.dropped == 2 and [e.inserted for e in entries] == [True, True]
        proxy.arm(1)
        entries = store.insert_many("u", [("y", b"y2"), ("z", b"z1")], fence=fence)
        # y was there before this call, with other bytes: not its own; z is its own.
        assert proxy.dropped == 3 and [e.inserted for e in entries] == [False, True]
        proxy.arm(1)
        entries = store.insert_many("u", [("x", b"other"), ("w", b"w1")], exclusive=True, fence=fence)
        assert proxy.dropped == 4 and not any(e.inserted for e in entries)
        assert store.get("u", "w") is None  # all or nothing, resent or not
        proxy.arm(1)
        assert store.release("u", "holder-1", lease.token)
        assert proxy.dropped == 5
    finally:
        store.close()
        proxy.close()


def test_a_lock_held_elsewhere_is_waited_for_the_busy_timeout_then_reported(prefix: str) -> None:
    """A session holding the store's tables (LOCK TABLE, or idle in a transaction) made every request, and
    opening the store, wait forever; now they wait the busy timeout, as on SQLite, and say what to do. An
    open of a store that is up to date reads only the catalogue, which such a lock does not hold up: it
    opens at once, and its requests wait and report as any. An open that must look at the tables more
    closely (here an older store, without the open-runs index) waits the busy timeout and says so."""
    store = bide.SQLStore(PG_URL, table_prefix=prefix, busy_timeout=1.0)
    try:
        assert store.insert_many("r", [("a", b"1")])[0].inserted
        with psycopg.connect(PLAIN_URL) as holder:
            holder.execute(f"LOCK TABLE {prefix}runs IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            bide.SQLStore(PG_URL, table_prefix=prefix, busy_timeout=5.0).close()
            assert time.monotonic() - started < 4  # not the busy timeout
            # A write "wrote nothing"; a listing, which writes nothing anyway, "failed".
            requests = ((lambda: store.insert_many("r", [("b", b"2")]), "wrote nothing"),
                        (store.runs, "listing the runs failed"))  # fmt: skip
            for request, said in requests:
                started = time.monotonic()
                with pytest.raises(bide.StoreError, match=f"{said}: the database stayed locked") as e:
                    request()
                assert 0.9 <= time.monotonic() - started < 5 and "lock timeout" in str(e.value)
            holder.rollback()
            holder.execute(f"DROP INDEX {prefix}runs_open")
            holder.commit()
            holder.execute(f"LOCK TABLE {prefix}runs IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(bide.StoreError, match="its tables stayed locked by another session"):
                bide.SQLStore(PG_URL, table_prefix=prefix, busy_timeout=1.0)
            assert time.monotonic() - started < 5  # not once per schema retry
            holder.rollback()
        assert store.insert_many("r", [("b", b"2")])[0].inserted  # nothing was left behind
        assert [e.key for e in store.load("r")] == ["a", "b"]
    finally:
        store.close()


def test_a_lost_pipelined_connection_is_not_reported_twice_by_psycopg(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A run whose pipelined write meets a backend the server terminated rides over it, and psycopg's own
    warning about the pipeline it could not close ("error ignored terminating <psycopg.Pipeline [BAD]>")
    is not logged: it reached stderr (and `bide runs`' output) once per cut connection. An application's
    own pipeline keeps the warning."""
    application = f"rc-quiet-{uuid.uuid4().hex[:6]}"
    store = bide.open_store(f"{PG_URL}?application_name={application}", table_prefix=prefix)
    fired: list[str] = []
    caplog.set_level(logging.WARNING, logger="psycopg")
    try:
        for i in range(3):
            assert _agent(store, fired).run_sync(f"quiet-{i}", "charge alice").answer == "done"
            assert _terminate(application) >= 1
    finally:
        store.close()
    assert len(fired) == 3
    assert not [r for r in caplog.records if "error ignored terminating" in r.getMessage()]

    own = psycopg.connect(f"{PLAIN_URL}?application_name={application}-own", autocommit=True)
    try:
        with contextlib.suppress(psycopg.OperationalError), own.pipeline():
            _terminate(f"{application}-own")
            own.execute("SELECT 1").fetchone()
    finally:
        own.close()
    assert [r for r in caplog.records if "error ignored terminating" in r.getMessage()]
