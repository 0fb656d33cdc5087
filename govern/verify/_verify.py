"""Verification over the tables: WFC, CC2 on every state, the checked domain, CC1 for
every checked pair (with sound footprint pruning), causal-order obligations and idempotence.

Everything is a handful of numpy gathers and compares per event or pair. CC1 runs on the checked
domain D only, in positions of D (so composing two steps is two gathers). Pruning skips a pair only
when the two events' footprints, closed under every invariant they can trigger, are disjoint and D
holds only valid states: then both steps change disjoint variables and read nothing the other writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from itertools import combinations
from typing import Literal

import numpy as np
import numpy.typing as npt

from .._errors import DeclarationError, NotConvergent
from ..model._declarations import Domain, Snapshot
from ..model._space import Space
from ._counterexample import Divergence, RepairCycle, Step, trace, trace_normalize
from ._parallel import PARALLEL_MIN_STATES, run_all
from ._report import PrunedPair
from ._tables import Footprint, Tables, normal_forms
from ._timing import PhaseTimer

__all__ = ["Verdict", "event_closures", "verify"]

IntArray = npt.NDArray[np.int32]


@dataclass
class Verdict:
    """What verification established (only produced when the machine converges)."""

    nf: IntArray
    depth_max: int
    initial: int
    domain_ids: IntArray
    pair_mode: str  # "all" or "declared"
    pairs_checked: list[tuple[int, int]]
    pairs_pruned: list[PrunedPair]
    undeclared_checked: int
    obligations: list[Divergence]
    not_idempotent: list[Divergence]
    cc2: bool
    cc2_failing_events: list[str]
    cc2_witness: Divergence | None
    closures: list[frozenset[int]] = field(default_factory=list)
    depth: IntArray | None = None  # repair depth of every state: the oracle's termination witness


def event_closures(inv_fps: list[Footprint], ev_fps: list[Footprint]) -> list[frozenset[int]]:
    """Each event's footprint (reads and writes) closed under every invariant footprint it meets."""
    return closed_footprints([inv.all for inv in inv_fps], [fp.all for fp in ev_fps])


def closed_footprints(inv_all: list[frozenset[int]], ev_all: list[frozenset[int]]) -> list[frozenset[int]]:
    """Each event's variables (`ev_all`) closed under every invariant's variables (`inv_all`) it meets."""
    out = []
    for fp in ev_all:
        f = set(fp)
        pending = list(inv_all)
        changed = True
        while changed:
            changed = False
            rest = []
            for touched in pending:
                if touched & f:
                    f |= touched
                    changed = True
                else:
                    rest.append(touched)
            pending = rest
        out.append(frozenset(f))
    return out


def verify(snap: Snapshot, space: Space, tables: Tables, domain: Domain, timer: PhaseTimer) -> Verdict:
    """Verify the machine or raise `NotConvergent` (repair cycle, or a checked pair that diverges)."""
    assert tables.apply is not None
    apply = tables.apply
    ev_names = [e.name for e in snap.events]
    inv_names = [i.name for i in snap.invariants]
    n_ev = len(ev_names)

    with timer.phase("normal forms (WFC)"):
        nf, depth, stuck = normal_forms(tables.valid, tables.repair)
        if stuck is not None:
            raise NotConvergent(_cycle(snap.name, space, inv_names, tables, stuck))
        depth_max = int(depth.max()) if len(depth) else 0
        if snap.initial is not None:
            initial = space.id_of(snap.initial)
            if not tables.valid[initial]:
                inv = inv_names[int(tables.first_violated[initial])]
                raise DeclarationError(
                    f"the declared initial state {space.as_dict(initial)} violates invariant "
                    f"{inv!r}; declare a valid initial state"
                )
        else:
            initial = int(nf[0])

    with timer.phase("CC2"):
        # CC2 compares NF(apply(e, s)) with NF(apply(e, NF(s))) on every state: two gathers per event.
        # The runtime step table (the second gather) is not kept: the machine derives it on first use.
        nf_index = nf.astype(np.intp)

        def cc2_task(e: int) -> int | None:
            raw_nf = np.take(nf, apply[e])
            row = np.take(raw_nf, nf_index)
            if np.array_equal(raw_nf, row):
                return None
            return int(np.argmax(raw_nf != row))

        firsts = run_all([partial(cc2_task, e) for e in range(n_ev)], parallel=space.n >= PARALLEL_MIN_STATES)
        cc2_failing = [ev_names[e] for e, s in enumerate(firsts) if s is not None]
        cc2_witness: Divergence | None = None
        for e, s in enumerate(firsts):
            if s is not None:
                cc2_witness = _cc2_witness(snap.name, space, ev_names, inv_names, tables, e, s)
                break

    with timer.phase("checked domain"):
        # D holds valid states only, where NF is the identity: step(e, s) = NF(apply(e, s)).
        if domain == "valid":
            domain_ids = np.flatnonzero(tables.valid).astype(np.int32)
        else:
            reached = np.zeros(space.n, dtype=np.bool_)
            reached[initial] = True
            frontier = np.array([initial], dtype=np.int32)
            while len(frontier):
                nxt = np.unique(np.take(nf, apply[:, frontier]))
                nxt = nxt[~reached[nxt]]
                reached[nxt] = True
                frontier = nxt
            domain_ids = np.flatnonzero(reached).astype(np.int32)
        if len(domain_ids) == space.n:
            pos_step: IntArray = apply  # every state is valid: NF is the identity and positions are ids
        else:
            pos = np.full(space.n, -1, dtype=np.int32)
            pos[domain_ids] = np.arange(len(domain_ids), dtype=np.int32)
            pos_step = np.empty((n_ev, len(domain_ids)), dtype=np.int32)
            for e in range(n_ev):
                np.take(pos, np.take(nf, np.take(apply[e], domain_ids)), out=pos_step[e])
            del pos
            if pos_step.size and int(pos_step.min()) < 0:  # D is closed under steps by construction
                raise AssertionError("internal error: a step leaves the checked domain")

    def diverges(a: int, b: int) -> int | None:
        x = np.take(pos_step[b], pos_step[a])
        y = np.take(pos_step[a], pos_step[b])
        if np.array_equal(x, y):
            return None
        return int(np.argmax(x != y))

    def divergence(kind: Literal["CC1", "obligation"], a: int, b: int, p: int) -> Divergence:
        s = int(domain_ids[p])
        first: list[Step] = []
        second: list[Step] = []
        for order, out in (((a, b), first), ((b, a), second)):
            cur = s
            for ev in order:
                st, cur = trace(
                    space, ev_names, inv_names, apply, tables.repair, tables.first_violated, ev, cur
                )
                out.append(st)
        return Divergence(
            snap.name,
            kind,
            (ev_names[a], ev_names[b]),
            space.as_dict(s),
            tuple(first),
            tuple(second),
        )

    all_pairs = list(combinations(range(n_ev), 2))
    checked = list(snap.independent) if snap.independent is not None else all_pairs
    checked_set = set(checked)
    undeclared = [p for p in all_pairs if p not in checked_set]
    closures = event_closures(tables.invariant_footprints, tables.event_footprints)
    names = space.names

    def prune_reason(a: int, b: int) -> str | None:
        if closures[a] & closures[b]:
            return None
        fa = ", ".join(names[i] for i in sorted(closures[a])) or "nothing"
        fb = ", ".join(names[i] for i in sorted(closures[b])) or "nothing"
        return (
            f"disjoint footprints closed under invariants: {ev_names[a]} touches {{{fa}}}, "
            f"{ev_names[b]} touches {{{fb}}}"
        )

    big = len(domain_ids) >= PARALLEL_MIN_STATES
    pruned: list[PrunedPair] = []
    with timer.phase("CC1"):
        to_check = []
        for a, b in checked:
            reason = prune_reason(a, b)
            if reason is None:
                to_check.append((a, b))
            else:
                pruned.append(PrunedPair(ev_names[a], ev_names[b], reason))
        found = run_all([partial(diverges, a, b) for a, b in to_check], parallel=big)
        for (a, b), p in zip(to_check, found, strict=True):
            if p is not None:
                raise NotConvergent(divergence("CC1", a, b, p))

    obligations: list[Divergence] = []
    with timer.phase("obligations"):
        to_check = [(a, b) for a, b in undeclared if prune_reason(a, b) is None]
        found = run_all([partial(diverges, a, b) for a, b in to_check], parallel=big)
        for (a, b), p in zip(to_check, found, strict=True):
            if p is not None:
                obligations.append(divergence("obligation", a, b, p))

    not_idem: list[Divergence] = []
    with timer.phase("idempotence"):
        for e in range(n_ev):
            twice = np.take(pos_step[e], pos_step[e])
            if not np.array_equal(twice, pos_step[e]):
                p = int(np.argmax(twice != pos_step[e]))
                s = int(domain_ids[p])
                st1, mid = trace(
                    space, ev_names, inv_names, apply, tables.repair, tables.first_violated, e, s
                )
                st2, _ = trace(
                    space, ev_names, inv_names, apply, tables.repair, tables.first_violated, e, mid
                )
                not_idem.append(
                    Divergence(snap.name, "idempotence", (ev_names[e],), space.as_dict(s), (st1, st2), (st1,))
                )

    return Verdict(
        nf,
        depth_max,
        initial,
        domain_ids,
        "declared" if snap.independent is not None else "all",
        checked,
        pruned,
        len(undeclared),
        obligations,
        not_idem,
        not cc2_failing,
        cc2_failing,
        cc2_witness,
        closures,
        depth,
    )


def _cycle(name: str, space: Space, inv_names: list[str], tables: Tables, stuck: int) -> RepairCycle:
    seen: dict[int, int] = {}
    path: list[int] = []
    s = stuck
    while s not in seen:
        seen[s] = len(path)
        path.append(s)
        s = int(tables.repair[s])
    loop = path[seen[s] :]
    return RepairCycle(
        name,
        space.as_dict(stuck),
        tuple((space.as_dict(x), inv_names[int(tables.first_violated[x])]) for x in loop),
    )


def _cc2_witness(
    name: str, space: Space, ev_names: list[str], inv_names: list[str], tables: Tables, e: int, s: int
) -> Divergence:
    assert tables.apply is not None
    direct, _ = trace(space, ev_names, inv_names, tables.apply, tables.repair, tables.first_violated, e, s)
    norm, t = trace_normalize(space, inv_names, tables.repair, tables.first_violated, s)
    after, _ = trace(space, ev_names, inv_names, tables.apply, tables.repair, tables.first_violated, e, t)
    return Divergence(name, "CC2", (ev_names[e],), space.as_dict(s), (direct,), (norm, after))
