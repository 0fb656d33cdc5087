"""Rules as piecewise-affine functions of a start state: the symbolic route's encoding.

Every rule expression (docs/semantics.md: `+`, `-`, `min`, `max`, `ite`, comparisons, connectives)
is, on a state that is itself piecewise affine in the start variables, a finite list of pieces
"where condition C holds, the value is the affine form A(x)". Conditions are Boolean formulas over
*atoms* `a·x <= c` on the start variables only, hash-consed in a `Formulas` table, and pieces
with the same affine form are merged (their conditions or-ed), so a value has as many pieces as
it has distinct affine forms, however many steps and repairs produced it.

Why: a CP-SAT model with one integer variable per intermediate value (min, max, ite, each repair
step) chains equalities between variables of 10^9 values, and bound propagation along such chains
moves a bound by one offset per round, so search and presolve stall for minutes on two-line machines.
With this encoding the model's only integer variables are the start state's; every other fact is a
literal equivalent to one linear inequality on them, which CP-SAT propagates in one step.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd
from typing import Any

from ..model._expr import Expr

__all__ = ["FALSE", "TRUE", "Affine", "FormulaLimit", "Formulas", "Piecewise"]

#: An affine form over the start variables: (coefficient of each variable, constant).
Affine = tuple[tuple[int, ...], int]
#: Pieces (condition formula id, affine form): conditions pairwise exclusive, affine forms distinct.
Piecewise = tuple[tuple[int, Affine], ...]

FALSE = 0
TRUE = 1
#: A join absorbs a child join of its own kind only up to this many children: absorbing more
#: copies long conjunctions into every formula built on them (quadratic in a repair chain's length).
_FLATTEN = 4


class FormulaLimit(Exception):
    """A query's formulas outgrew `Formulas.max_nodes` (the rules' pieces multiply too fast)."""


class Formulas:
    """Hash-consed Boolean formulas over linear atoms on start variables with the given ranges.

    A formula is an int id. Kinds: "false", "true", "atom" (payload (coeffs, c): sum coeffs·x <= c),
    "and" / "or" (payload: sorted child ids). Negation is pushed to the atoms (over the integers,
    not(a·x <= c) is -a·x <= -c - 1), so every formula is a monotone combination of atoms.
    Atoms decided by the variables' ranges alone fold to true or false."""

    #: Formula nodes one query may build before `FormulaLimit` (a few hundred MiB of Python objects).
    max_nodes = 2_000_000

    def __init__(self, ranges: Sequence[tuple[int, int]]) -> None:
        self.ranges = tuple(ranges)
        self.kind: list[str] = ["false", "true"]
        self.payload: list[Any] = [None, None]  # atoms: (coeffs, c); and/or: child ids
        self._ids: dict[tuple[str, object], int] = {}
        self._neg: dict[int, int] = {FALSE: TRUE, TRUE: FALSE}

    def _node(self, kind: str, payload: object) -> int:
        key = (kind, payload)
        hit = self._ids.get(key)
        if hit is None:
            hit = len(self.kind)
            if hit >= self.max_nodes:
                raise FormulaLimit(f"more than {self.max_nodes:,} formula nodes")
            self.kind.append(kind)
            self.payload.append(payload)
            self._ids[key] = hit
        return hit

    # -- atoms -----------------------------------------------------------------------------------
    def le(self, a: Affine, b: Affine) -> int:
        """a <= b."""
        (ca, ka), (cb, kb) = a, b
        return self._atom(tuple(x - y for x, y in zip(ca, cb, strict=True)), kb - ka)

    def lt(self, a: Affine, b: Affine) -> int:
        """a < b, that is a + 1 <= b over the integers."""
        return self.le((a[0], a[1] + 1), b)

    def _atom(self, coeffs: tuple[int, ...], c: int) -> int:
        """sum coeffs·x <= c, normalized (divided by the coefficients' gcd) and folded by ranges."""
        g = 0
        for k in coeffs:
            g = gcd(g, k)
        if g == 0:
            return TRUE if c >= 0 else FALSE
        if g > 1:
            coeffs = tuple(k // g for k in coeffs)
            c = c // g  # floor: sum (k/g)·x is an integer, so it is <= c/g exactly when <= floor(c/g)
        lo = hi = 0
        for k, (vlo, vhi) in zip(coeffs, self.ranges, strict=True):
            lo += k * (vlo if k > 0 else vhi)
            hi += k * (vhi if k > 0 else vlo)
        if hi <= c:
            return TRUE
        if lo > c:
            return FALSE
        return self._node("atom", (coeffs, c))

    # -- connectives -----------------------------------------------------------------------------
    def negate(self, f: int) -> int:
        hit = self._neg.get(f)
        if hit is not None:
            return hit
        kind = self.kind[f]
        if kind == "atom":
            coeffs, c = self.payload[f]
            out = self._node("atom", (tuple(-k for k in coeffs), -c - 1))
        elif kind == "and":
            out = self.any([self.negate(g) for g in self.payload[f]])
        else:
            out = self.all([self.negate(g) for g in self.payload[f]])
        self._neg[f] = out
        if out not in (TRUE, FALSE):  # a constant's negation is fixed; f only folded less far
            self._neg[out] = f
        return out

    def all(self, fs: Sequence[int]) -> int:
        return self._join("and", fs, TRUE, FALSE)

    def any(self, fs: Sequence[int]) -> int:
        return self._join("or", fs, FALSE, TRUE)

    def _join(self, kind: str, fs: Sequence[int], unit: int, zero: int) -> int:
        parts: set[int] = set()
        for f in fs:
            if f == zero:
                return zero
            if f == unit:
                continue
            if self.kind[f] == kind and len(self.payload[f]) <= _FLATTEN:
                parts.update(self.payload[f])
            else:
                parts.add(f)
        # Atoms on one linear form collapse to the tightest (and) or loosest (or) bound, and a form
        # bounded on both sides decides the join when the bounds cross (and) or cover (or): long
        # repair chains otherwise build conjunctions of every bound they passed.
        bounds: dict[tuple[int, ...], int] = {}
        others: list[int] = []
        for f in parts:
            if self.kind[f] != "atom":
                others.append(f)
                continue
            coeffs, c = self.payload[f]
            old = bounds.get(coeffs)
            bounds[coeffs] = c if old is None else (min(old, c) if kind == "and" else max(old, c))
        for coeffs, c in bounds.items():
            other = bounds.get(tuple(-k for k in coeffs))
            if other is not None and (c + other < 0 if kind == "and" else c + other >= -1):
                return zero
        atoms = [self._atom(coeffs, c) for coeffs, c in bounds.items()]
        parts = set(others)
        for a in atoms:
            if a == zero:
                return zero
            if a != unit:
                parts.add(a)
        if not parts:
            return unit
        if len(parts) == 1:
            return next(iter(parts))
        for f in parts:
            if self._neg.get(f) in parts:  # f and not f
                return zero
        return self._node(kind, tuple(sorted(parts)))

    # -- piecewise values --------------------------------------------------------------------------
    def const(self, k: int) -> Piecewise:
        return ((TRUE, ((0,) * len(self.ranges), k)),)

    def var(self, i: int) -> Piecewise:
        return ((TRUE, (tuple(int(j == i) for j in range(len(self.ranges))), 0)),)

    def merge(self, pieces: Sequence[tuple[int, Affine]]) -> Piecewise:
        """Drop pieces whose condition is false and or together the conditions of equal forms."""
        by_form: dict[Affine, list[int]] = {}
        for f, a in pieces:
            if f != FALSE:
                by_form.setdefault(a, []).append(f)
        return tuple((self.any(fs), a) for a, fs in by_form.items())

    def choose(self, cond: int, then: Piecewise, otherwise: Piecewise) -> Piecewise:
        """ite(cond, then, otherwise)."""
        if cond == TRUE:
            return then
        if cond == FALSE:
            return otherwise
        if then == otherwise:
            return then
        neg = self.negate(cond)
        return self.merge(
            [(self.all([cond, f]), a) for f, a in then] + [(self.all([neg, f]), a) for f, a in otherwise]
        )

    def plus(self, x: Piecewise, y: Piecewise, sign: int) -> Piecewise:
        """x + y (sign 1) or x - y (sign -1)."""
        return self.merge(
            [
                (
                    self.all([f, g]),
                    (tuple(p + sign * q for p, q in zip(a[0], b[0], strict=True)), a[1] + sign * b[1]),
                )
                for f, a in x
                for g, b in y
            ]
        )

    def least(self, x: Piecewise, y: Piecewise, greatest: bool) -> Piecewise:
        """min(x, y), or max(x, y) when `greatest`."""
        out: list[tuple[int, Affine]] = []
        for f, a in x:
            for g, b in y:
                both = self.all([f, g])
                if a == b:
                    out.append((both, a))
                    continue
                a_first = self.le(b, a) if greatest else self.le(a, b)
                out.append((self.all([both, a_first]), a))
                out.append((self.all([both, self.negate(a_first)]), b))
        return self.merge(out)

    def compare(self, op: str, x: Piecewise, y: Piecewise) -> int:
        """The condition under which x op y ("eq", "lt", "le")."""
        cases = []
        for f, a in x:
            for g, b in y:
                if op == "eq":
                    rel = self.all([self.le(a, b), self.le(b, a)])
                elif op == "lt":
                    rel = self.lt(a, b)
                else:
                    rel = self.le(a, b)
                cases.append(self.all([f, g, rel]))
        return self.any(cases)

    def differ(self, x: Piecewise, y: Piecewise) -> int:
        """The condition under which x != y."""
        return self.negate(self.compare("eq", x, y))

    def truth(self, x: Piecewise) -> int:
        """The condition under which x is non-zero."""
        return self.differ(x, self.const(0))

    def of_condition(self, cond: int) -> Piecewise:
        """A condition as a 0/1 value."""
        return self.choose(cond, self.const(1), self.const(0))

    def outside(self, x: Piecewise, lo: int, hi: int) -> int:
        """The condition under which x lies outside lo..hi."""
        return self.any([self.compare("lt", x, self.const(lo)), self.compare("lt", self.const(hi), x)])

    # -- expressions ---------------------------------------------------------------------------------
    def evaluate(self, e: Expr, state: Sequence[Piecewise], memo: dict[int, Piecewise]) -> Piecewise:
        """e's value on a state of piecewise values (memo: per state, keyed by id(e))."""
        hit = memo.get(id(e))
        if hit is not None:
            return hit
        op = e._op
        if op == "var":
            out = state[e._payload]
        elif op == "lit":
            out = self.const(e._payload)
        elif op in ("eq", "lt", "le", "and", "or", "not"):
            out = self.of_condition(self.condition(e, state, memo))
        elif op == "ite":
            out = self.choose(
                self.condition(e._args[0], state, memo),
                self.evaluate(e._args[1], state, memo),
                self.evaluate(e._args[2], state, memo),
            )
        else:
            args = [self.evaluate(a, state, memo) for a in e._args]
            out = args[0]
            for nxt in args[1:]:
                if op == "add":
                    out = self.plus(out, nxt, 1)
                elif op == "sub":
                    out = self.plus(out, nxt, -1)
                else:
                    out = self.least(out, nxt, op == "max")
        memo[id(e)] = out
        return out

    def condition(self, e: Expr, state: Sequence[Piecewise], memo: dict[int, Piecewise]) -> int:
        """The condition under which e is non-zero on the state."""
        op = e._op
        if op in ("eq", "lt", "le"):
            return self.compare(
                op, self.evaluate(e._args[0], state, memo), self.evaluate(e._args[1], state, memo)
            )
        if op == "and":
            return self.all([self.condition(a, state, memo) for a in e._args])
        if op == "or":
            return self.any([self.condition(a, state, memo) for a in e._args])
        if op == "not":
            return self.negate(self.condition(e._args[0], state, memo))
        return self.truth(self.evaluate(e, state, memo))
