"""Differential test: the engine (`govern.Registry.build`) against the extracted oracle on random machines.

Each machine is given by random tables (repair cycles, non-commuting pairs, CC2 failures and invalid
initial states included) and declared through the public API with one integer variable and rules
written as callables reading those tables, so the engine enumerates exactly these tables. The build
itself runs the oracle gate; this test also runs the oracle directly and requires: a machine is
returned exactly when the oracle certifies, a rejection is a `NotConvergent` the oracle agrees with,
the engine and the oracle never disagree, and the built machine's obligations and not-idempotent events
are the oracle's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings

from govern import NotConvergent, Registry
from govern.oracle import check_tables

from ._strategies import machines


def declare(m: dict[str, Any]) -> Registry:
    valid, repair, apply = m["valid"], m["repair"], m["apply"]
    r = Registry("diff")
    r.int("s", 0, len(valid) - 1)
    def holds(st: Any) -> bool:
        return bool(valid[st["s"]])

    def fix(st: Any) -> dict[str, int]:
        return {"s": repair[st["s"]]}

    def effect(row: list[int]) -> Any:
        return lambda st: {"s": row[st["s"]]}

    r.invariant("inv", holds=holds, repair=fix)
    for k, row in enumerate(apply):
        r.event(f"e{k}", effect=effect(row))
    for a, b in m["pairs"] or []:
        r.independent(f"e{a}", f"e{b}")
    if valid[m["initial"]]:
        r.initial(s=m["initial"])
    return r


def default_initial(m: dict[str, Any]) -> int | None:
    """NF of state 0 (the all-lowest state), or None when repair cycles from it."""
    s, seen = 0, set()
    while not m["valid"][s]:
        if s in seen:
            return None
        seen.add(s)
        s = m["repair"][s]
    return s


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines())
def test_engine_and_oracle_agree(m: dict[str, Any]) -> None:
    if not m["apply"]:
        return  # a registry must declare an event
    if m["pairs"] == []:
        m = {**m, "pairs": None}
    initial = m["initial"] if m["valid"][m["initial"]] else default_initial(m)
    registry = declare(m)
    try:
        machine = registry.build(m["domain"])
        built = True
    except NotConvergent:
        built = False
    if initial is None:
        assert not built
        return
    n = len(m["valid"])
    verdict = check_tables(
        valid=np.array(m["valid"], dtype=bool),
        repair=np.array(m["repair"]),
        apply=np.array(m["apply"], dtype=np.int64).reshape(len(m["apply"]), n),
        pairs=None if m["pairs"] is None else [tuple(p) for p in m["pairs"]],
        domain=m["domain"],
        initial=initial,
    )
    assert built == verdict.certified
    if built:  # the delivery rules replicas run by are the oracle's
        index = {name: i for i, name in enumerate(machine.events)}
        engine_obligations = sorted(
            tuple(sorted((index[d.events[0]], index[d.events[1]]))) for d in machine.report.obligations
        )
        assert engine_obligations == list(verdict.obligations)
        assert sorted(index[d.events[0]] for d in machine.report.not_idempotent) == list(
            verdict.not_idempotent
        )
