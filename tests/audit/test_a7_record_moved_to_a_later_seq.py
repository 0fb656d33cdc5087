"""`bide-audit export` of a store in which a record was moved by hand to a later seq: the refusal counted the
moved record twice ("holds 5 records where its audit tree has 6"; the tree had 5) because the export's sync
had taken it into the tree a second time, and that sync was written to the audit tables before the refusal.
The refusal now counts the tree as it was, names the moved record, and writes nothing anywhere."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from .test_export_edges import _store, audit


def _audit_tables(db: Path) -> list[object]:
    with sqlite3.connect(db) as conn:
        trees = conn.execute("SELECT * FROM bide_audit_tile_trees ORDER BY run_id").fetchall()
        tiles = conn.execute("SELECT * FROM bide_audit_tiles ORDER BY 1, 2, 3").fetchall()
    return [trees, tiles]


@pytest.mark.parametrize("moved", ["approval:note:2", "approval:note:0"])  # the last record, one inside
def test_a_record_moved_to_a_later_seq_is_counted_once_and_the_refusal_writes_nothing(
    tmp_path: Path, moved: str
) -> None:
    url = _store(tmp_path)  # run r1: header, start, notes 0 to 2 (5 records)
    base = ["export", "--store", url, "--run", "r1", "--key", "log.key"]
    assert audit(*base, "--head", "-o", "then.json", cwd=tmp_path).returncode == 0
    db = tmp_path / "runs.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("UPDATE bide_records SET seq = 99 WHERE run_id = 'r1' AND key = ?",
                            (moved,)).rowcount == 1  # fmt: skip
    tables = _audit_tables(db)
    (tmp_path / "anchors").mkdir()
    exports = [
        ["--head", "-o", "now.json", "--anchor-dir", "anchors"],
        ["-o", "evidence.json", "--anchor-dir", "anchors"],
        ["--record", "approval:note:1", "-o", "bundle.json"],
        ["--consistency-from", "2", "-o", "proof.json"],
    ]
    for options in exports:
        done = audit(*base, *options, cwd=tmp_path)
        assert done.returncode == 1, (options, done.stdout + done.stderr)
        assert "holds 4 records up to seq" in done.stderr and "where its audit tree has 5 " in done.stderr, (
            done.stderr
        )
        assert f"'{moved}', the tree's record" in done.stderr and "is now at seq 99" in done.stderr
        assert "has 6" not in done.stderr
        assert _audit_tables(db) == tables, options  # the refusal wrote nothing to the audit tables
    assert not list((tmp_path / "anchors").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".json") == ["then.json"]
