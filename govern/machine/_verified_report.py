"""The report of a verified build, made the same way whichever route verified it.

Enumeration (`_build`) and the symbolic route (`_symbolic`) establish the same conditions and hand
back verdicts of the same shape; what differs is how many states they counted, what gated them (the
proof-derived oracle, or a solver) and what the guarantee adds about that. `verified_report` turns
either verdict into the `Report` a `Machine` carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..model._declarations import Domain, Snapshot
from ..model._space import Space
from ..verify._report import Report, guarantee_text
from ..verify._symbolic import SymbolicVerdict
from ..verify._verify import Verdict

__all__ = ["verified_report"]


def verified_report(
    snap: Snapshot,
    domain: Domain,
    space: Space,
    verdict: Verdict | SymbolicVerdict,
    *,
    valid_states: int,
    domain_states: int,
    initial: dict[str, Any],
    oracle: dict[str, Any] | None,
    timings: dict[str, float],
    trusted_callables: Sequence[str] = (),
    method: str = "enumeration",
    solver: dict[str, Any] | None = None,
    rests_on: str | None = None,
) -> Report:
    """The report of `snap` verified by `verdict`. `rests_on`, when the verdict is not the oracle's,
    says what it rests on; it ends the guarantee and joins the theorems."""
    names = [e.name for e in snap.events]
    footprints = {names[k]: tuple(space.names[i] for i in sorted(c)) for k, c in enumerate(verdict.closures)}
    guarantee, theorems = guarantee_text(
        cc2=verdict.cc2,
        pair_mode=verdict.pair_mode,
        obligations=len(verdict.obligations),
        not_idempotent=len(verdict.not_idempotent),
        domain=domain,
    )
    if oracle is not None and oracle.get("theorem"):
        theorems = (*theorems, f"oracle: {oracle['theorem']}")
    if rests_on is not None:
        guarantee += f" Method: {method}; {rests_on}."
        theorems = (*theorems, f"solver: {rests_on}")
    return Report(
        machine=snap.name,
        domain=domain,
        states=space.n,
        valid_states=valid_states,
        domain_states=domain_states,
        initial=initial,
        events=tuple(names),
        invariants=tuple(i.name for i in snap.invariants),
        pair_mode=verdict.pair_mode,
        pairs_checked=tuple((names[a], names[b]) for a, b in verdict.pairs_checked),
        pairs_pruned=tuple(verdict.pairs_pruned),
        undeclared_pairs=verdict.undeclared_checked,
        max_repair_depth=verdict.depth_max,
        cc2=verdict.cc2,
        cc2_failing_events=tuple(verdict.cc2_failing_events),
        cc2_witness=verdict.cc2_witness,
        obligations=tuple(verdict.obligations),
        not_idempotent=tuple(verdict.not_idempotent),
        guarantee=guarantee,
        theorems=theorems,
        trusted_callables=tuple(trusted_callables),
        footprints=footprints,
        oracle=oracle,
        timings=timings,
        method=method,
        solver=solver,
    )

