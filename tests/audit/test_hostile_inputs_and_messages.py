"""Findings of an adversarial review: evidence packages built to exhaust memory, `AuditLog.inclusion` on a
tree not synced yet, a damaged leaf cache blamed on the journal, heads of two keys verified without a word,
and messages that did not say what to do."""

from __future__ import annotations

import json
import sqlite3
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

import bide
from bide.audit import AuditLog, SigningKey
from bide.audit._cli import main
from bide.audit._errors import JournalDamaged, NotVerified, UnreadableInput
from bide.audit._formats import EvidencePackage, check_head, journal_leaf, sign_head
from bide.audit._merkle import leaf_hash, verify_inclusion
from bide.audit._strict import parse_artifact

from .conftest import write_run


def _package(tmp_path: Path) -> tuple[dict[str, object], SigningKey]:
    """A genuine evidence package (as parsed JSON) of a run of 13 records, and the key of its head."""
    key = SigningKey.generate()
    store = bide.MemoryStore()
    write_run(store, "r", 11)
    package = AuditLog(store, key).evidence("r")
    return json.loads(package.to_json()), key


def _with_records(package: dict[str, object], records: str, *, head_first: bool = True) -> bytes:
    head = json.dumps(package["sth"], separators=(",", ":"))
    if head_first:
        text = f'{{"format":"bide.audit.evidence.v1","sth":{head},"records":[{records}]}}'
    else:
        text = f'{{"format":"bide.audit.evidence.v1","records":[{records}],"sth":{head}}}'
    return text.encode() + b"\n"


_COUNT = 150_000
# A record's bytes, long enough that entries carrying it are no denser than genuine ones: those reach the
# checks made while the package is parsed; the packed shapes are refused before it is.
_R = "A" * 200
_HOSTILE: dict[str, tuple[Callable[[dict[str, object]], bytes], type[Exception], str]] = {
    # The real head, then far more entries than its 13 records: 2.7 GB for 110 MB before the fix.
    "many records": (
        lambda p: _with_records(
            p, ",".join(f'{{"index":{i},"record":"{_R}","path":[]}}' for i in range(_COUNT))
        ),
        NotVerified,
        "record at position 0 is not in the signed tree: its audit path has 0 hashes, where a path to that "
        "position has 4",
    ),
    # One character outside the Basic Multilingual Plane, at the end: the decoded text took 4 bytes a
    # character, the whole of it (now its escape pair is decoded instead).
    "many records, one emoji": (
        lambda p: _with_records(
            p,
            ",".join(f'{{"index":{i},"record":"{_R}","path":[]}}' for i in range(_COUNT))
            + ',{"index":0,"record":"\U0001f600","path":[]}',
        ),
        NotVerified,
        "record at position 0 is not in the signed tree: its audit path has 0 hashes, where a path to that "
        "position has 4",
    ),
    "entries with another member": (
        lambda p: _with_records(
            p, ",".join(f'{{"index":{i},"record":"{_R}","path":[],"x":0}}' for i in range(_COUNT))
        ),
        UnreadableInput,
        "is malformed at records.0: an object that is not a record",
    ),
    "records before the head": (
        lambda p: _with_records(
            p, ",".join(f'{{"index":{i},"record":"{_R}","path":[]}}' for i in range(_COUNT)), head_first=False
        ),
        UnreadableInput,
        "its records do not follow its signed head",
    ),
    "tiny records, packed": (
        lambda p: _with_records(p, ",".join(f'{{"index":{i},"record":"","path":[]}}' for i in range(_COUNT))),
        UnreadableInput,
        "and none is denser than one every 32",
    ),
    "a path of empty lists": (
        lambda p: _with_records(p, '{"index":0,"record":"","path":[' + ",".join(["[]"] * _COUNT * 8) + "]}"),
        UnreadableInput,
        "holds a JSON value every 1.5 bytes on average, and none is denser than one every 32",
    ),
    # Dense values, then padding that thinned an average of commas alone out below the limit.
    "packed lists, then padding": (
        lambda p: b'{"format":[' + b",".join([b"[]"] * _COUNT * 8) + b"]" + b" " * (_COUNT * 8 * 4) + b"}",
        UnreadableInput,
        "none is denser than one every 32",
    ),
}


@pytest.mark.parametrize("shape", list(_HOSTILE))
def test_a_hostile_evidence_package_is_refused_in_memory_near_its_size(tmp_path: Path, shape: str) -> None:
    """Every entry was parsed into a dict and then a model before the first was checked: a package of
    millions of tiny entries under a real head of 13 records took 25 times its size in memory (2.7 GB for
    110 MB) before it was refused. Now it is refused at the first record that cannot be under its head,
    or, denser than any artifact, unread; peak memory stays within about twice its size (the decoded text;
    with characters outside the BMP, their escaped copy and the text, where the text alone was four times
    its size)."""
    package, _ = _package(tmp_path)
    build, error, message = _HOSTILE[shape]
    data = build(package)
    assert len(data) > 3_000_000
    refused: Exception | None = None
    tracemalloc.start()
    try:
        try:
            parse_artifact(EvidencePackage, data, what="package.json")
        except (NotVerified, UnreadableInput) as exc:
            refused = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(data) + 64 * 1024, f"peak {peak} bytes for {len(data)} bytes of input"
    assert isinstance(refused, error) and message in str(refused), refused


def test_the_tiny_records_package_keeps_its_exit_code_and_a_genuine_one_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package, key = _package(tmp_path)
    (tmp_path / "hostile.json").write_bytes(_HOSTILE["many records"][0](package))
    (tmp_path / "genuine.json").write_text(json.dumps(package, separators=(",", ":")))
    pub = key.public.raw.hex()
    for command in (["verify-evidence", "--pubkey", pub], ["verify-approvals"]):
        assert main([*command, str(tmp_path / "hostile.json")]) == 1
        assert "NOT VERIFIED: record at position 0 is not in the signed tree" in capsys.readouterr().err
    assert main(["verify-evidence", "--pubkey", pub, str(tmp_path / "genuine.json")]) == 0
    assert "holds all of its records" in capsys.readouterr().out


def _unaudited(tmp_path: Path) -> bide.Store:
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    write_run(store, "fresh", 2)  # 4 records, no AuditLog yet: the run's tree was never synced
    return store


def test_inclusion_syncs_first_and_refuses_a_bad_argument_as_one(tmp_path: Path) -> None:
    """`inclusion` read the stored tree without syncing it or checking its arguments: on an intact run not
    synced yet, a size beyond the tree or a run that does not exist it raised AuditTablesDamaged ("the
    audit tables are damaged"), as for tampering. It now behaves as `root` and `consistency` do."""
    store = _unaudited(tmp_path)
    try:
        log = AuditLog(store, SigningKey.generate())
        path = log.inclusion("fresh", 1, 3)
        record = store.load("fresh")[1].data
        assert verify_inclusion(1, 3, leaf_hash(journal_leaf(record)), path, log.root("fresh", 3))
        with pytest.raises(bide.ConfigError, match="run 'fresh' has 4 records; there is no tree of size 100"):
            log.inclusion("fresh", 0, 100)
        with pytest.raises(bide.ConfigError, match="run 'nope' has 0 records; there is no tree of size 5"):
            log.inclusion("nope", 0, 5)
        with pytest.raises(bide.ConfigError, match="the tree of 3 records of run 'fresh' has no record 3"):
            log.inclusion("fresh", 3, 3)
    finally:
        store.close()


def test_a_damaged_leaf_cache_is_not_blamed_on_the_journal_alone(tmp_path: Path) -> None:
    """With level 0 of the audit tables zeroed (the journal untouched), export said the journal had "a
    record ... other than the tree's: records were changed, removed or inserted behind bide", with no next
    step. The tables are a cache of the journal: it now says either may differ, and what to do."""
    store = _unaudited(tmp_path)
    try:
        log = AuditLog(store, SigningKey.generate())
        log.sync("fresh")
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "runs.db") as db:
        zeroed = db.execute("UPDATE bide_audit_tiles SET hashes = zeroblob(length(hashes)) WHERE level = 0")
        assert zeroed.rowcount == 1
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        with pytest.raises(JournalDamaged) as raised:
            AuditLog(store, SigningKey.generate()).check_journal("fresh")
    finally:
        store.close()
    message = str(raised.value)
    assert "has at position 0 a record ('@journal' now) other than the tree's" in message
    assert "the journal or its audit tree (the audit tables, a cache of the journal) was changed" in message
    assert "to have the tree rebuilt from the journal; then check the rebuilt tree against a head" in message
    assert "`bide-audit verify-consistency`" in message and "restore the store from a backup" in message


def _heads_of_two_keys(tmp_path: Path) -> list[str]:
    store = bide.MemoryStore()
    write_run(store, "r", 6)
    first, second = AuditLog(store, SigningKey.generate()), AuditLog(store, SigningKey.generate())
    files = {
        "old.json": first.sign_head("r", size=3).to_json(),
        "new.json": second.sign_head("r", size=8).to_json(),
        "proof.json": first.consistency("r", 3, 8).to_json(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return [str(tmp_path / name) for name in files]


def test_heads_of_two_keys_are_named_without_pubkey(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --pubkey, heads signed by two different keys verified saying only "the heads' signatures
    were not checked". The proof holds (exit 0: a rotated key has no one --pubkey), but the two key ids
    are now named first under "Not proven", and in --json."""
    files = _heads_of_two_keys(tmp_path)
    old, new = (json.loads(Path(f).read_text())["key_id"] for f in files[:2])
    assert main(["verify-consistency", *files]) == 0
    out = capsys.readouterr().out
    assert "(the heads' signatures were not checked, and the heads name different keys)" in out
    assert f"Not proven: that one key signed both heads: they name different keys ({old} the first, " in out
    assert f"{new} the second)" in out
    assert main(["verify-consistency", "--json", *files]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["key_ids"] == [old, new] and doc["signatures_checked"] is False


def test_reversed_consistency_sizes_are_named_as_reversed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`export --consistency-from 10 --consistency-to 5` said "run 'r1' has 13 records; cannot prove 10 ->
    5"; `AuditLog.consistency` the same."""
    store = _unaudited(tmp_path)
    try:
        with pytest.raises(bide.ConfigError, match="the sizes are reversed; the older, smaller size comes"):
            AuditLog(store).consistency("fresh", 3, 1)
    finally:
        store.close()
    assert main(["keygen", str(tmp_path / "log.key")]) == 0
    capsys.readouterr()
    code = main(["export", "--store", f"sqlite:///{tmp_path / 'runs.db'}", "--run", "fresh", "--key",
                 str(tmp_path / "log.key"), "--consistency-from", "3", "--consistency-to", "1",
                 "-o", str(tmp_path / "proof.json")])  # fmt: skip
    assert code == 2 and not (tmp_path / "proof.json").exists()
    refused = capsys.readouterr().err
    assert "--consistency-from 3 is larger than --consistency-to 1: the sizes are reversed" in refused


def test_a_head_dated_in_the_future_says_when_how_far_and_which_option() -> None:
    """It said only "dated in the future (beyond the allowed clock skew)"."""
    key = SigningKey.generate()
    head = sign_head(key, "r", 0, leaf_hash(b""), timestamp_ns=1_000_000_600 * 10**9)
    with pytest.raises(NotVerified) as raised:
        check_head(head, key.public, now_ns=1_000_000_000 * 10**9, max_skew_ns=300 * 10**9)
    assert str(raised.value) == (
        "the tree head is dated in the future: 2001-09-09T01:56:40Z, 600 s ahead of this machine's clock, "
        "beyond the allowed clock skew of 300 s: check both clocks (`bide-audit` allows a larger skew with "
        "`--max-clock-skew SECONDS`, the library with `max_skew_ns=`)"
    )
