"""Delivery rules: what a built machine's report says about the order and repetition of its events.

From `Machine.report`: the causal-order obligations (undeclared pairs that do not commute on the
checked domain; two events of one record forming such a pair must be applied in log order) and the
events that are not idempotent (a redelivery would change the state; replicas deduplicate). Both lists
are the proof-derived oracle's: a build fails unless the engine's equal the ones the oracle computes
over every pair and event, and `Machine.load` re-checks them. Every other pair of events commutes on
the checked domain (`Govern.Delivery.check_tables_delivery`), so any delivery keeping the obligation
pairs in log order reaches the log-order state (`Govern.Delivery.check_tables_replica`). The rules
also carry the machine's step table, so a replica folds an event with one array lookup.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..machine._machine import Machine

__all__ = ["DeliveryRules", "Outcome", "delivery_rules"]

_cache: weakref.WeakKeyDictionary[Machine, DeliveryRules] = weakref.WeakKeyDictionary()
_ROWS_MAX = 1 << 20  # step-table cells kept as Python lists
_CACHE_MAX = 1 << 16  # decoded states and explained outcomes remembered per machine


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one event did to a state: "applied", "no-op" (nothing changed) or "compensated" (the
    effect broke an invariant and repair changed the result); `why` says it in words."""

    kind: Literal["applied", "no-op", "compensated"]
    why: str
    after: int


@dataclass(frozen=True, eq=False)
class DeliveryRules:
    """A machine's runtime view for replicas and event tools (see the module docstring)."""

    machine: Machine
    name: str
    digest: str
    names: tuple[str, ...]
    index: dict[str, int]
    initial: int
    table: npt.NDArray[np.int32]
    partners: tuple[frozenset[int], ...]
    obligations: frozenset[tuple[str, str]]
    not_idempotent: frozenset[str]
    # The step table as nested Python lists for machines up to _ROWS_MAX cells (a list lookup costs a
    # fraction of a numpy scalar lookup); None for bigger machines, composed or symbolic ones (whose table
    # is a view computed entry by entry): `table[event, state]` is looked up then.
    rows: list[list[int]] | None = field(default=None, repr=False)
    _decoded: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    _explained: dict[tuple[int, int], Outcome] = field(default_factory=dict, repr=False)

    def step(self, state: int, event: int) -> int:
        """The state after `event` (an index) at `state`: one lookup in the normalized step table."""
        rows = self.rows
        if rows is None:
            return int(self.table[event, state])
        return rows[event][state]

    def decode(self, state: int) -> dict[str, Any]:
        """The state id as `{variable: value}` (a fresh dict: the caller may change it)."""
        decoded = self._decoded.get(state)
        if decoded is None:
            decoded = dict(self.machine.state_of(state))
            if len(self._decoded) < _CACHE_MAX:
                self._decoded[state] = decoded
        return dict(decoded)

    def explain(self, state: int, event: int) -> Outcome:
        """What `event` does at the normal form `state`, in words a model can act on (remembered per
        state and event: a machine's tables never change)."""
        outcome = self._explained.get((state, event))
        if outcome is None:
            outcome = self._explain(state, event)
            if len(self._explained) < _CACHE_MAX:
                self._explained[state, event] = outcome
        return outcome

    def _explain(self, state: int, event: int) -> Outcome:
        tables = self.machine.tables()
        name = self.names[event]
        raw = int(tables.apply[event, state])
        after = self.step(state, event)
        if raw == state:
            # The tables cannot tell a false guard from an effect that rewrites the same values.
            why = (
                f"{name} changed nothing: its guard does not hold in {_fmt(self.decode(state))}, "
                "or its effect leaves that state as it is"
            )
            return Outcome("no-op", why, after)
        if after != raw:
            effect, repaired = self.decode(raw), self.decode(after)
            changes = ", ".join(
                f"{k}: {effect[k]!r} -> {repaired[k]!r}" for k in effect if effect[k] != repaired[k]
            )
            return Outcome(
                "compensated",
                f"{name} produced {_fmt(effect)}, which breaks an invariant; repair changed {changes}",
                after,
            )
        return Outcome("applied", f"{name} applied", after)


def _fmt(state: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v!r}" for k, v in state.items()) + "}"


def delivery_rules(machine: Machine) -> DeliveryRules:
    """The delivery rules of a built machine (computed once per machine)."""
    if not isinstance(machine, Machine):
        raise TypeError(f"expected a govern.Machine (Registry.build() or Machine.load()), not {machine!r}")
    cached = _cache.get(machine)
    if cached is not None:
        return cached
    names = tuple(machine.events)
    index = {n: i for i, n in enumerate(names)}
    report = machine.report
    pairs: set[tuple[str, str]] = set()
    partners: list[set[int]] = [set() for _ in names]
    for witness in report.obligations:
        a, b = witness.events[0], witness.events[1]
        pairs.add((a, b))
        partners[index[a]].add(index[b])
        partners[index[b]].add(index[a])
    table = machine.tables().step
    rules = DeliveryRules(
        machine=machine,
        name=machine.name,
        digest=machine.digest,
        names=names,
        index=index,
        initial=machine.initial.id,
        table=table,
        # A composed or symbolic machine's table is a per-entry view, never a list of rows.
        rows=table.tolist() if isinstance(table, np.ndarray) and table.size <= _ROWS_MAX else None,
        partners=tuple(frozenset(p) for p in partners),
        obligations=frozenset(pairs),
        not_idempotent=frozenset(w.events[0] for w in report.not_idempotent),
    )

    _cache[machine] = rules
    return rules
