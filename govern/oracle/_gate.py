"""The oracle gate: no machine unless the checker extracted from our Rocq proof agrees (fail closed).

On every build the engine's tables (validity, one-step repair, raw apply over all states) go to
`govern.oracle.check_tables`, with the engine's normal forms and repair depths as a witness that the
oracle checks (in one pass, instead of iterating repair itself) and never trusts. The engine's own
results (normal forms, WFC, repair depth, CC1 on D, CC2, domain size) must equal the oracle's, and the
oracle must certify; anything else raises and the build produces nothing. There is no switch to skip
this. The delivery rules replicas run by (the causal-order obligations and the events that are not
idempotent) must also equal the oracle's, which it computes over every pair and every event.

When every rule is an expression, the rules checker (`check_rules`) also confirms, on every build
whatever its size, that the tables are exactly what the rules mean (rules as Python callables have no
expression to check: the report says so).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import OracleDisagreement, OracleRejected, OracleUnavailable

__all__ = ["certified_record", "oracle_identity", "oracle_module", "run_gate"]


def oracle_module() -> Any:
    """The proof-derived oracle (`govern.oracle`), or `OracleUnavailable` when it cannot be loaded."""
    try:
        from .. import oracle
    except Exception as exc:  # any import failure leaves us without an oracle: fail closed
        raise OracleUnavailable(
            f"the proof-derived oracle (govern.oracle) cannot be loaded: {exc}; "
            "no machine is built without it. Reinstall the package."
        ) from exc
    return oracle


def oracle_identity() -> dict[str, Any]:
    """The oracle's identity (module and proof hashes, Coq version, theorem names), JSON-ready."""
    ident = oracle_module().ORACLE_IDENTITY
    return {
        "coq_version": ident.coq_version,
        "proof_sha256": ident.proof_sha256,
        "json_sha256": ident.json_sha256,
        "generated_sha256": ident.generated_sha256,
        "generator_sha256": ident.generator_sha256,
        "prims_sha256": ident.prims_sha256,
        "frontend_sha256": ident.frontend_sha256,
        "axiom_gate_sha256": ident.axiom_gate_sha256,
        "theorems": list(ident.theorems),
    }


def run_gate(
    *,
    rules: dict[str, Any],
    data_rules: bool,
    valid: npt.NDArray[np.bool_],
    repair: npt.NDArray[np.int32],
    apply: npt.NDArray[np.int32],
    nf: npt.NDArray[np.int32],
    independent: tuple[tuple[int, int], ...] | None,
    domain: str,
    initial: int,
    max_depth: int,
    cc2: bool,
    domain_size: int,
    obligations: list[tuple[int, int]],
    not_idempotent: list[int],
    depth: npt.NDArray[np.int32] | None = None,
) -> dict[str, Any]:
    """Have the oracle re-check the tables (and rules); returns its identity and verdict for the
    report, or raises `OracleUnavailable`, `OracleRejected` or `OracleDisagreement`.

    `depth` (the engine's repair depth of every state), when given, goes with `nf` to the oracle as a
    witness it checks instead of iterating repair itself. A witness the oracle rejects is a
    disagreement; the oracle then re-checks without it, so the error says where the engine erred.

    `obligations` (pairs of event indices, a < b) and `not_idempotent` (event indices) are the
    engine's delivery rules; the oracle computes both over every pair and every event, and they must
    be equal (`Govern.Delivery.check_tables_delivery` proves the oracle's lists exactly right)."""
    oracle = oracle_module()
    pairs = None if independent is None else [(int(a), int(b)) for a, b in independent]
    tables: dict[str, Any] = {
        "valid": valid, "repair": repair, "apply": apply, "pairs": pairs, "domain": domain,
        "initial": int(initial),
    }
    problems = []
    try:
        try:
            v = oracle.check_tables(**tables, **({} if depth is None else {"nf": nf, "depth": depth}))
        except oracle.OracleInputError:
            if depth is None:
                raise
            # The engine's normal forms or depths failed the oracle's check. Re-check without them:
            # the oracle's own results then say where the engine went wrong.
            v = oracle.check_tables(**tables)
            problems.append(
                "the engine's normal forms and repair depths failed the oracle's check of them as a "
                "termination witness"
            )
    except oracle.OracleError as exc:
        raise OracleUnavailable(f"the oracle gave no verdict on the engine's tables: {exc}") from exc
    if not v.wfc:
        problems.append("WFC: the engine found repair terminating from every state, the oracle did not")
    else:
        if int(v.max_depth) != max_depth:
            problems.append(f"max repair depth: engine {max_depth}, oracle {v.max_depth}")
        oracle_nf = np.asarray(v.nf)
        if oracle_nf.shape != nf.shape or not np.array_equal(oracle_nf, nf):
            problems.append(f"normal forms differ (first at state id {_first_difference(oracle_nf, nf)})")
        if not v.cc1:
            problems.append(
                f"CC1: the engine found every checked pair commuting on D, the oracle reports a "
                f"witness {v.cc1_witness}"
            )
        if bool(v.cc2) != cc2:
            problems.append(f"CC2: engine {cc2}, oracle {bool(v.cc2)}")
        if int(v.domain_size) != domain_size:
            problems.append(f"checked domain size: engine {domain_size}, oracle {v.domain_size}")
        if v.certified:
            problems += _delivery_problems(v, obligations, not_idempotent)
    if problems:
        raise OracleDisagreement(
            f"ENGINE AND PROOF-DERIVED ORACLE DISAGREE on machine {rules['name']!r}; no "
            "machine is built. This is a bug: please report it with the registry.\n  - "
            + "\n  - ".join(problems)
        )
    if not v.certified:
        raise OracleRejected(
            f"the proof-derived oracle did not certify machine {rules['name']!r} "
            f"(theorem {v.theorem}); no machine is built"
        )
    if not data_rules:
        rules_checked = "not applicable: some rules are Python callables (only the tables were checked)"
    else:
        try:
            r = oracle.check_rules(rules=rules, valid=valid, repair=repair, apply=apply)
        except oracle.OracleError as exc:
            raise OracleUnavailable(
                f"the rules oracle gave no verdict on the machine's rules: {exc}"
            ) from exc
        if not r.matches:
            raise OracleDisagreement(
                f"ENGINE AND PROOF-DERIVED ORACLE DISAGREE on machine {rules['name']!r}: "
                f"the tables are not what the rules mean: {r.detail}. No machine is built; "
                "please report this bug with the registry."
            )
        rules_checked = f"checked: the tables are exactly what the rules mean ({r.theorem})"
    return certified_record(v, rules_checked)


def certified_record(v: Any, rules_checked: str) -> dict[str, Any]:
    """What a report records of the oracle that certified a machine: its verdict `v` (the oracle's own
    answer), the delivery rules it derived, how the rules were checked, and which oracle it was."""
    oracle = oracle_module()
    identity = oracle_identity()
    return {
        "verdict": "certified",
        "theorem": str(v.theorem),
        "delivery": {
            "obligations": [list(p) for p in v.obligations],
            "not_idempotent": list(v.not_idempotent),
            "theorem": oracle.THEOREM_DELIVERY,
        },
        "rules_checked": rules_checked,
        "identity": identity,
        "module_sha256": identity["generated_sha256"],
    }


def _delivery_problems(v: Any, obligations: list[tuple[int, int]], not_idempotent: list[int]) -> list[str]:
    """Where the engine's delivery rules differ from the oracle's (computed over every pair and event)."""
    problems = []
    engine_pairs = sorted((min(a, b), max(a, b)) for a, b in obligations)
    oracle_pairs = sorted(tuple(p) for p in v.obligations)
    if engine_pairs != oracle_pairs:
        problems.append(
            f"causal-order obligations: engine {engine_pairs}, oracle {oracle_pairs} (the oracle checks "
            "every pair; the engine skips pairs whose footprints are disjoint)"
        )
    if sorted(not_idempotent) != sorted(v.not_idempotent):
        problems.append(
            f"not-idempotent events: engine {sorted(not_idempotent)}, oracle {sorted(v.not_idempotent)}"
        )
    return problems


def _first_difference(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> int | str:
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    return int(np.argmax(a != b))
