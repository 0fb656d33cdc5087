"""The symbolic route against enumeration, on a corpus of nasty integer machines and on random ones.

- The corpus (`symbolic_corpus.py`) shrunk to 0..40: the symbolic verdict equals enumeration's
  field by field, on the "valid" and the "reachable" domain.
- The same machines at 10^9 and 10^12 values per variable: the symbolic route decides them and
  reaches the verdict the shrunk machines reach (the constants scale with the domain).
- Random machines with nested `min_`/`max_`/`if_`, guards with comparisons and two or three
  invariants whose repairs cascade, on both domains: verdicts equal field by field.
- What the route cannot decide it says, with what to do: a reachable set walked one unit at a time,
  a repair that steps one unit at a time.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from symbolic_corpus import CORPUS, long_reach

from govern import (
    Divergence,
    DomainViolation,
    NotConvergent,
    Registry,
    RepairCycle,
    StateSpaceTooLarge,
    if_,
    max_,
    min_,
)
from govern.machine._build import build_machine
from govern.model._declarations import Domain, Snapshot
from govern.verify._concrete import Concrete
from govern.verify._symbolic import verify_symbolic
from govern.verify._timing import PhaseTimer

SMALL = 40


def _states(snap: Snapshot) -> int:
    n = 1
    for v in snap.vars:
        n *= v.size
    return n


def _failure(exc: Exception) -> tuple[Any, ...]:
    if isinstance(exc, DomainViolation):
        return ("domain", exc.rule)
    assert isinstance(exc, NotConvergent)
    cx = exc.counterexample
    if isinstance(cx, RepairCycle):
        return ("cycle",)
    assert cx.first_result != cx.second_result  # replayed: the two orders really end apart
    return ("diverge", cx.condition, cx.events)


def enumerated(snap: Snapshot, domain: Domain) -> tuple[Any, ...]:
    """Enumeration's verdict on the fields the symbolic route also reports."""
    try:
        r = build_machine(snap, domain, method="enumerate").report
    except (DomainViolation, NotConvergent) as exc:
        return _failure(exc)
    return (
        "ok",
        r.initial,
        r.max_repair_depth,
        r.cc2,
        tuple(r.cc2_failing_events),
        tuple(d.events for d in r.obligations),
        tuple(d.events for d in r.not_idempotent),
        tuple((p.a, p.b) for p in r.pairs_pruned),
    )


def symbolic(snap: Snapshot, domain: Domain, *, exhaustive: bool) -> tuple[Any, ...]:
    """The symbolic verdict; `exhaustive` lets repair and run searches go as far as the state count."""
    n = _states(snap)
    bounds = {"max_depth": n + 1, "max_run": n} if exhaustive else {}
    try:
        v = verify_symbolic(snap, domain, PhaseTimer(), **bounds)
    except (DomainViolation, NotConvergent) as exc:
        return _failure(exc)
    for d in (*v.obligations, *v.not_idempotent, *([v.cc2_witness] if v.cc2_witness else [])):
        assert d.first_result != d.second_result
    return (
        "ok",
        Concrete.of(snap).as_dict(v.initial),
        v.depth_max,
        v.cc2,
        tuple(v.cc2_failing_events),
        tuple(d.events for d in v.obligations),
        tuple(d.events for d in v.not_idempotent),
        tuple((p.a, p.b) for p in v.pairs_pruned),
    )


def _scale_free(verdict: tuple[Any, ...]) -> tuple[Any, ...]:
    """A verdict without the initial state (whose values scale with the domain)."""
    return verdict[:1] + verdict[2:] if verdict[0] == "ok" else verdict


MACHINES = sorted(CORPUS)


@pytest.mark.parametrize("domain", ["valid", "reachable"])
@pytest.mark.parametrize("name", MACHINES)
def test_corpus_small_scale_equals_enumeration(name: str, domain: Domain) -> None:
    snap = CORPUS[name](SMALL).snapshot()
    assert symbolic(snap, domain, exhaustive=True) == enumerated(snap, domain)


# deep_repair (40 repair steps, a few seconds each) runs once at scale; the others in every combination.
LARGE = [
    (name, domain, n)
    for name in MACHINES
    for domain in ("valid", "reachable")
    for n in (10**9, 10**12)
    if name != "deep_repair" or (domain, n) == ("valid", 10**12)
]


@pytest.mark.parametrize(("name", "domain", "n"), LARGE)
def test_corpus_large_scale_reaches_the_small_verdict(name: str, domain: Domain, n: int) -> None:
    expected = _scale_free(enumerated(CORPUS[name](SMALL).snapshot(), domain))
    assert _scale_free(symbolic(CORPUS[name](n).snapshot(), domain, exhaustive=False)) == expected


def test_the_stuck_query_of_the_last_session_is_a_counterexample() -> None:
    # min_(limit + 1000, 10**9) and max_(limit, 100) over 0..10^9: CP-SAT returned UNKNOWN after
    # minutes on the old encoding. limit = 0 is a counterexample (1100 against 1000).
    r = Registry("limit")
    limit = r.int("limit", 0, 10**9)
    r.event("up", effect={limit: min_(limit + 1000, 10**9)})
    r.event("floor", effect={limit: max_(limit, 100)})
    with pytest.raises(NotConvergent) as info:
        r.build()
    cx = info.value.counterexample
    assert isinstance(cx, Divergence)
    assert cx.events == ("up", "floor") and cx.first_result != cx.second_result


def test_reachability_beyond_the_run_bound_is_refused_with_what_to_do() -> None:
    small = long_reach(SMALL).snapshot()
    assert symbolic(small, "reachable", exhaustive=True) == enumerated(small, "reachable")
    with pytest.raises(StateSpaceTooLarge) as info:
        verify_symbolic(long_reach(10**9).snapshot(), "reachable", PhaseTimer(), max_run=8)
    text = str(info.value)
    assert "fails on the valid state {'x': " in text and "no run of up to 8 events" in text
    assert "domain='valid'" in text and "add an invariant" in text
    with pytest.raises(NotConvergent):  # on the valid domain the same pair is a counterexample
        verify_symbolic(long_reach(10**9).snapshot(), "valid", PhaseTimer())


def test_a_repair_chain_beyond_the_depth_bound_is_refused_with_what_to_do() -> None:
    r = Registry("slow")
    x = r.int("x", 0, 10**9)
    r.invariant("small", holds=x <= 0, repair={x: x - 1})  # repair chains of 10^9 steps
    r.event("e", effect={x: 0})
    with pytest.raises(StateSpaceTooLarge) as info:
        verify_symbolic(r.snapshot(), "valid", PhaseTimer(), max_depth=8)
    text = str(info.value)
    assert "neither shown nor refuted" in text and "repair takes 9 steps" in text
    assert "assign the bound" in text


# -- random machines ------------------------------------------------------------------------------

Recipe = Any  # nested tuples interpreted by `_int` / `_cond` over the registry's variables


@st.composite
def _int_recipe(draw: st.DrawFn, depth: int, hi: int) -> Recipe:
    ops = ["lit", "var", "var"] + (["add", "sub", "min", "max", "ite"] * 2 if depth else [])
    op = draw(st.sampled_from(ops))
    if op == "lit":
        return ("lit", draw(st.integers(0, hi)))
    if op == "var":
        return ("var", draw(st.integers(0, 1)))
    if op in ("add", "sub"):
        return (op, draw(_int_recipe(depth - 1, hi)), draw(st.integers(1, 3)))
    if op == "ite":
        return (
            "ite",
            draw(_cond_recipe(depth - 1, hi)),
            draw(_int_recipe(depth - 1, hi)),
            draw(_int_recipe(depth - 1, hi)),
        )
    return (op, draw(_int_recipe(depth - 1, hi)), draw(_int_recipe(depth - 1, hi)))


@st.composite
def _cond_recipe(draw: st.DrawFn, depth: int, hi: int) -> Recipe:
    op = draw(st.sampled_from(["lt", "le", "eq"] + (["and", "or"] if depth else [])))
    if op in ("and", "or"):
        return (op, draw(_cond_recipe(depth - 1, hi)), draw(_cond_recipe(depth - 1, hi)))
    return (op, draw(_int_recipe(max(depth - 1, 0), hi)), draw(_int_recipe(max(depth - 1, 0), hi)))


def _int(rec: Recipe, vs: list[Any]) -> Any:
    op = rec[0]
    if op == "lit":
        return rec[1]
    if op == "var":
        return vs[rec[1]]
    if op == "add":
        return _int(rec[1], vs) + rec[2]
    if op == "sub":
        return _int(rec[1], vs) - rec[2]
    if op == "ite":
        return if_(_cond(rec[1], vs), _int(rec[2], vs), _int(rec[3], vs))
    return (min_ if op == "min" else max_)(_int(rec[1], vs), _int(rec[2], vs))


def _value(rec: Recipe, vs: list[Any], top: int, clamp: bool) -> Any:
    """An assigned value: a literal is declared in range; an expression may leave the range unless
    `clamp` keeps it within."""
    x = _int(rec, vs)
    if clamp:
        x = max_(min_(x, top), 0)
    if isinstance(x, int):
        return max(0, min(x, top))
    lo, hi = x.bounds
    return max(0, min(lo, top)) if lo == hi else x  # a folded constant


def _cond(rec: Recipe, vs: list[Any]) -> Any:
    op = rec[0]
    a, b = rec[1], rec[2]
    if op == "and":
        return _cond(a, vs) & _cond(b, vs)
    if op == "or":
        return _cond(a, vs) | _cond(b, vs)
    x, y = _int(a, vs), _int(b, vs)
    if isinstance(x, int) and isinstance(y, int):  # a comparison needs an expression on one side
        x = vs[0] - vs[0] + x
    return x < y if op == "lt" else x <= y if op == "le" else x == y


@st.composite
def integer_machines(draw: st.DrawFn) -> tuple[Registry, Domain]:
    """Two integer variables over small ranges, two or three invariants with cascading repairs,
    two or three guarded events with nested min/max/if effects, some pairs declared independent."""
    his = [draw(st.integers(2, 6)), draw(st.integers(2, 6))]
    hi = max(his)
    r = Registry("random_ints")
    vs = [r.int("x", 0, his[0]), r.int("y", 0, his[1])]
    for k in range(draw(st.integers(2, 3))):
        shape = draw(st.sampled_from(["bound", "bound", "order", "random"]))
        if shape == "bound":  # x <= c or x >= c, repaired to an expression clamped to the bound
            j, c = draw(st.integers(0, 1)), draw(st.integers(0, his[0]))
            c = min(c, his[j])
            fix = _int(draw(_int_recipe(2, hi)), vs)
            if draw(st.booleans()):
                r.invariant(f"inv{k}", holds=vs[j] <= c, repair={vs[j]: min_(max_(fix, 0), c)})
            else:
                r.invariant(f"inv{k}", holds=vs[j] >= c, repair={vs[j]: max_(min_(fix, his[j]), c)})
        elif shape == "order":  # x <= y, repaired by moving either side (repairs then cascade)
            j = draw(st.integers(0, 1))
            low, high = vs[j], vs[1 - j]
            moved = draw(st.integers(0, 1))
            top = his[1 - j] if moved else his[j]
            fix = max_(min_(high if moved == 1 else low, top), 0)
            r.invariant(f"inv{k}", holds=low <= high, repair={(low if moved else high): fix})
        else:
            written = draw(st.lists(st.integers(0, 1), min_size=1, max_size=2, unique=True))
            r.invariant(
                f"inv{k}",
                holds=_cond(draw(_cond_recipe(1, hi)), vs),
                repair={
                    vs[j]: _value(draw(_int_recipe(2, hi)), vs, his[j], draw(st.booleans())) for j in written
                },
            )
    n_ev = draw(st.integers(2, 3))
    for k in range(n_ev):
        written = draw(st.lists(st.integers(0, 1), min_size=1, max_size=2, unique=True))
        guard = _cond(draw(_cond_recipe(1, hi)), vs) if draw(st.booleans()) else True
        r.event(
            f"ev{k}",
            guard=guard,
            effect={
                vs[j]: _value(draw(_int_recipe(3, hi)), vs, his[j], draw(st.integers(0, 3)) > 0)
                for j in written
            },
        )
    if draw(st.booleans()):
        for a in range(n_ev):
            for b in range(a + 1, n_ev):
                if draw(st.booleans()):
                    r.independent(f"ev{a}", f"ev{b}")
    return r, draw(st.sampled_from(["valid", "reachable"]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(integer_machines())
def test_random_integer_machines_symbolic_equals_enumeration(machine: tuple[Registry, Domain]) -> None:
    registry, domain = machine
    snap = registry.snapshot()
    assert symbolic(snap, domain, exhaustive=True) == enumerated(snap, domain)


def test_a_query_too_large_to_state_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from govern.verify._piecewise import Formulas

    monkeypatch.setattr(Formulas, "max_nodes", 500)
    with pytest.raises(StateSpaceTooLarge, match="grew too large to state"):
        verify_symbolic(CORPUS["deep_repair"](10**9).snapshot(), "valid", PhaseTimer())
