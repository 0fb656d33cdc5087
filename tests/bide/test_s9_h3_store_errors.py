"""A SQLite store's error keeps what it was raised from (`__cause__`): the sqlite3 error of a refused or
failed write, the operating system's refusal of a directory this user may not enter. A library user (and
the command lines, bide._cli_common) reads the cause instead of SQLite's words in the message.

Before: a write that failed (a read-only file, a full disk) reached its caller as a StoreError with no
cause at all, and opening a store in a directory the user may not enter said so with no cause either.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from store_places import as_another_user, make_store

import bide

# Run as another user would: prints the cause of the StoreError the code in argv[2] raises.
_CAUSE = """
import sys, bide
from bide.testing import ScriptedModel, reply
url, what = sys.argv[1:3]
try:
    if what == "write":
        store = bide.open_store(url)
        bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("r2", "hi")
    else:
        bide.open_store(url, create=False)
except bide.StoreError as exc:
    cause = exc.__cause__
    print(type(cause).__module__, type(cause).__name__, getattr(cause, "sqlite_errorname", None))
    print(exc)
"""


def _as_another_user(url: str, what: str) -> list[str]:
    """The two lines `_CAUSE` prints, run without root's reach over files."""
    wrap = as_another_user()
    repo = str(Path(bide.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([*wrap, sys.executable, "-c", _CAUSE, url, what], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_write_to_a_read_only_store_file_is_refused_with_sqlites_error_as_its_cause(tmp_path: Path) -> None:
    path = tmp_path / "bide.db"
    make_store(path)
    path.chmod(0o444)
    try:
        cause, said = _as_another_user(f"sqlite:///{path}", "write")
    finally:
        path.chmod(0o644)
    assert cause == "sqlite3 OperationalError SQLITE_READONLY"
    assert "attempt to write a readonly database" in said and "is not writable by this user" in said


def test_a_write_on_a_full_disk_fails_with_sqlites_error_as_its_cause(small_disk: Path) -> None:
    store = bide.open_store(f"sqlite:///{small_disk / 'bide.db'}")
    try:
        store.insert_many("r", [("a", b"1")])
        fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:  # no space left
            pass
        finally:
            os.close(fd)
        with pytest.raises(bide.StoreError) as failed:
            store.insert_many("r", [("b", os.urandom(200_000))])
    finally:
        store.close()
    cause = failed.value.__cause__
    assert isinstance(cause, sqlite3.Error) and cause.sqlite_errorname == "SQLITE_FULL", repr(cause)
    assert "database or disk is full" in str(failed.value) and "is full: free some space" in str(failed.value)


def test_a_store_in_a_directory_the_user_may_not_enter_is_refused_from_the_systems_refusal(
    tmp_path: Path,
) -> None:
    closed = tmp_path / "closed"
    closed.mkdir()
    path = closed / "bide.db"
    make_store(path)
    closed.chmod(0)
    try:
        cause, said = _as_another_user(f"sqlite:///{path}", "open")
    finally:
        closed.chmod(0o755)
    assert cause == "builtins PermissionError None"
    assert f"the directory {closed} may not be entered" in said
