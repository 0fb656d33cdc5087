"""The mapped primitives of the extracted oracle: numpy meanings of the constants of rocq/theories/Vec.v.

Each function here is the run-time meaning of exactly one Gallina definition (named in its docstring);
tests/oracle/test_prims.py compares every one with that definition, extracted without this mapping, on
many inputs.  A ``vec`` is a read-only 1-D int32 or int64 array of naturals (the engine's tables are int32
and are used as they are; a primitive's result has the dtype of the vector it reads values from, and an
int32 result is only made where every value provably fits), a ``mask`` a read-only 1-D bool array, a
``zvec`` a read-only 1-D int32 or int64 array of integers (int32 exactly when a bound the primitive
tracks, on the absolute value of every entry, fits int32: half the memory traffic; the 0/1 results of
comparisons and connectives are int8, a view of numpy's bool result, and so is a variable's column
(`zcol`) when its values fit int8), a ``nat`` a Python int >= 0, a ``Z`` a Python int.
A constant vector (zconst's, and results computed from constants only) is a read-only stride-0 view of
its one value: see "constant vectors" below for the primitives that shortcut it.
Where the exact meaning cannot be computed in the array's dtype (an overflow that a cheap bound cannot
exclude) a primitive raises: the oracle then gives no verdict, never a wrong one.

`vjump` runs a pointer-doubling round in one chunked pass, `vstepok` checks a normal-form and depth
witness in one; `vgeq` and `mallat` decide chunk by chunk
(stopping at the first chunk that fails), on two threads for large inputs (numpy releases the GIL in
`take`). Neither changes a result or which inputs raise.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "andb",
    "mall",
    "mallat",
    "mand",
    "mandn",
    "mcount",
    "mfirst_false",
    "mgather",
    "mlen",
    "mmark",
    "mnone",
    "mnth",
    "mor",
    "mwhere",
    "nat_add",
    "nat_eqb",
    "nat_leb",
    "nat_log2",
    "nat_ltb",
    "nat_mul",
    "reset",
    "vadd",
    "veq",
    "vequals",
    "vgather",
    "vgeq",
    "viota",
    "vjump",
    "vlen",
    "vmax",
    "vnotbit",
    "vnth",
    "vrank",
    "vselect",
    "vseleq",
    "vstepok",
    "z_add",
    "z_of_nat",
    "zadd",
    "zand",
    "zaxpy",
    "zcol",
    "zconst",
    "zeq",
    "zinand",
    "zinrange",
    "zite",
    "zle",
    "zlen",
    "zlt",
    "zmax",
    "zmin",
    "zmulc",
    "znot",
    "znz",
    "zor",
    "zsub",
    "ztonat",
]

Vec = npt.NDArray[np.int64]  # int32 or int64 at run time (see the module docstring)
Mask = npt.NDArray[np.bool_]
_INT64_MAX = int(np.iinfo(np.int64).max)
_INT32_MAX = int(np.iinfo(np.int32).max)

# ---- running big array loops on two threads ------------------------------------------------------------

_T = TypeVar("_T")
_PAR_MIN = 1 << 18  # below this many entries one thread is faster than a hand-off
_CHUNK = 1 << 15  # entries per comparison chunk (two chunks of int64 fit in L2)
# vgeq's chunk: larger, so that its two threads (numpy's take releases the GIL) meet at the GIL seldom
# enough to overlap (with 2**15 they mostly took turns); measured 2**15..2**18 on chain(20)
_GEQ_CHUNK = 1 << 18
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:  # a forked child has the pool object but not its threads
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _two_cores() -> bool:
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return (os.cpu_count() or 1) >= 2


_PARALLEL = _two_cores()


def _halves(n: int, task: Callable[[int, int], _T]) -> list[_T]:
    """task(lo, hi) over [0, n) in two halves, on two threads when n is large; results in order."""
    global _pool
    if n < _PAR_MIN or not _PARALLEL:
        return [task(0, n)]
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="govern-oracle")
        pool = _pool
    mid = n // 2
    first = pool.submit(task, 0, mid)
    second = task(mid, n)
    return [first.result(), second]


def _dtype_for(top: int) -> type[np.signedinteger[npt.NBitBase]]:
    """int32 when every value is at most top and top fits int32, else int64."""
    return np.int32 if top <= _INT32_MAX else np.int64  # type: ignore[return-value]


def _frozen(a: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    a.flags.writeable = False
    return a


# ---- constant vectors ----------------------------------------------------------------------------------
# zconst's vector is a read-only stride-0 view of its one value (numpy's broadcast_to): the same entries as
# a filled array, without writing or reading n of them. A primitive whose result is elementwise over the
# common prefix of its vector operands (entry i depends on entry i of each, and on the scalars) computes,
# when every vector operand is constant, the one entry from the first entries and broadcasts it: every
# entry of the result is that one (`_pointwise`). A few primitives also shortcut ONE constant operand;
# each such case says why it is the same.

_F = TypeVar("_F", bound=Callable[..., Any])


def _cv(a: npt.NDArray[Any]) -> bool:
    """a is a constant vector: at least two entries, all one value (stride 0)."""
    return a.shape[0] > 1 and a.strides[0] == 0


def _spread(one: npt.NDArray[Any], k: int) -> npt.NDArray[Any]:
    """The length-k constant vector (read-only, stride 0) whose entries are one[0] (one has length 1),
    with the bound recorded for one."""
    r = np.broadcast_to(one, (k,))
    if one.dtype == np.bool_:
        return r
    return _checked(r, _BOUNDS.get(id(one)))


def _pointwise(nvec: int) -> Callable[[_F], _F]:
    """For a primitive that is elementwise over the common prefix of its first nvec arguments (vectors):
    when each of them is constant, the result is the constant vector of the entry computed from their
    first entries (raising exactly when computing that entry raises)."""

    def wrap(f: _F) -> _F:
        @functools.wraps(f)
        def g(*args: Any) -> Any:
            vs = args[:nvec]
            if all(_cv(v) for v in vs):
                k = min(v.shape[0] for v in vs)
                return _spread(f(*(v[:1] for v in vs), *args[nvec:]), k)
            return f(*args)

        return g  # type: ignore[return-value]

    return wrap


def _mconst(k: int, b: bool) -> Mask:
    return np.broadcast_to(np.bool_(b), (k,))


def _all(m: Mask) -> bool:
    """Every entry of m is True (a constant m: its one value)."""
    return bool(m[0]) if _cv(m) else bool(m.all())


def _any(m: Mask) -> bool:
    """Some entry of m is True (a constant m: its one value)."""
    return bool(m[0]) if _cv(m) else bool(m.any())


def vlen(a: Vec) -> int:
    """Vec.vlen: the length."""
    return int(a.shape[0])


def mlen(m: Mask) -> int:
    """Vec.mlen: the length."""
    return int(m.shape[0])


def viota(n: int) -> Vec:
    """Vec.viota: [0, 1, ..., n-1] (the same read-only array for the same n within one check)."""
    return _viota_cached(n)


@functools.lru_cache(maxsize=2)
def _viota_cached(n: int) -> Vec:
    return _frozen(np.arange(n, dtype=_dtype_for(n)))  # type: ignore[return-value]


def _gather(a: npt.NDArray[np.generic], idx: Vec, default: object) -> npt.NDArray[np.generic]:
    n = a.shape[0]
    k = idx.shape[0]
    try:
        # numpy bounds-checks every index as it gathers (they are never negative). One thread: a fresh
        # output is faulted in page by page, and two threads faulting pages of one process mostly wait.
        return _frozen(np.take(a, idx))
    except IndexError:
        pass
    if n == 0:
        return _frozen(np.full(k, default, dtype=a.dtype))
    inside = idx < n
    return _frozen(np.where(inside, a[np.where(inside, idx, 0)], np.asarray(default, dtype=a.dtype)))


def vgather(a: Vec, idx: Vec) -> Vec:
    """Vec.vgather: a[idx[j]] for each j; 0 where idx[j] is out of range."""
    return _gather(a, idx, 0)  # type: ignore[return-value]


def mgather(m: Mask, idx: Vec) -> Mask:
    """Vec.mgather: m[idx[j]] for each j; False where idx[j] is out of range."""
    return _gather(m, idx, False)  # type: ignore[return-value]


@_pointwise(3)
def vselect(m: Mask, a: Vec, b: Vec) -> Vec:
    """Vec.vselect: a[i] where m[i] else b[i], truncated to the shortest operand.

    A constant m selects one operand whole: its prefix, as it is."""
    k = min(m.shape[0], a.shape[0], b.shape[0])
    if _cv(m):
        return _frozen((a if m[0] else b)[:k])  # type: ignore[return-value]
    if _cv(a) or _cv(b):
        return _frozen(np.where(m[:k], a[:k], b[:k]))  # type: ignore[return-value]
    # branch-free (np.where branches on every entry, slow on irregular masks): ((a ^ b) * m) ^ b is
    # a ^ b ^ b = a where m, 0 ^ b = b elsewhere; xor and a 0/1 factor never overflow
    out = np.bitwise_xor(a[:k], b[:k])
    np.multiply(out, m[:k], out=out)
    np.bitwise_xor(out, b[:k], out=out)
    return _frozen(out)  # type: ignore[return-value]


@_pointwise(2)
def vadd(a: Vec, b: Vec) -> Vec:
    """Vec.vadd: a[i] + b[i], truncated to the shorter operand (raises on overflow of the result dtype)."""
    k = min(a.shape[0], b.shape[0])
    r = a[:k] + b[:k]
    # Both operands are naturals below 2**(w-1), so their true sum is below 2**w: it wrapped exactly
    # when the stored w-bit result is negative.
    if k and bool((r < 0).any()):
        raise OverflowError(f"vadd: sum exceeds {r.dtype}")
    return _frozen(r)  # type: ignore[return-value]


@_pointwise(2)
def veq(a: Vec, b: Vec) -> Mask:
    """Vec.veq: a[i] == b[i], truncated to the shorter operand."""
    k = min(a.shape[0], b.shape[0])
    return _frozen(a[:k] == b[:k])  # type: ignore[return-value]


def vequals(a: Vec, x: int) -> Mask:
    """Vec.vequals: a[i] == x."""
    if x > int(np.iinfo(a.dtype).max):
        return _frozen(np.zeros(a.shape[0], dtype=np.bool_))  # type: ignore[return-value]
    return _frozen(a == x)  # type: ignore[return-value]


def vnotbit(m: Mask) -> Vec:
    """Vec.vnotbit: 1 where m is False, 0 where it is True.

    int32 below 2**30 entries: the checker only adds such vectors along pointer doubling, where a sum
    stays at most twice the length (and vadd raises rather than wrap)."""
    dt = np.int32 if m.shape[0] < 1 << 30 else np.int64
    return _frozen((~m).astype(dt))  # type: ignore[return-value]


def vmax(a: Vec) -> int:
    """Vec.vmax: the largest entry, 0 for the empty vector."""
    return int(a.max()) if a.shape[0] else 0


def vnth(a: Vec, i: int) -> int:
    """Vec.vnth: a[i], 0 out of range."""
    return int(a[i]) if i < a.shape[0] else 0


def mnth(m: Mask, i: int) -> bool:
    """Vec.mnth: m[i], False out of range."""
    return bool(m[i]) if i < m.shape[0] else False


def mall(m: Mask) -> bool:
    """Vec.mall: every entry is True."""
    return bool(m.all())


@_pointwise(2)
def mor(a: Mask, b: Mask) -> Mask:
    """Vec.mor: a[i] or b[i], truncated to the shorter operand.

    A constant operand: all True is the result, all False leaves the other operand's prefix."""
    k = min(a.shape[0], b.shape[0])
    for c, other in ((a, b), (b, a)):
        if _cv(c):
            return _mconst(k, True) if c[0] else _frozen(other[:k])  # type: ignore[return-value]
    return _frozen(a[:k] | b[:k])  # type: ignore[return-value]


def mcount(m: Mask) -> int:
    """Vec.mcount: the number of True entries."""
    return int(np.count_nonzero(m))


def mwhere(m: Mask) -> Vec:
    """Vec.mwhere: the positions of the True entries, increasing."""
    return _frozen(np.flatnonzero(m).astype(_dtype_for(m.shape[0])))  # type: ignore[return-value]


def mmark(n: int, idx: Vec) -> Mask:
    """Vec.mmark: the length-n mask that is True exactly at the entries of idx (entries >= n ignored)."""
    z = np.zeros(n, dtype=np.bool_)
    z[idx[idx < n]] = True
    return _frozen(z)  # type: ignore[return-value]


def mfirst_false(m: Mask) -> int:
    """Vec.mfirst_false: the first position holding False, or the length if there is none."""
    if bool(m.all()):
        return int(m.shape[0])
    return int(np.argmin(m))


def vrank(m: Mask) -> Vec:
    """Vec.vrank: entry i is the number of True entries of m before position i."""
    r = np.cumsum(m, dtype=_dtype_for(m.shape[0]))
    r -= m
    return _frozen(r)  # type: ignore[return-value]


def vjump(f: Vec, d: Vec) -> tuple[int, Vec, Vec]:
    """Vec.vjump: the pair (f[f[i]] for each i, d[i] + d[f[i]] truncated to the shorter) as the Coq pair
    (0, first, second); out of range reads 0, and the sum raises on overflow of its dtype (as vadd)."""
    n = f.shape[0]
    if d.shape[0] != n:
        return (0, vgather(f, f), vadd(d, vgather(d, f)))
    f2 = np.empty(n, dtype=f.dtype)
    d2 = np.empty(n, dtype=np.result_type(d, d))
    tmp = np.empty(min(_CHUNK, n), dtype=d.dtype)
    for s in range(0, n, _CHUNK):
        e = min(n, s + _CHUNK)
        ci, t = f[s:e], tmp[: e - s]
        if int(ci.max()) < n:
            ip = ci.astype(np.intp)  # one index conversion for both gathers
            np.take(f, ip, out=f2[s:e], mode="clip")  # every index is in range: "clip" never clips
            np.take(d, ip, out=t, mode="clip")
        else:  # some index out of range: that entry reads 0
            f2[s:e] = _gather(f, ci, 0)
            t[...] = _gather(d, ci, 0)
        np.add(d[s:e], t, out=d2[s:e])
    # naturals below 2**(w-1) sum below 2**w: a wrapped sum is exactly a negative stored one
    if n and bool((d2 < 0).any()):
        raise OverflowError(f"vjump: sum exceeds {d2.dtype}")
    return (0, _frozen(f2), _frozen(d2))  # type: ignore[return-value]


def mallat(m: Mask, idx: Vec) -> bool:
    """Vec.mallat: m[idx[i]] for every i (False where idx[i] is out of range)."""
    n = m.shape[0]

    def part(lo: int, hi: int) -> bool:
        buf = np.empty(min(_CHUNK, hi - lo), dtype=np.bool_)
        for s in range(lo, hi, _CHUNK):
            e = min(hi, s + _CHUNK)
            ci, c = idx[s:e], buf[: e - s]
            if int(ci.max()) >= n:
                return False  # an index out of range: that entry reads False
            np.take(m, ci, out=c, mode="clip")  # every index is in range: "clip" never clips
            if not c.all():
                return False
        return True

    return all(_halves(idx.shape[0], part))


# Index vectors that vgeq reads again and again within one check (the position of every normal form,
# once per event in CC2; each event's position table, once per pair in CC1) are converted to numpy's
# index type once, not at every gather. Only read-only arrays (they cannot change); keyed by id() with
# the array itself kept, so an id is never reused while cached; reset() drops them after every check.
_INDEX: dict[int, tuple[Vec, npt.NDArray[np.intp]]] = {}
_INDEX_MAX_U = 1 << 18  # vgeq's second argument is cached only up to this length (CC2 reads each once)


def _index(a: Vec) -> npt.NDArray[np.integer[Any]]:
    if a.dtype == np.intp or a.flags.writeable:
        return a
    hit = _INDEX.get(id(a))
    if hit is not None and hit[0] is a:
        return hit[1]
    ip = a.astype(np.intp)
    _INDEX[id(a)] = (a, ip)
    return ip


def vgeq(x: Vec, u: Vec, y: Vec, w: Vec) -> bool:
    """Vec.vgeq: x[u[i]] == y[w[i]] for every i below min(len u, len w) (out of range reads 0)."""
    k = min(u.shape[0], w.shape[0])
    iu = _index(u) if u.shape[0] <= _INDEX_MAX_U else u
    iw = _index(w)

    def part(lo: int, hi: int) -> bool:
        for s in range(lo, hi, _GEQ_CHUNK):
            e = min(hi, s + _GEQ_CHUNK)
            try:
                # numpy bounds-checks every index as it gathers (they are never negative); no range
                # pass of our own, no "clip" (which clamps every index)
                same = bool(np.equal(np.take(x, iu[s:e]), np.take(y, iw[s:e])).all())
            except IndexError:  # some index out of range: that entry reads 0
                same = bool(np.equal(vgather(x, u[s:e]), vgather(y, w[s:e])).all())
            if not same:
                return False
        return True

    return all(_halves(k, part))


def _take_or_zero(a: Vec, idx: npt.NDArray[np.intp]) -> npt.NDArray[np.generic]:
    try:
        return np.take(a, idx)  # bounds-checked; indices are never negative
    except IndexError:  # some index out of range: that entry reads 0
        return _gather(a, idx, 0)


def vstepok(m: Mask, r: Vec, f: Vec, d: Vec) -> bool:
    """Vec.vstepok: f[i] == f[r[i]] for i below min(len f, len r), and d[i] == d[r[i]] + (0 if m[i]
    else 1) for i below min(len d, len r, len m) (out of range reads 0).

    One chunked pass converting each index chunk once for both gathers; d[i] - (1 - m[i]) is compared
    with d[r[i]] (the same equation over the integers, and it cannot overflow: entries are naturals)."""
    k1 = min(f.shape[0], r.shape[0])
    k2 = min(d.shape[0], r.shape[0], m.shape[0])
    for s in range(0, max(k1, k2), _GEQ_CHUNK):
        e = min(max(k1, k2), s + _GEQ_CHUNK)
        ip = r[s:e].astype(np.intp)
        e1, e2 = min(k1, e), min(k2, e)
        if s < e1 and not bool(np.equal(f[s:e1], _take_or_zero(f, ip[: e1 - s])).all()):
            return False
        if s < e2:
            lhs = np.subtract(d[s:e2], ~m[s:e2], dtype=np.result_type(d.dtype, np.int32))
            if not bool(np.equal(lhs, _take_or_zero(d, ip[: e2 - s])).all()):
                return False
    return True


def nat_eqb(a: int, b: int) -> bool:
    """Nat.eqb."""
    return a == b


def nat_ltb(a: int, b: int) -> bool:
    """Nat.ltb."""
    return a < b


def nat_leb(a: int, b: int) -> bool:
    """Nat.leb."""
    return a <= b


def nat_add(a: int, b: int) -> int:
    """Nat.add."""
    return a + b


def nat_log2(n: int) -> int:
    """Nat.log2: floor of the base-2 logarithm, 0 for 0."""
    return n.bit_length() - 1 if n > 0 else 0


def andb(a: bool, b: bool) -> bool:
    """andb (the generator emits a short-circuit ``and`` wherever both operands are given)."""
    return a and b


# ---- integer vectors (rocq/theories/ZVec.v) -----------------------------------------------------------

_INT64_MIN = int(np.iinfo(np.int64).min)


# An upper bound of |entry| for every integer vector a primitive made, so the int64 overflow checks need no
# pass over the data. Keyed by id() and dropped when the array dies (before its id can be reused); the
# arrays are read-only, so a recorded bound stays true.
_BOUNDS: dict[int, int] = {}
# For some of them (columns, constants, zaxpy's results) also an interval [lo, hi] holding every entry, so
# that ztonat knows without a pass that no entry is negative. Same keying and lifetime as _BOUNDS.
_RANGES: dict[int, tuple[int, int]] = {}


def _forget(key: int) -> None:
    _BOUNDS.pop(key, None)
    _RANGES.pop(key, None)


def _checked(r: npt.NDArray[np.int64], bound: int | None = None, rng: tuple[int, int] | None = None) -> Vec:
    r.flags.writeable = False
    if bound is not None and id(r) not in _BOUNDS:
        _BOUNDS[id(r)] = bound
        if rng is not None:
            _RANGES[id(r)] = rng
        weakref.finalize(r, _forget, id(r))
    return r


def _range(a: Vec) -> tuple[int, int]:
    """An interval holding every entry of a: recorded when a primitive made a, else from its bound."""
    known = _RANGES.get(id(a))
    if known is not None:
        return known
    b = _bound(a)
    return (-b, b)


def _bound(a: Vec) -> int:
    """An upper bound of |a[i]|: recorded when a primitive made a, else computed."""
    known = _BOUNDS.get(id(a))
    if known is not None:
        return known
    return max(abs(int(a.max())), abs(int(a.min()))) if a.shape[0] else 0


def _exact_bound(a: Vec) -> int:
    return max(abs(int(a.max())), abs(int(a.min()))) if a.shape[0] else 0


def zlen(a: Vec) -> int:
    """ZVec.zlen: the length."""
    return int(a.shape[0])


def zconst(n: int, z: int) -> Vec:
    """ZVec.zconst: n copies of z (the same read-only array for the same (n, z) within one check)."""
    if not _INT64_MIN <= z <= _INT64_MAX:
        raise OverflowError("zconst: literal beyond int64")
    return _zconst_cached(n, z)


@functools.lru_cache(maxsize=4)
def _zconst_cached(n: int, z: int) -> Vec:
    # a constant vector: a read-only stride-0 view of the one value (see "constant vectors" above)
    return _checked(np.broadcast_to(np.array(z, dtype=_zdt(abs(z))), (n,)), abs(z), (z, z))


def _zdt(bound: int) -> Any:
    """The dtype of a zvec whose entries are at most bound in absolute value: int32 when it fits."""
    return np.int32 if bound <= _INT32_MAX else np.int64


def _as(a: Vec, dt: Any) -> Vec:
    """a in dtype dt; only called with dt wide enough for every entry of a (its bound fits dt)."""
    return a if a.dtype == dt else a.astype(dt)


def reset() -> None:
    """Drop the memoized constant vectors and index conversions (the front end calls this after every
    check)."""
    _zconst_cached.cache_clear()
    _viota_cached.cache_clear()
    _INDEX.clear()


def _pow2(k: int) -> bool:
    return k > 0 and k & (k - 1) == 0


def zcol(n: int, stride: int, size: int, lo: int) -> Vec:
    """ZVec.zcol: entry s is lo + (s / stride) mod size (nat division: x / 0 = 0, x mod 0 = x).

    When the period stride * size is shorter than n (every variable's column but the last): entry s
    depends only on s mod period (s = q * period + j, j < period: s / stride = q * size + j / stride and
    j / stride < size), so one period, lo + j / stride for j < period, is written and then copied over
    the rest by doubling (memory copies only). Int8 when every entry fits (a bool's or small enum's
    column: a quarter of the memory traffic of int32)."""
    if stride >= 1 and size >= 1 and stride * size < n:
        if not (_INT64_MIN <= lo <= _INT64_MAX and lo + size - 1 <= _INT64_MAX):
            raise OverflowError("zcol: values beyond int64")
        bound = max(abs(lo), abs(lo + size - 1))
        dt = np.int8 if bound <= 127 else _zdt(bound)
        period = stride * size
        out = np.empty(n, dtype=dt)
        # lo + j / stride for j < period: each of lo, ..., lo + size - 1 repeated stride times
        out[:period] = np.repeat((np.arange(size, dtype=np.int64) + lo).astype(dt), stride)
        filled = period  # out[:filled] holds whole periods: out[j] = out[j mod period] for j < filled
        while filled < n:
            c = min(filled, n - filled)
            out[filled:filled + c] = out[:c]
            filled += c
        return _checked(out, bound, (lo, lo + size - 1))
    narrow = max(n, stride, size) <= _INT32_MAX
    s = viota(n) if narrow else np.arange(n, dtype=np.int64)  # read-only: never written below
    if stride == 0:
        q = np.zeros(n, dtype=s.dtype)
    elif stride == 1:
        q = s
    elif _pow2(stride):
        q = s >> (stride.bit_length() - 1)
    else:
        q = s // stride
    fresh = q is not s  # a new array this call owns: the steps below may write it in place
    top = int(q[-1]) if n else 0  # the largest quotient (they increase with s); m never exceeds it
    if size == 0 or (n and size > top):
        m = q  # every quotient is below size (they increase with s): mod changes nothing
    elif _pow2(size):
        m = np.bitwise_and(q, size - 1, out=q if fresh else None)
    else:
        m = np.remainder(q, size, out=q if fresh else None)
    fresh = fresh or m is not s
    if size:
        top = min(top, size - 1)
    if n and not (_INT64_MIN <= lo <= _INT64_MAX and lo + top <= _INT64_MAX):
        raise OverflowError("zcol: values beyond int64")
    bound = max(abs(lo), abs(lo + top))
    dt = _zdt(bound)
    if lo:
        if fresh and m.dtype == dt:
            np.add(m, dt(lo), out=m)
        else:
            m = _as(m, dt) + dt(lo)
    else:
        m = _as(m, dt)
    return _checked(m, bound, (lo, lo + top))


def _two(a: Vec, b: Vec) -> tuple[Vec, Vec]:
    k = min(a.shape[0], b.shape[0])
    return a[:k], b[:k]


def _sum_bound(a: Vec, b: Vec, what: str) -> int:
    bound = _bound(a) + _bound(b)
    if bound > _INT64_MAX:
        bound = _exact_bound(a) + _exact_bound(b)
        if bound > _INT64_MAX:
            raise OverflowError(f"{what} may leave int64")
    return bound


@_pointwise(2)
def zadd(a: Vec, b: Vec) -> Vec:
    """ZVec.zadd: a[i] + b[i] (raises if the exact sum may leave int64)."""
    bound = _sum_bound(a, b, "zadd: sum")
    x, y = _two(a, b)
    dt = _zdt(bound)
    return _checked(_as(x, dt) + _as(y, dt), bound)


@_pointwise(2)
def zsub(a: Vec, b: Vec) -> Vec:
    """ZVec.zsub: a[i] - b[i] (raises if the exact difference may leave int64)."""
    bound = _sum_bound(a, b, "zsub: difference")
    x, y = _two(a, b)
    dt = _zdt(bound)
    return _checked(_as(x, dt) - _as(y, dt), bound)


@_pointwise(2)
def zmin(a: Vec, b: Vec) -> Vec:
    """ZVec.zmin: min(a[i], b[i])."""
    bound = max(_bound(a), _bound(b))
    x, y = _two(a, b)
    dt = _zdt(bound)
    return _checked(np.minimum(_as(x, dt), _as(y, dt)), bound)


@_pointwise(2)
def zmax(a: Vec, b: Vec) -> Vec:
    """ZVec.zmax: max(a[i], b[i])."""
    bound = max(_bound(a), _bound(b))
    x, y = _two(a, b)
    dt = _zdt(bound)
    return _checked(np.maximum(_as(x, dt), _as(y, dt)), bound)


@_pointwise(2)
def zeq(a: Vec, b: Vec) -> Vec:
    """ZVec.zeq: 1 where a[i] = b[i], else 0."""
    x, y = _two(a, b)
    return _checked((x == y).view(np.int8), 1)


@_pointwise(2)
def zlt(a: Vec, b: Vec) -> Vec:
    """ZVec.zlt: 1 where a[i] < b[i], else 0."""
    x, y = _two(a, b)
    return _checked((x < y).view(np.int8), 1)


@_pointwise(2)
def zle(a: Vec, b: Vec) -> Vec:
    """ZVec.zle: 1 where a[i] <= b[i], else 0."""
    x, y = _two(a, b)
    return _checked((x <= y).view(np.int8), 1)


@_pointwise(2)
def zand(a: Vec, b: Vec) -> Vec:
    """ZVec.zand: 1 where a[i] and b[i] are both non-zero, else 0."""
    x, y = _two(a, b)
    return _checked(((x != 0) & (y != 0)).view(np.int8), 1)


@_pointwise(2)
def zor(a: Vec, b: Vec) -> Vec:
    """ZVec.zor: 1 where a[i] or b[i] is non-zero, else 0."""
    x, y = _two(a, b)
    return _checked(((x != 0) | (y != 0)).view(np.int8), 1)


@_pointwise(1)
def znot(a: Vec) -> Vec:
    """ZVec.znot: 1 where a[i] is zero, else 0."""
    return _checked((a == 0).view(np.int8), 1)


@_pointwise(1)
def zmulc(a: Vec, c: int) -> Vec:
    """ZVec.zmulc: a[i] * c (raises if an exact product may leave int64)."""
    big = _bound(a)
    if big and abs(c) > _INT64_MAX // big:
        big = _exact_bound(a)
        if big and abs(c) > _INT64_MAX // big:
            raise OverflowError("zmulc: product may leave int64")
    if c == 1:
        return _checked(a, big)  # read-only: the same array is the same vector
    if big == 0 or c == 0:
        return _checked(np.zeros(a.shape[0], dtype=np.int32), 0)
    dt = _zdt(big * abs(c))
    if dt is np.int32:
        a = _as(a, dt)  # every entry is at most big <= big * |c| in absolute value
    return _checked(a * dt(c) if dt is np.int32 else a.astype(np.int64) * np.int64(c), big * abs(c))


@_pointwise(3)
def zite(c: Vec, a: Vec, b: Vec) -> Vec:
    """ZVec.zite: a[i] where c[i] is non-zero else b[i], truncated to the shortest operand.

    A constant c selects one operand whole (its prefix)."""
    k = min(c.shape[0], a.shape[0], b.shape[0])
    bound = max(_bound(a), _bound(b))
    dt = _zdt(bound)
    if _cv(c):
        return _checked(_as((a if c[0] != 0 else b)[:k], dt), bound)
    return _checked(np.where(c[:k] != 0, _as(a[:k], dt), _as(b[:k], dt)), bound)


@_pointwise(1)
def znz(a: Vec) -> Mask:
    """ZVec.znz: a[i] is non-zero."""
    return _frozen(a != 0)  # type: ignore[return-value]


@_pointwise(1)
def zinrange(a: Vec, lo: int, hi: int) -> Mask:
    """ZVec.zinrange: lo <= a[i] < hi."""
    lo_c = max(lo, _INT64_MIN)
    if lo > _INT64_MAX or hi <= _INT64_MIN:
        return _frozen(np.zeros(a.shape[0], dtype=np.bool_))  # type: ignore[return-value]
    r = a >= lo_c
    if hi <= _INT64_MAX:
        r &= a < hi
    return _frozen(r)  # type: ignore[return-value]


@_pointwise(1)
def ztonat(a: Vec) -> Vec:
    """ZVec.ztonat: Z.to_nat elementwise (negative entries become 0); a vec, so int32 or int64.

    When no entry is negative (by a recorded interval, else one reduction finds out) Z.to_nat changes
    nothing: a read-only view of a."""
    known = _RANGES.get(id(a))
    if a.dtype != np.int8 and (a.shape[0] == 0 or (known[0] if known else int(a.min())) >= 0):
        return _checked(a.view(), _BOUNDS.get(id(a)), _RANGES.get(id(a)))
    return _checked(np.maximum(a if a.dtype != np.int8 else a.astype(np.int32), 0))


@_pointwise(2)
def mand(a: Mask, b: Mask) -> Mask:
    """ZVec.mand: a[i] and b[i], truncated to the shorter operand.

    A constant operand: all False is the result, all True leaves the other operand's prefix."""
    k = min(a.shape[0], b.shape[0])
    for c, other in ((a, b), (b, a)):
        if _cv(c):
            return _frozen(other[:k]) if c[0] else _mconst(k, False)  # type: ignore[return-value]
    return _frozen(a[:k] & b[:k])  # type: ignore[return-value]


@_pointwise(2)
def mandn(a: Mask, b: Mask) -> Mask:
    """ZVec.mandn: a[i] and not b[i], truncated to the shorter operand.

    A constant b: all True makes every entry False, all False leaves a's prefix. A constant a: all False
    is the result, all True makes it not b."""
    k = min(a.shape[0], b.shape[0])
    if _cv(b):
        return _mconst(k, False) if b[0] else _frozen(a[:k])  # type: ignore[return-value]
    if _cv(a):
        return _frozen(~b[:k]) if a[0] else _mconst(k, False)  # type: ignore[return-value]
    return _frozen(a[:k] & ~b[:k])  # type: ignore[return-value]


# ---- fused for the rules checker: each is the composition its Gallina definition names ----------------


@_pointwise(3)
def zaxpy(acc: Vec, v: Vec, col: Vec, c: int) -> Vec:
    """ZVec.zaxpy: zadd acc (zmulc (zsub v col) c), acc[i] + (v[i] - col[i]) * c, in one fresh array
    (raises where the composition would): col copied once into the result's dtype (which widens a
    narrow column), then v - that, times c, plus acc, in place (for a constant v, -c times that, plus
    acc, plus the one number v * c: the same sum)."""
    k = min(acc.shape[0], v.shape[0], col.shape[0])
    diff = _bound(v) + _bound(col)
    final = _bound(acc) + diff * abs(c)
    if final > _INT64_MAX:
        return zadd(acc, zmulc(zsub(v, col), c))  # exact bounds, or the same OverflowError
    dt = _zdt(final)
    if diff == 0 or c == 0:  # (v - col) * c is 0 everywhere: the result is acc
        return _checked(acc[:k].astype(dt), final, _RANGES.get(id(acc)))
    # every intermediate is at most final in absolute value (and so are c and v * c: diff >= 1)
    out = col[:k].astype(dt)  # one fresh array, then in place (a narrow col is widened by this copy)
    if _cv(v):  # a constant v: acc - col * c + v * c (|v * c| <= bound(v) * |c|), one pass fewer
        if c != 1:
            np.multiply(out, dt(-c), out=out)
        else:
            np.negative(out, out=out)
        np.add(out, acc[:k], out=out, dtype=dt)
        if v[0] != 0 and c != 0:
            np.add(out, dt(int(v[0]) * c), out=out)
    else:
        np.subtract(v[:k], out, out=out, dtype=dt)
        if c != 1:
            np.multiply(out, dt(c), out=out)
        np.add(out, acc[:k], out=out, dtype=dt)
    (la, ha), (lv, hv), (lc, hc) = _range(acc), _range(v), _range(col)
    dl, dh = lv - hc, hv - lc  # v[i] - col[i] lies in [dl, dh], so the entry in acc's interval plus:
    pl, ph = (dl * c, dh * c) if c >= 0 else (dh * c, dl * c)
    return _checked(out, final, (la + pl, ha + ph))


def zinand(ok: Mask, v: Vec, lo: int, hi: int) -> Mask:
    """ZVec.zinand: mand ok (zinrange v lo hi), ok[i] and lo <= v[i] < hi.

    A constant v is in the range everywhere or nowhere: ok's prefix, or all False. A constant ok: all
    False is the result, all True leaves zinrange v lo hi."""
    k = min(ok.shape[0], v.shape[0])
    if lo > _INT64_MAX or hi <= _INT64_MIN:
        return _frozen(np.zeros(k, dtype=np.bool_))  # type: ignore[return-value]
    if _cv(v) and k > 1:
        return _frozen(ok[:k]) if lo <= int(v[0]) < hi else _mconst(k, False)  # type: ignore[return-value]
    if _cv(ok):
        return zinrange(v[:k], lo, hi) if ok[0] else _mconst(k, False)
    x = v[:k]
    r = np.greater_equal(x, max(lo, _INT64_MIN))
    if hi <= _INT64_MAX:
        r &= x < hi
    r &= ok[:k]
    return _frozen(r)  # type: ignore[return-value]


_FUSED_CHUNK = 1 << 18


def mnone(a: Mask, b: Mask) -> bool:
    """ZVec.mnone: Nat.eqb (mcount (mandn a b)) 0, no i with a[i] and not b[i] (chunk by chunk).

    A constant a: all False holds, all True asks that b's prefix be all True. A constant b: all True
    holds, all False asks that a's prefix be all False."""
    k = min(a.shape[0], b.shape[0])
    if _cv(a):
        return not a[0] or _all(b[:k])
    if _cv(b):
        return bool(b[0]) or not _any(a[:k])
    for lo in range(0, k, _FUSED_CHUNK):
        hi = min(k, lo + _FUSED_CHUNK)
        if bool((a[lo:hi] & ~b[lo:hi]).any()):
            return False
    return True


def vseleq(m: Mask, a: Vec, b: Vec, row: Vec) -> bool:
    """ZVec.vseleq: mall (veq (vselect m a b) row), (a[i] if m[i] else b[i]) == row[i] over the common
    length (chunk by chunk, stopping at the first chunk that differs).

    A constant m selects one operand whole: that operand's prefix is compared with row's."""
    k = min(m.shape[0], a.shape[0], b.shape[0], row.shape[0])
    if _cv(m):
        src = a if m[0] else b
        for lo in range(0, k, _FUSED_CHUNK):
            hi = min(k, lo + _FUSED_CHUNK)
            if not np.array_equal(src[lo:hi], row[lo:hi]):
                return False
        return True
    for lo in range(0, k, _FUSED_CHUNK):
        hi = min(k, lo + _FUSED_CHUNK)
        if not np.array_equal(np.where(m[lo:hi], a[lo:hi], b[lo:hi]), row[lo:hi]):
            return False
    return True


def nat_mul(a: int, b: int) -> int:
    """Nat.mul."""
    return a * b


def z_add(a: int, b: int) -> int:
    """Z.add."""
    return a + b


def z_of_nat(n: int) -> int:
    """Z.of_nat."""
    return n
