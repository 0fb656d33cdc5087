"""A small model for machines with one huge integer variable: a representative machine, small enough
to enumerate, that behaves like the large machine up to shifts of that variable.

The fragment: one integer variable `j` whose domain is too large to enumerate (every other variable
small), rules that are expressions, and `j` used only in ways that are affine between thresholds:
compared, `min_`/`max_`-ed or `if_`-selected against values known on each side, shifted by constants,
and assigned either `j + c` or a constant. Between two consecutive thresholds (the points where some
comparison, `min_`, `max_` or `if_` of the rules can change its choice, the constants assigned to `j`,
and the domain's ends) every condition is constant in `j`, every other variable's assignment ignores
`j`, and `j`'s own assignment is a translation `j + c` or a jump to a constant outside the interval.
So deep inside such an interval the machine is invariant under translation: a state and its shift by
t repair, step, commute or diverge alike, up to the same shift. `_aff` checks, rather than assumes,
that every rule is affine on every interval the model cuts.

The representative machine keeps a margin of `_margin` values on each side of every long interval
and cuts out the middle: its variable `j` ranges over the shorter domain, its rules read `j` through
the embedding `iota` (values past a cut point are shifted up by the cut's width) and assign `j`
through the projection `kappa` (values past the middle of a cut are shifted down). It is built and
verified by the enumeration engine and checked by the proof-derived oracle, like any machine; every
counterexample it yields is mapped back and replayed through the concrete semantics of the large
machine before it is reported (the route gives up, returning None, when a replay fails).

What the verdict rests on: the oracle's check of the representative machine, and the reduction from
the large domain to it, which is argued here and tested against enumeration and CP-SAT but is not a
Rocq theorem. So only its failures are used (`refute_small`, called by the symbolic route before
CP-SAT): a counterexample replayed on the large machine is exact whatever the reduction. Its "holds"
verdicts are not used (CP-SAT decides them); tests compare them with enumeration and with CP-SAT.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations, pairwise
from typing import Any, Protocol

from .._errors import DeclarationError, DomainViolation, NotConvergent, StateSpaceTooLarge
from ..model._declarations import Assignment, EventRule, InvariantRule, Snapshot
from ..model._expr import INT, Expr, _arith, _bool_op, _cmp, _eq, _lit, _not
from ..model._space import VarSpec
from ._concrete import Concrete, Values
from ._counterexample import Divergence, RepairCycle
from ._report import PrunedPair, Report
from ._symbolic import DEFAULT_MAX_DEPTH, SymbolicVerdict, _footprint
from ._verify import event_closures

__all__ = ["Built", "Enumerate", "Representative", "decide_small", "refute_small", "representative"]

class Built(Protocol):
    """What the engine's build hands back that the small model reads: its report."""

    @property
    def report(self) -> Report: ...


Enumerate = Callable[[Snapshot], Built]
"""The engine's own build of a snapshot on the "valid" domain (tables, verification, the oracle),
raising like `Registry.build`: passed in by the machine layer, which this layer may not import."""

#: The representative machine is only worth building when it has at most this many states.
_MAX_SMALL_STATES = 1 << 22
#: More pieces than this in one expression: give up (the analysis is exact, not clever).
_MAX_FORMS = 256

Form = tuple[int, int | None]  # slope in j, and the offset when known (None: other variables decide it)


class _Outside(Exception):
    """The machine is not in the fragment."""


# -- the analysis: forms and thresholds ----------------------------------------------------------------


def _cut_points(f1: Form, f2: Form) -> set[int]:
    """Where the order of k1*v + c1 and k2*v + c2 can change (a few points around the crossing)."""
    (k1, c1), (k2, c2) = f1, f2
    if k1 == k2:
        return set()
    if c1 is None or c2 is None:
        raise _Outside("a comparison of j against a value other variables decide")
    r = (c2 - c1) // (k1 - k2)
    return {r - 1, r, r + 1, r + 2}


def _pieces(e: Expr, j: int) -> tuple[frozenset[Form], set[int]]:
    """Every form e takes on some piece of j's line, and the points where pieces may change."""
    op = e._op
    if op == "var":
        return (frozenset({(1, 0)}) if e._payload == j else frozenset({(0, None)})), set()
    if op == "lit":
        return frozenset({(0, e._payload)}), set()
    parts = [_pieces(a, j) for a in e._args]
    cuts: set[int] = set().union(*(p[1] for p in parts))
    forms: set[Form]
    if op in ("add", "sub"):
        sign = 1 if op == "add" else -1
        forms = {
            (k1 + sign * k2, None if c1 is None or c2 is None else c1 + sign * c2)
            for k1, c1 in parts[0][0]
            for k2, c2 in parts[1][0]
        }
    elif op in ("min", "max", "eq", "lt", "le"):
        for f1 in parts[0][0]:
            for f2 in parts[1][0]:
                cuts |= _cut_points(f1, f2)
        if op in ("min", "max"):
            forms = set(parts[0][0] | parts[1][0])
        else:
            known = all(c is not None for f in (*parts[0][0], *parts[1][0]) for _, c in [f])
            forms = {(0, 0), (0, 1)} if known else {(0, None)}
    elif op == "ite":
        cond, then, other = parts
        if any(k != 0 for k, _ in cond[0]):
            raise _Outside("an if_ condition that is not a condition")
        if any(c is None for _, c in cond[0]) and len({k for k, _ in then[0] | other[0]}) > 1:
            raise _Outside("an if_ that other variables decide between different slopes in j")
        forms = set(then[0] | other[0])
    else:  # and, or, not
        if any(k != 0 for p in parts for k, _ in p[0]):
            raise _Outside("a connective over an integer")
        known = all(c is not None for p in parts for _, c in p[0])
        forms = {(0, 0), (0, 1)} if known else {(0, None)}
    if len(forms) > _MAX_FORMS:
        raise _Outside("too many pieces")
    return frozenset(forms), cuts


# -- the checked interval lemma (the twin of `aff`) ----------------------------------------------------


def _sign_lt(k: int, c: int, a: int, b: int) -> bool | None:
    """k*v + c < 0 for every v in [a, b] (True), for none (False), or it depends (None)."""
    lo_end, hi_end = k * a + c, k * b + c
    if lo_end < 0 and hi_end < 0:
        return True
    if lo_end >= 0 and hi_end >= 0:
        return False
    return None


def _cmp_on(op: str, f1: tuple[int, int], f2: tuple[int, int], a: int, b: int) -> bool | None:
    (k1, c1), (k2, c2) = f1, f2
    if op == "lt":
        return _sign_lt(k1 - k2, c1 - c2, a, b)
    if op == "le":
        return _sign_lt(k1 - k2, c1 - c2 - 1, a, b)
    r1, r2 = _sign_lt(k1 - k2, c1 - c2, a, b), _sign_lt(k2 - k1, c2 - c1, a, b)
    return None if r1 is None or r2 is None else not r1 and not r2


def _aff(e: Expr, j: int, a: int, b: int) -> Form | None:
    """The slope of e in j on [a, b] and its offset when known, or None when e is not affine there."""
    op = e._op
    if op == "var":
        return (1, 0) if e._payload == j else (0, None)
    if op == "lit":
        return (0, e._payload)
    fs = [_aff(x, j, a, b) for x in e._args]
    if any(f is None for f in fs):
        return None
    forms: list[Form] = [f for f in fs if f is not None]
    if op in ("add", "sub"):
        (k1, c1), (k2, c2) = forms
        s = 1 if op == "add" else -1
        return k1 + s * k2, None if c1 is None or c2 is None else c1 + s * c2
    if op in ("min", "max"):
        (k1, c1), (k2, c2) = forms
        if k1 == k2:
            return k1, None if c1 is None or c2 is None else (min if op == "min" else max)(c1, c2)
        if c1 is None or c2 is None:
            return None
        le = _cmp_on("le", (k1, c1), (k2, c2), a, b)
        if le is None:
            return None
        return forms[0] if le == (op == "min") else forms[1]
    if op in ("eq", "lt", "le"):
        (k1, c1), (k2, c2) = forms
        if k1 == k2:
            if c1 is None or c2 is None:
                return 0, None
            return 0, int(c1 == c2 if op == "eq" else c1 < c2 if op == "lt" else c1 <= c2)
        if c1 is None or c2 is None:
            return None
        r = _cmp_on(op, (k1, c1), (k2, c2), a, b)
        return None if r is None else (0, int(r))
    if op == "ite":
        (kc, oc), then, other = forms
        if kc != 0:
            return None
        if oc is not None:
            return then if oc != 0 else other
        return (then[0], None) if then[0] == other[0] else None
    if any(k != 0 for k, _ in forms):
        return None
    if any(c is None for _, c in forms):
        return 0, None
    vals = [c != 0 for _, c in forms]
    if op == "and":
        return 0, int(vals[0] and vals[1])
    if op == "or":
        return 0, int(vals[0] or vals[1])
    return 0, int(not vals[0])


# -- the representative machine -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cut:
    """One interval's middle, cut out: big values in (keep, keep + width] are not represented."""

    keep: int  # the last big value kept below the cut (same value in the small machine)
    width: int  # how many values were cut out
    below: int  # the total width of the cuts below this one


@dataclass(frozen=True)
class Representative:
    """The representative machine of a large one: `snap` (variable `var` shortened by the cuts) and
    the maps between the two machines' values of that variable."""

    snap: Snapshot
    var: int
    cuts: tuple[_Cut, ...]

    def embed(self, y: int) -> int:
        """The large machine's value represented by the small machine's value y (`iota`)."""
        for cut in reversed(self.cuts):
            if y > cut.keep - cut.below:
                return y + cut.below + cut.width
        return y

    def embed_state(self, x: Values) -> Values:
        return tuple(self.embed(v) if i == self.var else v for i, v in enumerate(x))


def _margin(snap: Snapshot, j: int) -> int:
    """Values kept on each side of a cut: every chain the conditions look at (two events, each
    normalized, plus a normalization first) moves j by at most this much, twice over."""
    move = 1
    for part in [*(i.repair for i in snap.invariants), *(e.effect for e in snap.events)]:
        assert isinstance(part, tuple)
        for target, e in part:
            if target == j:
                for k, c in _pieces(e, j)[0]:
                    if k == 1 and c is not None:
                        move = max(move, abs(c))
    chain = 3 * (DEFAULT_MAX_DEPTH + 1)
    return 2 * chain * move + 2


def _specials(snap: Snapshot, j: int) -> list[int]:
    """The thresholds of j: domain ends, every cut point of every rule, every constant j is assigned."""
    v = snap.vars[j]
    points = {v.lo, v.hi}
    for cond, part in [
        *((i.holds, i.repair) for i in snap.invariants),
        *((e.guard, e.effect) for e in snap.events),
    ]:
        assert isinstance(cond, Expr) and isinstance(part, tuple)
        forms, cuts = _pieces(cond, j)
        if any(k != 0 for k, _ in forms):
            raise _Outside("a condition with a slope in j")
        points |= cuts
        for target, e in part:
            forms, cuts = _pieces(e, j)
            points |= cuts
            for k, c in forms:
                if target != j and k != 0:
                    raise _Outside("another variable assigned a value that moves with j")
                if target == j and (c is None or k not in (0, 1)):
                    raise _Outside("j assigned a value other variables decide, or a multiple of j")
                if target == j and k == 0 and c is not None:
                    points.add(c)
    return sorted(p for p in points if v.lo <= p <= v.hi)


def _affine_on(snap: Snapshot, j: int, a: int, b: int) -> bool:
    """Every rule affine in j on [a, b] with the slopes the reduction needs (checked, not assumed)."""
    for cond, part in [
        *((i.holds, i.repair) for i in snap.invariants),
        *((e.guard, e.effect) for e in snap.events),
    ]:
        assert isinstance(cond, Expr) and isinstance(part, tuple)
        f = _aff(cond, j, a, b)
        if f is None or f[0] != 0:
            return False
        for target, e in part:
            f = _aff(e, j, a, b)
            if f is None:
                return False
            k, c = f
            if target != j and k != 0:
                return False
            translation = k == 1 and c is not None
            jump_out = k == 0 and c is not None and not a <= c <= b
            if target == j and not (translation or jump_out):
                return False
    return True


def representative(snap: Snapshot) -> Representative | None:
    """The representative machine of `snap`, or None when `snap` is outside the fragment or has no
    interval long enough to cut (or the representative machine would still be too large)."""
    if not snap.is_data():
        return None
    ints = [i for i, v in enumerate(snap.vars) if v.kind == "int"]
    if not ints:
        return None
    j = max(ints, key=lambda i: snap.vars[i].size)  # the others must be small (checked below)
    try:
        points = _specials(snap, j)
        margin = _margin(snap, j)
    except _Outside:
        return None
    cuts: list[_Cut] = []
    below = 0
    for a, b in pairwise(points):
        inner_lo, inner_hi = a + 1, b - 1  # no threshold strictly between a and b
        width = (inner_hi - inner_lo + 1) - 4 * margin
        if width <= 0:
            continue
        if not _affine_on(snap, j, inner_lo, inner_hi):
            return None
        cuts.append(_Cut(inner_lo + 2 * margin - 1, width, below))
        below += width
    if not cuts:
        return None
    v = snap.vars[j]
    small_var = VarSpec(v.name, v.kind, v.lo, v.hi - below, v.labels)
    others = 1
    for i, spec in enumerate(snap.vars):
        if i != j:
            others *= spec.size
    if others * small_var.size > _MAX_SMALL_STATES:
        return None
    return Representative(_substituted(snap, j, small_var, cuts), j, tuple(cuts))


def _substituted(snap: Snapshot, j: int, small_var: VarSpec, cuts: list[_Cut]) -> Snapshot:
    """`snap` with j read through iota and assigned through kappa, over the shortened domain."""
    x = Expr("var", (), j, INT, small_var.lo, small_var.hi)
    iota = x
    for cut in cuts:
        iota = _arith("add", iota, _ite(_cmp("lt", _lit(cut.keep - cut.below, INT), x), cut.width))
    memo: dict[int, Expr] = {}

    def read(e: Expr) -> Expr:
        hit = memo.get(id(e))
        if hit is not None:
            return hit
        out = _rebuild(e, [read(a) for a in e._args], iota, j)
        memo[id(e)] = out
        return out

    def kappa(v: Expr) -> Expr:
        out = v
        for cut in cuts:
            middle = cut.keep + cut.width // 2  # a big value past the middle of a cut is represented lower
            out = _arith("sub", out, _ite(_cmp("lt", _lit(middle, INT), v), cut.width))
        return out

    def assign(part: Assignment | Any) -> Assignment:
        assert isinstance(part, tuple)
        return tuple((t, kappa(read(e)) if t == j else read(e)) for t, e in part)

    variables = tuple(small_var if i == j else v for i, v in enumerate(snap.vars))
    invariants = tuple(
        InvariantRule(i.name, read(i.holds), assign(i.repair))  # type: ignore[arg-type]
        for i in snap.invariants
    )
    events = tuple(EventRule(e.name, read(e.guard), assign(e.effect)) for e in snap.events)  # type: ignore[arg-type]
    return Snapshot(snap.name, variables, invariants, events, snap.independent, None)


def _ite(cond: Expr, value: int) -> Expr:
    return Expr("ite", (cond, _lit(value, INT), _lit(0, INT)), 0, INT, 0, value)


def _rebuild(e: Expr, args: list[Expr], iota: Expr, j: int) -> Expr:
    op = e._op
    if op == "var":
        return iota if e._payload == j else e
    if op == "lit":
        return e
    if op in ("add", "sub", "min", "max"):
        return _arith(op, args[0], args[1])
    if op == "ite":
        lo, hi = min(args[1].bounds[0], args[2].bounds[0]), max(args[1].bounds[1], args[2].bounds[1])
        return Expr("ite", tuple(args), 0, args[1].type, lo, hi)
    if op == "eq":
        return _eq(args[0], args[1])
    if op in ("lt", "le"):
        return _cmp(op, args[0], args[1])
    if op in ("and", "or"):
        return _bool_op(op, args[0], args[1])
    return _not(args[0])


# -- deciding the large machine by its representative ---------------------------------------------------


class _GiveUp(Exception):
    pass


def refute_small(snap: Snapshot, enumerate_build: Enumerate) -> None:
    """Raise the large machine's own `NotConvergent` or `DomainViolation` when its representative
    machine fails and the witness, mapped back, replays on `snap`; otherwise return.

    Only failures are taken: a replayed witness is exact whatever the reduction, while "holds" from
    the representative machine would rest on the unproved reduction."""
    try:
        decide_small(snap, enumerate_build)
    except DeclarationError:  # the declared initial state: the caller's own checks report it
        return


def decide_small(snap: Snapshot, enumerate_build: Enumerate) -> SymbolicVerdict | None:
    """Decide `snap` by its representative machine (built by `enumerate_build`: enumerated,
    oracle-checked); every witness is replayed on `snap` itself. None when the fragment does not apply
    or a replay does not confirm.

    Raises like the symbolic route: `NotConvergent`, `DomainViolation`, `DeclarationError`."""
    rep = representative(snap)
    if rep is None:
        return None
    try:
        return _decide(snap, rep, enumerate_build)
    except _GiveUp:
        return None


def _decide(snap: Snapshot, rep: Representative, enumerate_build: Enumerate) -> SymbolicVerdict:
    c = Concrete.of(snap)
    limit = 4 * DEFAULT_MAX_DEPTH
    names = list(c.event_names)

    def starts(state: dict[str, Any]) -> list[Values]:
        y = tuple(v.encode(state[v.name]) for v in rep.snap.vars)
        return [rep.embed_state(y), y] if rep.embed_state(y) != y else [y]

    def replay(w: Divergence, depth: int) -> Divergence:
        events = tuple(names.index(e) for e in w.events)
        for x in starts(w.start):
            if not all(v.lo <= val <= v.hi for v, val in zip(c.vars, x, strict=True)):
                continue
            if w.condition != "CC2" and not c.valid(x):  # CC1, obligations, idempotence: valid starts
                continue
            try:
                d = c.divergence(w.condition, events, x, depth)
            except (AssertionError, DomainViolation):  # not this start: repair too deep, or leaves
                continue
            if d is not None:
                return d
        raise _GiveUp

    try:
        small = enumerate_build(rep.snap)
    except StateSpaceTooLarge:
        raise _GiveUp from None
    except NotConvergent as exc:
        w = exc.counterexample
        if isinstance(w, RepairCycle):
            for x in starts(w.cycle[0][0]):
                try:
                    cycle = c.cycle(x, len(w.cycle))
                except DomainViolation:
                    continue
                if cycle is not None:
                    raise NotConvergent(cycle) from None
            raise _GiveUp from None
        raise NotConvergent(replay(w, limit)) from None
    except DomainViolation as exc:
        for x in starts(dict(exc.state)):
            try:
                c.repair(x)
                for e in range(len(names)):
                    c.apply(e, x)
            except DomainViolation as big:
                raise big from None
        raise _GiveUp from None
    report = small.report
    depth = report.max_repair_depth
    if depth > DEFAULT_MAX_DEPTH:  # the margins were sized for chains of at most this many repairs
        raise _GiveUp
    if snap.initial is not None:
        initial = snap.initial
        c.require_valid_initial(initial)
    else:
        try:
            initial = c.nf(tuple(v.lo for v in c.vars), depth)
        except AssertionError:
            raise _GiveUp from None
    all_pairs = list(combinations(range(len(names)), 2))
    checked = list(snap.independent) if snap.independent is not None else all_pairs
    cc2_witness = replay(report.cc2_witness, depth) if report.cc2_witness is not None else None
    return SymbolicVerdict(
        depth,
        initial,
        report.pair_mode,
        checked,
        [PrunedPair(p.a, p.b, p.reason) for p in report.pairs_pruned],
        report.undeclared_pairs,
        [replay(w, depth) for w in report.obligations],
        [replay(w, depth) for w in report.not_idempotent],
        report.cc2,
        list(report.cc2_failing_events),
        cc2_witness,
        event_closures(
            [_footprint(h, r) for h, r in zip(c.holds, c.repairs, strict=True)],
            [_footprint(g, f) for g, f in zip(c.guards, c.effects, strict=True)],
        ),
        0,
        {},
    )
