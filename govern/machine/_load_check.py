"""What `Machine.load` re-checks before it hands out a loaded machine.

A saved file's content hash is unkeyed: anyone can edit the tables or the report and recompute it. So
loading trusts nothing the file says. The extracted table checker (`govern.oracle.check_tables`)
re-checks the tables as the build did, and the loaded report's claims must be its findings: the
normal forms, the repair depth, CC2, the checked domain, the causal-order obligations and the events
that are not idempotent. When every rule is an expression, the extracted rules checker also confirms
that the tables are exactly what the rules mean. Anything else refuses the file.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..model._space import Space
from ..oracle._gate import oracle_module
from ..verify._report import Report

__all__ = ["recheck"]


def recheck(
    rules: dict[str, Any],
    space: Space,
    valid: npt.NDArray[np.bool_],
    repair: npt.NDArray[np.int32],
    apply: npt.NDArray[np.int32],
    nf: npt.NDArray[np.int32],
    initial: int,
    domain_ids: npt.NDArray[np.int32],
    report: Report,
) -> list[str]:
    """Every way the loaded machine differs from what the oracle finds in its tables (empty: it is the
    certified machine its report describes). Raises `OracleUnavailable` when there is no oracle."""
    oracle = oracle_module()
    events = [str(e["name"]) for e in rules["events"]]
    problems = _shape_problems(rules, space, valid, initial, report, events)
    if problems:
        return problems
    pairs = rules.get("independent")
    try:
        v = oracle.check_tables(
            valid=valid,
            repair=repair,
            apply=apply,
            pairs=None if pairs is None else [(int(a), int(b)) for a, b in pairs],
            domain=str(rules["domain"]),
            initial=initial,
        )
    except oracle.OracleInputError as exc:
        return [f"the table checker refuses the tables: {exc}"]
    if not v.certified:
        if not v.wfc:
            why = "repair does not terminate from every state"
        elif v.cc1_witness is not None:
            a, b, state = v.cc1_witness
            why = (
                f"declared-independent events {events[a]!r} and {events[b]!r} do not commute at "
                f"{space.as_dict(state)}"
            )
        else:
            why = "the initial state is not valid or the checked domain is not closed"
        return [f"the table checker does not certify the tables: {why} ({v.theorem})"]
    if not np.array_equal(np.asarray(v.nf), nf):
        problems.append("the stored normal forms are not the normal forms of the tables")
    claims: list[tuple[str, object, object]] = [
        ("max repair depth", report.max_repair_depth, v.max_depth),
        ("CC2", report.cc2, v.cc2),
        ("checked domain size", report.domain_states, v.domain_size),
        ("checked domain size (stored ids)", len(domain_ids), v.domain_size),
        ("causal-order obligations", _pairs(report, events), list(v.obligations)),
        ("not-idempotent events", sorted(events.index(d.events[0]) for d in report.not_idempotent),
         list(v.not_idempotent)),
    ]
    problems += [
        f"{what}: the file says {said!r}, the table checker finds {found!r}"
        for what, said, found in claims
        if said != found
    ]
    problems += _domain_problems(valid, apply, nf, initial, domain_ids)
    if not problems and _is_data(rules):
        r = oracle.check_rules(rules=rules, valid=valid, repair=repair, apply=apply)
        if not r.matches:
            problems.append(f"the tables are not what the rules mean: {r.detail}")
    return problems


def _shape_problems(
    rules: dict[str, Any], space: Space, valid: npt.NDArray[np.bool_], initial: int, report: Report,
    events: list[str],
) -> list[str]:
    problems = []
    if tuple(events) != report.events:
        problems.append(f"the report's events {list(report.events)} are not the rules' events {events}")
    if report.states != space.n or report.valid_states != int(np.count_nonzero(valid)):
        problems.append("the report's state counts do not match the tables")
    if rules.get("initial") is not None:
        values = rules["initial"]
        if (
            not isinstance(values, list)
            or len(values) != len(space.vars)
            or not all(type(x) is int and v.lo <= x <= v.hi for x, v in zip(values, space.vars, strict=True))
            or space.id_of(values) != initial
        ):
            problems.append("the stored initial state is not the rules' initial state")
    if report.initial != space.as_dict(initial):
        problems.append("the report's initial state is not the stored initial state")
    if not (report.wfc and report.cc1):
        problems.append("the report does not describe a certified machine")
    return problems


def _pairs(report: Report, events: list[str]) -> list[tuple[int, int]]:
    out = []
    for d in report.obligations:
        a, b = events.index(d.events[0]), events.index(d.events[1])
        out.append((min(a, b), max(a, b)))
    return sorted(out)


def _domain_problems(
    valid: npt.NDArray[np.bool_],
    apply: npt.NDArray[np.int32],
    nf: npt.NDArray[np.int32],
    initial: int,
    domain_ids: npt.NDArray[np.int32],
) -> list[str]:
    """The stored domain must hold the initial state, valid states only, and be closed under every
    normalized step; with the oracle's size, it is then the oracle's domain (which is the smallest
    such set for "reachable", and every valid state for "valid")."""
    ids = np.asarray(domain_ids)
    if ids.size and not (np.all(ids[1:] > ids[:-1]) and ids[0] >= 0 and ids[-1] < valid.size):
        return ["the stored checked domain is not a sorted list of state ids"]
    member = np.zeros(valid.size, dtype=np.bool_)
    member[ids] = True
    if not member[initial] or not valid[ids].all():
        return ["the stored checked domain lacks the initial state or holds an invalid state"]
    if ids.size and not member[nf[apply[:, ids]]].all():
        return ["the stored checked domain is not closed under the machine's steps"]
    return []


def _is_data(rules: dict[str, Any]) -> bool:
    invariants = all(r.get("holds") is not None and r.get("repair") is not None for r in rules["invariants"])
    events = all(e.get("guard") is not None and e.get("effect") is not None for e in rules["events"])
    return invariants and events
