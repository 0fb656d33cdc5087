"""`bide-audit export` at edges a tester found: a `--consistency-from` past the end of a journal that lost
records was called "sizes reversed" (a usage error); `--anchor-dir` published a head that forks from one
already anchored there; and the verifier of docs/audit.md ("Write your own verifier") accepted a record at
a position outside the signed tree."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import bide
from bide.audit import AuditLog, JournalDamaged, SigningKey, sign_head
from bide.audit._anchor import AnchorError, DirectoryPublisher

from .conftest import write_run

pytestmark = pytest.mark.slow  # the commands run as processes

REPO = Path(__file__).resolve().parents[2]


def audit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "bide.audit._cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def _store(tmp_path: Path, *runs: str) -> str:
    """A SQLite store `runs.db` holding each of `runs` (5 records: header, start, 3 gate records) and a
    signing key `log.key`; its URL."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url)
    try:
        for run in runs:
            write_run(store, run, 3)
    finally:
        store.close()
    assert audit("keygen", "log.key", cwd=tmp_path).returncode == 0
    return url


def _sql(tmp_path: Path, *statements: str) -> None:
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        for statement in statements:
            conn.execute(statement)


# What export's refusal of an edited journal advises: have the tree rebuilt from the journal.
DROP_TREE = ("DELETE FROM bide_audit_tiles", "DELETE FROM bide_audit_tile_trees")
CUT_TWO = "DELETE FROM bide_records WHERE run_id = 'r1' AND key IN ('approval:note:1', 'approval:note:2')"
EDIT = (
    "UPDATE bide_records SET data = CAST(REPLACE(CAST(data AS TEXT), '{\"i\":0}', '{\"i\":9}') AS BLOB) "
    "WHERE run_id = 'r1' AND key = 'approval:note:0'"
)


def _append(url: str, key: str) -> None:
    store = bide.open_store(url)
    try:
        bide.Journal(store, "r1").load().write([bide.GateRecord(key=key, data="x")])
    finally:
        store.close()


def _anchored(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "anchor").rglob("*.json"))


# --- --consistency-from past the journal's end --------------------------------------------------------


def test_consistency_from_a_size_the_journal_no_longer_holds_says_records_are_missing(tmp_path: Path) -> None:
    """A head of 5 records, then 2 records deleted behind bide (and the tree rebuilt): `export
    --consistency-from 5` said "cannot prove 5 -> 3: the sizes are reversed" (exit 2, usage), sizes the
    user never gave. The journal lost records a head covered: not verified (exit 1)."""
    url = _store(tmp_path, "r1", "r2")
    base = ["--store", url, "--key", "log.key"]
    assert audit("export", *base, "--run", "r1", "--head", "-o", "head.json", cwd=tmp_path).returncode == 0
    _sql(tmp_path, CUT_TWO, *DROP_TREE)
    cut = audit("export", *base, "--run", "r1", "--consistency-from", "5", "-o", "proof.json", cwd=tmp_path)
    assert cut.returncode == 1, cut.stdout + cut.stderr
    assert cut.stderr.startswith("NOT VERIFIED: the journal of run 'r1' now holds 3 records, fewer than 5")
    assert "reversed" not in cut.stderr and "restore the store from a backup" in cut.stderr
    beyond = audit("export", *base, "--run", "r2", "--consistency-from", "99", "-o", "proof.json", "--json",
                   cwd=tmp_path)  # fmt: skip
    doc = json.loads(beyond.stdout)
    assert beyond.returncode == doc["exit_code"] == 1, beyond.stdout + beyond.stderr
    assert doc["result"] == "not_verified" and doc["reason"] == "not verified"
    assert "now holds 5 records, fewer than 99" in doc["message"] and "reversed" not in doc["message"]
    # The docs' recipe gives both sizes, the newer one a head's you hold: past the journal's end, records
    # are missing too (it was a usage error, "has 3 records; cannot prove 2 -> 5").
    both = audit("export", *base, "--run", "r1", "--consistency-from", "2", "--consistency-to", "5",
                 "-o", "proof.json", cwd=tmp_path)  # fmt: skip
    assert both.returncode == 1, both.stdout + both.stderr
    assert both.stderr.startswith("NOT VERIFIED: the journal of run 'r1' now holds 3 records, fewer than 5")
    # Reversed stays the word for sizes the user gave the wrong way round.
    swapped = audit("export", *base, "--run", "r2", "--consistency-from", "4", "--consistency-to", "2",
                    "-o", "proof.json", cwd=tmp_path)  # fmt: skip
    assert swapped.returncode == 2 and "the sizes are reversed" in swapped.stderr
    assert not (tmp_path / "proof.json").exists()


def test_the_library_says_the_same_for_a_proof_from_past_the_journals_end(tmp_path: Path) -> None:
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        write_run(store, "r1", 3)
        with pytest.raises(JournalDamaged, match="now holds 5 records, fewer than 99") as refused:
            AuditLog(store).consistency("r1", 99)
        assert "reversed" not in str(refused.value)
    finally:
        store.close()


# --- export --anchor-dir and the heads already anchored there -------------------------------------------


@pytest.mark.parametrize(
    ("grow", "why"),
    [
        (False, "it is of the same size, 5 records, with another root"),
        (True, "the journal's first 5 records are not the ones it covers"),
    ],
)
def test_export_refuses_to_anchor_a_head_that_forks_from_one_anchored(
    tmp_path: Path, grow: bool, why: str
) -> None:
    """A record edited behind bide, the tree rebuilt as export's refusal advises: the next export signed and
    published a head of the same size with another root (or a larger one that does not extend the anchored
    head) beside the anchored one, without a word: a fork signed by the log's key."""
    url = _store(tmp_path, "r1")
    (tmp_path / "anchor").mkdir()
    base = ["export", "--store", url, "--run", "r1", "--key", "log.key", "--anchor-dir", "anchor"]
    assert audit(*base, "-o", "ev1.json", cwd=tmp_path).returncode == 0
    [first] = _anchored(tmp_path)
    _sql(tmp_path, EDIT, *DROP_TREE)
    if grow:
        _append(url, "approval:later")
    forked = audit(*base, "-o", "ev2.json", cwd=tmp_path)
    assert forked.returncode == 1, forked.stdout + forked.stderr
    assert forked.stderr.startswith("NOT VERIFIED: the head of run 'r1' at ")
    anchored_first = f"already anchored in anchor: {first.relative_to(tmp_path)} (5 records): {why}"
    assert f"forks from a head of the same run and key {anchored_first}" in forked.stderr
    assert "--allow-fork" in forked.stderr
    assert "Nothing was published, and ev2.json was not written" in forked.stderr
    assert _anchored(tmp_path) == [first] and not (tmp_path / "ev2.json").exists()
    # Asked for, the head is published beside the anchored one, and the output names the fork.
    allowed = audit(*base, "-o", "ev2.json", "--allow-fork", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "It forks from heads anchored there, published all the same (--allow-fork)" in allowed.stdout
    assert why in allowed.stdout and len(_anchored(tmp_path)) == 2 and (tmp_path / "ev2.json").exists()


def test_export_refuses_to_anchor_a_head_of_a_journal_that_lost_anchored_records(tmp_path: Path) -> None:
    url = _store(tmp_path, "r1")
    (tmp_path / "anchor").mkdir()
    base = ["export", "--store", url, "--run", "r1", "--key", "log.key", "--anchor-dir", "anchor", "--head"]
    assert audit(*base, "-o", "then.json", cwd=tmp_path).returncode == 0
    _sql(tmp_path, CUT_TWO, *DROP_TREE)
    cut = audit(*base, "-o", "now.json", "--json", cwd=tmp_path)
    doc = json.loads(cut.stdout)
    assert cut.returncode == doc["exit_code"] == 1 and doc["result"] == "not_verified", cut.stdout
    assert "it covers 5 records, and the journal holds 3: records it covers were removed" in doc["message"]
    assert len(_anchored(tmp_path)) == 1 and not (tmp_path / "now.json").exists()


def test_a_head_that_extends_the_anchored_ones_is_published_whatever_else_lies_there(tmp_path: Path) -> None:
    """No false fork: the run grew; beside its anchored head lie a head of the same run and size under
    another key, one with a bad signature, and files that are no head: none is a head of this log."""
    url = _store(tmp_path, "r1")
    (tmp_path / "anchor").mkdir()
    base = ["export", "--store", url, "--run", "r1", "--key", "log.key", "--anchor-dir", "anchor", "--head"]
    assert audit(*base, "-o", "then.json", cwd=tmp_path).returncode == 0
    [first] = _anchored(tmp_path)
    other = sign_head(SigningKey.generate(), "r1", 5, b"\x01" * 32)
    (first.parent / f"{5:020d}-1.json").write_bytes(other.to_json())
    doc = json.loads(first.read_bytes())
    doc["root"] = base64.b64encode(b"\x02" * 32).decode()  # the log's key id, but not its signature
    (first.parent / f"{5:020d}-2.json").write_text(json.dumps(doc, separators=(",", ":")))
    (first.parent / f"{5:020d}-3.json").write_text("not a head")
    (first.parent / f"{6:020d}-4.json").symlink_to(first)
    _append(url, "approval:later")
    grown = audit(*base, "-o", "now.json", cwd=tmp_path)
    assert grown.returncode == 0, grown.stdout + grown.stderr
    assert "forks" not in grown.stdout and len(_anchored(tmp_path)) == 6
    refused = audit("export", "--store", url, "--run", "r1", "--key", "log.key", "--head", "-o", "x.json",
                    "--allow-fork", cwd=tmp_path)  # fmt: skip
    assert refused.returncode == 2 and "--allow-fork needs --anchor-dir" in refused.stderr


def test_an_anchor_whose_heads_cannot_be_read_is_published_to_and_the_output_says_it_was_not_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A drop box (writable, not readable) takes heads as before; the output says they were not compared."""
    from bide.audit._cli import main

    url = _store(tmp_path, "r1")
    (tmp_path / "anchor").mkdir()

    def unreadable(self: DirectoryPublisher, log_id: str) -> Any:
        raise AnchorError(f"cannot read the heads anchored in {self.path_for_log(log_id)}: Permission denied")

    monkeypatch.setattr(DirectoryPublisher, "anchored", unreadable)
    code = main(["export", "--store", url, "--run", "r1", "--key", str(tmp_path / "log.key"), "--head",
                 "-o", str(tmp_path / "head.json"), "--anchor-dir", str(tmp_path / "anchor")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and len(_anchored(tmp_path)) == 1, out
    assert "The heads already anchored there could not be read" in out and "not compared with them" in out


def test_anchored_reads_the_runs_heads_and_leaves_out_what_is_not_one(tmp_path: Path) -> None:
    key = SigningKey.generate()
    publisher = DirectoryPublisher(tmp_path)
    assert publisher.anchored("r1") == []  # no folder yet
    heads = [sign_head(key, "r1", n, hashlib.sha256(bytes([n])).digest()) for n in (3, 1)]
    for head in heads:
        publisher.publish(head)
    folder = publisher.path_for_log("r1")
    (folder / f"{9:020d}-1.json").write_text("{}")
    os.mkfifo(folder / f"{9:020d}-2.json")  # never waited on
    assert [head for _, head in publisher.anchored("r1")] == heads[::-1]
    assert publisher.anchored("r2") == []


# --- the verifier of docs/audit.md -----------------------------------------------------------------------


def _docs_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """docs/audit.md's python blocks run in order, as tests/test_docs.py runs them."""
    spec = importlib.util.spec_from_file_location("bide_test_docs", REPO / "tests" / "test_docs.py")
    assert spec is not None and spec.loader is not None
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "docs_audit"}
    for block in docs._blocks(REPO / "docs" / "audit.md"):
        exec(compile(block, "audit.md", "exec"), namespace)
    return namespace


def test_the_docs_verifier_refuses_a_record_at_a_position_outside_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check_bundle` of "Write your own verifier" lacked RFC 9162 2.1.3.2 step 1 (index < size): the
    quick start's bundle, its index moved past the tree's end (28 for record 12 of 15, say), passed."""
    docs = _docs_namespace(tmp_path, monkeypatch)
    check_bundle, text, key = docs["check_bundle"], docs["bundle"].to_json(), docs["log_key"].public.raw
    assert check_bundle(text, key)
    doc = json.loads(text)
    size = doc["inclusion"]["size"]
    accepted = []
    for index in (-1, *range(size, 8 * size)):
        doc["inclusion"]["index"] = index
        if check_bundle(json.dumps(doc, separators=(",", ":")).encode(), key):
            accepted.append(index)
    assert accepted == []


def test_an_export_waits_for_one_publishing_into_its_anchor_dir_and_then_compares_with_its_head(
    tmp_path: Path,
) -> None:
    """Two exports at once into one --anchor-dir, of two copies of a store (one edited behind bide): each
    compared its head with the heads there before the other's was published, and both forking heads went
    in, exit 0 twice. An export compares and publishes under the directory's lock (`flock`): here the test
    holds it, as another export would, and publishes a forking head meanwhile; the export waiting on the
    lock then finds that head, and refuses."""
    import fcntl
    import shutil
    import time

    from bide.audit import load_signing_key

    url = _store(tmp_path, "r1")
    (tmp_path / "anchor").mkdir()
    shutil.copy(tmp_path / "runs.db", tmp_path / "copy.db")
    with sqlite3.connect(tmp_path / "copy.db") as conn:
        conn.execute(EDIT)
    copy = bide.open_store(f"sqlite:///{tmp_path / 'copy.db'}")
    try:
        forking_head = AuditLog(copy, load_signing_key(tmp_path / "log.key")).sign_head("r1", publish=False)
    finally:
        copy.close()
    lock = os.open(tmp_path / "anchor", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        export = subprocess.Popen(
            [sys.executable, "-m", "bide.audit._cli", "export", "--store", url, "--run", "r1", "--key",
             "log.key", "--anchor-dir", "anchor", "-o", "ev.json"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(3)  # the export has signed its head and compared it (before), or waits on the lock (now)
        DirectoryPublisher(tmp_path / "anchor").publish(forking_head)
    finally:
        os.close(lock)  # released: the export goes on
    out, err = export.communicate(timeout=120)
    assert export.returncode == 1, out + err
    assert "forks from a head of the same run and key already anchored in anchor" in err, err
    assert len(_anchored(tmp_path)) == 1 and not (tmp_path / "ev.json").exists()
