"""`bide.open_store` and `govern.EventLog` accept the same URL forms, parsed by one parser, and refuse the
rest with their package's error type and a hint that says what to write (bide/_url.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import bide
import govern

ROOT = Path(__file__).resolve().parents[1]


def _open_store(url: str) -> Any:
    store = bide.open_store(url)
    store.insert_many("r", [("k", b"{}")])
    assert [e.key for e in store.load("r")] == ["k"]
    return store


def _open_log(url: str) -> Any:
    log = govern.EventLog(url)
    assert log.read() == [] and log.in_memory == url.startswith("memory://")
    return log


OPENERS: dict[str, tuple[Callable[[str], Any], type[Exception]]] = {
    "open_store": (_open_store, bide.StoreURLError),
    "EventLog": (_open_log, govern.LogURLError),
}


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(here)


@pytest.mark.parametrize("opener", sorted(OPENERS))
@pytest.mark.parametrize("form", ["plain", "plain-abs", "sqlite-rel", "sqlite-abs", "memory", "memory-named"])
def test_the_same_forms_open_both(opener: str, form: str, in_tmp: Path) -> None:
    (in_tmp / "data").mkdir()
    url = {
        "plain": "data/x.db",
        "plain-abs": str(in_tmp / "data" / "x.db"),
        "sqlite-rel": "sqlite:///data/x.db",
        "sqlite-abs": f"sqlite:///{in_tmp / 'data' / 'x.db'}",
        "memory": "memory://",
        "memory-named": "memory://urls-test",
    }[form]
    handle = OPENERS[opener][0](url)
    handle.close()
    assert (in_tmp / "data" / "x.db").exists() == (not form.startswith("memory"))


@pytest.mark.parametrize("opener", sorted(OPENERS))
@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("sqlite:/bide.db", "did you mean sqlite:///bide.db"),
        ("sqlite://bide.db", "did you mean sqlite:///bide.db"),
        ("sqlite:bide.db", "did you mean sqlite:///bide.db"),
        ("memory", "did you mean memory://"),
        ("memory:space", "did you mean memory://space"),
        ("sqlite://", "needs a file path"),
        ("sqlite:///:memory:", "use memory://"),
        ("mysql://u@h/db", "unsupported"),
        ("postgresql+asyncpg://u@h/db", "psycopg only"),
        ("postgresql:db", "postgresql://user@host/dbname"),
        ("postgresql://u@h1:5432,h2:5433/db", "?host=host1:5432&host=host2:5432"),
        ("postgresql://u@h/db?connect_timeout=abc", "connect_timeout"),
        ("", "URL is required"),
        ("nowhere/at/all/x.db", "does not exist"),
        # Read from a file or a variable with its line break, each opened a file of its own name.
        ("sqlite:///shared.db ", "ends with white space"),
        ("shared.db\n", "ends with white space"),
        ("\tshared.db", "begins or ends with white space"),
        ("sqlite:///sha\nred.db", "holds a control character"),
        ("postgresql://u@127.0.0.1:5432/test\n", "(a line break, a tab); remove it"),
        # libpq would have used the database named like the user: tables made where nobody meant them.
        ("postgresql://postgres@127.0.0.1:5432/", "names no database"),
        ("postgresql://postgres@127.0.0.1", "names no database"),
        ("postgresql://postgres@127.0.0.1/test%0A", "its database name 'test\\n' holds a control character"),
        # libpq ends a name at a NUL: these opened database "test" and logged in as "postgres".
        ("postgresql://postgres@127.0.0.1/test%00x", "cannot hold %00"),
        ("postgresql://postgres%00x@127.0.0.1/test", "cannot hold %00"),
        ("postgresql://postgres@127.0.0.1/test?application_name=a%00b", "cannot hold %00"),
        ("\ufeffshared.db", "holds a control character"),  # a byte order mark, from a file read as text
        ("sha\x9bred.db", "holds a control character"),
    ],
)
def test_bad_urls_are_refused_with_a_hint_and_create_nothing(
    opener: str, url: str, hint: str, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGDATABASE", raising=False)
    open_, error = OPENERS[opener]
    with pytest.raises(error) as caught:
        open_(url)
    assert hint in str(caught.value)
    assert list(in_tmp.iterdir()) == []
    assert isinstance(caught.value, bide.BideError if opener == "open_store" else govern.GovernError)


def test_postgresql_without_psycopg_says_how_to_install_it(tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import bide, govern\n"
        "for opener in (bide.open_store, govern.EventLog):\n"
        "    for url in ('postgresql://postgres@127.0.0.1/test', 'postgresql://u@host:5342x/db'):\n"
        "        try:\n"
        "            opener(url)\n"
        "        except (bide.StoreURLError, govern.LogURLError) as exc:\n"
        "            print(type(exc).__name__, exc)\n"
    )
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["StoreURLError"] * 2 + ["LogURLError"] * 2
    assert all("pip install 'bide[postgres]'" in line for line in lines[::2])
    # A typo is told first: installing the driver would not fix it.
    assert all("the port '5342x' is not a port number" in line for line in lines[1::2])


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg"])
def test_postgresql_schemes_open_both(scheme: str) -> None:
    import uuid

    url = f"{scheme}://postgres@127.0.0.1:5432/test"
    prefix = "u" + uuid.uuid4().hex[:10] + "_"
    store = bide.open_store(url, table_prefix=prefix)
    try:
        store.insert_many("r", [("k", b"{}")])
        assert [e.key for e in store.load("r")] == ["k"]
    finally:
        store.close()
        engine = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test")
        with engine.begin() as conn:  # (tests/bide's conftest is not importable from here when run alone)
            for table in ("records", "runs"):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {prefix}{table}")
        engine.dispose()
    log = govern.EventLog(url, name="urls" + uuid.uuid4().hex[:12])
    try:
        assert log.read() == []
    finally:
        log.close()


def test_a_postgresql_database_named_by_a_service_or_the_environment_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check for a URL naming no database took only the URL and PGDATABASE: a libpq service (in the
    URL or PGSERVICE), whose file names the database, was refused."""
    from bide._url import parse_store_url

    monkeypatch.delenv("PGDATABASE", raising=False)
    monkeypatch.delenv("PGSERVICE", raising=False)
    assert parse_store_url("postgresql:///?service=orders").kind == "postgresql"
    for variable in ("PGSERVICE", "PGDATABASE"):
        with monkeypatch.context() as env:
            env.setenv(variable, "orders")
            assert parse_store_url("postgresql://app@db.internal").kind == "postgresql"
    with pytest.raises(bide.StoreURLError, match="names no database"):
        parse_store_url("postgresql://app@db.internal")

