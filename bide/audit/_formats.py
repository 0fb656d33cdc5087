"""The portable artifacts and the exact bytes that are hashed and signed (see docs/audit.md).

Integers in signed bytes are unsigned 64-bit big-endian (`u64`); a variable-length byte string x is written
`field(x) = u64(len(x)) || x`; text is UTF-8.

- journal leaf data:  "bide.audit.journal-leaf.v1\\x00" || stored record bytes (verbatim)
- tree head signed bytes:  "bide.audit.sth.v1\\x00" || field("ed25519") || field(key_id) || field(log_id)
  || u64(size) || root (32 bytes) || u64(timestamp_ns)
"""

from __future__ import annotations

import base64
import struct
import time
from typing import Annotated, Any, Final, Literal

from pydantic import Field

from ._errors import NotVerified, UnreadableInput
from ._keys import ALG, PublicKey, SigningKey
from ._merkle import inclusion_path_length
from ._strict import B64, Artifact, ObjectCheck, strict_json

__all__ = [
    "CONSISTENCY_FORMAT",
    "EVIDENCE_FORMAT",
    "LEAF_TAG",
    "PROOF_FORMAT",
    "STH_FORMAT",
    "STH_TAG",
    "ConsistencyProof",
    "EvidencePackage",
    "EvidenceRecord",
    "Inclusion",
    "ProofBundle",
    "SignedTreeHead",
    "check_head",
    "decode_record_bytes",
    "field",
    "journal_leaf",
    "sign_head",
    "sth_signed_bytes",
    "u64",
]

STH_FORMAT: Final = "bide.audit.sth.v1"
PROOF_FORMAT: Final = "bide.audit.proof.v1"
EVIDENCE_FORMAT: Final = "bide.audit.evidence.v1"
CONSISTENCY_FORMAT: Final = "bide.audit.consistency.v1"
LEAF_TAG = b"bide.audit.journal-leaf.v1\x00"
STH_TAG = b"bide.audit.sth.v1\x00"
MAX_SKEW_NS = 5 * 60 * 10**9

_U64 = 2**64 - 1
Hash32 = Annotated[B64, Field(min_length=32, max_length=32)]
Sig64 = Annotated[B64, Field(min_length=64, max_length=64)]
# The largest size or position an artifact holds: u64 in the signed bytes, but 2^63 - 1 so that every
# implementation reads it as a signed 64-bit integer too.
MAX_SIZE: Final = 2**63 - 1
Size = Annotated[int, Field(ge=0, le=MAX_SIZE)]
Text = Annotated[str, Field(min_length=1, max_length=4096)]


def u64(n: int) -> bytes:
    """Unsigned 64-bit big-endian."""
    return struct.pack(">Q", n)


def field(data: bytes) -> bytes:
    """u64(len(data)) || data."""
    return u64(len(data)) + data


def journal_leaf(record_bytes: bytes) -> bytes:
    """The leaf data committed for one stored journal record."""
    return LEAF_TAG + record_bytes


class SignedTreeHead(Artifact):
    """A signed statement: the journal of run `log_id` had `size` records with Merkle root `root` at
    `timestamp_ns` (Unix nanoseconds, the signer's clock), signed by the key `key_id`."""

    format: Literal["bide.audit.sth.v1"] = STH_FORMAT
    alg: Literal["ed25519"] = "ed25519"
    key_id: Text
    log_id: Text
    size: Size
    root: Hash32
    timestamp_ns: Annotated[int, Field(gt=0, le=2**63 - 1)]
    signature: Sig64


def sth_signed_bytes(alg: str, key_id: str, log_id: str, size: int, root: bytes, timestamp_ns: int) -> bytes:
    """The exact bytes an STH signature covers."""
    if len(root) != 32:
        raise ValueError("root must be 32 bytes")
    return (
        STH_TAG
        + field(alg.encode())
        + field(key_id.encode())
        + field(log_id.encode())
        + u64(size)
        + root
        + u64(timestamp_ns)
    )


def sign_head(
    key: SigningKey, log_id: str, size: int, root: bytes, timestamp_ns: int | None = None
) -> SignedTreeHead:
    """Sign the head (log_id, size, root) now (or at `timestamp_ns`)."""
    ts = time.time_ns() if timestamp_ns is None else timestamp_ns
    kid = key.key_id
    sig = key.sign(sth_signed_bytes(ALG, kid, log_id, size, root, ts))
    return SignedTreeHead(key_id=kid, log_id=log_id, size=size, root=root, timestamp_ns=ts, signature=sig)


def check_head(
    sth: SignedTreeHead, key: PublicKey, *, now_ns: int | None = None, max_skew_ns: int = MAX_SKEW_NS
) -> None:
    """Raise NotVerified unless `sth` is signed by `key` and not dated in the future (beyond the skew).

    There is no maximum age: an old head stays valid; whether it is the latest is the auditor's question.
    """
    if sth.key_id != key.key_id:
        # The key given may be the head's key id read as a key (both are 64 hex characters).
        given_id = "ed25519:" + key.raw.hex() == sth.key_id
        raise NotVerified(
            f"the tree head names key {sth.key_id}, but the key given is {key.key_id}"
            + ("; what was given is the head's key id, not its public key: give the log's .pub file, or its "
               "64 hex characters" if given_id else "")
        )
    msg = sth_signed_bytes(sth.alg, sth.key_id, sth.log_id, sth.size, sth.root, sth.timestamp_ns)
    if not key.verify(sth.signature, msg):
        raise NotVerified(f"the tree head's signature does not verify under key {key.key_id}")
    now = time.time_ns() if now_ns is None else now_ns
    if sth.timestamp_ns > now + max_skew_ns:
        ahead = (sth.timestamp_ns - now) / 1e9
        dated = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(sth.timestamp_ns // 10**9))
        raise NotVerified(
            f"the tree head is dated in the future: {dated}, {ahead:.0f} s ahead of this machine's clock, "
            f"beyond the allowed clock skew of {max_skew_ns / 1e9:.0f} s: check both clocks (`bide-audit` "
            "allows a larger skew with `--max-clock-skew SECONDS`, the library with `max_skew_ns=`)"
        )


class Inclusion(Artifact):
    """Where a leaf sits: its `index` in the tree of `size` leaves, and the RFC 6962 audit path."""

    index: Size
    size: Size
    path: list[Hash32] = Field(max_length=64)


class ProofBundle(Artifact):
    """One journal record (its stored bytes, verbatim), its inclusion proof, and the signed head proven."""

    format: Literal["bide.audit.proof.v1"] = PROOF_FORMAT
    record: B64
    inclusion: Inclusion
    sth: SignedTreeHead


class EvidenceRecord(Artifact):
    """One record of an evidence package: its position, stored bytes and audit path."""

    index: Size
    record: B64
    path: list[Hash32] = Field(max_length=64)


class EvidencePackage(Artifact):
    """Records of one run's journal under one signed head; `complete` when it holds every record."""

    format: Literal["bide.audit.evidence.v1"] = EVIDENCE_FORMAT
    sth: SignedTreeHead
    records: list[EvidenceRecord]

    @classmethod
    def _object_check(cls, what: str) -> ObjectCheck | None:
        return _RecordsUnderHead(what)


class _RecordsUnderHead:
    """Checks an evidence package's records while its JSON is parsed, against its head (which the one
    spelling puts before them): positions strictly increase below the head's size and each audit path has
    the length its position needs. So a package is refused at its first record that cannot be the journal's,
    and what is read before is about as large in memory as on disk; millions of tiny made-up entries
    would otherwise take gigabytes before any was checked. Its head's signature is checked later."""

    _HEAD_MEMBERS = frozenset(SignedTreeHead.model_fields)
    _RECORD_MEMBERS = frozenset(EvidenceRecord.model_fields)
    # Objects that may precede the head: a file of another format (a proof bundle's inclusion) is left to
    # be named as such by `parse_artifact`.
    _BEFORE_HEAD = 8

    def __init__(self, what: str) -> None:
        self.what = what
        self.size: int | None = None
        self.before_head = 0
        self.last = -1
        self.records = 0
        self.enclosing_seen = False

    def __call__(self, value: dict[str, Any]) -> None:
        if self.size is None:
            self._before_head(value)
        elif value.keys() == self._RECORD_MEMBERS:
            self._record(self.size, value["index"], value["path"])
        elif not self.enclosing_seen:  # the package itself (or, in another format, what holds the head)
            self.enclosing_seen = True
        else:
            raise UnreadableInput(
                f"{self.what} is malformed at records.{self.records}: an object that is not a record "
                '({"index", "record", "path"})'
            )

    def _before_head(self, value: dict[str, Any]) -> None:
        if value.keys() == self._HEAD_MEMBERS:
            size = value["size"]
            # Refused as the head's own validation refuses it (exit 4, as in a proof bundle), before a
            # record is judged against it.
            if type(size) is not int or not 0 <= size <= MAX_SIZE:
                raise UnreadableInput(
                    f"{self.what} is malformed at sth.size: not a whole number of records from 0 to "
                    f"{MAX_SIZE}"
                )
            self.size = size
            return
        self.before_head += 1
        if self.before_head > self._BEFORE_HEAD:
            raise UnreadableInput(
                f"{self.what} is not an evidence package as bide writes it (its members in order: format, "
                "sth, records): its records do not follow its signed head"
            )

    def _record(self, size: int, index: Any, path: Any) -> None:
        if type(index) is not int or not isinstance(path, list):
            raise UnreadableInput(
                f"{self.what} is malformed at records.{self.records}: its index must be an integer and its "
                "path a list"
            )
        if not 0 <= index <= MAX_SIZE:
            raise UnreadableInput(
                f"{self.what} is malformed at records.{self.records}.index: a position is a whole number "
                f"from 0 to {MAX_SIZE}, got {index}"
            )
        if index <= self.last:
            raise NotVerified(f"record positions must strictly increase; {index} follows {self.last}")
        if index >= size:
            raise NotVerified(f"record position {index} is outside the signed tree of {size} records")
        needed = inclusion_path_length(index, size)
        if len(path) != needed:
            raise NotVerified(
                f"record at position {index} is not in the signed tree: its audit path has {len(path)} "
                f"hashes, where a path to that position has {needed}"
            )
        self.last = index
        self.records += 1


class ConsistencyProof(Artifact):
    """The RFC 6962 proof that the journal of `log_id` at `old_size` is a prefix of it at `new_size`."""

    format: Literal["bide.audit.consistency.v1"] = CONSISTENCY_FORMAT
    log_id: Text
    old_size: Size
    new_size: Size
    path: list[Hash32] = Field(max_length=128)


def decode_record_bytes(data: bytes) -> dict[str, Any]:
    """The JSON object of a stored record; it must carry a string `key`, a string `kind` and a 32-byte
    base64 `salt`. Other members are not interpreted here (newer records still verify)."""
    try:
        value = strict_json(data, what="record")
    except UnreadableInput as exc:
        raise NotVerified(f"a proven record is not a journal record: {exc}") from exc
    if not isinstance(value, dict):
        raise NotVerified("a proven record is not a JSON object")
    if not isinstance(value.get("key"), str) or not isinstance(value.get("kind"), str):
        raise NotVerified("a proven record has no string 'key' and 'kind'")
    salt = value.get("salt")
    try:
        raw = base64.b64decode(salt, validate=True) if isinstance(salt, str) else b""
    except ValueError:  # binascii.Error, or text that is not ASCII
        raw = b""
    if len(raw) != 32:
        raise NotVerified(f"record {value['key']!r} has no 32-byte salt; unsalted records are not proven")
    return value
