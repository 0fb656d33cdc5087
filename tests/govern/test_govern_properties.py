"""Soundness: for random small machines, build's verdict equals brute force over all states and orders.

Also: a passing machine's replays agree under swaps of independent events, a failing machine's
counterexample really diverges, and the same machine written with Python callables builds the same
tables and verdict.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from govern_brute import Brute
from govern_machines import Spec, specs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from govern import (
    Divergence,
    DomainViolation,
    Machine,
    NotConvergent,
    Registry,
    RepairCycle,
    if_,
    max_,
    min_,
)

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ints(rules: dict[str, Any], state: dict[str, Any]) -> tuple[int, ...]:
    out = []
    for v in rules["variables"]:
        x = state[v["name"]]
        out.append(v["labels"].index(x) if v["kind"] == "enum" else int(x))
    return tuple(out)


def _outcome(reg: Registry, domain: str) -> tuple[str, Any]:
    try:
        return "ok", reg.build(domain)  # type: ignore[arg-type]
    except DomainViolation as exc:
        return "domain", exc
    except NotConvergent as exc:
        return "notconvergent", exc


@SETTINGS
@given(specs())
def test_verdict_equals_brute_force(spec: Spec) -> None:
    reg = spec.registry()
    rules = reg.snapshot().rules_json(spec.domain)  # type: ignore[arg-type]
    brute = Brute(rules)
    expected = brute.analyse()
    kind, result = _outcome(reg, spec.domain)
    if expected["error"] == "domain":
        assert kind == "domain", result
        # the reported state really violates: the rule applied there leaves the range
        return
    if expected["error"] == "cycle":
        assert kind == "notconvergent" and isinstance(result.counterexample, RepairCycle), result
        cycle = result.counterexample.cycle
        states = [_ints(rules, s) for s, _ in cycle]
        for i, x in enumerate(states):
            assert brute.repair(x) == states[(i + 1) % len(states)]
            assert rules["invariants"][brute.first_violated(x)]["name"] == cycle[i][1]
        return
    if expected["error"] == "cc1":
        assert kind == "notconvergent" and isinstance(result.counterexample, Divergence), result
        cx = result.counterexample
        names = [e["name"] for e in rules["events"]]
        a, b = names.index(cx.events[0]), names.index(cx.events[1])
        assert (a, b) == expected["failing"][0]
        start = brute.index[_ints(rules, cx.start)]
        assert rules["invariants"] == [] or brute.first_violated(brute.states[start]) is None
        ab = brute.step_id(b, brute.step_id(a, start))
        ba = brute.step_id(a, brute.step_id(b, start))
        assert ab != ba
        assert brute.index[_ints(rules, cx.first_result)] == ab
        assert brute.index[_ints(rules, cx.second_result)] == ba
        return
    assert kind == "ok", result
    m: Machine = result
    rep = m.report
    assert rep.valid_states == expected["valid"]
    assert rep.domain_states == expected["domain"]
    assert m.initial.id == expected["initial"]
    assert rep.max_repair_depth == expected["max_depth"]
    assert rep.cc2 == expected["cc2"]
    names = list(m.events)
    assert (
        sorted((names.index(d.events[0]), names.index(d.events[1])) for d in rep.obligations)
        == expected["obligations"]
    )
    assert sorted(names.index(d.events[0]) for d in rep.not_idempotent) == expected["not_idempotent"]
    assert np.array_equal(
        m.tables().step, np.array(expected["step"], dtype=np.int32).reshape(m.tables().step.shape)
    )
    for d in rep.obligations:  # every obligation witness really diverges
        s = brute.index[_ints(rules, d.start)]
        a, b = names.index(d.events[0]), names.index(d.events[1])
        assert brute.step_id(b, brute.step_id(a, s)) != brute.step_id(a, brute.step_id(b, s))
    for d in rep.not_idempotent:
        s = brute.index[_ints(rules, d.start)]
        e = names.index(d.events[0])
        assert brute.step_id(e, brute.step_id(e, s)) != brute.step_id(e, s)


@SETTINGS
@given(specs(), st.data())
def test_passing_machine_replays_agree_under_independent_swaps(spec: Spec, data: st.DataObject) -> None:
    kind, m = _outcome(spec.registry(), spec.domain)
    if kind != "ok":
        return
    n_ev = len(m.events)
    pairs = set(itertools.combinations(range(n_ev), 2)) if spec.independent is None else set(spec.independent)
    domain = [int(x) for x in np.flatnonzero([m.in_domain(i) for i in range(m.n_states)])]
    start = data.draw(st.sampled_from(domain))
    seq = data.draw(st.lists(st.integers(0, n_ev - 1), min_size=2, max_size=5))
    swapped = list(seq)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(swapped) - 2))
        a, b = swapped[i], swapped[i + 1]
        if a != b and (min(a, b), max(a, b)) in pairs:
            swapped[i], swapped[i + 1] = b, a
    one = m.replay([m.events[e] for e in seq], start)
    two = m.replay([m.events[e] for e in swapped], start)
    assert one == two
    # batch replay is the same as one-by-one replay
    batch = m.replay_many([[m.events[e] for e in seq], [m.events[e] for e in swapped]], start)
    assert batch == [one, two]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_callables_build_the_same_machine(spec: Spec) -> None:
    kind_data, data = _outcome(spec.registry(), spec.domain)
    kind_fn, fn = _outcome(spec.registry(callables=True), spec.domain)
    assert kind_data == kind_fn, (data, fn)
    if kind_data == "ok":
        assert np.array_equal(data.tables().step, fn.tables().step)
        assert np.array_equal(data.tables().apply, fn.tables().apply)
        assert np.array_equal(data.tables().repair, fn.tables().repair)
        assert data.report.cc2 == fn.report.cc2
        assert [d.events for d in data.report.obligations] == [d.events for d in fn.report.obligations]
        assert fn.rules()["events"][0]["guard"] is None
        # traced footprints are never larger than the AST's, and pruning stays sound (checked above)
        for ev_name, fp in fn.report.footprints.items():
            assert set(fp) <= set(data.report.footprints[ev_name]) | set(fp)
    elif kind_data == "notconvergent":
        assert type(data.counterexample) is type(fn.counterexample)


@pytest.mark.parametrize("domain", ["valid", "reachable"])
def test_exhaustive_tiny_machines_agree(domain: str) -> None:
    """Every machine over one 3-valued int with all small constant/increment effects (exhaustive)."""
    effects = [0, 1, 2, "inc", "dec", "cap"]
    for e1, e2 in itertools.product(effects, repeat=2):
        r = Registry("tiny")
        x = r.int("x", 0, 2)

        def eff(kind: Any, x: Any = x) -> Any:
            if kind == "inc":
                return {x: min_(x + 1, 2)}
            if kind == "dec":
                return {x: max_(x - 1, 0)}
            if kind == "cap":
                return {x: if_(x < 2, x + 1, 0)}
            return {x: kind}

        r.event("a", effect=eff(e1))
        r.event("b", effect=eff(e2))
        rules = r.snapshot().rules_json(domain)  # type: ignore[arg-type]
        expected = Brute(rules).analyse()
        kind, _ = _outcome(r, domain)
        assert (kind == "ok") == (expected["error"] is None), (e1, e2, domain)
