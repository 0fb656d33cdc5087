"""Witnesses a person can read: repair cycles, diverging event orders, CC2 and idempotence witnesses.

Every witness is plain data (states as `{variable: value}`), renders to text, and converts to a
JSON-ready dict. They are produced from the engine's tables by `trace`, which replays one event from
one state and records the effect and every repair that fired.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..model._space import Space, Value

__all__ = [
    "Counterexample",
    "Divergence",
    "RepairCycle",
    "Step",
    "divergence_from_dict",
    "trace",
    "trace_normalize",
]

StateDict = dict[str, Value]


@dataclass(frozen=True)
class Step:
    """One normalized step: the event, whether applying it changed the state (False when its guard
    was false or its effect rewrote the same values), the state after its effect, each repair that
    fired (invariant name, state after it), and the resulting normal form."""

    event: str
    changed: bool
    after_effect: StateDict
    repairs: tuple[tuple[str, StateDict], ...]
    result: StateDict

    def render(self, indent: str = "    ") -> list[str]:
        if self.event == "(normalize)":
            lines = [f"{indent}normalize first"]
            lines += [f"{indent}  repair {name!r} fired -> {_fmt(s)}" for name, s in self.repairs]
            lines.append(f"{indent}  = {_fmt(self.result)}")
            return lines
        lines = [
            f"{indent}{self.event}: "
            + ("effect -> " + _fmt(self.after_effect) if self.changed else "no change")
        ]
        lines += [f"{indent}  repair {name!r} fired -> {_fmt(s)}" for name, s in self.repairs]
        lines.append(f"{indent}  = {_fmt(self.result)}")
        return lines


@dataclass(frozen=True)
class Divergence:
    """Two event orders from one start state that end in different states.

    `condition` says what failed: "CC1" (a checked pair), "obligation" (an undeclared pair),
    "idempotence" (an event delivered twice) or "CC2" (applying at a state vs at its normal form)."""

    machine: str
    condition: Literal["CC1", "obligation", "idempotence", "CC2"]
    events: tuple[str, ...]
    start: StateDict
    first: tuple[Step, ...]
    second: tuple[Step, ...]
    kind: Literal["divergence"] = "divergence"

    @property
    def first_result(self) -> StateDict:
        return self.first[-1].result if self.first else self.start

    @property
    def second_result(self) -> StateDict:
        return self.second[-1].result if self.second else self.start

    def render(self) -> str:
        ev = self.events
        if self.condition == "CC1":
            head = (
                f"machine {self.machine!r} does not converge: events {ev[0]!r} and {ev[1]!r} are checked "
                "as independent but their orders reach different states"
            )
        elif self.condition == "obligation":
            head = (
                f"events {ev[0]!r} and {ev[1]!r} do not commute (undeclared pair: deliver them in one "
                "fixed causal order)"
            )
        elif self.condition == "idempotence":
            head = f"event {ev[0]!r} is not idempotent: delivering it twice differs from once"
        else:
            head = (
                f"CC2 fails for event {ev[0]!r}: applying it at an invalid state and at that state's "
                "normal form reach different states (the runtime normalizes first)"
            )
        lines = [head, f"  start: {_fmt(self.start)}"]
        for label, steps in (("order 1", self.first), ("order 2", self.second)):
            order = " then ".join(s.event for s in steps) or "(normalize only)"
            lines.append(f"  {label}: {order}")
            for s in steps:
                lines += s.render()
        lines.append(f"  results differ: {_fmt(self.first_result)} vs {_fmt(self.second_result)}")
        if self.condition == "CC1":
            lines += [
                "  ways out:",
                f"    - if {ev[0]!r} and {ev[1]!r} are delivered in causal order (one producer, or "
                f"the second caused by the first), declare it: r.ordered({ev[0]!r}, {ev[1]!r}) (in "
                f"place of r.independent({ev[0]!r}, {ev[1]!r}), if the file declares that); the pair is "
                "then an obligation replicas keep, not a convergence failure",
                "    - strengthen a guard so that neither order reaches the differing state",
                "    - add an invariant whose repair brings both results to the same state",
            ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(asdict(self))
        return out


@dataclass(frozen=True)
class RepairCycle:
    """Repair does not terminate (WFC fails): from `start`, repairs loop through `cycle`, a list of
    (state, invariant whose repair fires there) that returns to its first state."""

    machine: str
    start: StateDict
    cycle: tuple[tuple[StateDict, str], ...]
    kind: Literal["repair_cycle"] = "repair_cycle"

    def render(self) -> str:
        lines = [
            f"machine {self.machine!r} does not converge: repair never terminates (WFC fails)",
            f"  from {_fmt(self.start)} repairs reach this cycle:",
        ]
        for state, inv in self.cycle:
            lines.append(f"    {_fmt(state)}  -- repair {inv!r} -->")
        lines.append(f"    {_fmt(self.cycle[0][0])}  (back to the first state)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(asdict(self))
        return out


Counterexample = Divergence | RepairCycle


def _fmt(s: StateDict) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in s.items()) + "}"


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


def trace(
    space: Space,
    event_names: list[str],
    invariant_names: list[str],
    apply: npt.NDArray[np.int32],
    repair: npt.NDArray[np.int32],
    first_violated: npt.NDArray[np.int16],
    event: int,
    start: int,
) -> tuple[Step, int]:
    """Replay `event` from state `start` through the tables; returns the step and the resulting id."""
    raw = int(apply[event, start])
    repairs, s = _repair_chain(space, invariant_names, repair, first_violated, raw)
    step = Step(event_names[event], raw != start, space.as_dict(raw), repairs, space.as_dict(s))
    return step, s


def trace_normalize(
    space: Space,
    invariant_names: list[str],
    repair: npt.NDArray[np.int32],
    first_violated: npt.NDArray[np.int16],
    start: int,
) -> tuple[Step, int]:
    """Normalize state `start` through the repair table, as a step named "(normalize)"."""
    repairs, s = _repair_chain(space, invariant_names, repair, first_violated, start)
    return Step("(normalize)", False, space.as_dict(start), repairs, space.as_dict(s)), s


def _repair_chain(
    space: Space,
    invariant_names: list[str],
    repair: npt.NDArray[np.int32],
    first_violated: npt.NDArray[np.int16],
    start: int,
) -> tuple[tuple[tuple[str, StateDict], ...], int]:
    """The repairs that fire from `start` (invariant repaired, state after) and the state they end in.
    Stops after N repairs (only reached when WFC fails, which is reported before any trace)."""
    repairs: list[tuple[str, StateDict]] = []
    s = start
    for _ in range(space.n):
        inv = int(first_violated[s])
        if inv < 0:
            break
        s = int(repair[s])
        repairs.append((invariant_names[inv], space.as_dict(s)))
    return tuple(repairs), s


def divergence_from_dict(d: Mapping[str, Any]) -> Divergence:
    """Rebuild a `Divergence` from `to_dict()` output (used when loading a saved machine's report)."""

    def step(x: Mapping[str, Any]) -> Step:
        return Step(
            x["event"],
            bool(x["changed"]),
            dict(x["after_effect"]),
            tuple((str(n), dict(s)) for n, s in x["repairs"]),
            dict(x["result"]),
        )

    return Divergence(
        d["machine"],
        d["condition"],
        tuple(d["events"]),
        dict(d["start"]),
        tuple(step(s) for s in d["first"]),
        tuple(step(s) for s in d["second"]),
    )
