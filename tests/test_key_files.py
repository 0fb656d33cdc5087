"""One Ed25519 key file serves both packages: `govern keygen` and `bide.audit.generate_key` write the same
formats (PKCS#8 PEM private key, SubjectPublicKeyInfo PEM public key at `<key>.pub`) and compute the same key
id, so an operator signs certificates and tree heads with one key and an auditor holds one public key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
