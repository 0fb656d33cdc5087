"""A plain brute-force reading of docs/semantics.md for the rules tests: tables from rules, state by state."""

from __future__ import annotations

import random
from typing import Any

Expr = list[Any]


def evaluate(e: Expr, x: list[int]) -> int:
    op = e[0]
    if op == "var":
        return x[e[1]]
    if op == "lit":
        return int(e[1])
    a = [evaluate(s, x) for s in e[1:]]
    if op == "add":
        return a[0] + a[1]
    if op == "sub":
        return a[0] - a[1]
    if op == "min":
        return min(a)
    if op == "max":
        return max(a)
    if op == "ite":
        return a[1] if a[0] != 0 else a[2]
    if op == "eq":
        return int(a[0] == a[1])
    if op == "lt":
        return int(a[0] < a[1])
    if op == "le":
        return int(a[0] <= a[1])
    if op == "and":
        return int(a[0] != 0 and a[1] != 0)
    if op == "or":
        return int(a[0] != 0 or a[1] != 0)
    if op == "not":
        return int(a[0] == 0)
    raise ValueError(op)


def domains(rules: dict[str, Any]) -> list[tuple[int, int]]:
    out = []
    for v in rules["variables"]:
        if v["kind"] == "bool":
            out.append((0, 2))
        elif v["kind"] == "enum":
            out.append((0, len(v["labels"])))
        else:
            out.append((v["min"], v["max"] - v["min"] + 1))
    return out


def tables(rules: dict[str, Any]) -> tuple[list[bool], list[int], list[list[int]], bool]:
    """valid, repair, apply, and whether some assignment the tables use leaves a domain."""
    dom = domains(rules)
    strides = [1]
    for _, size in dom:
        strides.append(strides[-1] * size)
    n = strides[-1]

    def decode(s: int) -> list[int]:
        return [lo + (s // strides[i]) % size for i, (lo, size) in enumerate(dom)]

    violation = False

    def assign(asg: list[Any], x: list[int]) -> int:
        nonlocal violation
        y = list(x)
        for i, e in asg:
            y[i] = evaluate(e, x)
        for i, (lo, size) in enumerate(dom):
            if not lo <= y[i] < lo + size:
                violation = True
                y[i] = lo  # any in-range value: the oracle must refuse regardless
        return sum((y[i] - lo) * strides[i] for i, (lo, _) in enumerate(dom))

    valid, repair = [], []
    apply: list[list[int]] = [[] for _ in rules["events"]]
    for s in range(n):
        x = decode(s)
        bad = [inv for inv in rules["invariants"] if evaluate(inv["holds"], x) == 0]
        valid.append(not bad)
        repair.append(assign(bad[0]["repair"], x) if bad else s)
        for k, ev in enumerate(rules["events"]):
            apply[k].append(assign(ev["effect"], x) if evaluate(ev["guard"], x) != 0 else s)
    return valid, repair, apply, violation


OPS2 = ["add", "sub", "min", "max", "eq", "lt", "le", "and", "or"]


def random_expr(rng: random.Random, k: int, depth: int) -> Expr:
    r = rng.random()
    if depth == 0 or r < 0.3:
        return ["var", rng.randrange(k)] if rng.random() < 0.6 else ["lit", rng.randint(-3, 4)]
    if r < 0.4:
        return ["not", random_expr(rng, k, depth - 1)]
    if r < 0.5:
        return ["ite", *(random_expr(rng, k, depth - 1) for _ in range(3))]
    return [rng.choice(OPS2), random_expr(rng, k, depth - 1), random_expr(rng, k, depth - 1)]


def random_machine(rng: random.Random) -> dict[str, Any]:
    k = rng.randint(1, 3)
    variables: list[dict[str, Any]] = []
    for i in range(k):
        kind = rng.choice(["bool", "enum", "int"])
        if kind == "bool":
            variables.append({"name": f"v{i}", "kind": "bool"})
        elif kind == "enum":
            labels = [f"l{j}" for j in range(rng.randint(2, 4))]
            variables.append({"name": f"v{i}", "kind": "enum", "labels": labels})
        else:
            lo = rng.randint(-3, 2)
            variables.append({"name": f"v{i}", "kind": "int", "min": lo, "max": lo + rng.randint(0, 3)})

    def asg() -> list[Any]:
        idx = sorted(rng.sample(range(k), rng.randint(0, k)))
        return [[i, random_expr(rng, k, 2)] for i in idx]

    invs = [{"name": f"i{j}", "holds": random_expr(rng, k, 2), "repair": asg()}
            for j in range(rng.randint(0, 2))]
    evs = [{"name": f"e{j}", "guard": random_expr(rng, k, 2), "effect": asg()}
           for j in range(rng.randint(0, 3))]
    return {"name": "m", "variables": variables, "initial": [0] * k, "invariants": invs, "events": evs,
            "independent": None, "domain": "valid"}
