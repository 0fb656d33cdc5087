"""RFC 6962 tree math against the published Certificate Transparency vectors, and its laws for any size."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from bide.audit._merkle import (
    EMPTY_ROOT,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_from_leaves,
    verify_consistency,
    verify_inclusion,
)
from bide.audit._tree import MerkleTree

# The eight leaves of the RFC 6962 / Certificate Transparency reference test suite and the roots of
# their prefixes (certificate-transparency merkle_tree_test, also used by Trillian and Go's tlog).
LEAVES = [
    bytes.fromhex(h)
    for h in [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
INCLUSION = [  # (leaf index, tree size, audit path)
    (0, 1, []),
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]
CONSISTENCY = [  # (old size, new size, proof)
    (1, 1, []),
    (
        1,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        5,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]


def _tree(n: int) -> MerkleTree:
    return MerkleTree(LEAVES[:n])


def test_hash_primitives() -> None:
    assert EMPTY_ROOT.hex() == ROOTS[0]
    assert leaf_hash(b"") == hashlib.sha256(b"\x00").digest()
    assert node_hash(b"a" * 32, b"b" * 32) == hashlib.sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest()


def test_roots_match_ct_vectors() -> None:
    tree = MerkleTree()
    for n, expected in enumerate(ROOTS):
        assert tree.root().hex() == expected
        assert root_from_leaves([leaf_hash(d) for d in LEAVES[:n]]).hex() == expected
        if n < len(LEAVES):
            tree.append(LEAVES[n])
    for n, expected in enumerate(ROOTS):
        assert tree.root(n).hex() == expected  # roots of earlier sizes from the same stored hashes


def test_inclusion_matches_ct_vectors() -> None:
    for index, size, path in INCLUSION:
        tree = _tree(size)
        proof = tree.inclusion_proof(index)
        assert [p.hex() for p in proof] == path
        assert verify_inclusion(index, size, leaf_hash(LEAVES[index]), proof, bytes.fromhex(ROOTS[size]))


def test_consistency_matches_ct_vectors() -> None:
    for old, new, path in CONSISTENCY:
        tree = _tree(new)
        proof = tree.consistency_proof(old)
        assert [p.hex() for p in proof] == path
        assert verify_consistency(old, new, bytes.fromhex(ROOTS[old]), bytes.fromhex(ROOTS[new]), proof)


def test_verifiers_refuse_bad_positions_and_shapes() -> None:
    tree = _tree(8)
    root = tree.root()
    proof = tree.inclusion_proof(5)
    leaf = leaf_hash(LEAVES[5])
    assert not verify_inclusion(-1, 8, leaf, proof, root)
    assert not verify_inclusion(8, 8, leaf, proof, root)
    assert not verify_inclusion(5, 9, leaf, proof, root)
    assert not verify_inclusion(5, 8, leaf, [*proof, proof[0]], root)
    assert not verify_inclusion(5, 8, leaf, proof[:-1], root)
    assert not verify_inclusion(5, 8, leaf, [p[:31] for p in proof], root)
    # the same bytes cut at other places: every hash must be 32 bytes, in the inner part and on the edge
    shifted = [proof[0] + proof[1][:1], proof[1][1:], proof[2]]
    assert b"".join(shifted) == b"".join(proof)
    assert not verify_inclusion(5, 8, leaf, shifted, root)
    assert not verify_inclusion(5, 8, leaf, [proof[0], proof[1] + proof[2][:1], proof[2][1:]], root)
    assert not verify_inclusion(5, 8, leaf[:31], proof, root)
    assert not verify_inclusion(5, 8, leaf, proof, root[:31])
    assert verify_inclusion(5, 8, leaf, tuple(proof), root)
    old = tree.root(6)
    cproof = tree.consistency_proof(6)
    assert not verify_consistency(6, 8, old, root, cproof[:-1])
    assert not verify_consistency(6, 8, old, root, [*cproof, cproof[0]])
    assert not verify_consistency(8, 6, root, old, cproof)
    assert not verify_consistency(6, 6, old, old, cproof)
    assert verify_consistency(0, 8, EMPTY_ROOT, root, [])
    assert not verify_consistency(0, 8, root, root, [])
    assert not verify_consistency(6, 8, old, root, [])


def test_inclusion_and_consistency_for_every_small_tree() -> None:
    data = [bytes([i]) * (i % 5) for i in range(40)]
    tree = MerkleTree(data)
    hashes = [leaf_hash(d) for d in data]
    for n in range(1, 41):
        root = root_from_leaves(hashes[:n])
        assert tree.root(n) == root
        for i in range(n):
            assert verify_inclusion(i, n, hashes[i], tree.inclusion_proof(i, n), root)
        for m in range(0, n + 1):
            assert verify_consistency(m, n, tree.root(m), root, tree.consistency_proof(m, n))


def _flip(proof: list[bytes], item: int, byte: int) -> list[bytes]:
    out = list(proof)
    p = bytearray(out[item])
    p[byte] ^= 0x01
    out[item] = bytes(p)
    return out


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3000), st.data())
def test_any_leaf_of_any_tree_proves_and_any_flip_fails(size: int, data: st.DataObject) -> None:
    leaves = [i.to_bytes(4, "big") for i in range(size)]
    tree = MerkleTree(leaves)
    index = data.draw(st.integers(0, size - 1))
    root = tree.root()
    proof = tree.inclusion_proof(index)
    leaf = leaf_hash(leaves[index])
    assert verify_inclusion(index, size, leaf, proof, root)
    assert inclusion_proof(index, size, tree.read) == proof
    if proof:
        item = data.draw(st.integers(0, len(proof) - 1))
        assert not verify_inclusion(
            index, size, leaf, _flip(proof, item, data.draw(st.integers(0, 31))), root
        )
    bad_leaf = bytearray(leaf)
    bad_leaf[data.draw(st.integers(0, 31))] ^= 0x80
    assert not verify_inclusion(index, size, bytes(bad_leaf), proof, root)
    other = data.draw(st.integers(0, size - 1))
    if other != index:
        assert not verify_inclusion(other, size, leaf, proof, root)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3000), st.data())
def test_any_prefix_is_consistent_and_any_flip_fails(new: int, data: st.DataObject) -> None:
    tree = MerkleTree(i.to_bytes(4, "big") for i in range(new))
    old = data.draw(st.integers(0, new))
    proof = tree.consistency_proof(old)
    old_root, new_root = tree.root(old), tree.root()
    assert consistency_proof(old, new, tree.read) == proof
    assert verify_consistency(old, new, old_root, new_root, proof)
    if proof:
        item = data.draw(st.integers(0, len(proof) - 1))
        assert not verify_consistency(
            old, new, old_root, new_root, _flip(proof, item, data.draw(st.integers(0, 31)))
        )
    if old > 0:
        bad = bytearray(old_root)
        bad[data.draw(st.integers(0, 31))] ^= 0x01
        assert not verify_consistency(old, new, bytes(bad), new_root, proof)
        if old < new:
            # a different old tree (one leaf changed) is not a prefix of this new tree
            changed = MerkleTree((b"x" if i == old - 1 else i.to_bytes(4, "big")) for i in range(old)).root()
            assert not verify_consistency(old, new, changed, new_root, proof)
