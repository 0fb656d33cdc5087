"""Declaring a machine: variables, ordered invariants with repairs, guarded events, independence.

A `Registry` collects declarations and checks each one as it is made (types, names, labels, ranges);
`build()` snapshots them, so later changes to the registry never affect a built machine.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Mapping
from itertools import combinations
from typing import TYPE_CHECKING, Any, Literal

from .._errors import DeclarationError
from ..model._declarations import (
    Assignment,
    AssignmentFn,
    ConditionFn,
    Domain,
    EventRule,
    InvariantRule,
    Snapshot,
)
from ..model._expr import BOOL, Expr, ExprLike, Var, coerce
from ..model._families import MAX_INSTANCES, EventFamily, check_family_name, make_param
from ..model._space import VarSpec
from ._build import build_machine

if TYPE_CHECKING:
    from ._machine import Machine

__all__ = ["Registry"]


class Registry:
    """A machine under construction: declare variables, invariants, events, then `build()`.

    Declarations are checked as they are made: names are unique, expressions are well typed and
    read only this registry's variables, enum labels exist, literals fit their variable's range.
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise DeclarationError("a registry needs a non-empty name")
        _refuse_non_text(name, f"the registry name {name!r}")
        self.name = name
        self._vars: list[Var] = []
        self._invariants: list[InvariantRule] = []
        self._events: list[EventRule] = []
        self._independent: list[tuple[str, str]] = []
        self._ordered: list[tuple[str, str]] = []
        self._all_ordered = False
        self._families: dict[str, EventFamily] = {}
        self._event_names: set[str] = set()
        self._initial: dict[builtins.int, builtins.int] | None = None
        self._version = 0

    # -- variables -----------------------------------------------------------------------------
    def bool(self, name: str) -> Var:
        """Declare a boolean variable (values False, True)."""
        return self._add_var(name, "bool", 0, 1, ())

    def enum(self, name: str, labels: list[str] | tuple[str, ...]) -> Var:
        """Declare an enum variable over at least two distinct string labels (compared by name)."""
        labels = tuple(labels)
        if len(labels) < 2 or len(set(labels)) != len(labels) or not all(isinstance(x, str) for x in labels):
            raise DeclarationError(f"enum {name!r} needs at least two distinct string labels, got {labels!r}")
        for label in labels:
            _refuse_non_text(label, f"label {label!r} of enum {name!r}")
        return self._add_var(name, "enum", 0, len(labels) - 1, labels)

    def int(self, name: str, lo: int, hi: int) -> Var:
        """Declare a bounded integer variable over the inclusive range lo..hi."""
        for bound in (lo, hi):
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise DeclarationError(f"int {name!r}: bounds must be integers, got {lo!r}..{hi!r}")
        if lo > hi:
            raise DeclarationError(f"int {name!r}: empty range {lo}..{hi} (need lo <= hi)")
        return self._add_var(name, "int", lo, hi, ())

    def _add_var(
        self,
        name: str,
        kind: Literal["bool", "int", "enum"],
        lo: builtins.int,
        hi: builtins.int,
        labels: tuple[str, ...],
    ) -> Var:
        self._check_name(name, "variable", [v.name for v in self._vars])
        v = Var(self, len(self._vars), name, kind, lo, hi, labels)
        self._vars.append(v)
        self._version += 1
        return v

    # -- rules ---------------------------------------------------------------------------------
    def invariant(
        self, name: str, *, holds: ExprLike | ConditionFn, repair: Mapping[Var | str, ExprLike] | AssignmentFn
    ) -> None:
        """Declare an invariant. Invariants are ordered by declaration: when several are violated, the
        repair of the first one is applied, then the state is checked again.

        `holds` is a condition (an expression, or a callable taking a state and returning a bool);
        `repair` maps variables to new values (expressions or literals), or is a callable taking a
        state and returning such a mapping of names to values.
        """
        self._check_name(name, "invariant", [i.name for i in self._invariants])
        rule = f"invariant {name!r}"
        self._invariants.append(
            InvariantRule(
                name, self._condition(holds, f"{rule} holds"), self._assignment(repair, f"{rule} repair")
            )
        )
        self._version += 1

    def event(
        self,
        name: str,
        *,
        guard: ExprLike | ConditionFn | Callable[..., Any] = True,
        effect: Mapping[Var | str, ExprLike] | AssignmentFn | Callable[..., Any],
        params: Mapping[str, object] | None = None,
    ) -> None:
        """Declare an event: where `guard` holds, `effect` is applied (simultaneously, every value
        computed from the state before); elsewhere the event changes nothing.

        With `params` ({parameter: values}, values a `range` or a list of labels, ints or bools) this
        declares a family: one event per combination of values, named `name(param=value,...)`. Then
        `guard` and `effect` are functions called once per instance with the values as keyword
        arguments, returning the instance's guard and effect (a `guard` that is not callable is shared).
        """
        if params is None:
            self._add_event(name, guard, effect)
            return
        check_family_name(name)
        self._check_name(name, "event family", [*self._families, *self._event_names])
        if not isinstance(params, Mapping) or not params:
            raise DeclarationError(f"event family {name!r}: params must be a non-empty mapping")
        family = EventFamily(name, tuple(make_param(name, k, v) for k, v in params.items()))
        if family.size > MAX_INSTANCES:
            raise DeclarationError(
                f"event family {name!r} has {family.size} instances (over {MAX_INSTANCES}); a parameter "
                "that large belongs in a variable, with one event reading it"
            )
        if not callable(effect) or isinstance(effect, Mapping):
            raise DeclarationError(
                f"event family {name!r}: effect must be a function of the parameters returning the "
                f"instance's effect, e.g. effect=lambda {family.params[0].name}: {{...}}"
            )
        before = (len(self._events), self._version)
        try:
            for values in family.instances():
                instance = family.instance(values)
                per_instance: Callable[..., Any] = effect
                g: object = guard
                if callable(guard) and not isinstance(guard, Expr):
                    guard_of: Callable[..., Any] = guard
                    g = guard_of(**values)
                self._add_event(instance, g, per_instance(**values))
        except Exception:
            for rule in self._events[before[0] :]:  # all instances or none
                self._event_names.discard(rule.name)
            del self._events[before[0] :]
            self._version = before[1]
            raise
        self._families[name] = family

    def _add_event(self, name: str, guard: object, effect: object) -> None:
        self._check_name(name, "event", self._event_names | self._families.keys())
        rule = f"event {name!r}"
        self._events.append(
            EventRule(
                name, self._condition(guard, f"{rule} guard"), self._assignment(effect, f"{rule} effect")
            )
        )
        self._event_names.add(name)
        self._version += 1

    def independent(self, a: str, b: str) -> None:
        """Declare that events `a` and `b` may be delivered in either order (build checks they commute).

        With no declaration at all every pair of events is checked; after the first declaration only
        declared pairs must commute, and undeclared pairs that do not are reported as obligations.
        A family name stands for all its instances; `independent(f, f)` pairs a family's instances."""
        if a == b and a not in self._families:
            raise DeclarationError(f"independent({a!r}, {b!r}): an event is not independent of itself")
        self._independent.append((a, b))
        self._version += 1

    def ordered(self, a: str | None = None, b: str | None = None) -> None:
        """Declare that events are delivered in causal order, so they need not commute.

        `ordered(a, b)`: the pair a, b (families stand for all their instances) is delivered in one causal
        order; every other pair is checked as usual. `ordered()`: every event is delivered in causal order;
        only pairs declared `independent` must commute. Pairs in causal order that do not commute are
        reported as obligations (`machine.report.obligations`), which replicas and event logs keep."""
        if a is None and b is None:
            self._all_ordered = True
        elif a is None or b is None:
            raise DeclarationError("ordered() takes two event names, or none for every event")
        else:
            if a == b and a not in self._families:
                raise DeclarationError(f"ordered({a!r}, {b!r}): name two events, or a family twice")
            self._ordered.append((a, b))
        self._version += 1

    def initial(self, values: Mapping[Var | str, object] | None = None, /, **named: object) -> None:
        """Declare the initial state (unnamed variables take their lowest value). It must be valid.

        Without a declaration the initial state is the normal form of the all-lowest state."""
        merged: dict[Var | str, object] = dict(values or {})
        merged.update(named)
        out: dict[builtins.int, builtins.int] = {}
        for key, value in merged.items():
            var = self._resolve(key, "initial")
            spec = _spec(var)
            out[var.index] = spec.encode(value)
        self._initial = out
        self._version += 1

    # -- build ---------------------------------------------------------------------------------
    def build(
        self,
        domain: Domain = "valid",
        *,
        max_states: builtins.int | None = None,
        compose: builtins.bool | None = None,
    ) -> Machine:
        """Enumerate the state space, verify WFC, CC1 (and report CC2, obligations, not-idempotent
        events), have the proof-derived oracle re-check the tables, and return the `Machine`.

        `domain` is the checked domain: "valid" (every valid state, the default) or "reachable" (the
        valid states reachable from the initial state). Raises `NotConvergent` with a counterexample,
        `DomainViolation`/`RuleError` naming a state, `StateSpaceTooLarge` before allocating, or an
        `OracleError` when the oracle does not certify the same result.

        The oracle's table checker runs on every build, and so does its rules checker (the tables
        are what the rules mean) whenever every rule is an expression, whatever the size.

        `compose`: a machine whose variables split into components with disjoint closed footprints
        (every rule an expression) is built by components, each enumerated and verified on its own
        (docs/govern.md, "Composition"): by default only when the whole space is too large to
        enumerate; `compose=True` whenever it splits; `compose=False` never.
        """
        if domain not in ("valid", "reachable"):
            raise DeclarationError(f"domain must be 'valid' or 'reachable', got {domain!r}")
        snapshot = self.snapshot()
        version = self._version
        machine = build_machine(snapshot, domain, max_states=max_states, compose=compose)
        if self._version != version:
            raise DeclarationError(
                f"registry {self.name!r} was changed while it was being built "
                "(by a rule callable?); rules must not declare anything"
            )
        return machine

    def snapshot(self) -> Snapshot:
        """An immutable copy of the declarations as they are now."""
        if not self._vars:
            raise DeclarationError(f"registry {self.name!r} declares no variables; declare at least one")
        if not self._events:
            raise DeclarationError(f"registry {self.name!r} declares no events; declare at least one")
        names = [e.name for e in self._events]
        independent = self._pairs(self._independent, "independent", names)
        ordered = self._pairs(self._ordered, "ordered", names)
        clash = sorted(independent & ordered)
        if clash:
            a, b = clash[0]
            raise DeclarationError(
                f"events {names[a]!r} and {names[b]!r} are declared both independent and ordered; "
                "keep one declaration"
            )
        checked: tuple[tuple[int, int], ...] | None = None
        if self._independent or self._all_ordered:
            checked = tuple(sorted(independent))
        elif self._ordered:
            every = set(combinations(range(len(names)), 2))
            checked = tuple(sorted(every - ordered))
        specs = tuple(_spec(v) for v in self._vars)
        initial: tuple[int, ...] | None = None
        if self._initial is not None:
            initial = tuple(self._initial.get(i, s.lo) for i, s in enumerate(specs))
        return Snapshot(
            self.name,
            specs,
            tuple(self._invariants),
            tuple(self._events),
            checked,
            initial,
        )

    # -- helpers -------------------------------------------------------------------------------
    def _pairs(
        self, declared: list[tuple[str, str]], what: str, names: list[str]
    ) -> set[tuple[builtins.int, builtins.int]]:
        """The event index pairs `declared` names (families expanded), each as (lower, higher)."""
        index = {n: i for i, n in enumerate(names)}
        pairs: set[tuple[builtins.int, builtins.int]] = set()
        for a, b in declared:
            sides: list[list[builtins.int]] = []
            for x in (a, b):
                if x in self._families:
                    family = self._families[x]
                    sides.append([index[family.instance(v)] for v in family.instances()])
                elif x in index:
                    sides.append([index[x]])
                else:
                    raise DeclarationError(
                        f"{what}({a!r}, {b!r}): no event or event family named {x!r}; events are "
                        f"{names[:20]}{' ...' if len(names) > 20 else ''}"
                    )
            for i in sides[0]:
                for j in sides[1]:
                    if i != j:
                        pairs.add((min(i, j), max(i, j)))
        return pairs

    def _check_name(self, name: str, what: str, taken: Collection[str]) -> None:
        if not isinstance(name, str) or not name:
            raise DeclarationError(f"a {what} needs a non-empty string name, got {name!r}")
        _refuse_non_text(name, f"the {what} name {name!r}")
        if name in taken:
            raise DeclarationError(f"{what} {name!r} is declared twice in registry {self.name!r}")

    def _resolve(self, key: Var | str, where: str) -> Var:
        if isinstance(key, Var):
            if key.owner is not self:
                raise DeclarationError(f"{where}: variable {key.name!r} belongs to another registry")
            return key
        if isinstance(key, str):
            for v in self._vars:
                if v.name == key:
                    return v
            raise DeclarationError(
                f"{where}: no variable named {key!r}; variables are {[v.name for v in self._vars]}"
            )
        raise DeclarationError(f"{where}: expected a variable or its name, got {key!r}")

    def _own(self, e: Expr, where: str) -> Expr:
        stack = [e]
        while stack:
            x = stack.pop()
            if isinstance(x, Var) and x.owner is not self:
                raise DeclarationError(f"{where}: reads variable {x.name!r} of another registry")
            stack.extend(x._args)
        return e

    def _condition(self, c: object, where: str) -> Expr | ConditionFn:
        if callable(c) and not isinstance(c, Expr):
            return c
        e = coerce(c, BOOL, where)
        return self._own(e, where)

    def _assignment(self, a: object, where: str) -> Assignment | AssignmentFn:
        if callable(a) and not isinstance(a, Mapping):
            return a
        if not isinstance(a, Mapping):
            raise DeclarationError(
                f"{where}: expected a mapping {{variable: value}} or a callable, got {a!r}"
            )
        out: dict[int, Expr] = {}
        for key, value in a.items():
            var = self._resolve(key, where)
            if var.index in out:
                raise DeclarationError(f"{where}: variable {var.name!r} is assigned twice")
            if callable(value) and not isinstance(value, Expr):
                raise DeclarationError(
                    f"{where}: {var.name!r} is given a callable; make the whole "
                    "effect/repair a callable returning a mapping instead"
                )
            e = self._own(coerce(value, var.type, f"{where} {var.name}"), where)
            lo = e.bounds[0]
            if e._op == "lit" and not var._lo <= lo <= var._hi:
                raise DeclarationError(
                    f"{where}: {var.name} = {lo} is outside its range {var._lo}..{var._hi}"
                )
            out[var.index] = e
        return tuple(sorted(out.items()))


def _refuse_non_text(text: str, described: str) -> None:
    """Raise DeclarationError, saying `described` (what `text` is, quoted), when `text` cannot be written
    as UTF-8: it holds a lone surrogate, as text decoded with errors="surrogateescape" does. Certificates,
    machine files and event logs store names as UTF-8, so such a name is refused when it is declared, not
    after a whole build."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DeclarationError(
            f"{described} is not valid text: it holds a lone surrogate "
            f"(U+{ord(text[exc.start]):04X} at position {exc.start}), which cannot be written as UTF-8; "
            "use a name made of Unicode characters"
        ) from None


def _spec(v: Var) -> VarSpec:
    lo, hi = v.bounds
    return VarSpec(v.name, v.kind, lo, hi, v.labels)
