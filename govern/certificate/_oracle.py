"""How certificate checking calls the proof-derived oracle (`govern.oracle`).

The oracle is extracted from our Rocq development; this module only converts a certificate's decoded
tables and machine JSON into the oracle's inputs and its answers into plain results. It never
imports anything from outside this package.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ._model import MachineRules, initial_state

__all__ = ["OracleVerdict", "local_oracle_identity", "run_rules_oracle", "run_tables_oracle"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class OracleVerdict:
    """The table checker's answer: `certified`, and when not, `reason` in words."""

    certified: bool
    reason: str
    theorem: str
    cc2: bool | None
    max_depth: int | None
    domain_size: int | None


def local_oracle_identity() -> dict[str, str]:
    """The identity of the oracle installed here (what `govern check` runs), as strings."""
    from ..oracle import ORACLE_IDENTITY

    fields = dataclasses.asdict(ORACLE_IDENTITY)
    return {
        str(key): ",".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)
        for key, value in fields.items()
    }


def run_tables_oracle(
    machine: MachineRules, valid: IntArray, repair: IntArray, apply: IntArray
) -> OracleVerdict:
    """Run the extracted table checker over the certificate's tables.

    Malformed tables (as the oracle's front end sees them) are a rejection, not an error; an oracle
    that gives no verdict raises `OracleNoVerdict` (an internal error, never a pass).
    """
    from ..oracle import OracleInputError, check_tables

    events = len(machine.events)
    pairs = None if machine.independent is None else [(int(a), int(b)) for a, b in machine.independent]
    try:
        result = check_tables(
            valid=valid.astype(np.bool_),
            repair=repair,
            apply=apply.reshape(events, len(valid)),
            pairs=pairs,
            domain=machine.domain,
            initial=initial_state(machine),
        )
    except OracleInputError as exc:
        return OracleVerdict(False, f"malformed tables: {exc}", "", None, None, None)
    if result.certified:
        reason = ""
    elif not result.wfc:
        reason = "repair does not terminate from every state (WFC)"
    elif not result.initial_valid:
        reason = "the initial state is not valid"
    elif not result.cc1:
        reason = f"a checked pair does not commute (events, state: {result.cc1_witness})"
    else:
        reason = "the checked domain is not closed under steps"
    return OracleVerdict(
        certified=bool(result.certified),
        reason=reason,
        theorem=str(result.theorem),
        cc2=bool(result.cc2),
        max_depth=int(result.max_depth),
        domain_size=int(result.domain_size),
    )


def run_rules_oracle(
    machine: MachineRules, valid: IntArray, repair: IntArray, apply: IntArray
) -> tuple[str | None, str]:
    """Run the extracted rules checker: it recomputes the tables from the machine JSON and compares
    them with the certificate's. Returns (None, theorem) when they are identical, else (what differs,
    theorem)."""
    from .. import oracle

    events = len(machine.events)
    try:
        result = oracle.check_rules(
            rules=machine.model_dump(mode="json"),
            valid=valid.astype(np.bool_),
            repair=repair,
            apply=apply.reshape(events, len(valid)),
        )
    except oracle.OracleInputError as exc:
        return f"the rules checker refuses the rules: {exc}", ""
    except oracle.OracleNoVerdict as exc:
        # The checker evaluates in signed 64-bit integers and stops when a sum or product could leave
        # them. govern's own build runs the same checker, so it never certifies such rules: a certificate
        # whose rules overflow was not made by govern, and its tables cannot be confirmed. Any other
        # missing verdict is a bug and stays one (exit 3).
        if isinstance(exc.__cause__, OverflowError):
            return (
                f"the rules' integer arithmetic leaves the signed 64-bit range ({exc.__cause__}); "
                "govern never certifies such rules, so the tables cannot be confirmed",
                "",
            )
        raise
    if not result.matches:
        return str(result.detail), str(result.theorem)
    return None, str(result.theorem)
