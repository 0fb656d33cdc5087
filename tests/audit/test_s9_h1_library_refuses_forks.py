"""The library's anchoring compares too. `bide-audit export --anchor-dir` refused a head that forks from one
of its run already anchored there, but `AuditLog(store, key, DirectoryPublisher(dir)).sign_head(run)` and
`AuditedStore` published any head: a journal rewritten (edited by hand, or restored from an older backup
that then took other records) was anchored as a second history beside the first, without a word. The
library now compares each head with those anchored (`DirectoryPublisher.publish_checked`, the export's one
check, under the export's lock) and refuses a fork (`ForkRefused`, an AnchorError); `AuditedStore` keeps and
logs the refusal, and the append still commits."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bide
from bide.audit import (
    AnchorError,
    AuditedStore,
    AuditLog,
    DirectoryPublisher,
    NotVerified,
    SigningKey,
    load_signing_key,
)
from bide.audit._cli import _ANCHOR_LOCK_FILE, _RecordingPublisher

from .conftest import write_run

pytestmark = pytest.mark.slow  # some run processes

REPO = Path(__file__).resolve().parents[2]
DROP_TREE = ("DELETE FROM bide_audit_tiles", "DELETE FROM bide_audit_tile_trees")
EDIT = (
    "UPDATE bide_records SET data = CAST(REPLACE(CAST(data AS TEXT), '{\"i\":0}', '{\"i\":9}') AS BLOB) "
    "WHERE run_id = 'r1' AND key = 'approval:note:0'"
)


def _store(path: Path) -> str:
    """A SQLite store at `path` holding run r1 (5 records: header, start, notes 0 to 2); its URL."""
    url = f"sqlite:///{path}"
    store = bide.open_store(url)
    try:
        write_run(store, "r1", 3)
    finally:
        store.close()
    return url


def _rewrite(path: Path) -> None:
    """Record approval:note:0 edited behind bide, and the audit tree rebuilt from the journal (as export's
    refusal of an edited journal advises): the journal is no longer the one that was anchored."""
    with sqlite3.connect(path) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for statement in (EDIT, *(DROP_TREE if "bide_audit_tiles" in tables else ())):
            conn.execute(statement)


def _append(url: str, key: str) -> None:
    store = bide.open_store(url)
    try:
        bide.Journal(store, "r1").load().write([bide.GateRecord(key=key, data="x")])
    finally:
        store.close()


def _anchored(anchor: Path) -> list[Path]:
    return sorted(anchor.rglob("*.json"))


def _sign(url: str, key: SigningKey, anchor: Path) -> None:
    store = bide.open_store(url)
    try:
        AuditLog(store, key, DirectoryPublisher(anchor)).sign_head("r1")
    finally:
        store.close()


@pytest.mark.parametrize("grow", [False, True])
def test_sign_head_refuses_a_head_of_a_rewritten_journal(tmp_path: Path, grow: bool) -> None:
    url = _store(tmp_path / "runs.db")
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    key = SigningKey.generate()
    _sign(url, key, anchor)
    [first] = _anchored(anchor)
    _rewrite(tmp_path / "runs.db")
    if grow:  # an older backup restored, which then took other records
        _append(url, "approval:later")
    store = bide.open_store(url)
    try:
        log = AuditLog(store, key, DirectoryPublisher(anchor))
        with pytest.raises(AnchorError) as refused:
            log.sign_head("r1")
    finally:
        store.close()
    assert type(refused.value).__name__ == "ForkRefused" and isinstance(refused.value, NotVerified)
    message = str(refused.value)
    why = "the journal's first 5 records are not the ones it covers" if grow else (
        "it is of the same size, 5 records, with another root"
    )
    assert f"forks from a head of the same run and key already anchored in {anchor}: {first} (5 records): " \
           f"{why}" in message, message  # fmt: skip
    assert "The journal is not the one that head was signed over" in message
    assert "Nothing was published" in message and "allow_fork=True" in message
    assert _anchored(anchor) == [first]


def test_a_publisher_that_anchored_the_history_refuses_its_rewrite(tmp_path: Path) -> None:
    """The same log and publisher (what a long-lived process holds) before and after the rewrite: what it
    remembers of the heads it published does not let the fork through; one published knowingly is."""
    db = tmp_path / "runs.db"
    _store(db)
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    store = bide.open_store(f"sqlite:///{db}")
    try:
        publisher = DirectoryPublisher(anchor)
        log = AuditLog(store, SigningKey.generate(), publisher)
        log.sign_head("r1")
        bide.Journal(store, "r1").load().write([bide.GateRecord(key="approval:note:3", data={"i": 3})])
        log.sign_head("r1")
        assert len(_anchored(anchor)) == 2
        store.close()
        _rewrite(db)
        store = bide.open_store(f"sqlite:///{db}")
        log = AuditLog(store, log.key, publisher)
        with pytest.raises(AnchorError, match="forks from a head of the same run and key"):
            log.sign_head("r1")
        assert len(_anchored(anchor)) == 2
        head = log.sign_head("r1", publish=False)
        found = publisher.publish_checked(log, head, allow_fork=True)  # knowingly: published, forks named
        assert found.forks and len(_anchored(anchor)) == 3
    finally:
        store.close()


def test_a_head_larger_than_the_last_one_a_publisher_anchored_is_still_compared(tmp_path: Path) -> None:
    """Two copies of a store publish into one directory: B a head of 6 records, then A one of 5, a prefix of
    B's. A's journal is then rewritten from its 6th record on: A's next head extends A's own last head
    but forks from B's larger one, which A's publisher had compared with before and must compare with
    again."""
    a_url = _store(tmp_path / "a.db")
    _append(a_url, "approval:b")
    shutil.copy(tmp_path / "a.db", tmp_path / "b.db")
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    key = SigningKey.generate()
    _sign(f"sqlite:///{tmp_path / 'b.db'}", key, anchor)  # 6 records
    publisher = DirectoryPublisher(anchor)
    a_store = bide.open_store(a_url)
    try:
        AuditLog(a_store, key, publisher).sign_head("r1", size=5)  # a prefix of B's head
    finally:
        a_store.close()
    assert len(_anchored(anchor)) == 2
    with sqlite3.connect(tmp_path / "a.db") as conn:
        conn.execute("UPDATE bide_records SET data = CAST(REPLACE(CAST(data AS TEXT), '\"data\":\"x\"', "
                     "'\"data\":\"y\"') AS BLOB) WHERE run_id = 'r1' AND key = 'approval:b'")
        for statement in DROP_TREE:
            conn.execute(statement)
    _append(a_url, "approval:a")
    a_store = bide.open_store(a_url)
    try:
        log = AuditLog(a_store, key, publisher)
        with pytest.raises(AnchorError, match=r"\(6 records\): the journal's first 6 records are not"):
            log.sign_head("r1")
    finally:
        a_store.close()
    assert len(_anchored(anchor)) == 2


def test_an_audited_store_keeps_and_logs_the_refusal_and_the_append_commits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "runs.db"
    url = f"sqlite:///{db}"
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    key = SigningKey.generate()
    inner = bide.open_store(url)
    store = AuditedStore(inner, AuditLog(inner, key, DirectoryPublisher(anchor)))
    try:
        write_run(store, "r1", 3)
        assert store.errors == [] and len(_anchored(anchor)) >= 3
    finally:
        store.close()
    anchored = _anchored(anchor)
    _rewrite(db)  # the process restarted over a journal rewritten meanwhile
    inner = bide.open_store(url)
    store = AuditedStore(inner, AuditLog(inner, key, DirectoryPublisher(anchor)))
    try:
        with caplog.at_level(logging.ERROR, logger="bide.audit"):
            bide.Journal(store, "r1").load().write([bide.GateRecord(key="approval:later", data="x")])
        assert [e.key for e in inner.load("r1")][-1] == "approval:later"  # the append committed
        [error] = store.errors
        assert isinstance(error, AnchorError) and type(error).__name__ == "ForkRefused", error
        assert "records are not the ones it covers" in str(error), error
        assert [r.levelno for r in caplog.records] == [logging.ERROR]
        assert "forks from a head of the same run" in caplog.records[0].getMessage()
    finally:
        store.close()
    assert _anchored(anchor) == anchored


_SIGN = """
import sys
import bide
from bide.audit import AnchorError, AuditLog, DirectoryPublisher, load_signing_key
store = bide.open_store(sys.argv[1])
log = AuditLog(store, load_signing_key(sys.argv[2]), DirectoryPublisher(sys.argv[3]))
print("ready", flush=True)
try:
    log.sign_head("r1")
except AnchorError as exc:
    print("refused", type(exc).__name__, exc, flush=True)
    sys.exit(1)
finally:
    store.close()
print("published", flush=True)
"""


def _signer(url: str, key: Path, anchor: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", _SIGN, url, str(key), str(anchor)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _two_copies(tmp_path: Path) -> tuple[str, str, Path]:
    """Two copies of a store, the second's journal rewritten, and the log's key file."""
    a_url = _store(tmp_path / "a.db")
    shutil.copy(tmp_path / "a.db", tmp_path / "b.db")
    _rewrite(tmp_path / "b.db")
    key = tmp_path / "log.key"
    key.write_bytes(SigningKey.generate().pem())
    key.chmod(0o600)
    return a_url, f"sqlite:///{tmp_path / 'b.db'}", key


def test_two_processes_publishing_two_histories_into_one_directory_at_once(tmp_path: Path) -> None:
    """Each round, a process signs each copy's head at the same moment: one history is anchored, and the
    other process is refused, whichever comes first."""
    a_url, b_url, key = _two_copies(tmp_path)
    for round_ in range(4):
        anchor = tmp_path / f"anchor{round_}"
        anchor.mkdir()
        signers = [_signer(url, key, anchor) for url in (a_url, b_url)]
        outcomes = [signer.communicate(timeout=120) for signer in signers]
        codes = sorted(signer.returncode for signer in signers)
        assert codes == [0, 1], outcomes
        refused = next(out for out, _ in outcomes if "refused" in out)
        assert "refused ForkRefused the head of run 'r1' at 5 records forks" in refused, refused
        assert len(_anchored(anchor)) == 1


def test_a_library_publisher_waits_for_the_exports_lock_and_compares_with_what_came_meanwhile(
    tmp_path: Path,
) -> None:
    """An export holds the anchor directory's lock (`.bide-audit-export.lock`) while it compares and
    publishes; a library publisher meanwhile waits on that lock file, then finds the head the export
    published, and refuses to fork from it."""
    a_url, b_url, key_file = _two_copies(tmp_path)
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    b_store = bide.open_store(b_url)
    try:
        b_head = AuditLog(b_store, load_signing_key(key_file)).sign_head("r1", publish=False)
    finally:
        b_store.close()
    with _RecordingPublisher(anchor, tmp_path / "out.json").exclusive():
        signer = _signer(a_url, key_file, anchor)
        assert signer.stdout is not None and signer.stdout.readline() == "ready\n"
        lock = str(anchor / _ANCHOR_LOCK_FILE)
        deadline = time.monotonic() + 60
        while not _holds_open(signer.pid, lock):  # it waits on the export's lock file
            assert signer.poll() is None and time.monotonic() < deadline, signer.communicate()
            time.sleep(0.02)
        DirectoryPublisher(anchor).publish(b_head)  # what the export published meanwhile
    out, err = signer.communicate(timeout=120)
    assert signer.returncode == 1, out + err
    assert "refused ForkRefused" in out and "it is of the same size, 5 records, with another root" in out
    assert len(_anchored(anchor)) == 1 and not (anchor / _ANCHOR_LOCK_FILE).exists()


def _holds_open(pid: int, path: str) -> bool:
    """The process `pid` has the file `path` open."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == path:
                return True
        except OSError:
            continue
    return False


def test_an_export_refuses_to_fork_from_a_head_the_library_anchored(tmp_path: Path) -> None:
    """One check, whoever publishes: the export compares with the library's heads."""
    a_url, _, key_file = _two_copies(tmp_path)
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    _sign(a_url, load_signing_key(key_file), anchor)
    [first] = _anchored(anchor)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    b_url = f"sqlite:///{tmp_path / 'b.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "bide.audit._cli", "export", "--store", b_url, "--run", "r1", "--key",
         str(key_file), "--anchor-dir", str(anchor), "--head", "-o", str(tmp_path / "h.json")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    said = "NOT VERIFIED: the head of run 'r1' at 5 records forks from a head"
    assert done.stderr.startswith(said), done.stderr
    assert f"{first} (5 records): it is of the same size" in done.stderr and "--allow-fork" in done.stderr
    assert "Nothing was published, and" in done.stderr and _anchored(anchor) == [first]


def test_the_export_and_the_library_name_one_lock_file() -> None:
    from bide.audit import _anchor

    assert _anchor.LOCK_FILE == _ANCHOR_LOCK_FILE
