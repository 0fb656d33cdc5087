"""A plain, independent reading of docs/semantics.md: the reference the engine is tested against.

Nothing here uses the engine's evaluator, tables or verifier: expressions are evaluated from their
canonical JSON, states are enumerated with itertools, repairs are iterated one state at a time, and
convergence is checked by replaying event orders directly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any


def ev(node: Any, x: tuple[int, ...]) -> int:
    op = node[0]
    if op == "var":
        return x[node[1]]
    if op == "lit":
        return int(node[1])
    if op == "ite":
        return ev(node[2], x) if ev(node[1], x) != 0 else ev(node[3], x)
    a = [ev(n, x) for n in node[1:]]
    return {
        "add": lambda: a[0] + a[1],
        "sub": lambda: a[0] - a[1],
        "min": lambda: min(a),
        "max": lambda: max(a),
        "eq": lambda: int(a[0] == a[1]),
        "lt": lambda: int(a[0] < a[1]),
        "le": lambda: int(a[0] <= a[1]),
        "and": lambda: int(a[0] != 0 and a[1] != 0),
        "or": lambda: int(a[0] != 0 or a[1] != 0),
        "not": lambda: int(a[0] == 0),
    }[op]()


class Violation(Exception):
    pass


@dataclass
class Brute:
    """Everything the semantics says about one machine, computed the slow, obvious way."""

    rules: dict[str, Any]
    ranges: list[tuple[int, int]] = field(init=False)
    states: list[tuple[int, ...]] = field(init=False)

    def __post_init__(self) -> None:
        self.ranges = []
        for v in self.rules["variables"]:
            if v["kind"] == "bool":
                self.ranges.append((0, 1))
            elif v["kind"] == "enum":
                self.ranges.append((0, len(v["labels"]) - 1))
            else:
                self.ranges.append((v["min"], v["max"]))
        # first variable fastest: product over reversed ranges, reversed back
        self.states = [
            tuple(reversed(p))
            for p in itertools.product(*(range(lo, hi + 1) for lo, hi in reversed(self.ranges)))
        ]
        self.index = {s: i for i, s in enumerate(self.states)}

    def assign(self, assignment: list[Any], x: tuple[int, ...]) -> tuple[int, ...]:
        out = list(x)
        for i, e in assignment:
            v = ev(e, x)
            lo, hi = self.ranges[i]
            if not lo <= v <= hi:
                raise Violation((x, i, v))
            out[i] = v
        return tuple(out)

    def first_violated(self, x: tuple[int, ...]) -> int | None:
        for k, inv in enumerate(self.rules["invariants"]):
            if ev(inv["holds"], x) == 0:
                return k
        return None

    def repair(self, x: tuple[int, ...]) -> tuple[int, ...]:
        k = self.first_violated(x)
        return x if k is None else self.assign(self.rules["invariants"][k]["repair"], x)

    def apply(self, e: int, x: tuple[int, ...]) -> tuple[int, ...]:
        event = self.rules["events"][e]
        return self.assign(event["effect"], x) if ev(event["guard"], x) != 0 else x

    def analyse(self) -> dict[str, Any]:
        """The verdict: which error, or every reported fact of a passing build."""
        try:
            rep = {x: self.repair(x) for x in self.states}
            app = {(e, x): self.apply(e, x) for e in range(len(self.rules["events"])) for x in self.states}
        except Violation:
            return {"error": "domain"}
        nf: dict[tuple[int, ...], tuple[int, ...]] = {}
        depth: dict[tuple[int, ...], int] = {}
        for x in self.states:
            seen = {x}
            y, d = x, 0
            while self.first_violated(y) is not None:
                y = rep[y]
                d += 1
                if y in seen:
                    return {"error": "cycle"}
                seen.add(y)
            nf[x], depth[x] = y, d
        valid = [x for x in self.states if self.first_violated(x) is None]
        n_ev = len(self.rules["events"])

        def step(e: int, x: tuple[int, ...]) -> tuple[int, ...]:
            return nf[app[(e, nf[x])]]

        init = tuple(self.rules["initial"]) if self.rules["initial"] is not None else nf[self.states[0]]
        if self.rules["domain"] == "valid":
            domain = valid
        else:
            seen_d = {init}
            frontier = [init]
            while frontier:
                nxt = []
                for x in frontier:
                    for e in range(n_ev):
                        y = step(e, x)
                        if y not in seen_d:
                            seen_d.add(y)
                            nxt.append(y)
                frontier = nxt
            domain = sorted(seen_d, key=lambda s: self.index[s])
        pairs = list(itertools.combinations(range(n_ev), 2))
        checked = (
            [tuple(p) for p in self.rules["independent"]] if self.rules["independent"] is not None else pairs
        )

        def commutes(a: int, b: int) -> bool:
            return all(step(b, step(a, x)) == step(a, step(b, x)) for x in domain)

        failing = [p for p in checked if not commutes(*p)]
        if failing:
            return {"error": "cc1", "failing": failing}
        undeclared = [p for p in pairs if p not in checked]
        return {
            "error": None,
            "valid": len(valid),
            "domain": len(domain),
            "initial": self.index[init],
            "max_depth": max(depth.values()),
            "obligations": sorted(p for p in undeclared if not commutes(*p)),
            "not_idempotent": sorted(
                e for e in range(n_ev) if any(step(e, step(e, x)) != step(e, x) for x in domain)
            ),
            "cc2": all(nf[app[(e, x)]] == nf[app[(e, nf[x])]] for e in range(n_ev) for x in self.states),
            "step": [[self.index[step(e, x)] for x in self.states] for e in range(n_ev)],
            "domain_ids": [self.index[x] for x in domain],
        }

    def step_id(self, e: int, sid: int) -> int:
        x = self.states[sid]
        y = self.apply(e, self.nf(x))
        return self.index[self.nf(y)]

    def nf(self, x: tuple[int, ...]) -> tuple[int, ...]:
        while self.first_violated(x) is not None:
            x = self.repair(x)
        return x
