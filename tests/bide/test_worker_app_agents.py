"""`bide worker --app module:agent` and `--app module:agents`: agents an application builds when its module
is imported opened their own store object, before the worker opened its own. When both name the same
tables (here a relative and an absolute path to one SQLite file, or one PostgreSQL database and prefix),
the worker drives the agents on the app's store; otherwise it refuses (exit 2) and says what to do. Both
forms were refused every time ("uses another store than the worker"), whatever the URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide.testing import Fail, ScriptedModel, call

APP = '''
import os

import bide
from bide.testing import ScriptedModel, call, reply


@bide.tool(safety=bide.ReadOnly)
def note(text: str) -> str:
    """Take a note."""
    return text


store = bide.open_store(os.environ["APP_STORE"], table_prefix=os.environ["APP_PREFIX"])
script = [call("note", text="x"), reply("done")]  # (turn 0 is journaled: the worker asks for turn 1)
agent = bide.Agent(ScriptedModel(script), store=store, tools=[note], name="noter")
agents = [agent]
'''


@bide.tool(safety=bide.ReadOnly)
def note(text: str) -> str:
    """Take a note."""
    return text


def crashed_run(url: str, prefix: str) -> None:
    """A run of "noter" whose model went down after its first turn: one for a worker to finish."""
    store = bide.open_store(url, table_prefix=prefix)
    try:
        model = ScriptedModel([call("note", text="x"), Fail(bide.ModelError("down"))])
        with pytest.raises(bide.ModelError):
            bide.Agent(model, store=store, tools=[note], name="noter").run_sync("r", "go")
        assert bide.run_status(store, "r").status == "running"
    finally:
        store.close()


def worker_once(
    url: str, prefix: str, app: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--table-prefix", prefix,
         "--app", app, "--once", "--json"],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("attribute", ["agent", "agents"])
def test_agents_built_at_import_are_driven_on_their_own_store_when_it_holds_the_same_tables(
    durable_store_spec: tuple[str, str], tmp_path: Path, attribute: str
) -> None:
    url, prefix = durable_store_spec
    (tmp_path / "noter_app.py").write_text(APP)
    crashed_run(url, prefix)
    app_url = url
    if url.startswith("sqlite:///"):  # the app names the file by a relative path, the worker by its own
        app_url = "sqlite:///" + os.path.relpath(url.removeprefix("sqlite:///"), tmp_path)
    env = dict(os.environ, APP_STORE=app_url, APP_PREFIX=prefix)
    done = worker_once(url, prefix, f"noter_app:{attribute}", tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["completed"] == 1
    store = bide.open_store(url, table_prefix=prefix)
    try:
        assert bide.run_status(store, "r").status == "completed"
        assert bide.run_status(store, "r").answer == "done"
    finally:
        store.close()


def test_agents_built_at_import_on_other_tables_are_refused_with_what_to_do(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    url, prefix = durable_store_spec
    (tmp_path / "noter_app.py").write_text(APP)
    crashed_run(url, prefix)
    for app_url, app_prefix in [(f"sqlite:///{tmp_path / 'elsewhere.db'}", prefix), (url, prefix + "x_")]:
        env = dict(os.environ, APP_STORE=app_url, APP_PREFIX=app_prefix)
        done = worker_once(url, prefix, "noter_app:agent", tmp_path, env)
        assert done.returncode == 2, done.stderr
        assert "agent 'noter' uses the store" in done.stderr and "--app module:build" in done.stderr
        assert json.loads(done.stdout)["reason"] == "usage error"
    store = bide.open_store(url, table_prefix=prefix)
    try:
        assert bide.run_status(store, "r").status == "running"  # nothing was driven
    finally:
        store.close()


@pytest.mark.postgres
def test_agents_on_the_same_database_but_another_schema_are_refused(tmp_path: Path) -> None:
    # The app's URL differs from the worker's only by a query option that points its tables elsewhere
    # (another schema on the search path): it was taken for the same store and the worker drove the
    # app's agents on tables in which the worker's run does not exist.
    import sqlalchemy as sa
    from conftest import PG_URL, drop_prefix

    prefix = f"t{os.urandom(5).hex()}_"
    schema = f"s{os.urandom(5).hex()}"
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    try:
        (tmp_path / "noter_app.py").write_text(APP)
        crashed_run(PG_URL, prefix)
        app_url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
        env = dict(os.environ, APP_STORE=app_url, APP_PREFIX=prefix)
        done = worker_once(PG_URL, prefix, "noter_app:agent", tmp_path, env)
        assert done.returncode == 2, done.stderr
        assert "agent 'noter' uses the store" in done.stderr and "--app module:build" in done.stderr
        store = bide.open_store(PG_URL, table_prefix=prefix)
        try:
            assert bide.run_status(store, "r").status == "running"  # nothing was driven
        finally:
            store.close()
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        engine.dispose()
        drop_prefix(PG_URL, prefix)
