"""A SQLite store that may not be written where it is fails the same way on every try, also for a command
that writes (`bide cancel`, `bide-audit export`, which writes its tree): exit 4 (`unreadable`), not 6 ("the
store failed", which a script retries for ever). It was 6 for a store file of mode 0444, for -wal and -shm
files this user may not write, and for any write on a read-only mount, since the write path's error keeps
only the text of SQLite's. The advice names the file a symbolic link leads to (its -wal is beside that
file), says nothing of retrying, and does not say SQLite creates files that are there; and a locked store in
a directory this user may not write is still 6, without the hint that the directory is not writable."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from store_places import WITHOUT_ROOTS_REACH
from test_cli_a7_read_only_store_place import (
    _WRITE_AND_DIE,
    _closed_store,
    _env,
    _run,
    _store_with_records_only_in_its_wal,
)


def _as_another_user() -> list[str]:
    wrap = WITHOUT_ROOTS_REACH if os.geteuid() == 0 else []
    assert not wrap or shutil.which("capsh"), "make test installs capsh (libcap2-bin)"
    return wrap


def _writing_commands(store: Path, tmp_path: Path) -> list[tuple[str, list[str]]]:
    assert _run("bide.audit._cli", "keygen", "log.key", cwd=tmp_path).returncode == 0
    url = f"sqlite:///{store}"
    export = ["export", "--store", url, "--run", "r1", "--key", "log.key", "--head", "-o", "head.json"]
    return [("bide._cli", ["cancel", "--store", url, "r1"]), ("bide.audit._cli", export)]


def _assert_unusable_there(
    commands: list[tuple[str, list[str]]], tmp_path: Path, wrap: list[str], place: str
) -> None:
    for module, args in commands:
        done = _run(module, *args, cwd=tmp_path, wrap=wrap)
        assert done.returncode == 4, (args, done.stderr)
        assert place in done.stderr, done.stderr
        assert "will fail the same way every time" in done.stderr, done.stderr
        assert "run it again" not in done.stderr, done.stderr
        if module == "bide.audit._cli":  # (bide cancel has no --json)
            as_json = json.loads(_run(module, *args, "--json", cwd=tmp_path, wrap=wrap).stdout)
            assert (as_json["exit_code"], as_json["reason"]) == (4, "unreadable"), as_json
    assert not (tmp_path / "head.json").exists()


def test_a_store_file_this_user_may_not_write_is_unusable_for_writes(tmp_path: Path) -> None:
    wrap = _as_another_user()
    store = _closed_store(tmp_path)
    tmp_path.chmod(0o777)  # the directory is writable: only the file is not
    store.chmod(0o444)
    _assert_unusable_there(_writing_commands(store, tmp_path), tmp_path, wrap, f"{store}' is not writable")


def test_wal_and_shm_this_user_may_not_write_are_unusable_for_writes(tmp_path: Path) -> None:
    wrap = _as_another_user()
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    store = evidence / "bide.db"
    done = subprocess.run([sys.executable, "-c", _WRITE_AND_DIE, f"sqlite:///{store}", "kill"],
                          capture_output=True, text=True, env=_env(), timeout=120)  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    for name in ("bide.db", "bide.db-wal", "bide.db-shm"):
        (evidence / name).chmod(0o444)
    tmp_path.chmod(0o777)
    evidence.chmod(0o555)
    try:
        commands = _writing_commands(store, tmp_path)
        _assert_unusable_there(commands, tmp_path, wrap, "is not writable by this user")
    finally:
        evidence.chmod(0o755)


def test_writes_on_a_read_only_mount_with_wal_and_shm_are_unusable(
    read_only_mount: Path, tmp_path: Path
) -> None:
    mount = read_only_mount
    store = _closed_store(mount)
    commands = _writing_commands(store, tmp_path)
    assert _run(commands[1][0], *commands[1][1], cwd=tmp_path).returncode == 0  # the audit tables made
    (tmp_path / "head.json").unlink()
    newer = (  # a record the tree has not taken in, left in bide.db-wal with bide.db-shm by a killed writer
        "import os, signal, sys\nimport bide\nstore = bide.open_store(sys.argv[1])\n"
        "bide.Journal(store, 'r1').load().write([bide.GateRecord(key='approval:note:9', data={})])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", newer, f"sqlite:///{store}"], capture_output=True, text=True,
                          env=_env(), timeout=120)  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (mount / "bide.db-wal").exists() and (mount / "bide.db-shm").exists()
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    try:
        _assert_unusable_there(commands, tmp_path, [], "is mounted read-only")
        for module, args in commands:
            said = _run(module, *args, cwd=tmp_path).stderr
            assert "SQLite creates" not in said, said  # both are there
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True)


def test_the_advice_for_a_store_behind_a_link_names_the_file_it_leads_to(tmp_path: Path) -> None:
    wrap = _as_another_user()
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    store = _store_with_records_only_in_its_wal(evidence)
    (tmp_path / "link.db").symlink_to(store)
    tmp_path.chmod(0o777)
    evidence.chmod(0o555)
    try:
        done = _run("bide._cli", "show", "--store", f"sqlite:///{tmp_path / 'link.db'}", "r1", cwd=tmp_path,
                    wrap=wrap)  # fmt: skip
    finally:
        evidence.chmod(0o755)
    assert done.returncode == 4, done.stderr
    assert f"copy {store}, with its bide.db-wal file" in done.stderr, done.stderr
    assert "link.db-wal" not in done.stderr


_HOLD_LOCKED = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode=EXCLUSIVE")
conn.execute("BEGIN EXCLUSIVE")
conn.execute("CREATE TABLE IF NOT EXISTS held(x)")
conn.execute("COMMIT")
conn.execute("SELECT 1 FROM held").fetchall()
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_locked_store_in_a_directory_the_user_may_not_write_failed_without_the_hint(tmp_path: Path) -> None:
    wrap = _as_another_user()
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    store = _closed_store(evidence)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCKED, str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        tmp_path.chmod(0o777)
        evidence.chmod(0o555)
        try:
            done = _run("bide._cli", "show", "--store", f"sqlite:///{store}", "r1", cwd=tmp_path, wrap=wrap)
        finally:
            evidence.chmod(0o755)
    finally:
        holder.kill()
        holder.communicate()
    assert done.returncode == 6, done.stderr
    assert "database is locked" in done.stderr, done.stderr
    assert "not writable" not in done.stderr and "SQLite creates" not in done.stderr, done.stderr
