"""The extracted rules checker against a brute-force reading of docs/semantics.md on random machines."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import govern.oracle as oracle
from govern.oracle import OracleInputError, check_rules

from ._rules_brute import random_machine, tables


def run(rules: dict[str, Any], valid: list[bool], repair: list[int],
        apply: list[list[int]]) -> oracle.RulesVerdict:
    n = len(valid)
    return check_rules(rules=rules, valid=np.array(valid, dtype=bool),
                       repair=np.array(repair, dtype=np.int64),
                       apply=np.array(apply, dtype=np.int64).reshape(len(apply), n))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32))
def test_rules_checker_agrees_with_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    rules = random_machine(rng)
    valid, repair, apply, violation = tables(rules)
    verdict = run(rules, valid, repair, apply)
    assert verdict.matches == (not violation), verdict.detail
    assert verdict.theorem == oracle.THEOREM_RULES


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 2**16))
def test_any_changed_entry_is_caught(seed: int, where: int) -> None:
    rng = random.Random(seed)
    rules = random_machine(rng)
    valid, repair, apply, violation = tables(rules)
    n = len(valid)
    if n < 2:
        return
    which = where % (2 + len(apply))
    s = (where // 7) % n
    if which == 0:
        valid[s] = not valid[s]
        want = "validity"
    elif which == 1:
        repair[s] = (repair[s] + 1) % n
        want = "repair"
    else:
        row = apply[which - 2]
        row[s] = (row[s] + 1) % n
        want = f"event 'e{which - 2}'"
    verdict = run(rules, valid, repair, apply)
    assert not verdict.matches
    if not violation:
        assert want in verdict.detail


def test_orders_machine_from_the_semantics_page() -> None:
    rules: dict[str, Any] = {
        "name": "orders",
        "variables": [
            {"name": "status", "kind": "enum", "labels": ["pending", "paid", "shipped", "cancelled"]},
            {"name": "paid", "kind": "bool"},
            {"name": "stock", "kind": "int", "min": 0, "max": 5},
        ],
        "initial": [0, 0, 0],
        "invariants": [{"name": "no_ship_unpaid",
                        "holds": ["or", ["not", ["eq", ["var", 0], ["lit", 2]]], ["var", 1]],
                        "repair": [[0, ["lit", 0]]]}],
        "events": [{"name": "pay", "guard": ["eq", ["var", 0], ["lit", 0]],
                    "effect": [[0, ["lit", 1]], [1, ["lit", 1]]]}],
        "independent": [[0, 2]],
        "domain": "valid",
    }
    valid, repair, apply, violation = tables(rules)
    assert not violation
    assert run(rules, valid, repair, apply).matches
    # a domain violation: stock := stock + 1 without a guard
    events: list[Any] = rules["events"]
    events.append({"name": "restock", "guard": ["lit", 1], "effect": [[2, ["add", ["var", 2], ["lit", 1]]]]})
    valid, repair, apply, violation = tables(rules)
    assert violation
    verdict = run(rules, valid, repair, apply)
    assert not verdict.matches and "restock" in verdict.detail


GOOD: dict[str, Any] = {
    "name": "m",
    "variables": [{"name": "a", "kind": "bool"}],
    "initial": [0],
    "invariants": [],
    "events": [{"name": "set", "guard": ["lit", 1], "effect": [[0, ["lit", 1]]]}],
    "independent": None,
    "domain": "valid",
}


@pytest.mark.parametrize(
    "change",
    [
        {"variables": []},
        {"variables": [{"name": "a", "kind": "int", "min": 2, "max": 1}]},
        {"variables": [{"name": "a", "kind": "enum", "labels": ["x"]}]},
        {"events": [{"name": "set", "guard": None, "effect": None}]},
        {"events": [{"name": "set", "guard": ["lit", True], "effect": []}]},
        {"events": [{"name": "set", "guard": ["var", 1], "effect": []}]},
        {"events": [{"name": "set", "guard": ["pow", ["lit", 1]], "effect": []}]},
        {"events": [{"name": "set", "guard": ["add", ["lit", 1]], "effect": []}]},
        {"events": [{"name": "set", "guard": ["lit", 1], "effect": [[0, ["lit", 1]], [0, ["lit", 0]]]}]},
        {"invariants": [{"name": "i", "holds": ["not", ["lit", 0]], "repair": "x"}]},
    ],
)
def test_malformed_rules_give_no_verdict(change: dict[str, Any]) -> None:
    with pytest.raises(OracleInputError):
        check_rules(rules={**GOOD, **change}, valid=np.array([True, True]), repair=np.array([0, 1]),
                    apply=np.array([[1, 1]]))


def test_too_deep_expressions_are_refused() -> None:
    e: list[Any] = ["lit", 1]
    for _ in range(200):
        e = ["not", e]
    rules = {**GOOD, "events": [{"name": "set", "guard": e, "effect": []}]}
    with pytest.raises(OracleInputError):
        check_rules(rules=rules, valid=np.array([True, True]), repair=np.array([0, 1]),
                    apply=np.array([[0, 1]]))


def test_wrong_number_of_states_is_a_mismatch() -> None:
    verdict = check_rules(rules=GOOD, valid=np.array([True, True, True]), repair=np.array([0, 1, 2]),
                          apply=np.array([[1, 1, 1]]))
    assert not verdict.matches and "number of states" in verdict.detail


def test_the_largest_accepted_shapes_do_not_exhaust_the_python_stack() -> None:
    e: list[Any] = ["lit", 1]
    for _ in range(oracle._MAX_DEPTH):
        e = ["not", ["not", e]][1]
    k = oracle._MAX_VARS
    rules = {
        "name": "wide",
        "variables": [{"name": f"v{i}", "kind": "int", "min": 3, "max": 3} for i in range(k)],
        "initial": [3] * k,
        "invariants": [{"name": "deep", "holds": e, "repair": []}],
        "events": [{"name": "set", "guard": ["lit", 1], "effect": [[k - 1, ["var", 0]]]}],
        "independent": None,
        "domain": "valid",
    }
    verdict = check_rules(rules=rules, valid=np.array([True]), repair=np.array([0]), apply=np.array([[0]]))
    assert verdict.matches
