"""A table prefix too long for PostgreSQL's 63-byte names is refused when the store opens (ConfigError, the
CLI's exit 2), not met as an internal error when a table is created: the store's own tables at once, or the
audit log's, which `bide-audit export` creates under the same prefix months later. The longest prefix
allowed works end to end, and the names bide makes on the database are the ones the limit is derived from
(`bide._sql._PREFIXED_NAMES`), so a table added without being listed there fails here."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import PG_URL

import bide
from bide._sql import _PREFIXED_NAMES
from bide.audit._hashes import SQLHashes, backend_for
from bide.testing import ScriptedModel, reply

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]
LONGEST = 63 - len("audit_tile_trees")  # 47: the audit log's table has the longest name under the prefix
APP = """
import bide
from bide.testing import ScriptedModel, reply


def build(store):
    return [bide.Agent(ScriptedModel([reply("ok")]), store=store, name="a")]
"""


def _prefix(length: int) -> str:
    """A fresh lower-case prefix of `length` characters."""
    return f"t{uuid.uuid4().hex}".ljust(length - 1, "x")[: length - 1] + "_"


def _names_under(prefix: str) -> set[str]:
    """The relations (tables, indexes, sequences, views) and constraints on the server named with
    `prefix`, less the primary keys the server named itself (``<table>_pkey``, shortened by it to fit)."""
    engine = sa.create_engine(PG_URL)
    try:
        with engine.connect() as conn:
            pattern = prefix.replace("_", r"\_") + "%"
            relations = conn.exec_driver_sql(
                "SELECT relname FROM pg_catalog.pg_class WHERE relname LIKE %(p)s", {"p": pattern}
            ).scalars()
            constraints = conn.exec_driver_sql(
                "SELECT conname, contype FROM pg_catalog.pg_constraint WHERE conname LIKE %(p)s",
                {"p": pattern},
            ).all()
            names = set(relations) | {name for name, _ in constraints}
            server_named = {name for name, kind in constraints if kind == "p" and name.endswith("_pkey")}
    finally:
        engine.dispose()
    return names - server_named


@pytest.fixture
def prefixes() -> Iterator[list[str]]:
    """Prefixes a test uses on the server: every table bide makes under them is dropped afterwards."""
    used: list[str] = []
    yield used
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        for prefix in used:
            for table in ("audit_tiles", "audit_tile_trees", "records", "runs"):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {prefix}{table}")
    engine.dispose()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(REPO), str(cwd), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def _run_an_agent(store: bide.Store) -> None:
    result = bide.Agent(ScriptedModel([reply("done")]), store=store, name="a").run_sync("r", "go")
    assert result.status == "completed"


def test_the_limit_is_the_longest_name_bide_makes() -> None:
    assert LONGEST == 63 - max(len(name) for name in _PREFIXED_NAMES) == 47


@pytest.mark.parametrize("length", [LONGEST + 1, 56])
def test_open_store_refuses_a_prefix_too_long_creating_nothing(length: int, prefixes: list[str]) -> None:
    """48 characters used to open, and only `bide-audit export` failed (its audit_tile_trees is 64 bytes);
    56 failed at once with SQLAlchemy's IdentifierError, an internal error."""
    prefix = _prefix(length)
    prefixes.append(prefix)
    with pytest.raises(bide.ConfigError) as refused:
        bide.open_store(PG_URL, table_prefix=prefix)
    said = str(refused.value)
    assert f"at most {LONGEST} characters, got {length}" in said
    assert f"{prefix}audit_tile_trees" in said and "63 bytes" in said and "bide-audit export" in said
    assert _names_under(prefix) == set()


def test_the_cli_refuses_a_prefix_too_long_as_a_usage_error(tmp_path: Path, prefixes: list[str]) -> None:
    prefix = _prefix(LONGEST + 1)
    prefixes.append(prefix)
    (tmp_path / "prefix_app.py").write_text(APP)
    assert _cli("bide.audit._cli", "keygen", "log.key", cwd=tmp_path).returncode == 0
    store = ["--store", PG_URL, "--table-prefix", prefix]
    commands = [
        ("bide._cli", "worker", *store, "--app", "prefix_app:build", "--once"),
        ("bide._cli", "runs", *store),
        ("bide.audit._cli", "export", *store, "--run", "r", "--key", "log.key", "--head", "-o", "head.json"),
    ]
    for command in commands:
        done = _cli(*command, cwd=tmp_path)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert f"a table_prefix may be at most {LONGEST} characters" in done.stderr, done.stderr
        assert "internal error" not in done.stderr
    assert _names_under(prefix) == set() and not (tmp_path / "head.json").exists()


def test_the_longest_prefix_runs_an_agent_and_exports(tmp_path: Path, prefixes: list[str]) -> None:
    """The limit is no stricter than it must be: the longest prefix opens, an agent runs, the worker and
    `bide-audit export` (which creates the audit tables) succeed, and the longest name is 63 bytes."""
    prefix = _prefix(LONGEST)
    prefixes.append(prefix)
    store = bide.open_store(PG_URL, table_prefix=prefix)
    try:
        _run_an_agent(store)
    finally:
        store.close()
    (tmp_path / "prefix_app.py").write_text(APP)
    assert _cli("bide.audit._cli", "keygen", "log.key", cwd=tmp_path).returncode == 0
    where = ["--store", PG_URL, "--table-prefix", prefix]
    worker = _cli("bide._cli", "worker", *where, "--app", "prefix_app:build", "--once", cwd=tmp_path)
    assert worker.returncode == 0, worker.stderr
    export = ["export", *where, "--run", "r", "--key", "log.key", "--head", "-o", "head.json"]
    exported = _cli("bide.audit._cli", *export, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "head.json").exists()
    names = _names_under(prefix)
    # Every name bide made is listed where the limit comes from, and every listed one was made here
    # (records_run_key is SQLite's alone).
    assert {name[len(prefix) :] for name in names} == set(_PREFIXED_NAMES) - {"records_run_key"}
    assert max(len(name.encode()) for name in names) == 63


def test_sqlite_names_are_listed_too_and_any_length_is_taken(tmp_path: Path) -> None:
    """SQLite has no limit on names: a prefix PostgreSQL refuses opens, runs and gets its audit tables; and
    the names it makes there are listed in `_PREFIXED_NAMES` as well."""
    prefix = "a" * 56 + "_"
    store = bide.SQLStore(f"sqlite:///{tmp_path / 'bide.db'}", table_prefix=prefix)
    try:
        _run_an_agent(store)
        hashes = backend_for(store)
        assert isinstance(hashes, SQLHashes)
        with store.engine.connect() as conn:
            listed = conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite%'")
            made = set(listed.scalars())
        for metadata in (store.metadata, hashes.tiles.metadata):
            for table in metadata.tables.values():
                made |= {str(c.name) for c in table.constraints if c.name}
                made |= {str(i.name) for i in table.indexes}
    finally:
        store.close()
    assert {name[len(prefix) :] for name in made} <= set(_PREFIXED_NAMES)
    assert all(name.startswith(prefix) for name in made)
