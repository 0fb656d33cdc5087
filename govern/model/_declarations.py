"""Declarations as plain data: invariant and event rules, and the immutable `Snapshot` a build reads.

`Registry` (govern.machine) makes these; the verifier and the tables read them. Nothing here builds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ._expr import Expr
from ._space import VarSpec

__all__ = ["Assignment", "AssignmentFn", "ConditionFn", "Domain", "EventRule", "InvariantRule", "Snapshot"]

Domain: TypeAlias = Literal["valid", "reachable"]
#: An assignment as data: (variable position, expression) pairs, distinct and sorted by position.
Assignment: TypeAlias = tuple[tuple[int, Expr], ...]
ConditionFn: TypeAlias = Callable[[Any], Any]
AssignmentFn: TypeAlias = Callable[[Any], Any]


@dataclass(frozen=True)
class InvariantRule:
    """One invariant: a condition that must hold and the repair applied when it is the first violated."""

    name: str
    holds: Expr | ConditionFn
    repair: Assignment | AssignmentFn


@dataclass(frozen=True)
class EventRule:
    """One event: a guard and the effect applied when the guard holds (else the event is a no-op)."""

    name: str
    guard: Expr | ConditionFn
    effect: Assignment | AssignmentFn


@dataclass(frozen=True)
class Snapshot:
    """An immutable copy of a registry's declarations, taken when `build()` starts."""

    name: str
    vars: tuple[VarSpec, ...]
    invariants: tuple[InvariantRule, ...]
    events: tuple[EventRule, ...]
    independent: tuple[tuple[int, int], ...] | None
    initial: tuple[int, ...] | None

    def is_data(self) -> bool:
        """True when every rule is an expression (no Python callables)."""
        parts: list[object] = [i.holds for i in self.invariants] + [i.repair for i in self.invariants]
        parts += [e.guard for e in self.events] + [e.effect for e in self.events]
        return not any(callable(p) for p in parts)

    def rules_json(self, domain: Domain) -> dict[str, Any]:
        """The machine as data, exactly the JSON object of docs/semantics.md."""
        return {
            "name": self.name,
            "variables": [v.to_json() for v in self.vars],
            "initial": list(self.initial) if self.initial is not None else None,
            "invariants": [
                {"name": i.name, "holds": _cond_json(i.holds), "repair": _assign_json(i.repair)}
                for i in self.invariants
            ],
            "events": [
                {"name": e.name, "guard": _cond_json(e.guard), "effect": _assign_json(e.effect)}
                for e in self.events
            ],
            "independent": [list(p) for p in self.independent] if self.independent is not None else None,
            "domain": domain,
        }


def _cond_json(c: Expr | ConditionFn) -> Any:
    return c.to_json() if isinstance(c, Expr) else None


def _assign_json(a: Assignment | AssignmentFn) -> Any:
    return [[i, e.to_json()] for i, e in a] if isinstance(a, tuple) else None
