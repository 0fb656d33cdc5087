"""Small-but-nasty integer machines for the symbolic route, each declared at any scale.

Every machine is a function of `n`, the top of its integer domains: `n = 10**9` or `10**12` is what
the symbolic route exists for, and a small `n` (about 40) gives the same machine shrunk so
enumeration can decide it too. Constants are fractions of `n`, chosen so the shrunk machine keeps
the shape of the large one (the same guards fire, the same events meet or miss); the tests check
that the symbolic verdict equals enumeration's at the small scale, and that the large scale reaches
the same verdict kind. Shapes: nested `min_`/`max_`/`if_`, guards with comparisons, repairs of
several steps, two and three integer variables, commuting and non-commuting pairs, CC2 failures,
obligations and events that are not idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from govern import DomainViolation, NotConvergent, Registry, RepairCycle, if_, max_, min_

Corpus = dict[str, Callable[[int], Registry]]


def outcome(decide: Callable[[], Any]) -> tuple[str, Any]:
    """What deciding a machine gave, as a kind ("ok", "domain", "cycle", "diverge") and the result or error,
    so that two routes' outcomes compare."""
    try:
        return "ok", decide()
    except DomainViolation as exc:
        return "domain", exc
    except NotConvergent as exc:
        return ("cycle" if isinstance(exc.counterexample, RepairCycle) else "diverge"), exc


def limits(non_commuting: bool) -> Registry:
    """One limit of 10^9 values kept at 10 or more; two floors and a cap commute. With `non_commuting`, an
    add of 3e8 that does not commute with the floors (from limit = 10: 300001000 vs 300000010)."""
    r = Registry("limits")
    limit = r.int("limit", 0, 10**9 - 1)
    r.invariant("at_least_ten", holds=limit >= 10, repair={limit: 10})
    r.event("floor_1k", effect={limit: max_(limit, 1000)})
    r.event("floor_1m", effect={limit: max_(limit, 1_000_000)})
    r.event("cap_900m", effect={limit: min_(limit, 900_000_000)})
    if non_commuting:
        r.event("add_300m", guard=limit <= 10**9 - 1 - 300_000_000, effect={limit: limit + 300_000_000})
    return r


def up_floor(n: int) -> Registry:
    """The session's stuck query: a saturating raise and a floor do not commute (limit = 0)."""
    r = Registry("up_floor")
    limit = r.int("limit", 0, n)
    r.event("up", effect={limit: min_(limit + n // 10**6 + 1, n)})
    r.event("floor", effect={limit: max_(limit, n // 10**7 + 1)})
    return r


def floors_and_cap(n: int) -> Registry:
    """Floors and a cap above them commute; the repair raises anything below a minimum."""
    r = Registry("floors_and_cap")
    limit = r.int("limit", 0, n)
    r.invariant("at_least_min", holds=limit >= n // 40, repair={limit: n // 40})
    r.event("floor_a", effect={limit: max_(limit, n // 20)})
    r.event("floor_b", effect={limit: max_(limit, n // 5)})
    r.event("cap", effect={limit: min_(limit, n - n // 10)})
    return r


def nested_clamps(n: int) -> Registry:
    """Nested clamps and an `if_` that bumps to a threshold only from below it: all commute."""
    r = Registry("nested_clamps")
    x = r.int("x", 0, n)
    t = n // 2
    r.event("clamp_mid", effect={x: max_(min_(x, n - n // 4), n // 4)})
    r.event("bump_to_t", effect={x: if_(x < t, max_(x, t), x)})
    r.event("cap_high", effect={x: min_(max_(x, n // 8), n - n // 8)})
    return r


def saturating_adds(n: int) -> Registry:
    """Two saturating additions commute with each other but not with a guarded reset."""
    r = Registry("saturating_adds")
    x = r.int("x", 0, n)
    r.event("add_small", effect={x: min_(x + n // 40, n)})
    r.event("add_big", effect={x: min_(x + n // 10, n)})
    r.event("reset_if_high", guard=x > n - n // 3, effect={x: n // 2})
    r.independent("add_small", "add_big")
    return r


def balance_under_limit(n: int) -> Registry:
    """Two variables: a balance kept under a limit by repair; raising and lowering the limit with a
    deposit. Deposits do not commute with lowering the limit (the repair clips in between)."""
    r = Registry("balance_under_limit")
    balance = r.int("balance", 0, n)
    limit = r.int("limit", 0, n)
    r.invariant("within_limit", holds=balance <= limit, repair={balance: limit})
    r.event("deposit", guard=balance + n // 10 <= limit, effect={balance: balance + n // 10})
    r.event("raise_limit", effect={limit: min_(limit + n // 5, n)})
    r.event("lower_limit", effect={limit: max_(limit - n // 5, 0)})
    return r


def repair_chain(n: int) -> Registry:
    """Three variables ordered x <= y <= z <= n/2 by a chain of repairs (depth 3), and events that
    only raise: every pair commutes, and the normal form takes several repair steps."""
    r = Registry("repair_chain")
    x = r.int("x", 0, n)
    y = r.int("y", 0, n)
    z = r.int("z", 0, n)
    r.invariant("z_capped", holds=z <= n // 2, repair={z: n // 2})
    r.invariant("y_below_z", holds=y <= z, repair={y: z})
    r.invariant("x_below_y", holds=x <= y, repair={x: y})
    r.event("raise_z", effect={z: max_(z, n // 3)})
    r.event("raise_y", effect={y: max_(y, n // 4)})
    r.event("raise_x", effect={x: max_(x, n // 5)})
    return r


def cascade_push(n: int) -> Registry:
    """Repairs that push upward through two variables: raising x past y pushes y, and y past a cap
    resets both; several steps, and a pair that diverges through the cascade."""
    r = Registry("cascade_push")
    x = r.int("x", 0, n)
    y = r.int("y", 0, n)
    r.invariant("y_cap", holds=y <= n - n // 10, repair={y: n // 2, x: n // 4})
    r.invariant("x_le_y", holds=x <= y, repair={y: min_(x + n // 20, n)})
    r.event("raise_x", effect={x: max_(x, n // 2 + n // 5)})
    r.event("bump_x", guard=x + n // 10 <= n, effect={x: x + n // 10})
    return r


def cc2_fails(n: int) -> Registry:
    """An event that reads an invalid value before repair fixes it: CC2 fails (and is reported),
    while every pair of events still commutes on valid states."""
    r = Registry("cc2_fails")
    x = r.int("x", 0, n)
    r.invariant("floor", holds=x >= n // 10, repair={x: n // 10})
    r.event("jump_if_low", effect={x: if_(x < n // 10, n // 2, x)})
    r.event("raise", effect={x: max_(x, n // 5)})
    return r


def not_idempotent(n: int) -> Registry:
    """A guarded increment is not idempotent; declared independent of a floor it does not commute
    with, it leaves an obligation."""
    r = Registry("not_idempotent")
    x = r.int("x", 0, n)
    r.event("inc", guard=x + n // 3 <= n, effect={x: x + n // 3})
    r.event("floor", effect={x: max_(x, n // 2)})
    r.event("cap", effect={x: min_(x, n)})
    r.independent("floor", "cap")
    r.independent("inc", "cap")
    return r


def two_sums(n: int) -> Registry:
    """Sums of two variables in guards and repairs (x + y <= n keeps y in check): a transfer and
    two floors, where the floors commute with each other and the transfer does not."""
    r = Registry("two_sums")
    x = r.int("x", 0, n)
    y = r.int("y", 0, n)
    r.invariant("sum_capped", holds=x + y <= n, repair={y: n - x})
    r.event("floor_x", effect={x: max_(x, n // 4)})
    r.event("floor_y", effect={y: max_(y, n // 4)})
    r.event("transfer", guard=(x >= n // 10) & (y + n // 10 <= n), effect={x: x - n // 10, y: y + n // 10})
    r.independent("floor_x", "floor_y")
    return r


def three_way_guards(n: int) -> Registry:
    """Three variables, nested `if_`: pairwise max-merges of three registers, which do not commute
    (merging a and b before or after b and c decides whether c's value reaches a)."""
    r = Registry("three_way_guards")
    a = r.int("a", 0, n)
    b = r.int("b", 0, n)
    c = r.int("c", 0, n)
    r.event("merge_ab", effect={a: max_(a, b), b: max_(a, b)})
    r.event("merge_bc", effect={b: max_(b, c), c: max_(b, c)})
    r.event("lift_c", effect={c: if_(c < n // 3, n // 3, if_(c < n // 2, n // 2, c))})
    return r


def deep_repair(n: int) -> Registry:
    """A repair that steps down one unit at a time, 40 steps at most: WFC needs the depth search to
    go past 32, and the floor event commutes with the cap it triggers."""
    r = Registry("deep_repair")
    x = r.int("x", 0, n)
    r.invariant("near_top", holds=x <= n - 40, repair={x: x - 1})
    r.event("floor", effect={x: max_(x, n // 4)})
    r.event("top", effect={x: n})
    return r


def unreachable_conflict(n: int) -> Registry:
    """Two events that diverge only above n/2, which no run from 0 reaches: CC1 fails on the "valid"
    domain and holds on the "reachable" one (reachable: 0, n/4, n/3)."""
    r = Registry("unreachable_conflict")
    x = r.int("x", 0, n)
    r.event("lift_a", effect={x: if_(x <= n // 2, max_(x, n // 4), n)})
    r.event("lift_b", effect={x: if_(x <= n // 2, max_(x, n // 3), 0)})
    return r


def long_reach(n: int) -> Registry:
    """Like `unreachable_conflict`, but the reachable states 0 .. n/2 are walked one unit at a time:
    deciding "reachable" needs runs of n/2 events, so at 10^9 the symbolic route says it cannot."""
    r = Registry("long_reach")
    x = r.int("x", 0, n)
    r.event("walk", effect={x: if_(x <= n // 2, min_(x + 1, n // 2), n)})
    r.event("drop_high", effect={x: if_(x <= n // 2, x, 0)})
    return r


CORPUS: Corpus = {
    f.__name__: f
    for f in (
        up_floor,
        floors_and_cap,
        nested_clamps,
        saturating_adds,
        balance_under_limit,
        repair_chain,
        cascade_push,
        cc2_fails,
        not_idempotent,
        two_sums,
        three_way_guards,
        deep_repair,
        unreachable_conflict,
    )
}
