"""A long-lived `AuditedStore` kept the right edge of the tree it last wrote and reused it whenever the
stored tree's (size, last seq) was still what it had written. A journal rewritten meanwhile (edited, or the
run deleted and started again) and its tree rebuilt by another process to that same size and last seq went
unseen: the live process wrote its old tiles back over the rebuilt tree and signed heads extending the old
history, which the fork check let through, and the next export found the tree damaged. The live process now
compares the stored partial tiles with its copy at each append: it extends the rebuilt tree, whose heads
fork from the anchored ones and are refused (`ForkRefused`), and the tree stays the journal's."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from pg_tables import drop_prefixed_tables

import bide
from bide.audit import AuditedStore, AuditLog, DirectoryPublisher, SigningKey

from .conftest import POSTGRES_URL, write_run

pytestmark = pytest.mark.slow  # runs processes

REPO = Path(__file__).resolve().parents[2]

# Another process, with its own audited store on the same run: what an export or a restarted run does.
_OTHER = """
import sys, bide
from bide.audit import AuditedStore, AuditLog, DirectoryPublisher, load_signing_key
url, prefix, key, anchor, restart = sys.argv[1:6]
s = bide.open_store(url, table_prefix=prefix)
s = AuditedStore(s, AuditLog(s, load_signing_key(key), DirectoryPublisher(anchor)))
if restart == "yes":
    j = bide.Journal(s, "r1").load()
    j.write([bide.Start(key="run:start", entry="agent:test", input="again")])
    for i in range(3):
        j.write([bide.GateRecord(key=f"approval:new:{i}", data="o")])
else:
    s.log.sync("r1")
print(sorted({type(e).__name__ for e in s.errors}))
s.close()
"""


def _other(url: str, prefix: str, key: Path, anchor: Path, restart: bool) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [url, prefix, str(key), str(anchor), "yes" if restart else "no"]
    done = subprocess.run(
        [sys.executable, "-c", _OTHER, *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _check_live_store(
    url: str, prefix: str, tmp_path: Path, rewrite: Callable[[], None], restart: bool
) -> None:
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    key = SigningKey.generate()
    key_file = tmp_path / "key"
    key_file.write_bytes(key.pem())
    key_file.chmod(0o600)
    inner = bide.open_store(url, table_prefix=prefix)
    live = AuditedStore(inner, AuditLog(inner, key, DirectoryPublisher(anchor)))
    try:
        write_run(live, "r1", 3)  # 5 records, each head anchored
        assert live.errors == []
        anchored = sorted(anchor.rglob("*.json"))
        rewrite()
        # The tree rebuilt elsewhere to the size and last seq the live store last wrote.
        _other(url, prefix, key_file, anchor, restart)
        for i in range(2):
            bide.Journal(live, "r1").load().write([bide.GateRecord(key=f"approval:live:{i}", data=i)])
        assert [type(e).__name__ for e in live.errors] == ["ForkRefused", "ForkRefused"], live.errors
        assert sorted(anchor.rglob("*.json")) == anchored  # nothing of the new history published
    finally:
        live.close()
    # The tree is still the journal's: an export signs a head over it.
    done = subprocess.run(
        [sys.executable, "-m", "bide.audit._cli", "export", "--store", url, "--table-prefix", prefix,
         "--run", "r1", "--key", str(key_file), "--head", "-o", str(tmp_path / "head.json")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _sqlite_rewrite(db: Path, restart: bool) -> Callable[[], None]:
    def rewrite() -> None:
        with sqlite3.connect(db) as conn:
            if restart:  # the run deleted (records and tree); it starts again under the same id
                conn.execute("DELETE FROM bide_records WHERE run_id = 'r1'")
            else:  # a record edited by hand
                conn.execute(
                    "UPDATE bide_records SET data = CAST(REPLACE(CAST(data AS TEXT), '{\"i\":0}', "
                    "'{\"i\":9}') AS BLOB) WHERE run_id = 'r1' AND key = 'approval:note:0'"
                )
            conn.execute("DELETE FROM bide_audit_tiles WHERE run_id = 'r1'")
            conn.execute("DELETE FROM bide_audit_tile_trees WHERE run_id = 'r1'")

    return rewrite


@pytest.mark.parametrize("restart", [False, True], ids=["edited", "restarted"])
def test_a_live_sqlite_store_refuses_the_history_of_a_tree_rebuilt_to_the_same_size(
    tmp_path: Path, restart: bool
) -> None:
    db = tmp_path / "runs.db"
    _check_live_store(f"sqlite:///{db}", "bide_", tmp_path, _sqlite_rewrite(db, restart), restart)


def test_a_live_postgres_store_refuses_the_history_of_a_tree_rebuilt_to_the_same_size(tmp_path: Path) -> None:
    prefix = f"h5{uuid.uuid4().hex[:10]}_"
    engine = sa.create_engine(POSTGRES_URL, poolclass=sa.NullPool)

    def rewrite() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"UPDATE {prefix}records SET data = convert_to(replace(convert_from(data, 'UTF8'), "
                f"'{{\"i\":0}}', '{{\"i\":9}}'), 'UTF8') WHERE run_id = 'r1' AND key = 'approval:note:0'"
            )
            conn.exec_driver_sql(f"DELETE FROM {prefix}audit_tiles WHERE run_id = 'r1'")
            conn.exec_driver_sql(f"DELETE FROM {prefix}audit_tile_trees WHERE run_id = 'r1'")

    try:
        _check_live_store(POSTGRES_URL, prefix, tmp_path, rewrite, restart=False)
    finally:
        drop_prefixed_tables(engine, prefix)
        engine.dispose()
