"""What every certificate format shares: its digest, its signature block, the accessors of a certificate
document, and the front matter of checking one (digest recomputed, signature verified).

A table certificate (`_certificate`), a composed one (`_composed`) and a symbolic one (`_symbolic`)
differ in what they certify and how that is checked; how they are identified, signed and
authenticated is the same, and lives here once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol, Self

from ._encoding import canonical_json
from ._errors import CertificateInvalid
from ._model import MachineRules, SignatureBlock, has_rules
from ._signing import is_strong_key, key_id, public_key_from_raw, verify_signature

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from ._signing import Signer

__all__ = [
    "DIGEST_DOMAIN",
    "MAX_CLOCK_SKEW",
    "CertificateDocument",
    "Signature",
    "check_front_matter",
    "compute_digest",
]

DIGEST_DOMAIN: Final = b"govern-certificate-digest-v1\n"
MAX_CLOCK_SKEW: Final = 300
"""Seconds a signature's `signed_at` may lie beyond the checker's clock (clocks drift; no more)."""


def compute_digest(document: dict[str, Any]) -> str:
    """`sha256:` + hex SHA-256 of the domain tag and the canonical JSON of every member except
    `digest` and `signature`."""
    body = {k: v for k, v in document.items() if k not in ("digest", "signature")}
    return "sha256:" + hashlib.sha256(DIGEST_DOMAIN + canonical_json(body)).hexdigest()


@dataclass(frozen=True)
class Signature:
    """Who signed a certificate and when (the signature itself was verified when this exists)."""

    key_id: str
    signed_at: str


class _Model(Protocol):
    """The members every certificate model has."""

    @property
    def machine(self) -> MachineRules: ...

    @property
    def digest(self) -> str: ...

    @property
    def signature(self) -> SignatureBlock | None: ...


class CertificateDocument:
    """The part of a certificate every format shares: its name, digest, signer and signing. A subclass
    holds `model` and says how its document reads back (`_from_document`)."""

    model: _Model

    @property
    def name(self) -> str:
        """The certified machine's name."""
        return self.model.machine.name

    @property
    def digest(self) -> str:
        """`sha256:` and the hex digest over everything but the signature block."""
        return self.model.digest

    @property
    def has_rules(self) -> bool:
        """True when every rule is an AST, so `govern check` re-derives the verdict from the rules."""
        return has_rules(self.model.machine)

    @property
    def signature(self) -> Signature | None:
        """Who signed and when, as written (verified only by checking); None if unsigned."""
        block = self.model.signature
        return None if block is None else Signature(block.key_id, block.signed_at)

    def document(self) -> dict[str, Any]:
        """The certificate as a JSON value (the signature member only when signed)."""
        raise NotImplementedError

    def to_bytes(self) -> bytes:
        """The canonical file content: canonical JSON and one newline."""
        return canonical_json(self.document()) + b"\n"

    def _from_document(self, document: dict[str, Any]) -> Self:
        raise NotImplementedError

    def signed(self, signer: Signer) -> Self:
        """A copy signed by `signer` now (replacing any earlier signature; the digest is unchanged)."""
        signed_at, value = signer.sign(self.digest)
        block = {
            "algorithm": "ed25519",
            "key_id": signer.key_id,
            "public_key": base64.b64encode(signer.public_key.public_bytes_raw()).decode("ascii"),
            "signed_at": signed_at,
            "value": value,
        }
        return self._from_document(self.document() | {"signature": block})


def check_front_matter(
    certificate: CertificateDocument,
    parsed: str,
    *,
    public_key: Ed25519PublicKey | None,
    require_signature: bool,
    now: datetime | None,
    max_clock_skew: float,
) -> tuple[list[str], Signature | None]:
    """The first steps of checking any certificate, after it was parsed (`parsed` says how): the digest
    recomputed and the signature verified. Returns the steps done and the verified signer, or raises
    `CertificateInvalid`."""
    steps = [parsed]
    expected = compute_digest(certificate.document())
    if expected != certificate.digest:
        raise CertificateInvalid(
            f"digest mismatch: the document hashes to {expected}, the certificate says "
            f"{certificate.digest}; it was altered after it was made"
        )
    steps.append(f"digest recomputed: {certificate.digest}")
    signature = _verify_signature(
        certificate, public_key, require_signature, now or datetime.now(UTC), max_clock_skew
    )
    if signature is not None:
        steps.append(f"Ed25519 signature by {signature.key_id} at {signature.signed_at} verified")
    return steps, signature


def _verify_signature(
    certificate: CertificateDocument,
    public_key: Ed25519PublicKey | None,
    require_signature: bool,
    now: datetime,
    max_clock_skew: float,
) -> Signature | None:
    block = certificate.model.signature
    if block is None:
        if public_key is not None or require_signature:
            raise CertificateInvalid("the certificate is not signed, and a signature was required")
        return None
    try:
        embedded = public_key_from_raw(base64.b64decode(block.public_key, validate=True))
    except (binascii.Error, ValueError):
        raise CertificateInvalid("signature.public_key is not an Ed25519 public key") from None
    if not is_strong_key(embedded):
        raise CertificateInvalid(
            "signature.public_key is a weak Ed25519 key (small-order, mixed-order or non-canonical): "
            "anyone can make signatures that verify under it, so it identifies no signer"
        )
    if key_id(embedded) != block.key_id:
        raise CertificateInvalid("signature.key_id is not the id of signature.public_key")
    if public_key is not None and key_id(public_key) != block.key_id:
        raise CertificateInvalid(
            f"signed by {block.key_id}, not by the key given ({key_id(public_key)})"
        )
    if not verify_signature(embedded, certificate.digest, block.key_id, block.signed_at, block.value):
        raise CertificateInvalid(f"the signature by {block.key_id} does not verify: the certificate "
                                 "or its signature block was altered")
    signed_at = datetime.strptime(block.signed_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    try:
        latest = now + timedelta(seconds=max_clock_skew)
    except OverflowError:
        latest = datetime.max.replace(tzinfo=UTC)  # a skew past the calendar's end allows any date
    if signed_at > latest:
        raise CertificateInvalid(
            f"signed at {block.signed_at}, in the future (this clock says "
            f"{now.strftime('%Y-%m-%dT%H:%M:%SZ')}, {max_clock_skew:g} s of skew allowed)"
        )
    return Signature(block.key_id, block.signed_at)
