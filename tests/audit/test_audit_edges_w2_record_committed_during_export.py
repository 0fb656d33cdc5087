"""`bide-audit export --record KEY` of a record a second process commits while the export runs. The
export looked the record up in the store after it had read (and checked) the journal it signs: a record
committed between the two was found, and then not found under the head, so the export failed as a usage
error (exit 2) saying the run "has no record ... under a head of N records", a record `bide show` lists.
The record is now looked up first: one found is among the records checked, signed and proven; one
committed after the look-up is "no record" (exit 4), as it was when asked; and a proof is never made
against a head that does not hold the record (exit 7, "not yet", nothing written or published)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bide

from .conftest import write_run

REPO = Path(__file__).resolve().parents[2]

# `bide-audit ARGV` with the store's look-up of the record wrapped: a second process commits record
# `approval:late` to the run just before the look-up (`before`) or just after it (`after`); `short` also has
# the journal's check report one record fewer than it read, as a store whose commits became visible out of
# order could (the record, the last, left out of the head).
EXPORT_DURING_A_COMMIT = """
import subprocess, sys
import bide._open
from bide.audit import _cli
from bide.audit._log import AuditLog

when, url = sys.argv[1], sys.argv[2]
APPEND = (
    "import sys, bide; s = bide.open_store(sys.argv[1]); "
    "bide.Journal(s, 'r').load().write([bide.GateRecord(key='approval:late', data='x')]); s.close()"
)
opened, checked = bide._open.open_store, AuditLog.check_journal

def commit():
    subprocess.run([sys.executable, "-c", APPEND, url], check=True)

def open_store(*args, **kwargs):
    store = opened(*args, **kwargs)
    looked_up = store.get

    def get(run_id, key):
        if key == "approval:late" and when in ("before", "short"):
            commit()
        found = looked_up(run_id, key)
        if key == "approval:late" and when == "after":
            commit()
        return found

    store.get = get
    return store

def check_journal(self, run_id):
    size = checked(self, run_id)
    return size - 1 if when == "short" else size

bide._open.open_store, AuditLog.check_journal = open_store, check_journal
sys.exit(_cli.main(sys.argv[3:]))
"""


def export_during_a_commit(when: str, url: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", EXPORT_DURING_A_COMMIT, when, url, "export", "--store", url, *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def audit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "bide.audit._cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store with run `r` (a header, a start and 3 notes: 5 records) and a log key `log.key`."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url)
    try:
        write_run(store, "r", 3)
    finally:
        store.close()
    assert audit("keygen", "log.key", cwd=tmp_path).returncode == 0
    (tmp_path / "anchors").mkdir()
    return url


def record_keys(url: str) -> list[str]:
    store = bide.open_store(url)
    try:
        return [e.key for e in store.load("r")]
    finally:
        store.close()


EXPORT = (
    "--run", "r", "--key", "log.key", "--record", "approval:late", "-o", "b.json", "--anchor-dir", "anchors"
)  # fmt: skip


def test_a_record_committed_after_it_was_looked_up_is_not_there_yet_and_nothing_is_written(
    tmp_path: Path, url: str
) -> None:
    done = export_during_a_commit("after", url, *EXPORT, "--json", cwd=tmp_path)
    assert "approval:late" in record_keys(url)  # the second process did commit it, during the export
    report = json.loads(done.stdout)
    assert done.returncode == 4 and report["exit_code"] == 4, done.stdout + done.stderr
    assert report["result"] == "unusable_input" and "has no record 'approval:late'" in report["message"]
    assert "under a head" not in report["message"]
    assert not (tmp_path / "b.json").exists() and not list((tmp_path / "anchors").iterdir())
    # Asked again, it is there: proven under a head that holds it.
    again = audit("export", "--store", url, *EXPORT[:-2], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    bundle = json.loads((tmp_path / "b.json").read_text())
    assert bundle["inclusion"]["index"] == 5 and bundle["sth"]["size"] == 6
    assert audit("verify", "b.json", "--pubkey", "log.key.pub", cwd=tmp_path).returncode == 0


def test_a_record_committed_during_the_export_before_its_look_up_is_proven_under_a_head_holding_it(
    tmp_path: Path, url: str
) -> None:
    done = export_during_a_commit("before", url, *EXPORT, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    bundle = json.loads((tmp_path / "b.json").read_text())
    assert bundle["inclusion"] == {**bundle["inclusion"], "index": 5, "size": 6}
    assert bundle["sth"]["size"] == 6
    [anchored] = [p for p in (tmp_path / "anchors").rglob("*") if p.is_file()]
    assert json.loads(anchored.read_text())["size"] == 6
    verified = audit("verify", "b.json", "--pubkey", "log.key.pub", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_record_the_signed_head_does_not_hold_is_refused_as_not_yet_and_nothing_is_written(
    tmp_path: Path, url: str
) -> None:
    """The look-up found the record, but the journal the head is signed over held one record fewer: no
    proof against that head (it does not hold the record), no usage error either: run it again."""
    done = export_during_a_commit("short", url, *EXPORT, cwd=tmp_path)
    assert done.returncode == 7, done.stdout + done.stderr
    assert done.stderr.startswith("NOT YET: record 'approval:late' of run 'r' is not among the 5 records")
    assert "committed while the export ran" in done.stderr and "run the export again" in done.stderr
    assert not (tmp_path / "b.json").exists() and not list((tmp_path / "anchors").iterdir())
    as_json = export_during_a_commit("short", url, *EXPORT, "--json", cwd=tmp_path)
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 7 and report["exit_code"] == 7, as_json.stdout + as_json.stderr
    assert report["result"] == "not_yet" and report["reason"] == "not yet"


def test_prove_under_a_head_that_predates_the_record_says_so_and_makes_no_proof() -> None:
    from bide._errors import ConfigError
    from bide.audit import AuditLog, SigningKey
    from bide.audit._errors import RecordPastHead

    store = bide.MemoryStore()
    write_run(store, "r", 1)
    log = AuditLog(store, SigningKey.generate())
    older = log.sign_head("r")
    bide.Journal(store, "r").load().write([bide.GateRecord(key="approval:late", data="x")])
    with pytest.raises(RecordPastHead, match=r"committed after its head of 3 records"):
        log.prove("r", "approval:late", older)
    with pytest.raises(ConfigError) as missing:
        log.prove("r", "approval:never", older)
    assert not isinstance(missing.value, RecordPastHead)
    assert log.prove("r", "approval:late").inclusion.index == 3
