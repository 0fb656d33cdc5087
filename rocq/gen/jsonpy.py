#!/usr/bin/env python3
"""Translate Coq's JSON (MiniML) extraction into a plain Python module.

Usage: jsonpy.py INPUT.json OUTPUT.py --roots NAME[,NAME...] [--reference] [--allow-unary NAME=REASON ...]

Representation (the generator's own trusted meaning of each name):
  nat      -> Python int >= 0   (first constructor = 0, second = successor)
  bool     -> Python True/False (first constructor = True)
  any other inductive -> tuple (constructor index, arguments...)
  vec/mask -> opaque values only the mapped primitives touch (numpy arrays at run time);
              in --reference mode they are ordinary inductives.
  prim_*   -> functions of govern.oracle._prims; their printed bodies are never translated.

Strict: an unknown JSON node kind or key, a local fixpoint, mutual recursion, Obj.magic,
an axiom, an unknown primitive, a non-tail self call, or a self call on the predecessor of a
nat (unary recursion) not allow-listed with a reason is an error.  Self tail calls become
loops.  Only declarations reachable from the roots are emitted.  Output is deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import keyword
import os
import sys
from typing import Any

Json = dict[str, Any]
Fix = tuple[str, list[str]] | None  # the fixpoint being emitted and its parameters (tail calls loop)

# name -> (arity, python expression of the implementation, lazy boolean operator or None)
PRIMS: dict[str, tuple[int, str]] = {
    "prim_vlen": (1, "_P.vlen"),
    "prim_mlen": (1, "_P.mlen"),
    "prim_viota": (1, "_P.viota"),
    "prim_vgather": (2, "_P.vgather"),
    "prim_mgather": (2, "_P.mgather"),
    "prim_vselect": (3, "_P.vselect"),
    "prim_vadd": (2, "_P.vadd"),
    "prim_veq": (2, "_P.veq"),
    "prim_vequals": (2, "_P.vequals"),
    "prim_vnotbit": (1, "_P.vnotbit"),
    "prim_vmax": (1, "_P.vmax"),
    "prim_vnth": (2, "_P.vnth"),
    "prim_mnth": (2, "_P.mnth"),
    "prim_mall": (1, "_P.mall"),
    "prim_mor": (2, "_P.mor"),
    "prim_mcount": (1, "_P.mcount"),
    "prim_mwhere": (1, "_P.mwhere"),
    "prim_mmark": (2, "_P.mmark"),
    "prim_mfirst_false": (1, "_P.mfirst_false"),
    "prim_vrank": (1, "_P.vrank"),
    "prim_vgeq": (4, "_P.vgeq"),
    "prim_mallat": (2, "_P.mallat"),
    "prim_vjump": (2, "_P.vjump"),
    "prim_vstepok": (4, "_P.vstepok"),
    "prim_nat_eqb": (2, "_P.nat_eqb"),
    "prim_nat_ltb": (2, "_P.nat_ltb"),
    "prim_nat_leb": (2, "_P.nat_leb"),
    "prim_nat_add": (2, "_P.nat_add"),
    "prim_nat_log2": (1, "_P.nat_log2"),
    "prim_andb": (2, "_P.andb"),
    "prim_zlen": (1, "_P.zlen"),
    "prim_zconst": (2, "_P.zconst"),
    "prim_zcol": (4, "_P.zcol"),
    "prim_zadd": (2, "_P.zadd"),
    "prim_zaxpy": (4, "_P.zaxpy"),
    "prim_zinand": (4, "_P.zinand"),
    "prim_mnone": (2, "_P.mnone"),
    "prim_vseleq": (4, "_P.vseleq"),
    "prim_zsub": (2, "_P.zsub"),
    "prim_zmin": (2, "_P.zmin"),
    "prim_zmax": (2, "_P.zmax"),
    "prim_zeq": (2, "_P.zeq"),
    "prim_zlt": (2, "_P.zlt"),
    "prim_zle": (2, "_P.zle"),
    "prim_zand": (2, "_P.zand"),
    "prim_zor": (2, "_P.zor"),
    "prim_znot": (1, "_P.znot"),
    "prim_zmulc": (2, "_P.zmulc"),
    "prim_zite": (3, "_P.zite"),
    "prim_znz": (1, "_P.znz"),
    "prim_zinrange": (3, "_P.zinrange"),
    "prim_ztonat": (1, "_P.ztonat"),
    "prim_mand": (2, "_P.mand"),
    "prim_mandn": (2, "_P.mandn"),
    "prim_nat_mul": (2, "_P.nat_mul"),
    "prim_z_add": (2, "_P.z_add"),
    "prim_z_of_nat": (1, "_P.z_of_nat"),
}
LAZY_AND = "prim_andb"
OPAQUE_TYPES = ("vec", "mask", "zvec")
# Integers: Z (Z0 | Zpos p | Zneg p) and positive (xI p | xO p | xH) are Python ints; only their
# constructors may appear (literals), never a match on them.
INT_TYPES = ("z", "positive")

EXPR_KEYS = {
    "expr:rel": {"what", "name"},
    "expr:global": {"what", "name"},
    "expr:apply": {"what", "func", "args"},
    "expr:lambda": {"what", "argnames", "body"},
    "expr:constructor": {"what", "name", "args"},
    "expr:case": {"what", "expr", "cases"},
    "expr:let": {"what", "name", "nameval", "body"},
}
PAT_KEYS = {"pat:constructor": {"what", "name", "argnames"}, "pat:wild": {"what"}}


class GenError(Exception):
    pass


def check_keys(node: Json, table: dict[str, set[str]]) -> str:
    kind = node.get("what")
    if kind not in table:
        raise GenError(f"unsupported JSON node kind {kind!r}")
    if set(node) != table[kind]:
        raise GenError(f"node {kind} has keys {sorted(node)}, expected {sorted(table[kind])}")
    return str(kind)


def ident(name: str, prefix: str) -> str:
    out = []
    for ch in name:
        if ch.isalnum() or ch == "_":
            out.append(ch)
        elif ch == "'":
            out.append("_q")
        else:
            raise GenError(f"unexpected character in name {name!r}")
    base = "".join(out)
    if keyword.iskeyword(base):
        base += "_"
    return prefix + base


class Ctor:
    def __init__(self, ind: str, index: int, arity: int) -> None:
        self.ind, self.index, self.arity = ind, index, arity


class Gen:
    def __init__(self, doc: Json, roots: list[str], reference: bool, allow_unary: dict[str, str],
                 allow_nontail: dict[str, str] | None = None) -> None:
        self.reference = reference
        self.allow_unary = allow_unary
        self.allow_nontail = allow_nontail or {}
        self.nontail_used: dict[str, str] = {}
        self.roots = roots
        for key in ("what", "name", "need_magic", "need_dummy", "used_modules", "declarations"):
            if key not in doc:
                raise GenError(f"module lacks key {key}")
        if set(doc) != {"what", "name", "need_magic", "need_dummy", "used_modules", "declarations"}:
            raise GenError(f"unexpected module keys {sorted(doc)}")
        if doc["need_magic"] or doc["need_dummy"] or doc["used_modules"]:
            raise GenError("Obj.magic, dummies or modular extraction are refused")
        self.ctors: dict[str, Ctor] = {}
        self.inds: dict[str, list[str]] = {}
        self.terms: dict[str, Json] = {}  # name -> value
        self.fixes: set[str] = set()
        self.mutual: dict[str, str] = {}  # refused if reachable
        self.order: list[str] = []
        for decl in doc["declarations"]:
            self.read_decl(decl)
        for ind, names in (("nat", 2), ("bool", 2), ("z", 3), ("positive", 3)):
            if len(self.inds.get(ind, [None] * names)) != names:
                raise GenError(f"{ind} must have exactly {names} constructors")
        self.arity: dict[str, int] = {}
        for name, value in self.terms.items():
            self.arity[name] = len(value["argnames"]) if value.get("what") == "expr:lambda" else 0
        self.lines: list[str] = []
        self.counter = 0
        self.unary_used: dict[str, str] = {}
        self.pred_vars: set[str] = set()
        self.current: str | None = None

    # ---- declarations -------------------------------------------------------------------------
    def read_decl(self, decl: Json) -> None:
        kind = decl.get("what")
        if kind == "decl:ind":
            if set(decl) != {"what", "name", "argnames", "constructors"}:
                raise GenError(f"decl:ind keys {sorted(decl)}")
            names = []
            for i, c in enumerate(decl["constructors"]):
                if set(c) != {"name", "argtypes"}:
                    raise GenError("constructor keys")
                if c["name"] in self.ctors:
                    raise GenError(f"duplicate constructor name {c['name']}")
                self.ctors[c["name"]] = Ctor(decl["name"], i, len(c["argtypes"]))
                names.append(c["name"])
            self.inds[decl["name"]] = names
        elif kind == "decl:type":  # a type abbreviation: nothing to run
            if set(decl) != {"what", "name", "argnames", "value"}:
                raise GenError(f"decl:type keys {sorted(decl)}")
        elif kind == "decl:term":
            if set(decl) != {"what", "name", "type", "value"}:
                raise GenError(f"decl:term keys {sorted(decl)}")
            self.add_term(decl["name"], decl["value"])
        elif kind == "decl:fixgroup":
            if set(decl) != {"what", "fixlist"}:
                raise GenError("decl:fixgroup keys")
            group = [f.get("name") for f in decl["fixlist"]]
            for item in decl["fixlist"]:
                if set(item) != {"what", "name", "type", "value"} or item["what"] != "fixgroup:item":
                    raise GenError("fixgroup:item keys")
                self.add_term(item["name"], item["value"])
                self.fixes.add(item["name"])
                if len(group) > 1:
                    self.mutual[item["name"]] = ", ".join(group)
        else:
            raise GenError(f"unsupported declaration kind {kind!r}")

    def add_term(self, name: str, value: Json) -> None:
        if name in self.terms:
            raise GenError(f"duplicate declaration {name}")
        self.terms[name] = value
        self.order.append(name)

    # ---- reachability -----------------------------------------------------------------------------
    def globals_of(self, node: Any, acc: set[str]) -> None:
        if isinstance(node, dict):
            if node.get("what") == "expr:global":
                acc.add(node["name"])
            for v in node.values():
                self.globals_of(v, acc)
        elif isinstance(node, list):
            for v in node:
                self.globals_of(v, acc)

    def reachable(self) -> list[str]:
        seen: set[str] = set()
        todo = list(self.roots)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            if name not in self.terms:
                raise GenError(f"reference to undeclared global {name}")
            seen.add(name)
            if name in self.mutual and not self.reference:
                raise GenError(f"mutual recursion is refused: {self.mutual[name]}")
            if self.is_prim(name):
                continue
            deps: set[str] = set()
            self.globals_of(self.terms[name], deps)
            todo.extend(sorted(deps))
        return [n for n in self.order if n in seen]

    def is_prim(self, name: str) -> bool:
        if name.startswith("prim_"):
            if self.reference:
                raise GenError(f"reference extraction must not map {name}")
            if name not in PRIMS:
                raise GenError(f"unknown primitive {name}")
            return True
        return False

    # ---- emission helpers -------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"_{base}{self.counter}"

    def ctor(self, name: str) -> Ctor:
        if name not in self.ctors:
            raise GenError(f"unknown constructor {name}")
        c = self.ctors[name]
        if c.ind in OPAQUE_TYPES and not self.reference:
            raise GenError(f"constructor {name} of opaque type {c.ind} used outside the primitives")
        return c

    # ---- expressions -------------------------------------------------------------------------------
    def expr(self, node: Json, env: dict[str, str], out: list[str], ind: str) -> str:
        """Python expression for node; helper statements (hoisted matches) go to out."""
        kind = check_keys(node, EXPR_KEYS)
        if kind == "expr:rel":
            if node["name"] not in env:
                raise GenError(f"unbound variable {node['name']}")
            return env[node["name"]]
        if kind == "expr:global":
            return self.global_value(node["name"])
        if kind == "expr:constructor":
            return self.construct(node, env, out, ind)
        if kind == "expr:apply":
            return self.apply(node, env, out, ind)
        if kind == "expr:lambda":
            return self.lambda_(node, env, out, ind)
        # case / let in expression position: hoist into a local function called at once
        name = self.fresh("h")
        out.append(f"{ind}def {name}():")
        body: list[str] = []
        self.stmt(node, env, body, ind + "    ", None)
        out.extend(body)
        return f"{name}()"

    def global_value(self, name: str) -> str:
        if name == self.current and not self.reference:
            raise GenError(f"{name} refers to itself as a value")
        if self.is_prim(name):
            arity, impl = PRIMS[name]
            return impl if arity == 1 else f"_curry({impl}, {arity})"
        ar = self.arity[name]
        py = ident(name, "c_")
        if ar == 0:
            return py
        return py if ar == 1 else f"_curry({py}, {ar})"

    def construct(self, node: Json, env: dict[str, str], out: list[str], ind: str) -> str:
        c = self.ctor(node["name"])
        args = node["args"]
        if len(args) != c.arity:
            raise GenError(f"constructor {node['name']} applied to {len(args)} args, arity {c.arity}")
        if c.ind == "nat":
            if c.index == 0:
                return "0"
            # fold literal chains S (S (... O))
            depth, inner = 0, node
            while inner.get("what") == "expr:constructor" and inner["name"] == node["name"]:
                depth += 1
                inner = inner["args"][0]
            if inner.get("what") == "expr:constructor" and self.ctor(inner["name"]).ind == "nat":
                return str(depth)
            return f"({self.expr(inner, env, out, ind)} + {depth})"
        if c.ind == "bool":
            return "True" if c.index == 0 else "False"
        if c.ind in INT_TYPES and not self.reference:
            return str(self.int_literal(node))
        parts = [str(c.index)] + [self.expr(a, env, out, ind) for a in args]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    def int_literal(self, node: Json) -> int:
        """The value of a closed Z or positive literal."""
        if node.get("what") != "expr:constructor":
            raise GenError("Z and positive constructors may only build literals")
        c = self.ctor(node["name"])
        args = node["args"]
        if c.ind == "z":
            return 0 if c.index == 0 else (1 if c.index == 1 else -1) * self.int_literal(args[0])
        if c.ind == "positive":
            if c.index == 2:
                return 1
            return 2 * self.int_literal(args[0]) + (1 if c.index == 0 else 0)
        raise GenError(f"{node['name']} inside an integer literal")

    def apply(self, node: Json, env: dict[str, str], out: list[str], ind: str) -> str:
        func, args = node["func"], node["args"]
        if func.get("what") == "expr:global":
            name = func["name"]
            if self.is_prim(name):
                arity, impl = PRIMS[name]
                if name == LAZY_AND and len(args) == 2:
                    left = self.expr(args[0], env, out, ind)
                    right_out: list[str] = []
                    right = self.expr(args[1], env, right_out, ind + "    ")
                    if right_out:
                        # keep the right operand lazy even when it needs statements
                        fn = self.fresh("r")
                        out.append(f"{ind}def {fn}():")
                        out.extend(right_out)
                        out.append(f"{ind}    return {right}")
                        right = f"{fn}()"
                    return f"({left} and {right})"
            else:
                if name == self.current and not self.reference:
                    if name not in self.allow_nontail:
                        raise GenError(f"non-tail self call in {name} (allow-list it with a reason)")
                    self.nontail_used[name] = self.allow_nontail[name]
                arity, impl = self.arity[name], ident(name, "c_")
                if arity == 0:
                    return self.call_curried(impl, args, env, out, ind)
            vals = [self.expr(a, env, out, ind) for a in args]
            if len(vals) == arity:
                return f"{impl}({', '.join(vals)})"
            if len(vals) > arity:
                head = f"{impl}({', '.join(vals[:arity])})"
                return head + "".join(f"({v})" for v in vals[arity:])
            return f"_curry({impl}, {arity})" + "".join(f"({v})" for v in vals)
        if func.get("what") == "expr:constructor":
            raise GenError("applied constructor expression is not supported")
        f = self.expr(func, env, out, ind)
        return self.call_curried(f, args, env, out, ind)

    def call_curried(self, f: str, args: list[Json], env: dict[str, str], out: list[str], ind: str) -> str:
        vals = [self.expr(a, env, out, ind) for a in args]
        return f + "".join(f"({v})" for v in vals)

    def lambda_(self, node: Json, env: dict[str, str], out: list[str], ind: str) -> str:
        # A closure: a factory receiving the current values of the free variables, so a
        # closure built in a loop keeps the values of its iteration (no late binding).
        argnames = node["argnames"]
        if not argnames:
            raise GenError("zero-argument lambda in expression position")
        free = sorted(set(env.values()))
        fac = self.fresh("mk")
        inner_env = dict(env)
        params = []
        for a in argnames:
            p = self.local(a)
            inner_env[a] = p
            params.append(p)
        out.append(f"{ind}def {fac}({', '.join(free)}):")
        body: list[str] = []
        # curried: one nested function per argument
        cur_ind = ind + "    "
        names = []
        for p in params:
            fn = self.fresh("lam")
            names.append(fn)
            body.append(f"{cur_ind}def {fn}({p}):")
            cur_ind += "    "
        self.stmt(node["body"], inner_env, body, cur_ind, None)
        for fn in reversed(names):
            cur_ind = cur_ind[:-4]
            body.append(f"{cur_ind}return {fn}")
        out.extend(body)
        return f"{fac}({', '.join(free)})"

    def local(self, name: str) -> str:
        if name == "_":
            return self.fresh("u")
        return ident(name, "v_")

    # ---- statements ----------------------------------------------------------------------------------
    def stmt(self, node: Json, env: dict[str, str], out: list[str], ind: str, self_fix: Fix) -> None:
        """Statements computing node in tail position (return, or loop for a self tail call)."""
        kind = check_keys(node, EXPR_KEYS)
        if kind == "expr:let":
            val = self.expr(node["nameval"], env, out, ind)
            var = self.local(node["name"])
            out.append(f"{ind}{var} = {val}")
            env2 = dict(env)
            env2[node["name"]] = var
            self.stmt(node["body"], env2, out, ind, self_fix)
            return
        if kind == "expr:case":
            self.case(node, env, out, ind, self_fix)
            return
        if kind == "expr:apply" and self_fix is not None:
            func = node["func"]
            if func.get("what") == "expr:global" and func["name"] == self_fix[0]:
                params = self_fix[1]
                if len(node["args"]) != len(params):
                    raise GenError(f"self call of {self_fix[0]} with wrong arity")
                vals = [self.expr(a, env, out, ind) for a in node["args"]]
                out.append(f"{ind}{', '.join(params)} = {', '.join(vals)}")
                out.append(f"{ind}continue")
                return
        out.append(f"{ind}return {self.expr(node, env, out, ind)}")

    def case(self, node: Json, env: dict[str, str], out: list[str], ind: str, self_fix: Fix) -> None:
        scrut = self.expr(node["expr"], env, out, ind)
        s = self.fresh("s")
        out.append(f"{ind}{s} = {scrut}")
        first = True
        exhaustive = False
        for case in node["cases"]:
            if set(case) != {"what", "pat", "body"} or case["what"] != "case":
                raise GenError("case keys")
            pat = case["pat"]
            pkind = check_keys(pat, PAT_KEYS)
            env2 = dict(env)
            binds: list[str] = []
            if pkind == "pat:wild":
                cond = "True"
                exhaustive = True
            else:
                c = self.ctor(pat["name"])
                names = pat["argnames"]
                if len(names) != c.arity:
                    raise GenError(f"pattern {pat['name']} arity")
                if c.ind == "nat":
                    if c.index == 0:
                        cond = f"{s} == 0"
                    else:
                        cond = f"{s} > 0"
                        if names[0] != "_":
                            v = self.local(names[0])
                            env2[names[0]] = v
                            binds.append(f"{v} = {s} - 1")
                            self.pred_vars.add(v)
                elif c.ind == "bool":
                    cond = f"{s} is True" if c.index == 0 else f"{s} is False"
                elif c.ind in INT_TYPES and not self.reference:
                    raise GenError(f"match on {c.ind} outside the primitives")
                else:
                    cond = f"{s}[0] == {c.index}"
                    for i, nm in enumerate(names):
                        if nm != "_":
                            v = self.local(nm)
                            env2[nm] = v
                            binds.append(f"{v} = {s}[{i + 1}]")
            out.append(f"{ind}{'if' if first else 'elif'} {cond}:")
            first = False
            for b in binds:
                out.append(f"{ind}    {b}")
            self.check_unary(case["body"], env2, self_fix)
            self.stmt(case["body"], env2, out, ind + "    ", self_fix)
        if not exhaustive:
            out.append(f"{ind}raise _Stuck({s!r})")

    def check_unary(self, body: Json, env: dict[str, str], self_fix: Fix) -> None:
        if self_fix is None:
            return
        name = self_fix[0]
        calls: list[Json] = []

        def walk(n: Any) -> None:
            if isinstance(n, dict):
                func = n.get("func", {})
                if n.get("what") == "expr:apply" and func.get("what") == "expr:global" \
                        and func["name"] == name:
                    calls.append(n)
                for v in n.values():
                    walk(v)
            elif isinstance(n, list):
                for v in n:
                    walk(v)

        walk(body)
        for call in calls:
            for a in call["args"]:
                if a.get("what") == "expr:rel" and env.get(a["name"]) in self.pred_vars:
                    if name not in self.allow_unary and not self.reference:
                        raise GenError(f"unary nat recursion in {name} (allow-list it with a reason)")
                    self.unary_used[name] = self.allow_unary.get(name, "reference extraction")

    # ---- functions -----------------------------------------------------------------------------------
    def function(self, name: str) -> None:
        value = self.terms[name]
        py = ident(name, "c_")
        self.pred_vars = set()
        self.current = name if name in self.fixes else None
        if value.get("what") != "expr:lambda" or not value["argnames"]:
            if name in self.fixes:
                raise GenError(f"recursive constant {name}")
            inner = value["body"] if value.get("what") == "expr:lambda" else value
            out: list[str] = [f"def _init_{py}():"]
            self.stmt(inner, {}, out, "    ", None)
            self.lines.extend(out)
            self.lines.append(f"{py} = _init_{py}()")
            self.lines.append("")
            return
        check_keys(value, EXPR_KEYS)
        env: dict[str, str] = {}
        params = []
        for a in value["argnames"]:
            p = self.local(a) if a != "_" else self.fresh("u")
            env[a] = p
            params.append(p)
        if len(set(params)) != len(params):
            raise GenError(f"duplicate parameter names in {name}")
        out = [f"def {py}({', '.join(params)}):"]
        if name in self.fixes:
            body: list[str] = []
            self.stmt(value["body"], env, body, "        ", (name, params))
            out.append("    while True:")
            out.extend(body)
        else:
            self.stmt(value["body"], env, out, "    ", None)
        self.lines.extend(out)
        self.lines.append("")


    def run(self, source_name: str, source_sha: str) -> str:
        names = self.reachable()
        header = [
            f"# GENERATED by rocq/gen/jsonpy.py from {source_name} (sha256 {source_sha}).",
            "# Never edit by hand: `make -C rocq check` regenerates it and fails on any difference.",
            "# ruff: noqa",
            "# mypy: ignore-errors",
            "from __future__ import annotations",
            "",
        ]
        if not self.reference:
            header.append("from govern.oracle import _prims as _P")
            header.append("")
        header += [
            "",
            "class _Stuck(Exception):",
            '    """A match met a value outside its type: no verdict."""',
            "",
            "",
            "def _curry(f, n, args=()):",
            "    if n == 0:",
            "        return f(*args)",
            "    return lambda x: _curry(f, n - 1, args + (x,))",
            "",
            "",
        ]
        for name in names:
            if self.is_prim(name):
                continue
            self.function(name)
            self.lines.append("")
        notes = ["# Unary nat recursion allowed:"]
        notes += [f"#   {k}: {v}" for k, v in sorted(self.unary_used.items())]
        notes += ["# Non-tail recursion allowed:"]
        notes += [f"#   {k}: {v}" for k, v in sorted(self.nontail_used.items())]
        roots = ["", "__all__ = [" + ", ".join(repr(ident(r, "c_")) for r in self.roots) + "]", ""]
        text = "\n".join(header + notes + ["", ""] + self.lines).rstrip() + "\n" + "\n".join(roots)
        return text


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--roots", required=True)
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--allow-unary", action="append", default=[])
    ap.add_argument("--allow-nontail", action="append", default=[])
    ns = ap.parse_args(argv)

    def allow_list(items: list[str]) -> dict[str, str]:
        out = {}
        for item in items:
            name, _, reason = item.partition("=")
            if not reason:
                raise SystemExit(f"allow-list entry {name} needs a reason")
            out[name] = reason
        return out

    allow, nontail = allow_list(ns.allow_unary), allow_list(ns.allow_nontail)
    with open(ns.input, "rb") as fh:
        raw = fh.read()
    doc = json.loads(raw)
    try:
        text = Gen(doc, ns.roots.split(","), ns.reference, allow, nontail).run(
            "rocq/extracted/" + os.path.basename(ns.input), hashlib.sha256(raw).hexdigest())
    except GenError as err:
        print(f"jsonpy: {err}", file=sys.stderr)
        return 1
    tmp = ns.output + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)

    os.replace(tmp, ns.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
