"""Approval policies (k of n named approvers, each seat one Ed25519 key) and the bytes approvers sign.

u64 is unsigned 64-bit big-endian, field(x) = u64(len(x)) || x, text is UTF-8:

    approvers_digest = SHA-256("bide.approval.approvers.v1\\x00" || u64(n)
                               || for each approver, sorted by the UTF-8 bytes of its name:
                                  field(name) || field(raw 32-byte public key))
    policy_digest    = SHA-256("bide.approval.policy.v1\\x00" || u64(need) || approvers_digest)
    journal_digest   = SHA-256(the stored bytes of the run's "@journal" header record)
    decision bytes   = "bide.approval.decision.v2\\x00" || journal_digest (32 bytes) || field(run_id)
                       || field(call_id) || field(tool) || arguments_digest (32 bytes) || field(approver)
                       || (0x01 approve | 0x00 deny) || u64(need) || approvers_digest (32 bytes)

The header carries a random salt, so the journal digest names one journal: a decision signed for run R in
one store does not verify in another store's run R. Decisions signed as "bide.approval.decision.v1"
(before the journal digest was signed) verify nowhere.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError, StoreError
from ..audit._errors import UnreadableInput
from ..audit._formats import field, u64
from ..audit._keys import PublicKey, load_public_key

__all__ = ["ApprovalPolicy", "Approver", "decision_bytes", "journal_digest_of"]

APPROVERS_TAG = b"bide.approval.approvers.v1\x00"
POLICY_TAG = b"bide.approval.policy.v1\x00"
DECISION_TAG = b"bide.approval.decision.v2\x00"
# A key id is "ed25519:" and 64 hex characters of SHA-256(key), as bide-audit prints it; a public key given
# as text is 64 hex characters too, so a key id pasted without its prefix reads as a (usually weak) key.
_KEY_ID = re.compile(r"(ed25519:)?[0-9a-fA-F]{64}")
KEY_ID_HINT = (
    "a key id (ed25519:<64 hex>, as bide-audit prints it: a hash of the key, which cannot be turned back "
    "into it) may have been given where a public key is needed: give the approver's public key file (the "
    ".pub written beside their key by `bide keygen` or `bide-audit keygen`) or its 64 hex characters"
)


@dataclass(frozen=True)
class Approver:
    """One seat of a policy: a name and the Ed25519 public key that speaks for it."""

    name: str
    key: PublicKey


#: The longest approver name, in characters: it is part of the key of each decision record, which a
#: PostgreSQL index holds (a name of thousands of characters could never record a decision there).
MAX_APPROVER_NAME = 128


#: The most seats a policy has. Every seat's key is checked to be strong whenever a policy is read (pure
#: arithmetic, milliseconds per key: `bide.audit._ed25519`), also from an evidence package anyone can write,
#: where a policy of a million made-up keys would take hours to refuse. A call is put to a handful of
#: people; no real policy comes near 256.
MAX_SEATS = 256


# True while `from_json(recorded=True)` reads a policy: one recorded in a journal, or an auditor's copy of
# one, is read under the rules it was written with (before the C1 and length limits), so runs of an older
# bide stay decidable and verifiable.
_READING: ContextVar[bool] = ContextVar("bide_approvals_reading_policy", default=False)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"approver name {name!r} must be non-empty text")
    new = not _READING.get()
    if new and len(name) > MAX_APPROVER_NAME:
        raise ConfigError(
            f"approver name {name[:40]!r}... is {len(name)} characters long; the limit is {MAX_APPROVER_NAME}"
        )
    if new and "=" in name:
        raise ConfigError(
            f"approver name {name!r} holds '=': an auditor pins seats as `--approver NAME=KEY`, split at the "
            "first '=', so such a seat could not be pinned by name; choose a name without '='"
        )
    for c in name:
        kind = unicodedata.category(c)
        if kind == "Cc" and (new or ord(c) < 32 or ord(c) == 127):  # C0, DEL; C1 in new policies
            raise ConfigError(f"approver name {name!r} must be text without control characters")
        if kind == "Cs":
            raise ConfigError(f"approver name {name!r} holds a lone surrogate, which is not text")


def _check_seat_count(seats: int) -> None:
    if seats > MAX_SEATS:
        raise ConfigError(
            f"an approval policy has at most {MAX_SEATS} approvers, this one lists {seats}: split the "
            "approvers into smaller policies (gates of their own)"
        )


def _fold(name: str) -> str:
    return unicodedata.normalize("NFKC", name).casefold()


@dataclass(frozen=True)
class ApprovalPolicy:
    """`need` approvals out of a fixed, named set of approvers.

    Refused at construction: no approvers, an empty or control-character name (C0, DEL, C1), a name longer
    than `MAX_APPROVER_NAME` characters, holding '=' or a lone surrogate (`from_json(..., recorded=True)`,
    which reads policies recorded by older versions, lets C1 characters, '=' and longer names through), two
    names equal under NFKC case folding (``alice``/``Alice``), two names sharing one key (a seat is a key),
    need outside 1..n, more than `MAX_SEATS` approvers.
    """

    need: int
    approvers: tuple[Approver, ...]

    def __post_init__(self) -> None:
        if not self.approvers:
            raise ConfigError("an approval policy needs at least one approver")
        _check_seat_count(len(self.approvers))
        folded: set[str] = set()
        keys: dict[bytes, str] = {}
        for a in self.approvers:
            _check_name(a.name)
            if _fold(a.name) in folded:
                raise ConfigError(
                    f"approver name {a.name!r} collides with another (names are compared under "
                    "NFKC case folding)"
                )
            folded.add(_fold(a.name))
            if a.key.raw in keys:
                raise ConfigError(
                    f"approvers {keys[a.key.raw]!r} and {a.name!r} share one key; each seat needs "
                    "its own key, or one person could fill two seats"
                )
            keys[a.key.raw] = a.name
        if (
            isinstance(self.need, bool)
            or not isinstance(self.need, int)
            or not 1 <= self.need <= len(self.approvers)
        ):
            raise ConfigError(f"need must be between 1 and {len(self.approvers)}, got {self.need!r}")
        ordered = tuple(sorted(self.approvers, key=lambda a: a.name.encode()))
        object.__setattr__(self, "approvers", ordered)

    @classmethod
    def of(cls, need: int, approvers: Mapping[str, PublicKey | str | bytes]) -> ApprovalPolicy:
        """A policy from {name: public key}: a `PublicKey`, a PEM file path, or 64 hex characters."""
        seats = []
        for name, key in approvers.items():
            if isinstance(key, PublicKey):
                pk = key
            elif isinstance(key, bytes):
                pk = PublicKey.from_raw(key)
            else:
                pk = load_approver_key(name, key)
            seats.append(Approver(name, pk))
        return cls(need, tuple(seats))

    @property
    def names(self) -> list[str]:
        """Approver names, sorted by their UTF-8 bytes."""
        return [a.name for a in self.approvers]

    def seat(self, name: str) -> Approver | None:
        """The seat named `name` (exact match), or None."""
        for a in self.approvers:
            if a.name == name:
                return a
        return None

    def seat_of_key(self, key: PublicKey) -> Approver | None:
        """The seat whose key is `key`, or None."""
        for a in self.approvers:
            if a.key.raw == key.raw:
                return a
        return None

    # Cached: a policy is frozen, and a tally checks each of its decisions against these digests, which
    # hash every seat's name (a name recorded by an older bide may be long).
    @functools.cached_property
    def approvers_digest(self) -> bytes:
        """SHA-256 over the sorted (name, key) seats (see the module docstring)."""
        h = hashlib.sha256(APPROVERS_TAG + u64(len(self.approvers)))
        for a in self.approvers:
            h.update(field(a.name.encode()) + field(a.key.raw))
        return h.digest()

    @functools.cached_property
    def digest(self) -> bytes:
        """SHA-256 binding `need` and the approver set."""
        return hashlib.sha256(POLICY_TAG + u64(self.need) + self.approvers_digest).digest()

    def to_json(self) -> dict[str, Any]:
        """{"need": k, "approvers": [{"name", "public_key" (64 hex)}] sorted by name bytes}."""
        return {
            "need": self.need,
            "approvers": [{"name": a.name, "public_key": a.key.hex} for a in self.approvers],
        }

    @classmethod
    def from_json(cls, value: Any, *, recorded: bool = False, check_keys: bool = True) -> ApprovalPolicy:
        """Parse `to_json` output; raises ConfigError when it is not a valid policy. `recorded`: the policy
        was recorded (in a journal, or an auditor's copy of one) by a version of bide that let through
        approver names now refused for new policies (C1 characters, '=', more than `MAX_APPROVER_NAME`
        characters), and is read under those rules. `check_keys=False` skips the check that each key is
        strong (the slow part): only for a policy that is refused anyway, whatever its keys (one that an
        auditor's pin does not match)."""
        if (
            not isinstance(value, dict)
            or set(value) != {"need", "approvers"}
            or not isinstance(value["approvers"], list)
        ):
            raise ConfigError('a policy is {"need": k, "approvers": [{"name", "public_key"}]}')
        _check_seat_count(len(value["approvers"]))  # before any key is checked
        key_of = PublicKey.from_raw if check_keys else PublicKey.from_raw_unchecked
        seats = []
        for a in value["approvers"]:
            if (
                not isinstance(a, dict)
                or set(a) != {"name", "public_key"}
                or not isinstance(a["name"], str)
                or not isinstance(a["public_key"], str)
                or len(a["public_key"]) != 64
            ):
                raise ConfigError(f"malformed approver entry {a!r}")
            try:
                raw = bytes.fromhex(a["public_key"])
            except ValueError as exc:
                raise ConfigError(f"approver {a['name']!r} has a malformed key") from exc
            if raw.hex() != a["public_key"]:
                raise ConfigError(f"approver {a['name']!r}: keys are lower-case hex")
            try:
                seats.append(Approver(a["name"], key_of(raw)))
            except UnreadableInput as exc:
                raise ConfigError(f"approver {a['name']!r}: {exc}") from exc
        need = value["need"]
        if isinstance(need, bool) or not isinstance(need, int):
            raise ConfigError("need must be an integer")
        reading = _READING.set(recorded)
        try:
            policy = cls(need, tuple(seats))
        finally:
            _READING.reset(reading)
        if policy.names != [a["name"] for a in value["approvers"]]:
            raise ConfigError("policy approvers must be sorted by name")
        return policy


def decision_bytes(
    run_id: str,
    call_id: str,
    tool: str,
    arguments_digest: bytes,
    approver: str,
    approve: bool,
    need: int,
    approvers_digest: bytes,
    *,
    journal_digest: bytes,
) -> bytes:
    """The exact bytes an approver signs for one decision in the journal whose header hashes to
    `journal_digest` (`journal_digest_of`; see the module docstring)."""
    if len(arguments_digest) != 32 or len(approvers_digest) != 32 or len(journal_digest) != 32:
        raise ValueError("digests are 32 bytes")
    return (
        DECISION_TAG
        + journal_digest
        + field(run_id.encode())
        + field(call_id.encode())
        + field(tool.encode())
        + arguments_digest
        + field(approver.encode())
        + (b"\x01" if approve else b"\x00")
        + u64(need)
        + approvers_digest
    )


def journal_digest_of(header: bytes) -> bytes:
    """SHA-256 of the stored bytes of a run's ``@journal`` header record: what binds a decision to one
    journal (the header's random salt tells two journals of the same run id apart)."""
    return hashlib.sha256(header).digest()


def run_journal_digest(run_id: str, header: bytes | None) -> str:
    """The hex `journal_digest_of` the run's stored header bytes (StoreError when the run has none)."""
    if header is None:
        raise StoreError(f"run {run_id!r} has no '@journal' header; the store is damaged")
    return journal_digest_of(header).hex()


def load_approver_key(name: str, spec: str | os.PathLike[str]) -> PublicKey:
    """`load_public_key` for approver `name`; when a key id was likely given instead, the error says so."""
    try:
        return load_public_key(spec)
    except UnreadableInput as exc:
        if isinstance(spec, str) and _KEY_ID.fullmatch(spec):
            # The audit loader's own hint speaks of logs and anchors: the approver's replaces it.
            why = str(exc).split("; a key id", 1)[0].split(": a key id", 1)[0]
            raise UnreadableInput(f"the key given for approver {name!r}: {why}; {KEY_ID_HINT}") from exc
        raise


def names_of(values: Iterable[Approver]) -> list[str]:
    return [a.name for a in values]
