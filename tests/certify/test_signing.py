"""Ed25519 keys and the domain-separated certificate signature."""

from __future__ import annotations

import base64
import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from govern.certificate._errors import KeyFileUnreadable, SigningKeyError
from govern.certificate._signing import (
    SIGNATURE_DOMAIN,
    generate_key_pair,
    is_signing_time,
    load_private_key,
    load_public_key,
    raw_public_key,
    signed_bytes,
    verify_signature,
)

DIGEST = "sha256:" + "ab" * 32


def test_keygen_writes_a_private_key_only_the_owner_can_read(tmp_path: Path) -> None:
    public, key_id = generate_key_pair(tmp_path / "k")
    assert public == tmp_path / "k.pub"
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600
    signer = load_private_key(tmp_path / "k")
    assert signer.key_id == key_id
    assert raw_public_key(load_public_key(public)) == raw_public_key(signer.public_key)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "k.pub"]  # no temporary files left


def test_keygen_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    generate_key_pair(tmp_path / "k")
    before = (tmp_path / "k").read_bytes()
    with pytest.raises(SigningKeyError, match="already exists"):
        generate_key_pair(tmp_path / "k")
    assert (tmp_path / "k").read_bytes() == before
    generate_key_pair(tmp_path / "k", overwrite=True)
    assert (tmp_path / "k").read_bytes() != before
    with pytest.raises(SigningKeyError, match="no such directory"):
        generate_key_pair(tmp_path / "missing" / "k")


def test_a_readable_private_key_is_refused(tmp_path: Path) -> None:
    generate_key_pair(tmp_path / "k")
    os.chmod(tmp_path / "k", 0o640)
    with pytest.raises(SigningKeyError, match="chmod 600"):
        load_private_key(tmp_path / "k")


def test_unusable_key_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "junk").write_text("not a key")
    os.chmod(tmp_path / "junk", 0o600)
    with pytest.raises(SigningKeyError):
        load_private_key(tmp_path / "junk")
    with pytest.raises(SigningKeyError):
        load_public_key(tmp_path / "junk")
    with pytest.raises(KeyFileUnreadable, match=r"absent\.pub: no such file"):
        load_public_key(tmp_path / "absent.pub")
    with pytest.raises(KeyFileUnreadable, match="absent: no such file"):
        load_private_key(tmp_path / "absent")


def test_a_public_key_may_be_given_as_raw_base64(tmp_path: Path) -> None:
    generate_key_pair(tmp_path / "k")
    signer = load_private_key(tmp_path / "k")
    (tmp_path / "raw.pub").write_text(base64.b64encode(raw_public_key(signer.public_key)).decode() + "\n")
    assert raw_public_key(load_public_key(tmp_path / "raw.pub")) == raw_public_key(signer.public_key)


def test_signature_binds_digest_key_and_time(tmp_path: Path) -> None:
    generate_key_pair(tmp_path / "k")
    signer = load_private_key(tmp_path / "k")
    signed_at, value = signer.sign(DIGEST, now=datetime(2026, 1, 2, 3, 4, 5, 999, tzinfo=UTC))
    assert signed_at == "2026-01-02T03:04:05Z"
    public = signer.public_key
    assert verify_signature(public, DIGEST, signer.key_id, signed_at, value)
    assert not verify_signature(public, "sha256:" + "cd" * 32, signer.key_id, signed_at, value)
    assert not verify_signature(public, DIGEST, "ed25519:" + "00" * 32, signed_at, value)
    assert not verify_signature(public, DIGEST, signer.key_id, "2026-01-02T03:04:06Z", value)
    assert not verify_signature(public, DIGEST, signer.key_id, signed_at, "not base64")
    assert not verify_signature(public, DIGEST, signer.key_id, signed_at, value[:-4] + "AAA=")


def test_signed_bytes_are_domain_separated() -> None:
    data = signed_bytes(DIGEST, "ed25519:" + "00" * 32, "2026-01-02T03:04:05Z")
    assert data == f"{SIGNATURE_DOMAIN}\n{DIGEST}\ned25519:{'00' * 32}\n2026-01-02T03:04:05Z".encode()
    assert data.startswith(b"govern-certificate-signature-v1\n")


def test_a_signature_made_for_anything_else_does_not_verify(tmp_path: Path) -> None:
    generate_key_pair(tmp_path / "k")
    signer = load_private_key(tmp_path / "k")
    # The same key signing the bare digest (no domain tag) must not produce a certificate signature.
    bare = base64.b64encode(signer.private_key.sign(DIGEST.encode())).decode()
    assert not verify_signature(signer.public_key, DIGEST, signer.key_id, "2026-01-02T03:04:05Z", bare)


def test_signing_time_format() -> None:
    assert is_signing_time("2026-02-28T23:59:59Z")
    for text in ("2026-02-30T00:00:00Z", "2026-02-28 23:59:59Z", "2026-02-28T23:59:59+00:00", ""):
        assert not is_signing_time(text)


def test_pem_files_are_standard(tmp_path: Path) -> None:
    generate_key_pair(tmp_path / "k")
    key = serialization.load_pem_public_key((tmp_path / "k.pub").read_bytes())
    assert len(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)) == 32
