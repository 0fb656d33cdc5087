"""A damaged SQLite store file (truncated: "database disk image is malformed") is unreadable, exit 4 in `bide`
and `bide-audit export` (docs/cli.md's table), with a message that says to restore it from a backup; not exit
6, "the store failed", which a script retries forever. A store that fails for a while (locked, unreachable)
is still 6."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide._errors import StoreError

pytestmark = pytest.mark.slow

_CLI = {"bide": "bide._cli", "bide-audit": "bide.audit._cli"}


def _run(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", _CLI[prog], *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def _truncated_store(tmp_path: Path) -> Path:
    """A store holding a few runs, cut short as a copy that ran out of space is (`head -c 20000`)."""
    store = bide.open_store(f"sqlite:///{tmp_path / 'bide.db'}")
    try:
        for n in range(3):
            journal = bide.Journal(store, f"run-{n}").load()
            journal.write([bide.Start(key="run:start", entry="agent:test", input="x" * 4000)])
    finally:
        store.close()
    cut = tmp_path / "trunc.db"
    cut.write_bytes((tmp_path / "bide.db").read_bytes()[:20000])
    return cut


def test_a_truncated_store_is_exit_4_saying_to_restore_it_in_both_clis(tmp_path: Path) -> None:
    cut = _truncated_store(tmp_path)
    assert _run("bide-audit", "keygen", "log.key", cwd=tmp_path).returncode == 0
    export = ["export", "--store", str(cut), "--run", "run-0", "--key", "log.key", "--head", "-o", "h.json"]
    commands = [
        ("bide", ("runs", "--store", str(cut))),
        ("bide", ("show", "--store", str(cut), "run-0")),
        ("bide-audit", export),
    ]
    for prog, args in commands:
        done = _run(prog, *args, cwd=tmp_path)
        assert done.returncode == 4, (args, done.stderr)
        assert "malformed" in done.stderr and "damaged" in done.stderr, done.stderr
        assert "restore it from a backup" in done.stderr, done.stderr
        as_json = json.loads(_run(prog, *args, "--json", cwd=tmp_path).stdout)
        assert (as_json["exit_code"], as_json["reason"]) == (4, "unreadable"), as_json
    assert not (tmp_path / "h.json").exists()


def test_a_store_that_cannot_be_reached_is_still_exit_6(tmp_path: Path) -> None:
    assert _run("bide-audit", "keygen", "log.key", cwd=tmp_path).returncode == 0
    url = "postgresql://nobody@127.0.0.1:1/none"
    export = ["export", "--store", url, "--run", "r", "--key", "log.key", "--head", "-o", "h.json"]
    for prog, args in [("bide", ("runs", "--store", url)), ("bide-audit", export)]:
        done = _run(prog, *args, cwd=tmp_path)
        assert done.returncode == 6, (args, done.stderr)
        assert "backup" not in done.stderr, done.stderr


def test_only_a_damaged_file_is_called_damaged(tmp_path: Path) -> None:
    """A locked database (SQLITE_BUSY) passes: it is not damaged; a malformed one (SQLITE_CORRUPT) is."""
    from bide._cli_common import damaged_store_file

    path = tmp_path / "x.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN EXCLUSIVE")
        with contextlib.closing(sqlite3.connect(path, timeout=0)) as other, pytest.raises(
            sqlite3.OperationalError
        ) as busy:
            other.execute("SELECT * FROM t")
    assert damaged_store_file(_wrapped(busy.value)) is None
    corrupt = sqlite3.DatabaseError("database disk image is malformed")
    corrupt.sqlite_errorname = "SQLITE_CORRUPT"
    assert damaged_store_file(_wrapped(corrupt)) is not None


def _wrapped(exc: BaseException) -> StoreError:
    try:
        raise StoreError(f"cannot read the SQLite database: {exc}") from exc
    except StoreError as wrapped:
        return wrapped
