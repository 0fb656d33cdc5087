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


def _write_run(url: str, run_id: str, records: int) -> None:
    store = bide.open_store(url)
    try:
        write_run(store, run_id, records)
    finally:
        store.close()


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
    _write_run(url, "r", 4)
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


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ("DELETE FROM bide_audit_tiles WHERE run_id = 'r' AND level = 7", "are missing node (7, 0)"),
        ("UPDATE bide_audit_tiles SET hashes = substr(hashes, 1, 64) WHERE run_id = 'r' AND level = 0 "
         "AND tile = 0", "are missing node (0, 2)"),
        ("UPDATE bide_audit_tiles SET hashes = 'abc' WHERE run_id = 'r' AND level = 0 AND tile = 0",
         "are missing node (0, 0)"),
        ("UPDATE bide_audit_tile_trees SET size = -1 WHERE run_id = 'r'", "records size -1"),
    ],
    ids=["a tile deleted", "a tile cut short", "a tile of text", "a negative size"],
)
def test_audit_tables_edited_by_hand_are_damage_not_a_store_failure(
    tmp_path: Path, edit: str, said: str
) -> None:
    """A tile deleted or cut short was 'the store failed' (exit 6, which a script retries as for a database
    down); a tile of text or a negative size an internal error (exit 3). They are damage: exit 1, with how
    to have the tree rebuilt, nothing signed or written."""
    url = _store(tmp_path)
    _write_run(url, "r", 200)
    base = ["export", "--store", url, "--run", "r", "--key", "log.key"]
    assert audit(*base, "--head", "-o", "before.json", cwd=tmp_path).returncode == 0  # the tree is built
    with sqlite3.connect(tmp_path / "runs.db") as db:
        assert db.execute(edit).rowcount == 1
    done = audit(*base, "-o", "out.json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert said in done.stderr and "to have the tree rebuilt from the journal" in done.stderr, done.stderr
    assert not (tmp_path / "out.json").exists()


def test_a_tile_turned_to_text_with_its_bytes_is_read_as_its_bytes(tmp_path: Path) -> None:
    """A tile stored as TEXT (`hashes || ''` in the sqlite3 shell keeps its bytes, valid UTF-8 or not) made
    every export say "the store failed ... run it again once the database answers" (exit 6, the driver's
    UTF-8 decoding), which no retry changes. Its bytes are read as a tile's are: here still the true tree,
    so the export signs the same head."""
    url = _store(tmp_path)
    _write_run(url, "r", 200)
    base = ["export", "--store", url, "--run", "r", "--key", "log.key", "--head"]
    assert audit(*base, "-o", "before.json", cwd=tmp_path).returncode == 0  # the tree is built
    with sqlite3.connect(tmp_path / "runs.db") as db:
        assert db.execute("UPDATE bide_audit_tiles SET hashes = hashes || '' WHERE run_id = 'r'").rowcount > 1
        assert {t for (t,) in db.execute("SELECT typeof(hashes) FROM bide_audit_tiles")} == {"text"}
    done = audit(*base, "-o", "after.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    heads = [json.loads((tmp_path / name).read_text()) for name in ("before.json", "after.json")]
    assert heads[0]["root"] == heads[1]["root"] and heads[0]["size"] == heads[1]["size"] == 202, heads


def test_a_head_is_not_anchored_when_its_artifact_cannot_be_written(tmp_path: Path) -> None:
    """The head went to --anchor-dir just before the output was written: a full disk (here a file size
    limit) left an anchored head with no artifact. The output is staged first; a head is published only
    once it is, and nothing is when it cannot be."""
    import resource

    url = _store(tmp_path)
    _write_run(url, "r", 300)
    # The tree built first, so that the export below writes nothing to the store (under the size limit).
    assert audit("export", "--store", url, "--run", "r", "--key", "log.key", "--head", "-o", "head.json",
                 cwd=tmp_path).returncode == 0  # fmt: skip
    (tmp_path / "anchors").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "bide.audit._cli", "export", "--store", url, "--run", "r", "--key", "log.key",
         "-o", "out.json", "--anchor-dir", "anchors"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000)),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "out.json was not written, and nothing was published" in done.stderr, done.stderr
    assert not (tmp_path / "out.json").exists() and not list((tmp_path / "anchors").iterdir())


def test_a_run_in_another_journal_format_is_not_exported(tmp_path: Path) -> None:
    """A header naming another journal format was exported and signed (exit 0), while bide itself refuses
    to read the run: the export says to use the bide version that wrote it (exit 4)."""
    url = _store(tmp_path)
    with sqlite3.connect(tmp_path / "runs.db") as db:
        where = "run_id = 'r1' AND key = '@journal'"
        (data,) = db.execute(f"SELECT data FROM bide_records WHERE {where}").fetchone()
        header = json.loads(data) | {"format": "bide.journal/2"}
        db.execute(f"UPDATE bide_records SET data = ? WHERE {where}", (json.dumps(header).encode(),))
    done = audit("export", "--store", url, "--run", "r1", "--key", "log.key", "-o", "out.json", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "is in journal format 'bide.journal/2'" in done.stderr and not (tmp_path / "out.json").exists()
