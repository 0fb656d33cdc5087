"""Every mapped primitive equals its Gallina definition (rocq/theories/Vec.v, nat operations of the stdlib).

The definitions are extracted a second time WITHOUT the mapping (rocq/PrimRef.v) and translated by the same
generator into tests/oracle/_primref.py, where vectors are plain Coq lists and nat arithmetic is unary
recursion.  Each primitive of govern/oracle/_prims.py must agree with it on exhaustive small inputs and
random ones, including out-of-range indices, empty vectors and operands of different lengths.
"""

from __future__ import annotations

import importlib.util
import itertools
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from govern.oracle import _prims

from ._conv import cons, mask, uncons, vec

ref: Any = importlib.import_module("tests.oracle._primref")
RNG = random.Random(4)


def rvec(max_len: int = 9, max_val: int = 12) -> list[int]:
    return [RNG.randrange(max_val) for _ in range(RNG.randrange(max_len + 1))]


def rmask(max_len: int = 9) -> list[bool]:
    return [RNG.random() < 0.5 for _ in range(RNG.randrange(max_len + 1))]


def to_z(z: int) -> tuple[Any, ...]:
    """A Python int as Coq's Z (Z0 | Zpos p | Zneg p; positive = xI p | xO p | xH)."""

    def pos(p: int) -> tuple[Any, ...]:
        return (2,) if p == 1 else (p % 2 == 0 and (1, pos(p // 2))) or (0, pos(p // 2))

    return (0,) if z == 0 else ((1, pos(z)) if z > 0 else (2, pos(-z)))


def from_z(t: tuple[Any, ...]) -> int:
    def pos(p: tuple[Any, ...]) -> int:
        return 1 if p[0] == 2 else 2 * pos(p[1]) + (1 if p[0] == 0 else 0)

    return 0 if t[0] == 0 else (pos(t[1]) if t[0] == 1 else -pos(t[1]))


def rz(big: bool = False) -> int:
    return RNG.choice([RNG.randint(-20, 20), RNG.randint(-(2**40), 2**40) if big else RNG.randint(-3, 3)])


def zargs(kinds: str, big: bool = True) -> tuple[list[Any], list[Any]]:
    """Arguments of integer-vector primitives: Z = integer vector, z = Z scalar, n = nat."""
    ours: list[Any] = []
    theirs: list[Any] = []
    for k in kinds:
        if k == "Z":
            xs = [rz(big=big) for _ in range(RNG.randrange(8))]
            ours.append(vec(xs))
            theirs.append(cons([to_z(x) for x in xs]))
        elif k == "z":
            z = rz(big=big and RNG.random() < 0.3)
            ours.append(z)
            theirs.append(to_z(z))
        elif k == "M":
            bs = rmask()
            ours.append(mask(bs))
            theirs.append(cons(bs))
        else:
            n = RNG.randrange(9)
            ours.append(n)
            theirs.append(n)
    return ours, theirs


def zres(x: Any) -> Any:
    """A reference result with Z entries as Python ints."""
    if isinstance(x, tuple) and x and x[0] in (0, 1) and (len(x) == 1 or len(x) == 3):
        items = uncons(x)
        return [from_z(i) if isinstance(i, tuple) else i for i in items]
    return x


Z_PRIMS: dict[str, tuple[Callable[..., Any], Callable[..., Any], str]] = {
    "zlen": (_prims.zlen, ref.c_zlen, "Z"),
    "zconst": (_prims.zconst, ref.c_zconst, "nz"),
    "zcol": (_prims.zcol, ref.c_zcol, "nnnz"),
    "zadd": (_prims.zadd, ref.c_zadd, "ZZ"),
    "zsub": (_prims.zsub, ref.c_zsub, "ZZ"),
    "zmin": (_prims.zmin, ref.c_zmin, "ZZ"),
    "zmax": (_prims.zmax, ref.c_zmax, "ZZ"),
    "zeq": (_prims.zeq, ref.c_zeq, "ZZ"),
    "zlt": (_prims.zlt, ref.c_zlt, "ZZ"),
    "zle": (_prims.zle, ref.c_zle, "ZZ"),
    "zand": (_prims.zand, ref.c_zand, "ZZ"),
    "zor": (_prims.zor, ref.c_zor, "ZZ"),
    "znot": (_prims.znot, ref.c_znot, "Z"),
    "zmulc": (_prims.zmulc, ref.c_zmulc, "Zz"),
    "zite": (_prims.zite, ref.c_zite, "ZZZ"),
    "znz": (_prims.znz, ref.c_znz, "Z"),
    "zinrange": (_prims.zinrange, ref.c_zinrange, "Zzz"),
    "ztonat": (_prims.ztonat, ref.c_ztonat, "Z"),
    "mand": (_prims.mand, ref.c_mand, "MM"),
    "mandn": (_prims.mandn, ref.c_mandn, "MM"),
    "zaxpy": (_prims.zaxpy, ref.c_zaxpy, "ZZZz"),
    "zinand": (_prims.zinand, ref.c_zinand, "MZzz"),
    "mnone": (_prims.mnone, ref.c_mnone, "MM"),
}


@pytest.mark.parametrize("name", sorted(Z_PRIMS))
def test_integer_primitive_matches_its_gallina_definition(name: str) -> None:
    ours, theirs, kinds = Z_PRIMS[name]
    for _ in range(250):
        # unary nat results (Z.to_nat, nat division) keep the reference's numbers small there
        a, b = zargs(kinds, big=name not in ("zmulc", "ztonat", "zcol", "zaxpy"))
        got = py(ours(*a))
        want = theirs(*b)
        want = zres(want) if isinstance(want, tuple) else want
        assert got == want, (name, a)


def test_nat_mul_and_z_scalars_match_their_gallina_definitions() -> None:
    for a, b in itertools.product(range(25), repeat=2):
        assert _prims.nat_mul(a, b) == ref.c_ref_nat_mul(a)(b)
    for _ in range(300):
        x, y = rz(big=True), rz(big=True)
        assert _prims.z_add(x, y) == from_z(ref.c_ref_z_add(to_z(x))(to_z(y)))
    for n in range(200):
        assert _prims.z_of_nat(n) == from_z(ref.c_ref_z_of_nat(n))


def test_integer_primitives_refuse_to_wrap() -> None:
    big = np.array([2**62, -(2**62)], dtype=np.int64)
    with pytest.raises(OverflowError):
        _prims.zadd(big, big)
    with pytest.raises(OverflowError):
        _prims.zsub(big, -big)
    with pytest.raises(OverflowError):
        _prims.zmulc(big, 4)
    with pytest.raises(OverflowError):
        _prims.zconst(2, 2**63)


def py(x: Any) -> Any:
    """A prim result as plain Python (lists for vectors)."""
    if isinstance(x, np.ndarray):
        assert not x.flags.writeable, "primitives return read-only arrays"
        assert x.dtype in (np.int8, np.int32, np.int64, np.bool_)
        return [bool(v) if x.dtype == np.bool_ else int(v) for v in x]
    assert type(x) in (int, bool), f"scalar results are Python ints/bools, got {type(x)}"
    return x


def rf(x: Any) -> Any:
    """A reference result as plain Python."""
    if isinstance(x, tuple):
        return uncons(x)
    return x


# name -> (our prim, reference, argument generator producing (prim args, reference args))
V = "v"
M = "m"
N = "n"


def vec32(xs: list[int]) -> npt.NDArray[np.int32]:
    a = np.array(xs, dtype=np.int32)
    a.flags.writeable = False
    return a


def args_of(kinds: str) -> tuple[list[Any], list[Any]]:
    """Random arguments; a vector is int64 or int32 (the engine's tables are int32), at random."""
    ours: list[Any] = []
    theirs: list[Any] = []
    for k in kinds:
        if k == V:
            xs = rvec()
            ours.append(vec(xs) if RNG.random() < 0.5 else vec32(xs))
            theirs.append(cons(xs))
        elif k == M:
            bs = rmask()
            ours.append(mask(bs))
            theirs.append(cons(bs))
        else:
            n = RNG.randrange(14)
            ours.append(n)
            theirs.append(n)
    return ours, theirs


VECTOR_PRIMS: dict[str, tuple[Callable[..., Any], Callable[..., Any], str]] = {
    "vlen": (_prims.vlen, ref.c_vlen, V),
    "mlen": (_prims.mlen, ref.c_mlen, M),
    "viota": (_prims.viota, ref.c_viota, N),
    "vgather": (_prims.vgather, ref.c_vgather, V + V),
    "mgather": (_prims.mgather, ref.c_mgather, M + V),
    "vselect": (_prims.vselect, ref.c_vselect, M + V + V),
    "vadd": (_prims.vadd, ref.c_vadd, V + V),
    "veq": (_prims.veq, ref.c_veq, V + V),
    "vequals": (_prims.vequals, ref.c_vequals, V + N),
    "vnotbit": (_prims.vnotbit, ref.c_vnotbit, M),
    "vmax": (_prims.vmax, ref.c_vmax, V),
    "vnth": (_prims.vnth, ref.c_vnth, V + N),
    "mnth": (_prims.mnth, ref.c_mnth, M + N),
    "mall": (_prims.mall, ref.c_mall, M),
    "mor": (_prims.mor, ref.c_mor, M + M),
    "mcount": (_prims.mcount, ref.c_mcount, M),
    "mwhere": (_prims.mwhere, ref.c_mwhere, M),
    "mmark": (_prims.mmark, ref.c_mmark, N + V),
    "mfirst_false": (_prims.mfirst_false, ref.c_mfirst_false, M),
    "vrank": (_prims.vrank, ref.c_vrank, M),
    "vgeq": (_prims.vgeq, ref.c_vgeq, V + V + V + V),
    "mallat": (_prims.mallat, ref.c_mallat, M + V),
    "vstepok": (_prims.vstepok, ref.c_vstepok, M + V + V + V),
    "vseleq": (_prims.vseleq, ref.c_vseleq, M + V + V + V),
}


@pytest.mark.parametrize("name", sorted(VECTOR_PRIMS))
def test_vector_primitive_matches_its_gallina_definition(name: str) -> None:
    ours, theirs, kinds = VECTOR_PRIMS[name]
    for _ in range(400):
        a, b = args_of(kinds)
        assert py(ours(*a)) == rf(theirs(*b)), (name, b)


def test_vjump_matches_its_gallina_definition() -> None:
    # a Coq pair of vectors: (0, first, second)
    for _ in range(400):
        (f, d), (cf, cd) = args_of(V + V)
        if RNG.random() < 0.6:  # mostly the fused path: f maps into itself, d as long as f
            xs = [RNG.randrange(len(f) + (RNG.random() < 0.2)) for _ in range(len(f))]  # some out of range
            ds = [RNG.randrange(6) for _ in xs]
            f, cf, d, cd = vec32(xs), cons(xs), vec(ds), cons(ds)
        tag, got_f, got_d = _prims.vjump(f, d)
        want = ref.c_vjump(cf, cd)
        assert tag == want[0] == 0
        assert (py(got_f), py(got_d)) == (rf(want[1]), rf(want[2])), (cf, cd)


def test_vjump_refuses_to_wrap() -> None:
    with pytest.raises(OverflowError):
        _prims.vjump(vec32([1, 0]), vec32([2**30, 2**30]))
    with pytest.raises(OverflowError):  # the unfused path (d shorter than f) too
        _prims.vjump(vec32([1, 0, 0]), vec32([2**30, 2**30]))


def test_mallat_when_every_entry_is_true() -> None:
    for _ in range(300):
        bs = rmask()
        idx = [i for i, b in enumerate(bs) if b and RNG.random() < 0.8]
        want = ref.c_mallat(cons(bs), cons(idx))
        assert _prims.mallat(mask(bs), vec32(idx)) is want
        assert want is True


def test_vgeq_when_the_gathers_agree() -> None:
    # random arguments rarely agree: build ones that do, and then break one entry
    for _ in range(300):
        x, u = rvec(max_val=6), rvec(max_val=8)  # some of u out of range of x: those read 0
        y = [x[i] if i < len(x) else 0 for i in u] + [RNG.randrange(5) for _ in range(3)]
        w = list(range(len(u)))
        for xs, us, ys, ws in ((x, u, y, w), (x, u, [v + 1 for v in y], w)):
            want = ref.c_vgeq(cons(xs), cons(us), cons(ys), cons(ws))
            assert _prims.vgeq(vec(xs), vec32(us), vec32(ys), vec(ws)) is want


def witness(bs: list[bool], rs: list[int]) -> tuple[list[int], list[int]]:
    """The normal form and depth of every state under repair table rs (cycles: any values)."""
    n = len(bs)
    fs, ds = [], []
    for s in range(n):
        cur, k = s, 0
        while k <= n and not (0 <= cur < n and bs[cur]):
            cur = rs[cur] if 0 <= cur < n else 0
            k += 1
        fs.append(cur)
        ds.append(k)
    return fs, ds


def test_vstepok_on_witnesses_and_near_misses() -> None:
    seen = {True: 0, False: 0}
    for _ in range(600):
        n = RNG.randrange(1, 10)
        bs = [RNG.random() < 0.5 for _ in range(n)]
        rs = [s if bs[s] else RNG.randrange(n + (RNG.random() < 0.1)) for s in range(n)]  # some out of range
        fs, ds = witness(bs, rs)
        change = RNG.randrange(6)
        if change == 1:
            ds[RNG.randrange(n)] += RNG.choice([1, -1]) if ds[0] else 1
            ds = [max(0, x) for x in ds]
        elif change == 2:
            fs[RNG.randrange(n)] = RNG.randrange(n + 1)
        elif change == 3:  # lengths differ: every operand is truncated as the definition says
            fs, ds, bs = fs[: RNG.randrange(n + 1)], ds[: RNG.randrange(n + 1)], bs[: RNG.randrange(n + 1)]
        want = ref.c_vstepok(cons(bs), cons(rs), cons(fs), cons(ds))
        for mk in (vec, vec32):
            assert _prims.vstepok(mask(bs), mk(rs), mk(fs), vec(ds)) is want, (bs, rs, fs, ds)
        seen[want] += 1
    assert seen[True] > 100 and seen[False] > 100


def test_vstepok_never_wraps() -> None:
    # d[0] = d[r 0] + 1 with d[r 0] the largest int32: false over the naturals, never a wrapped true
    top = 2**31 - 1
    assert _prims.vstepok(mask([False, True]), vec32([1, 1]), vec32([1, 1]), vec32([0, top])) is False
    assert _prims.vstepok(mask([False, True]), vec32([1, 1]), vec32([1, 1]), vec([top + 1, top])) is True


BIG = 1 << 19  # above the size where gathers and vgeq run in chunks on two threads


def test_big_gathers_and_comparisons_equal_their_small_meaning() -> None:
    rng = np.random.default_rng(7)
    for dt in (np.int32, np.int64):
        a = rng.integers(0, BIG, BIG).astype(dt)
        idx = rng.integers(0, BIG, BIG + 5).astype(dt)
        a.flags.writeable = idx.flags.writeable = False
        got = _prims.vgather(a, idx)
        assert got.dtype == a.dtype and not got.flags.writeable
        assert np.array_equal(got, a[idx.astype(np.intp)])
        out = idx.copy()
        out[-1] = BIG  # one index out of range reads 0
        out.flags.writeable = False
        want = a[np.minimum(out, BIG - 1).astype(np.intp)]
        want[-1] = 0
        assert np.array_equal(_prims.vgather(a, out), want)
        # vgeq over every chunk boundary: equal, then one entry changed at each end and in the middle
        y = np.asarray(a[idx.astype(np.intp)], dtype=np.int64)
        w = np.arange(idx.shape[0], dtype=np.int64)
        assert _prims.vgeq(a, idx, y, w) is True
        for pos in (0, BIG // 2 - 1, BIG // 2, idx.shape[0] - 1):
            y2 = y.copy()
            y2[pos] += 1
            assert _prims.vgeq(a, idx, y2, w) is False
        assert _prims.vgeq(a, out, y, w) is False  # out of range reads 0, a[...] was read instead
    m = rng.random(BIG) < 0.3
    where = np.flatnonzero(m)
    assert _prims.mallat(m, where) is True
    for pos in (0, where.shape[0] // 2, where.shape[0] - 1):
        bad = where.copy()
        bad[pos] = np.flatnonzero(~m)[0]
        assert _prims.mallat(m, bad) is False
        bad[pos] = BIG  # out of range reads False
        assert _prims.mallat(m, bad) is False
    f = rng.integers(0, BIG, BIG).astype(np.int32)
    d = rng.integers(0, 9, BIG).astype(np.int32)
    f.flags.writeable = d.flags.writeable = False
    _, f2, d2 = _prims.vjump(f, d)
    assert np.array_equal(f2, f[f]) and np.array_equal(d2, d + d[f])
    g = f.copy()
    g[BIG // 2] = BIG  # out of range, in one chunk only: reads 0 there
    g.flags.writeable = False
    _, g2, e2 = _prims.vjump(g, d)
    safe = np.minimum(g, BIG - 1)
    want_g, want_e = g[safe], d + d[safe]
    want_g[BIG // 2], want_e[BIG // 2] = 0, d[BIG // 2]
    assert np.array_equal(g2, want_g) and np.array_equal(e2, want_e)
    r = _prims.vrank(m)
    assert np.array_equal(r, np.concatenate([[0], np.cumsum(m)[:-1]]))
    # vstepok over every chunk boundary: repair one step towards the next valid state
    ids = np.arange(BIG + 3)
    valid = rng.random(BIG + 3) < 0.5
    valid[-1] = True
    nxt = np.flatnonzero(valid)[np.searchsorted(np.flatnonzero(valid), ids)]  # next valid at or after
    rep = np.where(valid, ids, np.minimum(ids + 1, nxt)).astype(np.int32)
    depth = (nxt - ids).astype(np.int32)
    nf = nxt.astype(np.int32)
    for a in (rep, depth, nf):
        a.flags.writeable = False
    assert _prims.vstepok(valid, rep, nf, depth) is True
    for anchor in (0, BIG // 2, BIG - 9):
        pos = anchor + int(np.flatnonzero(~valid[anchor:])[0])  # an invalid state: its own step is checked
        for which in ("nf", "depth"):
            bad = (nf if which == "nf" else depth).copy()
            bad[pos] += 1
            args = (bad, depth) if which == "nf" else (nf, bad)
            assert _prims.vstepok(valid, rep, *args) is False
    out = rep.copy()
    out[BIG // 2] = BIG + 3  # out of range reads 0
    assert _prims.vstepok(valid, out, nf, depth) is False


def test_int32_vectors_never_wrap() -> None:
    big = vec32([2**30, 2**30, 5])
    with pytest.raises(OverflowError):
        _prims.vadd(big, big)
    assert py(_prims.vadd(vec32([2**30, 1]), vec([2**30, 2]))) == [2**31, 3]  # int64 operand: int64 sum
    assert py(_prims.vequals(vec32([1, 2]), 2**40)) == [False, False]
    assert py(_prims.vequals(vec32([1, 2**31 - 1]), 2**31 - 1)) == [False, True]


def test_gather_of_the_empty_vector_and_all_out_of_range() -> None:
    assert py(_prims.vgather(vec([]), vec([0, 3]))) == rf(ref.c_vgather(cons([]), cons([0, 3])))
    assert py(_prims.mgather(mask([]), vec([2]))) == rf(ref.c_mgather(cons([]), cons([2])))
    assert py(_prims.vgather(vec([5, 6]), vec([]))) == []


def test_every_mapped_primitive_is_tested() -> None:
    gen_path = Path(__file__).parents[2] / "rocq" / "gen" / "jsonpy.py"
    spec = importlib.util.spec_from_file_location("jsonpy_for_test", gen_path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["jsonpy_for_test"] = mod
    spec.loader.exec_module(mod)
    mapped = {impl.removeprefix("_P.") for _, impl in mod.PRIMS.values()}
    scalars = {"andb", "nat_log2", "nat_mul", "z_add", "z_of_nat", "vjump"}  # vjump: its own test
    tested = set(VECTOR_PRIMS) | set(NAT_PRIMS) | set(Z_PRIMS) | scalars
    assert mapped == tested


NAT_PRIMS: dict[str, tuple[Callable[..., Any], Any]] = {
    "nat_eqb": (_prims.nat_eqb, ref.c_ref_nat_eqb),
    "nat_ltb": (_prims.nat_ltb, ref.c_ref_nat_ltb),
    "nat_leb": (_prims.nat_leb, ref.c_ref_nat_leb),
    "nat_add": (_prims.nat_add, ref.c_ref_nat_add),
}


@pytest.mark.parametrize("name", sorted(NAT_PRIMS))
def test_nat_primitive_matches_its_gallina_definition(name: str) -> None:
    ours, theirs = NAT_PRIMS[name]
    for a, b in itertools.product(range(40), repeat=2):
        assert ours(a, b) == theirs(a)(b), (name, a, b)
    for _ in range(200):  # unary recursion stays shallow enough below ~600
        a, b = RNG.randrange(600), RNG.randrange(600)
        assert ours(a, b) == theirs(a)(b), (name, a, b)


def test_log2_matches_its_gallina_definition() -> None:
    for n in range(0, 700):
        assert _prims.nat_log2(n) == ref.c_ref_nat_log2(n), n


def test_andb_matches_its_gallina_definition() -> None:
    for a, b in itertools.product([True, False], repeat=2):
        assert _prims.andb(a, b) == ref.c_ref_andb(a, b)


def test_vadd_refuses_to_wrap() -> None:
    big = np.array([2**62, 2**62], dtype=np.int64)
    with pytest.raises(OverflowError):
        _prims.vadd(big, big)


def test_vequals_with_a_number_beyond_int64() -> None:
    assert py(_prims.vequals(vec([1, 2]), 2**70)) == [False, False]


def test_recorded_bounds_never_hide_an_overflow_nor_invent_one() -> None:
    # vectors made by primitives carry an upper bound of |entry|; results must still be exact
    big = _prims.zconst(4, 2**62)
    with pytest.raises(OverflowError):
        _prims.zadd(big, big)
    with pytest.raises(OverflowError):
        _prims.zmulc(big, 2)
    col = _prims.zcol(6, 2, 3, -5)
    assert py(col) == [-5 + (s // 2) % 3 for s in range(6)]
    x = _prims.zmulc(_prims.zsub(col, _prims.zconst(6, 7)), 3)
    y = _prims.zadd(x, _prims.zite(_prims.zlt(col, x), col, x))
    want_x = [(-5 + (s // 2) % 3 - 7) * 3 for s in range(6)]
    assert py(x) == want_x
    assert py(y) == [a + (c if c < a else a) for a, c in zip(want_x, py(col), strict=True)]
    _prims.reset()
    assert py(_prims.zconst(3, 9)) == [9, 9, 9]


def test_vgeq_index_conversions_follow_the_arrays() -> None:
    """vgeq converts a read-only index vector once per check; the answers never depend on that."""
    _prims.reset()
    idx = vec32([2, 0, 1])
    for _ in range(3):  # the same index object with different data: converted once, read each time
        xs, ys = rvec(3, 5), rvec(3, 5)
        xs, ys = xs + [0] * (3 - len(xs)), ys + [0] * (3 - len(ys))
        want = ref.c_vgeq(cons(xs), cons([2, 0, 1]), cons(ys), cons([2, 0, 1]))
        assert _prims.vgeq(vec32(xs), idx, vec32(ys), idx) is want
    assert id(idx) in _prims._INDEX
    writable = np.array([0, 1, 2], dtype=np.int32)  # writable arrays are never cached
    a = vec32([5, 6, 7])
    assert _prims.vgeq(a, writable, a, vec32([0, 1, 2])) is True
    writable[0] = 1
    assert _prims.vgeq(a, writable, a, vec32([0, 1, 2])) is False
    assert id(writable) not in _prims._INDEX
    _prims.reset()
    assert not _prims._INDEX


RNG_NP = np.random.default_rng(20261201)


def test_the_fused_rules_primitives_when_they_hold_and_on_large_inputs() -> None:
    """vseleq and mnone are mostly False on random inputs: here the row is the selection (or one entry
    off) and b covers a (or misses one entry), on short and on multi-chunk inputs; zaxpy and zinand on
    int32 and int64 columns, including sums that leave int32 (they must widen, not wrap)."""
    for n in (0, 1, 7, 3 * (1 << 18) + 5):
        m = RNG_NP.random(n) < 0.5
        a = RNG_NP.integers(0, 1000, n).astype(np.int32)
        b = RNG_NP.integers(0, 1000, n).astype(np.int64)
        row = np.where(m, a, b)
        assert _prims.vseleq(m, a, b, row) is True
        if n:
            off = row.copy()
            off[-1] += 1
            assert _prims.vseleq(m, a, b, off) is False
        cover = m | (RNG_NP.random(n) < 0.5)
        assert _prims.mnone(m, cover) is True
        if n and m.any():
            hole = cover.copy()
            hole[int(np.flatnonzero(m)[-1])] = False
            assert _prims.mnone(m, hole) is False
    cases = [([2**30], [-(2**30)], [2**30], 1), ([5, -3], [2, 2], [1, 1], -7), ([2**31 - 1], [0], [1], 1),
             ([2**31 - 1], [1], [0], 1), ([2**30], [2**30], [0], 2)]
    for xs, ys, zs, c in cases:
        for dt in (np.int32, np.int64):
            acc, v, col = (np.array(t, dtype=dt) for t in (xs, ys, zs))
            want = [x + (y - z) * c for x, y, z in zip(xs, ys, zs, strict=True)]
            assert py(_prims.zaxpy(acc, v, col, c)) == want
    with pytest.raises(OverflowError):
        big = np.array([2**62], dtype=np.int64)
        _prims.zaxpy(big, big, -big, 4)
    v32 = np.array([-5, 0, 3, 2**31 - 1], dtype=np.int32)
    ok = np.array([True, True, False, True])
    for lo, hi in ((-(2**40), 2**40), (0, 4), (2**31, 2**33), (-5, -4)):
        want = [bool(k) and lo <= x < hi for k, x in zip(ok, v32.tolist(), strict=True)]
        assert py(_prims.zinand(ok, v32, lo, hi)) == want


# Constant vectors: zconst's vector is a stride-0 view, and primitives shortcut constant operands. Every
# elementwise primitive must give exactly its definition's answer when any of its vector operands is such
# a constant vector (of any length), alone or with ordinary ones.
CONST_PRIMS: dict[str, tuple[Callable[..., Any], Callable[..., Any], str]] = {
    **{k: v for k, v in Z_PRIMS.items() if k not in ("zlen", "zconst", "zcol")},
    "vselect": (_prims.vselect, ref.c_vselect, "MZZ"),
    "vadd": (_prims.vadd, ref.c_vadd, "ZZ"),
    "veq": (_prims.veq, ref.c_veq, "ZZ"),
    "mor": (_prims.mor, ref.c_mor, "MM"),
    "vseleq": (_prims.vseleq, ref.c_vseleq, "MZZZ"),
}
_NAT_ONLY = ("vselect", "vadd", "veq", "vseleq", "ztonat")  # vec operands: naturals


def _constant_args(name: str, kinds: str) -> tuple[list[Any], list[Any]]:
    ours, theirs = zargs(kinds, big=name not in ("zmulc", "ztonat", "zaxpy"))
    for j, k in enumerate(kinds):
        if k not in "ZM" or RNG.random() < 0.35:
            continue
        n = RNG.randrange(2, 9)
        if k == "M":
            b = RNG.random() < 0.5
            ours[j] = np.broadcast_to(np.bool_(b), (n,))
            theirs[j] = cons([b] * n)
        else:
            big = name not in ("zmulc", "ztonat", "zaxpy")
            z = RNG.randrange(0, 12) if name in _NAT_ONLY else rz(big=big)
            ours[j] = _prims.zconst(n, z)
            theirs[j] = cons([z] * n) if name in _NAT_ONLY and name != "ztonat" else cons([to_z(z)] * n)
    for j, k in enumerate(kinds):  # vec operands of the Vec.v primitives: naturals, as plain lists
        if k == "Z" and name in _NAT_ONLY and name != "ztonat" and ours[j].strides[0] != 0:
            xs = [abs(int(x)) % 12 for x in ours[j]]
            ours[j], theirs[j] = vec(xs), cons(xs)
    return ours, theirs


@pytest.mark.parametrize("name", sorted(CONST_PRIMS))
def test_primitives_on_constant_vectors_match_their_gallina_definition(name: str) -> None:
    ours, theirs, kinds = CONST_PRIMS[name]
    for _ in range(300):
        a, b = _constant_args(name, kinds)
        got = py(ours(*a))
        want = theirs(*b)
        want = zres(want) if isinstance(want, tuple) else want
        assert got == want, (name, a)


def test_zconst_is_a_read_only_constant_vector() -> None:
    c = _prims.zconst(5, -3)
    assert py(c) == [-3] * 5 and c.strides == (0,)
    with pytest.raises(ValueError):
        np.asarray(c)[0] = 1


def test_columns_and_recorded_intervals_give_exact_encodings() -> None:
    """zcol (periodic columns, int8 when they fit), zaxpy's recorded interval, and ztonat trusting it:
    chains of them equal the plain arithmetic, including negative results that Z.to_nat clamps."""
    for _ in range(400):
        n = RNG.randrange(0, 70)
        stride, size = RNG.randrange(0, 6), RNG.randrange(0, 6)
        lo = RNG.choice([RNG.randint(-150, 150), RNG.randint(-(2**40), 2**40)])
        col = _prims.zcol(n, stride, size, lo)
        want_col = [lo + ((s // stride if stride else 0) % size if size else (s // stride if stride else 0))
                    for s in range(n)]
        assert py(col) == want_col, (n, stride, size, lo)
        acc = _prims.zcol(n, 1, n, 0) if RNG.random() < 0.5 else _prims.zconst(n, RNG.randint(-50, 50))
        v = _prims.zconst(n, RNG.randint(-200, 200)) if RNG.random() < 0.5 else col
        c = RNG.randint(-40, 40)
        r = _prims.zaxpy(acc, v, col, c)
        want = [x + (y - z) * c for x, y, z in zip(py(acc), py(v), want_col, strict=True)]
        assert py(r) == want
        assert py(_prims.ztonat(r)) == [max(0, x) for x in want]
        r2 = _prims.zaxpy(r, _prims.zconst(n, 1), col, 3)
        want2 = [x + (1 - z) * 3 for x, z in zip(want, want_col, strict=True)]
        assert py(_prims.ztonat(r2)) == [max(0, x) for x in want2]


def test_zaxpy_with_a_zero_difference_or_factor_is_acc() -> None:
    zero = _prims.zconst(3, 0)
    acc = _prims.zcol(3, 1, 3, 4)
    for c in (0, 2**40, -(2**50)):
        assert py(_prims.zaxpy(acc, zero, vec([0, 0, 0]), c)) == [4, 5, 6]
    assert py(_prims.zaxpy(acc, vec([1, 2, 3]), vec([7, 8, 9]), 0)) == [4, 5, 6]
