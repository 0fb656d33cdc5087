"""Fixtures for the bide runtime tests: one `store_url` per store kind (memory, SQLite, PostgreSQL),
`serve` (a `LoopbackServer` answering as the test says) and `raw_server` for the hostile-model tests."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from halting import Said
from mounts import tmpfs
from raw_http import RawServer, StartServer

import bide
from bide.testing import LoopbackServer, Received, Reply

PG_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def drop_prefix(url: str, prefix: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in ("records", "runs"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {prefix}{table}")
    engine.dispose()


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(url, table_prefix) of a fresh, empty store of each kind."""
    kind = request.param
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    if kind == "memory":
        yield "memory://", prefix
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'bide.db'}", prefix
    else:
        yield PG_URL, prefix
        drop_prefix(PG_URL, prefix)


@pytest.fixture
def store(store_spec: tuple[str, str]) -> Iterator[bide.Store]:
    url, prefix = store_spec
    s = bide.open_store(url, table_prefix=prefix)
    yield s
    s.close()


@pytest.fixture
def journal_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[bide.Store], list[str]]:
    """Call it with a store: from then on, the run ids of the store's journal reads (`aload`), in order (how
    the worker tests tell a run read again from one left parked)."""

    def counting(store: bide.Store) -> list[str]:
        reads: list[str] = []
        load = store.aload

        def counted(run_id: str, after: int = 0) -> Any:
            reads.append(run_id)
            return load(run_id, after)

        monkeypatch.setattr(store, "aload", counted)
        return reads

    return counting


@pytest.fixture
def pg_prefix() -> Iterator[str]:
    """A fresh table prefix for a test on the PostgreSQL server; its tables are dropped afterwards."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    yield prefix
    drop_prefix(PG_URL, prefix)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def durable_store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(url, table_prefix) of a fresh durable store shared by several processes."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}", prefix
    else:
        yield PG_URL, prefix
        drop_prefix(PG_URL, prefix)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def tagged_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(url, table prefix, tag) of a fresh durable store that this test's store objects alone use: on
    PostgreSQL its sessions carry the tag as application_name (tests/held.py counts them), and either URL
    names this test's store alone (in warnings, in thread names)."""
    tag = f"tagged-{uuid.uuid4().hex[:8]}"
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / tag}.db", prefix, tag
    else:
        yield f"{PG_URL}?application_name={tag}", prefix, tag
        drop_prefix(PG_URL, prefix)


@pytest.fixture
def raw_server() -> Iterator[StartServer]:
    servers: list[RawServer] = []

    def start(answer: Callable[[socket.socket], None]) -> RawServer:
        servers.append(RawServer(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start `LoopbackServer`s answering with a function of each request; closed after the test."""
    servers: list[LoopbackServer] = []

    def start(respond: Callable[[Received], Reply]) -> LoopbackServer:
        servers.append(LoopbackServer(respond))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs mounted for the test (the tests run as root), unmounted afterwards."""
    with tmpfs(tmp_path / "volume", "4m") as path:
        yield path


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a 1 MiB tmpfs mounted for the test (the tests run as root), unmounted afterwards."""
    with tmpfs(tmp_path / "disk", "1m") as path:
        yield path


@pytest.fixture
def said() -> Iterator[Said]:
    """The lines the worker logs while the test runs (a `Said` on the "bide.worker" logger)."""
    handler = Said()
    logging.getLogger("bide.worker").addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger("bide.worker").removeHandler(handler)
