"""The oracle's delivery lists, against brute force: on every certified random machine, the obligations
are exactly the pairs a < b that fail to commute at some state of the checked domain, and the
not-idempotent events exactly those whose second application changes some state of it
(`Govern.Delivery.check_tables_delivery`, here on the extracted code); with a witness the lists are the
same (`check_tables_w_eq`); an uncertified verdict has none."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings

from govern.oracle import check_tables

from ._strategies import machines


def brute(m: dict[str, Any]) -> tuple[list[tuple[int, int]], list[int]] | None:
    """(obligations, not idempotent) by definition, or None when repair does not terminate."""
    valid, repair, apply = m["valid"], m["repair"], m["apply"]
    n = len(valid)
    nf = []
    for s in range(n):
        x = s
        for _ in range(n + 1):
            x = x if valid[x] else repair[x]
        if not valid[x]:
            return None
        nf.append(x)

    def step(e: int, s: int) -> int:
        return nf[apply[e][s]]

    if m["domain"] == "valid":
        dom = {s for s in range(n) if valid[s]}
    else:
        dom, todo = {m["initial"]}, [m["initial"]]
        while todo:
            s = todo.pop()
            for e in range(len(apply)):
                t = step(e, s)
                if t not in dom:
                    dom.add(t)
                    todo.append(t)
    events = range(len(apply))
    obligations = [
        (a, b) for a in events for b in events
        if a < b and any(step(b, step(a, s)) != step(a, step(b, s)) for s in dom)
    ]
    not_idem = [e for e in events if any(step(e, step(e, s)) != step(e, s) for s in dom)]
    return obligations, not_idem


def _true_witness(m: dict[str, Any]) -> tuple[list[int], list[int]]:
    nf, depth = [], []
    for s in range(len(m["valid"])):
        x, k = s, 0
        while not m["valid"][x]:
            x, k = m["repair"][x], k + 1
        nf.append(x)
        depth.append(k)
    return nf, depth


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines())
def test_obligations_and_not_idempotent_are_exact_on_the_domain(m: dict[str, Any]) -> None:
    n = len(m["valid"])
    tables = {
        "valid": np.array(m["valid"], dtype=bool),
        "repair": np.array(m["repair"]),
        "apply": np.array(m["apply"], dtype=np.int64).reshape(len(m["apply"]), n),
        "pairs": None if m["pairs"] is None else [tuple(p) for p in m["pairs"]],
        "domain": m["domain"],
        "initial": m["initial"],
    }
    verdict = check_tables(**tables)
    if not verdict.certified:
        assert verdict.obligations == () and verdict.not_idempotent == ()
        return
    expected = brute(m)
    assert expected is not None
    obligations, not_idem = expected
    assert list(verdict.obligations) == obligations
    assert list(verdict.not_idempotent) == not_idem
    if m["pairs"] is None:
        assert obligations == []  # every pair was checked and commutes
    nf, depth = _true_witness(m)
    witnessed = check_tables(**tables, nf=np.array(nf), depth=np.array(depth))
    assert witnessed.obligations == verdict.obligations
    assert witnessed.not_idempotent == verdict.not_idempotent
