"""Building machines: the issue's usage, verdicts, counterexamples, errors with states, the report."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

import govern
from govern import (
    DeclarationError,
    Divergence,
    DomainViolation,
    NotConvergent,
    Registry,
    RepairCycle,
    Report,
    RuleError,
    StateSpaceTooLarge,
)


def orders() -> Registry:
    r = Registry("orders")
    status = r.enum("status", ["pending", "paid", "shipped", "cancelled"])
    paid = r.bool("paid")
    stock = r.int("stock", 0, 5)
    r.invariant("no_ship_unpaid", holds=(status != "shipped") | paid, repair={status: "pending"})
    r.event("pay", guard=status == "pending", effect={status: "paid", paid: True})
    r.event("ship", guard=(status == "paid") & (stock > 0), effect={status: "shipped", stock: stock - 1})
    r.event("restock", guard=stock < 5, effect={stock: stock + 1})
    r.independent("pay", "restock")
    return r


def test_issue_usage_works_as_written() -> None:
    machine = orders().build()
    s = machine.apply(machine.initial, "pay")
    assert s["status"] == "paid"
    assert s["paid"] is True and s["stock"] == 0
    rep = machine.report
    assert (rep.states, rep.valid_states, rep.domain_states) == (48, 42, 42)
    assert rep.pair_mode == "declared" and rep.pairs_checked == (("pay", "restock"),)
    assert {(d.events[0], d.events[1]) for d in rep.obligations} == {("pay", "ship"), ("ship", "restock")}
    assert [d.events[0] for d in rep.not_idempotent] == ["restock"]
    assert rep.cc2 is False and rep.cc2_failing_events == ("pay",)
    assert rep.max_repair_depth == 1
    assert rep.oracle is not None and rep.oracle["verdict"] == "certified"
    assert "Govern." in rep.oracle["theorem"]
    text = str(rep)
    for needle in ("CONVERGES", "OBLIGATIONS", "pay / ship", "restock", "oracle", "timings", "guarantee"):
        assert needle in text
    assert set(rep.timings) >= {"tables", "normal forms (WFC)", "CC1", "oracle"}


def test_rules_json_is_the_semantics_document_shape() -> None:
    rules = orders().build().rules()
    assert rules["variables"] == [
        {"name": "status", "kind": "enum", "labels": ["pending", "paid", "shipped", "cancelled"]},
        {"name": "paid", "kind": "bool"},
        {"name": "stock", "kind": "int", "min": 0, "max": 5},
    ]
    assert rules["initial"] == [0, 0, 0]
    assert rules["invariants"][0] == {
        "name": "no_ship_unpaid",
        "holds": ["or", ["not", ["eq", ["var", 0], ["lit", 2]]], ["var", 1]],
        "repair": [[0, ["lit", 0]]],
    }
    assert rules["events"][0] == {
        "name": "pay",
        "guard": ["eq", ["var", 0], ["lit", 0]],
        "effect": [[0, ["lit", 1]], [1, ["lit", 1]]],
    }
    assert rules["independent"] == [[0, 2]] and rules["domain"] == "valid"


def test_naive_pay_ship_is_rejected_with_a_readable_counterexample() -> None:
    r = Registry("naive")
    paid = r.bool("paid")
    shipped = r.bool("shipped")
    r.event("pay", effect={paid: True})
    r.event("ship", guard=paid, effect={shipped: True})
    with pytest.raises(NotConvergent) as info:
        r.build()
    cx = info.value.counterexample
    assert isinstance(cx, Divergence) and cx.condition == "CC1" and cx.events == ("pay", "ship")
    assert cx.start == {"paid": False, "shipped": False}
    assert cx.first_result == {"paid": True, "shipped": True}
    assert cx.second_result == {"paid": True, "shipped": False}
    assert [s.event for s in cx.first] == ["pay", "ship"] and [s.event for s in cx.second] == ["ship", "pay"]
    text = str(info.value)
    assert "order 1: pay then ship" in text and "order 2: ship then pay" in text and "results differ" in text
    json.dumps(cx.to_dict())


def test_two_events_writing_one_variable_are_never_pruned() -> None:
    r = Registry("overwrite")
    x = r.int("x", 0, 2)
    r.bool("unrelated")
    r.event("one", effect={x: 1})
    r.event("two", effect={x: 2})
    with pytest.raises(NotConvergent, match="'one' and 'two'"):
        r.build()


def test_cascading_repairs_report_every_repair_that_fired() -> None:
    r = Registry("cascade")
    a, b, c = r.bool("a"), r.bool("b"), r.bool("c")
    r.invariant("a_b", holds=~a | b, repair={b: True})
    r.invariant("b_c", holds=~b | c, repair={c: True})
    r.event("set_a", effect={a: True})
    r.event("reset", effect={a: False, b: False, c: False})
    with pytest.raises(NotConvergent) as info:
        r.build()
    cx = info.value.counterexample
    assert isinstance(cx, Divergence)
    assert cx.start == {"a": False, "b": False, "c": False}
    set_a = next(step for step in cx.first + cx.second if step.event == "set_a" and step.repairs)
    assert [name for name, _ in set_a.repairs] == ["a_b", "b_c"]
    assert set_a.repairs[0][1] == {"a": True, "b": True, "c": False}
    assert set_a.result == {"a": True, "b": True, "c": True}


def test_repair_cycle_is_reported_with_its_states_and_invariants() -> None:
    r = Registry("cycle")
    x = r.int("x", 0, 2)
    r.invariant("not_zero", holds=x != 0, repair={x: 1})
    r.invariant("not_one", holds=x != 1, repair={x: 0})
    r.event("noop", guard=False, effect={x: 2})
    with pytest.raises(NotConvergent) as info:
        r.build()
    cx = info.value.counterexample
    assert isinstance(cx, RepairCycle)
    assert [(s["x"], inv) for s, inv in cx.cycle] in (
        [(0, "not_zero"), (1, "not_one")],
        [(1, "not_one"), (0, "not_zero")],
    )
    assert "WFC fails" in str(info.value)


def test_domain_violation_names_the_state_never_clamps() -> None:
    r = Registry("overflow")
    stock = r.int("stock", 0, 5)
    r.event("restock", effect={stock: stock + 1})
    with pytest.raises(DomainViolation) as info:
        r.build()
    assert info.value.state == {"stock": 5} and info.value.variable == "stock" and info.value.value == 6
    assert "restock" in str(info.value)


def test_callable_rules_errors_are_reported_with_the_state() -> None:
    def build(guard: Any = True, effect: Any = None) -> None:
        r = Registry("callables")
        r.int("n", 0, 3)
        r.event("e", guard=guard, effect=effect or (lambda s: {"n": s["n"]}))
        r.build()

    with pytest.raises(RuleError, match="raised ZeroDivisionError") as info:
        build(effect=lambda s: {"n": 1 // (s["n"] - 2) + 1})
    assert info.value.state == {"n": 2}
    with pytest.raises(RuleError, match="must return a bool"):
        build(guard=lambda s: s["n"])
    with pytest.raises(RuleError, match="must return a mapping"):
        build(effect=lambda s: 3)
    with pytest.raises(DomainViolation):
        build(effect=lambda s: {"n": s["n"] + 1})
    with pytest.raises(RuleError, match="unknown variable"):
        build(effect=lambda s: {"m": 1})
    calls = iter(range(10**6))
    with pytest.raises(RuleError, match="not deterministic"):
        build(guard=lambda s: next(calls) % 2 == 0)


def test_callables_get_traced_footprints_and_prune_soundly() -> None:
    r = Registry("traced")
    r.bool("a")
    r.bool("b")
    r.event("set_a", effect=lambda s: {"a": True})
    r.event("set_b", guard=lambda s: not s["a"] or True, effect=lambda s: {"b": True})
    m = r.build()
    assert m.report.footprints == {"set_a": ("a",), "set_b": ("a", "b")}
    assert m.report.pairs_pruned == ()  # set_b's guard reads a: not disjoint
    assert m.report.trusted_callables == ("event set_a", "event set_b")
    assert m.rules()["events"][0]["effect"] is None


def test_a_rule_that_changes_the_registry_is_refused() -> None:
    r = Registry("sneaky")
    r.bool("a")

    def guard(s: Any) -> bool:
        r.bool(f"x{time.perf_counter_ns()}")
        return True

    r.event("e", guard=guard, effect={"a": True})
    with pytest.raises(DeclarationError):
        r.build()


def test_state_space_too_large_fails_fast_with_size_and_memory() -> None:
    r = Registry("huge")
    flags = [r.bool(f"f{i}") for i in range(40)]
    r.event("e", effect={flags[0]: True})
    start = time.perf_counter()
    with pytest.raises(StateSpaceTooLarge) as info:
        r.build()
    assert time.perf_counter() - start < 5
    assert info.value.states == 2**40
    assert "1,099,511,627,776 states" in str(info.value) and "GiB" in str(info.value)
    small = Registry("capped")
    x = small.int("x", 0, 999)
    small.event("e", effect={x: 0})
    with pytest.raises(StateSpaceTooLarge, match="max_states"):
        small.build(max_states=100)


def test_initial_state_declared_or_normalized() -> None:
    r = Registry("init")
    a, b = r.bool("a"), r.int("b", 1, 3)
    r.invariant("b_big", holds=b >= 2, repair={b: 2})
    r.event("e", effect={a: True})
    assert dict(r.build().initial) == {"a": False, "b": 2}
    r.initial(b=3)
    m = r.build()
    assert dict(m.initial) == {"a": False, "b": 3} and m.rules()["initial"] == [0, 3]
    r.initial(b=1)
    with pytest.raises(DeclarationError, match="violates invariant 'b_big'"):
        r.build()


def test_reachable_domain_is_sound_from_the_initial_state() -> None:
    # From the unreachable valid state x=2 the two events disagree; from x=0 they never get there.
    r = Registry("reach")
    x = r.int("x", 0, 2)
    y = r.bool("y")
    r.event("a", guard=x == 2, effect={y: True})
    r.event("b", guard=x == 2, effect={y: False})
    with pytest.raises(NotConvergent):
        r.build("valid")
    m = r.build("reachable")
    assert m.report.domain == "reachable" and m.report.domain_states == 1
    assert m.in_domain(m.initial) and not m.in_domain(m.state(x=2))
    assert "From the initial state" in m.report.guarantee


def test_undeclared_pairs_become_obligations_not_failures() -> None:
    r = Registry("obl")
    a, b = r.bool("a"), r.bool("b")
    r.event("set_a", effect={a: True})
    r.event("copy", effect={b: a})
    r.event("noop_b", guard=b & ~b, effect={b: True})
    r.independent("set_a", "noop_b")
    m = r.build()
    assert [d.events for d in m.report.obligations] == [("set_a", "copy")]
    w = m.report.obligations[0]
    assert w.first_result != w.second_result


def test_cc2_holds_and_is_stated_when_it_holds() -> None:
    r = Registry("flags")
    f = [r.bool(f"f{i}") for i in range(3)]
    r.invariant("c0", holds=~f[0] | f[1], repair={f[1]: True})
    for i in range(3):
        r.event(f"set{i}", effect={f[i]: True})
    m = r.build()
    assert m.report.cc2 and m.report.cc2_witness is None
    assert any("Newman" in t for t in m.report.theorems)
    assert "CC2 holds too" in m.report.guarantee
    # The Rocq confluence theorem needs CC1 on every valid state: a "reachable" build does not claim it.
    reachable = r.build("reachable")
    assert reachable.report.cc2 and not any("Newman" in t for t in reachable.report.theorems)
    assert reachable.report.oracle["theorem"] == "Govern.TableCheck.check_tables_trace"


def test_report_roundtrips_through_json() -> None:
    rep = orders().build().report
    data = json.loads(json.dumps(rep.to_dict()))
    again = Report.from_dict(data)
    assert again.to_dict() == rep.to_dict()
    assert again.text() == rep.text()


def test_public_names_carry_the_public_module() -> None:
    assert govern.Registry.__module__ == "govern"
    assert govern.NotConvergent.__module__ == "govern"
    assert issubclass(govern.NotConvergent, govern.GovernError)
    assert sorted(govern.__all__) == govern.__all__


def test_a_registry_needs_variables_and_events() -> None:
    r = Registry("empty")
    with pytest.raises(DeclarationError, match="no variables"):
        r.build()
    x = r.int("x", 5, 5)
    with pytest.raises(DeclarationError, match="no events"):
        r.build()
    r.event("keep", effect={x: 5})
    assert dict(r.build().replay(["keep", "keep"])) == {"x": 5}


def _shifted(offset: int, size: int) -> govern.Machine:
    """One machine over x in [offset, offset + size): the same rules wherever its values lie."""
    r = Registry("shifted")
    x = r.int("x", offset, offset + size - 1)
    flag = r.bool("flag")
    r.invariant("flag_only_high", holds=~flag | (x >= offset + 2), repair={flag: False})
    r.event("set", effect={x: offset + 1})  # a constant assignment
    r.event("bump", guard=x < offset + size - 1, effect={x: x + 1})
    r.event("raise_flag", effect={flag: True})
    r.event("floor", effect={x: govern.max_(x, offset + 2)})
    r.independent("set", "raise_flag")  # they commute; the other pairs are obligations
    return r.build()


@pytest.mark.parametrize("offset", [10**10, -(5 * 10**11), 2**62 - 16, -(2**62)])
def test_int_values_anywhere_in_the_64_bit_range_build_like_small_ones(offset: int) -> None:
    """The docs allow an int variable's values anywhere within +-2**62: a machine whose values lie past
    int32 (enumerated, a few states) has the verdict, obligations and replays of the same machine at 0
    (a constant assignment there raised numpy's OverflowError, exit 3 from `govern certify`)."""
    small, big = _shifted(0, 6), _shifted(offset, 6)
    assert big.report.method == small.report.method
    assert [(o.events, o.condition) for o in big.report.obligations] == [
        (o.events, o.condition) for o in small.report.obligations
    ]
    for events in (["set"], ["bump", "raise_flag"], ["raise_flag", "set", "floor"], ["floor", "bump"]):
        s, b = small.replay(events), big.replay(events)
        assert (b["x"] - offset, b["flag"]) == (s["x"], s["flag"]), events


def test_a_huge_domain_below_int32_is_decided_symbolically() -> None:
    """A variable of 10**12 values from -5*10**11 takes the symbolic route; its small-model pre-pass
    enumerates a representative machine that kept the low bound, and crashed there."""
    machine, small = _shifted(-(5 * 10**11), 10**12), _shifted(0, 6)
    assert machine.report.method == "symbolic"
    assert [o.events for o in machine.report.obligations] == [o.events for o in small.report.obligations]
    assert machine.replay(["set", "bump"])["x"] == -(5 * 10**11) + 2
