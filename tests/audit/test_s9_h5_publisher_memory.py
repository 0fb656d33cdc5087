"""What a long-lived `DirectoryPublisher` remembers of the runs it published: a file named like a head that
is not one was parsed again at every anchoring (it is now remembered, as the heads are: a file there is never
rewritten), and every run ever published was remembered for the life of the process (now the most
recently published ones, `_KNOWN_KEPT`; a run forgotten is compared in full next time, so a fork of it is
still refused)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import bide
import bide.audit._anchor as anchor_module
import bide.audit._strict as strict_module
from bide.audit import AnchorError, AuditLog, DirectoryPublisher, SigningKey

from .conftest import write_run


def _note(store: bide.Store, run_id: str, key: str) -> None:
    bide.Journal(store, run_id).load().write([bide.GateRecord(key=key, data="x")])


def test_a_file_named_like_a_head_that_is_not_one_is_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        publisher = DirectoryPublisher(anchor)
        log = AuditLog(store, SigningKey.generate(), publisher)
        write_run(store, "r1", 1)
        log.sign_head("r1")
        junk = "00000000000000000001-1.json"
        (publisher.path_for_log("r1") / junk).write_text("not a head\n")
        parsed: list[str] = []
        real = strict_module.parse_artifact

        def counting(kind: Any, data: bytes, *, what: str) -> Any:
            parsed.append(what)
            return real(kind, data, what=what)

        monkeypatch.setattr(strict_module, "parse_artifact", counting)
        for i in range(3):
            _note(store, "r1", f"approval:more:{i}")
            log.sign_head("r1")
        assert parsed.count(junk) == 1, parsed
        assert len(list(publisher.path_for_log("r1").glob("*.json"))) == 5  # 4 heads and the junk
    finally:
        store.close()


def test_a_publisher_remembers_only_its_most_recent_runs_and_compares_a_forgotten_one_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(anchor_module, "_KNOWN_KEPT", 3, raising=False)
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    db = tmp_path / "runs.db"
    store = bide.open_store(f"sqlite:///{db}")
    try:
        publisher = DirectoryPublisher(anchor)
        log = AuditLog(store, SigningKey.generate(), publisher)
        runs = [f"r{i}" for i in range(6)]
        for run_id in runs:
            write_run(store, run_id, 1)
            log.sign_head(run_id)
        assert [log_id for log_id, _ in publisher._known] == runs[-3:]
    finally:
        store.close()
    # r0, forgotten, rewritten behind bide (a record edited, its tree rebuilt): its next head is refused.
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE bide_records SET data = CAST(REPLACE(CAST(data AS TEXT), '{\"i\":0}', '{\"i\":9}') "
            "AS BLOB) WHERE run_id = 'r0' AND key = 'approval:note:0'"
        )
        conn.execute("DELETE FROM bide_audit_tiles WHERE run_id = 'r0'")
        conn.execute("DELETE FROM bide_audit_tile_trees WHERE run_id = 'r0'")
    store = bide.open_store(f"sqlite:///{db}")
    try:
        log = AuditLog(store, log.key, publisher)
        _note(store, "r0", "approval:later")
        with pytest.raises(AnchorError, match="forks from a head of the same run and key"):
            log.sign_head("r0")
    finally:
        store.close()
