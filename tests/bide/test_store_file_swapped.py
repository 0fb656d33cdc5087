"""A SQLite store file deleted, moved away or replaced while a store holds it open.

Open connections write through their file descriptors: before, a run went on committing into the unlinked
file and reported `completed`, the next connection created an empty file at the path, and a backup renamed
over the store got the old file's pages from the write-ahead log ("database disk image is malformed").
Now every write checks the path before and after its commit, and later connections open only the file the
store opened.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import bide
from bide._dbfile import OpenedFile
from bide.testing import ScriptedModel, call, reply


def _agent(store: bide.Store, fired: list[str], tamper: Callable[[], None]) -> bide.Agent:
    @bide.tool
    def charge(customer: str) -> str:
        """Charge a customer."""
        fired.append(customer)
        tamper()  # after the attempt marker committed: the tool's result is the next write
        return f"charged {customer}"

    return bide.Agent(
        ScriptedModel([call("charge", customer="alice"), reply("done")]), store=store, tools=[charge]
    )


def _warm(store: bide.Store) -> None:
    """A run before, so that the store's connections are open when the file goes."""
    bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("warm", "hi")


@pytest.mark.parametrize("how", ["deleted", "moved"])
def test_a_store_file_gone_while_a_run_writes_is_reported_and_not_recreated(tmp_path: Path, how: str) -> None:
    path = tmp_path / "bide.db"
    store = bide.open_store(f"sqlite:///{path}")
    fired: list[str] = []

    def tamper() -> None:
        if how == "deleted":
            path.unlink()
        else:
            path.rename(tmp_path / "moved.db")

    try:
        _warm(store)
        with pytest.raises(bide.StoreError, match="was deleted or moved away while this process had it open"):
            _agent(store, fired, tamper).run_sync("r1", "charge alice")
        # Nothing more goes through this store object, and no empty store appears at the path.
        with pytest.raises(bide.StoreError, match="deleted or moved away"):
            bide.run_status(store, "r1")
        assert not path.exists()
    finally:
        store.close()
    assert fired == ["alice"]
    if how == "moved":
        # Put back beside its write-ahead log, which holds the run's attempt marker and no result: a later
        # drive halts (the call's outcome is unknown) instead of firing again.
        (tmp_path / "moved.db").rename(path)
        again = bide.open_store(f"sqlite:///{path}")
        try:
            records = bide.Journal(again, "r1").load().records()
            assert [type(r) for r in records if isinstance(r, (bide.Attempt, bide.ToolResult))] == [
                bide.Attempt
            ]
            assert bide.run_status(again, "r1").status != "completed"
        finally:
            again.close()
        assert fired == ["alice"]


def test_a_backup_renamed_over_an_open_store_is_left_intact(tmp_path: Path) -> None:
    path = tmp_path / "bide.db"
    backup = tmp_path / "backup.db"
    old = bide.open_store(f"sqlite:///{backup}")
    try:
        for i in range(20):
            bide.Agent(ScriptedModel([reply("old " * 200)]), store=old).run_sync(f"old-{i}", "hi")
    finally:
        old.close()
    store = bide.open_store(f"sqlite:///{path}")
    fired: list[str] = []

    def restore_backup() -> None:
        # As SQLite does on its own every 1,000 pages: the write-ahead log is folded into the file first.
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        os.replace(backup, path)

    try:
        _warm(store)
        with pytest.raises(bide.StoreError, match="was replaced by another file"):
            _agent(store, fired, restore_backup).run_sync("r1", "charge alice")
    finally:
        store.close()
    assert fired == ["alice"]
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        runs = {r for (r,) in conn.execute("SELECT DISTINCT run_id FROM bide_records")}
    finally:
        conn.close()
    assert runs == {f"old-{i}" for i in range(20)}


def test_a_store_opened_by_a_relative_path_stays_on_its_file_after_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    store = bide.open_store("sqlite:///bide.db")
    answers: list[object] = []

    def in_a_new_thread() -> None:  # a thread of its own opens a connection of its own
        try:
            answers.append(
                bide.Agent(ScriptedModel([reply("later")]), store=store).run_sync("later", "hi").answer
            )
        except BaseException as exc:
            answers.append(exc)

    try:
        _warm(store)
        monkeypatch.chdir(tmp_path / "b")
        thread = threading.Thread(target=in_a_new_thread)
        thread.start()
        thread.join()
    finally:
        store.close()
    assert answers == ["later"]
    assert not (tmp_path / "b" / "bide.db").exists()


def test_a_path_starting_with_two_slashes_is_written_as_before(tmp_path: Path) -> None:
    """POSIX keeps a leading "//"; SQLite read "file://tmp/..." as a host named tmp (writes failed with
    "invalid uri authority")."""
    path = "/" + str(tmp_path / "double.db")
    store = bide.open_store(f"sqlite:///{path}")
    try:
        assert bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("r", "hi").answer == "hi"
    finally:
        store.close()
    again = bide.open_store(f"sqlite:///{path}", create=False)
    try:
        assert bide.run_status(again, "r").status == "completed"
    finally:
        again.close()


def test_a_store_found_gone_stays_gone_though_a_restored_file_gets_its_inode_back(tmp_path: Path) -> None:
    """Once the old file is closed its inode number is free: a copy restored at the path may get it back
    (ext4 does at the first try), and the store object that had refused wrote into the restored file."""
    path = tmp_path / "bide.db"
    store = bide.open_store(f"sqlite:///{path}")
    try:
        store.insert_many("r", [("k0", b"x")])
        shutil.copyfile(path, tmp_path / "backup.db")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        with pytest.raises(bide.StoreError, match="deleted or moved away"):
            store.insert_many("r", [("k1", b"x")])
        for _ in range(20):  # a restore that gets the old inode number, as ext4 gives it
            shutil.copyfile(tmp_path / "backup.db", path)
            with pytest.raises(bide.StoreError, match="deleted or moved away"):
                store.insert_many("r", [("k2", b"x")])
            path.unlink()
    finally:
        store.close()


def test_a_batch_that_committed_into_the_old_file_is_told_so_and_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three writes of one transaction: the file is moved away while they commit (after the check before
    the commit). Each was told "nothing more is written" after the batch was run again request by request
    (which the check before the commit refused); each is told its write went into the old file."""
    path = tmp_path / "bide.db"
    store = bide.open_store(f"sqlite:///{path}")
    real = OpenedFile.swapped
    armed = [False]

    def moved_during_the_commit(self: OpenedFile, *connection: dict[str, object] | None) -> str | None:
        found = real(self, *connection)
        if armed[0] and found is None:
            armed[0] = False
            path.rename(tmp_path / "moved.db")
        return found

    async def three_writes() -> list[object]:
        await store.ainsert_many("warm", [("k", b"x")])
        armed[0] = True
        writes = (store.ainsert_many(f"r{i}", [("k", b"x")]) for i in range(3))
        return await asyncio.gather(*writes, return_exceptions=True)

    monkeypatch.setattr(OpenedFile, "swapped", moved_during_the_commit)
    try:
        answers = asyncio.run(three_writes())
    finally:
        store.close()
    assert all(isinstance(a, bide.StoreError) and "committed into the old file" in str(a) for a in answers)


@pytest.mark.parametrize("opened_by", ["its path", "a link to the file", "a link to its directory"])
def test_a_write_ahead_log_deleted_under_the_store_refuses_the_next_write(
    tmp_path: Path, opened_by: str
) -> None:
    """Commits went on into the unlinked -wal file, reported as done, and were lost at the next crash. Opened
    through a symbolic link to the file, the store watched "<link>-wal" while SQLite wrote "<file>-wal"
    beside the file: the deletion went unnoticed, and a side effect's attempt marker with it."""
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "bide.db"
    bide.open_store(f"sqlite:///{path}").close()
    opened = path
    if opened_by == "a link to the file":
        opened = tmp_path / "link.db"
        opened.symlink_to(path)
    elif opened_by == "a link to its directory":
        (tmp_path / "linked").symlink_to(tmp_path / "data")
        opened = tmp_path / "linked" / "bide.db"
    store = bide.open_store(f"sqlite:///{opened}")
    try:
        store.insert_many("r", [("k0", b"x")])
        Path(f"{path}-wal").unlink()
        with pytest.raises(bide.StoreError, match=r"write-ahead log .*data/bide\.db-wal' .* was deleted"):
            store.insert_many("r", [("k1", b"x")])
    finally:
        store.close()


def test_an_idle_worker_notices_its_store_file_moved_away(tmp_path: Path) -> None:
    """A worker with nothing to drive only lists runs, and listings did not look at the path: it went on
    reading the moved file while runs waited in a new one at the path, and logged nothing."""
    path = tmp_path / "bide.db"
    store = bide.open_store(f"sqlite:///{path}")
    _warm(store)
    worker = bide.Worker(store, bide.Agent(ScriptedModel([reply("hi")]), store=store))
    assert asyncio.run(worker.run_once()).driven == 0
    os.rename(path, tmp_path / "moved.db")
    with pytest.raises(ExceptionGroup) as failed:
        asyncio.run(worker.run_once())
    [error] = failed.value.exceptions
    assert isinstance(error, bide.StoreError) and "was deleted or moved away" in str(error)
    with pytest.raises(bide.StoreError, match="moved away"):
        store.runs()
    assert not path.exists()  # nothing was created at the path
    store.close()


def test_a_serving_worker_whose_store_file_moved_away_stops_with_the_error(tmp_path: Path) -> None:
    """It logged "retrying in 1.0 s", then 2, 4 ... 300 s, for ever: the store object fails every request
    alike once its file is gone, so the worker never recovered, and stayed up where a supervisor could not
    see it was dead. It stops and raises the store's lasting error."""
    path = tmp_path / "bide.db"
    store = bide.open_store(f"sqlite:///{path}")
    _warm(store)
    worker = bide.Worker(store, bide.Agent(ScriptedModel([reply("hi")]), store=store), poll_interval=0.05)

    async def serve() -> None:
        serving = asyncio.create_task(worker.run_forever())
        await asyncio.sleep(0.2)
        os.rename(path, tmp_path / "moved.db")
        await asyncio.wait_for(serving, 60)  # a bound for a failing test only: it stops at its next listing

    try:
        with pytest.raises(bide.StoreError, match="was deleted or moved away") as failed:
            asyncio.run(serve())
        assert failed.value.lasting
    finally:
        store.close()
    assert not path.exists()


def test_bide_worker_exits_6_when_its_store_file_is_replaced(tmp_path: Path) -> None:
    """The command: a restored backup renamed over the store it serves ends it with exit 6 and the store's
    words, for a supervisor to restart it on the file now there."""
    path = tmp_path / "bide.db"
    bide.open_store(f"sqlite:///{path}").close()
    (tmp_path / "app.py").write_text(
        "import bide\nfrom bide.testing import ScriptedModel, reply\n\n\n"
        "def build(store):\n    return bide.Agent(ScriptedModel([reply('hi')]), store=store)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[2])])
    worker = subprocess.Popen(
        [sys.executable, "-m", "bide._cli", "worker", "--store", f"sqlite:///{path}", "--app", "app:build",
         "--poll", "0.1"],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert worker.stderr is not None
        assert "bide worker: serving" in worker.stderr.readline()
        shutil.copy(path, tmp_path / "backup.db")
        os.rename(tmp_path / "backup.db", path)
        _, errors = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 6, errors
    assert "was replaced by another file while this process had it open" in errors


def test_a_store_file_with_another_name_is_refused_by_both_names(tmp_path: Path) -> None:
    """A hard link: SQLite names the write-ahead log after the path a file is opened by, so a process that
    opened the other name missed an attempt marker still in the first name's log and fired the side effect
    again; the stale log, played later over the other name's commits, took a finished run back to halted.
    Both names are refused, and nothing is written through either."""
    import govern

    first = tmp_path / "a.db"
    bide.open_store(f"sqlite:///{first}").close()
    os.link(first, tmp_path / "b.db")
    before = first.read_bytes()
    for name in ("a.db", "b.db"):
        with pytest.raises(bide.StoreError, match="has 2 names \\(hard links to one file\\)") as refused:
            bide.open_store(f"sqlite:///{tmp_path / name}")
        assert refused.value.lasting
        with pytest.raises(govern.EventLogError, match="has 2 names"):
            govern.EventLog(f"sqlite:///{tmp_path / name}")
    assert first.read_bytes() == before and not Path(f"{first}-wal").exists()
    (tmp_path / "b.db").unlink()
    bide.open_store(f"sqlite:///{first}").close()  # one name again: it opens
