"""The oracle gate fails closed: no machine unless the proof-derived oracle agrees and certifies.

The real oracle runs on every build in the other tests; here it is replaced by ones that lie, refuse,
or are missing, to show each outcome is a distinct loud error and never a machine.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np
import pytest
from test_govern_build import orders

import govern.oracle as oracle
from govern import DeclarationError, OracleDisagreement, OracleRejected, OracleUnavailable, Registry

REAL = oracle.check_tables


def _tampered(**changes: Any) -> Any:
    def check(**kwargs: Any) -> Any:
        verdict = REAL(**kwargs)
        fields = {k: (v(verdict) if callable(v) else v) for k, v in changes.items()}
        return dataclasses.replace(verdict, **fields)

    return check


def test_the_real_oracle_certifies_and_is_named_in_the_report() -> None:
    rep = orders().build().report
    assert rep.oracle is not None
    assert rep.oracle["identity"]["generated_sha256"] == oracle.ORACLE_IDENTITY.generated_sha256
    assert rep.oracle["theorem"] in oracle.ORACLE_IDENTITY.theorems


@pytest.mark.parametrize(
    "changes",
    [
        {"nf": lambda v: np.roll(v.nf, 1)},
        {"max_depth": 7},
        {"cc2": True},
        {"domain_size": 1},
        {"cc1": False, "certified": False, "cc1_witness": (0, 2, 0)},
        {"wfc": False, "certified": False},
        {"obligations": ((0, 1),)},  # the oracle's delivery rules differ from the engine's
        {"not_idempotent": ()},
    ],
)
def test_any_disagreement_raises_and_builds_nothing(
    monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any]
) -> None:
    monkeypatch.setattr(oracle, "check_tables", _tampered(**changes))
    with pytest.raises(OracleDisagreement, match="DISAGREE"):
        orders().build()


def test_an_uncertified_verdict_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oracle, "check_tables", _tampered(certified=False))
    with pytest.raises(OracleRejected):
        orders().build()


def test_an_oracle_that_gives_no_verdict_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**kwargs: Any) -> Any:
        raise oracle.OracleNoVerdict("extracted checker failed")

    monkeypatch.setattr(oracle, "check_tables", refuse)
    with pytest.raises(OracleUnavailable, match="no verdict"):
        orders().build()


def test_a_missing_oracle_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "govern.oracle", None)
    monkeypatch.delattr(sys.modules["govern"], "oracle", raising=False)
    with pytest.raises(OracleUnavailable, match="cannot be loaded"):
        orders().build()


@pytest.mark.parametrize("where", ["guard", "effect", "holds", "repair"])
def test_a_rule_the_rules_checker_cannot_read_is_refused_before_the_build_not_by_the_oracle(
    where: str,
) -> None:
    """The rules checker reads expressions at most 120 operators deep; a build whose rules need more is a
    DeclarationError naming the rule, raised before any table is built (the oracle would fail with
    OracleUnavailable, which reads as a bug). 120 deep builds and the oracle accepts it."""

    def registry(depth: int) -> Registry:
        r = Registry(f"deep_{where}")
        x = r.int("x", 0, 3)
        flag = r.bool("flag")
        cond = x < 3  # 1 deep
        for _ in range(depth - 1):  # each `| flag` adds 1
            cond = cond | flag
        if where == "guard":
            r.event("e", guard=cond, effect={x: 0})
        elif where == "effect":
            r.event("e", guard=flag, effect={flag: ~cond})
        elif where == "holds":
            r.invariant("i", holds=cond | (x == 3), repair={x: 0})
        else:
            r.invariant("i", holds=~flag, repair={flag: ~cond})
        if where in ("holds", "repair"):
            r.event("tick", guard=x < 3, effect={x: x + 1})
        return r

    extra = {"guard": 0, "effect": 1, "holds": 1, "repair": 1}[where]
    fits = registry(120 - extra).build()
    assert fits.report.oracle is not None and "checked" in fits.report.oracle["rules_checked"]
    with pytest.raises(DeclarationError, match=r"nests 121 operators deep.*reads at most 120"):
        registry(121 - extra).build()
