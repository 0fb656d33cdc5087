"""`bide-audit export` at the edges an adversarial review found: a symbolic link planted in the anchor
directory, a record put behind bide's back at seq 0 (where loads did not look), and a store made with
another table prefix than bide_."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide.testing import ScriptedModel, call, reply

from .conftest import write_run

REPO = Path(__file__).resolve().parents[2]


def audit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "bide.audit._cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def _store(tmp_path: Path, prefix: str = "bide_") -> str:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url, table_prefix=prefix)
    try:
        write_run(store, "r1", 3)
    finally:
        store.close()
    assert audit("keygen", "log.key", cwd=tmp_path).returncode == 0
    return url


def test_a_symbolic_link_planted_as_the_runs_anchor_folder_is_not_written_through(tmp_path: Path) -> None:
    """The run's folder in the anchor directory, replaced by a link to a directory elsewhere: the head was
    published there ("Published ... to anchor/<folder>/..."), outside the directory the auditor watches."""
    url = _store(tmp_path)
    (tmp_path / "anchor").mkdir()
    (tmp_path / "elsewhere").mkdir()
    folder = tmp_path / "anchor" / hashlib.sha256(b"r1").hexdigest()
    folder.symlink_to(tmp_path / "elsewhere")
    done = audit(
        "export", "--store", url, "--run", "r1", "--key", "log.key", "--head", "-o", "head.json",
        "--anchor-dir", "anchor", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert "is not a folder publish() made" in done.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == [] and not (tmp_path / "head.json").exists()


def test_a_record_put_at_seq_zero_is_seen_so_the_journal_is_refused_not_read_without_it(
    tmp_path: Path,
) -> None:
    """A forged result inserted at seq 0 was invisible to load() (and so to the export's check of the
    journal against its tree), but not to the insert that met its key: the tool's real result was dropped
    and the run went on with the forged one, and export signed the journal as intact."""
    url = _store(tmp_path)
    assert audit("export", "--store", url, "--run", "r1", "--key", "log.key", "--head", "-o", "before.json",
                 cwd=tmp_path).returncode == 0  # fmt: skip
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        conn.execute(
            "INSERT INTO bide_records(seq, run_id, key, data) VALUES (0, 'r1', 'approval:forged', ?)",
            (b'{"data":1,"key":"approval:forged","kind":"gate","salt":"x"}',),
        )
    store = bide.open_store(url)
    try:
        assert store.load("r1")[0].key == "approval:forged"
        assert store.load("r1", after=1)[0].key != "approval:forged"  # a tail read: past it
    finally:
        store.close()
    done = audit("export", "--store", url, "--run", "r1", "--key", "log.key", "--head", "-o", "after.json",
                 cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1 and "NOT VERIFIED" in done.stderr, done.stdout + done.stderr
    assert not (tmp_path / "after.json").exists()


def test_a_run_whose_journal_gained_a_row_at_seq_zero_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url)
    store.close()
    forged = b'{"call_id":"c0.0","is_error":false,"key":"result:c0.0","kind":"tool_result","result":999}'
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        conn.execute(
            "INSERT INTO bide_records(seq, run_id, key, data) VALUES (0, 'r', 'result:c0.0', ?)", (forged,)
        )
    fired: list[int] = []

    @bide.tool
    def add(a: int, b: int) -> int:
        """Add."""
        fired.append(a + b)
        return a + b

    store = bide.open_store(url)
    try:
        agent = bide.Agent(ScriptedModel([call("add", a=1, b=2), reply("done")]), store=store, tools=[add])
        with pytest.raises(bide.BideError, match="does not start with a '@journal' header"):
            agent.run_sync("r", "add")
    finally:
        store.close()
    assert fired == []


def test_export_reads_a_store_made_with_another_table_prefix(tmp_path: Path) -> None:
    url = _store(tmp_path, prefix="app_")
    plain = audit("export", "--store", url, "--run", "r1", "--key", "log.key", "-o", "ev.json", cwd=tmp_path)
    assert plain.returncode == 4 and "--table-prefix" in plain.stderr, plain.stderr
    done = audit(
        "export", "--store", url, "--table-prefix", "app_", "--run", "r1", "--key", "log.key",
        "-o", "ev.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    verified = audit("verify-evidence", "ev.json", "--pubkey", "log.key.pub", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_record_at_the_least_seq_a_column_holds_is_seen_too(tmp_path: Path) -> None:
    """The whole load read `seq > -2**63`, so a row put at -2**63 itself stayed invisible to it."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    bide.open_store(url).close()
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        conn.execute(
            "INSERT INTO bide_records(seq, run_id, key, data) VALUES (?, 'r', 'result:c0.0', x'7b7d')",
            (-(2**63),),
        )
    store = bide.open_store(url)
    try:
        assert [(e.seq, e.key) for e in store.load("r")] == [(-(2**63), "result:c0.0")]
    finally:
        store.close()


def test_a_link_swapped_in_while_the_head_is_written_sends_nothing_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder was checked, then written to by its name: a link put there between the two (a racing
    process) still sent the head outside the anchor directory. It is now opened once, without following a
    link, and written through that handle."""
    from bide.audit import AnchorError, DirectoryPublisher, SigningKey, _anchor, sign_head

    (tmp_path / "anchor").mkdir()
    (tmp_path / "elsewhere").mkdir()
    write = _anchor.write_whole

    def swapped(path: Path, data: bytes, **options: bool) -> None:
        folder = tmp_path / "anchor" / hashlib.sha256(b"r1").hexdigest()
        folder.rmdir()
        folder.symlink_to(tmp_path / "elsewhere")
        write(path, data, **options)

    monkeypatch.setattr(_anchor, "write_whole", swapped)
    head = sign_head(SigningKey.generate(), "r1", 1, bytes(32))
    with pytest.raises(AnchorError):
        DirectoryPublisher(tmp_path / "anchor").publish(head)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_heads_are_published_to_a_drop_box_anchor_directory(tmp_path: Path) -> None:
    """An anchor directory others may write to but not list (mode 0333, a drop box the operator cannot read
    back or rewrite) took heads, until the run's folder was opened for reading: then a raw PermissionError.
    Run without root's reach to every file, as another user would."""
    import shutil

    url = _store(tmp_path)
    drop = tmp_path / "drop"
    drop.mkdir()
    drop.chmod(0o333)
    reach = ["capsh", "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--", "-c", 'exec "$@"', "--"]
    wrap = reach if os.geteuid() == 0 else []
    assert not wrap or shutil.which("capsh"), "make test installs capsh (libcap2-bin)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(
            [*wrap, sys.executable, "-m", "bide.audit._cli", "export", "--store", url, "--run", "r1", "--key",
             "log.key", "--head", "-o", "head.json", "--anchor-dir", "drop"],
            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
        )  # fmt: skip
    finally:
        drop.chmod(0o755)
    assert done.returncode == 0, done.stdout + done.stderr
    [folder] = drop.iterdir()
    assert len(list(folder.iterdir())) == 1


@pytest.mark.parametrize("export", [["--head"], ["--record", "approval:note:3"], []])
def test_a_damaged_hash_above_the_leaves_is_refused_before_a_head_is_signed(
    tmp_path: Path, export: list[str]
) -> None:
    """Only the leaves were checked against the journal, while roots and proofs are read from the levels
    stored above them (7, 14, ...): with a level-7 hash zeroed, `--head` and `--record` signed, anchored and
    wrote a root that is not the journal's (exit 0), and a full export refused only after it had
    anchored a head. Each now refuses (exit 1) with nothing signed, anchored or written."""
    url = _store(tmp_path)
    store = bide.open_store(url)
    try:
        write_run(store, "r", 200)
        base = ["export", "--store", url, "--run", "r", "--key", "log.key"]
        assert audit(*base, "--head", "-o", "before.json", cwd=tmp_path).returncode == 0
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "runs.db") as db:
        assert db.execute("UPDATE bide_audit_tiles SET hashes = ? WHERE run_id = 'r' AND level = 7",
                          (bytes(32),)).rowcount == 1  # fmt: skip
    (tmp_path / "anchors").mkdir()
    done = audit("export", "--store", url, "--run", "r", "--key", "log.key", *export, "-o", "out.json",
                 "--anchor-dir", "anchors", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "its stored hash of records 0 to 127 (level 7) is not the one those records give" in done.stderr
    assert not (tmp_path / "out.json").exists() and not list((tmp_path / "anchors").iterdir())


def test_a_record_committed_while_the_export_runs_is_left_out_of_what_it_signs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal was checked, then the head signed at the size found then: a record committed between the
    two (a live run goes on; here a second header, which the check refuses) was signed into the package,
    which verify-evidence then called forged. The head is of the records checked."""
    from bide.audit import _cli
    from bide.audit._log import AuditLog

    url = _store(tmp_path)
    store = bide.open_store(url)
    try:
        write_run(store, "r", 4)
    finally:
        store.close()
    checked = AuditLog.check_journal

    def then_a_record_lands(self: AuditLog, run_id: str) -> int:
        size = checked(self, run_id)
        bide.Journal(self.store, run_id).load().write([bide.GateRecord(key="approval:late", data="x")])
        return size

    monkeypatch.setattr(AuditLog, "check_journal", then_a_record_lands)
    monkeypatch.chdir(tmp_path)
    assert _cli.main(["export", "--store", url, "--run", "r", "--key", "log.key", "-o", "e.json"]) == 0
    package = json.loads((tmp_path / "e.json").read_text())
    assert package["sth"]["size"] == 6 and len(package["records"]) == 6  # the header, the start, 4 notes
    verified = audit("verify-evidence", "e.json", "--pubkey", "log.key.pub", cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr
