"""Machines verified on their rules rather than their tables: the symbolic build and its runtime.

A machine whose integer domains are too large to enumerate is verified by the symbolic route
(`verify._symbolic`, CP-SAT) and runs without tables: each step evaluates the rules' AST on the
one state at hand (`verify._concrete`, the engine's reference evaluator), normalizing with at most
the repair depth WFC was shown to need. State ids keep the numbering of docs/semantics.md (Python
integers, so they may exceed 32 bits); the table views answer one `[event, state]` lookup at a time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import (
    DeclarationError,
    ForeignState,
    MachineFileError,
    NotConvergent,
    StateSpaceTooLarge,
    UnknownEvent,
)
from ..model._declarations import Domain, Snapshot
from ..model._expr import canonical_json
from ..model._space import Space
from ..verify._concrete import Concrete
from ..verify._report import Report
from ..verify._smallmodel import Enumerate, refute_small
from ..verify._symbolic import DEFAULT_MAX_DEPTH, symbolic_problem, verify_symbolic
from ..verify._timing import PhaseTimer
from ._load_check import check_stored_timings
from ._machine import Machine, State, register_loader, rules_digest, symbolic_digest, write_machine_file
from ._rules_snapshot import snapshot_from_rules
from ._verified_report import verified_report

__all__ = [
    "SYMBOLIC_FORMAT",
    "SYMBOLIC_MIN_INT_VALUES",
    "SymbolicMachine",
    "build_symbolic",
    "load_symbolic",
    "symbolic_candidate",
]

#: The format tag of a saved symbolic machine (rules and report, no tables).
SYMBOLIC_FORMAT = "govern.machine.symbolic.v1"

#: The automatic route is taken only when some integer variable has more values than this.
SYMBOLIC_MIN_INT_VALUES = 1 << 16
#: State ids must fit in int64 (replicas keep them in numpy arrays).
_MAX_ID = 2**63 - 1


def symbolic_candidate(snap: Snapshot) -> bool:
    """True when a build too large for tables should try the symbolic route: some integer variable
    has more than `SYMBOLIC_MIN_INT_VALUES` values (the route's purpose: large integer domains)."""
    return any(v.kind == "int" and v.size > SYMBOLIC_MIN_INT_VALUES for v in snap.vars)


def build_symbolic(
    snap: Snapshot,
    domain: Domain,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    enumerate_build: Enumerate | None = None,
) -> SymbolicMachine:
    """Verify `snap` on its AST with CP-SAT and return a table-free machine (or raise like a build).

    With `enumerate_build` (the engine's build, given by `_build`) a machine in the small model's
    fragment is first refuted, when it can be, by its representative machine: the witness is replayed
    on `snap`, so it is exact. Only on the "valid" domain: a failure at some valid state says nothing
    of the reachable ones."""
    timer = PhaseTimer()
    space = Space(snap.vars)
    if space.n - 1 > _MAX_ID:
        raise StateSpaceTooLarge(
            f"{space.n:,} states: state ids would not fit in 64 bits; shrink variable ranges or split "
            "the machine",
            states=space.n,
            bytes_needed=0,
        )
    if domain == "valid" and enumerate_build is not None and symbolic_problem(snap, domain) is None:
        with timer.phase("small model"):
            refute_small(snap, enumerate_build)
    verdict = verify_symbolic(snap, domain, timer, max_depth=max_depth, states=space.n)
    rules = snap.rules_json(domain)
    if rules["initial"] is None:
        rules["initial"] = list(verdict.initial)
    solver = dict(verdict.solver, queries=verdict.queries)
    rests = (
        f"every verdict rests on {solver['name']} {solver['version']} ({solver['package']}): "
        f"{verdict.queries} queries, unsatisfiable ones taken as verdicts, satisfiable ones replayed "
        "through the concrete semantics; the Rocq theorems apply to the conditions it established, "
        "but no proof-derived oracle re-checked them"
    )
    concrete = Concrete.of(snap)
    report = verified_report(
        snap,
        domain,
        space,
        verdict,
        valid_states=-1,
        domain_states=-1,
        initial=concrete.as_dict(verdict.initial),
        oracle=None,
        timings=dict(timer.seconds),
        method="symbolic",
        solver=solver,
        rests_on=rests,
    )
    return SymbolicMachine(rules, space, concrete, space.id_of(verdict.initial), report)


class _View:
    """A read-only "table" computed one entry at a time: `view[e, s]`, `view[e][s]` or `view[s]`."""

    def __init__(self, f: Any, two: bool, shape: tuple[int, ...]) -> None:
        self._f = f
        self._two = two
        self.shape = shape
        self.size = 1
        for k in shape:
            self.size *= k

    def __getitem__(self, key: Any) -> Any:
        if self._two:
            if isinstance(key, tuple):
                e, s = key
                return int(self._f(int(e), int(s)))
            return _View(lambda s, e=int(key): self._f(e, s), False, self.shape[1:])
        return int(self._f(int(key)))

    def tolist(self) -> list[Any]:
        """Every entry (only sensible for small machines)."""
        if self._two:
            return [[self[e, s] for s in range(self.shape[1])] for e in range(self.shape[0])]
        return [self[s] for s in range(self.shape[0])]


class _SymbolicTables:
    """The `MachineTables` interface of a symbolic machine: entries are computed on demand."""

    def __init__(self, m: SymbolicMachine) -> None:
        n, e = m.n_states, len(m.events)
        self.valid = _View(lambda s: m.is_valid(s), False, (n,))
        self.repair = _View(m._repair_id, False, (n,))
        self.apply = _View(m._apply_id, True, (e, n))
        self.nf = _View(lambda s: m.normalize(s).id, False, (n,))
        self.step = _View(m._step_id, True, (e, n))


class SymbolicMachine(Machine):
    """A machine verified symbolically (see the module docstring). Same interface as `Machine`; it
    has no tables: it saves as its rules and report, and its certificate is a symbolic one."""

    def __init__(
        self, rules: dict[str, Any], space: Space, concrete: Concrete, initial: int, report: Report
    ) -> None:
        self._rules = rules
        self._space = space
        self._concrete = concrete
        self._depth = report.max_repair_depth
        self._events = tuple(e["name"] for e in rules["events"])
        self._event_index = {name: i for i, name in enumerate(self._events)}
        self._report = report
        self._rules_digest = rules_digest(rules)
        self._digest = None
        self._initial = State(self, initial)

    # -- per-state semantics ---------------------------------------------------------------------
    def _values(self, sid: int) -> tuple[int, ...]:
        return self._space.values(sid)

    def _repair_id(self, sid: int) -> int:
        return self._space.id_of(self._concrete.repair(self._values(sid)))

    def _apply_id(self, e: int, sid: int) -> int:
        return self._space.id_of(self._concrete.apply(e, self._values(sid)))

    def _step_id(self, e: int, sid: int) -> int:
        c, d = self._concrete, self._depth
        return self._space.id_of(c.step(e, c.nf(self._values(sid), d), d))

    def _step_table(self) -> npt.NDArray[np.int32]:
        raise MachineFileError(
            f"machine {self.name!r} was verified symbolically and has no tables; use apply/replay"
        )

    # -- identity --------------------------------------------------------------------------------
    @property
    def tables_digest(self) -> str:
        """A symbolic machine has no tables: its rules (all expressions) determine it."""
        return self._rules_digest

    @property
    def digest(self) -> str:
        """SHA-256 over the rules digest, domain "govern.machine.symbolic.v1"."""
        if self._digest is None:
            self._digest = symbolic_digest(self._rules_digest)
        return self._digest

    def tables(self) -> Any:
        """Table views computed entry by entry (`tables().step[e, s]`), for replicas and tools."""
        return _SymbolicTables(self)

    # -- states and transitions ------------------------------------------------------------------
    def normalize(self, state: State | int) -> State:
        return State(self, self._space.id_of(self._concrete.nf(self._values(self._sid(state)), self._depth)))

    def is_valid(self, state: State | int) -> bool:
        return self._concrete.valid(self._values(self._sid(state)))

    def in_domain(self, state: State | int) -> bool:
        """True when `state` is valid. On the "reachable" domain this is a superset of the checked
        domain: whether one state is reachable is not decided state by state here (the build decided
        the verdicts on every reachable state, not a membership test)."""
        return self.is_valid(state)

    def apply(self, state: State | int, event: str, /, **params: object) -> State:
        """`step(event, NF(state))`, evaluated on the rules; with `params`, an instance of a family."""
        if params:
            event = self.event(event, **params)
        return State(self, self._step_id(self.event_index(event), self._sid(state)))

    def replay(self, events: Iterable[str], start: State | int | None = None) -> State:
        c, d = self._concrete, self._depth
        sid = self._initial._id if start is None else self._sid(start)
        x = self._values(sid)
        for e in events:
            x = c.step(self.event_index(e), c.nf(x, d), d)
        return State(self, self._space.id_of(x))

    def replay_many(self, streams: Sequence[Sequence[str]], start: State | int | None = None) -> list[State]:
        return [self.replay(s, start) for s in streams]

    def replay_ids(
        self, codes: npt.NDArray[np.integer[Any]], starts: npt.NDArray[np.integer[Any]] | Sequence[int]
    ) -> Any:
        c, d = self._concrete, self._depth
        n = self._space.n
        codes = np.asarray(codes)
        out = []
        for i, start in enumerate(np.asarray(starts).tolist()):
            if not 0 <= start < n:
                raise ForeignState(f"start ids must lie in 0..{n - 1}")
            x = self._values(start)
            for code in codes[i].tolist() if codes.ndim == 2 else []:
                if code < 0:
                    continue
                if code >= len(self._events):
                    raise UnknownEvent(f"event index {code} out of range (machine has {len(self._events)})")
                x = c.step(code, c.nf(x, d), d)
            out.append(self._space.id_of(x))
        return np.array(out, dtype=np.int64)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the machine to `path` atomically: its rules and report (it has no tables; its rules
        determine it). `Machine.load` decides the rules again before it hands the machine out."""
        write_machine_file(
            path,
            SYMBOLIC_FORMAT,
            {
                "rules": np.frombuffer(canonical_json(self._rules), dtype=np.uint8),
                "report": np.frombuffer(canonical_json(self._report.to_dict()), dtype=np.uint8),
            },
        )


def _claims(report: Report) -> dict[str, Any]:
    """What a report says about the machine (not when, how fast, or with which solver build)."""
    return {
        "checked domain": report.domain,
        "states": report.states,
        "initial state": report.initial,
        "events": list(report.events),
        "invariants": list(report.invariants),
        "pairs": report.pair_mode,
        "pairs checked": [list(p) for p in report.pairs_checked],
        "max repair depth": report.max_repair_depth,
        "CC2": report.cc2,
        "causal-order obligations": [list(d.events) for d in report.obligations],
        "not-idempotent events": [list(d.events) for d in report.not_idempotent],
        "method": report.method,
    }


def load_symbolic(
    path: str | os.PathLike[str], arrays: dict[str, npt.NDArray[Any]], digest: str | None
) -> Machine:
    """The machine saved by `SymbolicMachine.save` (its content hash already checked, which only
    catches accidents). Nothing the file says is trusted: its rules are read back strictly and decided
    again by the symbolic route (CP-SAT, counterexamples replayed), and every claim of the stored
    report must be what that finds. The machine handed out is the one just decided."""
    where = os.fspath(path)
    try:
        rules = json.loads(bytes(arrays["rules"]).decode())
        stored = Report.from_dict(json.loads(bytes(arrays["report"]).decode()))
        check_stored_timings(stored)
        snap = snapshot_from_rules(rules)
        domain = rules["domain"]
        if domain not in ("valid", "reachable"):
            raise ValueError(f"unknown checked domain {domain!r}")
        if snap.rules_json(domain) != rules:
            raise ValueError("the rules are not in the canonical form a build writes")
    except (KeyError, ValueError, IndexError, TypeError, AttributeError, RecursionError,
            DeclarationError) as exc:
        raise MachineFileError(f"machine file {where!r} is inconsistent: {exc}") from exc
    try:
        machine = build_symbolic(snap, domain)
    except (NotConvergent, StateSpaceTooLarge, DeclarationError) as exc:
        raise MachineFileError(
            f"machine file {where!r} fails the re-check: deciding its rules again gives no machine, so it "
            f"was altered (or damaged) after it was saved:\n{exc}"
        ) from exc
    said, found = _claims(stored), _claims(machine.report)
    problems = [f"{k}: the file says {said[k]!r}, deciding the rules gives {found[k]!r}" for k in said
                if said[k] != found[k]]
    if problems:
        raise MachineFileError(
            f"machine file {where!r} fails the re-check: its report is not what deciding its rules again "
            "finds, so it was altered (or damaged) after it was saved; rebuild the machine from its "
            "registry:\n  - " + "\n  - ".join(problems)
        )
    if digest is not None and machine.digest != digest:
        raise MachineFileError(
            f"machine file {where!r} holds machine {machine.digest}, not the expected {digest}"
        )
    return machine


register_loader(SYMBOLIC_FORMAT, load_symbolic)
