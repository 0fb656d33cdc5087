"""A machine built by components: its state is the product of its components' states.

When a machine's variables split into components with disjoint closed footprints (verify._compose),
each component is an ordinary enumerated `Machine` and the whole machine is their product: a state id
is still the dense mixed-radix id of docs/semantics.md (a Python int, which may exceed 64 bits), an
event looks up its own component's step table and leaves the others alone, and the normal form of a
state is the tuple of its components' normal forms. Nothing of the size of the whole space is ever
allocated. `Govern.Compose` is why the components' verdicts are the whole machine's.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import combinations
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .._errors import (
    DeclarationError,
    ForeignState,
    MachineFileError,
    OracleDisagreement,
    OracleUnavailable,
    UnknownEvent,
)
from ..model._declarations import Domain, Snapshot
from ..model._expr import canonical_json
from ..model._space import Space
from ..oracle._gate import oracle_module
from ..verify._compose import (
    Component,
    Decomposition,
    decompose,
    eval_json,
    product,
    project_rules,
    project_snapshot,
)
from ..verify._report import PrunedPair, Report, guarantee_text
from ._load_check import check_stored_timings
from ._machine import (
    FILE_FORMAT,
    IntArray,
    Machine,
    MachineTables,
    RawTables,
    State,
    _spec,
    _tables_digest,
    machine_file_bytes,
    register_loader,
    rules_digest,
    write_machine_file,
)
from ._rules_snapshot import snapshot_from_rules

__all__ = ["COMPOSED_FORMAT", "ComposedMachine", "ProductTables", "build_composed", "composed_digest"]

COMPOSED_FORMAT = "govern.machine.composed.v1"
_COMPOSED_DOMAIN = b"govern.composed.v1\x00"
_MACHINE_DOMAIN = b"govern.machine.v1\x00"


class _ProductView:
    """One table of a composed machine, computed entry by entry from the components' tables.

    Index it as the table it stands for: `view[e, s]` (apply, step) or `view[s]` (valid, repair, nf),
    with Python ints; the whole table is never materialized (it has one entry per state)."""

    __slots__ = ("_kind", "_machine")

    def __init__(self, machine: ComposedMachine, kind: str) -> None:
        self._machine = machine
        self._kind = kind

    def __getitem__(self, key: Any) -> Any:
        m = self._machine
        if self._kind in ("apply", "step"):
            e, s = key
            return m._event_entry(self._kind, int(e), int(s))
        return m._state_entry(self._kind, int(key))

    def __len__(self) -> int:
        return self._machine.n_states if self._kind not in ("apply", "step") else len(self._machine.events)

    def __repr__(self) -> str:
        return f"<{self._kind} table of composed machine {self._machine.name!r}, computed per component>"


class ProductTables(MachineTables):
    """The tables of a composed machine: per-entry views (`[e, s]`, `[s]`), computed per component.
    Each component's real tables are `machine.components[i].tables()`."""

    __slots__ = ()

    def __init__(self, machine: ComposedMachine) -> None:
        self._machine = machine
        self.valid = cast(Any, _ProductView(machine, "valid"))
        self.repair = cast(Any, _ProductView(machine, "repair"))
        self.apply = cast(Any, _ProductView(machine, "apply"))
        self.nf = cast(Any, _ProductView(machine, "nf"))

    @property
    def step(self) -> IntArray:
        return cast(IntArray, _ProductView(cast(ComposedMachine, self._machine), "step"))


class ComposedMachine(Machine):
    """A verified machine built by components (see the module docstring); the `Machine` API holds.

    `components` are the component machines (ordinary enumerated machines, each verified and checked
    by the oracle); `decomposition` says which variables, invariants and events each one holds."""

    def __init__(
        self,
        rules: dict[str, Any],
        space: Space,
        parts: Sequence[Machine],
        decomposition: Decomposition,
        initial: int,
        report: Report,
    ) -> None:
        self._rules = rules
        self._space = space
        self._parts = tuple(parts)
        self._decomposition = decomposition
        self._report = report
        self._events = tuple(e["name"] for e in rules["events"])
        self._event_index = {name: i for i, name in enumerate(self._events)}
        self._rules_digest = rules_digest(rules)
        self._digest: str | None = None
        # event -> (component, its position there); per component: (global stride, size, local stride).
        self._where: list[tuple[int, int]] = [(0, 0)] * len(self._events)
        self._layout: list[list[tuple[int, int, int]]] = []
        for c, comp in enumerate(decomposition.components):
            for k, e in enumerate(comp.events):
                self._where[e] = (c, k)
            local = 1
            lay = []
            for v in comp.variables:
                size = space.vars[v].size
                lay.append((space.strides[v], size, local))
                local *= size
            self._layout.append(lay)
        self._steps = [p._step_table() for p in self._parts]
        self._initial = State(self, initial)

    # -- the product encoding ---------------------------------------------------------------------
    def _locals(self, sid: int) -> list[int]:
        out = []
        for lay in self._layout:
            x = 0
            for stride, size, lstride in lay:
                x += (sid // stride) % size * lstride
            out.append(x)
        return out

    def _global(self, parts: Sequence[int]) -> int:
        sid = 0
        for lay, x in zip(self._layout, parts, strict=True):
            for stride, size, lstride in lay:
                sid += (x // lstride) % size * stride
        return sid

    def _normal_locals(self, sid: int) -> list[int]:
        return [int(p._raw.nf[x]) for p, x in zip(self._parts, self._locals(sid), strict=True)]

    def _state_entry(self, kind: str, sid: int) -> Any:
        sid = self._sid(sid)
        xs = self._locals(sid)
        if kind == "valid":
            return all(bool(p._raw.valid[x]) for p, x in zip(self._parts, xs, strict=True))
        if kind == "nf":
            return self._global([int(p._raw.nf[x]) for p, x in zip(self._parts, xs, strict=True)])
        # one repair step of the whole machine: the first violated invariant's repair
        first: tuple[int, int] | None = None
        for c, (p, x) in enumerate(zip(self._parts, xs, strict=True)):
            if not p._raw.valid[x]:
                inv = self._first_violated(c, x)
                if first is None or inv < first[0]:
                    first = (inv, c)
        if first is None:
            return sid
        c = first[1]
        xs[c] = int(self._parts[c]._raw.repair[xs[c]])
        return self._global(xs)

    def _first_violated(self, c: int, x: int) -> int:
        """The whole machine's position of the first invariant of component c violated at local x."""
        part = self._parts[c]
        values = part._space.values(x)
        comp = self._decomposition.components[c]
        for k, inv in enumerate(part._rules["invariants"]):
            if not eval_json(inv["holds"], values):
                return comp.invariants[k]
        raise AssertionError("internal error: an invalid component state violates no invariant")

    def _event_entry(self, kind: str, e: int, sid: int) -> int:
        if not 0 <= e < len(self._events):
            raise UnknownEvent(f"event index {e} out of range (machine has {len(self._events)})")
        sid = self._sid(sid)
        c, k = self._where[e]
        if kind == "apply":
            xs = self._locals(sid)
            xs[c] = int(self._parts[c]._raw.apply[k, xs[c]])
            return self._global(xs)
        xs = self._normal_locals(sid)
        xs[c] = int(self._steps[c][k, xs[c]])
        return self._global(xs)

    # -- identity ----------------------------------------------------------------------------------
    @property
    def components(self) -> tuple[Machine, ...]:
        """The component machines, in the order of their lowest variable."""
        return self._parts

    @property
    def decomposition(self) -> Decomposition:
        """Which variables, invariants and events each component holds (whole-machine positions)."""
        return self._decomposition

    @property
    def tables_digest(self) -> str:
        """SHA-256 (hex) over the components' tables digests, domain "govern.composed.v1"."""
        return _composed_tables_digest([p.tables_digest for p in self._parts])

    @property
    def digest(self) -> str:
        """SHA-256 over the rules digest and the components' tables digests (domain "govern.machine.v1")."""
        if self._digest is None:
            self._digest = composed_digest(self._rules_digest, [p._raw for p in self._parts])
        return self._digest

    def tables(self) -> MachineTables:
        """Per-entry views of the whole machine's tables (see `ProductTables`)."""
        return ProductTables(self)

    def _step_table(self) -> IntArray:
        return ProductTables(self).step

    # -- states and transitions --------------------------------------------------------------------
    def normalize(self, state: State | int) -> State:
        return State(self, self._global(self._normal_locals(self._sid(state))))

    def is_valid(self, state: State | int) -> bool:
        return bool(self._state_entry("valid", self._sid(state)))

    def in_domain(self, state: State | int) -> bool:
        xs = self._locals(self._sid(state))
        return all(p.in_domain(x) for p, x in zip(self._parts, xs, strict=True))

    def apply(self, state: State | int, event: str, /, **params: object) -> State:
        if params:
            event = self.event(event, **params)
        return State(self, self._event_entry("step", self.event_index(event), self._sid(state)))

    def _run(self, codes: Iterable[int], start: int) -> int:
        codes = list(codes)
        if not codes:
            return start  # as Machine.replay: no event, no normalization
        xs = self._normal_locals(start)
        where, steps = self._where, self._steps
        for e in codes:
            c, k = where[e]
            xs[c] = int(steps[c][k, xs[c]])
        return self._global(xs)

    def replay(self, events: Iterable[str], start: State | int | None = None) -> State:
        s = self._initial._id if start is None else self._sid(start)
        return State(self, self._run((self.event_index(e) for e in events), s))

    def replay_many(self, streams: Sequence[Sequence[str]], start: State | int | None = None) -> list[State]:
        s = self._initial._id if start is None else self._sid(start)
        return [State(self, self._run([self.event_index(e) for e in stream], s)) for stream in streams]

    def replay_ids(
        self, codes: npt.NDArray[np.integer[Any]], starts: npt.NDArray[np.integer[Any]] | Sequence[int]
    ) -> Any:
        """As `Machine.replay_ids`; ids are Python ints (an object array when they exceed int64)."""
        codes = np.asarray(codes)
        if codes.size and codes.max() >= len(self._events):
            raise UnknownEvent(
                f"event index {int(codes.max())} out of range (machine has {len(self._events)})"
            )
        out = []
        for i, first in enumerate(list(starts)):
            if not 0 <= int(first) < self._space.n:
                raise ForeignState(f"start ids must lie in 0..{self._space.n - 1}")
            row = [int(e) for e in codes[i]] if codes.ndim == 2 else []
            out.append(self._run((e for e in row if e >= 0), int(first)))
        dtype = np.int64 if self._space.n <= 2**63 - 1 else object
        return np.array(out, dtype=dtype)

    # -- persistence -------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the machine to `path` atomically: its rules, report and decomposition, and each component
        machine as `Machine.save` writes it; `Machine.load` reads it back and re-checks every component
        and the decomposition (by the extracted checker)."""
        arrays: dict[str, npt.NDArray[Any]] = {
            "rules": np.frombuffer(canonical_json(self._rules), dtype=np.uint8),
            "report": np.frombuffer(canonical_json(self._report.to_dict()), dtype=np.uint8),
            "decomposition": np.frombuffer(canonical_json(self._decomposition.to_json()), dtype=np.uint8),
        }
        for c, part in enumerate(self._parts):
            part_file = machine_file_bytes(FILE_FORMAT, part._arrays())  # what part.save writes
            arrays[f"part{c:06d}"] = np.frombuffer(part_file, dtype=np.uint8)
        write_machine_file(path, COMPOSED_FORMAT, arrays)

    def __repr__(self) -> str:
        return (
            f"<Machine {self.name!r}: {self._space.n:,} states, {len(self._events)} events, "
            f"{len(self._parts)} components>"
        )


def _composed_tables_digest(part_digests: Sequence[str]) -> str:
    h = hashlib.sha256(_COMPOSED_DOMAIN)
    for d in part_digests:
        h.update(bytes.fromhex(d))
    return h.hexdigest()


def composed_digest(rules_digest_hex: str, parts: Sequence[RawTables]) -> str:
    """A composed machine's identity from its rules digest and its components' raw tables: what
    `Machine.digest` is for it, computable from a composed certificate alone."""
    tables = _composed_tables_digest([_tables_digest(raw) for raw in parts])
    head = _MACHINE_DOMAIN + bytes.fromhex(rules_digest_hex)
    return hashlib.sha256(head + bytes.fromhex(tables)).hexdigest()


# ---- building by components ---------------------------------------------------------------------

#: What a composed verdict rests on, besides each component's own theorems.
COMPOSE_THEOREMS = (
    "Govern.Compose.check_decomposition_sound (the extracted check: every rule reads and writes only its "
    "own component, so components are disjoint and closed)",
    "Govern.Compose.compose_unique_normal_forms, compose_stream_convergence (the product of converging "
    "components converges; WFC, CC1, CC2 lift)",
    "Govern.Compose.compose_cc1, compose_cross_valid, compose_cross (events of different components "
    "commute at every valid state, and with CC2 at every state: no table)",
    "Govern.Compose.compose_commute_iff, compose_idem_iff (obligations and idempotence are the "
    "components' own), compose_run and compose_swap (runs and trace equivalence lift)",
)

#: What a composed verdict on the "valid" domain with CC2 also rests on: the end-to-end theorem from
#: the extracted checks each component passed to the whole rules machine being governed.
COMPOSE_TRANSPORT_THEOREM = (
    "Govern.ComposeTransport.check_components_governed_in_range (a split accepted by "
    "check_decomposition whose components pass check_rules and check_tables, renumbered from 0, makes "
    "the whole rules machine governed on every in-range valuation), check_components_converge"
)


def _merge_eventless(decomp: Decomposition) -> Decomposition:
    """Fold every component without events into the first one with events (a union of closed
    footprints is closed): a component needs an event to be a machine of its own."""
    comps = list(decomp.components)
    if all(c.events for c in comps) or not any(c.events for c in comps):
        return decomp
    target = next(i for i, c in enumerate(comps) if c.events)
    merged = comps[target]
    rest = []
    for i, c in enumerate(comps):
        if i == target:
            continue
        if c.events:
            rest.append(c)
        else:
            merged = Component(
                tuple(sorted(merged.variables + c.variables)),
                tuple(sorted(merged.invariants + c.invariants)),
                merged.events,
            )
    out = sorted([merged, *rest], key=lambda c: c.variables[0])
    return Decomposition(tuple(out))


class _MalformedRules(OracleUnavailable):
    """The oracle's front end refused the rules as malformed: in a loaded file, the file was altered."""


def check_decomposition(rules: dict[str, Any], decomp: Decomposition) -> str:
    """Have the extracted `Compose.check_decomposition` confirm the decomposition; returns the theorem."""
    oracle = oracle_module()
    try:
        ok = oracle.check_decomposition(
            rules=rules,
            variables=decomp.labels(len(rules["variables"])),
            invariants=decomp.invariant_labels(len(rules["invariants"])),
            events=decomp.event_labels(len(rules["events"])),
        )
    except oracle.OracleInputError as exc:
        raise _MalformedRules(f"the oracle cannot read the rules of the decomposition: {exc}") from exc
    except oracle.OracleError as exc:
        raise OracleUnavailable(f"the oracle gave no verdict on the decomposition: {exc}") from exc
    if not ok:
        raise OracleDisagreement(
            f"ENGINE AND PROOF-DERIVED ORACLE DISAGREE on machine {rules['name']!r}: the engine split it "
            "into components the extracted decomposition checker does not accept (a rule reads or writes "
            "outside its component). No machine is built; please report this bug with the registry."
        )
    return str(oracle.THEOREM_DECOMPOSITION)


def build_composed(
    snap: Snapshot, domain: Domain, build_part: Callable[[Snapshot], Machine]
) -> Machine | None:
    """Build `snap` by components, each with `build_part` (the ordinary, enumerated build), or return
    None when it does not split (one component, or a rule is a Python callable: its footprint cannot be
    read from the AST, so the machine is built whole)."""
    if not snap.is_data():
        return None
    rules = snap.rules_json(domain)
    found = decompose(rules)
    if found is None:
        return None
    decomp = _merge_eventless(found)
    if len(decomp.components) < 2:
        return None
    started = time.perf_counter()
    parts = [build_part(project_snapshot(snap, comp, c)) for c, comp in enumerate(decomp.components)]
    space = Space(snap.vars)
    if rules["initial"] is None:
        values = [0] * len(snap.vars)
        for comp, part in zip(decomp.components, parts, strict=True):
            for v, x in zip(comp.variables, part._space.values(part.initial.id), strict=True):
                values[v] = x
        rules["initial"] = values
    for c, (comp, part) in enumerate(zip(decomp.components, parts, strict=True)):
        if project_rules(rules, comp, c) != part._rules:
            raise OracleDisagreement(f"internal error: component {c} of {snap.name!r} is not its projection")
    t_check = time.perf_counter()
    decomposition_theorem = check_decomposition(rules, decomp)
    t_checked = time.perf_counter()
    initial = space.id_of(rules["initial"])
    report = _composed_report(snap, domain, space, decomp, parts, initial, decomposition_theorem)
    timings = {"components": t_check - started, "decomposition check": t_checked - t_check}
    report = replace(report, timings=timings)
    return ComposedMachine(rules, space, parts, decomp, initial, report)


def _composed_report(
    snap: Snapshot,
    domain: Domain,
    space: Space,
    decomp: Decomposition,
    parts: Sequence[Machine],
    initial: int,
    decomposition_theorem: str,
) -> Report:
    names = [e.name for e in snap.events]
    label = decomp.event_labels(len(names))
    reports = [p.report for p in parts]
    all_pairs = list(combinations(range(len(names)), 2))
    declared = snap.independent
    checked = list(declared) if declared is not None else all_pairs
    pruned: list[PrunedPair] = [p for r in reports for p in r.pairs_pruned]
    for a, b in checked:
        if label[a] != label[b]:
            pruned.append(
                PrunedPair(
                    names[a],
                    names[b],
                    f"different components ({label[a]} and {label[b]}): they commute at every state "
                    "[Govern.Compose.compose_cross]",
                )
            )
    obligations = tuple(d for r in reports for d in r.obligations)
    not_idem = tuple(d for r in reports for d in r.not_idempotent)
    cc2 = all(r.cc2 for r in reports)
    pair_mode = "declared" if declared is not None else "all"
    guarantee, theorems = guarantee_text(
        cc2=cc2,
        pair_mode=pair_mode,
        obligations=len(obligations),
        not_idempotent=len(not_idem),
        domain=domain,
    )
    guarantee = (
        f"The machine splits into {len(parts)} components with disjoint closed footprints, each verified "
        f"and checked by the oracle on its own; what holds for each holds for the whole "
        f"[Govern.Compose.compose_unique_normal_forms]. " + guarantee
    )
    footprints: dict[str, tuple[str, ...]] = {}
    for r in reports:
        footprints.update(r.footprints)
    return Report(
        machine=snap.name,
        domain=domain,
        states=space.n,
        valid_states=product([r.valid_states for r in reports]),
        domain_states=product([r.domain_states for r in reports]),
        initial=space.as_dict(initial),
        events=tuple(names),
        invariants=tuple(i.name for i in snap.invariants),
        pair_mode=pair_mode,
        pairs_checked=tuple((names[a], names[b]) for a, b in checked),
        pairs_pruned=tuple(pruned),
        undeclared_pairs=len(all_pairs) - len(checked),
        max_repair_depth=sum(r.max_repair_depth for r in reports),
        cc2=cc2,
        cc2_failing_events=tuple(e for r in reports for e in r.cc2_failing_events),
        cc2_witness=next((r.cc2_witness for r in reports if r.cc2_witness is not None), None),
        obligations=obligations,
        not_idempotent=not_idem,
        guarantee=guarantee,
        theorems=(
            *theorems,
            *COMPOSE_THEOREMS,
            *((COMPOSE_TRANSPORT_THEOREM,) if domain == "valid" and cc2 else ()),
        ),
        trusted_callables=(),
        footprints=footprints,
        oracle={
            "verdict": "certified",
            "theorem": "Govern.Compose.compose_unique_normal_forms",
            "decomposition": {
                "checked": f"by the extracted Compose.check_decomposition ({decomposition_theorem})",
                "components": decomp.to_json(),
            },
            "components": [r.oracle for r in reports],
            "module_sha256": (reports[0].oracle or {}).get("module_sha256", "?"),
        },
    )


def load_composed(
    path: str | os.PathLike[str], arrays: dict[str, npt.NDArray[Any]], digest: str | None
) -> Machine:
    """The machine saved by `ComposedMachine.save` (its content hash already checked): every component is
    loaded (and re-checked) by `Machine.load`, each must be the projection of the whole rules, and the
    extracted checker must accept the decomposition."""
    where = os.fspath(path)
    try:
        rules = json.loads(bytes(arrays["rules"]).decode())
        report = Report.from_dict(json.loads(bytes(arrays["report"]).decode()))
        check_stored_timings(report)
        comps = json.loads(bytes(arrays["decomposition"]).decode())
        decomp = Decomposition(
            tuple(Component(tuple(c["variables"]), tuple(c["invariants"]), tuple(c["events"])) for c in comps)
        )
        try:
            decomposition_theorem = check_decomposition(rules, decomp)
        except OracleDisagreement as exc:
            raise MachineFileError(
                f"machine file {where!r} claims a decomposition the extracted checker refuses; it was altered"
            ) from exc
        except _MalformedRules as exc:
            raise MachineFileError(f"machine file {where!r} is inconsistent: {exc}; it was altered") from exc
        keys = sorted(k for k in arrays if k.startswith("part"))
        if len(keys) != len(decomp.components):
            raise ValueError("the number of component machines differs from the decomposition")
        # Read from memory: loading a machine writes nothing (its directory may be read-only to a replica).
        parts = [
            Machine._from_file_bytes(bytes(arrays[key]), f"{where} (component {c})", None)
            for c, key in enumerate(keys)
        ]
        for c, (comp, part) in enumerate(zip(decomp.components, parts, strict=True)):
            if project_rules(rules, comp, c) != part._rules:
                raise ValueError(f"component {c} is not the projection of the machine's rules")
        space = Space(tuple(_spec(v) for v in rules["variables"]))
        initial = space.id_of(rules["initial"])
        # The report handed out is the one the re-checked components and decomposition give; the
        # stored one must claim the same (only its timings are taken as they are).
        snap = snapshot_from_rules(rules)
        found = _composed_report(snap, rules["domain"], space, decomp, parts, initial, decomposition_theorem)
        found = replace(found, timings=dict(report.timings))
    except MachineFileError:
        raise
    except (KeyError, ValueError, IndexError, TypeError, AttributeError, UnicodeDecodeError, RecursionError,
            OverflowError, DeclarationError) as exc:
        raise MachineFileError(f"machine file {where!r} is inconsistent: {exc}") from exc
    said, derived = _without_identity(report.to_dict()), _without_identity(found.to_dict())
    differs = sorted(k for k in said if said[k] != derived.get(k))
    if differs:
        raise MachineFileError(
            f"machine file {where!r} fails the re-check: its report is not what its re-checked components "
            f"and decomposition give ({', '.join(differs)} differ), so it was altered (or damaged) after "
            "it was saved; rebuild the machine from its registry"
        )
    report = found
    machine = ComposedMachine(rules, space, parts, decomp, initial, report)
    if digest is not None and machine.digest != digest:
        raise MachineFileError(
            f"machine file {where!r} holds machine {machine.digest}, not the expected {digest}"
        )
    return machine


def _without_identity(x: Any) -> Any:
    """`x` without the oracle identities in it: which oracle build checked a file is not a claim about
    the machine (the load's own oracle re-checks it, and the loaded report names that one)."""
    if isinstance(x, dict):
        return {k: _without_identity(v) for k, v in x.items() if k not in ("identity", "module_sha256")}
    if isinstance(x, list):
        return [_without_identity(v) for v in x]
    return x


register_loader(COMPOSED_FORMAT, load_composed)
