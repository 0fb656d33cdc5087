"""Verification without enumeration: WFC, CC1, CC2, obligations and idempotence decided on the rules'
AST by CP-SAT (ortools), for machines whose integer domains are too large for tables.

Every question is an existence query over a fresh start state ranging over the declared domains:
"is there a state where ...". The rules are compiled exactly (docs/semantics.md: integers never
wrap) into piecewise-affine functions of the start state (`_piecewise`), so the model's only integer
variables are the start state's and every condition is a literal tied to one linear inequality on
them. Then

- a **satisfiable** query yields a candidate state, which is replayed through the concrete semantics
  (`_concrete.Concrete`, the engine's own reference evaluator) and reported only when the replay
  shows the violation (else the build stops with an internal error: the encoding and the semantics
  disagree);
- an **unsatisfiable** query is a verdict that rests on CP-SAT's word: no proof object is checked.
  The report names the solver and its version.

Normal forms are unrolled: WFC is established by finding the least K such that K repair steps from
any state reach a valid state (then NF(s) = repair^K(s) and K is the maximum repair depth); when no
K up to the bound works, a repair cycle is searched for and replayed, and otherwise the route gives
up with what to do (it never guesses). On the "reachable" domain a failure found on a valid state is
searched for along runs from the initial state, unrolled the same way (`_reachable_witness`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Literal

from .._errors import NotConvergent, StateSpaceTooLarge
from ..model._declarations import Assignment, Domain, Snapshot
from ..model._expr import Expr
from ._concrete import Concrete, Values
from ._counterexample import Divergence
from ._piecewise import Affine, FormulaLimit, Formulas, Piecewise
from ._report import PrunedPair
from ._tables import Footprint
from ._timing import PhaseTimer
from ._verify import event_closures

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_RUN",
    "SymbolicVerdict",
    "solver_identity",
    "symbolic_problem",
    "verify_symbolic",
]

#: Repair depth (and repair cycle length) the route tries before it gives up.
DEFAULT_MAX_DEPTH = 64
#: With the "reachable" domain: the longest run from the initial state searched for a failing state.
DEFAULT_MAX_RUN = 32
#: Repair steps replayed concretely to find the cycle a long chain runs into.
_CYCLE_REPLAY = 10**5
#: Repair steps replayed concretely to describe a chain longer than the depth bound.
_CHAIN_REPLAY = 10**6
#: Wall-clock seconds each solver configuration gets, round after round, before the route gives up.
_BUDGETS = (2.0, 20.0, 60.0)

_State = tuple[Piecewise, ...]


def solver_identity() -> dict[str, str]:
    """The solver the symbolic verdicts rest on: name, package and version (imports ortools)."""
    from importlib.metadata import version

    from ortools.sat.python import cp_model  # noqa: F401  (the solver must be importable)

    return {"name": "CP-SAT", "package": "ortools", "version": version("ortools")}


def symbolic_problem(snap: Snapshot, domain: Domain) -> str | None:
    """Why the symbolic route cannot decide `snap` (None when it can)."""
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
    """One CP-SAT model: a fresh start state over the declared domains, the rules applied to it as
    piecewise-affine values (`_piecewise`), and formulas over them asserted true. The model's only
    integer variables are the start state's; every condition is a literal tied to one linear
    inequality on them (or an and/or of such literals)."""

    def __init__(self, c: Concrete, fixed: Values | None = None, choices: int = 0) -> None:
        """A free start state, or the state `fixed` followed by `choices` free event choices."""
        from ortools.sat.python import cp_model

        self._cp = cp_model
        self.m = cp_model.CpModel()
        self.c = c
        # The solver's variables: the start state's (unless fixed), then the event choices.
        ranges = [(v.lo, v.hi) for v in c.vars] if fixed is None else []
        self._free = len(ranges)
        ranges += [(0, len(c.event_names) - 1)] * choices
        self.f = Formulas(ranges)
        self.xs = [self.m.new_int_var(lo, hi, "") for lo, hi in ranges]
        self.start: _State = (
            tuple(self.f.var(i) for i in range(len(c.vars)))
            if fixed is None
            else tuple(self.f.const(x) for x in fixed)
        )
        self._memos: dict[int, dict[int, Piecewise]] = {}
        self._keep: list[_State] = []  # states memoized by id() must stay alive
        self._lits: dict[int, Any] = {}
        self.true = self.m.new_bool_var("true")
        self.m.add(self.true == 1)

    # -- expressions on states ------------------------------------------------------------------
    def _memo(self, xs: _State) -> dict[int, Piecewise]:
        memo = self._memos.get(id(xs))
        if memo is None:
            memo = self._memos[id(xs)] = {}
            self._keep.append(xs)
        return memo

    def value(self, e: Expr, xs: _State) -> Piecewise:
        return self.f.evaluate(e, xs, self._memo(xs))

    def cond(self, e: Expr, xs: _State) -> int:
        return self.f.condition(e, xs, self._memo(xs))

    # -- the semantics ---------------------------------------------------------------------------
    def holds(self, xs: _State) -> list[int]:
        return [self.cond(h, xs) for h in self.c.holds]

    def valid(self, xs: _State) -> int:
        return self.f.all(self.holds(xs))

    def first_violated(self, xs: _State, k: int) -> int:
        """Invariant k is the first violated at xs."""
        hs = self.holds(xs)
        return self.f.all([self.f.negate(hs[k]), *hs[:k]])

    def _assign(self, xs: _State, cases: list[tuple[int, Assignment]]) -> _State:
        """The state after the assignment of the first case whose condition holds (xs when none)."""
        out = list(xs)
        for j in range(len(xs)):
            val = xs[j]
            for cond, part in reversed(cases):
                written = [e for i, e in part if i == j]
                val = self.f.choose(cond, self.value(written[0], xs) if written else xs[j], val)
            out[j] = val
        return tuple(out)

    def repair(self, xs: _State) -> _State:
        hs = self.holds(xs)
        return self._assign(
            xs, [(self.f.negate(h), part) for h, part in zip(hs, self.c.repairs, strict=True)]
        )

    def nf(self, xs: _State, depth: int) -> _State:
        for _ in range(depth):
            xs = self.repair(xs)
        return xs

    def apply(self, e: int, xs: _State) -> _State:
        return self._assign(xs, [(self.cond(self.c.guards[e], xs), self.c.effects[e])])

    def step(self, e: int, xs: _State, depth: int) -> _State:
        return self.nf(self.apply(e, xs), depth)

    def run(self, xs: _State, depth: int) -> list[_State]:
        """xs and the states after each of the query's event choices (see `__init__`)."""
        states = [xs]
        for i in range(len(self.xs) - self._free):
            cur = states[-1]
            choice = self.f.var(self._free + i)
            nxt = self.step(len(self.c.event_names) - 1, cur, depth)
            for e in reversed(range(len(self.c.event_names) - 1)):
                chosen = self.f.compare("eq", choice, self.f.const(e))
                after = self.step(e, cur, depth)
                nxt = tuple(self.f.choose(chosen, a, b) for a, b in zip(after, nxt, strict=True))
            states.append(nxt)
        return states

    def differ(self, xs: _State, ys: _State) -> int:
        return self.f.any([self.f.differ(x, y) for x, y in zip(xs, ys, strict=True) if x != y])

    def require_distinct(self, states: list[_State]) -> None:
        """Assert that no two of the states are equal. Each state's values become solver variables
        here (tied to their pieces, never to each other), since comparing every pair piecewise costs
        the product of their pieces."""
        m = self.m
        values = [[self._materialize(v) for v in xs] for xs in states]
        for j in range(len(states)):
            for i in range(j):
                apart = []
                for x, y in zip(values[i], values[j], strict=True):
                    lt, gt = m.new_bool_var(""), m.new_bool_var("")
                    m.add(x < y).only_enforce_if(lt)
                    m.add(x > y).only_enforce_if(gt)
                    apart += [lt, gt]
                m.add_bool_or(apart)

    def _materialize(self, v: Piecewise) -> Any:
        lo = min(self._affine_bound(a, low=True) for _, a in v)
        hi = max(self._affine_bound(a, low=False) for _, a in v)
        out = self.m.new_int_var(lo, hi, "")
        pieces = []
        for cond, (coeffs, k) in v:
            lin = sum((c * x for c, x in zip(coeffs, self.xs, strict=True) if c), k)
            piece = self._lit(cond)
            self.m.add(out == lin).only_enforce_if(piece)
            pieces.append(piece)
        # A piece's literal only implies its condition (see `_lit`); requiring one to hold selects
        # the piece whose condition is true (pieces are exhaustive and pairwise exclusive).
        self.m.add_bool_or(pieces)
        return out

    def _affine_bound(self, a: Affine, *, low: bool) -> int:
        coeffs, k = a
        for c, (lo, hi) in zip(coeffs, self.f.ranges, strict=True):
            k += c * (lo if (c > 0) == low else hi)
        return k

    def same(self, xs: _State, ys: _State) -> int:
        return self.f.negate(self.differ(xs, ys))

    def out_of_range(self, xs: _State, part: Assignment) -> int:
        """Some value `part` assigns at xs lies outside its variable's range."""
        return self.f.any(
            [self.f.outside(self.value(e, xs), self.c.vars[j].lo, self.c.vars[j].hi) for j, e in part]
        )

    # -- CP-SAT ----------------------------------------------------------------------------------
    def require(self, *fs: int) -> None:
        """Assert every formula."""
        for f in fs:
            self.m.add_bool_and([self._lit(f)])

    def _lit(self, f: int) -> Any:
        """A literal that implies formula f (f's negations are in its atoms, so f only ever occurs
        positively and one direction suffices for and/or; atoms are encoded both ways)."""
        hit = self._lits.get(f)
        if hit is not None:
            return hit
        kind = self.f.kind[f]
        m = self.m
        out: Any
        if kind == "true":
            out = self.true
        elif kind == "false":
            out = self.true.negated()
        elif kind == "atom":
            coeffs, c = self.f.payload[f]
            lin = sum(k * x for k, x in zip(coeffs, self.xs, strict=True) if k)
            out = m.new_bool_var("")
            m.add(lin <= c).only_enforce_if(out)
            m.add(lin >= c + 1).only_enforce_if(out.negated())
        else:
            children = [self._lit(g) for g in self.f.payload[f]]
            out = m.new_bool_var("")
            if kind == "and":
                m.add_bool_and(children).only_enforce_if(out)
            else:
                m.add_bool_or(children).only_enforce_if(out)
        self._lits[f] = out
        return out

    def solve(self, what: str) -> Values | None:
        """The values of a solution's start variables (the start state, then any event choices), or
        None when the query is unsatisfiable."""
        cp = self._cp
        last = "UNKNOWN"
        # Presolve's probing walks a bound across a huge domain one offset at a time on some
        # models (seconds for what search answers in milliseconds), and helps on others: both are
        # tried, with growing wall-clock budgets. Which configuration answers may depend on load;
        # the answer does not.
        for budget in _BUDGETS:
            for presolve in (False, True):
                solver = cp.CpSolver()
                solver.parameters.num_workers = 1
                solver.parameters.random_seed = 0
                solver.parameters.cp_model_presolve = presolve
                solver.parameters.max_time_in_seconds = budget
                status = solver.solve(self.m)
                if status in (cp.OPTIMAL, cp.FEASIBLE):
                    return tuple(int(solver.value(x)) for x in self.xs)
                if status == cp.INFEASIBLE:
                    return None
                last = solver.status_name(status)
        raise _Undecided(
            f"CP-SAT returned {last} on the query for {what} within its budget; shrink variable ranges "
            "or simplify the rules"
        )


class _Run:
    def __init__(self, c: Concrete) -> None:
        self.c = c
        self.queries = 0

    def ask(self, build: Any, what: str) -> Values | None:
        """Solve the query `build(q, start)` asserts on a fresh start state."""
        q = _Query(self.c)
        _build(build, q, what)
        self.queries += 1
        return q.solve(what)

    def ask_run(self, initial: Values, events: int, build: Any, what: str) -> Values | None:
        """Solve the query `build(q, start)` asserts, where start is `initial` and `events` free
        event choices follow it; the solution's choices (or None)."""
        q = _Query(self.c, initial, events)
        _build(build, q, what)
        self.queries += 1
        return q.solve(what)


def _build(build: Any, q: _Query, what: str) -> None:
    try:
        build(q, q.start)
    except (FormulaLimit, RecursionError) as exc:  # formulas too wide, or nested too deep
        raise _Undecided(
            f"the query for {what} grew too large to state ({exc}): the rules' case splits multiply "
            "across steps and repairs; simplify the rules (fewer nested if_/min_/max_, fewer repair steps)"
        ) from None


def verify_symbolic(
    snap: Snapshot,
    domain: Domain,
    timer: PhaseTimer,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_run: int = DEFAULT_MAX_RUN,
    states: int = 0,
) -> SymbolicVerdict:
    """Decide the machine on its AST or raise `NotConvergent` / `DomainViolation` (replayed witnesses),
    `DeclarationError` (invalid initial state) or `StateSpaceTooLarge` (the route cannot decide)."""
    problem = symbolic_problem(snap, domain)
    if problem is not None:
        raise StateSpaceTooLarge(
            f"cannot verify {snap.name!r} symbolically: {problem}", states=states, bytes_needed=0
        )
    try:
        return _verify(snap, domain, timer, max_depth, max_run)
    except _Undecided as exc:
        raise StateSpaceTooLarge(
            f"machine {snap.name!r} is too large to enumerate and the symbolic route could not decide it: "
            f"{exc}.",
            states=states,
            bytes_needed=0,
        ) from None


def _verify(
    snap: Snapshot, domain: Domain, timer: PhaseTimer, max_depth: int, max_run: int
) -> SymbolicVerdict:
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
                lambda q, s, k=k, part=part: q.require(q.first_violated(s, k), q.out_of_range(s, part)),
                f"invariant {c.invariant_names[k]!r} repair range",
            )
            if x is not None:
                c.repair(x)  # raises DomainViolation
                raise replay_failed("a domain violation", x)
        for e, part in enumerate(c.effects):
            if not any(ex.bounds[0] < c.vars[j].lo or ex.bounds[1] > c.vars[j].hi for j, ex in part):
                continue
            x = run.ask(
                lambda q, s, e=e, part=part: q.require(q.cond(c.guards[e], s), q.out_of_range(s, part)),
                f"event {ev_names[e]!r} effect range",
            )
            if x is not None:
                c.apply(e, x)  # raises DomainViolation
                raise replay_failed("a domain violation", x)

    with timer.phase("normal forms (WFC)"):
        depth = _repair_depth(run, c, max_depth)
        if snap.initial is not None:
            initial = snap.initial
            c.require_valid_initial(initial)
        else:
            initial = c.nf(tuple(v.lo for v in c.vars), depth)

    with timer.phase("CC2"):
        cc2_failing: list[str] = []
        cc2_witness: Divergence | None = None
        for e in range(n_ev):
            x = run.ask(
                lambda q, s, e=e: q.require(q.differ(q.step(e, s, depth), q.step(e, q.nf(s, depth), depth))),
                f"CC2 of {ev_names[e]!r}",
            )
            if x is None:
                continue
            w = c.divergence("CC2", (e,), x, depth)
            if w is None:
                raise replay_failed(f"CC2 failing for {ev_names[e]!r}", x)
            cc2_failing.append(ev_names[e])
            cc2_witness = cc2_witness or w

    def failing(
        kind: Literal["CC1", "obligation", "idempotence"], events: tuple[int, ...]
    ) -> Divergence | None:
        """A replayed witness of `kind` on the checked domain, or None when there is none."""
        names = "/".join(ev_names[e] for e in events)
        what = f"{kind} of {names}"

        def fails(q: _Query, s: _State) -> int:
            if kind == "idempotence":
                once = q.step(events[0], s, depth)
                return q.differ(q.step(events[0], once, depth), once)
            a, b = events
            sa, sb = q.step(a, s, depth), q.step(b, s, depth)
            return q.differ(q.step(b, sa, depth), q.step(a, sb, depth))

        x = run.ask(lambda q, s: q.require(q.valid(s), fails(q, s)), what)
        if x is not None and domain == "reachable":
            x = _reachable_witness(run, c, initial, depth, max_run, fails, kind, events, x, what)
        if x is None:
            return None
        w = c.divergence(kind, events, x, depth)
        if w is None:
            raise replay_failed(f"{kind} failing for {names}", x)
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
            w = failing("CC1", (a, b))
            if w is not None:
                raise NotConvergent(w)

    obligations: list[Divergence] = []
    with timer.phase("obligations"):
        for a, b in undeclared:
            if prune_reason(a, b) is None:
                w = failing("obligation", (a, b))
                if w is not None:
                    obligations.append(w)

    not_idem: list[Divergence] = []
    with timer.phase("idempotence"):
        for e in range(n_ev):
            w = failing("idempotence", (e,))
            if w is not None:
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


def _reachable_witness(
    run: _Run,
    c: Concrete,
    initial: Values,
    depth: int,
    max_run: int,
    fails: Any,
    kind: str,
    events: tuple[int, ...],
    valid_witness: Values,
    what: str,
) -> Values | None:
    """A state reachable from `initial` where `fails` holds, or None when no reachable state fails.

    A valid state where the condition fails (`valid_witness`) exists; whether a run reaches one is
    reachability, a fixpoint no single query states, so runs are unrolled like repairs: runs of 0, 1,
    2, 4, ... up to `max_run` events are searched (one query each). The search is complete once no
    run of that many events visits only distinct states (the recurrence diameter is below it): every
    reachable state is then reached by a shorter, loop-free run, all of which were searched.
    `_Undecided` when neither happens within `max_run` events."""
    length = 0
    while True:
        choices = run.ask_run(
            initial, length, lambda q, s: q.require(q.f.any([fails(q, t) for t in q.run(s, depth)])), what
        )
        if choices is not None:
            x = initial
            for e in (None, *choices):
                if e is not None:
                    x = c.step(e, x, depth)
                if c.divergence(kind, events, x, depth) is not None:
                    return x
            raise AssertionError(
                f"internal error: CP-SAT proposed the run {[c.event_names[e] for e in choices]} from "
                f"{c.as_dict(initial)} to a witness of {what}, but the concrete semantics does not confirm "
                "it; please report this machine"
            )
        if run.ask_run(initial, length, lambda q, s: q.require_distinct(q.run(s, depth)), what) is None:
            return None
        if length >= max_run:
            break
        length = min(max(1, 2 * length), max_run)
    raise _Undecided(
        f"{what} fails on the valid state {c.as_dict(valid_witness)}, but no run of up to {max_run} events "
        f"from the initial state {c.as_dict(initial)} reaches a state where it fails, and whether a longer "
        "run does is not decided (reachability over a domain this large is unrolled run by run). Build "
        "with domain='valid' to check every valid state, or add an invariant that rules out the states "
        "no run reaches"
    )


def _footprint(cond: Expr, part: Assignment) -> Footprint:
    reads = cond.reads().union(*(e.reads() for _, e in part))
    return Footprint(reads, frozenset(j for j, _ in part), False)


def _repair_depth(run: _Run, c: Concrete, max_depth: int) -> int:
    """The maximum repair depth K (least K with repair^K(s) valid for every s), or NotConvergent with
    a replayed repair cycle; `_Undecided` when neither is found within `max_depth` steps.

    "Some state still violates an invariant after k repair steps" is monotone in k, so K is found by
    doubling k and then bisecting: O(log K) queries, fewer because every witness is replayed (a state
    that needs L steps shows K >= L). A repair cycle of any period up to `max_depth` is one query (a
    chain from an invalid state that comes back to it)."""
    if not c.holds:
        return 0

    def deeper_than(k: int) -> Values | None:
        return run.ask(lambda q, s: q.require(q.f.negate(q.valid(q.nf(s, k)))), f"repair depth above {k}")

    first = deeper_than(0)
    if first is None:
        return 0
    # Each witness is replayed: a state needing L steps shows depth >= L, so the search skips ahead.
    witness: Values = first
    below = 0  # some state needs more than `below` steps
    above: int | None = None  # no state needs more than `above` steps
    k = 1
    while below < max_depth:
        steps, _ = c.chain_length(witness, max_depth + 1)
        below = max(below, steps - 1)
        if below >= max_depth:
            break
        k = min(max(2 * k, below + 1), max_depth)
        found = deeper_than(k)
        if found is None:
            above = k
            break
        witness, below = found, k
    if above is not None:
        while above - below > 1:
            mid = (below + above) // 2
            if deeper_than(mid) is None:
                above = mid
            else:
                below = mid
        return above

    # The witness's own chain may run into a cycle: replaying it finds the cycle without a query.
    cycle = c.find_cycle(witness, _CYCLE_REPLAY)
    if cycle is not None:
        raise NotConvergent(cycle)

    def loops(q: _Query, s: _State, period: int) -> None:
        chain = [s]
        for _ in range(period):
            chain.append(q.repair(chain[-1]))
        q.require(q.f.negate(q.valid(s)), q.f.any([q.same(s, t) for t in chain[1:]]))

    period = 1
    while True:  # cycles of period <= 1, 2, 4, ...: short cycles (the usual ones) cost short queries
        x = run.ask(lambda q, s, p=period: loops(q, s, p), f"a repair cycle of at most {period} steps")
        if x is not None:
            cycle = next((cy for p in range(1, period + 1) if (cy := c.cycle(x, p)) is not None), None)
            if cycle is None:
                raise AssertionError(
                    f"internal error: CP-SAT proposed {c.as_dict(x)} on a repair cycle, but the concrete "
                    "semantics does not confirm it; please report this machine"
                )
            raise NotConvergent(cycle)
        if period >= max_depth:
            break
        period = min(2 * period, max_depth)
    steps, reached = c.chain_length(witness, _CHAIN_REPLAY)
    if reached:
        seen = f"from {c.as_dict(witness)} repair takes {steps:,} steps"
    else:
        seen = f"from {c.as_dict(witness)} repair takes more than {steps:,} steps"
    raise _Undecided(
        f"repair takes more than {max_depth} steps from some state ({seen}) and no repair cycle of at "
        f"most {max_depth} steps exists, so WFC is neither shown nor refuted. The symbolic route "
        "unrolls repair step by step: make each repair reach a valid state in a few steps (assign "
        "the bound, as in `x: 0`, rather than step towards it, as in `x: x - 1`)"
    )
