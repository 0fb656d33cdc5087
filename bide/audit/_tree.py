"""An in-memory incremental RFC 6962 tree: every complete subtree hash kept, level by level."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from ._merkle import (
    EMPTY_ROOT,
    Coord,
    _consistency_plan,
    _tiles,
    subtree_root,
)

__all__ = ["MerkleTree"]

_sha256 = hashlib.sha256


class MerkleTree:
    """An append-only RFC 6962 tree in memory.

    An append hashes the leaf and at most log2(n) parents (one on average); roots and proofs for any
    earlier size read O(log n) stored hashes. Memory: about 2n hashes of 32 bytes.
    """

    __slots__ = ("_edge", "_levels")

    def __init__(self, leaves: Iterable[bytes] = ()) -> None:
        self._levels: list[list[bytes]] = [[]]
        self._edge: tuple[int, dict[int, bytes]] = (-1, {})
        for data in leaves:
            self.append(data)

    @property
    def size(self) -> int:
        """The number of leaves."""
        return len(self._levels[0])

    def append(self, data: bytes) -> int:
        """Append a leaf (its data, hashed here) and return its index."""
        return self.append_hash(_sha256(b"\x00" + data).digest())

    def append_hash(self, leaf: bytes) -> int:
        """Append a leaf by its leaf hash and return its index."""
        levels = self._levels
        row = levels[0]
        index = len(row)
        row.append(leaf)
        level, h = 0, leaf
        # A finished left-right pair completes a parent; carry upward while pairs complete.
        while not len(levels[level]) & 1:
            left = levels[level][-2]
            h = _sha256(b"\x01" + left + h).digest()
            level += 1
            if level == len(levels):
                levels.append([])
            levels[level].append(h)
        return index

    def _right_edge(self, n: int) -> dict[int, bytes]:
        """start -> hash of leaves [start, n) for every tile boundary of the tree of n leaves (the partial
        subtrees on its right edge), computed once per size: every proof for that size reuses them."""
        if self._edge[0] != n:
            tiles = _tiles(0, n)
            hashes = self.read(tiles)
            out: dict[int, bytes] = {}
            acc = b""
            for (level, index), h in zip(reversed(tiles), reversed(hashes), strict=True):
                acc = h if not acc else _sha256(b"\x01" + h + acc).digest()
                out[index << level] = acc
            self._edge = (n, out)
        return self._edge[1]

    def leaf(self, index: int) -> bytes:
        """The leaf hash at `index`."""
        return self._levels[0][index]

    def read(self, coords: Sequence[Coord]) -> list[bytes]:
        """Stored complete-subtree hashes by (level, index)."""
        levels = self._levels
        return [levels[lv][i] for lv, i in coords]

    def root(self, size: int | None = None) -> bytes:
        """The root of the first `size` leaves (default: all)."""
        n = self.size if size is None else size
        if not 0 <= n <= self.size:
            raise ValueError(f"tree has {self.size} leaves, not {n}")
        return EMPTY_ROOT if n == 0 else self._right_edge(n)[0]

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """The audit path of leaf `index` in the tree of the first `size` leaves (default: all)."""
        n = self.size if size is None else size
        if n > self.size or not 0 <= index < n:
            raise ValueError(f"no leaf {index} in a tree of {n} leaves (the tree has {self.size})")
        # The generic plan-and-read path, specialised: direct list lookups (see _merkle._inclusion_plan).
        levels = self._levels
        inner = (index ^ (n - 1)).bit_length()
        out = [levels[level][(index >> level) ^ 1] for level in range(inner - 1)]
        if inner:
            level = inner - 1
            sibling = (index >> level) ^ 1
            start = sibling << level
            if start + (1 << level) <= n:
                out.append(levels[level][sibling])
            else:
                out.append(self._right_edge(n)[start])
        level, rest = inner, index >> inner
        while rest:
            if rest & 1:
                out.append(levels[level][rest ^ 1])
            rest >>= 1
            level += 1
        return out

    def consistency_proof(self, old: int, new: int | None = None) -> list[bytes]:
        """The proof that the first `old` leaves are a prefix of the first `new` (default: all)."""
        n = self.size if new is None else new
        if not 0 <= old <= n <= self.size:
            raise ValueError(f"no consistency proof from {old} to {n} leaves (the tree has {self.size})")
        if old == 0 or old == n:
            return []
        # The generic plan, with partial subtrees (which end at n) taken from the right-edge cache.
        levels = self._levels
        out: list[bytes] = []
        for item in _consistency_plan(old, n):
            level, index = item[0]
            if len(item) == 1:
                out.append(levels[level][index])
                continue
            last_level, last_index = item[-1]
            if (last_index + 1) << last_level == n:
                out.append(self._right_edge(n)[index << level])
            else:
                out.append(subtree_root(index << level, (last_index + 1) << last_level, self.read))
        return out
