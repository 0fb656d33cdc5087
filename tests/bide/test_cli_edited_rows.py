"""Rows edited in the database by hand, seen through the operator commands: a run id bide never writes (a
control character) and a record whose value SQLite holds as TEXT are one unreadable run, named on stderr
(sanitized), while the other runs are still listed and the command exits 4 (docs/cli.md); the worker skips
such a run, and its log lines are sanitized like every other output."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide.testing import Fail, ScriptedModel, call, reply

ROOT = Path(__file__).resolve().parents[2]
EVIL = "evil\x1b[2J"

APP = """
import bide
from bide.testing import ScriptedModel, reply


def build(store):
    return bide.Agent(ScriptedModel([reply("ok")] * 5), store=store)
"""


@bide.tool(safety=bide.ReadOnly)
def look(q: str) -> str:
    """Look something up."""
    return q


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "bide._cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def runs(path: Path, *run_ids: str) -> None:
    store = bide.open_store(f"sqlite:///{path}")
    for run_id in run_ids:
        bide.Agent(ScriptedModel([reply("ok")]), store=store).run_sync(run_id, "hi")
    store.close()


def test_a_run_id_with_a_control_character_is_one_unreadable_run_and_the_worker_skips_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    runs(db, "good-1")
    store = bide.open_store(f"sqlite:///{db}")
    script = [call("look", q="a"), Fail(bide.ModelError("the model is down"))]
    with pytest.raises(bide.ModelError):  # left open: a worker would resume it
        bide.Agent(ScriptedModel(script), store=store, tools=[look]).run_sync("evil-1", "hi")
    store.close()
    with sqlite3.connect(db) as conn:
        for table in ("bide_records", "bide_runs"):
            conn.execute(f"UPDATE {table} SET run_id = ? WHERE run_id = 'evil-1'", (EVIL,))
    listed = cli("runs", "--store", str(db), "--json", cwd=tmp_path)
    assert listed.returncode == 4, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)["listed"]] == ["good-1"]
    pending = cli("pending", "--store", str(db), cwd=tmp_path)  # lists the open runs: the edited one too
    assert pending.returncode == 4 and "\x1b" not in pending.stderr + pending.stdout
    assert "run 'evil\\x1b[2J' cannot be read" in listed.stderr and "\x1b" not in listed.stderr

    (tmp_path / "editedapp.py").write_text(APP)
    worked = cli("worker", "--store", str(db), "--app", "editedapp:build", "--once", "--json", cwd=tmp_path)
    assert worked.returncode == 4, worked.stderr
    report = json.loads(worked.stdout)
    assert report["skipped"] == 1 and report["failed"] == 0
    assert list(report["unresumable"]) == [EVIL]  # escaped by JSON
    assert "run evil\\x1b[2J not resumed" in worked.stderr  # the log line, sanitized
    assert "\x1b" not in worked.stderr


def test_a_record_edited_as_text_is_read_as_its_bytes(tmp_path: Path) -> None:
    """sqlite3's replace() turns a BLOB into TEXT: the store read it as a store failure (exit 6, nothing
    listed). Read as its bytes, a damaged one is named and the others are listed; an intact one reads."""
    db = tmp_path / "runs.db"
    runs(db, "a", "b", "c")
    with sqlite3.connect(db) as conn:
        edit = "UPDATE bide_records SET data = replace(data, ?, ?) WHERE run_id = ? AND key = 'run:end'"
        conn.execute(edit, ('"ok"', '"ok', "a"))  # no longer JSON
        conn.execute(edit, ('"ok"', '"OK"', "c"))  # still a record (an edit only the audit log can reveal)
        kinds = conn.execute(
            "SELECT DISTINCT typeof(data) FROM bide_records WHERE key = 'run:end'"
        ).fetchall()
        assert sorted(kinds) == [("blob",), ("text",)]
    listed = cli("runs", "--store", str(db), "--json", cwd=tmp_path)
    assert listed.returncode == 4, listed.stderr
    assert sorted(r["run_id"] for r in json.loads(listed.stdout)["listed"]) == ["b", "c"]
    assert "run 'a' cannot be read: its record 'run:end'" in listed.stderr and "not JSON" in listed.stderr
    shown = cli("show", "a", "--store", str(db), "--json", cwd=tmp_path)
    assert shown.returncode == 4 and json.loads(shown.stdout)["reason"] == "unreadable"  # not "not found"
    store = bide.open_store(f"sqlite:///{db}")
    try:
        assert bide.Agent(ScriptedModel([]), store=store).run_sync("c", "hi").answer == "OK"
    finally:
        store.close()


def test_a_table_prefix_in_another_case_finds_the_store_as_sqlite_does(tmp_path: Path) -> None:
    """SQLite matches table names whatever their ASCII case: `--table-prefix BIDE_` reads the tables
    `bide_*` (it said "the database has no table BIDE_records" while every query would have found them)."""
    db = tmp_path / "runs.db"
    runs(db, "a")
    listed = cli("runs", "--store", str(db), "--table-prefix", "BIDE_", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ["a"]
    other = cli("runs", "--store", str(db), "--table-prefix", "other_", "--json", cwd=tmp_path)
    assert other.returncode == 4 and "no table other_records" in other.stderr


def test_a_record_nested_too_deeply_is_a_damaged_record_not_a_crash(tmp_path: Path) -> None:
    """JSON nested past what the interpreter decodes raised RecursionError out of the decoder: every command
    crashed ("internal error", exit 3) and `bide runs` listed nothing. It is one damaged record now."""
    db = tmp_path / "runs.db"
    runs(db, "a", "b")
    deep = b'{"answer":' + b"[" * 100_000 + b"]" * 100_000 + b',"key":"run:end","kind":"end","salt":"x"}'
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE bide_records SET data = ? WHERE run_id = 'a' AND key = 'run:end'", (deep,))
    listed = cli("runs", "--store", str(db), "--json", cwd=tmp_path)
    assert listed.returncode == 4, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)["listed"]] == ["b"]
    assert "its record 'run:end'" in listed.stderr and "nested too deeply" in listed.stderr
    shown = cli("show", "a", "--store", str(db), "--json", cwd=tmp_path)
    assert shown.returncode == 4 and json.loads(shown.stdout)["reason"] == "unreadable"
    store = bide.open_store(f"sqlite:///{db}")
    try:
        with pytest.raises(bide.RecordDamaged, match="nested too deeply"):
            bide.Journal(store, "a").load()
    finally:
        store.close()
