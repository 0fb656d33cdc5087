"""One Ed25519 key file serves both packages: `govern keygen` and `bide.audit.generate_key` write the same
formats (PKCS#8 PEM private key, SubjectPublicKeyInfo PEM public key at `<key>.pub`) and compute the same key
id, so an operator signs certificates and tree heads with one key and an auditor holds one public key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bide._files import SecondNotPlaced, replace_pair
from bide.audit import generate_key, load_signing_key
from bide.audit import load_public_key as load_audit_public_key
from govern.certificate._signing import load_private_key, load_public_key, verify_signature


def test_a_govern_key_signs_and_verifies_for_bide_audit(tmp_path: Path) -> None:
    key = tmp_path / "ops.key"
    done = subprocess.run(
        [sys.executable, "-m", "govern", "keygen", "-o", str(key)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    signer = load_signing_key(key)
    public = load_audit_public_key(Path(str(key) + ".pub"))
    assert signer.key_id == public.key_id == load_private_key(key).key_id
    message = b"bide tree head"
    assert public.verify(signer.sign(message), message)
    assert not public.verify(signer.sign(message), message + b"!")


def test_a_bide_audit_key_signs_and_verifies_for_govern(tmp_path: Path) -> None:
    key = tmp_path / "audit.key"
    made = generate_key(key)
    signer = load_private_key(key)  # refuses keys others can read: generate_key writes mode 0600
    assert signer.key_id == made.key_id
    signed_at, value = signer.sign("sha256:" + "ab" * 32)
    public = load_public_key(Path(str(key) + ".pub"))
    assert verify_signature(public, "sha256:" + "ab" * 32, signer.key_id, signed_at, value)
    assert not verify_signature(public, "sha256:" + "cd" * 32, signer.key_id, signed_at, value)


def test_a_key_pair_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    """`replace_pair`, which both keygens use with --force: a pair whose second file cannot be written
    leaves the old pair as it was; one whose second file cannot be renamed into place leaves no new first
    file (never a new private key beside an old public half); no temporary file is left either way."""
    first, second = tmp_path / "k", tmp_path / "k.pub"
    first.write_bytes(b"old private")
    second.write_bytes(b"old public")
    with pytest.raises(FileNotFoundError):  # the second cannot be written: its directory is not there
        replace_pair(first, b"new private", 0o600, tmp_path / "gone" / "k.pub", b"new public", 0o644)
    assert first.read_bytes() == b"old private" and second.read_bytes() == b"old public"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "k.pub"]

    second.unlink()
    second.mkdir()  # a rename of a file over a directory fails
    (second / "inside").write_bytes(b"")
    with pytest.raises(SecondNotPlaced) as refused:
        replace_pair(first, b"new private", 0o600, second, b"new public", 0o644)
    assert isinstance(refused.value, OSError) and isinstance(refused.value.__cause__, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pub"]

    second.joinpath("inside").unlink()
    second.rmdir()
    replace_pair(first, b"new private", 0o600, second, b"new public", 0o644)
    assert first.read_bytes() == b"new private" and second.read_bytes() == b"new public"
    assert first.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "k.pub"]
