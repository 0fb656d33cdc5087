"""The build hands the engine's normal forms and repair depths to the oracle as a witness it checks.

The witness is never trusted: when the engine's depths or normal forms are wrong, the build raises
`OracleDisagreement` (naming the witness, and what the oracle's own re-check found) and returns nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import govern.oracle as oracle
import govern.verify._verify as verify_module
from govern import OracleDisagreement, Registry


def counter() -> Registry:
    """0..3 with an invariant "below 3" repaired by stepping down: repair depths 0, 0, 0, 1."""
    r = Registry("witness-counter")
    x = r.int("x", 0, 3)
    r.invariant("below3", holds=x < 3, repair={x: x - 1})
    r.event("inc", guard=x < 3, effect={x: x + 1})
    return r


def test_the_build_hands_the_witness_and_the_oracle_accepts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    real = oracle.check_tables

    def spy(**kwargs: Any) -> Any:
        seen.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(oracle, "check_tables", spy)
    machine = counter().build()
    assert machine.report.max_repair_depth == 1
    assert len(seen) == 1 and [int(d) for d in seen[0]["depth"]] == [0, 0, 0, 1]
    assert [int(s) for s in seen[0]["nf"]] == [0, 1, 2, 2]


@pytest.mark.parametrize("where", ["depth", "nf"])
def test_a_wrong_engine_witness_is_a_disagreement(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    real = verify_module.normal_forms

    def wrong(valid: Any, repair: Any) -> Any:
        nf, depth, stuck = real(valid, repair)
        if where == "depth":
            depth = depth.copy()
            depth[0] += 1  # a valid state with depth 1
        else:
            nf = nf.copy()
            nf[3] = 1  # a normal form that repair does not reach
        return nf, depth, stuck

    monkeypatch.setattr(verify_module, "normal_forms", wrong)
    with pytest.raises(OracleDisagreement, match="termination witness"):
        counter().build()


def test_a_valid_machine_is_certified_with_and_without_the_witness() -> None:
    valid = np.array([True, True, True, False])
    repair = np.array([0, 1, 2, 2], dtype=np.int32)
    apply = np.array([[1, 2, 3, 3], [0, 0, 0, 0]], dtype=np.int32)
    kwargs: dict[str, Any] = {"valid": valid, "repair": repair, "apply": apply, "pairs": None,
                              "domain": "reachable", "initial": 0}
    plain = oracle.check_tables(**kwargs)
    witnessed = oracle.check_tables(**kwargs, nf=np.array([0, 1, 2, 2], dtype=np.int32),
                                    depth=np.array([0, 0, 0, 1], dtype=np.int32))
    assert (plain.certified, plain.max_depth, plain.domain_size, plain.cc1_witness) == (
        witnessed.certified, witnessed.max_depth, witnessed.domain_size, witnessed.cc1_witness)
    assert [int(s) for s in witnessed.nf] == [int(s) for s in plain.nf]
