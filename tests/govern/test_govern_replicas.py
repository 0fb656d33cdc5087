"""Replicas converge on random machines: random small machines (rules as expressions, or the same rules as
Python callables), random logs over a few records (with declared dependencies), every event delivered
at least once and some several times, in random orders and batches. Every replica applies what the
delivery rules allow (`Govern.Delivery.check_tables_replica`: obligation pairs in log order, each log
position once) and ends in the state the log order reaches, whatever the order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from govern_machines import Spec, specs
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from govern import DomainViolation, Machine, NotConvergent, Registry, Var, max_, min_
from govern.runtime._eventlog import Event, EventLog, LoggedEvent
from govern.runtime._replica import Replica, fold

RECORDS = ["r1", "r2"]

# (data rule, the same rule as a callable) over x in 0..3, y in 0..2 and a flag f
GUARDS: dict[str, tuple[Callable[[dict[str, Var]], Any], Callable[[Any], bool]]] = {
    "always": (lambda v: True, lambda s: True),
    "x<2": (lambda v: v["x"] < 2, lambda s: s["x"] < 2),
    "f": (lambda v: v["f"], lambda s: bool(s["f"])),
    "not f": (lambda v: ~v["f"], lambda s: not s["f"]),
    "y==1": (lambda v: v["y"] == 1, lambda s: s["y"] == 1),
}
EFFECTS: dict[str, tuple[Callable[[dict[str, Var]], Any], Callable[[Any], dict[str, Any]]]] = {
    "x:=2": (lambda v: {v["x"]: 2}, lambda s: {"x": 2}),
    "x+=1": (lambda v: {v["x"]: min_(v["x"] + 1, 3)}, lambda s: {"x": min(s["x"] + 1, 3)}),
    "y-=1": (lambda v: {v["y"]: max_(v["y"] - 1, 0)}, lambda s: {"y": max(s["y"] - 1, 0)}),
    "f:=1": (lambda v: {v["f"]: True}, lambda s: {"f": True}),
    "toggle f": (lambda v: {v["f"]: ~v["f"]}, lambda s: {"f": not s["f"]}),
    "y:=x": (lambda v: {v["y"]: min_(v["x"], 2)}, lambda s: {"y": min(s["x"], 2)}),
    "x:=x+y": (lambda v: {v["x"]: min_(v["x"] + v["y"], 3)}, lambda s: {"x": min(s["x"] + s["y"], 3)}),
}
INVARIANTS: dict[str, tuple[Any, Any, Any, Any]] = {  # holds, repair (data), holds, repair (callable)
    "f needs x>=1": (
        lambda v: ~v["f"] | (v["x"] >= 1), lambda v: {v["x"]: 1},
        lambda s: (not s["f"]) or s["x"] >= 1, lambda s: {"x": 1},
    ),
    "y<=x": (
        lambda v: v["y"] <= v["x"], lambda v: {v["y"]: min_(v["x"], 2)},
        lambda s: s["y"] <= s["x"], lambda s: {"y": min(s["x"], 2)},
    ),
}


@st.composite
def machines(draw: st.DrawFn) -> Machine | None:
    """A small machine, with its rules as expressions or as callables; an event `tick` on a flag of
    its own is declared independent of the first event, so every other pair that does not commute is
    an obligation (instead of a failed build). None when it does not converge."""
    callables = draw(st.booleans())
    r = Registry("replicated")
    v = {"x": r.int("x", 0, 3), "y": r.int("y", 0, 2), "f": r.bool("f"), "t": r.bool("t")}
    for k, name in enumerate(draw(st.lists(st.sampled_from(sorted(INVARIANTS)), max_size=2, unique=True))):
        holds, repair, holds_fn, repair_fn = INVARIANTS[name]
        if callables:
            r.invariant(f"inv{k}", holds=holds_fn, repair=repair_fn)
        else:
            r.invariant(f"inv{k}", holds=holds(v), repair=repair(v))
    count = draw(st.integers(2, 4))
    for k in range(count):
        guard = GUARDS[draw(st.sampled_from(sorted(GUARDS)))]
        effect = EFFECTS[draw(st.sampled_from(sorted(EFFECTS)))]
        if callables:
            r.event(f"ev{k}", guard=guard[1], effect=effect[1])
        else:
            r.event(f"ev{k}", guard=guard[0](v), effect=effect[0](v))
    r.event("tick", effect=(lambda s: {"t": True}) if callables else {v["t"]: True})
    r.independent("tick", "ev0")
    try:
        return r.build(draw(st.sampled_from(["valid", "reachable"])))
    except (NotConvergent, DomainViolation):
        return None


def _with_tick(drawn: tuple[Spec, bool]) -> Machine | None:
    """A machine of the general strategy (tests/govern/govern_machines.py), plus `tick` as above."""
    spec, callables = drawn
    r = spec.registry(callables=callables)
    r.bool("zz")
    r.event("tick", effect=(lambda s: {"zz": True}) if callables else {"zz": True})
    r.independent("tick", "ev0")
    try:
        return r.build(spec.domain)  # type: ignore[arg-type]
    except (NotConvergent, DomainViolation):
        return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(machines(), st.tuples(specs(), st.booleans()).map(_with_tick)), st.data())
def test_every_replica_ends_in_the_log_order_state(m: Machine | None, data: st.DataObject) -> None:
    event("built" if m is not None else "not convergent")
    if m is None:
        return
    event(f"obligations: {min(len(m.report.obligations), 2)}+")
    event(f"not idempotent: {min(len(m.report.not_idempotent), 1)}+")
    ops = data.draw(
        st.lists(st.tuples(st.sampled_from(RECORDS), st.sampled_from(m.events), st.booleans()), max_size=14)
    )
    log = EventLog("memory://", machine=m)
    for i, (record, name, chained) in enumerate(ops):
        deps = (f"e{data.draw(st.integers(0, i - 1))}",) if chained and i else ()
        log.append(Event(id=f"e{i}", machine=m.digest, record=record, event=name, producer="p", deps=deps))
    stored = log.read()
    reference = fold(m, stored)
    digests = set()
    for _ in range(3):
        copies = data.draw(st.lists(st.sampled_from(stored), max_size=len(stored))) if stored else []
        arrivals: list[LoggedEvent] = data.draw(st.permutations(stored + copies))
        replica = Replica(m, log)
        start = 0
        while start < len(arrivals):  # delivered in random batches
            end = start + data.draw(st.integers(1, len(arrivals) - start))
            replica.deliver(arrivals[start:end])
            start = end
        assert replica.pending == 0 and replica.position == len(stored)
        assert replica.duplicates == len(copies)
        assert {k: replica.state_id(k) for k in replica.records()} == dict(reference)
        digests.add(replica.digest())
    assert len(digests) <= 1
