"""The audit log keeps one connection of a SQL store's pool out of it between calls, for its hash tables.
Closing the store disposed its engine, which closes only the connections checked in: the audit log's stayed
open, a PostgreSQL session per closed store for as long as the process lived (a long-running service that
opened and closed audited stores ran the server out of connections; the test suite nearly did). Closing
the store now ends that session too, and a forked child leaves its parent's untouched."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
from held import pg_sessions
from pg_tables import drop_prefixed_tables

import bide
from bide.audit import AuditedStore, AuditLog, SigningKey

from .conftest import POSTGRES_URL, write_run

pytestmark = pytest.mark.postgres

def sessions_after(application: str, wait: float = 3.0) -> int:
    """The sessions still open under `application` once they had `wait` seconds to end."""
    give_up = time.monotonic() + wait
    while (left := pg_sessions(POSTGRES_URL, application)) and time.monotonic() < give_up:
        time.sleep(0.05)
    return left


@pytest.fixture
def prefix() -> Iterator[str]:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    yield prefix
    drop_prefixed_tables(POSTGRES_URL, prefix)


@pytest.mark.parametrize("how", ["AuditLog", "AuditedStore"])
def test_closing_a_store_ends_the_audit_logs_session(prefix: str, how: str) -> None:
    application = f"bide-audit-{uuid.uuid4().hex[:8]}"
    for _ in range(3):  # a service that opens and closes its store: nothing accumulates
        store = bide.open_store(f"{POSTGRES_URL}?application_name={application}", table_prefix=prefix)
        log = AuditLog(store, SigningKey.generate())
        if how == "AuditedStore":
            store = AuditedStore(store, log)
        write_run(store, "r1", 3)
        assert log.sync("r1") > 0 and log.sign_head("r1", publish=False).size > 0  # hash tables used
        assert pg_sessions(POSTGRES_URL, application) >= 1
        store.close()
        assert sessions_after(application) == 0, "a session of the closed store is still open"


def test_a_forked_child_leaves_the_parents_hash_session_to_the_parent(prefix: str) -> None:
    application = f"bide-audit-{uuid.uuid4().hex[:8]}"
    store = bide.open_store(f"{POSTGRES_URL}?application_name={application}", table_prefix=prefix)
    log = AuditLog(store, SigningKey.generate())
    try:
        write_run(store, "r1", 3)
        root = log.root("r1")
        pid = os.fork()
        if pid == 0:  # the child reads through connections of its own, then closes its copy of the store
            code = 1
            try:
                child_log = AuditLog(store)
                if child_log.root("r1") == root:
                    store.close()
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's session lived through the child's close: its next reads and writes still work.
        bide.Journal(store, "r1").load().write([bide.GateRecord(key="approval:note:after", data={})])
        size = log.sync("r1")
        assert size == len(store.load("r1")) and log.check_journal("r1") == size and log.root("r1") != root
    finally:
        store.close()
    assert sessions_after(application) == 0
