"""A SQLite store in a place its reader may not write (an auditor's read-only copy, a mounted evidence
volume) cannot be read unless its -wal and -shm files are both there: SQLite creates them to read it. `bide`
and `bide-audit export` answered exit 6, "the store failed", which a script retries for ever. They now
answer exit 4 (`unreadable`) and say to copy the store, with its -wal file, to a directory the user can
write; the copy is read whole, the records only its -wal holds included."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from store_places import as_another_user

REPO = Path(__file__).resolve().parents[2]
_WRITE_AND_DIE = """
import os, signal, sys
import bide
store = bide.open_store(sys.argv[1])
journal = bide.Journal(store, "r1").load()
journal.write([bide.Start(key="run:start", entry="agent:test", input="go")])
journal.write([bide.GateRecord(key="approval:note:0", data={"i": 0})])
if sys.argv[2] == "close":
    store.close()  # the records are moved into bide.db, and bide.db-wal and bide.db-shm deleted
else:
    os.kill(os.getpid(), signal.SIGKILL)  # no close: the records stay in bide.db-wal, not yet in bide.db
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _run(
    module: str, *args: str, cwd: Path, wrap: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [*(wrap or []), sys.executable, "-m", module, *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=_env(), timeout=120)


def _closed_store(directory: Path) -> Path:
    """A store closed by its writer: no bide.db-wal or bide.db-shm beside it (as copied as evidence)."""
    path = directory / "bide.db"
    done = subprocess.run([sys.executable, "-c", _WRITE_AND_DIE, f"sqlite:///{path}", "close"],
                          capture_output=True, text=True, env=_env(), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in directory.iterdir() if p.name.startswith("bide")) == ["bide.db"]
    return path


def _store_with_records_only_in_its_wal(directory: Path) -> Path:
    """A store whose writer was killed, its records in bide.db-wal alone; bide.db-shm not copied along."""
    path = directory / "bide.db"
    done = subprocess.run([sys.executable, "-c", _WRITE_AND_DIE, f"sqlite:///{path}", "kill"],
                          capture_output=True, text=True, env=_env(), timeout=120)  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (directory / "bide.db-wal").stat().st_size > 0
    (directory / "bide.db-shm").unlink()
    return path


def _commands(store: Path, key: Path, out: Path) -> list[tuple[str, list[str]]]:
    url = f"sqlite:///{store}"
    export = ["export", "--store", url, "--run", "r1", "--key", str(key), "--head", "-o", str(out)]
    return [("bide._cli", ["runs", "--store", url]), ("bide._cli", ["show", "--store", url, "r1"]),
            ("bide.audit._cli", export)]  # fmt: skip


def _assert_unreadable_with_advice(store: Path, tmp_path: Path, wrap: list[str] | None, place: str) -> None:
    assert _run("bide.audit._cli", "keygen", "log.key", cwd=tmp_path).returncode == 0
    out = tmp_path / "head.json"
    for module, args in _commands(store, tmp_path / "log.key", out):
        done = _run(module, *args, cwd=tmp_path, wrap=wrap)
        assert done.returncode == 4, (args, done.stderr)
        assert place in done.stderr, done.stderr
        assert "will fail the same way every time" in done.stderr, done.stderr
        assert "copy bide.db, with its bide.db-wal file" in done.stderr, done.stderr
        as_json = json.loads(_run(module, *args, "--json", cwd=tmp_path, wrap=wrap).stdout)
        assert (as_json["exit_code"], as_json["reason"]) == (4, "unreadable"), as_json
    assert not out.exists()


def _assert_the_copy_is_read_whole(store: Path, tmp_path: Path) -> None:
    """The advice works: the store and its -wal, copied to a writable directory, show the run's records."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("bide.db", "bide.db-wal"):
        if (store.parent / name).exists():
            shutil.copyfile(store.parent / name, copy / name)
    url = f"sqlite:///{copy / 'bide.db'}"
    shown = _run("bide._cli", "show", "--store", url, "r1", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "approval:note:0" in shown.stdout


@pytest.mark.parametrize("make", [_closed_store, _store_with_records_only_in_its_wal])
def test_a_store_in_a_directory_the_user_may_not_write_is_unreadable_not_failed(
    tmp_path: Path, make: Callable[[Path], Path]
) -> None:
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    store = make(evidence)
    files = sorted(p.name for p in evidence.iterdir())
    wrap = as_another_user()
    tmp_path.chmod(0o777)  # the commands' user writes the key and the output here
    evidence.chmod(0o555)
    try:
        _assert_unreadable_with_advice(store, tmp_path, wrap, f"the directory {evidence} is not writable")
    finally:
        evidence.chmod(0o755)
    assert sorted(p.name for p in evidence.iterdir()) == files
    _assert_the_copy_is_read_whole(store, tmp_path)


def test_a_store_on_a_read_only_mount_is_unreadable_not_failed(read_only_mount: Path, tmp_path: Path) -> None:
    store = _closed_store(read_only_mount)
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_mount)], check=True)
    try:
        _assert_unreadable_with_advice(store, tmp_path, None, "is mounted read-only")
        _assert_the_copy_is_read_whole(store, tmp_path)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(read_only_mount)], check=True)
