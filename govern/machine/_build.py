"""`Registry.build()` end to end: size check, tables, verification, the oracle gate, the machine.

Peak memory is dominated by the raw apply table (4 bytes per state per event), which the machine
keeps: certificates and foreign checkers need it, and the runtime step table is derived from it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .._errors import DeclarationError, StateSpaceTooLarge
from ..model._declarations import Domain, Snapshot
from ..model._expr import Expr
from ..model._space import Space
from ..oracle import _MAX_DEPTH as RULES_CHECKER_MAX_DEPTH
from ..oracle._gate import run_gate
from ..verify._symbolic import symbolic_problem
from ..verify._tables import build_tables
from ..verify._timing import PhaseTimer
from ..verify._verify import verify
from ._composed import build_composed
from ._machine import Machine, RawTables
from ._symbolic import build_symbolic, symbolic_candidate
from ._verified_report import verified_report

__all__ = ["build_machine"]


def build_machine(
    snap: Snapshot,
    domain: Domain,
    *,
    max_states: int | None = None,
    compose: bool | None = None,
    method: Literal["auto", "enumerate", "symbolic"] = "auto",
) -> Machine:
    """Build and verify `snap`; returns the machine or raises (see `Registry.build`).

    `compose`: None builds by components (govern.machine._composed) only when the whole space is too
    large to enumerate and the machine splits; True whenever it splits; False never.

    `method` "auto" enumerates (whole or by components), and falls back to the symbolic route
    (`_symbolic.build_symbolic`) when neither can enumerate (not when `max_states` caps the build)
    and a large integer domain is the reason; "symbolic" forces that route (differential tests use
    it on small machines); "enumerate" never takes it."""
    if method == "symbolic":
        return build_symbolic(snap, domain, enumerate_build=_enumerate_valid)
    timer = PhaseTimer()
    space = Space(snap.vars)

    def build_part(part: Snapshot) -> Machine:
        return build_machine(part, domain, max_states=max_states, compose=False, method="enumerate")

    if compose:
        composed = build_composed(snap, domain, build_part)
        if composed is not None:
            return composed
    try:
        space.check_size(len(snap.events), max_states)
    except StateSpaceTooLarge as exc:
        failure = exc
        if compose is not False:
            try:
                composed = build_composed(snap, domain, build_part)
            except StateSpaceTooLarge as part_failure:  # a component too large to enumerate
                composed, failure = None, part_failure
            if composed is not None:
                return composed
        capped = max_states is not None and space.n > max_states
        if method == "enumerate" or capped or not symbolic_candidate(snap):
            raise failure from None
        problem = symbolic_problem(snap, domain)
        if problem is not None:
            raise StateSpaceTooLarge(
                f"{failure}\nThe symbolic route for large integer domains does not apply: {problem}.",
                states=exc.states,
                bytes_needed=exc.bytes_needed,
            ) from None
        return build_symbolic(snap, domain, enumerate_build=_enumerate_valid)
    _refuse_rules_too_deep(snap)
    with timer.phase("tables"):
        tables = build_tables(snap, space)
    verdict = verify(snap, space, tables, domain, timer)
    space.drop_columns()
    assert tables.apply is not None
    rules = snap.rules_json(domain)
    if rules["initial"] is None:
        rules["initial"] = list(space.values(verdict.initial))
    data_rules = snap.is_data()
    position = {e.name: i for i, e in enumerate(snap.events)}
    with timer.phase("oracle"):
        oracle = run_gate(
            rules=rules,
            data_rules=data_rules,
            valid=tables.valid,
            repair=tables.repair,
            apply=tables.apply,
            nf=verdict.nf,
            independent=snap.independent,
            domain=domain,
            initial=verdict.initial,
            max_depth=verdict.depth_max,
            cc2=verdict.cc2,
            domain_size=len(verdict.domain_ids),
            depth=verdict.depth,
            obligations=[(position[d.events[0]], position[d.events[1]]) for d in verdict.obligations],
            not_idempotent=[position[d.events[0]] for d in verdict.not_idempotent],
        )
    trusted = [
        f"invariant {i.name}" for i in snap.invariants if callable(i.holds) or not isinstance(i.repair, tuple)
    ]
    trusted += [
        f"event {e.name}" for e in snap.events if callable(e.guard) or not isinstance(e.effect, tuple)
    ]
    report = verified_report(
        snap,
        domain,
        space,
        verdict,
        valid_states=int(np.count_nonzero(tables.valid)),
        domain_states=len(verdict.domain_ids),
        initial=space.as_dict(verdict.initial),
        oracle=oracle,
        timings=dict(timer.seconds),
        trusted_callables=trusted,
    )
    raw = RawTables(tables.valid, tables.repair, tables.apply, verdict.nf)
    return Machine(rules, space, raw, verdict.initial, verdict.domain_ids, report)


def _enumerate_valid(snap: Snapshot) -> Machine:
    """The engine's own build on the "valid" domain, by enumeration only: what the symbolic route's
    small model decides its representative machine with."""
    return build_machine(snap, "valid", method="enumerate", compose=False)


def _refuse_rules_too_deep(snap: Snapshot) -> None:
    """Raise DeclarationError, before any table is built, for an expression nested deeper than the
    proof-derived rules checker reads: the build would otherwise end in an oracle failure that looks like
    a bug. Only where that checker runs (every rule is an expression, the machine is enumerated)."""
    if not snap.is_data():
        return
    parts: list[tuple[str, Expr]] = []
    for inv in snap.invariants:
        assert isinstance(inv.holds, Expr) and isinstance(inv.repair, tuple)
        parts.append((f"the condition of invariant {inv.name!r}", inv.holds))
        parts += [(f"the repair of invariant {inv.name!r}", e) for _, e in inv.repair]
    for ev in snap.events:
        assert isinstance(ev.guard, Expr) and isinstance(ev.effect, tuple)
        parts.append((f"the guard of event {ev.name!r}", ev.guard))
        parts += [(f"the effect of event {ev.name!r}", e) for _, e in ev.effect]
    for where, expr in parts:
        depth = expr.depth()
        if depth > RULES_CHECKER_MAX_DEPTH:
            raise DeclarationError(
                f"{where[0].upper()}{where[1:]} nests {depth} operators deep; the proof-derived rules "
                f"checker that re-checks every build reads at most {RULES_CHECKER_MAX_DEPTH}: write it "
                "flatter (an isin() over n values nests n deep: split it as x.isin(first_values) | "
                "x.isin(other_values))"
            )
