"""SQLStore's in-loop group commit on SQLite: requests made before the loop gets back to its callbacks run as
one transaction, with multi-row statements. These tests form such batches on purpose and check that each
request gets exactly what it would get alone. On PostgreSQL the store's thread batches what is queued and
runs each batch as a pipeline: the tests marked postgres check that too, and what an interrupted or broken
pipeline leaves behind."""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import drop_prefix
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bide
from bide._errors import LeaseLost, RunEnded, StoreError
from bide._memory import MemoryStore
from bide._sql import _CHUNK, SQLStore, _chunks, _retryable
from bide._store import Entry, Lease, WriteTransaction
from bide.testing import ScriptedModel, reply

POSTGRES_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLStore]:
    s = SQLStore(f"sqlite:///{tmp_path / 'batch.db'}")
    yield s
    s.close()


def run_batch(store: SQLStore, make: Any) -> tuple[list[Any], int]:
    """Issue the requests `make()` returns inside a running loop, await them together; return their results
    and how many transactions committed meanwhile."""

    async def go() -> list[Any]:
        futures = make()  # issued back to back: nothing awaited in between
        return list(await asyncio.gather(*futures))

    before = store.commits
    results = asyncio.run(go())
    return results, store.commits - before


def test_chunks_cover_every_row_in_powers_of_two() -> None:
    for n in (0, 1, 2, 3, 255, 256, 257, 1000, 3 * _CHUNK + 5):
        pieces = _chunks(n)
        assert sum(size for _, size in pieces) == n
        assert all(size & (size - 1) == 0 and size <= _CHUNK for _, size in pieces)
        assert [start for start, _ in pieces] == [sum(s for _, s in pieces[:i]) for i in range(len(pieces))]


def test_exclusive_conflict_in_a_mixed_batch_leaves_no_rows(store: SQLStore) -> None:
    old_b = store.insert_many("r1", [("b", b"old-b")])[0]
    old_x = store.insert_many("r3", [("x", b"old-x")])[0]
    (a, b, c, d), commits = run_batch(
        store,
        lambda: [
            store.ainsert_many("r1", [("a", b"new-a"), ("b", b"new-b"), ("c", b"new-c")], exclusive=True),
            store.ainsert_many("r2", [("p", b"p"), ("q", b"q")], exclusive=True),
            store.ainsert_many("r3", [("x", b"new-x"), ("y", b"y")]),
            store.ainsert_many("r4", [("z", b"z")]),
        ],
    )
    assert commits == 1
    # The conflicting exclusive request: only the stored entry of the existing key, nothing inserted.
    assert a == [Entry(old_b.seq, "b", b"old-b", False)]
    assert [e.key for e in store.load("r1")] == ["b"]
    assert store.get("r1", "a") is None and store.get("r1", "c") is None
    # Everyone else is unaffected.
    assert [(e.key, e.data, e.inserted) for e in b] == [("p", b"p", True), ("q", b"q", True)]
    assert b[0].seq < b[1].seq
    assert c[0] == Entry(old_x.seq, "x", b"old-x", False)
    assert (c[1].key, c[1].data, c[1].inserted) == ("y", b"y", True)
    assert [(e.key, e.inserted) for e in d] == [("z", True)]
    assert store.load("r2") == [Entry(e.seq, e.key, e.data) for e in b]
    assert store.load("r3") == [Entry(old_x.seq, "x", b"old-x"), Entry(c[1].seq, "y", b"y")]
    assert store.runs() == ["r1", "r2", "r3", "r4"]


def test_two_requests_of_one_batch_insert_the_same_key(store: SQLStore) -> None:
    (first, second, other, excl), commits = run_batch(
        store,
        lambda: [
            store.ainsert_many("r", [("k", b"first"), ("only-1", b"1")]),
            store.ainsert_many("r", [("k", b"second"), ("only-2", b"2")]),
            store.ainsert_many("s", [("k", b"s")]),
            store.ainsert_many("r", [("only-1", b"late"), ("never", b"n")], exclusive=True),
        ],
    )
    assert commits == 1
    # One winner per key, and every inserter gets the winner's record back.
    assert first[0] == Entry(first[0].seq, "k", b"first", True)
    assert second[0] == Entry(first[0].seq, "k", b"first", False)
    assert second[1].inserted and first[1].inserted
    assert other == [Entry(other[0].seq, "k", b"s", True)]
    assert excl == [Entry(first[1].seq, "only-1", b"1", False)]
    loaded = store.load("r")
    assert [(e.key, e.data) for e in loaded] == [("k", b"first"), ("only-1", b"1"), ("only-2", b"2")]
    assert [e.seq for e in loaded] == sorted(e.seq for e in loaded)


def test_loads_with_after_and_repeated_runs_in_one_batch(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = store.insert_many("r", [(f"k{i}", bytes([i])) for i in range(6)])
    s = store.insert_many("s", [("only", b"s")])
    seen: list[int] = []
    real = store._transaction

    def spy(reqs: list[Any], raw: Any, **options: Any) -> list[Any]:
        seen.append(len(reqs))
        return real(reqs, raw, **options)

    monkeypatch.setattr(store, "_transaction", spy)
    results, commits = run_batch(
        store,
        lambda: [
            store.aload("r"),
            store.aload("r", r[2].seq),
            store.aload("s"),
            store.aload("r", r[5].seq),
            store.aload("absent"),
            store.aload("r", r[2].seq),
            store.aget("r", "k3"),
            store.aload("s", s[0].seq),
        ],
    )
    assert seen == [8] and commits == 0  # one transaction, and it wrote nothing
    full = [Entry(e.seq, e.key, e.data) for e in r]
    assert results[0] == full
    assert results[1] == full[3:]
    assert results[2] == [Entry(s[0].seq, "only", b"s")]
    assert results[3] == []
    assert results[4] == []
    assert results[5] == full[3:] and results[5] is not results[1]
    assert results[6] == full[3]
    assert results[7] == []


def test_gets_in_one_batch_each_answer_what_they_would_alone(store: SQLStore) -> None:
    # Drives look for a cancel request at their turn boundaries, many in one batch: multi-row statements.
    r = store.insert_many("r", [(f"k{i}", bytes([i])) for i in range(5)])
    s = store.insert_many("s", [("k1", b"s1")])
    wanted = [("r", "k3"), ("s", "k1"), ("r", "absent"), ("absent", "k1"), ("r", "k3"), ("r", "k0")]
    wanted += [(f"x{i}", "k") for i in range(_CHUNK + 3)]  # more than one chunk
    results, commits = run_batch(store, lambda: [store.aget(run, key) for run, key in wanted])
    assert commits == 0
    assert results[0] == Entry(r[3].seq, "k3", bytes([3]))
    assert results[1] == Entry(s[0].seq, "k1", b"s1")
    assert results[2] is None and results[3] is None
    assert results[4] == results[0] and results[4] is not results[0]
    assert results[5] == Entry(r[0].seq, "k0", bytes([0]))
    assert results[6:] == [None] * (_CHUNK + 3)
    assert results == [store.get(run, key) for run, key in wanted]


def test_loads_in_a_batch_see_the_inserts_requested_before_them(store: SQLStore) -> None:
    (ins, loaded), commits = run_batch(
        store, lambda: [store.ainsert_many("r", [("a", b"1"), ("b", b"2")]), store.aload("r")]
    )
    assert commits == 1
    assert loaded == [Entry(e.seq, e.key, e.data) for e in ins]


def test_a_batch_larger_than_one_chunk(store: SQLStore) -> None:
    n = _CHUNK + 57  # requests; three records each, so the rows span several chunks
    # Existing keys spread over the chunks: every 7th run has its second key already.
    old = {i: store.insert_many(f"run-{i:04d}", [("b", b"old")])[0] for i in range(0, n, 7)}
    results, commits = run_batch(
        store,
        lambda: [
            store.ainsert_many(
                f"run-{i:04d}",
                [("a", b"a%d" % i), ("b", b"b%d" % i), ("c", b"c%d" % i)],
                exclusive=i % 2 == 0,
            )
            for i in range(n)
        ],
    )
    assert commits == 1
    for i, out in enumerate(results):
        rid = f"run-{i:04d}"
        stored = store.load(rid)
        if i in old and i % 2 == 0:  # exclusive and conflicting: nothing new
            assert out == [Entry(old[i].seq, "b", b"old", False)]
            assert stored == [Entry(old[i].seq, "b", b"old")]
        elif i in old:  # the two absent keys inserted, the existing one returned
            assert [(e.key, e.inserted) for e in out] == [("a", True), ("b", False), ("c", True)]
            assert out[1] == Entry(old[i].seq, "b", b"old", False)
            assert out[0].data == b"a%d" % i and out[2].data == b"c%d" % i
            assert stored == sorted((Entry(e.seq, e.key, e.data) for e in out), key=lambda e: e.seq)
        else:
            assert [(e.key, e.data, e.inserted) for e in out] == [
                ("a", b"a%d" % i, True),
                ("b", b"b%d" % i, True),
                ("c", b"c%d" % i, True),
            ]
            assert out[0].seq < out[1].seq < out[2].seq  # the items' order is their seq order
            assert stored == [Entry(e.seq, e.key, e.data) for e in out]
    assert len(store.runs(limit=10_000)) == n
    # As many loads in one batch (every other one after its run's first record), against one-by-one loads.
    firsts = {i: store.load(f"run-{i:04d}")[0].seq for i in range(n)}
    loaded, commits = run_batch(
        store, lambda: [store.aload(f"run-{i:04d}", firsts[i] if i % 2 else 0) for i in range(n)]
    )
    assert commits == 0
    for i, got in enumerate(loaded):
        assert got == store.load(f"run-{i:04d}", firsts[i] if i % 2 else 0)
        assert len(got) == (3 if i not in old or i % 2 == 1 else 1) - (i % 2)


def test_leases_in_one_batch_answer_what_they_would_one_by_one(store: SQLStore) -> None:
    """Grants and renewals of many runs in one batch are read, decided and written together (two
    statements a chunk); each answers and stores what the rule S9 says, over more than one chunk."""
    now, ttl = 1_000_000, 30_000
    live = store.lease("live", "x", now_ms=now, ttl_ms=ttl)
    expired = store.lease("expired", "x", now_ms=now - 2 * ttl, ttl_ms=ttl)
    mine = store.lease("mine", "y", now_ms=now, ttl_ms=ttl)
    store.lease("freed", "x", now_ms=now, ttl_ms=ttl)
    store.release("freed", "x", 1)
    fresh = [f"new-{i:04d}" for i in range(_CHUNK + 9)]
    results, _ = run_batch(
        store,
        lambda: [
            store.alease("live", "z", now_ms=now, ttl_ms=ttl),
            store.alease("expired", "z", now_ms=now, ttl_ms=ttl),
            store.alease("mine", "y", now_ms=now + 5, ttl_ms=ttl, token=mine.token),
            store.alease("freed", "z", now_ms=now, ttl_ms=ttl),
            *(store.alease(r, "h-" + r, now_ms=now, ttl_ms=ttl) for r in fresh),
        ],
    )
    assert results[0] == Lease("live", "x", live.token, live.expires_ms, False)
    assert results[1] == Lease("expired", "z", expired.token + 1, now + ttl, True)
    assert results[2] == Lease("mine", "y", mine.token, now + 5 + ttl, True)
    assert results[3] == Lease("freed", "z", 2, now + ttl, True)
    assert results[4:] == [Lease(r, "h-" + r, 1, now + ttl, True) for r in fresh]
    # What was stored is what was answered: each holder renews, nobody else gets in.
    for got in results:
        again = store.lease(got.run_id, "other", now_ms=now + 1, ttl_ms=ttl)
        assert (again.held, again.holder, again.token) == (False, got.holder, got.token)
        renewed = store.lease(got.run_id, got.holder, now_ms=now + 2, ttl_ms=ttl, token=got.token)
        assert renewed.held and renewed.token == got.token
    # Two requests on one run (and a release) in one batch are answered in order of issue.
    results, _ = run_batch(
        store,
        lambda: [
            store.alease("pair", "a", now_ms=now, ttl_ms=ttl),
            store.alease("pair", "b", now_ms=now, ttl_ms=ttl),
            store.arelease("live", "x", live.token),
        ],
    )
    assert [(r.holder, r.held) for r in results[:2]] == [("a", True), ("a", False)]
    assert results[2] is True


def test_records_commit_synced_and_lease_batches_alone_unsynced(store: SQLStore) -> None:
    """In the event loop a batch of leases alone (and the loads sent with it) commits at synchronous=NORMAL;
    every batch with a record commits at FULL (durable on return, S3). All of them run on one connection
    (a second one would reread the pages the first wrote), which is back at FULL after each lease batch."""
    statements: list[str] = []

    def level(conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA synchronous").fetchone()[0])

    def levels_at_commit() -> list[int]:
        """The synchronous level each traced transaction committed at."""
        out: list[int] = []
        current = 2
        for sql in statements:
            if sql.startswith("PRAGMA synchronous="):
                current = {"NORMAL": 1, "FULL": 2}[sql.split("=")[1]]
            elif sql == "COMMIT":
                out.append(current)
        return out

    async def go() -> tuple[list[int], int, list[Entry]]:
        await store.aload("warm")  # opens the event loop's connection
        slot = store._local.slot
        assert slot is not None
        conn = slot.raw.driver_connection
        conn.set_trace_callback(statements.append)
        await asyncio.gather(store.alease("r", "h", now_ms=1, ttl_ms=10), store.aload("r"))
        await store.ainsert_many("r", [("k", b"v")])
        granted = store.alease("s", "h", now_ms=1, ttl_ms=10)
        await asyncio.gather(granted, store.ainsert_many("r", [("k2", b"v")]))
        conn.set_trace_callback(None)
        return levels_at_commit(), level(conn), await store.aload("r")

    commits, final_level, loaded = asyncio.run(go())
    assert commits == [1, 2, 2]  # NORMAL for the lease alone, FULL with records
    assert final_level == 2 and store._local.slot is not None and len(store._slots) == 1
    assert [e.key for e in loaded] == ["k", "k2"] and store.lease("s", "h", now_ms=2, ttl_ms=10, token=1).held


def test_a_connection_that_stays_unsynced_is_dropped(store: SQLStore) -> None:
    """If a lease batch cannot set its connection back to synchronous=FULL after its commit, the caller gets
    an error and the connection is dropped: the next batch, with a record, commits on a new one at FULL."""

    def deny_full_sync(action: int, arg1: str | None, arg2: str | None, *_: Any) -> int:
        denied = action == sqlite3.SQLITE_PRAGMA and arg1 == "synchronous" and arg2 == "FULL"
        return sqlite3.SQLITE_DENY if denied else sqlite3.SQLITE_OK

    async def go() -> tuple[Any, Any]:
        await store.aload("warm")  # opens the event loop's connection
        slot = store._local.slot
        assert slot is not None
        before = slot.raw.driver_connection
        before.set_authorizer(deny_full_sync)
        with pytest.raises(StoreError):
            await store.alease("r", "h", now_ms=1, ttl_ms=10)
        await store.ainsert_many("r", [("k", b"v")])
        return before, slot.raw.driver_connection

    before, after = asyncio.run(go())
    assert after is not before
    assert int(after.execute("PRAGMA synchronous").fetchone()[0]) == 2  # FULL
    assert [e.key for e in store.load("r")] == ["k"]


def test_runs_ended_in_one_batch_are_all_sealed(store: SQLStore) -> None:
    """A batch that writes the end record of many runs (more than a chunk) marks every one of them ended:
    each refuses new records afterwards (S8), and none is listed as needing recovery."""
    runs = [f"end-{i:04d}" for i in range(_CHUNK + 3)]
    run_batch(store, lambda: [store.ainsert_many(r, [("a", b"a"), ("run:end", b"end")]) for r in runs])
    for r in runs:
        with pytest.raises(RunEnded):
            store.insert_many(r, [("late", b"x")])
    store.lease(runs[0], "h", now_ms=1, ttl_ms=1)
    assert store.expired_leases(now_ms=10) == []


def test_hooks_see_only_what_a_batch_kept(store: SQLStore) -> None:
    store.insert_many("r1", [("b", b"old")])
    calls: list[dict[str, list[Entry]]] = []

    def hook(txn: WriteTransaction, written: Mapping[str, Sequence[Entry]]) -> None:
        calls.append({rid: list(es) for rid, es in written.items()})
        # The transaction's own view: the batch's inserts, without the undone exclusive ones.
        assert [e.key for e in txn.load("r1")] == ["b"]

    store.add_write_hook(hook)
    (a, b), commits = run_batch(
        store,
        lambda: [
            store.ainsert_many("r1", [("a", b"a"), ("b", b"b")], exclusive=True),
            store.ainsert_many("r2", [("x", b"x"), ("y", b"y")]),
        ],
    )
    assert commits == 1 and store.hook_errors == []
    assert [e.inserted for e in a] == [False]
    assert calls == [{"r2": b}]


def test_every_request_of_a_batch_is_answered_in_order_of_issue(store: SQLStore) -> None:
    async def go() -> list[list[Entry]]:
        futures = [store.ainsert_many(f"r{i % 5}", [(f"k{i}", b"%d" % i)]) for i in range(40)]
        return list(await asyncio.gather(*futures))

    before = store.commits
    results = asyncio.run(go())
    assert store.commits == before + 1
    assert [out[0].key for out in results] == [f"k{i}" for i in range(40)]
    for i in range(5):
        loaded = store.load(f"r{i}")
        assert sorted(e.key for e in loaded) == sorted(f"k{j}" for j in range(i, 40, 5))


def test_a_batch_of_only_existing_keys_returns_the_stored_entries(store: SQLStore) -> None:
    def requests() -> list[Any]:
        return [
            store.ainsert_many("r", [("a", b"a"), ("b", b"b")], exclusive=True),
            store.ainsert_many("s", [("c", b"c")]),
        ]

    first, commits = run_batch(store, requests)
    assert commits == 1 and all(e.inserted for out in first for e in out)
    again, commits = run_batch(store, requests)
    assert commits == 1
    assert again == [[Entry(e.seq, e.key, e.data, False) for e in out] for out in first]
    assert [len(store.load(r)) for r in ("r", "s")] == [2, 1]



# -- the law of a batch, on random batches ------------------------------------------------------------------

RUNS = ["r0", "r1", "r2"]
KEYS = ["a", "b", "c", "d"]
_insert = st.tuples(
    st.just("insert"),
    st.sampled_from(RUNS),
    st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
    st.booleans(),
)
_load = st.tuples(st.just("load"), st.sampled_from(RUNS), st.integers(0, 6), st.just(False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    existing=st.lists(st.tuples(st.sampled_from(RUNS), st.sampled_from(KEYS)), max_size=5, unique=True),
    requests=st.lists(_insert | _load, min_size=1, max_size=12),
)
def test_a_batch_does_what_its_requests_do_one_by_one(
    existing: list[tuple[str, str]], requests: list[tuple[str, str, Any, bool]]
) -> None:
    """A batch (one transaction, multi-row statements) leaves the journal as its inserts would, run one by
    one in batch order, and answers every request as that sequence would: the same keys, bytes and inserted
    flags, seqs that are the stored ones, and loads that see every insert of the batch."""
    with tempfile.TemporaryDirectory() as tmp:
        batched = SQLStore(f"sqlite:///{Path(tmp) / 'batched.db'}")
        single = SQLStore(f"sqlite:///{Path(tmp) / 'single.db'}")
        try:
            for store in (batched, single):
                for rid, key in existing:
                    store.insert_many(rid, [(key, f"old {rid} {key}".encode())])

            def payload(i: int, rid: str, keys: list[str]) -> list[tuple[str, bytes]]:
                return [(k, f"req {i} {rid} {k}".encode()) for k in keys]

            def issue() -> list[Any]:
                return [
                    batched.ainsert_many(rid, payload(i, rid, arg), exclusive=excl)
                    if op == "insert"
                    else batched.aload(rid, arg)
                    for i, (op, rid, arg, excl) in enumerate(requests)
                ]

            got, commits = run_batch(batched, issue)
            writes = any(op == "insert" for op, *_ in requests)
            assert commits == (1 if writes else 0)

            # The reference: inserts one at a time in batch order, then the loads.
            want: dict[int, Any] = {}
            for i, (op, rid, arg, excl) in enumerate(requests):
                if op == "insert":
                    want[i] = single.insert_many(rid, payload(i, rid, arg), exclusive=excl)
            for i, (op, rid, arg, _) in enumerate(requests):
                if op == "load":
                    want[i] = single.load(rid, arg)

            def shape(entries: list[Entry]) -> list[tuple[str, bytes, bool]]:
                return [(e.key, e.data, e.inserted) for e in entries]

            stored = {rid: {e.key: e for e in batched.load(rid)} for rid in RUNS}
            for i, (op, rid, _, _) in enumerate(requests):
                if op == "insert":
                    assert shape(got[i]) == shape(want[i])
                    assert all(stored[rid][e.key].seq == e.seq for e in got[i])
            # Same journal content per run, in the same commit order.
            for rid in RUNS:
                journal = [(e.key, e.data) for e in batched.load(rid)]
                assert journal == [(e.key, e.data) for e in single.load(rid)]
            # A load answers the records after its `after` seq, in seq order (seqs may be numbered
            # differently in the two stores, so compare against this store's own journal).
            for i, (op, rid, arg, _) in enumerate(requests):
                if op == "load":
                    assert got[i] == [e for e in batched.load(rid) if e.seq > arg]
                    assert [e.seq for e in got[i]] == sorted(e.seq for e in got[i])
        finally:
            batched.close()
            single.close()


def test_retry_classifier_knows_a_lock_from_other_errors(tmp_path: Path) -> None:
    # The one retry policy retries what lost to another transaction, told by result code, not by text.
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    with pytest.raises(sqlite3.OperationalError) as locked:
        other.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as missing:
        other.execute("SELECT * FROM no_such_table")
    holder.execute("ROLLBACK")
    holder.close()
    other.close()
    assert _retryable(locked.value)
    assert not _retryable(missing.value)
    assert not _retryable(ValueError("database is locked"))  # the text alone proves nothing


def test_a_batch_waits_for_a_lock_held_elsewhere_then_commits(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'wait.db'}", busy_timeout=10.0)
    try:
        holder = sqlite3.connect(tmp_path / "wait.db", isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        timer = threading.Timer(0.15, holder.execute, ("ROLLBACK",))
        timer.start()
        # Blocking caller: the store's thread meets the lock and waits for it (a busy timeout far longer
        # than the hold, however late a loaded machine runs the timer), then commits.
        out = store.insert_many("r", [("k", b"v")])
        timer.join()
        holder.close()
        assert [(e.key, e.inserted) for e in out] == [("k", True)]
        assert store.load("r") == [Entry(out[0].seq, "k", b"v")]
    finally:
        store.close()


_LEASE_STATES = st.sampled_from(["none", "held", "expired", "released"])
_FENCES = st.sampled_from([None, "ours", "stale token", "other holder"])
_fenced_insert = st.tuples(
    st.sampled_from(RUNS),
    # A run's end, when a request writes it, is its last record (the stores refuse anything else).
    st.lists(st.sampled_from(KEYS), max_size=2, unique=True).flatmap(
        lambda keys: st.sampled_from([[*keys, "run:end"], keys] if keys else [["run:end"]])
    ),
    st.booleans(),
    _FENCES,
)


@contextmanager
def fresh_sql_store(dialect: str) -> Iterator[SQLStore]:
    """An empty SQLStore: a SQLite file, or tables of a prefix of their own in the test PostgreSQL."""
    if dialect == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            store = SQLStore(f"sqlite:///{Path(tmp) / 'batched.db'}")
            try:
                yield store
            finally:
                store.close()
        return
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    store = SQLStore(POSTGRES_URL, table_prefix=prefix)
    try:
        yield store
    finally:
        store.close()
        drop_prefix(POSTGRES_URL, prefix)


@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    leases=st.fixed_dictionaries({rid: _LEASE_STATES for rid in RUNS}),
    ended=st.sets(st.sampled_from(RUNS)),
    requests=st.lists(_fenced_insert, min_size=1, max_size=10),
)
def test_fences_and_ends_in_a_batch_answer_as_one_by_one(
    dialect: str,
    leases: dict[str, str],
    ended: set[str],
    requests: list[tuple[str, list[str], bool, str | None]],
) -> None:
    """Fenced inserts (S10) and run ends (S8) issued together get the answers the same requests get one by
    one, in issue order, from the in-memory store: the same refusals, the same entries, and nothing stored
    after a run's end, also when the end is written by a request of the same batch. On SQLite they form
    one batch with multi-row statements; on PostgreSQL the store's thread takes them in batches sorted by
    run (one transaction each, its statements sent as a pipeline), which keeps each run's order."""
    with fresh_sql_store(dialect) as batched:
        single = MemoryStore()
        try:
            tokens: dict[tuple[int, str], int] = {}
            for n, store in enumerate((batched, single)):
                for rid in RUNS:
                    store.insert_many(rid, [("a", b"old")])
                    state = leases[rid]
                    if state != "none":
                        lease = store.lease(rid, "A", now_ms=1_000, ttl_ms=1 if state == "expired" else 10**9)
                        tokens[n, rid] = lease.token
                        if state == "released":
                            assert store.release(rid, "A", lease.token)
                    if rid in ended:
                        store.insert_many(rid, [("run:end", b"ended before")])

            def fence(n: int, rid: str, kind: str | None) -> tuple[str, int] | None:
                token = tokens.get((n, rid), 0)
                return {
                    None: None,
                    "ours": ("A", token),
                    "stale token": ("A", token + 1),
                    "other holder": ("B", token),
                }[kind]

            def payload(i: int, keys: list[str]) -> list[tuple[str, bytes]]:
                return [(k, f"req {i} {k}".encode()) for k in keys]

            def issue() -> list[Any]:
                return [
                    batched.ainsert_many(rid, payload(i, keys), exclusive=excl, fence=fence(0, rid, f))
                    for i, (rid, keys, excl, f) in enumerate(requests)
                ]

            async def go() -> list[Any]:
                return list(await asyncio.gather(*issue(), return_exceptions=True))

            got = asyncio.run(go())
            want: list[Any] = []
            for i, (rid, keys, excl, f) in enumerate(requests):
                try:
                    fenced = fence(1, rid, f)
                    want.append(single.insert_many(rid, payload(i, keys), exclusive=excl, fence=fenced))
                except (LeaseLost, RunEnded) as exc:
                    want.append(exc)

            def shape(answer: Any) -> Any:
                if isinstance(answer, BaseException):
                    return type(answer).__name__
                return [(e.key, e.data, e.inserted) for e in answer]

            assert [shape(g) for g in got] == [shape(w) for w in want]
            for rid in RUNS:
                journal = [(e.key, e.data) for e in batched.load(rid)]
                assert journal == [(e.key, e.data) for e in single.load(rid)]
                keys = [k for k, _ in journal]
                assert "run:end" not in keys or keys[-1] == "run:end"
        finally:
            single.close()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_large_batch_runs_with_the_garbage_collector_paused(store: SQLStore, enabled: bool) -> None:
    """A batch of 128 requests or more runs with no collection in it (its objects are all in use), and
    leaves the collector as it found it: enabled, or disabled by the application."""
    collections: list[bool] = []  # per collection started: whether a batch was running
    running = False
    real_run_batch = store._run_batch

    def watched(*args: Any) -> None:
        nonlocal running
        running = True
        try:
            real_run_batch(*args)
        finally:
            running = False

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(running)

    store._run_batch = watched  # type: ignore[method-assign]
    threshold = gc.get_threshold()
    gc.set_threshold(50)  # without the pause, a batch this size would start collections
    gc.callbacks.append(on_gc)
    if not enabled:
        gc.disable()
    try:
        results, commits = run_batch(
            store, lambda: [store.ainsert_many(f"r{i}", [("k", b"v" * 10)]) for i in range(300)]
        )
        assert gc.isenabled() == enabled
        assert commits == 1 and all(r[0].inserted for r in results)
        assert not any(collections), "a collection ran inside the batch"
        if enabled:
            assert collections, "the collector ran before or after the batch, as usual"
    finally:
        gc.enable()
        gc.callbacks.remove(on_gc)
        gc.set_threshold(*threshold)


def test_a_lock_held_past_the_busy_timeout_is_reported_once_and_nothing_is_written(tmp_path: Path) -> None:
    """Each try already waited the whole busy timeout: the store says so after one, instead of trying 8
    times (4 minutes with the default 30 s), and says nothing was written."""
    path = tmp_path / "held.db"
    store = SQLStore(f"sqlite:///{path}", busy_timeout=0.5)
    try:
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"wrote nothing: the database stayed locked .* \(0.5 s\)"):
            store.insert_many("r", [("k", b"v")])
        took = time.monotonic() - started
        holder.execute("ROLLBACK")
        holder.close()
        assert took < 2.0, took  # one busy timeout and a little; 8 tries took 4 s or more
        assert store.load("r") == []
    finally:
        store.close()


@pytest.mark.postgres
def test_an_interrupted_pipeline_leaves_no_connection_committing_statement_by_statement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PostgreSQL batch runs as a pipeline on a connection switched to autocommit (its BEGIN and COMMIT
    are statements of the pipeline). Interrupted in the middle by something that is not an Exception (a
    Ctrl-C, after which the store keeps its connection), nothing of the batch is stored and the connection
    the store keeps is back out of autocommit mode (or discarded), so the next write is one transaction."""
    with fresh_sql_store("postgresql") as store:
        store.insert_many("r", [("a", b"1")])

        def interrupted(*args: Any) -> Any:
            raise KeyboardInterrupt

        with monkeypatch.context() as patch:
            patch.setattr(SQLStore, "_stored_pg", interrupted)  # after the insert statement ran
            with pytest.raises(StoreError, match="KeyboardInterrupt"):
                store.insert_many("r", [("b", b"2")])
        raw = store._worker_slot.raw  # (looked at before the next batch, which sets autocommit itself)
        assert raw is None or not raw.is_valid or raw.driver_connection.autocommit is False
        assert [e.key for e in store.load("r")] == ["a"]
        assert store.insert_many("r", [("c", b"3")])[0].inserted
        assert [e.key for e in store.load("r")] == ["a", "c"]


@pytest.mark.postgres
def test_an_error_on_a_connection_lost_in_a_pipeline_is_reported_as_the_loss() -> None:
    """In a pipeline, a statement whose answer never came (its backend killed) can surface as the stale
    result of an earlier statement, a psycopg ProgrammingError; on a connection that broke it is reported
    as the lost connection it is (an OperationalError: retried by the event log, "may or may not have
    committed" in the store), while the same error on a live connection stays what it is."""
    import psycopg

    from bide._sql import lost_in_pipeline

    stale = psycopg.ProgrammingError("the last operation didn't produce records (command status: BEGIN)")
    plain = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain) as conn, psycopg.connect(plain, autocommit=True) as killer:
        assert lost_in_pipeline(conn, stale) is None
        pid = conn.info.backend_pid
        killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        assert conn.broken
        lost = lost_in_pipeline(conn, stale)
        assert isinstance(lost, psycopg.OperationalError) and "connection to the server was lost" in str(lost)
        assert lost_in_pipeline(conn, psycopg.OperationalError("already the loss")) is None
        assert lost_in_pipeline(conn, ValueError("not the driver's")) is None


def test_short_lived_threads_do_not_keep_their_connections(tmp_path: Path) -> None:
    """Each thread that drives runs on a SQLite store gets a connection of its own. One per thread that
    ever called `run_sync` stayed open until the store was closed (two file descriptors each: an app with
    a thread per request reached "too many open files" after about 500 requests at the usual limit of
    1,024); a thread's connection is now closed once the thread has ended and another one comes."""
    store = bide.open_store(f"sqlite:///{tmp_path / 'threads.db'}")
    answers: list[str] = []

    def one_request(i: int) -> None:
        agent = bide.Agent(ScriptedModel([reply(f"hi {i}")]), store=store)
        answers.append(agent.run_sync(f"t{i}", "hi").answer)

    try:
        before = len(os.listdir("/proc/self/fd"))
        for i in range(300):
            thread = threading.Thread(target=one_request, args=(i,))
            thread.start()
            thread.join()
        assert len(os.listdir("/proc/self/fd")) - before < 10
    finally:
        store.close()
    assert answers == [f"hi {i}" for i in range(300)]


@pytest.mark.postgres
def test_a_postgresql_table_prefix_with_capitals_is_refused_before_anything_is_made() -> None:
    """`App_` passed the check (letters, digits, underscores): the tables were made under their quoted
    names, and every statement, naming them unquoted, looked for `app_records` ("relation does not
    exist"), leaving the empty tables behind."""
    with pytest.raises(bide.ConfigError, match=r"must be lower case .* use 'app_'"):
        bide.open_store(POSTGRES_URL, table_prefix="App_")
    engine = sa.create_engine(POSTGRES_URL)
    try:
        with engine.connect() as conn:
            made = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_tables WHERE left(tablename, 4) = %(prefix)s", {"prefix": "App_"}
            ).scalar()
    finally:
        engine.dispose()
    assert made == 0


def test_each_request_of_a_batch_that_waited_out_a_lock_is_told_its_own_run(tmp_path: Path) -> None:
    """A batch whose every try met a lock held past the busy timeout answered each of its requests with one
    error, which named the batch's first run: a worker's report said run g4 failed on "run 'g3'"."""
    path = tmp_path / "locked.db"
    store = SQLStore(f"sqlite:///{path}", busy_timeout=0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")

    async def main() -> list[BaseException | list[Entry]]:
        runs = ["g1", "g2", "g3", "g4"]
        writes = [store.ainsert_many(run, [("k", b"{}")]) for run in runs]
        return await asyncio.gather(*writes, return_exceptions=True)

    try:
        answers = asyncio.run(main())
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        store.close()
    for run, answer in zip(["g1", "g2", "g3", "g4"], answers, strict=True):
        assert isinstance(answer, StoreError), answer
        named = [r for r in ("g1", "g2", "g3", "g4") if f"run {r!r}" in str(answer)]
        assert named == [run], str(answer)
