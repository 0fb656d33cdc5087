"""Recompute a certificate's verdict from its tables alone (docs/semantics.md, "What is checked").

This is the checker's own reading of the tables, written against the semantics document and not
against the engine: the engine's verdict is written into the certificate, and `govern check` (and
`govern certify`, before writing) require this recomputation to agree with it field by field. The
proof-derived oracle is run in addition; this module is what makes the secondary claims
(obligations, non-idempotent events, depth, domain size) checkable too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["TableAnalysis", "analyse_tables"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class TableAnalysis:
    """Everything the semantics defines, recomputed from valid flags, repair and apply tables.

    `problem` is None when the tables describe a convergent machine; otherwise it says, in one
    sentence with a concrete state, which condition fails (and the other fields are best effort).
    """

    problem: str | None
    max_repair_depth: int
    states: int
    valid_states: int
    domain_states: int
    pairs_checked: list[list[int]]
    cc2: bool
    causal_order_obligations: list[list[int]]
    not_idempotent: list[int]
    nf: IntArray | None
    step: IntArray | None


def _normal_forms(valid: npt.NDArray[np.bool_], repair: IntArray) -> tuple[IntArray | None, int, str | None]:
    states = len(valid)
    cursor = np.arange(states, dtype=np.int64)
    depth = 0
    invalid = int(states - valid.sum())
    while True:
        pending = ~valid[cursor]
        if not pending.any():
            return cursor, depth, None
        if depth > invalid:
            stuck = int(np.flatnonzero(pending)[0])
            return None, depth, f"repair never reaches a valid state from state {stuck} (WFC fails)"
        cursor = np.where(pending, repair[cursor], cursor)
        depth += 1


def _reachable(step: IntArray, start: int) -> npt.NDArray[np.bool_]:
    seen = np.zeros(step.shape[1], dtype=bool)
    seen[start] = True
    frontier = np.array([start], dtype=np.int64)
    while frontier.size:
        successors = np.unique(step[:, frontier])
        successors = successors[~seen[successors]]
        seen[successors] = True
        frontier = successors
    return seen


def analyse_tables(
    valid_flags: IntArray,
    repair: IntArray,
    apply: IntArray,
    *,
    events: int,
    initial: int,
    independent: list[list[int]] | None,
    domain: str,
) -> TableAnalysis:
    """Recompute the verdict. `apply` is event-major: `apply[e * N + s]`."""
    states = len(valid_flags)

    def fail(problem: str) -> TableAnalysis:
        return TableAnalysis(problem, 0, states, 0, 0, [], False, [], [], None, None)

    if not np.isin(valid_flags, (0, 1)).all():
        return fail("a valid flag is neither 0 nor 1")
    if ((repair < 0) | (repair >= states)).any() or ((apply < 0) | (apply >= states)).any():
        return fail("a table entry is not a state id")
    valid = valid_flags.astype(bool)
    valid_count = int(valid.sum())
    fixed = repair == np.arange(states)
    if (fixed != valid).any():
        s = int(np.flatnonzero(fixed != valid)[0])
        return fail(
            f"state {s} is {'valid' if valid[s] else 'invalid'} but its repair "
            f"{'moves' if valid[s] else 'does not move'} it"
        )
    nf, depth, problem = _normal_forms(valid, repair)
    if problem is not None or nf is None:
        return fail(problem or "WFC fails")
    if not valid[initial]:
        return fail(f"the initial state {initial} is not valid")
    raw = apply.reshape(events, states)
    step = nf[raw]
    in_domain = valid if domain == "valid" else _reachable(step, initial)
    domain_ids = np.flatnonzero(in_domain)

    def commutes(a: int, b: int) -> int | None:
        ab = step[b][step[a][domain_ids]]
        ba = step[a][step[b][domain_ids]]
        differ = np.flatnonzero(ab != ba)
        return None if differ.size == 0 else int(domain_ids[differ[0]])

    all_pairs = [[a, b] for a, b in itertools.combinations(range(events), 2)]
    checked = all_pairs if independent is None else [list(p) for p in independent]
    for a, b in checked:
        witness = commutes(a, b)
        if witness is not None:
            return fail(f"events {a} and {b} do not commute from state {witness} (CC1 fails)")
    obligations: list[list[int]] = []
    if independent is not None:
        declared = {tuple(p) for p in independent}
        obligations = [p for p in all_pairs if tuple(p) not in declared and commutes(p[0], p[1]) is not None]
    not_idempotent = [
        e for e in range(events)
        if (step[e][step[e][domain_ids]] != step[e][domain_ids]).any()
    ]
    cc2 = bool((nf[raw] == nf[raw[:, nf]]).all())
    return TableAnalysis(
        problem=None,
        max_repair_depth=depth,
        states=states,
        valid_states=valid_count,
        domain_states=int(domain_ids.size),
        pairs_checked=checked,
        cc2=cc2,
        causal_order_obligations=obligations,
        not_idempotent=not_idempotent,
        nf=nf,
        step=step,
    )
