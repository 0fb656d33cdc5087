"""Rules as data: a small typed expression AST with one exact meaning (docs/semantics.md).

The Python operators on variables build `Expr` trees that are lowered at construction to the 13 core
node kinds. Every tree is type-checked when built, knows the exact interval of values it can take
(so vectorized evaluation picks a dtype that can never wrap), its read footprint, its canonical JSON
form and a domain-separated SHA-256 digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from bide._canonical import json_text

from .._errors import DeclarationError

__all__ = [
    "Expr",
    "ExprType",
    "Var",
    "canonical_json",
    "coerce",
    "dtype_for",
    "evaluate",
    "evaluate_one",
    "expr_digest",
    "if_",
    "implies",
    "max_",
    "min_",
]

Kind: TypeAlias = Literal["bool", "int", "enum"]
Array: TypeAlias = npt.NDArray[Any]
Scalar: TypeAlias = bool | int | str
#: What a rule may be given where an expression is expected: an expression or a Python literal.
ExprLike: TypeAlias = "Expr | bool | int | str"

# Values beyond this cannot be evaluated exactly in int64 after one more addition; refuse them early.
_LIMIT = 2**62

_DIGEST_DOMAIN = b"govern.expr.v1\x00"


@dataclass(frozen=True)
class ExprType:
    """The static type of an expression: bool, int, or an enum with its labels."""

    kind: Kind
    labels: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "enum":
            return "enum(" + ", ".join(repr(x) for x in self.labels) + ")"
        return self.kind


BOOL = ExprType("bool")
INT = ExprType("int")


class Expr:
    """A typed, immutable expression over a registry's variables.

    Build them with operators on variables (`status == "paid"`, `(stock > 0) & paid`, `stock - 1`),
    `x.isin([...])`, and `govern.if_ / min_ / max_ / implies`. An expression has no truth value in
    Python: `if expr:` raises, because rules are data evaluated at build time, not now.
    """

    __slots__ = ("_args", "_hi", "_lo", "_op", "_payload", "_pyeq", "_type")

    _op: str
    _args: tuple[Expr, ...]
    _payload: int
    _type: ExprType
    _lo: int
    _hi: int
    _pyeq: tuple[object, object] | None

    def __init__(
        self, op: str, args: tuple[Expr, ...], payload: int, typ: ExprType, lo: int, hi: int
    ) -> None:
        if lo < -_LIMIT or hi > _LIMIT:
            raise DeclarationError(
                f"expression values range over [{lo}, {hi}], too wide to evaluate exactly; "
                "keep integer ranges and literals within ±2**62"
            )
        self._op = op
        self._args = args
        self._payload = payload
        self._type = typ
        self._lo = lo
        self._hi = hi
        self._pyeq = None

    # -- introspection -------------------------------------------------------------------------
    @property
    def type(self) -> ExprType:
        """The expression's static type."""
        return self._type

    @property
    def bounds(self) -> tuple[int, int]:
        """The least and greatest value the expression can take on any state (exact interval bound)."""
        return (self._lo, self._hi)

    def to_json(self) -> Any:
        """The canonical JSON form `[op, args...]` of docs/semantics.md (variables by position)."""
        if self._op == "var":
            return ["var", self._payload]
        if self._op == "lit":
            return ["lit", self._payload]
        return [self._op, *(a.to_json() for a in self._args)]

    def depth(self) -> int:
        """How many operators are nested above its deepest variable or literal (0 for a variable or a
        literal; `~(x < 3)` has depth 2)."""
        deepest, todo = 0, [(self, 0)]
        while todo:  # not recursive: a declaration may nest deeper than Python's stack
            node, level = todo.pop()
            if level > deepest:
                deepest = level
            todo.extend((a, level + 1) for a in node._args)
        return deepest

    def reads(self) -> frozenset[int]:
        """Positions of the variables this expression reads (its exact read footprint)."""
        if self._op == "var":
            return frozenset((self._payload,))
        out: frozenset[int] = frozenset()
        for a in self._args:
            out |= a.reads()
        return out

    def render(self, names: list[str] | None = None) -> str:
        """Readable Python-like text, with variable names when given."""
        return _render(self, names)

    def __repr__(self) -> str:
        return f"Expr({_render(self, None)})"

    # -- Python truthiness: refused, except for identity tests dicts make on variables ----------
    def __bool__(self) -> bool:
        if self._pyeq is not None:
            # dict lookups with variables as keys compare keys with ==; answer identity there.
            return self._pyeq[0] is self._pyeq[1]
        raise TypeError(
            "a govern expression has no truth value in Python; combine conditions with & | ~ "
            "(not and/or/not) and pass them to a rule"
        )

    __hash__ = object.__hash__

    # -- comparisons ---------------------------------------------------------------------------
    def __eq__(self, other: object) -> Expr:  # type: ignore[override]
        out = _eq(self, coerce(other, self._type, "== operand"))
        if isinstance(other, Var) and isinstance(self, Var):
            out._pyeq = (self, other)
        return out

    def __ne__(self, other: object) -> Expr:  # type: ignore[override]
        return _not(_eq(self, coerce(other, self._type, "!= operand")))

    def __lt__(self, other: ExprLike) -> Expr:
        return _cmp("lt", _need_int(self, "<"), _need_int(coerce(other, INT, "< operand"), "<"))

    def __le__(self, other: ExprLike) -> Expr:
        return _cmp("le", _need_int(self, "<="), _need_int(coerce(other, INT, "<= operand"), "<="))

    def __gt__(self, other: ExprLike) -> Expr:
        return _cmp("lt", _need_int(coerce(other, INT, "> operand"), ">"), _need_int(self, ">"))

    def __ge__(self, other: ExprLike) -> Expr:
        return _cmp("le", _need_int(coerce(other, INT, ">= operand"), ">="), _need_int(self, ">="))

    def isin(self, values: Iterable[Scalar]) -> Expr:
        """True when the value is one of `values` (labels for an enum)."""
        items = [coerce(v, self._type, "isin value") for v in values]
        if not items:
            raise DeclarationError("isin() needs at least one value")
        out = _eq(self, items[-1])
        for item in reversed(items[:-1]):
            out = _bool_op("or", _eq(self, item), out)
        return out

    # -- logic ---------------------------------------------------------------------------------
    def __and__(self, other: ExprLike) -> Expr:
        return _bool_op("and", _need_bool(self, "&"), _need_bool(coerce(other, BOOL, "& operand"), "&"))

    def __rand__(self, other: ExprLike) -> Expr:
        return _bool_op("and", _need_bool(coerce(other, BOOL, "& operand"), "&"), _need_bool(self, "&"))

    def __or__(self, other: ExprLike) -> Expr:
        return _bool_op("or", _need_bool(self, "|"), _need_bool(coerce(other, BOOL, "| operand"), "|"))

    def __ror__(self, other: ExprLike) -> Expr:
        return _bool_op("or", _need_bool(coerce(other, BOOL, "| operand"), "|"), _need_bool(self, "|"))

    def __invert__(self) -> Expr:
        return _not(_need_bool(self, "~"))

    # -- arithmetic ----------------------------------------------------------------------------
    def __add__(self, other: ExprLike) -> Expr:
        return _arith("add", _need_int(self, "+"), _need_int(coerce(other, INT, "+ operand"), "+"))

    def __radd__(self, other: ExprLike) -> Expr:
        return _arith("add", _need_int(coerce(other, INT, "+ operand"), "+"), _need_int(self, "+"))

    def __sub__(self, other: ExprLike) -> Expr:
        return _arith("sub", _need_int(self, "-"), _need_int(coerce(other, INT, "- operand"), "-"))

    def __rsub__(self, other: ExprLike) -> Expr:
        return _arith("sub", _need_int(coerce(other, INT, "- operand"), "-"), _need_int(self, "-"))

    def __neg__(self) -> Expr:
        return _arith("sub", _lit(0, INT), _need_int(self, "unary -"))

    # -- operators rules do not have: refused with what they do have, not Python's bare TypeError -------
    def _unsupported(self, *_: object) -> Expr:
        raise DeclarationError(
            "govern rules have no *, /, //, %, ** or shifts: they take + and - on integers, "
            "comparisons (== != < <= > >=), & | ~ on conditions, govern.if_, min_, max_, implies and "
            "x.isin([...]); write a product of small domains as a lookup with if_(), or declare the rule "
            "as a Python function of the state"
        )

    __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _unsupported
    __mod__ = __rmod__ = __pow__ = __rpow__ = _unsupported
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _unsupported


class Var(Expr):
    """A declared variable; also the expression that reads it. Created by `Registry.bool/enum/int`."""

    __slots__ = ("index", "kind", "labels", "name", "owner")

    def __init__(
        self, owner: object, index: int, name: str, kind: Kind, lo: int, hi: int, labels: tuple[str, ...]
    ) -> None:
        typ = ExprType(kind, labels) if kind == "enum" else ExprType(kind)
        super().__init__("var", (), index, typ, lo, hi)
        self.owner = owner
        self.index = index
        self.name = name
        self.kind = kind
        self.labels = labels

    def __repr__(self) -> str:
        return f"Var({self.name!r}, {self._type.describe()})"


# -- constructors ------------------------------------------------------------------------------


def _lit(n: int, typ: ExprType) -> Expr:
    return Expr("lit", (), n, typ, n, n)


def coerce(value: object, like: ExprType, what: str) -> Expr:
    """`value` as an expression of type `like`: expressions are type-checked, literals converted
    (True/False for bool, int for int, a label for an enum)."""
    if isinstance(value, _PendingLabels):
        if like.kind != "enum":
            raise DeclarationError(f"{what}: expected {like.describe()}, got enum labels {value._choices!r}")
        return value.resolve(like)
    if isinstance(value, Expr):
        if value._type != like:
            raise DeclarationError(
                f"{what}: expected {like.describe()}, got {value._type.describe()} "
                f"expression {value.render()}"
            )
        return value
    if like.kind == "bool":
        if isinstance(value, bool | np.bool_):
            return _lit(int(bool(value)), BOOL)
    elif like.kind == "int":
        if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
            return _lit(int(value), INT)
    elif isinstance(value, str):
        if value not in like.labels:
            raise DeclarationError(f"{what}: {value!r} is not a label of {like.describe()}")
        return _lit(like.labels.index(value), like)
    raise DeclarationError(f"{what}: expected {like.describe()}, got {type(value).__name__} {value!r}")


def _need_int(e: Expr, op: str) -> Expr:
    if e._type.kind != "int":
        raise DeclarationError(f"operator {op} needs int operands, got {e._type.describe()} {e.render()}")
    return e


def _need_bool(e: Expr, op: str) -> Expr:
    if e._type.kind != "bool":
        raise DeclarationError(
            f"operator {op} needs conditions (bool), got {e._type.describe()} {e.render()}"
        )
    return e


def _eq(a: Expr, b: Expr) -> Expr:
    return Expr("eq", (a, b), 0, BOOL, 0, 1)


def _cmp(op: str, a: Expr, b: Expr) -> Expr:
    return Expr(op, (a, b), 0, BOOL, 0, 1)


def _not(a: Expr) -> Expr:
    return Expr("not", (a,), 0, BOOL, 0, 1)


def _bool_op(op: str, a: Expr, b: Expr) -> Expr:
    return Expr(op, (a, b), 0, BOOL, 0, 1)


def _arith(op: str, a: Expr, b: Expr) -> Expr:
    if op == "add":
        lo, hi = a._lo + b._lo, a._hi + b._hi
    elif op == "sub":
        lo, hi = a._lo - b._hi, a._hi - b._lo
    elif op == "min":
        lo, hi = min(a._lo, b._lo), min(a._hi, b._hi)
    else:
        lo, hi = max(a._lo, b._lo), max(a._hi, b._hi)
    return Expr(op, (a, b), 0, INT, lo, hi)


def _infer(values: tuple[object, ...], what: str) -> ExprType:
    for v in values:
        if isinstance(v, Expr):
            return v._type
    for v in values:
        if isinstance(v, bool | np.bool_):
            return BOOL
        if isinstance(v, int | np.integer):
            return INT
    raise DeclarationError(f"{what}: cannot tell the type of {values!r}; make one argument an expression")


class _PendingLabels(Expr):
    """`if_(c, "a", "b")` with only label branches: an enum choice whose enum is known only when it
    is assigned to or compared with an enum variable; it is typed (and checked) at that point."""

    __slots__ = ("_choices", "_cond")

    def __init__(self, cond: Expr, choices: tuple[object, object]) -> None:
        super().__init__("ite", (), 0, ExprType("enum", ()), 0, 0)
        self._cond = cond
        self._choices = choices

    def resolve(self, like: ExprType) -> Expr:
        return if_(
            self._cond,
            coerce(self._choices[0], like, "if_ value"),
            coerce(self._choices[1], like, "if_ value"),
        )

    def __repr__(self) -> str:
        return f"if_({self._cond.render()}, {self._choices[0]!r}, {self._choices[1]!r})"

    def to_json(self) -> Any:
        raise DeclarationError(
            f"if_ over labels {self._choices!r} is untyped until it is assigned to or "
            "compared with an enum variable"
        )


def if_(cond: ExprLike, then: ExprLike, otherwise: ExprLike) -> Expr:
    """The conditional value: `then` where `cond` holds, else `otherwise` (both of one type; two
    labels take the type of the enum variable they are assigned to or compared with)."""
    c = _need_bool(coerce(cond, BOOL, "if_ condition"), "if_")
    if all(isinstance(x, str | _PendingLabels) for x in (then, otherwise)):  # labels, or nested choices
        return _PendingLabels(c, (then, otherwise))
    if isinstance(then, _PendingLabels) or isinstance(otherwise, _PendingLabels):
        typ = _infer(tuple(x for x in (then, otherwise) if not isinstance(x, _PendingLabels)), "if_")
        if typ.kind != "enum":
            raise DeclarationError("if_: label choices mixed with a non-enum value")
    else:
        typ = _infer((then, otherwise), "if_")
    a = coerce(then, typ, "if_ value")
    b = coerce(otherwise, typ, "if_ value")
    return Expr("ite", (c, a, b), 0, typ, min(a._lo, b._lo), max(a._hi, b._hi))


def min_(first: ExprLike, *rest: ExprLike) -> Expr:
    """The least of two or more integer values."""
    return _fold("min", first, rest)


def max_(first: ExprLike, *rest: ExprLike) -> Expr:
    """The greatest of two or more integer values."""
    return _fold("max", first, rest)


def _fold(op: str, first: ExprLike, rest: tuple[ExprLike, ...]) -> Expr:
    if not rest:
        raise DeclarationError(f"{op}_() needs at least two values")
    out = _need_int(coerce(first, INT, f"{op}_ argument"), f"{op}_")
    for r in rest:
        out = _arith(op, out, _need_int(coerce(r, INT, f"{op}_ argument"), f"{op}_"))
    return out


def implies(premise: ExprLike, conclusion: ExprLike) -> Expr:
    """`premise` implies `conclusion`, i.e. `~premise | conclusion`."""
    return _bool_op(
        "or", _not(coerce(premise, BOOL, "implies premise")), coerce(conclusion, BOOL, "implies conclusion")
    )


# -- canonical form ----------------------------------------------------------------------------


def canonical_json(value: Any) -> bytes:
    """Canonical UTF-8 JSON: keys sorted, no whitespace (`bide._canonical`, the encoder of certificates)."""
    return json_text(value).encode("utf-8")


def expr_digest(e: Expr) -> str:
    """SHA-256 (hex) of the expression's canonical JSON, domain-separated from every other digest."""
    return hashlib.sha256(_DIGEST_DOMAIN + canonical_json(e.to_json())).hexdigest()


_INFIX = {"add": "+", "sub": "-", "eq": "==", "lt": "<", "le": "<=", "and": "&", "or": "|"}


def _render(e: Expr, names: list[str] | None) -> str:
    op = e._op
    if op == "var":
        return names[e._payload] if names is not None else f"v{e._payload}"
    if op == "lit":
        if e._type.kind == "bool":
            return "True" if e._payload else "False"
        if e._type.kind == "enum":
            return repr(e._type.labels[e._payload])
        return str(e._payload)
    args = [_render(a, names) for a in e._args]
    if op == "not":
        if e._args[0]._op == "eq":
            a, b = (_render(x, names) for x in e._args[0]._args)
            return f"({a} != {b})"
        return f"~{args[0]}"
    if op in _INFIX:
        return f"({args[0]} {_INFIX[op]} {args[1]})"
    if op == "ite":
        return f"if_({args[0]}, {args[1]}, {args[2]})"
    return f"{op}_({args[0]}, {args[1]})"


# -- vectorized evaluation -----------------------------------------------------------------------


def dtype_for(lo: int, hi: int) -> np.dtype[Any]:
    """The smallest signed integer dtype holding every value in [lo, hi]."""
    for dt in (np.int8, np.int16, np.int32, np.int64):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return np.dtype(dt)
    raise DeclarationError(f"values [{lo}, {hi}] do not fit in 64 bits")


def _truth(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x if x.dtype == np.bool_ else x != 0
    return bool(x)


def _condition(e: Expr, column: Callable[[int], Array]) -> Any:
    """`e` evaluated as a truth value (array of bools or a bool)."""
    x = evaluate(e, column)
    zero_one = e._lo >= 0 and e._hi <= 1
    if isinstance(x, np.ndarray) and zero_one and x.dtype.itemsize == 1 and x.dtype != np.bool_:
        return x.view(np.bool_)  # bytes known to be 0/1 already are bools: no pass over the data
    return _truth(x)


def _as(x: Any, dt: np.dtype[Any]) -> Any:
    if isinstance(x, np.ndarray):
        return x.astype(dt, copy=False)
    return dt.type(int(x))


def evaluate(e: Expr, column: Callable[[int], Array]) -> Any:
    """Evaluate `e` on many states at once. `column(i)` gives variable i's values (an integer array,
    one entry per state). Returns an array (or a numpy scalar when `e` reads no variable): booleans
    for conditions, exact integers otherwise (the dtype always covers the expression's bounds)."""
    op = e._op
    if op == "var":
        return column(e._payload)
    if op == "lit":
        return e._payload if e._type.kind != "bool" else bool(e._payload)
    if op in ("and", "or"):
        a = _condition(e._args[0], column)
        if not isinstance(a, np.ndarray):
            if (op == "and") != a:  # short-circuit a constant
                return a
            return _condition(e._args[1], column)
        b = _condition(e._args[1], column)
        return np.logical_and(a, b) if op == "and" else np.logical_or(a, b)
    if op == "not":
        a = _condition(e._args[0], column)
        return np.logical_not(a) if isinstance(a, np.ndarray) else not a
    if op == "ite":
        c = _condition(e._args[0], column)
        if not isinstance(c, np.ndarray):
            return evaluate(e._args[1] if c else e._args[2], column)
        dt = dtype_for(e._lo, e._hi)
        a = _as(evaluate(e._args[1], column), dt)
        b = _as(evaluate(e._args[2], column), dt)
        return np.where(c, a, b)
    x, y = e._args
    if op in ("eq", "lt", "le"):
        dt = dtype_for(min(x._lo, y._lo), max(x._hi, y._hi))
        a = _as(evaluate(x, column), dt)
        b = _as(evaluate(y, column), dt)
        if op == "eq":
            return np.equal(a, b) if _any_array(a, b) else bool(a == b)
        if op == "lt":
            return np.less(a, b) if _any_array(a, b) else bool(a < b)
        return np.less_equal(a, b) if _any_array(a, b) else bool(a <= b)
    # The dtype must hold both operands as well as the result (min(y, 128) is small, 128 is not).
    dt = dtype_for(min(e._lo, x._lo, y._lo), max(e._hi, x._hi, y._hi))
    a = _as(evaluate(x, column), dt)
    b = _as(evaluate(y, column), dt)
    if op == "add":
        r = np.add(a, b, dtype=dt)
    elif op == "sub":
        r = np.subtract(a, b, dtype=dt)
    elif op == "min":
        r = np.minimum(a, b)
    else:
        r = np.maximum(a, b)
    return r if isinstance(r, np.ndarray) else int(r)


def _any_array(a: Any, b: Any) -> bool:
    return isinstance(a, np.ndarray) or isinstance(b, np.ndarray)


def evaluate_one(e: Expr, values: tuple[int, ...]) -> int:
    """Evaluate `e` on one state given as its integer values (the reference, unvectorized meaning)."""
    op = e._op
    if op == "var":
        return values[e._payload]
    if op == "lit":
        return e._payload
    args = [evaluate_one(a, values) for a in e._args] if op != "ite" else []
    if op == "ite":
        c = evaluate_one(e._args[0], values)
        return evaluate_one(e._args[1] if c != 0 else e._args[2], values)
    if op == "add":
        return args[0] + args[1]
    if op == "sub":
        return args[0] - args[1]
    if op == "min":
        return min(args)
    if op == "max":
        return max(args)
    if op == "eq":
        return int(args[0] == args[1])
    if op == "lt":
        return int(args[0] < args[1])
    if op == "le":
        return int(args[0] <= args[1])
    if op == "and":
        return int(args[0] != 0 and args[1] != 0)
    if op == "or":
        return int(args[0] != 0 or args[1] != 0)
    return int(args[0] == 0)  # not
