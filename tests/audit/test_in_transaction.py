"""The audit tree advances in the transaction that writes the journal records it covers (write hooks)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import bide
import bide.audit._hashes
from bide._store import Entry, HookedStore, WriteTransaction
from bide.audit import AuditedStore, AuditLog, DirectoryPublisher, MerkleTree, SigningKey, journal_leaf
from bide.audit._hashes import backend_for

from .conftest import write_run


def _reference_root(store: bide.Store, run_id: str) -> bytes:
    return MerkleTree(journal_leaf(e.data) for e in store.load(run_id)).root()


def _snapshot(store: bide.Store, run_id: str) -> tuple[int, int]:
    """(journal records, tree size) of one run read in ONE database snapshot (for the memory store: the
    backend's state without syncing)."""
    if isinstance(store, bide.MemoryStore):
        with store._lock:  # the memory store's "transaction": hooks run under this lock
            return len(store._order.get(run_id, [])), backend_for(store).state(run_id)[0]
    p = store.table_prefix  # type: ignore[attr-defined]
    raw = store.engine.raw_connection()  # type: ignore[attr-defined]
    try:
        cur = raw.cursor()
        if store.engine.dialect.name == "sqlite":  # type: ignore[attr-defined]
            q = "?"
            cur.execute("BEGIN")
        else:
            q = "%s"
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute(f"SELECT count(*) FROM {p}records WHERE run_id = {q}", (run_id,))
        count = int(cur.fetchone()[0])
        cur.execute(f"SELECT size FROM {p}audit_tile_trees WHERE run_id = {q}", (run_id,))
        row = cur.fetchone()
        cur.close()
        raw.rollback()
    finally:
        raw.close()
    return count, 0 if row is None else int(row[0])


def test_tree_and_journal_commit_together(store: bide.Store) -> None:
    assert isinstance(store, HookedStore)
    write_run(store, "early", 3)  # written before auditing: the first audited append catches up
    audited = AuditedStore(store)
    assert audited.in_transaction
    assert _snapshot(store, "early") == (5, 0)
    for i in range(140):  # across a level-0 tile boundary (128 hashes)
        audited.insert_many("early", [(f"k{i}", b"record %d" % i), (f"j{i}", b"more %d" % i)][: 1 + i % 2])
        count, size = _snapshot(store, "early")
        assert size == count
    assert audited.errors == []
    log = AuditLog(store)
    assert log.root("early") == _reference_root(store, "early")
    # an insert that writes nothing leaves the tree as it is
    assert not audited.insert_many("early", [("k0", b"record 0")])[0].inserted
    assert _snapshot(store, "early") == (count, count)


def test_readers_never_see_the_journal_ahead_of_the_tree(store: bide.Store) -> None:
    audited = AuditedStore(store)
    stop = threading.Event()
    seen: list[tuple[int, int]] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(_snapshot(store, "r"))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(150):
            audited.insert_many("r", [(f"k{i}", b"x" * (i % 7))])
    finally:
        stop.set()
        reader.join()
    assert seen and all(count == size for count, size in seen)
    assert _snapshot(store, "r") == (150, 150)


def test_a_failing_hook_never_fails_the_append_and_the_tree_catches_up(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    audited = AuditedStore(store)
    audited.insert_many("r", [("a", b"1"), ("b", b"2")])
    hashes = backend_for(store)
    real = hashes.absorb
    failing = [True]
    undoable = not isinstance(store, bide.MemoryStore)  # the memory store cannot undo a hook's writes

    def absorb(txn: WriteTransaction, run_id: str, entries: Sequence[Entry]) -> bool:
        if failing[0] and not undoable:
            raise RuntimeError("hook broke")
        done = real(txn, run_id, entries)  # SQL: writes its rows in the hook's savepoint, then fails
        if failing[0]:
            raise RuntimeError("hook broke")
        return done

    monkeypatch.setattr(hashes, "absorb", absorb)
    out = audited.insert_many("r", [("c", b"3")])
    assert out[0].inserted and store.get("r", "c") is not None
    assert [str(e) for e in audited.errors] == ["hook broke"]
    # the hook's writes were undone, the journal's were not, and the wrapper synced after the commit
    assert _snapshot(store, "r") == (3, 3)
    assert AuditLog(store).root("r") == _reference_root(store, "r")
    # a plain AuditLog hook (no wrapper to sync after it): the next append's hook catches up
    assert isinstance(store, HookedStore)
    store.remove_write_hook(audited.log.absorb)
    log = AuditLog(store)
    store.add_write_hook(log.absorb, on_error=lambda exc: None)
    store.insert_many("r", [("d", b"4")])
    assert _snapshot(store, "r") == (4, 3)
    failing[0] = False
    store.insert_many("r", [("e", b"5")])
    assert _snapshot(store, "r") == (5, 5)
    assert AuditLog(store).root("r") == _reference_root(store, "r")
    # ... or a sync does
    failing[0] = True
    store.insert_many("r", [("f", b"6")])
    assert _snapshot(store, "r") == (6, 5)
    assert AuditLog(store).sync("r") == 6
    assert AuditLog(store).root("r") == _reference_root(store, "r")
    store.remove_write_hook(log.absorb)


def test_a_failing_hooks_writes_are_undone_and_the_others_kept(store: bide.Store) -> None:
    assert isinstance(store, HookedStore)
    AuditLog(store).sync("r")  # creates the audit tables
    marks: list[str] = []

    def mark(name: str, fail: bool) -> Any:
        def hook(txn: WriteTransaction, written: Mapping[str, Sequence[Entry]]) -> None:
            if txn.cursor is not None:
                p, q = store.table_prefix, "?" if txn.dialect == "sqlite" else "%s"  # type: ignore[attr-defined]
                txn.cursor.execute(
                    f"INSERT INTO {p}audit_tile_trees (run_id, size, last_seq) VALUES ({q}, 0, 0)", (name,)
                )
            txn.on_commit(lambda: marks.append(f"{name} committed"))
            txn.on_rollback(lambda: marks.append(f"{name} undone"))
            if fail:
                raise RuntimeError(name)

        return hook

    bad, good = mark("bad", True), mark("good", False)
    store.add_write_hook(bad)
    store.add_write_hook(good)
    store.insert_many("r", [("a", b"1")])
    store.remove_write_hook(bad)
    store.remove_write_hook(good)
    assert [e.key for e in store.load("r")] == ["a"]
    assert [str(e) for e in store.hook_errors] == ["bad"]
    assert marks == ["bad undone", "good committed"]
    if isinstance(store, bide.SQLStore):
        with store.engine.connect() as conn:
            names = conn.exec_driver_sql(
                f"SELECT run_id FROM {store.table_prefix}audit_tile_trees ORDER BY run_id"
            ).scalars().all()
        assert names == ["good"]


def test_a_hook_that_breaks_its_savepoint_costs_no_write(store: bide.Store) -> None:
    assert isinstance(store, HookedStore)
    audited = AuditedStore(store)
    audited.insert_many("r", [("a", b"1")])

    def rogue(txn: WriteTransaction, written: Mapping[str, Sequence[Entry]]) -> None:
        if txn.cursor is not None:
            txn.cursor.execute("RELEASE SAVEPOINT bide_hook")  # the store cannot roll this hook back
        raise RuntimeError("rogue")

    store.add_write_hook(rogue)
    out = audited.insert_many("r", [("b", b"2")])
    store.remove_write_hook(rogue)
    assert [(e.key, e.inserted) for e in out] == [("b", True)]
    assert [str(e) for e in store.hook_errors] == ["rogue"]
    assert audited.errors == [] and _snapshot(store, "r") == (2, 2)  # retried without hooks, then synced
    assert AuditLog(store).root("r") == _reference_root(store, "r")


def test_a_tree_far_behind_is_left_to_the_sync_after_the_commit(
    store: bide.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bide.audit._hashes, "CATCH_UP", 5)
    write_run(store, "old", 10)  # 12 records before auditing
    audited = AuditedStore(store)
    syncs: list[str] = []
    sync = audited.log.sync

    def counted(run_id: str) -> int:
        syncs.append(run_id)
        return sync(run_id)

    monkeypatch.setattr(audited.log, "sync", counted)
    audited.insert_many("old", [("x", b"1")])  # the hook declines; the wrapper syncs after the commit
    assert syncs == ["old"]
    assert _snapshot(store, "old") == (13, 13)
    assert audited.errors == [] and "old" not in audited.log._behind
    audited.insert_many("old", [("y", b"2")])  # in the transaction again, no sync
    assert syncs == ["old"]
    assert _snapshot(store, "old") == (14, 14)
    assert AuditLog(store).root("old") == _reference_root(store, "old")


def test_hook_errors_go_to_on_error_or_are_kept(store: bide.Store) -> None:
    assert isinstance(store, HookedStore)
    got: list[Exception] = []

    def broken(txn: WriteTransaction, written: Mapping[str, Sequence[Entry]]) -> None:
        raise ValueError("no")

    store.add_write_hook(broken, on_error=got.append)
    store.insert_many("r", [("a", b"1")])
    assert [str(e) for e in got] == ["no"] and store.hook_errors == []
    store.remove_write_hook(broken)
    store.add_write_hook(broken)
    store.insert_many("r", [("b", b"2")])
    assert [str(e) for e in store.hook_errors] == ["no"] and len(got) == 1
    store.remove_write_hook(broken)
    store.insert_many("r", [("c", b"3")])
    assert len(store.hook_errors) == 1
    assert [e.key for e in store.load("r")] == ["a", "b", "c"]


def test_hooks_see_what_the_transaction_wrote_and_commit_callbacks_follow(store: bide.Store) -> None:
    assert isinstance(store, HookedStore)
    calls: list[dict[str, list[tuple[str, bool]]]] = []
    committed: list[int] = []

    def hook(txn: WriteTransaction, written: Mapping[str, Sequence[Entry]]) -> None:
        calls.append({r: [(e.key, e.inserted) for e in es] for r, es in written.items()})
        for run_id, entries in written.items():
            # the transaction's own view includes the records it inserted, in seq order
            assert [e.key for e in txn.load(run_id)][-len(entries) :] == [e.key for e in entries]
        txn.on_commit(lambda: committed.append(len(calls)))

    store.add_write_hook(hook)
    store.insert_many("r", [("a", b"1"), ("b", b"2")])
    store.insert_many("r", [("a", b"1"), ("c", b"3")])  # "a" exists: only "c" is reported
    store.insert_many("r", [("a", b"1")])  # nothing written: no hook call
    store.insert_many("r", [("c", b"3"), ("d", b"4")], exclusive=True)  # refused: nothing written
    assert calls == [{"r": [("a", True), ("b", True)]}, {"r": [("c", True)]}]
    assert committed == [1, 2]
    store.remove_write_hook(hook)


@pytest.mark.parametrize("runs", [1, 40])
def test_group_committed_appends_of_many_runs_each_advance_their_tree(
    store: bide.Store, runs: int
) -> None:
    audited = AuditedStore(store)
    batches: list[list[str]] = []

    def spy(txn: WriteTransaction, written: Mapping[str, Sequence[Entry]]) -> None:
        batches.append(sorted(written))

    assert isinstance(store, HookedStore)
    store.add_write_hook(spy)

    async def main() -> None:
        for step in range(3):
            await asyncio.gather(
                *[audited.ainsert_many(f"run{j}", [(f"k{step}", b"%d" % j)]) for j in range(runs)]
            )

    asyncio.run(main())
    assert audited.errors == []
    for j in range(runs):
        assert _snapshot(store, f"run{j}") == (3, 3)
        assert AuditLog(store).root(f"run{j}") == _reference_root(store, f"run{j}")
    if isinstance(store, bide.SQLStore) and store.dialect == "sqlite" and runs > 1:
        # async appends made together share one transaction, and each run's tree advanced in it
        assert max(len(b) for b in batches) == runs
    store.remove_write_hook(spy)


def test_anchoring_still_follows_each_committed_append(
    store: bide.Store, log_key: SigningKey, tmp_path: Any
) -> None:
    (tmp_path / "anchor").mkdir()
    anchor = DirectoryPublisher(tmp_path / "anchor")
    audited = AuditedStore(store, AuditLog(store, log_key, anchor))
    assert audited.in_transaction
    for i in range(3):
        audited.insert_many("r", [(f"k{i}", b"%d" % i)])

    async def one_more() -> None:
        await audited.ainsert_many("r", [("k3", b"3")])

    asyncio.run(one_more())
    assert audited.errors == []
    sizes = sorted(int(f.name.split("-")[0]) for f in (tmp_path / "anchor").rglob("*.json"))
    assert sizes == [1, 2, 3, 4]


def test_closing_the_wrapper_unregisters_its_hook(tmp_path: Any) -> None:
    class KeptOpen(bide.MemoryStore):
        def close(self) -> None:  # the test writes to the inner store after the wrapper's close
            pass

    inner = KeptOpen()
    audited = AuditedStore(inner)
    audited.insert_many("r", [("a", b"1")])
    audited.close()
    inner.insert_many("r", [("b", b"2")])
    assert backend_for(inner).state("r")[0] == 1


def test_a_long_lived_audited_store_does_not_keep_memory_per_run(tmp_path: Any) -> None:
    """A process appending to ever more runs: what the audit tree keeps per run (the right edge of each
    run's tree, a lock per run) is bounded, not kept for the life of the process (about 1 KB per run was:
    1 MB more for 1,200 more runs, 115 MB after 100,000)."""
    import gc
    import tracemalloc

    store = AuditedStore(bide.open_store(f"sqlite:///{tmp_path / 'a.db'}"))

    def runs(first: int, last: int) -> None:
        for i in range(first, last):
            store.insert_many(f"run-{i}", [("a", b"x" * 50), ("b", b"y" * 50)])

    tracemalloc.start()
    try:
        runs(0, 1500)  # past the number of runs whose edges are kept
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        runs(1500, 3000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    try:
        assert grown < 500_000, f"{grown:,} bytes more for 1,500 more runs"
        store.insert_many("run-0", [("c", b"z")])  # its edges were dropped long ago: read again
        assert store.log.root("run-0") == _reference_root(store.inner, "run-0")
        assert store.log.size("run-0") == 3
    finally:
        store.close()


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE bide_audit_tiles SET hashes = 'abc' WHERE level = 0 AND tile = 0",
        "UPDATE bide_audit_tile_trees SET size = -1",
        "UPDATE bide_audit_tile_trees SET size = 'abc'",
    ],
    ids=["a tile of text", "a negative size", "a size of text"],
)
def test_audit_tables_edited_by_hand_are_a_store_error_to_the_journals_writes(
    tmp_path: Path, edit: str
) -> None:
    """The hook that advances the tree in the write's transaction met a tile of text or a size that is no
    number with a TypeError, KeyError or ValueError: to an `on_error` that sorts by `StoreError`, a bug. The
    write commits (the tree is a cache of the journal), and the hook's error is `AuditTablesDamaged`."""
    import sqlite3

    from bide.audit._hashes import AuditTablesDamaged

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url)
    audited = AuditedStore(store, AuditLog(store))
    write_run(audited, "r", 20)
    audited.close()
    with sqlite3.connect(tmp_path / "runs.db") as db:
        db.execute(edit)
    store = bide.open_store(url)
    audited = AuditedStore(store, AuditLog(store))
    try:
        bide.Journal(audited, "r").load().write([bide.GateRecord(key="approval:late", data={})])
        errors = list(audited.errors)
        assert errors and all(isinstance(e, AuditTablesDamaged) for e in errors), errors
        assert store.get("r", "approval:late") is not None
    finally:
        audited.close()
