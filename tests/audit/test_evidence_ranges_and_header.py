"""An evidence package read like a proof bundle: a size or position outside 0..2^63-1 is unreadable input
(exit 4) in both, a negative position too; position 0 holds the header in a partial package as in a
complete one; a negative size given to `export` is named as such."""

from __future__ import annotations

from pathlib import Path

import pytest

import bide
from bide.audit import AuditLog, SigningKey, verify_evidence
from bide.audit._cli import main
from bide.audit._errors import NotVerified, UnreadableInput
from bide.audit._formats import EvidencePackage
from bide.audit._strict import parse_artifact

from .conftest import write_run

_TOO_BIG = 2**63  # one above the largest size or position the formats hold


def _run(key: SigningKey) -> tuple[AuditLog, bide.MemoryStore]:
    store = bide.MemoryStore()
    write_run(store, "r", 4)
    return AuditLog(store, key), store


def _verify_file(tmp_path: Path, data: bytes, key: SigningKey, capsys: pytest.CaptureFixture[str]) -> int:
    (tmp_path / "ev.json").write_bytes(data)
    capsys.readouterr()
    return main(["verify-evidence", str(tmp_path / "ev.json"), "--pubkey", key.public.hex])


def test_a_head_size_above_the_format_range_is_unreadable_as_in_a_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was exit 1 ("not in the signed tree") for a package, exit 4 for a bundle."""
    key = SigningKey.generate()
    log, _ = _run(key)
    head = log.sign_head("r")
    package = log.evidence("r", head).to_json()
    big = package.replace(f'"size":{head.size},'.encode(), f'"size":{_TOO_BIG},'.encode(), 1)
    with pytest.raises(UnreadableInput, match=r"malformed at sth\.size: not a whole number of records"):
        parse_artifact(EvidencePackage, big, what="ev.json")
    assert _verify_file(tmp_path, big, key, capsys) == 4
    assert "UNREADABLE INPUT" in capsys.readouterr().err
    bundle = log.prove("r", "approval:note:0", head).to_json()
    big_bundle = bundle.replace(f'"size":{head.size},'.encode(), f'"size":{_TOO_BIG},'.encode())
    (tmp_path / "b.json").write_bytes(big_bundle)
    assert main(["verify", str(tmp_path / "b.json"), "--pubkey", key.public.hex]) == 4


@pytest.mark.parametrize("index", [-1, _TOO_BIG])
def test_a_record_position_outside_the_format_range_is_unreadable(
    index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A negative position was exit 1, "positions must strictly increase; -1 follows -1"."""
    key = SigningKey.generate()
    log, _ = _run(key)
    package = log.evidence("r").to_json()
    assert b'"records":[{"index":0,' in package
    edited = package.replace(b'"records":[{"index":0,', f'"records":[{{"index":{index},'.encode(), 1)
    with pytest.raises(UnreadableInput, match=rf"malformed at records\.0\.index: .* got {index}"):
        parse_artifact(EvidencePackage, edited, what="ev.json")
    assert _verify_file(tmp_path, edited, key, capsys) == 4


def test_a_partial_package_whose_position_0_is_not_the_header_fails() -> None:
    """A journal without its header was refused when complete but verified once one record was left out."""
    key = SigningKey.generate()
    _, store = _run(key)
    headless = bide.MemoryStore()
    for entry in store.load("r"):
        if entry.key != "@journal":
            headless.insert_many("r", [(entry.key, entry.data)])
    log = AuditLog(headless, key)
    keys = [e.key for e in headless.load("r")]
    for package in (log.evidence("r"), log.evidence("r", keys=keys[:-1])):
        with pytest.raises(NotVerified, match="the record at position 0 is 'run:start' of kind 'start'"):
            verify_evidence(package, key.public)
    # A partial package may leave position 0 out; one that holds it holds the header.
    verify_evidence(log.evidence("r", keys=keys[1:]), key.public)
    honest = AuditLog(store, key)
    verify_evidence(honest.evidence("r", keys=[e.key for e in store.load("r")][:-1]), key.public)


@pytest.mark.parametrize(
    ("sizes", "named"), [(("5", "-3"), "--consistency-to -3"), (("-3",), "--consistency-from -3")]
)
def test_a_negative_consistency_size_is_named_not_swapped(
    sizes: tuple[str, ...], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--consistency-from 5 --consistency-to -3` said to swap them, into a negative size."""
    options = ["--consistency-from", sizes[0]] + (["--consistency-to", sizes[1]] if len(sizes) > 1 else [])
    code = main(["export", "--store", f"sqlite:///{tmp_path / 'none.db'}", "--run", "r", "--key",
                 str(tmp_path / "log.key"), *options, "-o", str(tmp_path / "proof.json")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"{named} is negative: a size is a number of records" in err, err
    assert "reversed" not in err and not (tmp_path / "proof.json").exists()
    log, _ = _run(SigningKey.generate())
    with pytest.raises(bide.ConfigError, match=r"cannot prove 5 -> -3 .*a size is a number of records"):
        log.consistency("r", 5, -3)

