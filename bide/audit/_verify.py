"""Offline verification of bundles, evidence packages and consistency proofs: a key and a file, no store."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ._errors import NotVerified
from ._formats import (
    MAX_SKEW_NS,
    ConsistencyProof,
    EvidencePackage,
    ProofBundle,
    SignedTreeHead,
    check_head,
    decode_record_bytes,
    journal_leaf,
)
from ._keys import PublicKey
from ._merkle import leaf_hash, verify_consistency, verify_inclusion

__all__ = ["Verified", "verify_bundle", "verify_consistency_proof", "verify_evidence"]


@dataclass(frozen=True)
class Verified:
    """What a successful verification proved (`proven`, one sentence) and what it did not (`not_proven`);
    `facts` says the same for machines (`bide-audit --json` prints its members, e.g. `complete`)."""

    proven: str
    not_proven: str
    records: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns // 10**9))


def _head_text(sth: SignedTreeHead) -> str:
    return (
        f"the head of run {sth.log_id!r} at {sth.size} records signed by {sth.key_id} "
        f"at {_when(sth.timestamp_ns)}"
    )


def verify_bundle(
    bundle: ProofBundle, key: PublicKey, *, now_ns: int | None = None, max_skew_ns: int = MAX_SKEW_NS
) -> Verified:
    """Check a proof bundle: the head is signed by `key`, the record's bytes are the leaf at the stated
    position of that head's tree, and they are a salted journal record. Raises NotVerified otherwise."""
    check_head(bundle.sth, key, now_ns=now_ns, max_skew_ns=max_skew_ns)
    return check_bundle_proofs(bundle)


def check_bundle_proofs(bundle: ProofBundle) -> Verified:
    """`verify_bundle` without the head's signature: what the bundle proves if its head is genuine (the
    command checks this much when the key cannot be read, so that a forgery is never hidden behind it)."""
    sth = bundle.sth
    inc = bundle.inclusion
    if inc.size != sth.size:
        raise NotVerified(f"the inclusion proof is for a tree of {inc.size} records, the head for {sth.size}")
    if not verify_inclusion(inc.index, inc.size, leaf_hash(journal_leaf(bundle.record)), inc.path, sth.root):
        raise NotVerified(
            f"the record is not entry {inc.index} of the signed tree: the proof does not "
            "lead to the signed root"
        )
    rec = decode_record_bytes(bundle.record)
    return Verified(
        proven=(
            f"Record {rec['key']!r} (kind {rec['kind']}) is entry {inc.index} of the journal committed by "
            f"{_head_text(sth)}."
        ),
        not_proven=(
            "Not proven: that this head is the latest or was anchored (compare it with your anchor), "
            "that the record's claims are true, or anything about records not shown."
        ),
        records=[{"index": inc.index, **rec}],
    )


def _material(kinds: Counter[str]) -> str:
    parts = [f"{n} {k}" for k, n in sorted(kinds.items())]
    return ", ".join(parts)


def verify_evidence(
    pkg: EvidencePackage, key: PublicKey, *, now_ns: int | None = None, max_skew_ns: int = MAX_SKEW_NS
) -> Verified:
    """Check an evidence package: the head is signed by `key`; every record is, at its stated position,
    a leaf of that head's tree and a salted journal record; positions strictly increase; each key appears
    once, and the record at position 0, when present, is the header (and no other is). When positions
    0..size-1 are all present the package is complete (nothing of the journal omitted)."""
    check_head(pkg.sth, key, now_ns=now_ns, max_skew_ns=max_skew_ns)
    return check_evidence_proofs(pkg)


def check_evidence_proofs(pkg: EvidencePackage) -> Verified:
    """`verify_evidence` without the head's signature (see `check_bundle_proofs`)."""
    sth = pkg.sth
    if not pkg.records:
        raise NotVerified("the evidence package holds no records; an empty package proves nothing")
    last = -1
    decoded: list[dict[str, Any]] = []
    kinds: Counter[str] = Counter()
    seen: dict[str, int] = {}
    for item in pkg.records:
        if item.index <= last:
            raise NotVerified(f"record positions must strictly increase; {item.index} follows {last}")
        last = item.index
        if item.index >= sth.size:
            raise NotVerified(
                f"record position {item.index} is outside the signed tree of {sth.size} records"
            )
        if not verify_inclusion(
            item.index, sth.size, leaf_hash(journal_leaf(item.record)), item.path, sth.root
        ):
            raise NotVerified(f"record at position {item.index} is not in the signed tree")
        rec = decode_record_bytes(item.record)
        # A journal writes each key once and its header first: a package that holds otherwise was not
        # written by a store (whoever signed its head wrote it).
        if rec["kind"] == "header" and item.index != 0:
            raise NotVerified(f"a header record at position {item.index}: a journal's header is at 0")
        if item.index == 0 and rec["kind"] != "header":
            # Checked in a partial package too: what it leaves out cannot make position 0 another record.
            raise NotVerified(
                f"the record at position 0 is {rec['key']!r} of kind {rec['kind']!r}: a journal starts with "
                "its header record"
            )
        record_key = rec.get("key")
        if isinstance(record_key, str):
            if record_key in seen:
                raise NotVerified(
                    f"records at positions {seen[record_key]} and {item.index} have the same key "
                    f"{record_key!r}: a journal writes each key once"
                )
            seen[record_key] = item.index
        decoded.append({"index": item.index, **rec})
        kinds[rec["kind"]] += 1
    complete = len(pkg.records) == sth.size
    scope = (
        "all of its records"
        if complete
        else f"{len(pkg.records)} of its {sth.size} records (the others are not disclosed)"
    )
    not_proven = (
        "Not proven: that this head is the latest or was anchored (compare it with your anchor), "
        "or that the recorded results are true outside the journal."
    )
    if not complete:
        not_proven = "Not proven: anything about the omitted records, " + not_proven[len("Not proven: ") :]
    return Verified(
        proven=(
            f"The package holds {scope}, each proven at its position in the journal committed by "
            f"{_head_text(sth)} ({_material(kinds)})."
        ),
        not_proven=not_proven,
        records=decoded,
        facts={
            "complete": complete,
            "records": len(pkg.records),
            "size": sth.size,
            "log_id": sth.log_id,
            "key_id": sth.key_id,
        },
    )


def verify_consistency_proof(
    old: SignedTreeHead,
    new: SignedTreeHead,
    proof: ConsistencyProof,
    key: PublicKey | None = None,
    *,
    now_ns: int | None = None,
    max_skew_ns: int = MAX_SKEW_NS,
) -> Verified:
    """Check that the journal under `old` is a prefix of the journal under `new` (append-only between
    them). With `key`, both heads' signatures are checked too; without, only the hashes."""
    if key is not None:
        check_head(old, key, now_ns=now_ns, max_skew_ns=max_skew_ns)
        check_head(new, key, now_ns=now_ns, max_skew_ns=max_skew_ns)
    if not (old.log_id == new.log_id == proof.log_id):
        raise NotVerified(
            f"the heads and proof name different runs: {old.log_id!r}, {new.log_id!r}, {proof.log_id!r}"
        )
    if old.size > new.size:
        swapped = (proof.old_size, proof.new_size) == (new.size, old.size)
        raise NotVerified(
            f"the first head ({old.size} records) is larger than the second ({new.size} records): the older, "
            "smaller head comes first"
            + (
                "; the proof is for these two heads the other way round: were they given in the wrong "
                "order? Swap them"
                if swapped
                else ""
            )
        )
    if proof.old_size != old.size or proof.new_size != new.size:
        raise NotVerified(
            f"the proof is for sizes {proof.old_size} -> {proof.new_size}, the heads are "
            f"{old.size} -> {new.size}"
        )
    # The dates are the signers' clocks, not part of the proof: two processes anchoring one run at once
    # (AuditedStore writers) sign heads in either order, and both are the journal's. Said, not refused.
    dated = ""
    if new.timestamp_ns < old.timestamp_ns:
        dated = (
            f"; the larger head is dated {(old.timestamp_ns - new.timestamp_ns) / 1e9:.3f} s before the "
            "smaller one (heads signed at once by two processes can be: a head's date is its signer's clock)"
        )
    if not verify_consistency(old.size, new.size, old.root, new.root, proof.path):
        raise NotVerified(
            f"the journal at {new.size} records does not extend the journal at {old.size} "
            "records: something committed was changed, removed or reordered"
        )
    # Unchecked, a head's key id is only a claim; two different ones are said first, not refused: a log whose
    # key was rotated between the heads has no one --pubkey for both.
    other_keys = key is None and old.key_id != new.key_id
    if key is not None:
        signed = "both heads are signed by " + key.key_id
    elif other_keys:
        signed = "the heads' signatures were not checked, and the heads name different keys"
    else:
        signed = "the heads' signatures were not checked"
    unsigned = ""
    if other_keys:
        unsigned = (
            f"that one key signed both heads: they name different keys ({old.key_id} the first, "
            f"{new.key_id} the second), so they are not heads of one log key (a rotated key, or a head that "
            "is not the log's); check each head under the key it names; "
        )
    elif key is None:
        unsigned = "who signed the heads (pass --pubkey); "
    return Verified(
        proven=(
            f"The journal of run {old.log_id!r} at {new.size} records extends, unchanged, the journal at "
            f"{old.size} records ({signed})."
        ),
        not_proven=(
            "Not proven: " + unsigned + "that either head was anchored, or what the records say" + dated + "."
        ),
        facts={"signatures_checked": key is not None, "key_ids": [old.key_id, new.key_id]},
    )
