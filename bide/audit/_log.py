"""`AuditLog`: the RFC 6962 tree over each run's journal, signed heads, proofs and exports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import ConfigError, StoreError
from .._store import Entry, Store, WriteTransaction
from ._anchor import DirectoryPublisher, Publisher
from ._errors import JournalDamaged, NotVerified, RecordPastHead, UnreadableInput
from ._formats import (
    ConsistencyProof,
    EvidencePackage,
    EvidenceRecord,
    Inclusion,
    ProofBundle,
    SignedTreeHead,
    check_head,
    sign_head,
    sth_signed_bytes,
)
from ._hashes import TILE_HEIGHT, AuditTablesDamaged, HashBackend, _leaf_hash, _leaf_hashes, backend_for
from ._keys import PublicKey, SigningKey
from ._merkle import (
    EMPTY_ROOT,
    HashReader,
    consistency_proof,
    inclusion_proof,
    subtree_root,
    verify_consistency,
)
from ._tree import MerkleTree

__all__ = ["AuditLog"]



class AuditLog:
    """The audit log of a store: one RFC 6962 tree per run over its journal records, in commit order.

    Leaf i of run R is ``"bide.audit.journal-leaf.v1\\x00" || bytes of R's i-th record`` (exactly as stored).
    The tree's hashes are kept beside the journal (SQL tables for SQL stores, memory for the memory store)
    and brought up to date by `sync` (called by every method here): each new record costs O(log n).

    `key` signs tree heads; `publisher` (optional) receives every head signed, to anchor it somewhere the
    operator of the store cannot rewrite. A `DirectoryPublisher` first compares it with the heads of its run
    anchored there (`DirectoryPublisher.publish_checked`), and refuses one that forks from them.
    """

    def __init__(
        self, store: Store, key: SigningKey | None = None, publisher: Publisher | None = None
    ) -> None:
        inner = getattr(store, "inner", None)  # an AuditedStore: keep the hashes beside the real store
        self.store = store if inner is None else inner
        self.key = key
        self.publisher = publisher
        self._hashes: HashBackend = backend_for(self.store)
        self._behind: set[str] = set()  # runs whose tree `absorb` left to `sync`

    # -- the tree -----------------------------------------------------------------------------------------

    def sync(self, run_id: str) -> int:
        """Absorb the run's records committed since the last sync; returns the tree size."""
        self._behind.discard(run_id)
        for _ in range(100):
            size, last_seq = self._hashes.state(run_id)
            entries = self.store.load(run_id, last_seq)
            if not entries:
                return size
            leaves = _leaf_hashes([e.data for e in entries])
            if self._hashes.extend(run_id, size, last_seq, leaves, entries[-1].seq):
                return size + len(leaves)
        raise StoreError(f"audit tree of run {run_id!r} keeps changing under this process; try again")

    def absorb(self, txn: WriteTransaction, written: Mapping[str, Sequence[Entry]]) -> None:
        """A store write hook (`store.add_write_hook(log.absorb)`; see `HookedStore` in bide/_store.py):
        advance each written run's tree in the transaction that wrote its records, so tree and journal
        commit together. A tree found behind (records written before auditing, or a hook that failed)
        catches up from the journal first, unless it is far behind (more than 10,000 records): then it is
        left to `sync`, which `AuditedStore` calls after the commit."""
        # Undone (this hook failed, or the whole write did): the runs' trees are left to `sync`.
        txn.on_rollback(lambda: self._behind.update(written))
        absorb = self._hashes.absorb
        behind = [run_id for run_id, entries in written.items() if not absorb(txn, run_id, entries)]
        if behind:
            txn.on_commit(lambda: self._behind.update(behind))

    def size(self, run_id: str) -> int:
        """The number of records in the run's tree (after a sync)."""
        return self.sync(run_id)

    def _read(self, run_id: str) -> Any:
        return lambda coords: self._hashes.read(run_id, coords)

    def root(self, run_id: str, size: int | None = None) -> bytes:
        """The Merkle root of the run's first `size` records (default: all)."""
        n = self.sync(run_id)
        size = n if size is None else size
        if not 0 <= size <= n:
            raise ConfigError(f"run {run_id!r} has {n} records; there is no tree of size {size}")
        return EMPTY_ROOT if size == 0 else subtree_root(0, size, self._read(run_id))

    def inclusion(self, run_id: str, index: int, size: int) -> list[bytes]:
        """The audit path of record `index` in the run's tree of `size` records (after a sync)."""
        n = self.sync(run_id)
        if not 0 <= size <= n:
            raise ConfigError(f"run {run_id!r} has {n} records; there is no tree of size {size}")
        if not 0 <= index < size:
            raise ConfigError(f"the tree of {size} records of run {run_id!r} has no record {index}")
        return inclusion_proof(index, size, self._read(run_id))

    def consistency(self, run_id: str, old_size: int, new_size: int | None = None) -> ConsistencyProof:
        """The proof that the run's journal at `old_size` records is a prefix of it at `new_size`."""
        n = self.sync(run_id)
        new = n if new_size is None else new_size
        if old_size < 0 or new < 0:
            raise ConfigError(
                f"cannot prove {old_size} -> {new} for run {run_id!r}: a size is a number of records, 0 or "
                "more"
            )
        if new_size is None and old_size > n:
            raise journal_shorter(run_id, n, old_size)
        if new < old_size:
            raise ConfigError(
                f"cannot prove {old_size} -> {new} for run {run_id!r}: the sizes are reversed; the older, "
                f"smaller size comes first ({new} -> {old_size})"
            )
        if not 0 <= old_size <= new <= n:
            raise ConfigError(f"run {run_id!r} has {n} records; cannot prove {old_size} -> {new}")
        path = consistency_proof(old_size, new, self._read(run_id))
        return ConsistencyProof(log_id=run_id, old_size=old_size, new_size=new, path=path)

    # -- heads --------------------------------------------------------------------------------------------

    def _signing_key(self) -> SigningKey:
        if self.key is None:
            raise ConfigError("this AuditLog has no signing key; pass key=bide.audit.load_signing_key(path)")
        return self.key

    def check_journal(self, run_id: str) -> int:
        """Read the run's whole journal again and check that it is the one its audit tree was built from
        (as many records, each hashing to its leaf, and every hash stored above the leaves the one they
        give) and that each record is one a verifier accepts and bide reads (`_check_records`). Returns
        the tree's size; raises `JournalDamaged` naming where it fails (`UnreadableInput` for a run in
        another journal format). O(n) (`sign_head` is O(log n) and trusts the tree): `bide-audit export`
        runs it before it signs, proves or exports anything, so no head vouches for records the journal
        lost or that were changed before the tree took them in (a run exported for the first time)."""
        try:
            return self._check_journal(run_id)
        except AuditTablesDamaged as exc:  # a StoreError to the journal's writes; here, what it is
            raise JournalDamaged(f"{exc}: they were changed behind bide, so nothing was signed or exported. "
                                 f"{_REBUILD}") from exc

    def _check_journal(self, run_id: str) -> int:
        # The tree as stored, and the records past it, are checked before the tree takes any in: a journal
        # changed behind bide is refused with the audit tables left as they were (a record put past the
        # tree's last seq was taken in, and every export after the edit was undone refused the journal).
        for _ in range(100):
            size, last_seq = self._hashes.state(run_id)
            journal = self.store.load(run_id)
            self._check_tree(run_id, size, last_seq, journal)
            later = [e for e in journal if e.seq > last_seq]
            if not later:
                return size
            _check_records(run_id, journal)  # the later records among all: a key once, the header first
            # Only the records checked: one committed since the load is the next sync's.
            leaves = _leaf_hashes([e.data for e in later])
            if self._hashes.extend(run_id, size, last_seq, leaves, later[-1].seq):
                # The hashes the tree stores above its leaves are checked as the new leaves left them.
                after = self._hashes.state(run_id)
                self._check_tree(run_id, *after, self.store.load(run_id))
                return after[0]
        raise StoreError(f"audit tree of run {run_id!r} keeps changing under this process; try again")

    def _check_tree(self, run_id: str, size: int, last_seq: int, journal: Sequence[Entry]) -> None:
        """Raise `JournalDamaged` unless the run's records up to `last_seq` (of `journal`, all its records)
        are the `size` records the tree took in, each hashing to its leaf, and valid records
        (`_check_records`)."""
        # Records committed after the tree's last sync (a live run goes on) are not the tree's yet: left out.
        # One put behind bide with a seq among the tree's records counts; one appended after them is the
        # journal's next record to every reader, which the tree takes in at its next sync.
        entries = [e for e in journal if e.seq <= last_seq]
        leaves = self._hashes.read(run_id, [(0, i) for i in range(size)]) if size else []
        pairs = zip(entries, leaves, strict=False)
        differs = next((i for i, (entry, leaf) in enumerate(pairs) if _leaf_hash(entry.data) != leaf), None)
        if differs is None and len(entries) == size:
            _check_records(run_id, entries)
            self._check_upper_levels(run_id, leaves)
            return
        found = []
        if len(entries) != size:
            later = journal[len(entries) :]
            among = f" up to seq {last_seq}, the tree's last," if later else ""
            found.append(
                f"holds {len(entries)} records{among} where its audit tree has {size}{_later(later, leaves)}"
            )
        if differs is not None:
            key = entries[differs].key
            found.append(
                f"has at position {differs} a record ({key!r} now) other than the tree's (it does not "
                f"hash to leaf {differs})"
            )
        raise JournalDamaged(f"the journal of run {run_id!r} {' and '.join(found)}: {_TREE_OR_JOURNAL}")

    def _check_upper_levels(self, run_id: str, leaves: Sequence[bytes]) -> None:
        """Raise `JournalDamaged` unless every hash the tree stores above its leaves (every complete
        subtree at levels 7, 14, ...: see bide/audit/_hashes.py) is the one its leaves give. Roots and
        proofs are read from those levels: a damaged one would be signed as the journal's root."""
        tree = MerkleTree()
        for leaf in leaves:
            tree.append_hash(leaf)
        coords = [
            (level, index)
            for level in range(TILE_HEIGHT, len(leaves).bit_length(), TILE_HEIGHT)
            for index in range(len(leaves) >> level)
        ]
        if not coords:
            return
        stored = self._hashes.read(run_id, coords)
        for (level, index), theirs, ours in zip(coords, stored, tree.read(coords), strict=True):
            if theirs != ours:
                first, last = index << level, ((index + 1) << level) - 1
                raise JournalDamaged(
                    f"the audit tree of run {run_id!r} is damaged: its stored hash of records {first} to "
                    f"{last} (level {level}) is not the one those records give; it was changed behind "
                    f"bide, so nothing was signed or exported. {_REBUILD}"
                )

    def sign_head(self, run_id: str, *, publish: bool = True, size: int | None = None) -> SignedTreeHead:
        """Sync, sign the run's head (of its first `size` records; default: all of them), and hand it to
        the publisher (if any). A `DirectoryPublisher` publishes it only if it forks from none of the run's
        heads anchored there (`ForkRefused`, an AnchorError, when it does: the journal is not the one that
        was anchored, and nothing is published)."""
        key = self._signing_key()
        n = self.sync(run_id)
        size = n if size is None else size
        if not 0 <= size <= n:
            raise ConfigError(f"run {run_id!r} has {n} records; there is no head of size {size}")
        sth = sign_head(key, run_id, size, self.root(run_id, size))
        if publish and isinstance(self.publisher, DirectoryPublisher):
            self.publisher.publish_checked(self, sth)
        elif publish and self.publisher is not None:
            self.publisher.publish(sth)
        return sth

    def forks(
        self, sth: SignedTreeHead, heads: Sequence[SignedTreeHead], *, earlier_keys: Sequence[PublicKey] = ()
    ) -> list[tuple[int, str]]:
        """The heads among `heads` (those already anchored, say) that `sth`, a head of this log, forks from:
        (position in `heads`, why) for each head of `sth`'s run signed by this log's key, or by one of
        `earlier_keys` (the log's keys before a rotation: its tree is the same whatever key signs its
        heads), that `sth` neither extends nor is a prefix of, by a consistency proof from the run's tree;
        a head of more records than the journal holds is one too (the journal lost records it covers).
        Heads of another run or key, or whose signature does not verify under their key, are none of its
        heads and are left out."""
        keys = {key.key_id: key for key in earlier_keys}
        own = self._signing_key().public
        keys[own.key_id] = own
        run_id = sth.log_id
        mine = [(i, h) for i, h in enumerate(heads) if h.log_id == run_id and h.key_id in keys]
        if not mine:
            return []
        n = self.sync(run_id)
        if sth.size > n:
            raise ConfigError(f"the head covers {sth.size} records; the store has {n} for run {run_id!r}")
        read: HashReader = self._read(run_id)  # a few stored hashes per proof (a publisher compares with one)
        if len({(h.size, h.root) for _, h in mine}) > _PROOFS_FROM_THE_STORE:
            # Many heads (an export compares with every head anchored): the leaves read once, in one query.
            top = min(n, max(sth.size, *(h.size for _, h in mine)))
            tree = MerkleTree()
            for leaf in self._hashes.read(run_id, [(0, i) for i in range(top)]) if top else []:
                tree.append_hash(leaf)
            read = tree.read
        if subtree_root(0, sth.size, read) != sth.root:
            raise NotVerified(f"the audit tree of run {run_id!r} no longer gives the head's root: try again")
        verdicts: dict[tuple[int, bytes], str | None] = {}
        found = []
        for i, h in mine:
            if (h.size, h.root) not in verdicts:
                verdicts[h.size, h.root] = _fork(read, n, sth, h)
            why = verdicts[h.size, h.root]
            # Only a head that conflicts is worth its signature check: one that agrees forks nothing.
            signed = sth_signed_bytes(h.alg, h.key_id, h.log_id, h.size, h.root, h.timestamp_ns)
            if why is not None and keys[h.key_id].verify(h.signature, signed):
                found.append((i, why))
        return found

    # -- exports ------------------------------------------------------------------------------------------

    def _head(self, run_id: str, sth: SignedTreeHead | None) -> SignedTreeHead:
        """`sth` (signed now when None), checked to be this run's and to be the root of its stored tree."""
        if sth is None:
            sth = self.sign_head(run_id)
        if sth.log_id != run_id:
            raise ConfigError(f"the head is for run {sth.log_id!r}, not {run_id!r}")
        if self.key is not None:
            check_head(sth, self.key.public)
        n = self.sync(run_id)
        if sth.size > n:
            raise ConfigError(f"the head covers {sth.size} records; the store has {n} for run {run_id!r}")
        # Bind proofs to the head given: the stored tree must reproduce its root.
        if self.root(run_id, sth.size) != sth.root:
            raise NotVerified(f"the store's journal of run {run_id!r} does not hash to the given head's root")
        return sth

    def _entries(
        self, run_id: str, sth: SignedTreeHead | None
    ) -> tuple[SignedTreeHead, list[Entry], list[bytes]]:
        """The checked head, the records it covers and their leaf hashes, each record checked against its
        leaf."""
        sth = self._head(run_id, sth)
        entries = self.store.load(run_id)[: sth.size]
        leaves = self._hashes.read(run_id, [(0, i) for i in range(len(entries))]) if entries else []
        for i, (e, leaf) in enumerate(zip(entries, leaves, strict=True)):
            self._check_leaf(run_id, i, e, leaf)
        return sth, entries, list(leaves)

    @staticmethod
    def _check_leaf(run_id: str, index: int, entry: Entry, leaf: bytes) -> None:
        if _leaf_hash(entry.data) != leaf:
            raise JournalDamaged(
                f"record {index} of the journal of run {run_id!r} ({entry.key!r}, now) does not hash to "
                f"leaf {index} of its audit tree: {_TREE_OR_JOURNAL}"
            )

    def prove(self, run_id: str, key: str, sth: SignedTreeHead | None = None) -> ProofBundle:
        """A proof bundle for the record stored under `key`: its bytes, audit path, and the signed head
        (signed now when `sth` is None). A record the journal holds past the head is `RecordPastHead`
        (a ConfigError, as a key the run does not hold is): no proof is made against a head without it."""
        sth = self._head(run_id, sth)
        # Only the proven record is hashed and checked against its leaf (the path binds it to the root); the
        # journal is read to find its position, which the store does not index.
        entries = self.store.load(run_id)
        for i, e in enumerate(entries[: sth.size]):
            if e.key == key:
                [leaf] = self._hashes.read(run_id, [(0, i)])
                self._check_leaf(run_id, i, e, leaf)
                path = self.inclusion(run_id, i, sth.size)
                return ProofBundle(
                    record=e.data, inclusion=Inclusion(index=i, size=sth.size, path=path), sth=sth
                )
        if any(e.key == key for e in entries[sth.size :]):
            raise RecordPastHead(
                f"record {key!r} of run {run_id!r} was committed after its head of {sth.size} records: "
                "sign a head that covers it"
            )
        raise ConfigError(f"run {run_id!r} has no record {key!r} under a head of {sth.size} records")

    def evidence(
        self, run_id: str, sth: SignedTreeHead | None = None, keys: Sequence[str] | None = None
    ) -> EvidencePackage:
        """An evidence package: every record of the run under one signed head (or only `keys`), each with
        its audit path."""
        sth, entries, leaves = self._entries(run_id, sth)
        if not entries:
            raise ConfigError(f"run {run_id!r} has no records to export")
        # Every path from one in-memory tree over the leaves just checked (n hashes, instead of one store
        # read per record); it must reproduce the head's root like the stored tree did.
        tree = MerkleTree()
        for leaf in leaves:
            tree.append_hash(leaf)
        if tree.root() != sth.root:
            raise JournalDamaged(
                f"the audit tables of run {run_id!r} disagree with its leaf hashes (damaged)"
            )
        wanted = None if keys is None else set(keys)
        out = [
            EvidenceRecord(index=i, record=e.data, path=tree.inclusion_proof(i))
            for i, e in enumerate(entries)
            if wanted is None or e.key in wanted
        ]
        return EvidencePackage(sth=sth, records=out)


#: Up to how many distinct heads `AuditLog.forks` proves from the stored tree, a few hashes per proof; past
#: that it reads the leaves once and proves from them in memory.
_PROOFS_FROM_THE_STORE = 16


def _fork(read: HashReader, size: int, sth: SignedTreeHead, other: SignedTreeHead) -> str | None:
    """Why `sth` and `other` are not heads of one history (None when they are), from the run's tree of
    `size` records (its hashes by `read`; the tree of as many records as both heads need will do)."""
    if other.size > size:
        return (
            f"it covers {other.size} records, and the journal holds {size}: records it covers were removed "
            "(or the store rolled back)"
        )
    old, new = (other, sth) if other.size <= sth.size else (sth, other)
    proof = consistency_proof(old.size, new.size, read)
    if verify_consistency(old.size, new.size, old.root, new.root, proof):
        return None
    if other.size == sth.size:
        return f"it is of the same size, {other.size} records, with another root"
    return (
        f"the journal's first {other.size} records are not the ones it covers: records were changed, "
        "removed, inserted or reordered"
    )


def journal_shorter(run_id: str, size: int, old_size: int) -> JournalDamaged:
    """Why no proof runs from a head of `old_size` records to the run's journal, which holds `size`, fewer:
    either that head covered records the journal has lost, or no such head exists."""
    return JournalDamaged(
        f"the journal of run {run_id!r} now holds {size} records, fewer than {old_size}: a head of "
        f"{old_size} records covers records this journal no longer holds (removed behind bide, or the store "
        f"rolled back to an older copy), so no proof {old_size} -> {size} exists. If {old_size} is the size "
        "a head of this run you hold or anchored states, the journal lost records: restore the store from a "
        "backup, or `bide show RUN` to see the journal as it is; if not, give the size that head states"
    )


def _later(later: Sequence[Entry], leaves: Sequence[bytes]) -> str:
    """What to say of `later`, the journal's records past the tree's last seq, after a count of the tree's
    records: those that hash to one of the tree's `leaves` were moved there by hand (each record is salted,
    so no two records share a hash)."""
    known = {leaf: i for i, leaf in enumerate(leaves)}
    moved = [
        f"{e.key!r}, the tree's record {known[h]}, is now at seq {e.seq}"
        for e in later
        if (h := _leaf_hash(e.data)) in known
    ]
    if moved:
        return f" ({'; '.join(moved)}: moved past the tree's records by hand)"
    return f" (and {len(later)} later record(s), not in the tree yet)" if later else ""


def _check_records(run_id: str, entries: Sequence[Entry]) -> None:
    """Raise `JournalDamaged` unless every record is what the verifiers take for a journal's (see
    `check_evidence_proofs`: a salted JSON object with a key and a kind, each key once, the header first)
    and one bide reads (`decode_record`: a kind it writes, stored under its own key). A record edited in
    the store before the audit tree took it in hashes to its leaf all the same; signed, it would be a
    package its own verifier calls forged, of a journal `bide show` calls damaged."""
    from .._errors import RecordDamaged
    from .._records import FORMAT, Header, damage_in_words, decode_record
    from ._formats import decode_record_bytes

    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"record {index} of the journal of run {run_id!r} ({entry.key!r})"
        try:
            record = decode_record_bytes(entry.data)
        except NotVerified as exc:
            raise JournalDamaged(f"{where} is not a record bide wrote ({exc}): {_CHANGED}") from None
        key = record["key"]
        if key in seen:
            raise JournalDamaged(f"{where} has the key of record {seen[key]}, {key!r}: {_CHANGED}")
        seen[key] = index
        if (record["kind"] == "header") != (index == 0):
            raise JournalDamaged(f"{where} is of kind {record['kind']!r}; a journal's header is its first "
                                 f"record, and only it: {_CHANGED}")
        try:
            decoded = decode_record(entry.key, entry.data)
        except RecordDamaged as exc:
            reason = damage_in_words(exc)
            raise JournalDamaged(f"{where} is not a record bide wrote ({reason}): {_CHANGED}") from None
        if isinstance(decoded, Header) and decoded.format != FORMAT:
            raise UnreadableInput(
                f"run {run_id!r} is in journal format {decoded.format!r}; this bide reads {FORMAT!r}: "
                "export it with the bide version that wrote it"
            )


_REBUILD = (
    "Delete the run's rows from the store's audit_tiles and audit_tile_trees tables (under its table "
    "prefix) to have the tree rebuilt from the journal"
)
# The audit tables are a cache of the journal: a difference between them is either one's damage.
_TREE_OR_JOURNAL = (
    "the journal or its audit tree (the audit tables, a cache of the journal) was changed behind bide, so "
    f"nothing was signed or exported. {_REBUILD}; then check the rebuilt tree against a head you anchored: "
    "`bide-audit export --head`, `bide-audit export --consistency-from SIZE` (SIZE: the anchored head's) and "
    "`bide-audit verify-consistency`. If that fails, the journal was changed (records changed, removed or "
    "inserted): restore the store from a backup, or `bide show RUN` to see the journal as it is"
)
_CHANGED = (
    "it was changed behind bide, so nothing was signed or exported; restore the store from a backup, or "
    "`bide show RUN` to see the journal as it is"
)
