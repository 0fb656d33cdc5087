"""RFC 6962 Merkle tree math: hashes, roots, inclusion and consistency proofs, and their verification.

The tree over leaves d[0..n) is the one RFC 6962 section 2.1 defines: leaf hash SHA-256(0x00 || d), node hash
SHA-256(0x01 || left || right), the empty tree SHA-256(""), and a tree of n > 1 leaves split at the largest
power of two k < n. Every node of such a tree is either a *complete* subtree, the 2^level leaves starting at
index * 2^level, or a partial subtree on the right edge; a partial subtree's hash is the fold of the complete
subtrees that tile it. A tree therefore keeps only complete-subtree hashes (about 2n of them, addressed by
(level, index)), and every root or proof below is computed from O(log n) of them, read in one batch.

Proof generation here is split in two: a *plan* (which stored hashes are needed; pure integer arithmetic)
and an *assembly* (fold what was read), so a store can fetch a proof's hashes in one query.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

__all__ = [
    "EMPTY_ROOT",
    "HashReader",
    "consistency_proof",
    "inclusion_path_length",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "root_from_leaves",
    "subtree_root",
    "verify_consistency",
    "verify_inclusion",
]

_sha256 = hashlib.sha256

EMPTY_ROOT = _sha256(b"").digest()
"""The root of the empty tree: SHA-256 of no bytes."""

Coord = tuple[int, int]
"""A complete subtree: (level, index) covers leaves [index * 2**level, (index + 1) * 2**level)."""

HashReader = Callable[[Sequence[Coord]], Sequence[bytes]]
"""Reads stored complete-subtree hashes, one per coordinate, in the order asked."""


def leaf_hash(data: bytes) -> bytes:
    """SHA-256(0x00 || data): the hash of one leaf."""
    return _sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): the hash of an interior node."""
    return _sha256(b"\x01" + left + right).digest()


def root_from_leaves(leaf_hashes: Sequence[bytes]) -> bytes:
    """The RFC 6962 root of a list of leaf hashes, straight from the definition (O(n); a reference)."""
    n = len(leaf_hashes)
    if n == 0:
        return EMPTY_ROOT
    if n == 1:
        return leaf_hashes[0]
    k = 1 << ((n - 1).bit_length() - 1)
    return node_hash(root_from_leaves(leaf_hashes[:k]), root_from_leaves(leaf_hashes[k:]))


def _tiles(lo: int, hi: int) -> list[Coord]:
    """The complete subtrees tiling leaves [lo, hi), left to right (lo must be aligned, as in RFC 6962)."""
    out: list[Coord] = []
    while lo < hi:
        level = (hi - lo).bit_length() - 1
        while lo & ((1 << level) - 1):
            level -= 1
        out.append((level, lo >> level))
        lo += 1 << level
    return out


def _fold(hashes: Sequence[bytes]) -> bytes:
    """Hash of a range from its tiles: the right edge folds into its left neighbours."""
    acc = hashes[-1]
    for h in reversed(hashes[:-1]):
        acc = _sha256(b"\x01" + h + acc).digest()
    return acc


def subtree_root(lo: int, hi: int, read: HashReader) -> bytes:
    """The hash of leaves [lo, hi) from stored hashes; [0, n) gives the root of the tree of size n."""
    if hi <= lo:
        if lo == hi == 0:
            return EMPTY_ROOT
        raise ValueError(f"empty or inverted range [{lo}, {hi})")
    return _fold(read(_tiles(lo, hi)))


def _inclusion_plan(index: int, size: int) -> list[list[Coord]]:
    # Below level `inner` the leaf's path and the right edge (leaf size-1) are in different subtrees: every
    # sibling there is complete except, possibly, the right sibling at level inner-1, which may be the
    # partial right edge. From `inner` up the path is the right edge itself: a sibling exists (on the left,
    # complete) exactly where the index has a 1 bit.
    inner = (index ^ (size - 1)).bit_length()
    plan: list[list[Coord]] = [[(level, (index >> level) ^ 1)] for level in range(inner - 1)]
    if inner:
        level = inner - 1
        sibling = (index >> level) ^ 1
        start = sibling << level
        plan.append([(level, sibling)] if start + (1 << level) <= size else _tiles(start, size))
    level, rest = inner, index >> inner
    while rest:
        if rest & 1:
            plan.append([(level, rest ^ 1)])
        rest >>= 1
        level += 1
    return plan


def _consistency_plan(old: int, new: int) -> list[list[Coord]]:
    # RFC 6962 section 2.1.2 SUBPROOF(m, D[lo:hi], b), unrolled.
    plan: list[list[Coord]] = []
    lo, hi, m, whole = 0, new, old, True
    while m != hi - lo:
        k = 1 << ((hi - lo - 1).bit_length() - 1)
        if m <= k:
            plan.append(_tiles(lo + k, hi))
            hi = lo + k
        else:
            plan.append(_tiles(lo, lo + k))
            lo, m, whole = lo + k, m - k, False
    if not whole:
        plan.append(_tiles(lo, hi))
    plan.reverse()
    return plan


def _assemble(plan: list[list[Coord]], read: HashReader) -> list[bytes]:
    flat = [c for item in plan for c in item]
    hashes = read(flat)
    if len(hashes) != len(flat):
        raise ValueError("hash reader returned the wrong number of hashes")
    out: list[bytes] = []
    at = 0
    for item in plan:
        n = len(item)
        out.append(hashes[at] if n == 1 else _fold(hashes[at : at + n]))
        at += n
    return out


def inclusion_proof(index: int, size: int, read: HashReader) -> list[bytes]:
    """The RFC 6962 audit path of leaf `index` in the tree of `size` leaves, leaf-side first."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of size {size}")
    return _assemble(_inclusion_plan(index, size), read)


def consistency_proof(old: int, new: int, read: HashReader) -> list[bytes]:
    """The RFC 6962 consistency proof that the tree of size `old` is a prefix of the tree of size `new`.

    Empty when old is 0 or old equals new (nothing to prove beyond comparing roots).
    """
    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from size {old} to size {new}")
    if old == 0 or old == new:
        return []
    return _assemble(_consistency_plan(old, new), read)


def inclusion_path_length(index: int, size: int) -> int:
    """The number of hashes in the audit path of leaf `index` (0 <= index < size) in the tree of `size`."""
    inner = (index ^ (size - 1)).bit_length()
    return inner + (index >> inner).bit_count()


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> bool:
    """True when `proof` shows that the leaf hash `leaf` sits at `index` in the tree of `size` with `root`.

    Equivalent to RFC 9162 section 2.1.3.2: the first `inner` proof hashes are siblings below the level
    where the leaf's path joins the right edge (left or right by the index's bits), the rest are left
    siblings along the right edge; a proof of any other length is refused. Every hash must be 32 bytes.
    """
    if not 0 <= index < size or len(leaf) != 32 or len(root) != 32:
        return False
    if len(proof) != inclusion_path_length(index, size):
        return False
    inner = (index ^ (size - 1)).bit_length()
    # The side of each of the first `inner` siblings, lowest level first: "1" (the index's bit is set) when
    # the sibling is on the left. Spelled out once, so the loop does no integer arithmetic per level.
    sides = bin(index & ((1 << inner) - 1) | 1 << inner)[:2:-1]
    sha256 = _sha256
    r = leaf
    rest = iter(proof)
    # zip stops after the `inner` sides, leaving the right edge's hashes in `rest`. (The plain zip call and
    # the if statement are measurably faster here than zip(..., strict=False) and a conditional expression.)
    for side, p in zip(sides, rest):  # noqa: B905
        if len(p) != 32:
            return False
        if side == "1":  # noqa: SIM108
            r = sha256(b"\x01" + p + r).digest()
        else:
            r = sha256(b"\x01" + r + p).digest()
    for p in rest:  # the right edge: every remaining sibling is on the left
        if len(p) != 32:
            return False
        r = sha256(b"\x01" + p + r).digest()
    return r == root


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> bool:
    """True when `proof` shows the tree (old, old_root) is a prefix of the tree (new, new_root).

    The algorithm of RFC 9162 section 2.1.4.2. Size 0 is consistent with everything (its root must be the
    empty root); equal sizes need an empty proof and equal roots.
    """
    if not 0 <= old <= new or len(old_root) != 32 or len(new_root) != 32:
        return False
    if any(len(p) != 32 for p in proof):
        return False
    if old == 0:
        return not proof and old_root == EMPTY_ROOT
    if old == new:
        return not proof and old_root == new_root
    path = list(proof)
    if old & (old - 1) == 0:
        path.insert(0, old_root)
    if not path:
        return False
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = _sha256(b"\x01" + c + fr).digest()
            sr = _sha256(b"\x01" + c + sr).digest()
            while not fn & 1 and fn:
                fn >>= 1
                sn >>= 1
        else:
            sr = _sha256(b"\x01" + sr + c).digest()
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0
