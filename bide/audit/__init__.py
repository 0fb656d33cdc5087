"""bide.audit: the journal as an RFC 6962 audit log, verifiable offline with a public key and a file.

- `AuditLog(store, key, publisher)`: the Merkle tree over each run's journal (hashes kept in the store),
  signed tree heads, proof bundles, evidence packages, consistency proofs.
- `AuditedStore(store, log)`: a store wrapper that syncs the tree and anchors a head after every append.
- `verify_bundle`, `verify_evidence`, `verify_consistency_proof`: offline checks (also `bide-audit`).
- Keys: `generate_key`, `load_signing_key`, `load_public_key`, `key_id`.
- Anchoring: `DirectoryPublisher`, `HttpPublisher`, or any `Publisher`.
- The tree math itself: `MerkleTree`, `leaf_hash`, `node_hash`, `verify_inclusion`, `verify_consistency`.

Formats are documented byte for byte in docs/audit.md.
"""

from __future__ import annotations

from ._anchor import AnchorError, DirectoryPublisher, HttpPublisher, Publisher
from ._audited import AuditedStore
from ._errors import AuditError, NotVerified, UnreadableInput
from ._formats import (
    ConsistencyProof,
    EvidencePackage,
    EvidenceRecord,
    Inclusion,
    ProofBundle,
    SignedTreeHead,
    check_head,
    journal_leaf,
    sign_head,
    sth_signed_bytes,
)
from ._keys import PublicKey, SigningKey, generate_key, key_id, load_public_key, load_signing_key
from ._log import AuditLog
from ._merkle import EMPTY_ROOT, leaf_hash, node_hash, verify_consistency, verify_inclusion
from ._strict import parse_artifact
from ._tree import MerkleTree
from ._verify import Verified, verify_bundle, verify_consistency_proof, verify_evidence

__all__ = [
    "EMPTY_ROOT",
    "AnchorError",
    "AuditError",
    "AuditLog",
    "AuditedStore",
    "ConsistencyProof",
    "DirectoryPublisher",
    "EvidencePackage",
    "EvidenceRecord",
    "HttpPublisher",
    "Inclusion",
    "MerkleTree",
    "NotVerified",
    "ProofBundle",
    "PublicKey",
    "Publisher",
    "SignedTreeHead",
    "SigningKey",
    "UnreadableInput",
    "Verified",
    "check_head",
    "generate_key",
    "journal_leaf",
    "key_id",
    "leaf_hash",
    "load_public_key",
    "load_signing_key",
    "node_hash",
    "parse_artifact",
    "sign_head",
    "sth_signed_bytes",
    "verify_bundle",
    "verify_consistency",
    "verify_consistency_proof",
    "verify_evidence",
    "verify_inclusion",
]

# Public classes report their public path (bide.audit.X) in reprs and tracebacks.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("bide.audit._"):
        _obj.__module__ = "bide.audit"
del _name, _obj
