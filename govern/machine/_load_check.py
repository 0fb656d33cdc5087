"""What `Machine.load` re-checks before it hands out a loaded machine.

A saved file's content hash is unkeyed: anyone can edit the tables or the report and recompute it. So
loading trusts nothing the file says. The extracted table checker (`govern.oracle.check_tables`)
re-checks the tables as the build did, and the loaded report's claims must be its findings: the
normal forms, the repair depth, CC2, the checked domain, the causal-order obligations and the events
that are not idempotent. When every rule is an expression, the extracted rules checker also confirms
that the tables are exactly what the rules mean. The rest of the report must be what those findings
and the rules give: its guarantee and theorems, its pairs, the events CC2 fails for, the rules given as
callables, the oracle's verdict, and every witness (replayed through the tables). Anything else refuses
the file; the report handed out names the oracle that re-checked it. (A report in the words of an older
govern is first read in this version's words by `Machine.load`: see `_in_current_words` there.)
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import DeclarationError
from ..model._space import Space, Value
from ..oracle._gate import certified_record, oracle_module
from ..verify._compose import rule_footprints
from ..verify._concrete import Concrete
from ..verify._counterexample import Divergence, Step
from ..verify._report import Report, guarantee_text
from ..verify._verify import closed_footprints
from ._rules_snapshot import snapshot_from_rules

__all__ = ["check_stored_timings", "recheck"]


def recheck(
    rules: dict[str, Any],
    space: Space,
    valid: npt.NDArray[np.bool_],
    repair: npt.NDArray[np.int32],
    apply: npt.NDArray[np.int32],
    nf: npt.NDArray[np.int32],
    initial: int,
    domain_ids: npt.NDArray[np.int32],
    report: Report,
) -> tuple[list[str], dict[str, Any] | None]:
    """Every way the loaded machine differs from what the oracle finds in its tables (empty: it is the
    certified machine its report describes), and the oracle's record of this re-check for the report
    (None when there are problems). Raises `OracleUnavailable` when there is no oracle."""
    oracle = oracle_module()
    events = [str(e["name"]) for e in rules["events"]]
    problems = _shape_problems(rules, space, valid, initial, report, events)
    if problems:
        return problems, None
    pairs = rules.get("independent")
    try:
        v = oracle.check_tables(
            valid=valid,
            repair=repair,
            apply=apply,
            pairs=None if pairs is None else [(int(a), int(b)) for a, b in pairs],
            domain=str(rules["domain"]),
            initial=initial,
        )
    except oracle.OracleInputError as exc:
        return [f"the table checker refuses the tables: {exc}"], None
    if not v.certified:
        if not v.wfc:
            why = "repair does not terminate from every state"
        elif v.cc1_witness is not None:
            a, b, state = v.cc1_witness
            why = (
                f"declared-independent events {events[a]!r} and {events[b]!r} do not commute at "
                f"{space.as_dict(state)}"
            )
        else:
            why = "the initial state is not valid or the checked domain is not closed"
        return [f"the table checker does not certify the tables: {why} ({v.theorem})"], None
    if not np.array_equal(np.asarray(v.nf), nf):
        problems.append("the stored normal forms are not the normal forms of the tables")
    claims: list[tuple[str, object, object]] = [
        ("max repair depth", report.max_repair_depth, v.max_depth),
        ("CC2", report.cc2, v.cc2),
        ("checked domain size", report.domain_states, v.domain_size),
        ("checked domain size (stored ids)", len(domain_ids), v.domain_size),
        ("causal-order obligations", _pairs(report, events), list(v.obligations)),
        ("not-idempotent events", sorted(events.index(d.events[0]) for d in report.not_idempotent),
         list(v.not_idempotent)),
    ]
    problems += [
        f"{what}: the file says {said!r}, the table checker finds {found!r}"
        for what, said, found in claims
        if said != found
    ]
    problems += _domain_problems(valid, apply, nf, initial, domain_ids)
    if problems:
        return problems, None
    if not _is_data(rules):
        rules_checked = "not applicable: some rules are Python callables (only the tables were checked)"
    else:
        try:
            r = oracle.check_rules(rules=rules, valid=valid, repair=repair, apply=apply)
        except oracle.OracleInputError as exc:
            return [f"the rules checker cannot read the rules: {exc}"], None
        if not r.matches:
            return [f"the tables are not what the rules mean: {r.detail}"], None
        rules_checked = f"checked: the tables are exactly what the rules mean ({r.theorem})"
    record = certified_record(v, rules_checked)
    problems += _report_problems(
        rules, space, valid, repair, apply, nf, domain_ids, report, events, record, bool(v.cc2)
    )
    return problems, (None if problems else record)


def _report_problems(
    rules: dict[str, Any],
    space: Space,
    valid: npt.NDArray[np.bool_],
    repair: npt.NDArray[np.int32],
    apply: npt.NDArray[np.int32],
    nf: npt.NDArray[np.int32],
    domain_ids: npt.NDArray[np.int32],
    report: Report,
    events: list[str],
    record: dict[str, Any],
    cc2: bool,
) -> list[str]:
    """The report's claims beside what the rules and the re-check give (the tables are certified and
    the repair depth, CC2, domain, obligations and not-idempotent events already compared)."""
    invariants = [str(i["name"]) for i in rules["invariants"]]
    independent = rules.get("independent")
    all_pairs = list(combinations(range(len(events)), 2))
    checked = all_pairs if independent is None else [(int(a), int(b)) for a, b in independent]
    pair_mode = "all" if independent is None else "declared"
    cc2_failing = [] if cc2 else _cc2_failing(apply, nf, events)
    guarantee, theorems = guarantee_text(
        cc2=cc2,
        pair_mode=pair_mode,
        obligations=len(record["delivery"]["obligations"]),
        not_idempotent=len(record["delivery"]["not_idempotent"]),
        domain=str(rules["domain"]),
    )
    theorems = (*theorems, f"oracle: {record['theorem']}")
    trusted = [
        f"invariant {i['name']}"
        for i in rules["invariants"]
        if i.get("holds") is None or i.get("repair") is None
    ]
    trusted += [
        f"event {e['name']}" for e in rules["events"] if e.get("guard") is None or e.get("effect") is None
    ]
    stored_oracle = dict(report.oracle or {})
    stored_oracle.pop("identity", None)
    stored_oracle.pop("module_sha256", None)
    found_oracle = {k: v for k, v in record.items() if k not in ("identity", "module_sha256")}
    claims: list[tuple[str, object, object]] = [
        ("machine name", report.machine, rules["name"]),
        ("checked domain", report.domain, rules["domain"]),
        ("invariants", list(report.invariants), invariants),
        ("method", report.method, "enumeration"),
        ("solver", report.solver, None),
        ("pairs", report.pair_mode, pair_mode),
        ("pairs checked", [list(p) for p in report.pairs_checked],
         [[events[a], events[b]] for a, b in checked]),
        ("undeclared pairs", report.undeclared_pairs, len([p for p in all_pairs if p not in set(checked)])),
        ("events CC2 fails for", list(report.cc2_failing_events), cc2_failing),
        ("guarantee", report.guarantee, guarantee),
        ("theorems", list(report.theorems), list(theorems)),
        ("trusted callables", list(report.trusted_callables), trusted),
        ("oracle verdict", stored_oracle, found_oracle),
    ]
    problems = [
        f"{what}: the file says {said!r}, the re-check gives {found!r}"
        for what, said, found in claims
        if said != found
    ]
    if not problems:
        problems = _footprint_problems(rules, report, events, space.names)
    if cc2 and report.cc2_witness is not None:
        problems.append("CC2 holds, yet the file holds a CC2 witness")
    if problems:
        return problems
    concrete = Concrete.of(snapshot_from_rules(rules)) if _is_data(rules) else None
    replay = _Replay(space, invariants, valid, repair, apply, nf, concrete)
    in_domain = np.zeros(valid.size, dtype=np.bool_)
    in_domain[np.asarray(domain_ids)] = True
    witnesses: list[tuple[str, Divergence | None, str, tuple[str, ...]]] = [
        (f"the obligation {d.events}", d, "obligation", tuple(d.events)) for d in report.obligations
    ]
    witnesses += [(f"not-idempotent event {d.events}", d, "idempotence", tuple(d.events))
                  for d in report.not_idempotent]
    if not cc2:
        first = (cc2_failing[0],) if cc2_failing else ()
        witnesses.append(("the CC2 witness", report.cc2_witness, "CC2", first))
    for what, d, condition, names in witnesses:
        problem = replay.problem(d, condition, names, str(rules["name"]), in_domain, events)
        if problem is not None:
            problems.append(f"{what}: the witness {problem}")
    return problems


def _cc2_failing(apply: npt.NDArray[np.int32], nf: npt.NDArray[np.int32], events: list[str]) -> list[str]:
    """The events for which NF(apply(e, s)) differs from NF(apply(e, NF(s))) at some state."""
    nf_index = nf.astype(np.intp)
    failing = []
    for e, name in enumerate(events):
        raw_nf = np.take(nf, apply[e])
        if not np.array_equal(raw_nf, np.take(raw_nf, nf_index)):
            failing.append(name)
    return failing


def _footprint_problems(
    rules: dict[str, Any], report: Report, events: list[str], names: list[str]
) -> list[str]:
    """Footprints name variables in declaration order, one per event, and are what the rules give when
    every rule is an expression (a callable's footprint was traced by the build, and is trusted as its
    purity is); a pair is pruned exactly when it is checked and the two footprints are disjoint, for the
    reason the build gives."""
    fps = report.footprints
    if sorted(fps) != sorted(events) or not all(
        type(fp) is tuple
        and all(type(x) is str and x in names for x in fp)
        and [names.index(x) for x in fp] == sorted({names.index(x) for x in fp})
        for fp in fps.values()
    ):
        return ["the footprints do not name variables of the machine, one per event"]
    from_rules = rule_footprints(rules)
    if from_rules is not None:
        closures = closed_footprints(*from_rules)
        found = {event: tuple(names[i] for i in sorted(c)) for event, c in zip(events, closures, strict=True)}
        if fps != found:
            return [f"footprints: the file says {fps!r}, the rules give {found!r}"]
    expected = []
    for a, b in report.pairs_checked:
        if set(fps[a]) & set(fps[b]):
            continue
        fa, fb = ", ".join(fps[a]) or "nothing", ", ".join(fps[b]) or "nothing"
        expected.append(
            (a, b, f"disjoint footprints closed under invariants: {a} touches {{{fa}}}, {b} touches {{{fb}}}")
        )
    if [(p.a, p.b, p.reason) for p in report.pairs_pruned] != expected:
        return ["the pruned pairs are not the checked pairs whose footprints are disjoint"]
    return []


class _Replay:
    """Replays a stored witness through the certified tables: its start, every effect, every repair
    (and, when the rules are expressions, which invariant it repairs) and every result."""

    def __init__(
        self,
        space: Space,
        invariants: list[str],
        valid: npt.NDArray[np.bool_],
        repair: npt.NDArray[np.int32],
        apply: npt.NDArray[np.int32],
        nf: npt.NDArray[np.int32],
        concrete: Concrete | None,
    ) -> None:
        self.space, self.invariants, self.concrete = space, invariants, concrete
        self.valid, self.repair, self.apply, self.nf = valid, repair, apply, nf

    def sid(self, state: object) -> int:
        space = self.space
        if not isinstance(state, dict) or sorted(state) != sorted(space.names):
            raise ValueError("names another set of variables")
        sid = space.id_from_mapping(state, 0)
        if space.as_dict(sid) != state:
            raise ValueError(f"holds a state that is not one of the machine: {state}")
        return sid

    def _chain(self, start: int) -> tuple[list[tuple[str, dict[str, Value]]], int]:
        out: list[tuple[str, dict[str, Value]]] = []
        s = start
        while not self.valid[s]:
            after = int(self.repair[s])
            if self.concrete is not None:
                name = self.invariants[self.concrete.first_violated(self.space.values(s))]
            else:
                name = "?"
            out.append((name, self.space.as_dict(after)))
            s = after
        return out, s

    def step(self, stored: Step, event: int | None, start: int, events: list[str]) -> int:
        """Check one stored step from `start` (event None: "normalize first"); return its end."""
        raw = start if event is None else int(self.apply[event, start])
        repairs, end = self._chain(raw)
        name = "(normalize)" if event is None else events[event]
        want = Step(name, event is not None and raw != start, self.space.as_dict(raw), tuple(repairs),
                    self.space.as_dict(end))
        got_repairs = [(n if self.concrete is not None else "?", s) for n, s in stored.repairs]
        if (
            stored.event != want.event
            or stored.changed != want.changed
            or stored.after_effect != want.after_effect
            or got_repairs != list(want.repairs)
            or not all(n in self.invariants for n, _ in stored.repairs)
            or stored.result != want.result
        ):
            raise ValueError(f"step {name!r} is not what the tables do from {self.space.as_dict(start)}")
        return end

    def problem(
        self,
        d: Divergence | None,
        condition: str,
        names: tuple[str, ...],
        machine: str,
        in_domain: npt.NDArray[np.bool_],
        events: list[str],
    ) -> str | None:
        if d is None:
            return "is missing"
        if d.machine != machine or d.condition != condition or tuple(d.events) != names:
            return f"is of another machine, condition or event: {d.machine!r}, {d.condition!r}, {d.events}"
        try:
            s = self.sid(d.start)
            index = [events.index(x) for x in names]
            if condition == "CC2":
                plan: tuple[list[int | None], list[int | None]] = ([index[0]], [None, index[0]])
            elif condition == "idempotence":
                plan = ([index[0], index[0]], [index[0]])
            else:
                plan = ([index[0], index[1]], [index[1], index[0]])
                if not in_domain[s]:
                    return "starts outside the checked domain"
            if condition == "idempotence" and not in_domain[s]:
                return "starts outside the checked domain"
            ends = []
            for order, stored in zip(plan, (d.first, d.second), strict=True):
                if len(order) != len(stored):
                    return "has another number of steps than its condition"
                cur = s
                for e, st in zip(order, stored, strict=True):
                    cur = self.step(st, e, cur, events)
                ends.append(cur)
        except (ValueError, TypeError, KeyError, DeclarationError) as exc:
            return str(exc)
        if ends[0] == ends[1]:
            return "does not diverge: both orders reach the same state"
        return None


def _shape_problems(
    rules: dict[str, Any], space: Space, valid: npt.NDArray[np.bool_], initial: int, report: Report,
    events: list[str],
) -> list[str]:
    problems = []
    if tuple(events) != report.events:
        problems.append(f"the report's events {list(report.events)} are not the rules' events {events}")
    if report.states != space.n or report.valid_states != int(np.count_nonzero(valid)):
        problems.append("the report's state counts do not match the tables")
    if rules.get("initial") is not None:
        values = rules["initial"]
        if (
            not isinstance(values, list)
            or len(values) != len(space.vars)
            or not all(type(x) is int and v.lo <= x <= v.hi for x, v in zip(values, space.vars, strict=True))
            or space.id_of(values) != initial
        ):
            problems.append("the stored initial state is not the rules' initial state")
    if report.initial != space.as_dict(initial):
        problems.append("the report's initial state is not the stored initial state")
    if report.wfc is not True or report.cc1 is not True:
        problems.append("the report does not describe a certified machine")
    counts = (report.states, report.valid_states, report.domain_states, report.undeclared_pairs,
              report.max_repair_depth)  # fmt: skip
    if type(report.cc2) is not bool or not all(type(n) is int for n in counts):
        problems.append("the report's CC2 is not true or false, or one of its counts is not an integer")
    return problems


def _pairs(report: Report, events: list[str]) -> list[tuple[int, int]]:
    out = []
    for d in report.obligations:
        a, b = events.index(d.events[0]), events.index(d.events[1])
        out.append((min(a, b), max(a, b)))
    return sorted(out)


def _domain_problems(
    valid: npt.NDArray[np.bool_],
    apply: npt.NDArray[np.int32],
    nf: npt.NDArray[np.int32],
    initial: int,
    domain_ids: npt.NDArray[np.int32],
) -> list[str]:
    """The stored domain must hold the initial state, valid states only, and be closed under every
    normalized step; with the oracle's size, it is then the oracle's domain (which is the smallest
    such set for "reachable", and every valid state for "valid")."""
    ids = np.asarray(domain_ids)
    if ids.size and not (np.all(ids[1:] > ids[:-1]) and ids[0] >= 0 and ids[-1] < valid.size):
        return ["the stored checked domain is not a sorted list of state ids"]
    member = np.zeros(valid.size, dtype=np.bool_)
    member[ids] = True
    if not member[initial] or not valid[ids].all():
        return ["the stored checked domain lacks the initial state or holds an invalid state"]
    if ids.size and not member[nf[apply[:, ids]]].all():
        return ["the stored checked domain is not closed under the machine's steps"]
    return []


def _is_data(rules: dict[str, Any]) -> bool:
    invariants = all(r.get("holds") is not None and r.get("repair") is not None for r in rules["invariants"])
    events = all(e.get("guard") is not None and e.get("effect") is not None for e in rules["events"])
    return invariants and events


def check_stored_timings(report: Report) -> None:
    """Raise ValueError unless the timings of a report read from a file are what a build writes: phase
    names (text) mapped to a finite, non-negative number of seconds. They are the one part of a loaded
    report no re-check derives, and printing the report formats them as numbers."""
    timings = report.timings
    if not isinstance(timings, dict):
        raise ValueError(f"the report's timings are not a mapping of phases to seconds: {timings!r}")
    for phase, seconds in timings.items():
        if not isinstance(phase, str) or not _is_text(phase):
            raise ValueError(f"the report's timings name a phase that is not text: {phase!r}")
        if type(seconds) not in (int, float) or not _finite(seconds) or seconds < 0:
            raise ValueError(
                f"the report's timing of {phase!r} is {seconds!r}, not a finite non-negative number of "
                "seconds"
            )


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer too large for a float: no build took that long
        return False


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
