"""Decomposition of a machine into components with disjoint, closed footprints.

Read from the rules AST (the machine as data, docs/semantics.md), never from traced callables: each
rule's footprint is every variable its condition reads, its assignment's expressions read and its
assignment writes. Variables are linked when one rule's footprint holds both; the components are
the connected components of that graph (networkx). Every invariant and event then lies inside one
component (an event or invariant touching no variable goes to the first), and a shared reader, a
shared invariant or a shared written variable merges the parts it touches: there are no read-only
variables shared between components (the trap of gsm's `sw_diverges`/`rc_diverges`).

A machine with a rule given as a Python callable is not decomposed: its footprint cannot be read
from the AST, and a traced footprint is not trusted for this (it is whole, enumerated as before).

The decomposition is the engine's claim; the extracted `Compose.check_decomposition` (the oracle)
re-checks it from the same rules JSON, and `Govern.Compose` proves that a machine whose components
have disjoint closed footprints converges when every component does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..model._declarations import Assignment, EventRule, InvariantRule, Snapshot
from ..model._expr import Expr

__all__ = [
    "Component",
    "Decomposition",
    "decompose",
    "eval_json",
    "project_rules",
    "project_snapshot",
    "rule_footprints",
]


@dataclass(frozen=True)
class Component:
    """One component: its variables, invariants and events, by position in the whole machine (sorted)."""

    variables: tuple[int, ...]
    invariants: tuple[int, ...]
    events: tuple[int, ...]


@dataclass(frozen=True)
class Decomposition:
    """The components of a machine, ordered by their lowest variable."""

    components: tuple[Component, ...]

    def labels(self, n_vars: int) -> list[int]:
        """The component of every variable."""
        out = [0] * n_vars
        for c, comp in enumerate(self.components):
            for v in comp.variables:
                out[v] = c
        return out

    def event_labels(self, n_events: int) -> list[int]:
        out = [0] * n_events
        for c, comp in enumerate(self.components):
            for e in comp.events:
                out[e] = c
        return out

    def invariant_labels(self, n_invariants: int) -> list[int]:
        out = [0] * n_invariants
        for c, comp in enumerate(self.components):
            for i in comp.invariants:
                out[i] = c
        return out

    def to_json(self) -> list[dict[str, list[int]]]:
        return [
            {"variables": list(c.variables), "invariants": list(c.invariants), "events": list(c.events)}
            for c in self.components
        ]


def _expr_reads(node: Any, out: set[int]) -> None:
    stack = [node]
    while stack:
        x = stack.pop()
        if x[0] == "var":
            out.add(int(x[1]))
        elif x[0] != "lit":
            stack.extend(x[1:])


def _rule_footprint(cond: Any, assignment: Any) -> frozenset[int]:
    out: set[int] = set()
    _expr_reads(cond, out)
    for i, e in assignment:
        out.add(int(i))
        _expr_reads(e, out)
    return frozenset(out)


def rule_footprints(rules: dict[str, Any]) -> tuple[list[frozenset[int]], list[frozenset[int]]] | None:
    """Each invariant's and event's footprint from the rules JSON, or None when a rule is a callable."""
    invs, evs = [], []
    for r in rules["invariants"]:
        if r.get("holds") is None or r.get("repair") is None:
            return None
        invs.append(_rule_footprint(r["holds"], r["repair"]))
    for r in rules["events"]:
        if r.get("guard") is None or r.get("effect") is None:
            return None
        evs.append(_rule_footprint(r["guard"], r["effect"]))
    return invs, evs


def decompose(rules: dict[str, Any]) -> Decomposition | None:
    """The components of the machine `rules` (docs/semantics.md JSON), or None when a rule is a
    Python callable (no AST to read a footprint from). A machine of one component is returned as such."""
    fps = rule_footprints(rules)
    if fps is None:
        return None
    inv_fps, ev_fps = fps
    import networkx as nx  # type: ignore[import-untyped]  # not at import: only building a machine needs it

    n_vars = len(rules["variables"])
    graph: nx.Graph[int] = nx.Graph()
    graph.add_nodes_from(range(n_vars))
    for fp in (*inv_fps, *ev_fps):
        ordered = sorted(fp)
        graph.add_edges_from(itertools.pairwise(ordered))
    groups = sorted((sorted(c) for c in nx.connected_components(graph)), key=lambda c: c[0])
    label = [0] * n_vars
    for c, members in enumerate(groups):
        for v in members:
            label[v] = c

    def owner(fp: frozenset[int]) -> int:
        return label[min(fp)] if fp else 0

    inv_of: list[list[int]] = [[] for _ in groups]
    ev_of: list[list[int]] = [[] for _ in groups]
    for i, fp in enumerate(inv_fps):
        inv_of[owner(fp)].append(i)
    for e, fp in enumerate(ev_fps):
        ev_of[owner(fp)].append(e)
    return Decomposition(
        tuple(
            Component(tuple(members), tuple(inv_of[c]), tuple(ev_of[c])) for c, members in enumerate(groups)
        )
    )


# ---- projection: a component as an ordinary machine ----------------------------------------------


def _remap_json(node: Any, local: dict[int, int]) -> Any:
    if node[0] == "var":
        return ["var", local[int(node[1])]]
    if node[0] == "lit":
        return list(node)
    return [node[0], *(_remap_json(a, local) for a in node[1:])]


def component_name(name: str, c: int) -> str:
    """The name of component `c` of machine `name`."""
    return f"{name}[{c}]"


def project_rules(rules: dict[str, Any], comp: Component, c: int) -> dict[str, Any]:
    """Component `c` of the machine `rules` as a machine of its own (the same JSON format): its
    variables (renumbered in order), its invariants and events (in order, expressions renumbered),
    its part of the initial state, its declared pairs (renumbered), the same domain."""
    local = {v: j for j, v in enumerate(comp.variables)}
    ev_local = {e: j for j, e in enumerate(comp.events)}
    independent = rules["independent"]
    initial = rules["initial"]
    return {
        "name": component_name(str(rules["name"]), c),
        "variables": [rules["variables"][v] for v in comp.variables],
        "initial": None if initial is None else [initial[v] for v in comp.variables],
        "invariants": [
            {
                "name": rules["invariants"][i]["name"],
                "holds": _remap_json(rules["invariants"][i]["holds"], local),
                "repair": [
                    [local[int(j)], _remap_json(e, local)] for j, e in rules["invariants"][i]["repair"]
                ],
            }
            for i in comp.invariants
        ],
        "events": [
            {
                "name": rules["events"][e]["name"],
                "guard": _remap_json(rules["events"][e]["guard"], local),
                "effect": [[local[int(j)], _remap_json(x, local)] for j, x in rules["events"][e]["effect"]],
            }
            for e in comp.events
        ],
        "independent": None
        if independent is None
        else [
            sorted((ev_local[int(a)], ev_local[int(b)]))
            for a, b in independent
            if int(a) in ev_local and int(b) in ev_local
        ],
        "domain": rules["domain"],
    }


def _remap_expr(e: Expr, local: dict[int, int]) -> Expr:
    if e._op == "var":
        return Expr("var", (), local[e._payload], e._type, e._lo, e._hi)
    if not e._args:
        return e
    return Expr(e._op, tuple(_remap_expr(a, local) for a in e._args), e._payload, e._type, e._lo, e._hi)


def _remap_assignment(a: Assignment, local: dict[int, int]) -> Assignment:
    return tuple(sorted((local[i], _remap_expr(x, local)) for i, x in a))


def project_snapshot(snap: Snapshot, comp: Component, c: int) -> Snapshot:
    """Component `c` of `snap` as a snapshot of its own (what `project_rules` gives, as declarations).
    Every rule must be an expression (a decomposed machine has no callables)."""
    local = {v: j for j, v in enumerate(comp.variables)}
    ev_local = {e: j for j, e in enumerate(comp.events)}
    invariants = []
    for i in comp.invariants:
        rule = snap.invariants[i]
        assert isinstance(rule.holds, Expr) and isinstance(rule.repair, tuple)
        invariants.append(
            InvariantRule(rule.name, _remap_expr(rule.holds, local), _remap_assignment(rule.repair, local))
        )
    events = []
    for e in comp.events:
        ev = snap.events[e]
        assert isinstance(ev.guard, Expr) and isinstance(ev.effect, tuple)
        events.append(EventRule(ev.name, _remap_expr(ev.guard, local), _remap_assignment(ev.effect, local)))
    independent: tuple[tuple[int, int], ...] | None = None
    if snap.independent is not None:
        pairs = {
            (min(ev_local[a], ev_local[b]), max(ev_local[a], ev_local[b]))
            for a, b in snap.independent
            if a in ev_local and b in ev_local
        }
        independent = tuple(sorted(pairs))
    return Snapshot(
        component_name(snap.name, c),
        tuple(snap.vars[v] for v in comp.variables),
        tuple(invariants),
        tuple(events),
        independent,
        None if snap.initial is None else tuple(snap.initial[v] for v in comp.variables),
    )


def cross_pairs(decomp: Decomposition, pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The pairs whose events lie in different components (they commute: no table is needed)."""
    n = 1 + max((e for c in decomp.components for e in c.events), default=0)
    label = decomp.event_labels(n)
    return [(a, b) for a, b in pairs if label[a] != label[b]]


def product(sizes: Sequence[int]) -> int:
    out = 1
    for s in sizes:
        out *= s
    return out


def eval_json(node: Any, x: Sequence[int]) -> int:
    """The value of the expression `node` (JSON AST) at the state whose integer values are `x`, with
    the meaning of docs/semantics.md (conditions are 0/1, any non-zero operand is true)."""
    op = node[0]
    if op == "var":
        return int(x[node[1]])
    if op == "lit":
        return int(node[1])
    if op == "not":
        return int(not eval_json(node[1], x))
    if op == "ite":
        return eval_json(node[2], x) if eval_json(node[1], x) else eval_json(node[3], x)
    a, b = eval_json(node[1], x), eval_json(node[2], x)
    match op:
        case "add":
            return a + b
        case "sub":
            return a - b
        case "min":
            return min(a, b)
        case "max":
            return max(a, b)
        case "eq":
            return int(a == b)
        case "lt":
            return int(a < b)
        case "le":
            return int(a <= b)
        case "and":
            return int(bool(a) and bool(b))
        case "or":
            return int(bool(a) or bool(b))
    raise ValueError(f"unknown expression node {op!r}")
