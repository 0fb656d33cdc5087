"""Delivery rules: what a built machine's report says about the order and repetition of its events.

From `Machine.report`: the causal-order obligations (undeclared pairs that do not commute on the
checked domain; two events of one record forming such a pair must be applied in log order) and the
events that are not idempotent (a redelivery would change the state; replicas deduplicate). Every other
pair of events commutes on the checked domain. The rules also carry the machine's step table, so a replica
folds an event with one array lookup.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..machine._machine import Machine

__all__ = ["DeliveryRules", "Outcome", "delivery_rules"]

_cache: weakref.WeakKeyDictionary[Machine, DeliveryRules] = weakref.WeakKeyDictionary()


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

    def step(self, state: int, event: int) -> int:
        """The state after `event` (an index) at `state`: one lookup in the normalized step table."""
        return int(self.table[event, state])

    def decode(self, state: int) -> dict[str, Any]:
        """The state id as `{variable: value}`."""
        return dict(self.machine.state_of(state))

    def explain(self, state: int, event: int) -> Outcome:
        """What `event` does at the normal form `state`, in words a model can act on."""
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
    rules = DeliveryRules(
        machine=machine,
        name=machine.name,
        digest=machine.digest,
        names=names,
        index=index,
        initial=machine.initial.id,
        table=machine.tables().step,
        partners=tuple(frozenset(p) for p in partners),
        obligations=frozenset(pairs),
        not_idempotent=frozenset(w.events[0] for w in report.not_idempotent),
    )
    _cache[machine] = rules
    return rules
