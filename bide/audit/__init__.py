"""bide.audit: the journal as an RFC 6962 audit log, verifiable offline with a public key and a file.

- `AuditLog(store, key, publisher)`: the Merkle tree over each run's journal (hashes kept in the store),
  signed tree heads, proof bundles, evidence packages, consistency proofs.
- `AuditedStore(store, log)`: a store wrapper that syncs the tree and anchors a head after every append.
- `verify_bundle`, `verify_evidence`, `verify_consistency_proof`: offline checks (also `bide-audit`).
- Keys: `generate_key`, `load_signing_key`, `load_public_key`, `key_id`.
- Anchoring: `DirectoryPublisher` (refuses a head that forks from the run's heads there: `ForkRefused`),
  `HttpPublisher`, or any `Publisher`.
- The tree math itself: `MerkleTree`, `leaf_hash`, `node_hash`, `verify_inclusion`, `verify_consistency`.

Formats are documented byte for byte in docs/audit.md.

The re-exports are lazy: `import bide.audit` loads only its exceptions, and the first use of a name imports
the submodule that defines it, so the `bide-audit` and `bide` command lines start without pydantic,
cryptography and SQLAlchemy.
"""

from __future__ import annotations

import typing as _typing

from .._lazy import LazyExports as _LazyExports

if _typing.TYPE_CHECKING:  # type checkers and IDEs see the real objects; at run time `__getattr__` loads them
    from ._anchor import AnchorError, DirectoryPublisher, ForkRefused, HttpPublisher, Publisher
    from ._audited import AuditedStore
    from ._errors import AuditError, JournalDamaged, NotVerified, UnreadableInput
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
    "ForkRefused",
    "HttpPublisher",
    "Inclusion",
    "JournalDamaged",
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

# Where each public name is defined, submodule -> names (a test checks this against the imports above).
# fmt: off
_SUBMODULE_NAMES: dict[str, tuple[str, ...]] = {
    "_anchor": ("AnchorError", "DirectoryPublisher", "ForkRefused", "HttpPublisher", "Publisher"),
    "_audited": ("AuditedStore",),
    "_errors": ("AuditError", "JournalDamaged", "NotVerified", "UnreadableInput"),
    "_formats": (
        "ConsistencyProof", "EvidencePackage", "EvidenceRecord", "Inclusion", "ProofBundle", "SignedTreeHead",
        "check_head", "journal_leaf", "sign_head", "sth_signed_bytes",
    ),
    "_keys": ("PublicKey", "SigningKey", "generate_key", "key_id", "load_public_key", "load_signing_key"),
    "_log": ("AuditLog",),
    "_merkle": ("EMPTY_ROOT", "leaf_hash", "node_hash", "verify_consistency", "verify_inclusion"),
    "_strict": ("parse_artifact",),
    "_tree": ("MerkleTree",),
    "_verify": ("Verified", "verify_bundle", "verify_consistency_proof", "verify_evidence"),
}
# fmt: on
_EXPORTS = _LazyExports(__name__, globals(), __all__, _SUBMODULE_NAMES)

# Hidden from type checkers: with a visible module `__getattr__`, mypy would accept any `bide.audit.<typo>`.
if not _typing.TYPE_CHECKING:
    __getattr__ = _EXPORTS.load
__dir__ = _EXPORTS.names  # the loaded names and every public one, loaded or not


# The exceptions are published now (one small module): a traceback names bide.audit.NotVerified, not
# bide.audit._errors.NotVerified, even when the program never spelled the class's name.
_EXPORTS.publish("_errors")
