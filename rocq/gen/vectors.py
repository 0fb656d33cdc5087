#!/usr/bin/env python3
"""Compute vectors: run the table checker INSIDE Coq (vm_compute) on fixed inputs and record the results.

Usage: vectors.py COQC BUILD_DIR OUTPUT.json   (run from rocq/)
Writes BUILD_DIR/Vectors.v, runs it, and writes OUTPUT.json: a list of {"case": inputs, "coq": summary}
(a case with a "witness" runs check_tables_w with that normal-form and depth witness).
tests/oracle/test_vectors.py runs the generated Python on the same inputs and requires the same summary.
The cases are deterministic (seeded): small machines with repair cycles, non-commuting pairs, CC2
failures, reachable domains, declared pairs, invalid initial states and malformed tables.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from typing import Any

HEADER = """From Coq Require Import List ZArith.
From Govern Require Import Vec TableCheck Rules.
Import ListNotations.
Definition b2n (b : bool) : nat := if b then 1 else 0.
Definition summary (v : verdict) : list nat :=
  [b2n (v_wellformed v); b2n (v_certified v); b2n (v_wfc v); v_max_depth v; b2n (v_initial_valid v);
   b2n (v_domain_ok v); b2n (v_cc1 v); b2n (v_cc2 v); v_domain_size v]
  ++ match v_witness v with None => [0] | Some (a, b, s) => [1; a; b; s] end
  ++ [length (v_obligations v)] ++ flat_map (fun p => [fst p; snd p]) (v_obligations v)
  ++ [length (v_not_idem v)] ++ v_not_idem v
  ++ (if v_wfc v then vl (v_nf v) else []).
Definition rsummary (r : option nat) : list nat := match r with None => [0] | Some c => [1; c] end.
"""


def cases() -> list[dict[str, Any]]:
    rng = random.Random(20261130)
    out: list[dict[str, Any]] = []
    # hand-picked: the 4-state counter; a 2-cycle of repair; an invalid initial state
    out.append({"valid": [1, 1, 1, 0], "repair": [0, 1, 2, 2],
                "apply": [[1, 2, 3, 3], [0, 0, 0, 0]], "pairs": None, "reach": False, "init": 0})
    out.append({"valid": [1, 0, 0], "repair": [0, 2, 1], "apply": [[1, 1, 1]], "pairs": None, "reach": False,
                "init": 0})
    out.append({"valid": [0, 1], "repair": [1, 1], "apply": [[0, 1]], "pairs": None, "reach": True,
                "init": 0})
    out.append({"valid": [1], "repair": [0], "apply": [], "pairs": None, "reach": False, "init": 0})
    out.append({"valid": [1, 1], "repair": [0, 1], "apply": [[1, 1], [0, 0]], "pairs": [[0, 1]],
                "reach": True, "init": 0})
    # no pair declared: every pair is an obligation, the rotation is not idempotent
    out.append({"valid": [1, 1, 1], "repair": [0, 1, 2], "apply": [[1, 1, 1], [2, 2, 2], [1, 2, 0]],
                "pairs": [], "reach": False, "init": 0})
    for k in range(150):
        n = rng.randint(1, 7)
        valid = [rng.random() < 0.55 for _ in range(n)]
        if not any(valid):
            valid[rng.randrange(n)] = True
        valid_ids = [i for i in range(n) if valid[i]]
        repair = []
        for s in range(n):
            if valid[s]:
                repair.append(s)
            elif rng.random() < 0.8:
                repair.append(rng.choice(valid_ids))  # terminating
            else:
                repair.append(rng.randrange(n))  # may cycle
        e = rng.randint(0, 4)
        apply = [[rng.randrange(n) for _ in range(n)] for _ in range(e)]
        if rng.random() < 0.3 and e:
            # commuting-friendly: constant or identity events
            for row in apply:
                if rng.random() < 0.5:
                    row[:] = list(range(n))
        pairs: list[list[int]] | None = None
        if e >= 2 and rng.random() < 0.4:
            allp = [[a, b] for a in range(e) for b in range(a + 1, e)]
            pairs = rng.sample(allp, rng.randint(0, len(allp)))
        init = rng.choice(valid_ids) if rng.random() < 0.85 else rng.randrange(n)
        case = {"valid": [int(v) for v in valid], "repair": repair, "apply": apply, "pairs": pairs,
                "reach": rng.random() < 0.4, "init": init}
        if k % 25 == 7:  # malformed: an entry out of range
            case["repair"] = [*repair[:-1], n]
        if k % 25 == 13 and e:
            case["pairs"] = [[0, e]]
        if k % 25 == 19 and any(valid):
            s = valid_ids[0]
            case["repair"] = [(x if i != s else (s + 1) % n) for i, x in enumerate(repair)]
        out.append(case)
    return out


def _true_witness(c: dict[str, Any]) -> tuple[list[int], list[int]] | None:
    """The normal forms and repair depths of a case whose repair table is in range and terminates."""
    n, valid, repair = len(c["valid"]), c["valid"], c["repair"]
    if any(not 0 <= r < n for r in repair):
        return None
    nf, depth = [], []
    for s in range(n):
        x, k = s, 0
        while not valid[x] and k <= n:
            x, k = repair[x], k + 1
        if not valid[x]:
            return None
        nf.append(x)
        depth.append(k)
    return nf, depth


def witness_cases(base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same cases handed to check_tables_w with a witness: the true one, and wrong ones (a depth or a
    normal form changed at one state, all depths 0, a short vector, a repair cycle) that must give the
    malformed verdict."""
    rng = random.Random(4)
    out: list[dict[str, Any]] = []
    for k, c in enumerate(base):
        n = len(c["valid"])
        true = _true_witness(c)
        nf, depth = true if true is not None else (list(range(n)), [0] * n)
        kind = k % 6
        if true is None or kind in (0, 1, 2):
            pass  # the true witness (or, with a cycle or an out-of-range entry, any witness)
        elif kind == 3:
            s = rng.randrange(n)
            depth = [d + (1 if i == s else 0) for i, d in enumerate(depth)]
        elif kind == 4:
            s = rng.randrange(n)
            nf = [(x + 1) % n if i == s else x for i, x in enumerate(nf)]
        elif k % 12 == 5:
            depth = [0] * n
        else:
            depth = depth[:-1]
        out.append({**c, "witness": {"nf": nf, "depth": depth}})
    return out


OPS = {"add": "EAdd", "sub": "ESub", "min": "EMin", "max": "EMax", "ite": "EIte", "eq": "EEq",
       "lt": "ELt", "le": "ELe", "and": "EAnd", "or": "EOr", "not": "ENot"}


def evaluate(e: list[Any], x: list[int]) -> int:
    op, a = e[0], e[1:]
    if op == "var":
        return x[a[0]]
    if op == "lit":
        return int(a[0])
    v = [evaluate(s, x) for s in a]
    table = {"add": lambda: v[0] + v[1], "sub": lambda: v[0] - v[1], "min": lambda: min(v),
             "max": lambda: max(v), "ite": lambda: v[1] if v[0] else v[2], "eq": lambda: int(v[0] == v[1]),
             "lt": lambda: int(v[0] < v[1]), "le": lambda: int(v[0] <= v[1]),
             "and": lambda: int(bool(v[0]) and bool(v[1])), "or": lambda: int(bool(v[0]) or bool(v[1])),
             "not": lambda: int(not v[0])}
    return table[op]()


def random_expr(rng: random.Random, k: int, depth: int) -> list[Any]:
    r = rng.random()
    if depth == 0 or r < 0.3:
        return ["var", rng.randrange(k)] if rng.random() < 0.6 else ["lit", rng.randint(-3, 4)]
    if r < 0.4:
        return ["not", random_expr(rng, k, depth - 1)]
    if r < 0.5:
        return ["ite", *(random_expr(rng, k, depth - 1) for _ in range(3))]
    op = rng.choice(["add", "sub", "min", "max", "eq", "lt", "le", "and", "or"])
    return [op, random_expr(rng, k, depth - 1), random_expr(rng, k, depth - 1)]


def random_asg(rng: random.Random, nv: int) -> list[list[Any]]:
    return [[i, random_expr(rng, nv, 2)] for i in sorted(rng.sample(range(nv), rng.randint(0, nv)))]


def run_asg(a: list[list[Any]], x: list[int], s: int, strides: list[int]) -> int:
    """The new id (Z.to_nat of it: negative ids become 0) of a simultaneous assignment at state x = s."""
    y = list(x)
    for i, e in a:
        y[i] = evaluate(e, x)
    return max(0, s + sum((y[i] - x[i]) * strides[i] for i, _ in a))


def rules_cases() -> list[dict[str, Any]]:
    """Small machines (variables as (lo, size)) with the tables their rules define, some altered."""
    rng = random.Random(7)
    out = []
    for k in range(60):
        nv = rng.randint(1, 3)
        dom = [(rng.randint(-2, 1), rng.randint(1, 3)) for _ in range(nv)]
        strides = [1]
        for _, size in dom:
            strides.append(strides[-1] * size)
        n = strides[-1]

        invs = [[random_expr(rng, nv, 2), random_asg(rng, nv)] for _ in range(rng.randint(0, 2))]
        evs = [[random_expr(rng, nv, 2), random_asg(rng, nv)] for _ in range(rng.randint(0, 2))]

        valid, repair, apply = [], [], [[] for _ in evs]
        for s in range(n):
            x = [lo + (s // strides[i]) % size for i, (lo, size) in enumerate(dom)]
            bad = [inv for inv in invs if evaluate(inv[0], x) == 0]
            valid.append(int(not bad))
            repair.append(run_asg(bad[0][1], x, s, strides) if bad else s)
            for j, (g, eff) in enumerate(evs):
                apply[j].append(run_asg(eff, x, s, strides) if evaluate(g, x) else s)
        if k % 4 == 3:  # alter one entry
            which = rng.randrange(2 + len(evs))
            s = rng.randrange(n)
            if which == 0:
                valid[s] = 1 - valid[s]
            elif which == 1:
                repair[s] += 1
            else:
                apply[which - 2][s] += 1
        out.append({"vars": dom, "invs": invs, "evs": evs, "valid": valid, "repair": repair, "apply": apply})
    return out


def coq_z(z: int) -> str:
    return f"({z})%Z" if z < 0 else f"{z}%Z"


def coq_expr(e: list[Any]) -> str:
    if e[0] == "var":
        return f"(EVar {e[1]})"
    if e[0] == "lit":
        return f"(ELit {coq_z(e[1])})"
    return "(" + OPS[e[0]] + " " + " ".join(coq_expr(a) for a in e[1:]) + ")"


def coq_rules_term(c: dict[str, Any]) -> str:
    def rule(r: list[Any]) -> str:
        return "(" + coq_expr(r[0]) + ", [" + "; ".join(f"({i}, {coq_expr(e)})" for i, e in r[1]) + "])"

    vars_ = "[" + "; ".join(f"({coq_z(lo)}, {size})" for lo, size in c["vars"]) + "]"
    invs = "[" + "; ".join(rule(r) for r in c["invs"]) + "]"
    evs = "[" + "; ".join(rule(r) for r in c["evs"]) + "]"
    valid = "Mask [" + "; ".join("true" if v else "false" for v in c["valid"]) + "]"
    repair = f"Vec {nat_list(c['repair'])}"
    apply = "[" + "; ".join(f"Vec {nat_list(r)}" for r in c["apply"]) + "]"
    return f"rsummary (check_rules {vars_} {invs} {evs} ({valid}) ({repair}) {apply})"


def nat_list(xs: list[int]) -> str:
    return "[" + "; ".join(str(x) for x in xs) + "]"


def coq_term(c: dict[str, Any]) -> str:
    valid = "Mask [" + "; ".join("true" if v else "false" for v in c["valid"]) + "]"
    repair = f"Vec {nat_list(c['repair'])}"
    apply = "[" + "; ".join(f"Vec {nat_list(r)}" for r in c["apply"]) + "]"
    pairs = "None" if c["pairs"] is None else "Some [" + "; ".join(f"({a}, {b})" for a, b in c["pairs"]) + "]"
    reach = "true" if c["reach"] else "false"
    if "witness" in c:
        w = c["witness"]
        return (f"summary (check_tables_w ({valid}) ({repair}) {apply} ({pairs}) {reach} {c['init']} "
                f"(Vec {nat_list(w['nf'])}) (Vec {nat_list(w['depth'])}))")
    return f"summary (check_tables ({valid}) ({repair}) {apply} ({pairs}) {reach} {c['init']})"


def main(argv: list[str]) -> int:
    coqc, build, output = argv
    cs = cases()
    cs += witness_cases(cs)
    rcs = rules_cases()
    src = os.path.join(build, "Vectors.v")
    with open(src, "w", encoding="utf-8") as fh:
        fh.write(HEADER)
        for c in cs:
            fh.write(f"Eval vm_compute in {coq_term(c)}.\n")
        for c in rcs:
            fh.write(f"Eval vm_compute in {coq_rules_term(c)}.\n")
    res = subprocess.run([coqc, "-Q", "theories", "Govern", src], capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout + res.stderr, file=sys.stderr)
        return 1
    results = re.findall(r"=\s*\[([^\]]*)\]\s*:\s*list nat", res.stdout)
    if len(results) != len(cs) + len(rcs):
        print(f"vectors: expected {len(cs) + len(rcs)} results, parsed {len(results)}", file=sys.stderr)
        return 1
    records: list[dict[str, Any]] = []
    for c, r in zip([*cs, *rcs], results, strict=True):
        nums = [int(x) for x in r.replace("\n", " ").split(";") if x.strip()]
        records.append({"case": c, "coq": nums} if "vars" not in c else {"rules": c, "coq": nums})
    tmp = output + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        json.dump(records, fh, indent=None, separators=(",", ":"))
        fh.write("\n")
    os.replace(tmp, output)
    tables = [r for r in records if "case" in r]
    rules = [r for r in records if "rules" in r]
    print(f"vectors: {len(tables)} table-checker vectors ({sum(r['coq'][1] for r in tables)} certified, "
          f"{sum(1 for r in tables if 'witness' in r['case'])} with a witness), "
          f"{len(rules)} rules-checker vectors ({sum(1 - r['coq'][0] for r in rules)} match)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
