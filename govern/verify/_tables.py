"""The machine's tables over every state, computed vectorized: validity, the first violated invariant,
the one-step repair table, the raw apply table (before normalization), and normal forms with depths.

Rules given as expressions are evaluated on whole columns; callables run state by state through
`_callables`. Every assignment is checked against its variables' ranges where it is applied (an
effect where its guard holds, a repair where its invariant is the first violated).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import DomainViolation
from ..model._callables import run_assignment, run_condition
from ..model._declarations import Assignment, Snapshot
from ..model._expr import Expr, evaluate
from ..model._space import Space
from ._parallel import PARALLEL_MIN_STATES, run_all

__all__ = ["Footprint", "Tables", "build_tables", "normal_forms"]

IntArray = npt.NDArray[np.int32]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Footprint:
    """What a rule reads and writes (variable positions); `traced` when measured from a callable."""

    reads: frozenset[int]
    writes: frozenset[int]
    traced: bool

    @property
    def all(self) -> frozenset[int]:
        """Every variable the rule touches."""
        return self.reads | self.writes


@dataclass
class Tables:
    """Tables over all N states; `apply` is (events, N) and is released once the gate has used it."""

    valid: BoolArray
    first_violated: npt.NDArray[np.int16]
    repair: IntArray
    apply: IntArray | None
    invariant_footprints: list[Footprint]
    event_footprints: list[Footprint]


def _condition(
    part: Expr | Callable[[Any], Any], space: Space, rule: str
) -> tuple[Any, frozenset[int], bool]:
    if isinstance(part, Expr):
        v = evaluate(part, space.column)
        if isinstance(v, np.ndarray):
            return (v if v.dtype == np.bool_ else v != 0), part.reads(), False
        return bool(v), part.reads(), False
    arr, reads = run_condition(part, space, rule)
    return arr, frozenset(reads), True


def _as_int32(value: int) -> int:
    """`value` wrapped to int32 as NumPy wraps an int64 column cast to int32 (values may lie anywhere in
    the 64-bit range): a difference of two values of one enumerable variable fits in int32, so subtracting
    the wrapped forms gives it exactly, where casting the plain int would overflow."""
    return (value + 2**31) % 2**32 - 2**31


def _assign(
    part: Assignment | Callable[[Any], Any], space: Space, idx: IntArray | None, rule: str
) -> tuple[IntArray, frozenset[int], frozenset[int]]:
    """New state ids after applying `part` to the states `idx` (None = all states, in id order)."""
    if not isinstance(part, tuple):
        sub = space.ids() if idx is None else idx
        out, traced_reads, traced_writes = run_assignment(part, space, sub, rule)
        return out, frozenset(traced_reads), frozenset(traced_writes)
    cache: dict[int, npt.NDArray[Any]] = {}

    def column(i: int) -> npt.NDArray[Any]:
        if idx is None:
            return space.column(i)
        col = cache.get(i)
        if col is None:
            col = space.column(i)[idx]
            cache[i] = col
        return col

    base = space.ids() if idx is None else idx
    acc: IntArray | None = None
    reads: frozenset[int] = frozenset()
    for j, e in part:
        reads |= e.reads()
        spec = space.vars[j]
        v = evaluate(e, column)
        lo, hi = e.bounds
        if lo < spec.lo or hi > spec.hi:
            arr = np.broadcast_to(np.asarray(v), base.shape)
            bad = (arr < spec.lo) | (arr > spec.hi)
            if bad.any():
                k = int(np.argmax(bad))
                sid = int(base[k])
                raise DomainViolation(
                    rule=rule, state=space.as_dict(sid), variable=spec.name, value=int(arr[k])
                )
        if isinstance(v, np.ndarray) and v.dtype == np.bool_:
            v = v.view(np.int8)
        elif not isinstance(v, np.ndarray):
            v = _as_int32(int(v))
        d = np.subtract(v, column(j), dtype=np.int32)
        if space.strides[j] != 1:
            d *= np.int32(space.strides[j])
        if acc is None:
            acc = d
        else:
            acc += d
    writes = frozenset(j for j, _ in part)
    if acc is None:
        return base.copy(), reads, writes
    acc += base
    return acc, reads, writes


def build_tables(snap: Snapshot, space: Space) -> Tables:
    """Compute validity, first-violated, one-step repair and raw apply tables over all states."""
    n = space.n
    ids = space.ids()
    m = len(snap.invariants)
    fv = np.full(n, -1, dtype=np.int16)
    inv_reads: list[frozenset[int]] = [frozenset()] * m
    inv_traced = [False] * m
    parallel = n >= PARALLEL_MIN_STATES and snap.is_data()
    if parallel:
        for i in range(len(space.vars)):  # fill the caches before threads read them
            space.column(i)

    def holds_task(i: int) -> Any:
        inv = snap.invariants[i]
        h, inv_reads[i], inv_traced[i] = _condition(inv.holds, space, f"invariant {inv.name!r} holds")
        return h

    # Conditions are evaluated a batch at a time (bounded memory), then folded in reverse priority
    # order so that fv ends up holding the first violated invariant of every state.
    order = list(reversed(range(m)))
    batch = 8
    for start in range(0, m, batch):
        part = order[start : start + batch]
        results = run_all([partial(holds_task, i) for i in part], parallel=parallel)
        for i, h in zip(part, results, strict=True):
            if isinstance(h, np.ndarray):
                np.copyto(fv, np.int16(i), where=np.logical_not(h))
            elif not h:
                fv[:] = i
    valid = fv < 0
    repair = ids.copy()

    def repair_task(i: int) -> Footprint:
        inv = snap.invariants[i]
        idx = np.flatnonzero(fv == i).astype(np.int32)
        rule = f"invariant {inv.name!r} repair"
        if len(idx):
            new, reads, writes = _assign(inv.repair, space, idx, rule)
            repair[idx] = new  # each invariant owns a disjoint set of states
        else:
            reads, writes = _static_footprint(inv.repair)
        return Footprint(inv_reads[i] | reads, writes, inv_traced[i] or not isinstance(inv.repair, tuple))

    inv_fps = run_all([partial(repair_task, i) for i in range(m)], parallel=parallel)
    apply = np.empty((len(snap.events), n), dtype=np.int32)

    def event_task(k: int) -> Footprint:
        ev = snap.events[k]
        g, greads, gtraced = _condition(ev.guard, space, f"event {ev.name!r} guard")
        rule = f"event {ev.name!r} effect"
        row = apply[k]  # each event owns its row
        if isinstance(g, np.ndarray):
            idx = np.flatnonzero(g).astype(np.int32)
            row[:] = ids
            if len(idx):
                new, reads, writes = _assign(ev.effect, space, idx, rule)
                row[idx] = new
            else:
                reads, writes = _static_footprint(ev.effect)
        elif g:
            new, reads, writes = _assign(ev.effect, space, None, rule)
            row[:] = new
        else:
            row[:] = ids
            reads, writes = _static_footprint(ev.effect)
        return Footprint(greads | reads, writes, gtraced or not isinstance(ev.effect, tuple))

    ev_fps = run_all([partial(event_task, k) for k in range(len(snap.events))], parallel=parallel)
    return Tables(valid, fv, repair, apply, inv_fps, ev_fps)


def _static_footprint(part: Assignment | Callable[[Any], Any]) -> tuple[frozenset[int], frozenset[int]]:
    # An effect that never runs reads and writes nothing at run time; for data rules keep the
    # declared footprint anyway (a superset is always sound for pruning).
    if isinstance(part, tuple):
        return frozenset().union(*(e.reads() for _, e in part)), frozenset(j for j, _ in part)
    return frozenset(), frozenset()


def normal_forms(valid: BoolArray, repair: IntArray) -> tuple[IntArray, IntArray, int | None]:
    """NF and repair depth of every state by pointer jumping over the one-step repair table.

    Returns (nf, depth, stuck): `stuck` is None when repair terminates from every state (WFC), else
    a state from which repair never reaches a valid state (on or leading to a repair cycle)."""
    n = len(valid)
    ptr = repair
    depth = np.logical_not(valid).astype(np.int32)
    parallel = n >= PARALLEL_MIN_STATES
    parts = 8 if parallel else 1
    bounds = [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]
    landed = bool(valid[ptr].all())
    span = 1
    while not landed:
        if span >= n:
            return ptr, depth, int(np.argmin(valid[ptr]))
        # Pointer jumping: after k rounds ptr = repair^(2^k) (valid states are fixed points), and
        # depth counts the invalid states passed, i.e. the repair steps taken. Rounds read the old
        # arrays and write new ones, so the chunks can run on all cores.
        new_ptr = np.empty_like(ptr)
        new_depth = np.empty_like(depth)

        def jump(
            lo: int,
            hi: int,
            ptr: IntArray = ptr,
            depth: IntArray = depth,
            new_ptr: IntArray = new_ptr,
            new_depth: IntArray = new_depth,
        ) -> bool:
            p = ptr[lo:hi]
            np.take(ptr, p, out=new_ptr[lo:hi])
            np.add(depth[lo:hi], np.take(depth, p), out=new_depth[lo:hi])
            return bool(valid[new_ptr[lo:hi]].all())

        landed = all(run_all([partial(jump, lo, hi) for lo, hi in bounds], parallel=parallel))
        ptr, depth = new_ptr, new_depth
        span *= 2
    return ptr, depth, None
