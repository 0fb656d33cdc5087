from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_tables import drop_prefixed_tables

import bide
from bide.audit import SigningKey

POSTGRES_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def write_run(store: bide.Store, run_id: str, n: int) -> None:
    """A run with a header, a start record and n gate records (real journal records, salted)."""
    journal = bide.Journal(store, run_id).load()
    journal.write([bide.Start(key="run:start", entry="agent:test", input="go")])
    for i in range(n):
        journal.write([bide.GateRecord(key=f"approval:note:{i}", data={"i": i})])


@pytest.fixture
def log_key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[bide.Store]:
    if request.param == "memory":
        s: bide.Store = bide.MemoryStore()
    elif request.param == "sqlite":
        s = bide.open_store(f"sqlite:///{tmp_path / 'audit.db'}")
    else:
        prefix = f"t{uuid.uuid4().hex[:10]}_"
        s = bide.open_store(POSTGRES_URL, table_prefix=prefix)
    try:
        yield s
    finally:
        if request.param == "postgres":
            drop_prefixed_tables(s.engine, prefix)  # type: ignore[attr-defined]
        s.close()
