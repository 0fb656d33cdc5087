"""`bide-audit export` and what lies past its audit tree or in its anchor directory.

A record put behind bide after the tree's last seq (not a record at all, or a copy of one under a new key)
was refused only after the export's sync had taken it into the audit tables: once the edit was undone,
every export refused the journal until the tree was rebuilt. The records past the tree are now checked
before it takes them in. A FIFO planted as the anchor directory's lock file, which the exporting user may
only read, made the export wait for a writer for ever; and a lock file made under a umask of 077 could not
be taken over by another user's export."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide.audit._cli import _ANCHOR_LOCK_FILE, _RecordingPublisher

from .test_a7_record_moved_to_a_later_seq import _audit_tables
from .test_export_edges import REPO, _store, audit

# Root passes over file modes: the export runs without the capabilities that let it, as another user.
WITHOUT_ROOTS_REACH = ["capsh", "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--", "-c",
                       'exec "$@"', "--"]  # fmt: skip

_A_COPY = "(SELECT data FROM bide_records WHERE run_id = 'r1' AND key = 'approval:note:1')"
PAST_THE_TREE = {
    "not a record": ("approval:junk", "X'7B7D'"),  # b'{}'
    "not UTF-8": ("approval:junk", "X'FFFE00'"),
    "a copy under a new key": ("approval:copy", _A_COPY),
}


@pytest.mark.parametrize("edit", sorted(PAST_THE_TREE))
def test_a_bad_record_past_the_tree_is_refused_before_the_tree_takes_it_in(tmp_path: Path, edit: str) -> None:
    url = _store(tmp_path)  # run r1: header, start, notes 0 to 2 (5 records)
    base = ["export", "--store", url, "--run", "r1", "--key", "log.key", "--head"]
    assert audit(*base, "-o", "then.json", cwd=tmp_path).returncode == 0
    db = tmp_path / "runs.db"
    tables = _audit_tables(db)
    key, data = PAST_THE_TREE[edit]
    with sqlite3.connect(db) as conn:
        conn.execute(f"INSERT INTO bide_records(seq, run_id, key, data) VALUES (99, 'r1', ?, {data})", (key,))
    refused = audit(*base, "-o", "refused.json", cwd=tmp_path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"record 5 of the journal of run 'r1' ('{key}')" in refused.stderr, refused.stderr
    assert _audit_tables(db) == tables  # the refusal wrote nothing to the audit tables
    assert not (tmp_path / "refused.json").exists()
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM bide_records WHERE key = ?", (key,))
    # The edit undone, the journal is the tree's again.
    again = audit(*base, "-o", "again.json", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _audit_tables(db) == tables


def test_good_records_past_the_tree_are_taken_in_by_the_check(tmp_path: Path) -> None:
    url = _store(tmp_path)
    base = ["export", "--store", url, "--run", "r1", "--key", "log.key", "--head"]
    assert audit(*base, "-o", "then.json", cwd=tmp_path).returncode == 0
    store = bide.open_store(url)  # not audited: the tree is behind the journal
    try:
        journal = bide.Journal(store, "r1").load()
        journal.write([bide.GateRecord(key="approval:note:3", data={"i": 3})])
    finally:
        store.close()
    done = audit(*base, "-o", "now.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "at 6 records" in done.stdout, done.stdout


def _as_another_user(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    wrap = WITHOUT_ROOTS_REACH if os.geteuid() == 0 else []
    assert not wrap or shutil.which("capsh"), "make test installs capsh (libcap2-bin)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [*wrap, sys.executable, "-m", "bide.audit._cli", *args]
    # Generous: an export takes a second or two; the one that hung never ended at all.
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=90)


def test_a_fifo_planted_as_the_lock_file_does_not_hang_the_export(tmp_path: Path) -> None:
    url = _store(tmp_path)
    tmp_path.chmod(0o777)
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    anchor.chmod(0o777)
    os.mkfifo(anchor / _ANCHOR_LOCK_FILE, 0o444)  # readable only: opened to read, it waits for a writer
    if os.geteuid() == 0:
        os.chown(anchor / _ANCHOR_LOCK_FILE, 12345, 12345)
    try:
        done = _as_another_user("export", "--store", url, "--run", "r1", "--key", "log.key", "--head", "-o",
                                "head.json", "--anchor-dir", "anchor", cwd=tmp_path)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the export still waited on the FIFO after 90 s")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Published its signed head (5 records)" in done.stdout, done.stdout
    assert "could not be locked" not in done.stdout  # the directory's own lock was taken
    assert (anchor / _ANCHOR_LOCK_FILE).exists()  # not removed: not the export's


def test_the_lock_file_is_readable_by_every_user_whatever_the_umask(tmp_path: Path) -> None:
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    before = os.umask(0o077)
    try:
        with _RecordingPublisher(anchor, tmp_path / "out.json").exclusive():
            mode = (anchor / _ANCHOR_LOCK_FILE).stat().st_mode & 0o777
    finally:
        os.umask(before)
    # Another user's export can open it to lock it (a lock file left by a killed export is taken over).
    assert mode == 0o644, oct(mode)
    assert not (anchor / _ANCHOR_LOCK_FILE).exists()
