"""A key id (`ed25519:<64 hex>`, what bide-audit prints) pasted where an approver's public key is needed:
the message says that a key id may have been given, and where the public key is."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import bide
from bide.approvals import ApprovalGate
from bide.audit import AuditLog, SigningKey
from bide.audit._ed25519 import is_strong_public_key

from .helpers import LOG_KEY, approved_run, audit_cli

pytestmark = pytest.mark.slow


def _key_whose_id_reads_as_a_key() -> SigningKey:
    """A key whose id's 64 hex characters happen to decode as a strong public key (one key in about 16)."""
    while True:
        key = SigningKey.generate()
        if is_strong_public_key(hashlib.sha256(key.public.raw).digest()):
            return key


def test_a_key_id_given_for_an_approver_is_named_as_the_likely_mistake(tmp_path: Path) -> None:
    approvers = {"alice": _key_whose_id_reads_as_a_key(), "bob": SigningKey.generate(),
                 "carol": SigningKey.generate()}
    store, _ = approved_run(approvers)
    (tmp_path / "evidence.json").write_bytes(AuditLog(store, LOG_KEY).evidence("r").to_json())
    others = [f"--approver={n}={approvers[n].public.hex}" for n in ("bob", "carol")]
    alice_id = approvers["alice"].key_id
    weak = next(
        k
        for k in iter(SigningKey.generate, None)
        if not is_strong_public_key(hashlib.sha256(k.public.raw).digest())
    )
    for spec in (alice_id, weak.key_id.split(":")[1]):  # as printed; without its prefix, not a key at all
        pin = f"--approver=alice={spec}"
        done = audit_cli("verify-approvals", "evidence.json", pin, *others, cwd=tmp_path)
        assert done.returncode == 4, done.stderr
        assert "a key id (ed25519:<64 hex>" in done.stderr and "may have been given" in done.stderr
        assert ".pub written beside their key" in done.stderr
    # Without its prefix, alice's id decodes as a key: the policy check names it as her key id.
    done = audit_cli("verify-approvals", "evidence.json", f"--approver=alice={alice_id[8:]}", *others,
                     cwd=tmp_path)
    assert done.returncode == 5, done.stderr
    assert "the key pinned for alice is the key id of the package's key for that seat" in done.stderr
    assert "may have been given where a public key is needed" in done.stderr


def test_a_gate_given_a_key_id_says_so() -> None:
    key_id = SigningKey.generate().key_id
    with pytest.raises(bide.BideError, match=r"the key given for approver 'alice'.*may have been given"):
        ApprovalGate.k_of_n(1, {"alice": key_id})
