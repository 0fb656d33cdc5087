"""The JSON-to-Python generator (rocq/gen/jsonpy.py): strict refusals and the constructs it translates.

Inputs are small MiniML JSON modules written here in the shape Coq 8.16's `Extraction Language JSON`
prints (see rocq/extracted/oracle.json), so the test needs no Coq.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

GEN_PATH = Path(__file__).parents[2] / "rocq" / "gen" / "jsonpy.py"
_spec = importlib.util.spec_from_file_location("jsonpy_under_test", GEN_PATH)
assert _spec and _spec.loader
jsonpy: Any = importlib.util.module_from_spec(_spec)
sys.modules["jsonpy_under_test"] = jsonpy
_spec.loader.exec_module(jsonpy)

J = dict[str, Any]


def ind(name: str, ctors: list[tuple[str, int]]) -> J:
    return {"what": "decl:ind", "name": name, "argnames": [],
            "constructors": [{"name": c, "argtypes": [{"what": "type:glob", "name": "nat", "args": []}] * k}
                             for c, k in ctors]}


BASE = [ind("bool", [("True", 0), ("False", 0)]), ind("nat", [("O", 0), ("S", 1)]),
        ind("list", [("Nil", 0), ("Cons", 2)]), ind("prod", [("Pair", 2)])]
TY = {"what": "type:glob", "name": "nat", "args": []}


def rel(n: str) -> J:
    return {"what": "expr:rel", "name": n}


def glob(n: str) -> J:
    return {"what": "expr:global", "name": n}


def app(f: J, *args: J) -> J:
    return {"what": "expr:apply", "func": f, "args": list(args)}


def lam(names: list[str], body: J) -> J:
    return {"what": "expr:lambda", "argnames": names, "body": body}


def con(n: str, *args: J) -> J:
    return {"what": "expr:constructor", "name": n, "args": list(args)}


def case(e: J, *cases: tuple[str, list[str], J]) -> J:
    return {"what": "expr:case", "expr": e,
            "cases": [{"what": "case", "pat": {"what": "pat:constructor", "name": c, "argnames": a},
                       "body": b} for c, a, b in cases]}


def let(n: str, v: J, b: J) -> J:
    return {"what": "expr:let", "name": n, "nameval": v, "body": b}


def term(name: str, value: J) -> J:
    return {"what": "decl:term", "name": name, "type": TY, "value": value}


def fix(name: str, value: J) -> J:
    return {"what": "decl:fixgroup",
            "fixlist": [{"what": "fixgroup:item", "name": name, "type": TY, "value": value}]}


def module(*decls: J, **flags: Any) -> J:
    return {"what": "module", "name": "Main", "need_magic": flags.get("magic", False), "need_dummy": False,
            "used_modules": [], "declarations": [*BASE, *decls]}


def generate(doc: J, roots: list[str], allow_unary: dict[str, str] | None = None) -> dict[str, Any]:
    text = jsonpy.Gen(doc, roots, False, allow_unary or {}).run("test.json", "0" * 64)
    namespace: dict[str, Any] = {}
    exec(compile(text, "<generated>", "exec"), namespace)  # the generated module, as Python runs it
    return namespace


def num(k: int) -> J:
    e = con("O")
    for _ in range(k):
        e = con("S", e)
    return e


# count n acc = match n with O => acc | S p => count p (S acc): unary recursion, tail position
COUNT = fix("count", lam(["n", "acc"], case(
    rel("n"), ("O", [], rel("acc")), ("S", ["p"], app(glob("count"), rel("p"), con("S", rel("acc")))))))


def test_unary_nat_recursion_is_refused_unless_allow_listed() -> None:
    with pytest.raises(jsonpy.GenError, match="unary nat recursion"):
        generate(module(COUNT), ["count"])
    ns = generate(module(COUNT), ["count"], {"count": "test"})
    assert ns["c_count"](200_000, 0) == 200_000  # a tail call became a loop: no recursion limit


def test_nat_literals_are_folded_and_successor_is_plus_one() -> None:
    ten = term("ten", lam([], num(10)))
    succ = term("succ", lam(["x"], con("S", rel("x"))))
    ns = generate(module(ten, succ), ["ten", "succ"])
    assert ns["c_ten"] == 10 and ns["c_succ"](41) == 42


def test_a_negative_nat_gives_no_answer() -> None:
    isz = term("isz", lam(["n"], case(rel("n"), ("O", [], con("True")), ("S", ["_"], con("False")))))
    ns = generate(module(isz), ["isz"])
    assert ns["c_isz"](0) is True and ns["c_isz"](3) is False
    with pytest.raises(Exception, match="_s"):
        ns["c_isz"](-1)


def test_non_tail_self_call_is_refused() -> None:
    # len l = match l with Nil => O | Cons _ t => S (len t)
    length = fix("len", lam(["l"], case(rel("l"), ("Nil", [], con("O")),
                                        ("Cons", ["_", "t"], con("S", app(glob("len"), rel("t")))))))
    with pytest.raises(jsonpy.GenError, match="non-tail self call"):
        generate(module(length), ["len"])


def test_let_outside_tail_position_partial_and_over_application() -> None:
    add = term("add2", lam(["a", "b"], case(rel("a"), ("O", [], rel("b")), ("S", ["p"], con("S", rel("b"))))))
    # f x = (let y = S x in y) paired with (add2 x) applied later: partial then full application
    f = term("f", lam(["x"], con("Pair", let("y", con("S", rel("x")), rel("y")),
                                  app(app(glob("add2"), rel("x")), num(5)))))
    # g = fun h => h 1 2 (over-application of a curried value)
    g = term("g", lam(["h"], app(rel("h"), num(1), num(2))))
    k = term("k", lam([], app(glob("g"), glob("add2"))))
    ns = generate(module(add, f, g, k), ["f", "k"])
    assert ns["c_f"](0) == (0, 1, 5)
    assert ns["c_f"](3) == (0, 4, 6)
    assert ns["c_k"] == 3


def test_closures_built_in_a_loop_keep_their_own_values() -> None:
    # mk n acc = match n with O => acc | S p => mk p (Cons (fun _ => n) acc): closures capture n per round
    mk = fix("mk", lam(["n", "acc"], case(rel("n"), ("O", [], rel("acc")),
                                          ("S", ["p"], app(glob("mk"), rel("p"),
                                                           con("Cons", lam(["z"], rel("n")), rel("acc")))))))
    ns = generate(module(mk), ["mk"], {"mk": "test"})
    lst, got = ns["c_mk"](3, (0,)), []
    while lst[0] == 1:
        got.append(lst[1](None))
        lst = lst[2]
    assert got == [1, 2, 3]


@pytest.mark.parametrize(
    "doc, message",
    [
        (module(term("x", {"what": "expr:fix", "funcs": [], "for": 0})), "unsupported JSON node kind"),
        (module(term("x", {"what": "expr:rel", "name": "y", "extra": 1})), "keys"),
        (module(term("prim_bogus", lam(["n"], rel("n"))),
                term("x", lam([], app(glob("prim_bogus"), num(1))))), "unknown primitive"),
        (module(term("x", lam([], num(1))), magic=True), "Obj.magic"),
        (module(term("x", lam([], glob("nowhere")))), "undeclared global"),
        (module({"what": "decl:fixgroup", "fixlist": [
            {"what": "fixgroup:item", "name": "a", "type": TY, "value": lam(["n"], app(glob("b"), rel("n")))},
            {"what": "fixgroup:item", "name": "b", "type": TY,
             "value": lam(["n"], app(glob("a"), rel("n")))}]},
            term("x", lam(["n"], app(glob("a"), rel("n"))))), "mutual recursion"),
        (module({"what": "decl:axiom", "name": "ax"}, term("x", lam([], num(0)))), "declaration kind"),
    ],
)
def test_the_generator_refuses(doc: J, message: str) -> None:
    with pytest.raises(jsonpy.GenError, match=message):
        generate(doc, ["x"])


def test_output_is_deterministic_and_says_where_it_comes_from() -> None:
    doc = module(COUNT)
    a = jsonpy.Gen(doc, ["count"], False, {"count": "r"}).run("x.json", "ab" * 32)
    b = jsonpy.Gen(doc, ["count"], False, {"count": "r"}).run("x.json", "ab" * 32)
    assert a == b
    assert a.startswith("# GENERATED by rocq/gen/jsonpy.py from x.json (sha256 " + "ab" * 32)
    assert "#   count: r" in a
