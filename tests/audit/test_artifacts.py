"""Keys, signed heads, strict reading, and: no single-byte change of an artifact ever verifies."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bide
from bide.audit import (
    AuditLog,
    EvidencePackage,
    NotVerified,
    ProofBundle,
    SignedTreeHead,
    SigningKey,
    UnreadableInput,
    check_head,
    generate_key,
    key_id,
    load_public_key,
    load_signing_key,
    parse_artifact,
    sign_head,
    sth_signed_bytes,
)
from bide.audit._cli import main

from .conftest import write_run


def test_key_files(tmp_path: Path) -> None:
    path = tmp_path / "log.key"
    key = generate_key(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_signing_key(path).key_id == key.key_id
    pub = load_public_key(tmp_path / "log.key.pub")
    assert pub.raw == key.public.raw
    assert load_public_key(pub.hex).raw == pub.raw
    assert key.key_id == "ed25519:" + hashlib.sha256(pub.raw).hexdigest() == key_id(pub.raw)
    with pytest.raises(bide.ConfigError):
        generate_key(path)  # never overwrites
    (tmp_path / "junk").write_text("not a key")
    with pytest.raises(UnreadableInput):
        load_signing_key(tmp_path / "junk")
    with pytest.raises(UnreadableInput):
        load_public_key(tmp_path / "missing.pub")


def test_sth_signed_bytes_layout() -> None:
    root = bytes(range(32))
    msg = sth_signed_bytes("ed25519", "ed25519:ab", "run-1", 5, root, 7)
    expected = (
        b"bide.audit.sth.v1\x00"
        + (7).to_bytes(8, "big")
        + b"ed25519"
        + (10).to_bytes(8, "big")
        + b"ed25519:ab"
        + (5).to_bytes(8, "big")
        + b"run-1"
        + (5).to_bytes(8, "big")
        + root
        + (7).to_bytes(8, "big")
    )
    assert msg == expected


def test_head_binds_run_size_root_time_and_key() -> None:
    key = SigningKey.generate()
    sth = sign_head(key, "run-1", 3, bytes(32), 10**18)
    check_head(sth, key.public, now_ns=10**18)
    for change in ({"log_id": "run-2"}, {"size": 4}, {"root": b"\x01" * 32}, {"timestamp_ns": 10**18 + 1}):
        with pytest.raises(NotVerified):
            check_head(sth.model_copy(update=change), key.public, now_ns=10**18)
    with pytest.raises(NotVerified, match="names key"):
        check_head(sth, SigningKey.generate().public, now_ns=10**18)
    with pytest.raises(NotVerified, match="future"):
        check_head(sth, key.public, now_ns=10**18 - 10 * 60 * 10**9)


def _sth_json() -> bytes:
    return sign_head(SigningKey.generate(), "r", 1, bytes(32), 10**18).to_json()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda v: {**v, "extra": 1},
        lambda v: {**v, "size": "1"},
        lambda v: {**v, "size": True},
        lambda v: {**v, "size": 1.0},
        lambda v: {**v, "size": -1},
        lambda v: {**v, "root": v["root"].rstrip("=")},
        lambda v: {**v, "root": base64.b64encode(bytes(31)).decode()},
        lambda v: {**v, "signature": "!" + v["signature"][1:]},
        lambda v: {**v, "format": "bide.audit.sth.v0"},
        lambda v: {k: x for k, x in v.items() if k != "timestamp_ns"},
        lambda v: {("Size" if k == "size" else k): x for k, x in v.items()},
    ],
)
def test_strict_reading_refuses_malformed_heads(mutate: object) -> None:
    value = json.loads(_sth_json())
    data = json.dumps(mutate(value), separators=(",", ":")).encode()  # type: ignore[operator]
    with pytest.raises(UnreadableInput):
        parse_artifact(SignedTreeHead, data)


def test_strict_reading_refuses_bad_json() -> None:
    good = _sth_json()
    text = good.decode().rstrip("\n")
    for bad in [
        text[:-1] + ',"size":1}',  # duplicate key
        text.replace('"size":1', '"size":NaN'),
        b"\xff".decode("latin-1") + text,
        text.replace('"r"', '"\\ud800"'),
        json.dumps(json.loads(text), indent=1),  # re-encoded: not the artifact's one spelling
        "[]",
        "",
    ]:
        with pytest.raises(UnreadableInput):
            parse_artifact(SignedTreeHead, bad.encode("utf-8", "surrogatepass"))
    with pytest.raises(UnreadableInput, match="limit"):
        from bide.audit._strict import strict_json

        strict_json(good, max_bytes=10)
    assert parse_artifact(SignedTreeHead, good) == parse_artifact(SignedTreeHead, good.rstrip(b"\n"))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("artifacts")
    key = SigningKey.generate()
    (root / "log.pub").write_bytes(key.public.pem())
    store = bide.MemoryStore()
    write_run(store, "run", 5)
    log = AuditLog(store, key)
    old = log.sign_head("run")
    bide.Journal(store, "run").load().write([bide.GateRecord(key="approval:x", data=[1, 2])])
    new = log.sign_head("run")
    files = {
        "bundle": log.prove("run", "approval:note:2", new).to_json(),
        "evidence": log.evidence("run", new).to_json(),
        "old": old.to_json(),
        "new": new.to_json(),
        "proof": log.consistency("run", old.size).to_json(),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    return {"dir": root, "files": files}


def _run_cli(art: dict[str, object], kind: str, files: dict[str, bytes]) -> int:
    d: Path = art["dir"]  # type: ignore[assignment]
    paths = {}
    for name, data in files.items():
        p = d / f"t-{name}"
        p.write_bytes(data)
        paths[name] = str(p)
    pub = str(d / "log.pub")
    if kind == "bundle":
        return main(["verify", paths["bundle"], "--pubkey", pub])
    if kind == "evidence":
        return main(["verify-evidence", paths["evidence"], "--pubkey", pub])
    return main(["verify-consistency", paths["old"], paths["new"], paths["proof"], "--pubkey", pub])


def test_untouched_artifacts_verify(artifacts: dict[str, object]) -> None:
    files: dict[str, bytes] = artifacts["files"]  # type: ignore[assignment]
    assert _run_cli(artifacts, "bundle", {"bundle": files["bundle"]}) == 0
    assert _run_cli(artifacts, "evidence", {"evidence": files["evidence"]}) == 0
    assert _run_cli(artifacts, "consistency", {k: files[k] for k in ("old", "new", "proof")}) == 0


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["bundle", "evidence", "old", "new", "proof"]), st.data())
def test_any_single_byte_change_never_verifies(
    artifacts: dict[str, object], target: str, data: st.DataObject
) -> None:
    files: dict[str, bytes] = dict(artifacts["files"])  # type: ignore[call-overload]
    blob = bytearray(files[target])
    pos = data.draw(st.integers(0, len(blob) - 1), label="position")
    new_byte = data.draw(st.integers(0, 255).filter(lambda b: b != blob[pos]), label="byte")
    blob[pos] = new_byte
    files[target] = bytes(blob)
    kind = target if target in ("bundle", "evidence") else "consistency"
    code = _run_cli(artifacts, kind, files if kind == "consistency" else {target: files[target]})
    assert code in (1, 4), f"changing byte {pos} of {target} gave exit {code}"


def test_exit_codes_for_unusable_input(artifacts: dict[str, object], tmp_path: Path) -> None:
    d: Path = artifacts["dir"]  # type: ignore[assignment]
    pub = str(d / "log.pub")
    assert main(["verify", str(tmp_path / "missing.json"), "--pubkey", pub]) == 4
    assert main(["verify", str(d / "evidence"), "--pubkey", pub]) == 4  # wrong artifact kind
    assert main(["verify", str(d / "bundle"), "--pubkey", str(tmp_path / "nokey")]) == 4
    other = SigningKey.generate().public.hex
    assert main(["verify", str(d / "bundle"), "--pubkey", other]) == 1
    assert main(["verify", str(d / "bundle"), "--pubkey", pub, "--max-input-bytes", "10"]) == 4
    with pytest.raises(SystemExit) as exc:
        main(["verify"])
    assert exc.value.code == 2


def test_evidence_package_tampering(artifacts: dict[str, object]) -> None:
    files: dict[str, bytes] = artifacts["files"]  # type: ignore[assignment]
    pkg = parse_artifact(EvidencePackage, files["evidence"])
    records = list(pkg.records)
    d: Path = artifacts["dir"]  # type: ignore[assignment]
    pub = str(d / "log.pub")
    # reordering, dropping the header of a complete-looking package, and emptying it all fail
    for bad in (
        pkg.model_copy(update={"records": [records[1], records[0], *records[2:]]}),
        pkg.model_copy(update={"records": []}),
        pkg.model_copy(update={"records": [records[0].model_copy(update={"index": 1}), *records[1:]]}),
    ):
        p = d / "tampered.json"
        p.write_bytes(bad.to_json())
        assert main(["verify-evidence", str(p), "--pubkey", pub]) == 1
    bundle = parse_artifact(ProofBundle, files["bundle"])
    wrong = bundle.model_copy(update={"inclusion": bundle.inclusion.model_copy(update={"index": 0})})
    p = d / "tampered.json"
    p.write_bytes(wrong.to_json())
    assert main(["verify", str(p), "--pubkey", pub]) == 1


def _mixed_order(raw: bytes) -> bytes:
    """raw's point plus the order-2 point (0, -1), encoded: a key that verifies more than one signer."""
    p = 2**255 - 19
    y = int.from_bytes(raw, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    # (x, y) + (0, -1) = (-x, -y): negate y, and the sign of x flips unless x is 0
    return (((p - y) % p) | ((sign ^ 1) << 255)).to_bytes(32, "little")


def test_weak_public_keys_are_refused(tmp_path: Path) -> None:
    p = 2**255 - 19
    good = SigningKey.generate().public.raw
    weak = {
        "identity": b"\x01" + bytes(31),
        "order 2": (p - 1).to_bytes(32, "little"),
        "mixed order": _mixed_order(good),
        "non-canonical": (p + 1).to_bytes(32, "little"),
    }
    assert load_public_key(good.hex()).raw == good
    for name, raw in weak.items():
        with pytest.raises(UnreadableInput):
            load_public_key(raw.hex())
        assert main(["verify", "nothing.json", "--pubkey", raw.hex()]) == 4, name


def test_a_forged_head_beside_an_unreadable_file_reports_not_verified(artifacts: dict[str, object]) -> None:
    files: dict[str, bytes] = artifacts["files"]  # type: ignore[assignment]
    head = parse_artifact(SignedTreeHead, files["new"])
    forged = head.model_copy(update={"size": head.size + 1}).to_json()
    assert _run_cli(artifacts, "consistency", {"old": files["old"], "new": forged, "proof": b"{"}) == 1
    assert _run_cli(artifacts, "consistency", {"old": files["old"], "new": files["new"], "proof": b"{"}) == 4
