"""Differential property: for random small machines, the engine's verdict, the checker's own
recomputation and the proof-derived oracle agree, so every machine that builds certifies and checks.

Machines are drawn over int variables 0..hi with guards comparing a variable to a literal and effects
that set, increment or decrement (clamped with min/max so no value leaves its domain); invariants
bound a variable and repair it to a literal. Many draws do not converge; those are skipped, not
certified (and `certify` must then raise, never write).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from govern import Registry
from govern._errors import NotConvergent
from govern.certificate._certificate import check_certificate, read_table_certificate
from govern.certificate._make import certify
from govern.model._expr import max_, min_

variable = st.tuples(st.integers(1, 3))  # (hi,)
guard = st.tuples(st.sampled_from(["lt", "ge", "eq", "true"]), st.integers(0, 3))
effect = st.tuples(st.sampled_from(["set", "inc", "dec"]), st.integers(0, 3))


@st.composite
def machines(draw: st.DrawFn) -> dict[str, Any]:
    sizes = draw(st.lists(variable, min_size=1, max_size=3))
    n = len(sizes)
    events = draw(st.lists(st.tuples(st.integers(0, n - 1), guard, st.integers(0, n - 1), effect),
                           min_size=1, max_size=4))
    invariants = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 3), st.integers(0, 3)),
                               max_size=2))
    independent = draw(st.none() | st.just("first-pair"))
    domain = draw(st.sampled_from(["valid", "reachable"]))
    return {"sizes": sizes, "events": events, "invariants": invariants, "independent": independent,
            "domain": domain}


def _build(spec: dict[str, Any]) -> Registry:
    registry = Registry("random")
    xs = [registry.int(f"x{i}", 0, hi) for i, (hi,) in enumerate(spec["sizes"])]
    for k, (i, bound, reset) in enumerate(spec["invariants"]):
        hi = spec["sizes"][i][0]
        registry.invariant(f"inv{k}", holds=xs[i] <= min(bound, hi), repair={xs[i]: min(reset, bound, hi)})
    for k, (gi, (gop, glit), ti, (eop, elit)) in enumerate(spec["events"]):
        x, hi = xs[gi], spec["sizes"][gi][0]
        conditions: dict[str, Any] = {"lt": x < glit, "ge": x >= min(glit, hi), "eq": x == min(glit, hi)}
        condition: Any = conditions.get(gop, True)
        target, thi = xs[ti], spec["sizes"][ti][0]
        value: Any = {"set": min(elit, thi), "inc": min_(target + 1, thi), "dec": max_(target - 1, 0)}[eop]
        registry.event(f"e{k}", guard=condition, effect={target: value})
    if spec["independent"] == "first-pair" and len(spec["events"]) >= 2:
        registry.independent("e0", "e1")
    return registry


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines())
def test_every_machine_that_builds_certifies_and_checks(spec: dict[str, Any]) -> None:
    registry = _build(spec)
    try:
        machine = registry.build(spec["domain"])
    except NotConvergent:
        try:
            certify(registry)
        except NotConvergent:
            pass
        else:
            raise AssertionError("certify accepted a machine whose build does not converge")
        assume(False)
        return
    certificate = certify(machine)  # raises if the checker or the oracle disagrees with the engine
    data = certificate.to_bytes()
    result = check_certificate(data)
    assert result.rules_checked
    assert read_table_certificate(data).to_bytes() == data
    verdict = certificate.model.verdict
    report = machine.report
    fields = ("states", "valid_states", "domain_states", "max_repair_depth", "cc2")
    assert [getattr(verdict, f) for f in fields] == [getattr(report, f) for f in fields]
