"""The machine as data (docs/semantics.md, "The machine as data"), back to the declarations a build reads.

A symbolic machine is determined by its rules alone, so re-checking one read from a file (a saved
machine, a symbolic certificate) means deciding its rules again: this turns them into the `Snapshot`
the symbolic route takes. The input may be hostile, so every position, literal and arity is checked
(`ValueError`); the caller also requires `snapshot.rules_json(domain)` to give back the very rules it
read, so nothing is accepted by being read leniently.
"""

from __future__ import annotations

from typing import Any

from ..model._declarations import EventRule, InvariantRule, Snapshot
from ..model._expr import BOOL, INT, Expr, ExprType, _arith, _bool_op, _cmp, _eq, _lit, _not
from ..model._space import VarSpec

__all__ = ["check_rule_names", "snapshot_from_rules", "variable_spec", "variable_specs"]

_ARITY = {"add": 2, "sub": 2, "min": 2, "max": 2, "ite": 3, "eq": 2, "lt": 2, "le": 2, "and": 2, "or": 2,
          "not": 1}


def _int(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    if type(value) is not int or (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{what}: {value!r} is not an integer in {low}..{high}")
    return value


def _is_text(value: Any, *, empty: bool = False) -> bool:
    """True for a string a build can write: UTF-8 text (no lone surrogate), non-empty unless `empty`."""
    if not isinstance(value, str) or not (value or empty):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _expr(node: Any, specs: tuple[VarSpec, ...]) -> Expr:
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise ValueError(f"{node!r} is not an expression [op, args...]")
    op, args = node[0], node[1:]
    if op == "var" and len(args) == 1:
        v = specs[_int(args[0], "a variable position", 0, len(specs) - 1)]
        typ = ExprType(v.kind, v.labels) if v.kind == "enum" else ExprType(v.kind)
        return Expr("var", (), args[0], typ, v.lo, v.hi)
    if op == "lit" and len(args) == 1:
        return _lit(_int(args[0], "a literal"), INT)
    if _ARITY.get(op) != len(args):
        raise ValueError(f"unknown operator or wrong arity: {op!r} with {len(args)} arguments")
    sub = [_expr(a, specs) for a in args]
    for condition in sub if op in ("and", "or", "not") else sub[:1] if op == "ite" else ():
        _truth_literal(condition)
    if op in ("add", "sub", "min", "max"):
        return _arith(op, sub[0], sub[1])
    if op == "ite":
        lo, hi = min(sub[1].bounds[0], sub[2].bounds[0]), max(sub[1].bounds[1], sub[2].bounds[1])
        return Expr("ite", tuple(sub), 0, sub[1].type, lo, hi)
    if op == "eq":
        return _eq(sub[0], sub[1])
    if op in ("lt", "le"):
        return _cmp(op, sub[0], sub[1])
    if op in ("and", "or"):
        return _bool_op(op, sub[0], sub[1])
    return _not(sub[0])


def _truth_literal(e: Expr) -> None:
    """Refuse a literal where a condition goes unless it is 0 or 1: a build writes True and False so,
    and another number would read as true (the engine reads a condition as "non-zero") under another
    digest than any build gives."""
    if e._op == "lit":
        _int(e.bounds[0], "a literal condition (0 for False, 1 for True)", 0, 1)


def _cond(node: Any, specs: tuple[VarSpec, ...]) -> Expr:
    e = _expr(node, specs)
    _truth_literal(e)
    # A literal condition is typed bool like the front end's.
    return _lit(e.bounds[0], BOOL) if e._op == "lit" else e


def _assign(part: Any, specs: tuple[VarSpec, ...]) -> tuple[tuple[int, Expr], ...]:
    if not isinstance(part, list):
        raise ValueError("an assignment is a list of [position, expression] pairs (no Python callables)")
    out = []
    for entry in part:
        if not isinstance(entry, list) or len(entry) != 2:
            raise ValueError(f"{entry!r} is not a [position, expression] pair")
        out.append((_int(entry[0], "an assigned position", 0, len(specs) - 1), _expr(entry[1], specs)))
    return tuple(out)


def variable_spec(v: Any) -> VarSpec:
    """One variable of a machine given as data, read back strictly (the input may be hostile): a name,
    and a kind with what `Registry` accepts for it (an enum's labels are at least two distinct strings,
    an int's bounds are integers with min <= max); raises `ValueError`."""
    if not isinstance(v, dict) or not _is_text(v.get("name")):
        raise ValueError(f"{v!r} is not a variable {{name, kind, ...}} named by text")
    name, kind = v["name"], v.get("kind")
    if kind == "bool":
        return VarSpec(name, "bool", 0, 1)
    if kind == "enum":
        labels = v.get("labels")
        if (
            not isinstance(labels, list)
            or len(labels) < 2
            or not all(_is_text(label, empty=True) for label in labels)
            or len(set(labels)) != len(labels)
        ):
            raise ValueError(
                f"variable {name!r}: the labels must be at least two distinct strings (of text), "
                f"got {labels!r}"
            )
        return VarSpec(name, "enum", 0, len(labels) - 1, tuple(labels))
    if kind != "int":
        raise ValueError(f"variable {name!r} has unknown kind {kind!r}")
    low, high = _int(v.get("min"), f"the minimum of {name!r}"), _int(v.get("max"), f"the maximum of {name!r}")
    if low > high:
        raise ValueError(f"variable {name!r} has min above max")
    return VarSpec(name, "int", low, high)


def variable_specs(variables: Any) -> tuple[VarSpec, ...]:
    """Every variable of a machine given as data (`variable_spec`), their names distinct."""
    if not isinstance(variables, list):
        raise ValueError("the variables are not a list")
    specs = tuple(variable_spec(v) for v in variables)
    names = [v.name for v in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"the variable names {names} are not distinct")
    return specs


def check_rule_names(rules: dict[str, Any]) -> None:
    """The machine's name is text, and the invariants' names, and the events' names, are distinct texts
    (as a build writes them: a machine finds an event by its name; text is what UTF-8 can write, so a
    name with a lone surrogate is refused); raises `ValueError`."""
    if not _is_text(rules["name"]):
        raise ValueError(f"the machine's name {rules['name']!r} is not a non-empty string of text")
    for kind in ("invariants", "events"):
        if not isinstance(rules[kind], list) or not all(isinstance(r, dict) for r in rules[kind]):
            raise ValueError(f"the {kind} are not a list of rules")
        names = [r.get("name") for r in rules[kind]]
        if not all(_is_text(n) for n in names) or len(set(names)) != len(names):
            raise ValueError(f"the {kind}' names {names!r} are not distinct non-empty strings of text")


def snapshot_from_rules(rules: dict[str, Any]) -> Snapshot:
    """The declarations of a machine given as data, every rule an expression; raises `ValueError`,
    `KeyError` or `TypeError` for anything else."""
    specs = variable_specs(rules["variables"])
    check_rule_names(rules)
    initial = rules["initial"]
    if not isinstance(initial, list) or len(initial) != len(specs):
        raise ValueError("the initial state needs one value per variable")
    for x, v in zip(initial, specs, strict=True):
        _int(x, f"the initial value of {v.name!r}", v.lo, v.hi)
    events = tuple(
        EventRule(str(e["name"]), _cond(e["guard"], specs), _assign(e["effect"], specs))
        for e in rules["events"]
    )
    independent = rules["independent"]
    last = len(events) - 1
    pairs = None
    if independent is not None:
        pairs = tuple(
            (_int(a, "an event position", 0, last), _int(b, "an event position", 0, last))
            for a, b in independent
        )
    return Snapshot(
        str(rules["name"]),
        specs,
        tuple(
            InvariantRule(str(i["name"]), _cond(i["holds"], specs), _assign(i["repair"], specs))
            for i in rules["invariants"]
        ),
        events,
        pairs,
        tuple(initial),
    )
