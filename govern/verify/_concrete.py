"""The concrete semantics of docs/semantics.md on one state at a time, with no tables.

States are tuples of integer values. Every expression is evaluated by the engine's reference
evaluator (`model._expr.evaluate_one`), so this is the meaning the tables encode, state by state.
The symbolic route uses it to replay every counterexample the solver proposes before reporting it,
and a machine too large for tables uses it to take each step at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import DeclarationError, DomainViolation
from ..model._declarations import Assignment, Snapshot
from ..model._expr import Expr, evaluate_one
from ..model._space import Value, VarSpec
from ._counterexample import Divergence, RepairCycle, Step

__all__ = ["Concrete"]

Values = tuple[int, ...]


@dataclass(frozen=True)
class Concrete:
    """One machine's rules (expressions only), evaluated state by state."""

    name: str
    vars: tuple[VarSpec, ...]
    holds: tuple[Expr, ...]
    repairs: tuple[Assignment, ...]
    guards: tuple[Expr, ...]
    effects: tuple[Assignment, ...]
    invariant_names: tuple[str, ...]
    event_names: tuple[str, ...]

    @classmethod
    def of(cls, snap: Snapshot) -> Concrete:
        """The concrete semantics of `snap`; every rule must be an expression (`Snapshot.is_data`)."""
        holds, repairs, guards, effects = [], [], [], []
        for inv in snap.invariants:
            assert isinstance(inv.holds, Expr) and isinstance(inv.repair, tuple)
            holds.append(inv.holds)
            repairs.append(inv.repair)
        for ev in snap.events:
            assert isinstance(ev.guard, Expr) and isinstance(ev.effect, tuple)
            guards.append(ev.guard)
            effects.append(ev.effect)
        return cls(
            snap.name,
            snap.vars,
            tuple(holds),
            tuple(repairs),
            tuple(guards),
            tuple(effects),
            tuple(i.name for i in snap.invariants),
            tuple(e.name for e in snap.events),
        )

    # -- the semantics ---------------------------------------------------------------------------
    def as_dict(self, x: Values) -> dict[str, Value]:
        return {v.name: v.decode(val) for v, val in zip(self.vars, x, strict=True)}

    def _assign(self, part: Assignment, x: Values, rule: str) -> Values:
        out = list(x)
        for j, e in part:
            val = evaluate_one(e, x)
            spec = self.vars[j]
            if not spec.lo <= val <= spec.hi:
                raise DomainViolation(rule=rule, state=self.as_dict(x), variable=spec.name, value=val)
            out[j] = val
        return tuple(out)

    def first_violated(self, x: Values) -> int:
        """The position of the first invariant whose condition is zero at `x`, or -1 when valid."""
        for k, h in enumerate(self.holds):
            if evaluate_one(h, x) == 0:
                return k
        return -1

    def valid(self, x: Values) -> bool:
        return self.first_violated(x) < 0

    def require_valid_initial(self, initial: Values) -> None:
        """Raise `DeclarationError` when the declared initial state violates an invariant."""
        k = self.first_violated(initial)
        if k >= 0:
            raise DeclarationError(
                f"the declared initial state {self.as_dict(initial)} violates invariant "
                f"{self.invariant_names[k]!r}; declare a valid initial state"
            )

    def repair(self, x: Values) -> Values:
        """One repair step (x itself when valid)."""
        k = self.first_violated(x)
        if k < 0:
            return x
        return self._assign(self.repairs[k], x, f"invariant {self.invariant_names[k]!r} repair")

    def apply(self, e: int, x: Values) -> Values:
        """The event's effect where its guard holds, else x."""
        if evaluate_one(self.guards[e], x) == 0:
            return x
        return self._assign(self.effects[e], x, f"event {self.event_names[e]!r} effect")

    def nf(self, x: Values, limit: int) -> Values:
        """The normal form of x; at most `limit` repair steps are taken (WFC's proven depth bound)."""
        for _ in range(limit + 1):
            k = self.first_violated(x)
            if k < 0:
                return x
            x = self._assign(self.repairs[k], x, f"invariant {self.invariant_names[k]!r} repair")
        raise AssertionError(f"internal error: repair took more than {limit} steps, its proven bound")

    def step(self, e: int, x: Values, limit: int) -> Values:
        """step(e, x) = NF(apply(e, x))."""
        return self.nf(self.apply(e, x), limit)

    # -- witnesses ---------------------------------------------------------------------------------
    def _chain(self, x: Values, limit: int) -> tuple[tuple[tuple[str, dict[str, Value]], ...], Values]:
        repairs: list[tuple[str, dict[str, Value]]] = []
        for _ in range(limit + 1):
            k = self.first_violated(x)
            if k < 0:
                return tuple(repairs), x
            x = self._assign(self.repairs[k], x, f"invariant {self.invariant_names[k]!r} repair")
            repairs.append((self.invariant_names[k], self.as_dict(x)))
        raise AssertionError(f"internal error: repair took more than {limit} steps, its proven bound")

    def trace(self, e: int, x: Values, limit: int) -> tuple[Step, Values]:
        """Replay event `e` from `x`: the step as a witness, and the state it reaches."""
        raw = self.apply(e, x)
        repairs, y = self._chain(raw, limit)
        return Step(self.event_names[e], raw != x, self.as_dict(raw), repairs, self.as_dict(y)), y

    def trace_normalize(self, x: Values, limit: int) -> tuple[Step, Values]:
        repairs, y = self._chain(x, limit)
        return Step("(normalize)", False, self.as_dict(x), repairs, self.as_dict(y)), y

    def divergence(self, kind: str, events: tuple[int, ...], x: Values, limit: int) -> Divergence | None:
        """Replay a proposed witness of `kind` ("CC1", "obligation", "idempotence", "CC2") from `x`;
        the `Divergence` when the two orders really end apart, else None."""
        first: list[Step] = []
        second: list[Step] = []
        if kind in ("CC1", "obligation"):
            a, b = events
            orders: tuple[tuple[int, ...], tuple[int, ...]] = ((a, b), (b, a))
        elif kind == "idempotence":
            orders = ((events[0], events[0]), (events[0],))
        else:
            orders = ((events[0],), ())
        ends = []
        for order, out in zip(orders, (first, second), strict=True):
            cur = x
            if kind == "CC2" and not order:
                st, cur = self.trace_normalize(cur, limit)
                out.append(st)
                order = (events[0],)
            for ev in order:
                st, cur = self.trace(ev, cur, limit)
                out.append(st)
            ends.append(cur)
        if ends[0] == ends[1]:
            return None
        return Divergence(
            self.name,
            kind,  # type: ignore[arg-type]
            tuple(self.event_names[e] for e in events[: 1 if kind in ("idempotence", "CC2") else 2]),
            self.as_dict(x),
            tuple(first),
            tuple(second),
        )

    def chain_length(self, x: Values, limit: int) -> tuple[int, bool]:
        """The number of repair steps from x to a valid state, and True; or (limit, False) when
        `limit` steps do not reach one."""
        for steps in range(limit):
            if self.valid(x):
                return steps, True
            x = self.repair(x)
        return limit, self.valid(x)

    def find_cycle(self, x: Values, limit: int) -> RepairCycle | None:
        """The repair cycle that the repair chain from x runs into within `limit` steps, if any."""
        seen: dict[Values, int] = {}
        for step in range(limit):
            if self.valid(x):
                return None
            if x in seen:
                return self.cycle(x, step - seen[x])
            seen[x] = step
            x = self.repair(x)
        return None

    def cycle(self, x: Values, period: int) -> RepairCycle | None:
        """The repair cycle through x when `period` repair steps bring x back to itself."""
        path = [x]
        cur = x
        for _ in range(period):
            if self.valid(cur):
                return None
            cur = self.repair(cur)
            path.append(cur)
        if cur != x:
            return None
        loop = tuple((self.as_dict(s), self.invariant_names[self.first_violated(s)]) for s in path[:-1])
        return RepairCycle(self.name, self.as_dict(x), loop)
