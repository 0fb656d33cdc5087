"""Verification without enumeration: WFC, CC1, CC2, obligations and idempotence decided on the rules'
AST by CP-SAT (ortools), for machines whose integer domains are too large for tables.

Every question is an existence query over fresh state variables ranging over the declared domains:
"is there a state where ...". The rules are encoded exactly (docs/semantics.md: integers never wrap,
`ite`, `min`/`max`, comparisons and connectives as reified constraints), so

- a **satisfiable** query yields a candidate state, which is replayed through the concrete semantics
  (`_concrete.Concrete`, the engine's own reference evaluator) and reported only when the replay
  shows the violation (else the build stops with an internal error: the encoding and the semantics
  disagree);
- an **unsatisfiable** query is a verdict that rests on CP-SAT's word: no proof object is checked.
  The report names the solver and its version.

Normal forms are unrolled: WFC is established by finding the least K such that K repair steps from
any state reach a valid state (then NF(s) = repair^K(s) and K is the maximum repair depth); when no
K up to the bound works, a repair cycle is searched for and replayed, and otherwise the route gives
up (it never guesses). Only the "valid" checked domain is supported (reachability is not encoded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Literal

from .._errors import DeclarationError, NotConvergent, StateSpaceTooLarge
from ..model._declarations import Assignment, Domain, Snapshot
from ..model._expr import Expr
from ._concrete import Concrete, Values
from ._counterexample import Divergence
from ._report import PrunedPair
from ._tables import Footprint
from ._timing import PhaseTimer
from ._verify import event_closures

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "SymbolicVerdict",
    "solver_identity",
    "symbolic_problem",
    "verify_symbolic",
]

#: Repair depth (and repair cycle length) the route tries before it gives up.
DEFAULT_MAX_DEPTH = 32
#: Wall-clock seconds each solver configuration gets, round after round, before the route gives up.
_BUDGETS = (0.5, 5.0, 60.0)


def solver_identity() -> dict[str, str]:
    """The solver the symbolic verdicts rest on: name, package and version (imports ortools)."""
    from importlib.metadata import version

    from ortools.sat.python import cp_model  # noqa: F401  (the solver must be importable)

    return {"name": "CP-SAT", "package": "ortools", "version": version("ortools")}


def symbolic_problem(snap: Snapshot, domain: Domain) -> str | None:
    """Why the symbolic route cannot decide `snap` (None when it can)."""
    if domain != "valid":
        return (
            f"the symbolic route decides the 'valid' checked domain only (got {domain!r}); "
            "build with domain='valid'"
        )
    if not snap.is_data():
        return "a rule is a Python callable; the symbolic route needs every rule as an expression"
    try:
        solver_identity()
    except ImportError:
        return "ortools is not installed (pip install ortools)"
    return None


@dataclass
class SymbolicVerdict:
    """What the symbolic route established (only produced when the machine converges)."""

    depth_max: int
    initial: Values
    pair_mode: str
    pairs_checked: list[tuple[int, int]]
    pairs_pruned: list[PrunedPair]
    undeclared_checked: int
    obligations: list[Divergence]
    not_idempotent: list[Divergence]
    cc2: bool
    cc2_failing_events: list[str]
    cc2_witness: Divergence | None
    closures: list[frozenset[int]] = field(default_factory=list)
    queries: int = 0
    solver: dict[str, str] = field(default_factory=dict)


class _Undecided(Exception):
    pass


class _Query:
    """One CP-SAT model: fresh states over the declared domains and the rules encoded on them."""

    def __init__(self, c: Concrete) -> None:
        from ortools.sat.python import cp_model

        self._cp = cp_model
        self.m = cp_model.CpModel()
        self.c = c
        self._memo: dict[tuple[int, int], Any] = {}
        self._keep: list[tuple[Any, ...]] = []  # states memoized by id() must stay alive
        self.true = self.m.new_bool_var("true")
        self.m.add(self.true == 1)
        self.false: Any = self.true.negated()

    # -- states --------------------------------------------------------------------------------
    def state(self) -> tuple[Any, ...]:
        xs = tuple(
            self.m.new_bool_var(v.name) if v.kind == "bool" else self.m.new_int_var(v.lo, v.hi, v.name)
            for v in self.c.vars
        )
        self._keep.append(xs)
        return xs

    def _new(self, lo: int, hi: int) -> Any:
        return self.m.new_int_var(lo, hi, "")

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, e: Expr, xs: tuple[Any, ...]) -> Any:
        """An integer-valued CP-SAT expression equal to e's value on state xs."""
        op = e._op
        if op == "var":
            return xs[e._payload]
        if op == "lit":
            return e._payload
        if op in ("eq", "lt", "le", "and", "or", "not"):
            return self.lit(e, xs)
        key = (id(e), id(xs))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if op == "add":
            out = self.expr(e._args[0], xs) + self.expr(e._args[1], xs)
        elif op == "sub":
            out = self.expr(e._args[0], xs) - self.expr(e._args[1], xs)
        elif op in ("min", "max"):
            lo, hi = e.bounds
            out = self._new(lo, hi)
            parts = [self.expr(a, xs) for a in e._args]
            if op == "min":
                self.m.add_min_equality(out, parts)
            else:
                self.m.add_max_equality(out, parts)
        else:  # ite
            lo, hi = e.bounds
            c = self.lit(e._args[0], xs)
            out = self._new(lo, hi)
            self.m.add(out == self.expr(e._args[1], xs)).only_enforce_if(c)
            self.m.add(out == self.expr(e._args[2], xs)).only_enforce_if(c.negated())
        self._memo[key] = out
        return out

    def lit(self, e: Expr, xs: tuple[Any, ...]) -> Any:
        """A Boolean variable that is true exactly when e is non-zero on state xs."""
        key = (id(e), id(xs) ^ 1 << 62)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        op = e._op
        m = self.m
        b = m.new_bool_var("")
        if op in ("eq", "lt", "le"):
            x = self.expr(e._args[0], xs)
            y = self.expr(e._args[1], xs)
            if isinstance(x, int) and isinstance(y, int):
                m.add(b == int(x == y if op == "eq" else x < y if op == "lt" else x <= y))
            elif op == "eq":
                m.add(x == y).only_enforce_if(b)
                m.add(x != y).only_enforce_if(b.negated())
            elif op == "lt":
                m.add(x < y).only_enforce_if(b)
                m.add(x >= y).only_enforce_if(b.negated())
            else:
                m.add(x <= y).only_enforce_if(b)
                m.add(x > y).only_enforce_if(b.negated())
        elif op in ("and", "or"):
            p = self.lit(e._args[0], xs)
            q = self.lit(e._args[1], xs)
            if op == "and":
                m.add_bool_and([p, q]).only_enforce_if(b)
                m.add_bool_or([p.negated(), q.negated()]).only_enforce_if(b.negated())
            else:
                m.add_bool_or([p, q]).only_enforce_if(b)
                m.add_bool_and([p.negated(), q.negated()]).only_enforce_if(b.negated())
        elif op == "not":
            m.add(b + self.lit(e._args[0], xs) == 1)
        else:
            v = self.expr(e, xs)
            if isinstance(v, int):
                m.add(b == int(v != 0))
                self._memo[key] = b
                return b
            m.add(v != 0).only_enforce_if(b)
            m.add(v == 0).only_enforce_if(b.negated())
        self._memo[key] = b
        return b

    # -- the semantics -------------------------------------------------------------------------
    def holds(self, xs: tuple[Any, ...]) -> list[Any]:
        return [self.lit(h, xs) for h in self.c.holds]

    def require_valid(self, xs: tuple[Any, ...]) -> None:
        hs = self.holds(xs)
        if hs:
            self.m.add_bool_and(hs)

    def selectors(self, xs: tuple[Any, ...]) -> tuple[list[Any], Any]:
        """sel[k] is true exactly when invariant k is the first violated at xs; valid when none is."""
        m = self.m
        hs = self.holds(xs)
        sels = []
        for k, h in enumerate(hs):
            s = m.new_bool_var("")
            before = hs[:k]
            m.add_bool_and([h.negated(), *before]).only_enforce_if(s)
            m.add_bool_or([h, *(x.negated() for x in before)]).only_enforce_if(s.negated())
            sels.append(s)
        valid = m.new_bool_var("")
        m.add_bool_and(hs or [self.true]).only_enforce_if(valid)
        if hs:
            m.add_bool_or([h.negated() for h in hs]).only_enforce_if(valid.negated())
        m.add_exactly_one([*sels, valid])
        return sels, valid

    def _assign(
        self, xs: tuple[Any, ...], cases: list[tuple[Any, Assignment]], keep: list[Any]
    ) -> tuple[Any, ...]:
        """The state after the assignment of the case whose literal holds (the literals of `cases`
        and `keep` are exactly one true; under `keep` nothing changes). Values are in range: every
        assignment was first checked never to leave its variable's domain."""
        out = list(xs)
        for j, spec in enumerate(self.c.vars):
            writers = [(lit, e) for lit, part in cases for i, e in part if i == j]
            if not writers:
                continue
            y = self.m.new_bool_var("") if spec.kind == "bool" else self._new(spec.lo, spec.hi)
            for lit, e in writers:
                self.m.add(y == self.expr(e, xs)).only_enforce_if(lit)
            writing = {id(lit) for lit, _ in writers}
            for lit in [*(lit for lit, _ in cases if id(lit) not in writing), *keep]:
                self.m.add(y == xs[j]).only_enforce_if(lit)
            out[j] = y
        ys = tuple(out)
        self._keep.append(ys)
        return ys

    def repair(self, xs: tuple[Any, ...]) -> tuple[Any, ...]:
        if not self.c.holds:
            return xs
        sels, valid = self.selectors(xs)
        return self._assign(xs, list(zip(sels, self.c.repairs, strict=True)), [valid])

    def nf(self, xs: tuple[Any, ...], depth: int) -> tuple[Any, ...]:
        for _ in range(depth):
            xs = self.repair(xs)
        return xs

    def apply(self, e: int, xs: tuple[Any, ...]) -> tuple[Any, ...]:
        g = self.lit(self.c.guards[e], xs)
        return self._assign(xs, [(g, self.c.effects[e])], [g.negated()])

    def step(self, e: int, xs: tuple[Any, ...], depth: int) -> tuple[Any, ...]:
        return self.nf(self.apply(e, xs), depth)

    def differ(self, xs: tuple[Any, ...], ys: tuple[Any, ...]) -> None:
        ds = []
        for x, y in zip(xs, ys, strict=True):
            if x is y:
                continue
            # x < y or x > y, as two half-planes: `!=` over a huge domain propagates poorly.
            lt, gt = self.m.new_bool_var(""), self.m.new_bool_var("")
            self.m.add(x < y).only_enforce_if(lt)
            self.m.add(x > y).only_enforce_if(gt)
            ds += [lt, gt]
        self.m.add_bool_or(ds or [self.false])

    def out_of_range(self, cond: Any, xs: tuple[Any, ...], part: Assignment) -> None:
        """Require `cond` and some assigned value outside its variable's range."""
        bad: list[Any] = []
        for j, e in part:
            spec = self.c.vars[j]
            lo, hi = e.bounds
            v = self.expr(e, xs)
            if isinstance(v, int):
                if not spec.lo <= v <= spec.hi:
                    bad.append(self.true)
                continue
            if lo < spec.lo:
                b = self.m.new_bool_var("")
                self.m.add(v < spec.lo).only_enforce_if(b)
                bad.append(b)
            if hi > spec.hi:
                b = self.m.new_bool_var("")
                self.m.add(v > spec.hi).only_enforce_if(b)
                bad.append(b)
        self.m.add_bool_and([cond])
        self.m.add_bool_or(bad or [self.false])

    # -- solving -------------------------------------------------------------------------------
    def solve(self, start: tuple[Any, ...], what: str) -> Values | None:
        """The start state of a solution, or None when the query is unsatisfiable."""
        cp = self._cp
        last = "UNKNOWN"
        # A sequential portfolio with growing wall-clock budgets. Neither configuration wins
        # everywhere on huge domains: the LP relaxation (linearization level 2) finds a window of 10^8
        # values in 10^9 in milliseconds where plain search stalls, and stalls where plain search
        # answers at once. (CP-SAT's deterministic time does not advance during those stalls, so the
        # budgets are wall-clock: which configuration answers may depend on load, the answer not.)
        for budget in _BUDGETS:
            for level in (1, 2):
                solver = cp.CpSolver()
                solver.parameters.num_workers = 1
                solver.parameters.random_seed = 0
                solver.parameters.linearization_level = level
                solver.parameters.max_time_in_seconds = budget
                status = solver.solve(self.m)
                if status in (cp.OPTIMAL, cp.FEASIBLE):
                    return tuple(int(solver.value(x)) for x in start)
                if status == cp.INFEASIBLE:
                    return None
                last = solver.status_name(status)
        raise _Undecided(f"CP-SAT returned {last} on the query for {what} within its budget")


class _Run:
    def __init__(self, c: Concrete) -> None:
        self.c = c
        self.queries = 0

    def ask(self, build: Any, what: str) -> Values | None:
        q = _Query(self.c)
        start = q.state()
        build(q, start)
        self.queries += 1
        return q.solve(start, what)


def verify_symbolic(
    snap: Snapshot,
    domain: Domain,
    timer: PhaseTimer,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    states: int = 0,
) -> SymbolicVerdict:
    """Decide the machine on its AST or raise `NotConvergent` / `DomainViolation` (replayed witnesses),
    `DeclarationError` (invalid initial state) or `StateSpaceTooLarge` (the route cannot decide)."""
    problem = symbolic_problem(snap, domain)
    if problem is not None:
        raise StateSpaceTooLarge(
            f"cannot verify {snap.name!r} symbolically: {problem}", states=states, bytes_needed=0
        )
    from ._smallmodel import refute_small  # (imports this module)

    with timer.phase("small model"):
        refute_small(snap)  # a failure of the representative machine, replayed on this one
    try:
        return _verify(snap, timer, max_depth)
    except _Undecided as exc:
        raise StateSpaceTooLarge(
            f"machine {snap.name!r} is too large to enumerate and the symbolic route could not decide it: "
            f"{exc}. Shrink variable ranges or simplify the repairs.",
            states=states,
            bytes_needed=0,
        ) from None


def _verify(snap: Snapshot, timer: PhaseTimer, max_depth: int) -> SymbolicVerdict:
    c = Concrete.of(snap)
    run = _Run(c)
    ev_names = list(c.event_names)
    n_ev = len(ev_names)

    def replay_failed(what: str, x: Values) -> AssertionError:
        return AssertionError(
            f"internal error: CP-SAT proposed {c.as_dict(x)} as a witness of {what}, but the concrete "
            "semantics does not confirm it; please report this machine"
        )

    with timer.phase("domain checks"):
        # The tables check every assignment on every state where it runs; so do these queries.
        for k, part in enumerate(c.repairs):
            if not any(e.bounds[0] < c.vars[j].lo or e.bounds[1] > c.vars[j].hi for j, e in part):
                continue
            x = run.ask(
                lambda q, s, k=k, part=part: q.out_of_range(q.selectors(s)[0][k], s, part),
                f"invariant {c.invariant_names[k]!r} repair range",
            )
            if x is not None:
                c.repair(x)  # raises DomainViolation
                raise replay_failed("a domain violation", x)
        for e, part in enumerate(c.effects):
            if not any(ex.bounds[0] < c.vars[j].lo or ex.bounds[1] > c.vars[j].hi for j, ex in part):
                continue
            x = run.ask(
                lambda q, s, e=e, part=part: q.out_of_range(q.lit(c.guards[e], s), s, part),
                f"event {ev_names[e]!r} effect range",
            )
            if x is not None:
                c.apply(e, x)  # raises DomainViolation
                raise replay_failed("a domain violation", x)

    with timer.phase("normal forms (WFC)"):
        depth = _repair_depth(run, c, max_depth)
        if snap.initial is not None:
            initial = snap.initial
            k = c.first_violated(initial)
            if k >= 0:
                raise DeclarationError(
                    f"the declared initial state {c.as_dict(initial)} violates invariant "
                    f"{c.invariant_names[k]!r}; declare a valid initial state"
                )
        else:
            initial = c.nf(tuple(v.lo for v in c.vars), depth)

    with timer.phase("CC2"):
        cc2_failing: list[str] = []
        cc2_witness: Divergence | None = None
        for e in range(n_ev):
            x = run.ask(
                lambda q, s, e=e: q.differ(q.step(e, s, depth), q.step(e, q.nf(s, depth), depth)),
                f"CC2 of {ev_names[e]!r}",
            )
            if x is None:
                continue
            w = c.divergence("CC2", (e,), x, depth)
            if w is None:
                raise replay_failed(f"CC2 failing for {ev_names[e]!r}", x)
            cc2_failing.append(ev_names[e])
            cc2_witness = cc2_witness or w

    def pair_witness(kind: Literal["CC1", "obligation"], a: int, b: int) -> Divergence | None:
        def build(q: _Query, s: tuple[Any, ...]) -> None:
            q.require_valid(s)
            sa, sb = q.step(a, s, depth), q.step(b, s, depth)
            q.differ(q.step(b, sa, depth), q.step(a, sb, depth))

        x = run.ask(build, f"{kind} of {ev_names[a]!r}/{ev_names[b]!r}")
        if x is None:
            return None
        w = c.divergence(kind, (a, b), x, depth)
        if w is None:
            raise replay_failed(f"{kind} failing for {ev_names[a]!r}/{ev_names[b]!r}", x)
        return w

    all_pairs = list(combinations(range(n_ev), 2))
    checked = list(snap.independent) if snap.independent is not None else all_pairs
    undeclared = [p for p in all_pairs if p not in set(checked)]
    closures = event_closures(
        [_footprint(h, r) for h, r in zip(c.holds, c.repairs, strict=True)],
        [_footprint(g, f) for g, f in zip(c.guards, c.effects, strict=True)],
    )
    names = [v.name for v in c.vars]

    def prune_reason(a: int, b: int) -> str | None:
        if closures[a] & closures[b]:
            return None
        fa = ", ".join(names[i] for i in sorted(closures[a])) or "nothing"
        fb = ", ".join(names[i] for i in sorted(closures[b])) or "nothing"
        return (
            f"disjoint footprints closed under invariants: {ev_names[a]} touches {{{fa}}}, "
            f"{ev_names[b]} touches {{{fb}}}"
        )

    pruned: list[PrunedPair] = []
    with timer.phase("CC1"):
        for a, b in checked:
            reason = prune_reason(a, b)
            if reason is not None:
                pruned.append(PrunedPair(ev_names[a], ev_names[b], reason))
                continue
            w = pair_witness("CC1", a, b)
            if w is not None:
                raise NotConvergent(w)

    obligations: list[Divergence] = []
    with timer.phase("obligations"):
        for a, b in undeclared:
            if prune_reason(a, b) is None:
                w = pair_witness("obligation", a, b)
                if w is not None:
                    obligations.append(w)

    not_idem: list[Divergence] = []
    with timer.phase("idempotence"):
        for e in range(n_ev):

            def twice(q: _Query, s: tuple[Any, ...], e: int = e) -> None:
                q.require_valid(s)
                once = q.step(e, s, depth)
                q.differ(q.step(e, once, depth), once)

            x = run.ask(twice, f"idempotence of {ev_names[e]!r}")
            if x is not None:
                w = c.divergence("idempotence", (e,), x, depth)
                if w is None:
                    raise replay_failed(f"{ev_names[e]!r} not idempotent", x)
                not_idem.append(w)

    return SymbolicVerdict(
        depth,
        initial,
        "declared" if snap.independent is not None else "all",
        checked,
        pruned,
        len(undeclared),
        obligations,
        not_idem,
        not cc2_failing,
        cc2_failing,
        cc2_witness,
        closures,
        run.queries,
        solver_identity(),
    )


def _footprint(cond: Expr, part: Assignment) -> Footprint:
    reads = cond.reads().union(*(e.reads() for _, e in part))
    return Footprint(reads, frozenset(j for j, _ in part), False)


def _repair_depth(run: _Run, c: Concrete, max_depth: int) -> int:
    """The maximum repair depth K (least K with repair^K(s) valid for every s), or NotConvergent with
    a replayed repair cycle; `_Undecided` when neither is found within `max_depth`."""
    if not c.holds:
        return 0
    for k in range(max_depth + 1):

        def still_invalid(q: _Query, s: tuple[Any, ...], k: int = k) -> None:
            end = q.nf(s, k)
            q.m.add_bool_or([h.negated() for h in q.holds(end)])

        x = run.ask(still_invalid, f"repair depth {k}")
        if x is None:
            return k
    for period in range(1, max_depth + 1):

        def loops(q: _Query, s: tuple[Any, ...], period: int = period) -> None:
            q.m.add_bool_or([h.negated() for h in q.holds(s)])
            end = s
            for _ in range(period):
                end = q.repair(end)
            for x, y in zip(s, end, strict=True):
                if x is not y:
                    q.m.add(x == y)

        x = run.ask(loops, f"a repair cycle of length {period}")
        if x is not None:
            cycle = c.cycle(x, period)
            if cycle is None:
                raise AssertionError(
                    f"internal error: CP-SAT proposed {c.as_dict(x)} on a repair cycle of length {period}, "
                    "but the concrete semantics does not confirm it; please report this machine"
                )
            raise NotConvergent(cycle)
    raise _Undecided(
        f"repair takes more than {max_depth} steps from some state and no repair cycle of at most "
        f"{max_depth} steps exists, so WFC is neither shown nor refuted"
    )
