"""A SQLite store the user cannot reach or open for writing says why: with the store failure's exit code,
or, for a store on a read-only file system (which no retry can read), the unreadable one.

Before: a store in a directory the user may not enter was "no bide store ...: the file does not exist"
(exit 4: an operator would think it deleted), and a store on a full disk or a read-only file system was
"cannot create bide tables in ...: (sqlite3.OperationalError) disk I/O error" with SQLAlchemy's link,
naming neither the cause nor that the tables were there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from store_places import as_another_user, make_store

import bide
from bide.testing import ScriptedModel, reply


def _bide(*args: str, wrap: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(wrap or []), "bide", *args], capture_output=True, text=True, timeout=120)


def test_a_store_in_a_directory_the_user_may_not_enter_is_not_called_missing(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir()
    make_store(closed / "bide.db")
    wrap = as_another_user()
    closed.chmod(0)
    try:
        done = _bide("runs", "--store", f"sqlite:///{closed / 'bide.db'}", wrap=wrap)
    finally:
        closed.chmod(0o755)
    assert done.returncode == 4, done.stderr  # not 6, which a script retries: the place stays as it is
    assert "permission denied reaching" in done.stderr and "does not exist" not in done.stderr


def test_a_store_on_a_read_only_file_system_says_so(small_disk: Path) -> None:
    make_store(small_disk / "bide.db")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        for command in (["runs"], ["show", "r1"]):
            done = _bide(*command, "--store", f"sqlite:///{small_disk / 'bide.db'}")
            assert done.returncode == 4, done.stderr
            assert "is mounted read-only" in done.stderr, done.stderr
            assert "sqlalche.me" not in done.stderr
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)


def test_a_store_on_a_full_disk_says_the_disk_is_full(small_disk: Path) -> None:
    make_store(small_disk / "bide.db")  # closed: its -wal and -shm files are gone
    filler = small_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # no space left
        pass
    finally:
        os.close(fd)
    done = _bide("runs", "--store", f"sqlite:///{small_disk / 'bide.db'}")
    filler.unlink()
    assert done.returncode == 6, done.stderr
    assert "is full" in done.stderr and "sqlalche.me" not in done.stderr, done.stderr
    again = _bide("runs", "--store", f"sqlite:///{small_disk / 'bide.db'}")
    assert again.returncode == 0 and "r1" in again.stdout, again.stderr


def test_a_read_only_store_is_read_and_the_audit_export_says_what_it_needs(tmp_path: Path) -> None:
    """Reading commands work on a read-only store file as before; `bide-audit export`, which keeps its hashes
    beside the journal, said "INTERNAL ERROR: attempt to write a readonly database" (exit 3)."""
    path = tmp_path / "bide.db"
    make_store(path)
    store = bide.open_store(f"sqlite:///{path}")
    try:  # a thread left idle: a run a cancel request would end
        bide.Agent(ScriptedModel([reply("hi")]), store=store).thread("t1").send_sync("hi")
    finally:
        store.close()
    key = tmp_path / "log.key"
    assert subprocess.run(["bide-audit", "keygen", str(key)], capture_output=True).returncode == 0
    wrap = as_another_user()
    path.chmod(0o444)
    try:
        runs = _bide("runs", "--store", f"sqlite:///{path}", wrap=wrap)
        cancelled = _bide("cancel", "--store", f"sqlite:///{path}", "t1", wrap=wrap)
        exported = subprocess.run(
            [*wrap, "bide-audit", "export", "--store", f"sqlite:///{path}", "--run", "r1", "-o",
             str(tmp_path / "ev.json"), "--key", str(key)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        path.chmod(0o644)
    assert runs.returncode == 0 and "r1" in runs.stdout, runs.stderr
    # SQLite refuses a write to a read-only file before it writes anything: "a write may or may not have
    # committed" sent the user to check what could not have happened.
    assert cancelled.returncode == 4, cancelled.stderr
    assert "nothing was written" in cancelled.stderr and "may or may not" not in cancelled.stderr
    assert exported.returncode == 4, exported.stderr
    assert "hash tables" in exported.stderr and "is not writable by this user" in exported.stderr
    assert not (tmp_path / "ev.json").exists()


def test_files_a_read_only_store_left_beside_it_are_named_when_writes_fail(tmp_path: Path) -> None:
    """A reader of a read-only store file leaves its -wal and -shm files with the file's mode (SQLite's
    choice). Once the store was made writable again, every write failed with "attempt to write a readonly
    database" alone: the hint (which file is not writable) looked only at the store and its directory."""
    path = tmp_path / "bide.db"
    make_store(path)
    wrap = as_another_user()
    tmp_path.chmod(0o777)
    path.chmod(0o444)
    assert _bide("runs", "--store", f"sqlite:///{path}", wrap=wrap).returncode == 0
    path.chmod(0o644)
    code = (
        "import sys, bide\n"
        "from bide.testing import ScriptedModel, reply\n"
        "store = bide.open_store(sys.argv[1])\n"
        "try:\n"
        "    bide.Agent(ScriptedModel([reply('hi')]), store=store).run_sync('r2', 'hi')\n"
        "except bide.StoreError as exc:\n"
        "    print(exc)\n"
    )
    repo = str(Path(bide.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([*wrap, sys.executable, "-c", code, f"sqlite:///{path}"], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert "readonly database" in done.stdout, done.stdout + done.stderr
    assert "-shm'" in done.stdout or "-wal'" in done.stdout, done.stdout
    assert "is not writable by this user" in done.stdout
