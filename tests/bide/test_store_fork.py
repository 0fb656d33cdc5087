"""A SQL store opened in a parent and used after os.fork() (gunicorn --preload, multiprocessing with the fork
start method): every child writes, leases and loads through the store it inherited, as if it had opened it
itself, and the parent's keeps working."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from forked import fork, wait_all

import bide

CHILDREN, EACH, SHARED = 3, 30, 10


def child_work(store: bide.Store, k: int, acks: Path) -> Callable[[], None]:
    """A child's use of the inherited store: a lease on a run of its own, fenced writes (blocking and
    async), inserts racing the other children on a shared run, loads, a get, listings, the release. Each
    answer is checked, and every record the child was told about goes to `acks` as `run key seq data`."""

    def work() -> None:
        run, holder = f"c{k}", f"holder-{k}"
        lease = store.lease(run, holder, now_ms=int(time.time() * 1000), ttl_ms=60_000)
        assert lease.held, lease
        fence = (holder, lease.token)
        acked: list[str] = []
        for i in range(EACH):
            data = f"{run}-{i}".encode()
            [entry] = store.insert_many(run, [(f"r{i}", data)], fence=fence)
            assert entry.inserted and entry.key == f"r{i}" and entry.data == data, entry
            acked.append(f"{run} r{i} {entry.seq} {data.decode()}\n")
        for i in range(SHARED):  # every child inserts these keys: one wins, each is told the winner's bytes
            [entry] = store.insert_many("shared", [(f"s{i}", f"from-{k}".encode())])
            acked.append(f"shared s{i} {entry.seq} {entry.data.decode()}\n")

        async def in_loop() -> None:
            writes = [
                store.ainsert_many(run, [(f"a{i}", f"{run}-a{i}".encode())], fence=fence) for i in range(EACH)
            ]
            for i, [entry] in enumerate(await asyncio.gather(*writes)):
                assert entry.inserted and entry.key == f"a{i}", entry
                acked.append(f"{run} a{i} {entry.seq} {run}-a{i}\n")
            loaded = await store.aload(run)
            assert [e.key for e in loaded] == [f"r{i}" for i in range(EACH)] + [f"a{i}" for i in range(EACH)]

        asyncio.run(in_loop())
        got = store.get(run, "r0")
        assert got is not None and got.data == f"{run}-0".encode(), got
        loaded = store.load(run)
        assert [e.seq for e in loaded] == sorted(e.seq for e in loaded)
        assert run in store.runs(prefix="c", limit=100)
        assert store.release(run, holder, lease.token)
        assert run in [e.run_id for e in store.expired_leases(now_ms=int(time.time() * 1000))]
        acks.write_text("".join(acked))

    return work


def check_stored(url: str, prefix: str, acks: list[Path], parent_keys: list[str]) -> None:
    """Every record is in the store once, at the seq its writer was told, with the bytes it was told;
    read through a store opened afresh."""
    fresh = bide.open_store(url, table_prefix=prefix)
    try:
        stored: dict[tuple[str, str], tuple[int, bytes]] = {}
        for run in [*(f"c{k}" for k in range(CHILDREN)), "shared", "parent"]:
            entries = fresh.load(run)
            assert [e.seq for e in entries] == sorted({e.seq for e in entries}), run
            keys = [e.key for e in entries]
            assert len(keys) == len(set(keys)), run
            stored.update({(run, e.key): (e.seq, e.data) for e in entries})
        for k in range(CHILDREN):
            mine = {key for run, key in stored if run == f"c{k}"}
            assert mine == {f"r{i}" for i in range(EACH)} | {f"a{i}" for i in range(EACH)}
        assert {key for run, key in stored if run == "shared"} == {f"s{i}" for i in range(SHARED)}
        assert {key for run, key in stored if run == "parent"} == set(parent_keys)
        for path in acks:
            for line in path.read_text().splitlines():
                run, key, seq, data = line.split()
                assert stored[(run, key)] == (int(seq), data.encode()), line
    finally:
        fresh.close()


@pytest.mark.parametrize("parent_use", ["sync", "async", "opened"])
def test_forked_children_use_the_inherited_store(
    durable_store_spec: tuple[str, str], parent_use: str, tmp_path: Path
) -> None:
    """Before, a child's first call waited for ever on the store's thread, which it does not have (a forked
    child copies the thread object and the queue, nothing answers them); a store only opened before the
    fork worked, but on PostgreSQL every child took the pooled connection left from the open, one session
    for all of them. Now each child serves its calls on a thread and connections of its own while the
    parent goes on using its store: every record is stored once, as its writer was told."""
    url, prefix = durable_store_spec
    store = bide.open_store(url, table_prefix=prefix)
    parent_keys: list[str] = []

    def parent_writes() -> None:
        key = f"p{len(parent_keys)}"
        [entry] = store.insert_many("parent", [(key, b"parent")])
        assert entry.inserted, entry
        parent_keys.append(key)

    if parent_use == "sync":
        parent_writes()
        assert store.load("parent")[0].key == "p0"
    elif parent_use == "async":

        async def in_loop() -> None:
            [entry] = await store.ainsert_many("parent", [("p0", b"parent")])
            assert entry.inserted
            assert [e.key for e in await store.aload("parent")] == ["p0"]

        asyncio.run(in_loop())
        parent_keys.append("p0")

    acks = [tmp_path / f"acks{k}" for k in range(CHILDREN)]
    errors = [tmp_path / f"errors{k}" for k in range(CHILDREN)]
    pids = [fork(child_work(store, k, acks[k]), errors[k]) for k in range(CHILDREN)]
    wait_all(pids, errors, parent_writes)  # the parent writes while the children do
    for _ in range(5):
        parent_writes()
    assert [e.key for e in store.load("parent")] == parent_keys
    check_stored(url, prefix, acks, parent_keys)
    store.close()


def test_children_forked_while_a_parent_thread_writes(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    """Before, children forked while a thread of the parent wrote through the store hung at their first
    call. With only the child's side fixed, a SQLite child forked in the middle of one of the parent's
    transactions inherited its locks (every write of its own was refused as locked) or a mutex SQLite held
    in that thread (its first connection waited for ever). Now a fork waits for the store's transaction
    under way: every child works, and so does the parent's thread, across every fork."""
    url, prefix = durable_store_spec
    store = bide.open_store(url, table_prefix=prefix)
    stop = threading.Event()
    parent_keys: list[str] = []
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            while not stop.is_set():
                key = f"p{len(parent_keys)}"
                [entry] = store.insert_many("parent", [(key, b"parent")])
                assert entry.inserted, entry
                parent_keys.append(key)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(parent_keys) < 3 and thread.is_alive():
            time.sleep(0.001)
        pids: list[int] = []
        errors = [tmp_path / f"errors{k}" for k in range(2 * CHILDREN)]
        acks = [tmp_path / f"acks{k}" for k in range(2 * CHILDREN)]

        def small(k: int) -> Callable[[], None]:
            def work() -> None:
                [entry] = store.insert_many(f"f{k}", [("only", b"child")])
                assert entry.inserted, entry
                assert [e.key for e in store.load(f"f{k}")] == ["only"]
                acks[k].write_text("ok")

            return work

        for k in range(2 * CHILDREN):
            pids.append(fork(small(k), errors[k]))
            time.sleep(0.005)  # forks at different moments of the parent's writes
        wait_all(pids, errors)
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    assert [e.key for e in store.load("parent")] == parent_keys
    fresh = bide.open_store(url, table_prefix=prefix)
    for k in range(2 * CHILDREN):
        assert [e.data for e in fresh.load(f"f{k}")] == [b"child"]
    fresh.close()
    store.close()


@pytest.mark.parametrize("parent_use", ["sync", "async"])
def test_sqlite_child_writes_on_after_the_parent_closed(parent_use: str, tmp_path: Path) -> None:
    """Before, a child used its copy of the parent's SQLite connection (an async caller's, on the thread
    that forked) or waited for ever (a blocking caller's): that copy holds none of the file's locks, so the
    parent's close found the file unused, checkpointed it and deleted its write-ahead log under the child,
    whose next write was refused (the log "was deleted"). Now the child closes its copies and writes on
    connections of its own, which hold their locks: it writes on after the parent closed, and every record
    is stored."""
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    if parent_use == "sync":
        store.insert_many("parent", [("p0", b"parent")])
    else:

        async def in_loop() -> None:
            await store.ainsert_many("parent", [("p0", b"parent")])

        asyncio.run(in_loop())
    to_parent_r, to_parent_w = os.pipe()
    to_child_r, to_child_w = os.pipe()

    def work() -> None:
        async def write(key: str) -> None:
            [entry] = await store.ainsert_many("child", [(key, b"child")])
            assert entry.inserted, entry

        asyncio.run(write("before"))
        store.insert_many("child", [("before-sync", b"child")])
        os.write(to_parent_w, b"1")
        assert os.read(to_child_r, 1) == b"1"  # the parent closed its store
        asyncio.run(write("after"))
        store.insert_many("child", [("after-sync", b"child")])
        store.close()

    errors = tmp_path / "errors"
    pid = fork(work, errors)
    os.close(to_parent_w)  # (so that a child that failed or hung before writing cannot stall the parent)
    os.close(to_child_r)
    ready = select.select([to_parent_r], [], [], 60)[0] and os.read(to_parent_r, 1)
    store.close()
    with contextlib.suppress(BrokenPipeError):  # a child that failed: wait_all reports it
        os.write(to_child_w, b"1")
    os.close(to_child_w)
    os.close(to_parent_r)
    wait_all([pid], [errors])
    assert ready == b"1"
    fresh = bide.open_store(url)
    assert [e.key for e in fresh.load("child")] == ["before", "before-sync", "after", "after-sync"]
    assert [e.key for e in fresh.load("parent")] == ["p0"]
    fresh.close()
