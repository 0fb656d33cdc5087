"""Compute vectors: the generated Python gives exactly the verdict Coq computes (vm_compute) on each case.

rocq/extracted/vectors.json is produced by `make -C rocq check` (rocq/gen/vectors.py), which runs the
table checker inside Coq on 156 fixed cases (repair cycles, non-commuting pairs, CC2 failures,
reachable domains, declared pairs, causal-order obligations, invalid initial states and malformed
tables; each summary includes the obligations and not-idempotent events), the witness checker
(check_tables_w) on the same 156 cases with right and wrong witnesses, and the rules checker
on 60 small machines (tables right, altered, or using assignments that leave a domain).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from ._conv import cons, mask, option_pairs, summary, vec

_generated: Any = importlib.import_module("govern.oracle._generated")

ALL = json.loads((Path(__file__).parents[2] / "rocq" / "extracted" / "vectors.json").read_text())
VECTORS = [r for r in ALL if "case" in r]
RULES = [r for r in ALL if "rules" in r]


def run(case: dict[str, Any]) -> list[int]:
    args = (
        mask([bool(v) for v in case["valid"]]),
        vec(case["repair"]),
        cons([vec(r) for r in case["apply"]]),
        option_pairs(case["pairs"]),
        case["reach"],
        case["init"],
    )
    if "witness" in case:
        w = case["witness"]
        return summary(_generated.c_check_tables_w(*args, vec(w["nf"]), vec(w["depth"])))
    return summary(_generated.c_check_tables(*args))


def test_vectors_cover_every_outcome() -> None:
    outcomes = {tuple(r["coq"][:3]) for r in VECTORS}
    assert (0, 0, 0) in outcomes  # malformed
    assert (1, 0, 0) in outcomes  # repair cycle
    assert (1, 1, 1) in outcomes  # certified
    assert any(r["coq"][2] == 1 and r["coq"][6] == 0 and r["coq"][5] == 1 for r in VECTORS)  # CC1 failure
    assert any(r["coq"][2] == 1 and r["coq"][7] == 0 for r in VECTORS)  # CC2 failure
    assert any(r["coq"][4] == 0 and r["coq"][2] == 1 for r in VECTORS)  # invalid initial state
    assert any(r["case"]["reach"] and r["coq"][1] == 1 for r in VECTORS)  # reachable domain certified
    witnessed = [r for r in VECTORS if "witness" in r["case"]]
    assert any(r["coq"][1] == 1 for r in witnessed)  # certified with a witness
    assert any(r["coq"][0] == 0 and _true_nf(r["case"]) is not None for r in witnessed)  # a wrong witness
    certified = [_delivery_counts(r["coq"]) for r in VECTORS if r["coq"][1] == 1]
    assert any(obligations > 0 for obligations, _ in certified)  # certified with causal-order obligations
    assert any(not_idem > 0 for _, not_idem in certified)  # certified with a not-idempotent event


def _delivery_counts(coq: list[int]) -> tuple[int, int]:
    """The numbers of obligations and not-idempotent events in a summary (see _conv.summary)."""
    i = 10 if coq[9] == 0 else 13
    obligations = coq[i]
    return obligations, coq[i + 1 + 2 * obligations]


def _true_nf(case: dict[str, Any]) -> list[int] | None:
    """The normal forms when repair is in range and terminates (so a malformed verdict blames the witness)."""
    n, valid, repair = len(case["valid"]), case["valid"], case["repair"]
    if any(not 0 <= r < n for r in repair):
        return None
    out = []
    for s in range(n):
        x = s
        for _ in range(n):
            x = repair[x] if not valid[x] else x
        if not valid[x]:
            return None
        out.append(x)
    return out


def test_witness_vectors_agree_with_the_plain_checker() -> None:
    """check_tables_w_eq, on the vectors: a well-formed verdict with a witness is the verdict without one."""
    plain = {json.dumps(r["case"]): r["coq"] for r in VECTORS if "witness" not in r["case"]}
    checked = 0
    for r in VECTORS:
        if "witness" in r["case"] and r["coq"][0] == 1:
            key = json.dumps({k: v for k, v in r["case"].items() if k != "witness"})
            assert r["coq"] == plain[key]
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("index", range(len(VECTORS)))
def test_generated_python_matches_coq(index: int) -> None:
    record = VECTORS[index]
    assert run(record["case"]) == record["coq"]


def expr(e: list[Any]) -> tuple[Any, ...]:
    tags = {"var": 0, "lit": 1, "add": 2, "sub": 3, "min": 4, "max": 5, "ite": 6, "eq": 7, "lt": 8, "le": 9,
            "and": 10, "or": 11, "not": 12}
    if e[0] in ("var", "lit"):
        return (tags[e[0]], e[1])
    return (tags[e[0]], *(expr(a) for a in e[1:]))


def rules_run(c: dict[str, Any]) -> list[int]:
    def rule(r: list[Any]) -> tuple[Any, ...]:
        return (0, expr(r[0]), cons([(0, i, expr(e)) for i, e in r[1]]))

    raw = _generated.c_check_rules(
        cons([(0, lo, size) for lo, size in c["vars"]]),
        cons([rule(r) for r in c["invs"]]),
        cons([rule(r) for r in c["evs"]]),
        mask([bool(v) for v in c["valid"]]),
        vec(c["repair"]),
        cons([vec(r) for r in c["apply"]]),
    )
    return [0] if raw == (1,) else [1, raw[1]]


def test_rules_vectors_cover_both_outcomes() -> None:
    assert {r["coq"][0] for r in RULES} == {0, 1}


@pytest.mark.parametrize("index", range(len(RULES)))
def test_generated_rules_checker_matches_coq(index: int) -> None:
    record = RULES[index]
    assert rules_run(record["rules"]) == record["coq"]
