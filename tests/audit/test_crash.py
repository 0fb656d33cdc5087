"""SIGKILL while the audit tree absorbs records: the tables are a cache of the journal, so whatever a kill
leaves, the next sync reaches exactly the reference root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bide
from bide.audit import AuditLog, MerkleTree, journal_leaf

pytestmark = pytest.mark.slow

WRITER = r"""
import sys
import bide
from bide.audit import AuditedStore, AuditLog
audited = sys.argv[2] == "audited"
store = AuditedStore(bide.open_store(sys.argv[1])) if audited else bide.open_store(sys.argv[1])
assert not audited or store.in_transaction
log = None if audited else AuditLog(store)
salt = b"A" * 43 + b"="
i = 0
print("ready", flush=True)
while True:
    keys = range(i, i + 1 + i % 97)
    batch = [(f"k{k}", b'{"key":"k%d","kind":"gate","salt":"%s"}' % (k, salt)) for k in keys]
    store.insert_many("run", batch)
    i += len(batch)
    if log is not None:  # not audited: the tree is synced after each commit
        log.sync("run")
"""


def kill_writer_after(tmp_path: Path, mode: str, delay: float) -> str:
    """Start the writer ("synced" or "audited") on a fresh SQLite store, SIGKILL it `delay` seconds after it
    is ready; returns the store URL."""
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), url, mode], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return url


def assert_sync_reaches_the_reference(store: bide.Store, entries: list[bide.Entry]) -> None:
    log = AuditLog(store)
    assert log.sync("run") == len(entries)
    reference = MerkleTree(journal_leaf(e.data) for e in entries)
    assert log.root("run") == reference.root()
    n = len(entries)
    for i in (0, n // 2, n - 1):
        assert log.inclusion("run", i, n) == reference.inclusion_proof(i)


@pytest.mark.parametrize("delay", [0.3, 0.8, 1.5])
def test_kill_during_sync_then_recover(tmp_path: Path, delay: float) -> None:
    store = bide.open_store(kill_writer_after(tmp_path, "synced", delay))
    try:
        entries = store.load("run")
        assert entries, "the writer wrote nothing before it was killed"
        assert_sync_reaches_the_reference(store, entries)
    finally:
        store.close()


@pytest.mark.parametrize("delay", [0.3, 0.8])
def test_kill_while_the_tree_advances_in_the_journal_transaction(tmp_path: Path, delay: float) -> None:
    store = bide.open_store(kill_writer_after(tmp_path, "audited", delay))
    try:
        entries = store.load("run")
        assert entries, "the writer wrote nothing before it was killed"
        # tree and journal committed together: whatever survived the kill, the stored tree covers exactly
        # the surviving records, before any sync
        with store.engine.connect() as conn:  # type: ignore[attr-defined]
            size, last_seq = conn.exec_driver_sql(
                "SELECT size, last_seq FROM bide_audit_tile_trees WHERE run_id = 'run'"
            ).one()
        assert (size, last_seq) == (len(entries), entries[-1].seq)
        assert_sync_reaches_the_reference(store, entries)
    finally:
        store.close()
