"""Parametric events: declared once, verified as one ordinary event per instance.

`r.event("assign", params={"who": staff}, ...)` declares the family `assign`; each value of its parameters
is an instance, an ordinary event named `assign(who=alice)`. Instances are what the engine, the oracle and
certificates see, so every verdict covers every instance and nothing new needs trusting. The name is the
instance's identity everywhere (event logs, replicas, tools), and a family is recovered from its instances'
names, so a loaded machine knows its families without any extra field.

Rules for names (so that parsing a name back is exact):

- a family name is an identifier-like word (letters, digits, `_`, `.`, `-`; not starting with a digit);
- a label value is such a word too, other than `true` and `false`; an int is written in decimal; a bool as
  `true`/`false`; so a parameter's kind is read back from its values without ambiguity;
- parameters appear in declaration order: `move(src=a,dst=b)`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from .._errors import DeclarationError, UnknownEvent

__all__ = [
    "EventFamily",
    "Param",
    "ParamValue",
    "families_of",
    "instance_name",
    "make_param",
    "parse_instance",
]

ParamValue: TypeAlias = int | str | bool
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_INT = re.compile(r"-?[0-9]+")
_INSTANCE = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]*)\((.*)\)")
#: More instances than this in one family is almost surely a mistake (a balance as a parameter).
MAX_INSTANCES = 10_000


@dataclass(frozen=True)
class Param:
    """One parameter of an event family and the finite set of values it ranges over, in order."""

    name: str
    kind: Literal["int", "label", "bool"]
    values: tuple[ParamValue, ...]

    def text(self, value: ParamValue) -> str:
        """How `value` is written in an instance name."""
        if self.kind == "bool":
            return "true" if value else "false"
        return str(value)

    def check(self, family: str, value: object) -> ParamValue:
        """`value` if it is one of this parameter's values, else `UnknownEvent` naming them."""
        for v in self.values:
            if type(v) is type(value) and v == value:
                return v
        shown = _shown(self.values)
        raise UnknownEvent(f"event family {family!r}: {self.name}={value!r} is not one of {shown}")


@dataclass(frozen=True)
class EventFamily:
    """An event declared once over parameters; `instances()` are its ordinary events."""

    name: str
    params: tuple[Param, ...]

    def instances(self) -> Iterator[dict[str, ParamValue]]:
        """Every assignment of values to the parameters, in declaration order (the last varies fastest)."""
        for combo in itertools.product(*(p.values for p in self.params)):
            yield {p.name: v for p, v in zip(self.params, combo, strict=True)}

    def instance(self, values: Mapping[str, object]) -> str:
        """The instance name for `values` (every parameter given, each one of its values)."""
        names = [p.name for p in self.params]
        unknown = sorted(set(values) - set(names))
        missing = [n for n in names if n not in values]
        if unknown or missing:
            raise UnknownEvent(
                f"event family {self.name!r} takes the parameters {names}"
                + (f"; unknown: {unknown}" if unknown else "")
                + (f"; missing: {missing}" if missing else "")
            )
        return instance_name(self.name, {p.name: p.check(self.name, values[p.name]) for p in self.params})

    @property
    def size(self) -> int:
        """The number of instances."""
        n = 1
        for p in self.params:
            n *= len(p.values)
        return n


def instance_name(family: str, values: Mapping[str, ParamValue]) -> str:
    """The event name of one instance: `family(p=v,...)` in the order of `values`."""
    parts = []
    for key, value in values.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        parts.append(f"{key}={text}")
    return f"{family}({','.join(parts)})"


def parse_instance(name: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """`("assign", (("who", "alice"),))` for `"assign(who=alice)"`; None for a name that is no instance."""
    m = _INSTANCE.fullmatch(name)
    if m is None:
        return None
    pairs: list[tuple[str, str]] = []
    for part in m.group(2).split(","):
        key, sep, value = part.partition("=")
        if not sep or not _WORD.fullmatch(key) or not (_WORD.fullmatch(value) or _INT.fullmatch(value)):
            return None
        pairs.append((key, value))
    return m.group(1), tuple(pairs)


def families_of(events: Iterable[str]) -> dict[str, EventFamily]:
    """The families whose instances are among `events`, recovered from the names (declaration order)."""
    seen: dict[str, tuple[str, ...]] = {}
    values: dict[str, dict[str, list[str]]] = {}
    for event in events:
        parsed = parse_instance(event)
        if parsed is None:
            continue
        family, pairs = parsed
        keys = tuple(k for k, _ in pairs)
        if seen.setdefault(family, keys) != keys:
            continue  # not one family's shape: leave it an ordinary event name
        per = values.setdefault(family, {k: [] for k in keys})
        for k, v in pairs:
            if v not in per[k]:
                per[k].append(v)
    out: dict[str, EventFamily] = {}
    for family, keys in seen.items():
        params = tuple(_param_from_text(k, values[family][k]) for k in keys)
        out[family] = EventFamily(family, params)
    return out


def make_param(family: str, name: str, values: object) -> Param:
    """A parameter from what a user declares: a `range`, or a sequence of labels, ints or bools."""
    where = f"event family {family!r}, parameter {name!r}"
    if not isinstance(name, str) or not _WORD.fullmatch(name):
        raise DeclarationError(f"{where}: a parameter name is a word (letters, digits, _ . -)")
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise DeclarationError(
            f"{where}: give its values as a range or a list (of labels, ints or bools), got {values!r}"
        )
    items = tuple(values)
    if not items:
        raise DeclarationError(f"{where}: needs at least one value")
    if len(set(map(repr, items))) != len(items):
        raise DeclarationError(f"{where}: values must be distinct, got {_shown(items)}")
    if all(isinstance(v, bool) for v in items):
        return Param(name, "bool", items)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return Param(name, "int", items)
    if all(isinstance(v, str) for v in items):
        for v in items:
            if not _WORD.fullmatch(str(v)) or v in ("true", "false"):
                raise DeclarationError(
                    f"{where}: label {v!r} must be a word (letters, digits, _ . -, not starting with a "
                    "digit, not 'true'/'false') so that instance names read back exactly"
                )
        return Param(name, "label", items)
    raise DeclarationError(f"{where}: values must be all labels, all ints or all bools, got {_shown(items)}")


def check_family_name(name: str) -> None:
    """Refuse a family name that would not read back from its instance names."""
    if not isinstance(name, str) or not _WORD.fullmatch(name):
        raise DeclarationError(
            f"event family {name!r}: a family name is a word (letters, digits, _ . -, not starting with a "
            "digit), because its instances are named family(param=value,...)"
        )


def _param_from_text(name: str, texts: list[str]) -> Param:
    if all(t in ("true", "false") for t in texts):
        return Param(name, "bool", tuple(t == "true" for t in texts))
    if all(_INT.fullmatch(t) for t in texts):
        return Param(name, "int", tuple(int(t) for t in texts))
    return Param(name, "label", tuple(texts))


def _shown(values: tuple[object, ...]) -> str:
    if len(values) > 8:
        return f"[{', '.join(map(repr, values[:4]))}, ..., {', '.join(map(repr, values[-2:]))}]"
    return repr(list(values))
