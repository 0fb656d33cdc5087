"""The audit log's hash tables live in the store, read and written through a connection of their own. A
failure there (a write lock held past the busy timeout, a connection the server ended) escaped as the
driver's own exception, which `bide-audit export` reported as an internal error (exit 3, "a bug"). It is
the store failing: a `bide.StoreError` (exit 6) that says what happened, and the next try succeeds.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from pg_tables import drop_prefixed_tables

import bide
from bide.audit import AuditLog
from bide.audit._cli import main as audit_main

from .conftest import POSTGRES_URL, write_run


def test_a_hash_table_locked_past_the_busy_timeout_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    store = bide.SQLStore(f"sqlite:///{path}", busy_timeout=0.3)
    try:
        write_run(store, "r", 2)
        log = AuditLog(store)
        assert log.sync("r") == 4  # the tables exist; the tree holds the run so far
        write_run(store, "s", 1)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # a driver stopped inside its write transaction
        try:
            with pytest.raises(bide.StoreError, match="stayed locked by another connection") as failed:
                log.sync("s")
            assert "hash tables" in str(failed.value)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert log.sync("s") == 3  # the next try goes on
    finally:
        store.close()


def test_the_export_command_says_the_store_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through `bide-audit export` (in process, with a store whose busy timeout is short): exit 6."""
    path = tmp_path / "audit.db"
    store = bide.SQLStore(f"sqlite:///{path}", busy_timeout=0.3)
    try:
        write_run(store, "r", 1)
        AuditLog(store).sync("r")
        later = bide.GateRecord(key="approval:note:later", data={})
        bide.Journal(store, "r").load().write([later])  # the tree is behind: the export writes hashes
    finally:
        store.close()
    assert audit_main(["keygen", str(tmp_path / "log.key")]) == 0
    original = bide.SQLStore.__init__

    def short(self: bide.SQLStore, url: str, **options: object) -> None:
        original(self, url, **{**options, "busy_timeout": 0.3})  # type: ignore[arg-type]

    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(bide.SQLStore, "__init__", short)
            out, key = str(tmp_path / "h.json"), str(tmp_path / "log.key")
            code = audit_main(["export", "--store", f"sqlite:///{path}", "--run", "r", "--head", "-o", out,
                               "--key", key])  # fmt: skip
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    said = capsys.readouterr().err
    assert code == 6 and "the store failed" in said and "INTERNAL" not in said, said
    assert not (tmp_path / "h.json").exists()


@pytest.mark.postgres
def test_a_hash_connection_the_server_ended_is_a_store_error_and_the_next_read_goes_on() -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    store = bide.open_store(POSTGRES_URL, table_prefix=prefix)
    engine = sa.create_engine(POSTGRES_URL)
    try:
        write_run(store, "r", 3)
        log = AuditLog(store)
        root = log.root("r")
        pid = log._hashes._conn.driver_connection.info.backend_pid  # type: ignore[attr-defined]
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_terminate_backend(%(pid)s)", {"pid": pid})
        with pytest.raises(bide.StoreError, match="could not read its hash tables"):
            log.root("r")
        assert log.root("r") == root
    finally:
        drop_prefixed_tables(engine, prefix)
        engine.dispose()
        store.close()
