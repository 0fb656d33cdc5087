"""The store conformance suite (S1-S6 of bide._store), run against memory, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import bide
import bide.testing
from bide._journal import Journal
from bide._records import Start, encode_record


def test_insert_if_absent_returns_winner(store: bide.Store) -> None:
    first = store.insert_many("r", [("a", b"one"), ("b", b"two")])
    assert [e.inserted for e in first] == [True, True]
    again = store.insert_many("r", [("a", b"other"), ("c", b"three")])
    assert again[0].inserted is False and again[0].data == b"one" and again[0].seq == first[0].seq
    assert again[1].inserted is True
    assert [e.key for e in store.load("r")] == ["a", "b", "c"]
    got = store.get("r", "a")
    assert got is not None and got.data == b"one"
    assert store.get("r", "missing") is None
    assert store.get("other-run", "a") is None


def test_seq_increases_and_load_after(store: bide.Store) -> None:
    for i in range(10):
        store.insert_many("r", [(f"k{i}", b"x")])
    entries = store.load("r")
    seqs = [e.seq for e in entries]
    assert seqs == sorted(seqs) and len(set(seqs)) == 10
    tail = store.load("r", seqs[4])
    assert [e.key for e in tail] == [f"k{i}" for i in range(5, 10)]
    assert store.load("r", seqs[-1]) == []


def test_byte_fidelity(store: bide.Store) -> None:
    every_byte = bytes(range(256))
    invalid_utf8 = b"\xff\xfe\xc0\x80 not utf-8 \xed\xa0\x80"
    big = os.urandom(1 << 20)
    store.insert_many("bytes", [("all", every_byte), ("bad", invalid_utf8), ("big", big), ("empty", b"")])
    loaded = {e.key: e.data for e in store.load("bytes")}
    assert loaded == {"all": every_byte, "bad": invalid_utf8, "big": big, "empty": b""}


def test_caller_mutation_does_not_leak(store: bide.Store) -> None:
    buf = bytearray(b"original")
    store.insert_many("m", [("k", buf)])  # type: ignore[list-item]
    buf[:] = b"mutated!"
    got = store.get("m", "k")
    assert got is not None and got.data == b"original"


def test_runs_listing(store: bide.Store) -> None:
    for rid in ["b", "a", "tenant/x", "tenant/y", "c"]:
        store.insert_many(rid, [("k", b"v")])
    assert store.runs() == ["a", "b", "c", "tenant/x", "tenant/y"]
    assert store.runs(prefix="tenant/") == ["tenant/x", "tenant/y"]
    assert store.runs(after="b", limit=2) == ["c", "tenant/x"]


def test_runs_listing_of_runs_that_have_not_ended(store: bide.Store) -> None:
    """`open_only` leaves out the runs holding run:end, whatever wrote it and however many there are."""
    for rid in ["b", "a", "tenant/x", "tenant/y", "c"]:
        store.insert_many(rid, [("k", b"v")])
    store.insert_many("b", [("run:end", b"{}")])
    store.insert_many("tenant/x", [("k2", b"v"), ("run:end", b"{}")])
    assert store.runs(open_only=True) == ["a", "c", "tenant/y"]
    assert store.runs(prefix="tenant/", open_only=True) == ["tenant/y"]
    assert store.runs(after="a", limit=1, open_only=True) == ["c"]
    assert store.runs() == ["a", "b", "c", "tenant/x", "tenant/y"]  # all of them still, by default
    agent = bide.Agent(bide.testing.ScriptedModel([bide.testing.reply("done")]), store=store)
    agent.run_sync("d-completed", "go")
    assert "d-completed" in store.runs() and "d-completed" not in store.runs(open_only=True)


def test_bad_input_refused(store: bide.Store) -> None:
    with pytest.raises(bide.ConfigError):
        store.insert_many("", [("k", b"v")])
    with pytest.raises(bide.ConfigError):
        store.insert_many("r", [("", b"v")])
    with pytest.raises(bide.ConfigError):
        store.insert_many("r", [("k", "text")])  # type: ignore[list-item]
    with pytest.raises(bide.ConfigError, match="distinct"):
        store.insert_many("r", [("k", b"1"), ("k", b"2")])
    assert store.load("r") == []


def test_threads_one_winner_and_prefix_closed(store: bide.Store) -> None:
    """32 threads race for the same keys (one winner each, everyone sees its bytes), while pollers check
    that every load is a prefix of the final seq order."""
    keys = [f"k{i}" for i in range(20)]
    results: dict[int, list[bide.Entry]] = {}
    stop = threading.Event()
    snapshots: list[list[int]] = []

    def writer(n: int) -> None:
        out: list[bide.Entry] = []
        for k in keys:
            out.extend(store.insert_many("race", [(k, f"writer-{n}".encode())]))
        results[n] = out

    def poller() -> None:
        while not stop.is_set():
            snapshots.append([e.seq for e in store.load("race")])

    pollers = [threading.Thread(target=poller) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(n,)) for n in range(32)]
    for t in pollers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in pollers:
        t.join()
    final = store.load("race")
    final_seqs = [e.seq for e in final]
    winners = {e.key: e.data for e in final}
    for out in results.values():
        for e in out:
            assert e.data == winners[e.key]
    for k in keys:
        assert sum(1 for out in results.values() for e in out if e.key == k and e.inserted) == 1
    for snap in snapshots:
        assert snap == final_seqs[: len(snap)]


def test_async_api_matches(store: bide.Store) -> None:
    async def go() -> None:
        results = await asyncio.gather(
            *(store.ainsert_many("a", [("k", f"{i}".encode())]) for i in range(50))
        )
        assert sum(r[0].inserted for r in results) == 1
        assert len({r[0].data for r in results}) == 1
        more = await asyncio.gather(
            *(store.ainsert_many(f"run{i}", [("x", b"1"), ("y", b"2")]) for i in range(50))
        )
        assert all(e.inserted for r in more for e in r)
        assert [e.key for e in await store.aload("run7")] == ["x", "y"]
        got = await store.aget("run7", "y")
        assert got is not None and got.data == b"2"

    asyncio.run(go())


def test_journal_header_and_foreign_format(store: bide.Store) -> None:
    j = Journal(store, "j1").load()
    ((_rec, inserted),) = j.write([Start(key="run:start", entry="agent:x", input="hi")])
    assert inserted
    keys = [e.key for e in store.load("j1")]
    assert keys == ["@journal", "run:start"]
    header = json.loads(store.load("j1")[0].data)
    assert header["format"] == bide.JOURNAL_FORMAT and len(header["salt"]) == 44
    # A run written in another format is refused, and nothing is written to it.
    foreign = b'{"format":"bide.journal/0","key":"@journal","kind":"header","salt":"x"}'
    store.insert_many("old", [("@journal", foreign), ("run:start", b"{}")])
    with pytest.raises(bide.JournalFormatError):
        Journal(store, "old").load()
    store.insert_many(
        "headless", [("run:start", encode_record(Start(key="run:start", entry="e", input="i")))]
    )
    with pytest.raises(bide.JournalFormatError):
        Journal(store, "headless").load()
    agent = bide.Agent(bide.testing.ScriptedModel([]), store=store)
    with pytest.raises(bide.JournalFormatError):
        agent.run_sync("old", "hi")
    assert len(store.load("old")) == 2


def test_record_under_wrong_key_is_refused(store: bide.Store) -> None:
    j = Journal(store, "w").load()
    j.write([Start(key="run:start", entry="e", input="i")])
    store.insert_many("w", [("model:0", encode_record(Start(key="run:start", entry="e", input="i")))])
    with pytest.raises(bide.StoreError, match="corrupt"):
        Journal(store, "w").load()


_CONTENDER = r"""
import json, sys, time, os
import bide
import bide.testing
url, prefix, me, go = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
store = bide.open_store(url, table_prefix=prefix)
while not os.path.exists(go):
    time.sleep(0.001)
out = []
for i in range(25):
    for e in store.insert_many("contended", [(f"k{i}", me.encode()), (f"{me}-own-{i}", b"x")]):
        out.append([e.key, e.seq, e.data.decode(), e.inserted])
store.close()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_multiprocess_insert_if_absent(durable_store_spec: tuple[str, str], tmp_path: Path) -> None:
    """Six processes race on the same keys of one run: one winner per key, all agree, seq order holds."""
    url, prefix = durable_store_spec
    bide.open_store(url, table_prefix=prefix).close()  # create the schema once
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER, url, prefix, f"p{n}", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(6)
    ]
    time.sleep(0.5)
    go.write_text("go")
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outputs.append(json.loads(out))
    store = bide.open_store(url, table_prefix=prefix)
    try:
        final = store.load("contended")
    finally:
        store.close()
    winners = {e.key: (e.seq, e.data.decode()) for e in final}
    assert len(final) == 25 + 6 * 25
    for i in range(25):
        key = f"k{i}"
        seen = [(seq, data, ins) for out in outputs for k, seq, data, ins in out if k == key]
        assert len(seen) == 6
        assert {(seq, data) for seq, data, _ in seen} == {winners[key]}
        assert sum(ins for _, _, ins in seen) == 1
    seqs = [e.seq for e in final]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_exclusive_is_all_or_nothing(store: bide.Store) -> None:
    store.insert_many("x", [("a", b"1")])
    out = store.insert_many("x", [("b", b"2"), ("a", b"other"), ("c", b"3")], exclusive=True)
    assert [(e.key, e.data, e.inserted) for e in out] == [("a", b"1", False)]
    assert [e.key for e in store.load("x")] == ["a"]
    ok = store.insert_many("x", [("b", b"2"), ("c", b"3")], exclusive=True)
    assert [e.inserted for e in ok] == [True, True]
    assert [e.key for e in store.load("x")] == ["a", "b", "c"]
    seqs = [e.seq for e in store.load("x")]
    assert seqs == sorted(seqs)

    async def go() -> list[list[bide.Entry]]:
        return list(
            await asyncio.gather(
                *(
                    store.ainsert_many("y", [("t", f"{i}".encode()), (f"m{i}", b"x")], exclusive=True)
                    for i in range(20)
                )
            )
        )

    results = asyncio.run(go())
    winners = [r for r in results if len(r) == 2 and all(e.inserted for e in r)]
    assert len(winners) == 1
    assert sorted(e.key for e in store.load("y")) == sorted(["t", winners[0][1].key])


def test_sqlite_lock_held_by_another_process_does_not_block_the_event_loop(tmp_path: Path) -> None:
    """While another connection holds SQLite's write lock, async writers wait off the event loop (other
    tasks keep running) and finish once the lock is released."""
    import sqlite3

    path = tmp_path / "locked.db"
    store = bide.open_store(f"sqlite:///{path}")
    store.insert_many("warm", [("k", b"v")])
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    ticks: list[int] = []

    async def go() -> list[bide.Entry]:
        async def ticker() -> None:
            for i in range(1000):
                ticks.append(i)
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        write = asyncio.ensure_future(store.ainsert_many("r", [("a", b"1")]))
        while len(ticks) < 20:  # the loop keeps running while the write waits for the lock
            await asyncio.sleep(0.001)
        assert not write.done()
        other.execute("COMMIT")
        out = await write
        t.cancel()
        return out

    try:
        out = asyncio.run(go())
    finally:
        other.close()
        store.close()
    assert out[0].inserted and len(ticks) >= 20


def test_sqlite_store_survives_a_loop_closed_with_a_write_queued(tmp_path: Path) -> None:
    """An event loop that closes while a write is queued but not flushed must not wedge the store for the
    next loop on the same thread."""
    store = bide.open_store(f"sqlite:///{tmp_path / 'loops.db'}")
    assert isinstance(store, bide.SQLStore)

    async def abandon() -> None:
        # Queued by a callback that runs just before the loop stops, so the flush it schedules never runs.
        asyncio.get_running_loop().call_soon(store._asubmit, "r", "insert", ([("orphan", b"x")], False))

    loop = asyncio.new_event_loop()
    loop.run_until_complete(abandon())
    loop.close()
    assert store._local.scheduled  # the flush never ran

    async def write() -> list[bide.Entry]:
        return await asyncio.wait_for(store.ainsert_many("r", [("k", b"v")]), 10)

    assert asyncio.run(write())[0].inserted  # a later loop on the same thread is served
    store.close()
