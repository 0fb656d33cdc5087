"""`bide-audit` as installed (the console script), end to end through subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import bide

from .conftest import write_run

pytestmark = pytest.mark.slow


def _audit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("bide-audit")
    cmd = [exe] if exe else [sys.executable, "-m", "bide.audit._cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def _audit_all(*calls: tuple[str, ...], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """`_audit(*args)` for each of `calls`, all at once: for commands that do not depend on each other
    (the same CPU work; a free core makes it faster)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: _audit(*args, cwd=cwd), calls))


def _store_and_key(tmp_path: Path, run_id: str, records: int) -> str:
    """A SQLite store in `tmp_path` holding run `run_id` (`records` gate records) and a signing key
    `log.key` beside it; the store's URL."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url)
    try:
        write_run(store, run_id, records)
    finally:
        store.close()
    assert _audit("keygen", "log.key", cwd=tmp_path).returncode == 0
    return url


def test_keygen_export_verify_and_consistency(tmp_path: Path) -> None:
    url = _store_and_key(tmp_path, "run-1", 3)
    assert (tmp_path / "log.key.pub").exists()
    assert _audit("keygen", "log.key", cwd=tmp_path).returncode == 2  # never overwrites a key
    base = ["--store", url, "--run", "run-1", "--key", "log.key"]
    assert _audit("export", *base, "--head", "-o", "old.json", cwd=tmp_path).returncode == 0
    store = bide.open_store(url)
    try:
        bide.Journal(store, "run-1").load().write([bide.GateRecord(key="approval:later", data="x")])
    finally:
        store.close()
    assert _audit("export", *base, "--head", "-o", "new.json", cwd=tmp_path).returncode == 0
    typo = f"sqlite:///{tmp_path / 'runz.db'}"
    (tmp_path / "unused").mkdir()  # --anchor-dir must exist: export never creates it
    (tmp_path / "anchor").mkdir()
    # The tree is current from here on: the other exports only read the store, and the refusals write nothing.
    proof, bundle, missing, evidence, no_key, no_run, no_store, unknown = _audit_all(
        ("export", *base, "--consistency-from", "5", "-o", "proof.json"),
        ("export", *base, "--record", "run:start", "-o", "bundle.json"),
        ("export", *base, "--record", "no-such-key", "-o", "x.json", "--anchor-dir", "unused"),
        ("export", *base, "-o", "evidence.json", "--anchor-dir", "anchor"),
        ("export", *base[:4], "-o", "x.json"),  # --key missing
        ("export", "--store", url, "--run", "nope", "--key", "log.key", "-o", "x.json"),
        ("export", "--store", typo, "--run", "run-1", "--key", "log.key", "-o", "x.json"),
        ("frobnicate",),
        cwd=tmp_path,
    )
    assert proof.returncode == 0 and bundle.returncode == 0 and evidence.returncode == 0
    # A record that is not there is "not found" (4), as a run that is not there is (docs/cli.md).
    assert missing.returncode == 4 and "no record 'no-such-key'" in missing.stdout + missing.stderr
    assert not (tmp_path / "x.json").exists() and not list((tmp_path / "unused").rglob("*.json"))
    assert list((tmp_path / "anchor").rglob("*.json"))
    assert no_key.returncode == 2
    assert no_run.returncode == 4
    assert no_store.returncode == 4 and "no bide store" in no_store.stderr
    assert not (tmp_path / "runz.db").exists()  # a mistyped path leaves no empty database behind
    assert unknown.returncode == 2

    ok, extends, nokey, backwards, backwards_gone_key, gone_key, out, approvals = _audit_all(
        ("verify", "bundle.json", "--pubkey", "log.key.pub"),
        ("verify-consistency", "old.json", "new.json", "proof.json", "--pubkey", "log.key.pub"),
        ("verify-consistency", "old.json", "new.json", "proof.json"),
        ("verify-consistency", "new.json", "old.json", "proof.json"),
        ("verify-consistency", "new.json", "old.json", "proof.json", "--pubkey", "gone.pub"),
        ("verify-consistency", "old.json", "new.json", "proof.json", "--pubkey", "gone.pub"),
        ("verify-evidence", "evidence.json", "--pubkey", "log.key.pub", "--json"),
        ("verify-approvals", "evidence.json"),
        cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    assert "Record 'run:start' (kind start) is entry 1" in ok.stdout and "Not proven" in ok.stdout
    assert extends.returncode == 0 and "extends, unchanged" in extends.stdout
    assert nokey.returncode == 0 and "not checked" in nokey.stdout
    assert backwards.returncode == 1
    assert "larger than the second" in backwards.stderr and "Swap them" in backwards.stderr, backwards.stderr
    # An unreadable --pubkey does not hide heads and a proof that disagree (exit 1 before exit 4).
    assert backwards_gone_key.returncode == 1, backwards_gone_key.stderr
    assert gone_key.returncode == 4 and "gone.pub" in gone_key.stderr, gone_key.stderr
    assert out.returncode == 0 and json.loads(out.stdout)["result"] == "verified"
    keys = list(json.loads(out.stdout))
    assert keys == sorted(keys) and {"result", "exit_code", "message", "not_proven", "key_id"} <= set(keys)
    assert approvals.returncode == 1  # no gate in this run
    assert not (tmp_path / "x.json").exists()

    # A file given to the command that does not read it says which one does.
    mixed = _audit_all(
        ("verify", "evidence.json", "--pubkey", "log.key.pub"),
        ("verify-evidence", "bundle.json", "--pubkey", "log.key.pub"),
        ("verify-consistency", "old.json", "proof.json", "new.json"),
        cwd=tmp_path,
    )
    for done, read_by in zip(
        mixed,
        ["`bide-audit verify-evidence`", "`bide-audit verify`", "`bide-audit verify-consistency`, as PROOF"],
        strict=True,
    ):
        assert done.returncode == 4, done.stderr
        assert f"(a file of that format is read by {read_by}" in done.stderr, done.stderr


def test_an_unreadable_key_never_hides_a_forged_bundle_or_package(tmp_path: Path) -> None:
    """verify and verify-evidence with a --pubkey that cannot be read: they exited 4 before looking at the
    proofs; a record swapped for another one (not in the tree at that position) is now exit 1 first."""
    url = _store_and_key(tmp_path, "run-1", 3)
    base = ["--store", url, "--run", "run-1", "--key", "log.key"]
    made = _audit_all(
        ("export", *base, "--record", "run:start", "-o", "bundle.json"),
        ("export", *base, "-o", "evidence.json"),
        cwd=tmp_path,
    )
    assert [m.returncode for m in made] == [0, 0], [m.stderr for m in made]
    evidence = json.loads((tmp_path / "evidence.json").read_text())
    bundle = json.loads((tmp_path / "bundle.json").read_text())
    bundle["record"] = next(r["record"] for r in evidence["records"] if r["record"] != bundle["record"])
    (tmp_path / "forged-bundle.json").write_text(json.dumps(bundle, separators=(",", ":")) + "\n")
    first, second = evidence["records"][0], evidence["records"][1]
    first["record"], second["record"] = second["record"], first["record"]
    (tmp_path / "forged-evidence.json").write_text(json.dumps(evidence, separators=(",", ":")) + "\n")
    results = _audit_all(
        ("verify", "forged-bundle.json", "--pubkey", "gone.pub"),
        ("verify-evidence", "forged-evidence.json", "--pubkey", "gone.pub"),
        ("verify", "bundle.json", "--pubkey", "gone.pub"),
        ("verify-evidence", "evidence.json", "--pubkey", "gone.pub"),
        cwd=tmp_path,
    )
    assert [r.returncode for r in results] == [1, 1, 4, 4], [r.stderr for r in results]
    assert all("gone.pub" in r.stderr for r in results[2:]), [r.stderr for r in results[2:]]


def test_export_from_a_store_that_cannot_be_read_exits_4_and_writes_nothing(tmp_path: Path) -> None:
    assert _audit("keygen", "log.key", cwd=tmp_path).returncode == 0
    (tmp_path / "bad.db").write_text("this is not a database\n")
    url = f"sqlite:///{tmp_path / 'bad.db'}"
    args = ["export", "--store", url, "--run", "r", "--key", "log.key", "--head", "-o", "h.json"]
    out = _audit(*args, cwd=tmp_path)
    assert out.returncode == 4
    assert out.stderr.startswith("ERROR:") and "not a database" in out.stderr
    assert not (tmp_path / "h.json").exists()
    assert (tmp_path / "bad.db").read_text() == "this is not a database\n"  # the file is left as it was
    as_json = _audit(*args, "--json", cwd=tmp_path)
    assert as_json.returncode == 4 and json.loads(as_json.stdout)["result"] == "error"


def test_exit_4_prints_unreadable_input_but_error_for_a_store_it_cannot_open(tmp_path: Path) -> None:
    """docs/audit.md, "Exit codes": exit 4 is `UNREADABLE INPUT:` / `unusable_input` for an input that cannot
    be used (no such run or record, a private key as --pubkey, another artifact's format), and `ERROR:` /
    `error` only for a store `export` cannot open. --json keys are sorted (docs/cli.md)."""
    url = _store_and_key(tmp_path, "r", 1)
    base = ["--key", "log.key", "--json"]
    exported = _audit("export", "--store", url, "--run", "r", "-o", "ev.json", *base, cwd=tmp_path)
    assert exported.returncode == 0, exported
    unusable = _audit_all(
        ("export", "--store", url, "--run", "nope", "-o", "x.json", *base),
        ("export", "--store", url, "--run", "r", "--record", "nope", "-o", "x.json", *base),
        ("verify-evidence", "ev.json", "--pubkey", "log.key", "--json"),
        ("verify", "ev.json", "--pubkey", "log.key.pub", "--json"),
        cwd=tmp_path,
    )
    no_store = _audit("export", "--store", url + "x", "--run", "r", "-o", "x.json", *base, cwd=tmp_path)
    for done, result, prefix in [*((d, "unusable_input", "UNREADABLE INPUT: ") for d in unusable),
                                 (no_store, "error", "ERROR: ")]:
        assert done.returncode == 4, done
        doc = json.loads(done.stdout)
        assert (doc["exit_code"], doc["result"]) == (4, result) and doc["message"].startswith(prefix), doc
        assert list(doc) == sorted(doc), doc
        # Every command's failure names its exit code in `reason` (docs/cli.md); bide-audit's had none.
        assert doc["reason"] == "unusable input", doc


def test_a_missing_input_file_is_exit_4_naming_the_path(tmp_path: Path) -> None:
    """Every input path of `bide-audit` (artifact, policy file, approver key, signing key) that does not exist
    is "unreadable or not found", exit 4, as in `govern` (docs/cli.md), and the message names the path."""
    from bide.audit import SigningKey

    pub = SigningKey.generate().public.hex
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    missing = {
        ("verify", "gone.json", "--pubkey", pub): "gone.json",
        ("verify-evidence", "gone.json", "--pubkey", pub, "--json"): "gone.json",
        ("verify-consistency", "gone-old.json", "gone-new.json", "gone-proof.json"): "gone-old.json",
        ("verify-approvals", "gone.json"): "gone.json",
        ("verify-approvals", "gone.json", "--policy", "gone-policy.json"): "gone-policy.json",
        ("verify-approvals", "gone.json", "--approver", "alice=gone-alice.pub"): "gone-alice.pub",
        ("export", "--store", store, "--run", "r", "--key", "gone.key", "-o", "out.json"): "gone.key",
        ("verify-approvals", "gone.json", "--policy", "gone-policy.json", "--json"): "gone-policy.json",
        ("export", "--store", store, "--run", "r", "--key", "gone.key", "-o", "o.json", "--json"): "gone.key",
    }
    for (args, path), done in zip(missing.items(), _audit_all(*missing, cwd=tmp_path), strict=True):
        assert done.returncode == 4, (args, done.stdout, done.stderr)
        assert path in done.stdout + done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        if "--json" in args:
            # The word bide and govern give a missing file (it was "unusable input", as a malformed one).
            assert json.loads(done.stdout)["reason"] == "not found", (args, done.stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_consistency_proof_to_the_size_of_a_head_held_verifies_after_the_run_grew(tmp_path: Path) -> None:
    """The documented workflow (a head now, then a proof from an older head) failed as forged (exit 1:
    "the proof is for sizes 5 -> 7, the heads are 5 -> 6") when a record was appended between the two
    exports: the proof ran to the journal's size at its own export. `--consistency-to` names the newer
    head's size."""
    url = _store_and_key(tmp_path, "run-1", 3)
    base = ["--store", url, "--run", "run-1", "--key", "log.key"]
    assert _audit("export", *base, "--head", "-o", "old.json", cwd=tmp_path).returncode == 0
    old = json.loads((tmp_path / "old.json").read_text())["size"]

    def append(key: str) -> None:
        store = bide.open_store(url)
        try:
            bide.Journal(store, "run-1").load().write([bide.GateRecord(key=key, data="x")])
        finally:
            store.close()

    append("approval:later")
    assert _audit("export", *base, "--head", "-o", "new.json", cwd=tmp_path).returncode == 0
    new = json.loads((tmp_path / "new.json").read_text())["size"]
    append("approval:later-still")  # the run goes on between the two exports
    late, held, alone, beyond = _audit_all(
        ("export", *base, "--consistency-from", str(old), "-o", "late.json"),
        ("export", *base, "--consistency-from", str(old), "--consistency-to", str(new), "-o", "held.json"),
        ("export", *base, "--consistency-to", str(new), "-o", "x.json"),
        ("export", *base, "--consistency-from", str(old), "--consistency-to", str(new + 5), "-o", "x.json"),
        cwd=tmp_path,
    )
    assert late.returncode == held.returncode == 0, late.stderr + held.stderr
    assert alone.returncode == 2 and "--consistency-to needs --consistency-from" in alone.stderr
    # A size past the journal's end is one a head covers that the journal no longer holds (or a slip):
    # not verified, and the message says both.
    assert beyond.returncode == 1 and f"records, fewer than {new + 5}: a head of {new + 5}" in beyond.stderr
    assert not (tmp_path / "x.json").exists()
    stale, fits = _audit_all(
        ("verify-consistency", "old.json", "new.json", "late.json", "--pubkey", "log.key.pub"),
        ("verify-consistency", "old.json", "new.json", "held.json", "--pubkey", "log.key.pub"),
        cwd=tmp_path,
    )
    assert stale.returncode == 1  # to now: one record past the newer head
    assert fits.returncode == 0 and "extends, unchanged" in fits.stdout, fits.stderr


def test_a_key_id_given_as_a_public_key_is_named_as_one(tmp_path: Path) -> None:
    """bide-audit prints key ids (ed25519:<64 hex>); pasted into --pubkey, one was "a weak Ed25519 public key
    (small-order, mixed-order or non-canonical)" or, read as a key, a bare mismatch of keys."""
    url = _store_and_key(tmp_path, "run-1", 3)
    base = ["--store", url, "--run", "run-1", "--key", "log.key"]
    assert _audit("export", *base, "--head", "-o", "head.json", cwd=tmp_path).returncode == 0
    assert _audit("export", *base, "--record", "run:start", "-o", "bundle.json", cwd=tmp_path).returncode == 0
    key_id = json.loads((tmp_path / "head.json").read_text())["key_id"]
    assert key_id.startswith("ed25519:")
    whole, bare = _audit_all(
        ("verify", "bundle.json", "--pubkey", key_id),
        ("verify", "bundle.json", "--pubkey", key_id.removeprefix("ed25519:")),
        cwd=tmp_path,
    )
    assert whole.returncode == 4 and "is a key id, not a public key" in whole.stderr, whole.stderr
    assert bare.returncode in (1, 4), bare.stderr  # a weak key (4), or a key read from it that differs (1)
    assert "key id" in bare.stderr and ".pub" in bare.stderr, bare.stderr


def test_export_from_a_store_path_that_is_a_directory_or_a_pipe_says_what_is_there(tmp_path: Path) -> None:
    """`bide-audit export` called a directory or a pipe given as the store "the file does not exist"."""
    assert _audit("keygen", "log.key", cwd=tmp_path).returncode == 0
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "pipe")
    base = ["export", "--run", "r", "--head", "-o", "out.json", "--key", "log.key"]
    folder, pipe = _audit_all(
        (*base, "--store", f"sqlite:///{tmp_path / 'adir'}"),
        (*base, "--store", f"sqlite:///{tmp_path / 'pipe'}"),
        cwd=tmp_path,
    )
    assert folder.returncode == 4 and "it is a directory" in folder.stderr, folder.stderr
    assert pipe.returncode == 4 and "not a regular file (a pipe or a device)" in pipe.stderr, pipe.stderr
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("damage", ["a record deleted", "a record rewritten"])
def test_export_signs_and_proves_nothing_over_a_journal_changed_behind_bide(
    tmp_path: Path, damage: str
) -> None:
    """A head and a consistency proof came from the audit tree alone: after a record was deleted or
    rewritten in the store, `export --head` signed (and anchored) a head of records the journal no longer
    holds, and a consistency proof to it verified. Every export re-reads the journal first and refuses
    (exit 1, NOT VERIFIED, naming what differs), writing and anchoring nothing."""
    import sqlite3

    url = _store_and_key(tmp_path, "r", 6)
    base = ["--store", url, "--run", "r", "--key", "log.key"]
    assert _audit("export", *base, "--head", "-o", "then.json", cwd=tmp_path).returncode == 0
    with sqlite3.connect(tmp_path / "runs.db") as db:
        if damage == "a record deleted":
            db.execute("DELETE FROM bide_records WHERE run_id = 'r' AND key = 'approval:note:2'")
        else:
            db.execute(
                "UPDATE bide_records SET data = ? WHERE run_id = 'r' AND key = 'approval:note:2'",
                (b'{"altered": true}',),
            )
    (tmp_path / "anchors").mkdir()
    exports = [
        ("--head", "-o", "now.json", "--anchor-dir", "anchors"),
        ("--consistency-from", "3", "-o", "proof.json"),
        ("-o", "evidence.json"),
        ("--record", "approval:note:1", "-o", "bundle.json"),
    ]
    outcomes = _audit_all(*[("export", *base, *options) for options in exports], cwd=tmp_path)
    for options, done in zip(exports, outcomes, strict=True):
        assert done.returncode == 1, (options, done.stdout, done.stderr)
        said = done.stdout + done.stderr
        assert "NOT VERIFIED: the journal of run 'r'" in said and "behind bide" in said, (options, said)
        if damage == "a record deleted":
            assert "holds 7 records where its audit tree has 8" in said, said
    assert not (tmp_path / "now.json").exists() and not list((tmp_path / "anchors").iterdir())
    assert not list(tmp_path.glob("proof.json")) and not list(tmp_path.glob("evidence.json"))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (b"{not json", "is not a record bide wrote"),
        (b'{"key": "approval:note:2", "kind": "note"}', "no 32-byte salt"),
        ("the key of record 1", "has the key of record 1"),
        ("a second header", "a journal's header is its first record"),
        # What the verifiers accept, but bide itself does not read (bide show: exit 4).
        ("a kind bide does not write", "is not a record bide wrote"),
        ("a key of its own", "says it is 'approval:note:7'"),
    ],
)
def test_a_first_export_signs_nothing_over_a_record_changed_before_the_tree_took_it_in(
    tmp_path: Path, damage: bytes | str, said: str
) -> None:
    """With no audit tree yet (the run never exported), the export built the tree from the journal as it
    found it: a record edited in the store was signed, anchored and written into a package that
    verify-evidence then called forged. The export refuses it (exit 1), writing and anchoring nothing."""
    import json
    import sqlite3

    url = _store_and_key(tmp_path, "r", 4)
    with sqlite3.connect(tmp_path / "runs.db") as db:
        rows = dict(db.execute("SELECT key, data FROM bide_records WHERE run_id = 'r' ORDER BY seq"))
        if isinstance(damage, bytes):
            data = damage
        else:
            record = json.loads(rows["approval:note:2"])
            if damage == "a second header":
                record["kind"] = "header"
            elif damage == "a kind bide does not write":
                record["kind"] = "bogus"
            elif damage == "a key of its own":
                record["key"] = "approval:note:7"
            else:
                record["key"] = list(rows)[1]
            data = json.dumps(record).encode()
        db.execute("UPDATE bide_records SET data = ? WHERE run_id = 'r' AND key = 'approval:note:2'", (data,))
    (tmp_path / "anchors").mkdir()
    base = ["--store", url, "--run", "r", "--key", "log.key"]
    done = _audit("export", *base, "-o", "evidence.json", "--anchor-dir", "anchors", cwd=tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert said in done.stdout + done.stderr and "'approval:note:2'" in done.stdout + done.stderr
    assert not (tmp_path / "evidence.json").exists() and not list((tmp_path / "anchors").iterdir())

