"""Real stores for the approval tests: SQLite files, and PostgreSQL under a table prefix of the test's own."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pg_tables import drop_prefixed_tables

import bide

POSTGRES_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@dataclass
class RealStore:
    """An open store and the `--store`/`--table-prefix` arguments that name it to the command line."""

    store: bide.Store
    cli: list[str]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def real_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], RealStore]]:
    """`real_store(name)`: a fresh store of the parametrized kind; each name is another store."""
    opened: list[tuple[bide.Store, str]] = []

    def make(name: str) -> RealStore:
        prefix = f"t{uuid.uuid4().hex[:10]}_"
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / f'{name}.db'}"
            store = bide.open_store(url)
            cli = ["--store", url]
        else:
            store = bide.open_store(POSTGRES_URL, table_prefix=prefix)
            cli = ["--store", POSTGRES_URL, "--table-prefix", prefix]
        opened.append((store, prefix))
        return RealStore(store, cli)

    yield make
    for store, prefix in opened:
        store.close()
        if request.param == "postgres":
            drop_prefixed_tables(POSTGRES_URL, prefix)
