"""Signature and reading defects an adversarial review found in `govern check`, each through the command in
a subprocess: a signature block that differs by one padding bit, signatures anyone can make (small-order
keys), signatures from the future, and rules whose arithmetic overflows the checker."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from govern.certificate._certificate import Certificate
from govern.certificate._encoding import canonical_json
from govern.certificate._make import certify
from govern.certificate._signing import generate_key_pair, load_private_key

from .conftest import govern, orders_registry
from .test_certificate import forge

# The identity point: a small-order Ed25519 key. (R = identity, S = 0) verifies under it for every
# message, and OpenSSL accepts it, so anyone can "sign" as this key.
SMALL_ORDER_KEY = bytes([1]) + bytes(31)
ANYONE_SIGNATURE = bytes([1]) + bytes(31) + bytes(32)


@pytest.fixture(scope="module")
def orders() -> Certificate:
    return certify(orders_registry())


def _with_signature(certificate: Certificate, block: dict[str, Any]) -> bytes:
    return canonical_json(certificate.document() | {"signature": block}) + b"\n"


def _signed(certificate: Certificate, key: Path, now: datetime | None = None) -> dict[str, Any]:
    signer = load_private_key(key)
    signed_at, value = signer.sign(certificate.digest, now=now)
    raw = signer.public_key.public_bytes_raw()
    return {"algorithm": "ed25519", "key_id": signer.key_id, "public_key": base64.b64encode(raw).decode(),
            "signed_at": signed_at, "value": value}


def test_a_public_key_with_non_zero_padding_bits_is_unreadable(tmp_path: Path, orders: Certificate) -> None:
    generate_key_pair(tmp_path / "k")
    block = _signed(orders, tmp_path / "k")
    (tmp_path / "good.json").write_bytes(_with_signature(orders, block))
    good = govern("check", "good.json", "--pubkey", "k.pub", "--require-signature", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    text = block["public_key"]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet[alphabet.index(text[-2]) ^ 1]  # the low bit of the last character is padding
    assert base64.b64decode(text[:-2] + last + "=") == base64.b64decode(text)
    bent = {**block, "public_key": text[:-2] + last + "="}
    (tmp_path / "bent.json").write_bytes(_with_signature(orders, bent))
    done = govern("check", "bent.json", "--pubkey", "k.pub", "--require-signature", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "canonical base64" in done.stderr


def test_a_signature_under_a_small_order_key_is_refused(tmp_path: Path, orders: Certificate) -> None:
    block = {
        "algorithm": "ed25519",
        "key_id": "ed25519:" + hashlib.sha256(SMALL_ORDER_KEY).hexdigest(),
        "public_key": base64.b64encode(SMALL_ORDER_KEY).decode(),
        "signed_at": "2026-01-02T03:04:05Z",
        "value": base64.b64encode(ANYONE_SIGNATURE).decode(),
    }
    (tmp_path / "anyone.json").write_bytes(_with_signature(orders, block))
    done = govern("check", "anyone.json", "--require-signature", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "weak Ed25519 key" in done.stderr
    (tmp_path / "weak.pub").write_text(base64.b64encode(SMALL_ORDER_KEY).decode() + "\n")
    done = govern("check", "anyone.json", "--pubkey", "weak.pub", cwd=tmp_path)
    assert done.returncode == 2 and "weak Ed25519 key" in done.stderr, done.stdout + done.stderr


def test_a_signature_dated_in_the_future_is_refused(tmp_path: Path, orders: Certificate) -> None:
    generate_key_pair(tmp_path / "k")
    block = _signed(orders, tmp_path / "k", now=datetime(2101, 1, 1, tzinfo=UTC))
    (tmp_path / "future.json").write_bytes(_with_signature(orders, block))
    done = govern("check", "future.json", "--pubkey", "k.pub", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "in the future" in done.stderr
    skew = str(100 * 366 * 24 * 3600)
    assert govern("check", "future.json", "--pubkey", "k.pub", "--max-clock-skew", skew,
                  cwd=tmp_path).returncode == 0


def test_an_effect_literal_at_the_int64_limit_is_invalid_not_an_internal_error(
    tmp_path: Path, orders: Certificate
) -> None:
    def overflow(document: dict[str, Any]) -> None:
        [restock] = [e for e in document["machine"]["events"] if e["name"] == "restock"]
        assert restock["effect"][0][1] == ["add", ["var", 2], ["lit", 1]]
        restock["effect"][0][1][2][1] = 2**63 - 1

    (tmp_path / "overflow.json").write_bytes(forge(orders, overflow))
    done = govern("check", "overflow.json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "64-bit" in done.stderr and "internal error" not in done.stderr
    done = govern("check", "overflow.json", "--json", cwd=tmp_path)
    assert done.returncode == 1 and '"exit_code": 1' in done.stdout
