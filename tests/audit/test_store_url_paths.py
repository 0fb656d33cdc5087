"""The SQLite file a store URL names is the file the store opens (bide/_url.py): `StoreURL.path`, which the
CLIs guard against being overwritten, is percent-decoded as SQLAlchemy decodes it, a plain path is taken
literally, and a query (which the store would drop or misread) is refused."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

import bide
from bide._url import parse_store_url

from .conftest import write_run

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
        env={**os.environ, "PYTHONPATH": path}, timeout=120,
    )


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///%62ide.db", "bide.db"),
        ("sqlite:///my%20data.db", "my data.db"),
        ("sqlite:///a%3Fb.db", "a?b.db"),
        ("sqlite:///100%25.db", "100%.db"),
        ("a?b.db", "a?b.db"),
        ("%62ide.db", "%62ide.db"),
        ("100%25?.db", "100%25?.db"),
    ],
)
def test_the_path_is_the_file_the_store_opens(url: str, path: str, in_tmp: Path) -> None:
    where = parse_store_url(url)
    assert where.path == path
    assert make_url(where.url).database == path
    store = bide.open_store(url)
    try:
        store.insert_many("r", [("k", b"{}")])
    finally:
        store.close()
    assert sorted(p.name for p in in_tmp.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [path]


@pytest.mark.parametrize("query", ["?timeout=30", "?mode=memory&uri=true", "?"])
def test_a_sqlite_url_with_options_is_refused_and_creates_nothing(query: str, in_tmp: Path) -> None:
    with pytest.raises(bide.StoreURLError, match="takes no options"):
        bide.open_store("sqlite:///bide.db" + query)
    assert list(in_tmp.iterdir()) == []


def test_a_percent_encoded_nul_is_refused_like_a_raw_one(in_tmp: Path) -> None:
    import govern

    with pytest.raises(bide.StoreURLError, match="NUL"):
        bide.open_store("sqlite:///a%00b.db")
    with pytest.raises(govern.LogURLError, match="NUL"):
        govern.EventLog("sqlite:///a%00b.db")
    assert list(in_tmp.iterdir()) == []


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    store = bide.open_store(f"sqlite:///{tmp_path / 'bide.db'}")
    try:
        write_run(store, "r", 2)
    finally:
        store.close()
    assert _run("bide.audit._cli", "keygen", "log.key", cwd=tmp_path).returncode == 0
    return tmp_path


@pytest.mark.parametrize("url", ["sqlite:///%62ide.db", "sqlite:///./b%69de.db", "sqlite:///bide.db?timeout=30"])
def test_export_never_replaces_the_store_it_reads_whatever_the_url_spelling(url: str, exported: Path) -> None:
    before = (exported / "bide.db").read_bytes()
    rows = "select count(*) from bide_records"
    count = sqlite3.connect(exported / "bide.db").execute(rows).fetchone()[0]
    done = _run("bide.audit._cli", "export", "--store", url, "--run", "r", "--head", "-o", "bide.db",
                "--key", "log.key", cwd=exported)
    assert done.returncode == 2, done.stderr
    assert "is the input file" in done.stderr or "takes no options" in done.stderr
    assert (exported / "bide.db").read_bytes() == before
    assert sqlite3.connect(exported / "bide.db").execute(rows).fetchone()[0] == count > 0


def test_bide_finds_a_store_named_by_a_percent_encoded_url(exported: Path) -> None:
    done = _run("bide._cli", "runs", "--store", "sqlite:///%62ide.db", "--json", cwd=exported)
    assert done.returncode == 0, done.stderr
    assert '"r"' in done.stdout
