"""Hypothesis strategies for random small machines, declared through the public front end.

Machines have up to three variables (bool, enum, small int) so brute force stays cheap, and the
strategies deliberately produce overlapping footprints, guards that read what others write,
cascading repairs, several events writing one variable, and arithmetic that can leave its range.
Each machine can also be declared with every rule as a Python callable computing the same thing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from govern_brute import ev
from hypothesis import strategies as st

from govern import Expr, Registry, Var, if_, max_, min_
from govern.model._expr import coerce


@dataclass
class Spec:
    """A drawn machine, replayable into a registry with data rules or with callables."""

    vars: list[tuple[str, str, int, int, tuple[str, ...]]]
    invariants: list[tuple[Any, list[tuple[int, Any]]]]  # (holds builder, [(var, value builder)])
    events: list[tuple[Any, list[tuple[int, Any]]]]
    independent: list[tuple[int, int]] | None
    domain: str

    def registry(self, *, callables: bool = False) -> Registry:
        r = Registry("random")
        vs: list[Var] = []
        for name, kind, lo, hi, labels in self.vars:
            if kind == "bool":
                vs.append(r.bool(name))
            elif kind == "enum":
                vs.append(r.enum(name, list(labels)))
            else:
                vs.append(r.int(name, lo, hi))
        for k, (holds, repair) in enumerate(self.invariants):
            h = holds(vs)
            rep = {vs[i]: val(vs) for i, val in repair}
            if callables:
                r.invariant(f"inv{k}", holds=_cond_fn(h, vs), repair=_assign_fn(rep, vs))
            else:
                r.invariant(f"inv{k}", holds=h, repair=rep)
        for k, (guard, effect) in enumerate(self.events):
            g = guard(vs)
            eff = {vs[i]: val(vs) for i, val in effect}
            if callables:
                r.event(f"ev{k}", guard=_cond_fn(g, vs), effect=_assign_fn(eff, vs))
            else:
                r.event(f"ev{k}", guard=g, effect=eff)
        for a, b in self.independent or []:
            r.independent(f"ev{a}", f"ev{b}")
        return r


def _to_int(v: Var, value: Any) -> int:
    if v.kind == "enum":
        return v.labels.index(value)
    return int(value)


def _json(x: Any, var: Var | None = None) -> Any:
    if isinstance(x, Expr):
        return (coerce(x, var.type, "test") if var is not None else x).to_json()
    if isinstance(x, bool):
        return ["lit", int(x)]
    if isinstance(x, str):
        assert var is not None
        return ["lit", var.labels.index(x)]
    return ["lit", int(x)]


class _Lazy:
    """Integer values of a StateView, read only when an expression needs them (so reads are traced)."""

    def __init__(self, s: Any, vs: list[Var]) -> None:
        self.s, self.vs = s, vs

    def __getitem__(self, i: int) -> int:
        return _to_int(self.vs[i], self.s[self.vs[i].name])


def _cond_fn(c: Any, vs: list[Var]) -> Callable[[Any], bool]:
    node = _json(c)
    return lambda s: bool(ev(node, _Lazy(s, vs)))  # type: ignore[arg-type]


def _assign_fn(assign: dict[Var, Any], vs: list[Var]) -> Callable[[Any], dict[str, Any]]:
    nodes = [(v, _json(x, v)) for v, x in assign.items()]

    def fn(s: Any) -> dict[str, Any]:
        lazy = _Lazy(s, vs)
        out: dict[str, Any] = {}
        for v, node in nodes:
            value = ev(node, lazy)  # type: ignore[arg-type]
            if v.kind == "bool":
                out[v.name] = bool(value)
            elif v.kind == "enum":
                out[v.name] = v.labels[value]
            else:
                out[v.name] = value
        return out

    return fn


Builder = Callable[[list[Var]], Any]


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    n = draw(st.integers(1, 3))
    vars_: list[tuple[str, str, int, int, tuple[str, ...]]] = []
    for i in range(n):
        kind = draw(st.sampled_from(["bool", "enum", "int"]))
        if kind == "bool":
            vars_.append((f"b{i}", "bool", 0, 1, ()))
        elif kind == "enum":
            k = draw(st.integers(2, 3))
            vars_.append((f"e{i}", "enum", 0, k - 1, ("a", "b", "c")[:k]))
        else:
            lo = draw(st.integers(-2, 2))
            vars_.append((f"i{i}", "int", lo, lo + draw(st.integers(0, 3)), ()))
    kinds = [v[1] for v in vars_]
    ints = [i for i, k in enumerate(kinds) if k == "int"]
    bools = [i for i, k in enumerate(kinds) if k == "bool"]
    enums = [i for i, k in enumerate(kinds) if k == "enum"]

    def int_expr(depth: int) -> Builder:
        options = ["lit"] + (["var"] * 3 if ints else [])
        if depth > 0:
            options += ["add", "sub", "min", "max", "ite"]
        op = draw(st.sampled_from(options))
        if op == "lit":
            c = draw(st.integers(-3, 3))
            return lambda vs: c
        if op == "var":
            i = draw(st.sampled_from(ints))
            return lambda vs: vs[i]
        if op == "ite":
            c, a, b = bool_expr(depth - 1), int_expr(depth - 1), int_expr(depth - 1)
            return lambda vs: if_(c(vs), _as_int_expr(a(vs)), b(vs))
        a, b = int_expr(depth - 1), int_expr(depth - 1)
        if op == "add":
            return lambda vs: _as_int_expr(a(vs)) + b(vs)
        if op == "sub":
            return lambda vs: _as_int_expr(a(vs)) - b(vs)
        f = min_ if op == "min" else max_
        return lambda vs: f(_as_int_expr(a(vs)), b(vs))

    def bool_expr(depth: int) -> Builder:
        options = ["const"] + (["bvar"] * 3 if bools else []) + (["enum"] * 3 if enums else [])
        options += ["cmp"] * 2
        if depth > 0:
            options += ["and", "or", "not"]
        op = draw(st.sampled_from(options))
        if op == "const":
            c = draw(st.booleans())
            return lambda vs: _as_bool_expr(c, vs)
        if op == "bvar":
            i = draw(st.sampled_from(bools))
            return lambda vs: vs[i]
        if op == "enum":
            i = draw(st.sampled_from(enums))
            labels = vars_[i][4]
            if draw(st.booleans()):
                lab = draw(st.sampled_from(labels))
                neg = draw(st.booleans())
                return lambda vs: (vs[i] != lab) if neg else (vs[i] == lab)
            chosen = draw(st.lists(st.sampled_from(labels), min_size=1, max_size=2))
            return lambda vs: vs[i].isin(chosen)
        if op == "cmp":
            a, b = int_expr(depth - 1 if depth > 0 else 0), int_expr(0)
            rel = draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]))
            return lambda vs: _cmp(_as_int_expr(a(vs)), rel, b(vs))
        if op == "not":
            a = bool_expr(depth - 1)
            return lambda vs: ~_as_bool_expr(a(vs), vs)
        a, b = bool_expr(depth - 1), bool_expr(depth - 1)
        if op == "and":
            return lambda vs: _as_bool_expr(a(vs), vs) & b(vs)
        return lambda vs: _as_bool_expr(a(vs), vs) | b(vs)

    def value_for(i: int) -> Builder:
        _, kind, lo, hi, labels = vars_[i]
        if kind == "bool":
            if draw(st.booleans()):
                c = draw(st.booleans())
                return lambda vs: c
            return bool_expr(1)
        if kind == "enum":
            if draw(st.booleans()):
                lab = draw(st.sampled_from(labels))
                return lambda vs: lab
            c, x, y = bool_expr(1), draw(st.sampled_from(labels)), draw(st.sampled_from(labels))
            return lambda vs: if_(c(vs), x, y)
        e = int_expr(2)
        if draw(st.integers(0, 4)) == 0:
            # may leave the range: a domain violation unless guarded away (a constant out of range
            # is refused at declaration, so constants are kept in range)
            return lambda vs: _raw(e(vs), lo, hi)
        return lambda vs: min_(max_(_as_int_expr(e(vs)), lo), hi)

    def assignment() -> list[tuple[int, Builder]]:
        targets = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2, unique=True))
        return [(i, value_for(i)) for i in sorted(targets)]

    invariants = [(bool_expr(2), assignment()) for _ in range(draw(st.integers(0, 2)))]
    events = []
    for _ in range(draw(st.integers(1, 3))):
        guard: Builder = (lambda vs: True) if draw(st.booleans()) else bool_expr(1)
        events.append((guard, assignment()))
    independent: list[tuple[int, int]] | None = None
    if len(events) > 1 and draw(st.booleans()):
        pairs = [(a, b) for a in range(len(events)) for b in range(a + 1, len(events))]
        independent = draw(st.lists(st.sampled_from(pairs), min_size=1, unique=True))
    return Spec(vars_, invariants, events, independent, draw(st.sampled_from(["valid", "reachable"])))


def _raw(x: Any, lo: int, hi: int) -> Any:
    return x if isinstance(x, Expr) else min(max(x, lo), hi)


def _as_int_expr(x: Any) -> Any:
    return x


def _as_bool_expr(x: Any, vs: list[Var]) -> Any:
    if isinstance(x, bool):
        # a Python bool has no ~ / & of the right kind; lift it to a condition expression
        v = vs[0]
        lit = (v == v) if v.kind != "int" else (v <= v)
        return lit if x else ~lit
    return x


def _cmp(a: Any, rel: str, b: Any) -> Any:
    if not isinstance(a, Expr):
        if not isinstance(b, Expr):
            return a < b if rel == "<" else a <= b  # both constants: a plain bool condition
        a, b, rel = b, a, {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}[rel]
    return {"<": a.__lt__, "<=": a.__le__, ">": a.__gt__, ">=": a.__ge__, "==": a.__eq__, "!=": a.__ne__}[
        rel
    ](b)
