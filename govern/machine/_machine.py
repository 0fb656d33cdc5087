"""A built machine at run time: every transition is one lookup in a precomputed table.

The runtime contract of docs/semantics.md is built in: the step table holds `step(e, NF(s))` for
every state s, so `apply` normalizes any input first and a running machine only hands out normal
forms. Machines save to a compact binary file (numpy .npz with a SHA-256 content hash) and load
without rebuilding, re-checked by the proof-derived oracle (`_load_check`).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from bide._files import read_small_file, write_whole

from .._errors import DeclarationError, ForeignState, MachineFileError, UnknownEvent
from ..model._expr import canonical_json
from ..model._families import EventFamily, families_of
from ..model._space import MAX_STATES, Space, Value, VarSpec, available_memory
from ..oracle._gate import oracle_module
from ..verify._report import Report, guarantee_text
from ._load_check import check_stored_timings, recheck
from ._rules_snapshot import check_rule_names, variable_spec, variable_specs

__all__ = [
    "FILE_FORMAT",
    "Machine",
    "MachineTables",
    "RawTables",
    "State",
    "machine_digest",
    "machine_file_bytes",
    "register_loader",
    "rules_digest",
    "symbolic_digest",
    "write_machine_file",
]

IntArray = npt.NDArray[np.int32]
BoolArray = npt.NDArray[np.bool_]

#: The format tag stored in (and required of) every saved machine file.
FILE_FORMAT = "govern.machine.v1"
#: Reads a machine file of another format (its content hash already checked): path, arrays, digest.
_Loader = Callable[[str | os.PathLike[str], dict[str, npt.NDArray[Any]], str | None], "Machine"]
#: The loaders of the other formats (composed, symbolic), registered by the modules that define them.
_LOADERS: dict[str, _Loader] = {}
#: The module that registers each other format's loader. Named, not imported: those modules import this
#: one, so `load` imports the one a file needs, when it meets that format.
_LOADER_MODULES: dict[str, str] = {
    "govern.machine.composed.v1": "govern.machine._composed",
    "govern.machine.symbolic.v1": "govern.machine._symbolic",
}
_RULES_DOMAIN = b"govern.rules.v1\x00"
_TABLES_DOMAIN = b"govern.tables.v1\x00"
_MACHINE_DOMAIN = b"govern.machine.v1\x00"
_SYMBOLIC_DOMAIN = b"govern.machine.symbolic.v1\x00"
_FILE_DOMAIN = b"govern.machine-file.v1\x00"
#: How much of a machine file's array is copied at a time while it is read (small chunks stay in cache).
_READ_CHUNK = 1 << 20


class MachineTables:
    """The machine's tables over all N states (read-only arrays, state ids are int32).

    - `valid[s]`: every invariant holds at s.
    - `repair[s]`: one repair step (s itself when valid).
    - `apply[e, s]`: the raw effect of event e at s, before normalization (s when the guard is false).
    - `nf[s]`: the normal form of s.
    - `step[e, s]`: `NF(apply(e, NF(s)))`, what `Machine.apply` returns (derived on first access).
    """

    __slots__ = ("_machine", "apply", "nf", "repair", "valid")

    def __init__(self, machine: Machine) -> None:
        raw = machine._raw
        self._machine = machine
        self.valid = raw.valid
        self.repair = raw.repair
        self.apply = raw.apply
        self.nf = raw.nf

    @property
    def step(self) -> IntArray:
        """The runtime table, (events, N)."""
        return self._machine._step_table()


@dataclass(frozen=True)
class RawTables:
    """What a build hands the machine: validity, one-step repair, raw apply, normal forms."""

    valid: BoolArray
    repair: IntArray
    apply: IntArray
    nf: IntArray


class State(Mapping[str, Value]):
    """An immutable state of one machine: a mapping of variable names to labels, bools and ints.

    `state.id` is its compact integer id (docs/semantics.md numbering). States of the same machine
    compare equal when their ids are equal; they hash and pickle-free serialize as that id."""

    __slots__ = ("_id", "_machine", "_values")

    def __init__(self, machine: Machine, sid: int) -> None:
        self._machine = machine
        self._id = sid
        self._values: dict[str, Value] | None = None

    @property
    def id(self) -> int:
        """The state's integer id."""
        return self._id

    @property
    def machine(self) -> Machine:
        """The machine this state belongs to."""
        return self._machine

    def _dict(self) -> dict[str, Value]:
        if self._values is None:
            self._values = self._machine._space.as_dict(self._id)
        return self._values

    def __getitem__(self, key: str) -> Value:
        return self._dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._machine._space.vars)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, State):
            return self._id == other._id and (
                other._machine is self._machine or other._machine.rules_digest == self._machine.rules_digest
            )
        if isinstance(other, Mapping):
            return self._dict() == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._machine.name, self._id))

    def __repr__(self) -> str:
        return "State(" + ", ".join(f"{k}={v!r}" for k, v in self._dict().items()) + ")"


class Machine:
    """A verified machine. Build one with `Registry.build()` or load one with `Machine.load(path)`.

    Every transition is one table lookup; `apply` accepts any state of this machine (it normalizes
    first, as the runtime contract requires) and returns a normal form."""

    def __init__(
        self,
        rules: dict[str, Any],
        space: Space,
        raw: RawTables,
        initial: int,
        domain_ids: IntArray,
        report: Report,
    ) -> None:
        self._rules = rules
        self._space = space
        self._raw = raw
        for arr in (raw.valid, raw.repair, raw.apply, raw.nf, domain_ids):
            arr.flags.writeable = False
        self._step: IntArray | None = None
        self._step_lock = threading.Lock()
        self._domain_ids = domain_ids
        self._events = tuple(e["name"] for e in rules["events"])
        self._event_index = {name: i for i, name in enumerate(self._events)}
        self._initial = State(self, initial)
        self._report = report
        self._rules_digest = rules_digest(rules)
        self._digest: str | None = None
        self._in_domain: BoolArray | None = None

    def _step_table(self) -> IntArray:
        """The runtime table step[e, s] = NF(apply(e, NF(s))), derived from the raw tables on first use
        (two gathers per event) so that a build does not pay for it twice."""
        step = self._step
        if step is None:
            with self._step_lock:
                step = self._step
                if step is None:
                    raw = self._raw
                    nf_index = raw.nf.astype(np.intp)
                    step = np.empty(raw.apply.shape, dtype=np.int32)
                    for e in range(raw.apply.shape[0]):
                        np.take(np.take(raw.nf, raw.apply[e]), nf_index, out=step[e])
                    step.flags.writeable = False
                    self._step = step
        return step

    # -- identity ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The registry's name."""
        return str(self._rules["name"])

    @property
    def report(self) -> Report:
        """The verification report of this machine's build."""
        return self._report

    def rules(self) -> dict[str, Any]:
        """The machine as data: the canonical JSON object of docs/semantics.md (a fresh copy)."""
        copy: dict[str, Any] = json.loads(json.dumps(self._rules))
        return copy

    @property
    def rules_digest(self) -> str:
        """SHA-256 (hex) of the canonical rules JSON, domain "govern.rules.v1"."""
        return self._rules_digest

    @property
    def tables_digest(self) -> str:
        """SHA-256 (hex) of the raw tables that determine the machine: N and E as int64, then valid
        (one byte per state), repair and apply (int32 little-endian), domain "govern.tables.v1".
        Distinguishes machines whose callables differ."""
        return _tables_digest(self._raw)

    @property
    def digest(self) -> str:
        """The machine's identity: SHA-256 over its rules digest and tables digest (domain
        "govern.machine.v1"). Two machines with equal digests behave identically."""
        if self._digest is None:
            self._digest = machine_digest(self._rules_digest, self._raw)
        return self._digest

    # -- shape ---------------------------------------------------------------------------------
    @property
    def events(self) -> tuple[str, ...]:
        """Event names in declaration order (an event's position is its index in the tables)."""
        return self._events

    @property
    def variables(self) -> tuple[VarSpec, ...]:
        """The declared variables, in order."""
        return self._space.vars

    @property
    def n_states(self) -> int:
        """N, the number of states (valid or not)."""
        return self._space.n

    @property
    def domain(self) -> str:
        """The checked domain: "valid" or "reachable"."""
        return str(self._rules["domain"])

    @property
    def initial(self) -> State:
        """The initial state (valid, hence a normal form)."""
        return self._initial

    def tables(self) -> MachineTables:
        """The machine's read-only tables (for certificates and foreign runtimes)."""
        return MachineTables(self)

    @property
    def components(self) -> tuple[Machine, ...]:
        """The machines this one is built from: itself, unless it was built by components
        (docs/govern.md, "Composition"), when each is an ordinary machine over its own variables."""
        return (self,)

    @property
    def families(self) -> dict[str, EventFamily]:
        """The event families (parametric events), recovered from the instances' names."""
        return families_of(self._events)

    def event(self, name: str, /, **params: object) -> str:
        """The event named `name`, or with `params` the instance of family `name` for those values
        (`machine.event("assign", who="alice")` is `"assign(who=alice)"`); raises `UnknownEvent`."""
        if not params:
            self.event_index(name)
            return name
        family = families_of(self._events).get(name)
        if family is None:
            raise UnknownEvent(
                f"machine {self.name!r} has no event family {name!r}; its families are "
                f"{sorted(families_of(self._events))}"
            )
        return family.instance(params)

    def event_index(self, event: str) -> int:
        """The position of an event; raises `UnknownEvent`."""
        try:
            return self._event_index[event]
        except (KeyError, TypeError):
            raise UnknownEvent(
                f"machine {self.name!r} has no event {event!r}; events are {list(self._events)}"
            ) from None

    # -- states --------------------------------------------------------------------------------
    def state(self, values: Mapping[str, object] | None = None, /, **named: object) -> State:
        """The state with the given values (labels, bools, ints); unnamed variables keep their value
        in the initial state. The result may be invalid: `apply` and `normalize` repair it."""
        merged = dict(values or {})
        merged.update(named)
        return State(self, self._space.id_from_mapping(merged, self._initial.id))

    def state_of(self, sid: int) -> State:
        """The state with integer id `sid`."""
        if (
            isinstance(sid, bool)
            or not isinstance(sid, int | np.integer)
            or not 0 <= int(sid) < self._space.n
        ):
            raise ForeignState(f"{sid!r} is not a state id of machine {self.name!r} (0..{self._space.n - 1})")
        return State(self, int(sid))

    def _sid(self, state: State | int) -> int:
        if isinstance(state, State):
            if state._machine is not self and state._machine.rules_digest != self._rules_digest:
                raise ForeignState(
                    f"that state belongs to machine {state._machine.name!r}, not to {self.name!r}"
                )
            return state._id
        return self.state_of(state)._id

    def normalize(self, state: State | int) -> State:
        """The normal form of `state` (repairs applied until every invariant holds)."""
        return State(self, int(self._raw.nf[self._sid(state)]))

    def is_valid(self, state: State | int) -> bool:
        """True when every invariant holds at `state`."""
        return bool(self._raw.valid[self._sid(state)])

    def in_domain(self, state: State | int) -> bool:
        """True when `state` is in the checked domain D, where the guarantees start."""
        if self._in_domain is None:
            mask = np.zeros(self._space.n, dtype=np.bool_)
            mask[self._domain_ids] = True
            self._in_domain = mask
        return bool(self._in_domain[self._sid(state)])

    # -- transitions ---------------------------------------------------------------------------
    def apply(self, state: State | int, event: str, /, **params: object) -> State:
        """`step(event, NF(state))`: one table lookup; returns a normal form. With `params`, `event`
        names a family and the instance for those values is applied (see `event`)."""
        if params:
            event = self.event(event, **params)
        return State(self, int(self._step_table()[self.event_index(event), self._sid(state)]))

    def replay(self, events: Iterable[str], start: State | int | None = None) -> State:
        """Apply `events` in order from `start` (default: the initial state)."""
        s = self._initial._id if start is None else self._sid(start)
        step = self._step_table()
        for e in events:
            s = int(step[self.event_index(e), s])
        return State(self, s)

    def replay_many(self, streams: Sequence[Sequence[str]], start: State | int | None = None) -> list[State]:
        """Replay many independent event streams at once (vectorized); one final state per stream."""
        width = max((len(s) for s in streams), default=0)
        codes = np.full((len(streams), width), -1, dtype=np.int32)
        for i, stream in enumerate(streams):
            codes[i, : len(stream)] = [self.event_index(e) for e in stream]
        first = self._initial._id if start is None else self._sid(start)
        ids = self.replay_ids(codes, np.full(len(streams), first, dtype=np.int32))
        return [State(self, int(x)) for x in ids]

    def replay_ids(
        self, codes: npt.NDArray[np.integer[Any]], starts: npt.NDArray[np.integer[Any]] | Sequence[int]
    ) -> IntArray:
        """Vectorized core of `replay_many`: `codes[i, t]` is the t-th event index of stream i (-1 =
        no event), `starts[i]` its start id; returns the final ids."""
        ids = np.asarray(starts, dtype=np.int32).copy()
        if ids.size and (ids.min() < 0 or ids.max() >= self._space.n):
            raise ForeignState(f"start ids must lie in 0..{self._space.n - 1}")
        codes = np.asarray(codes)
        if codes.size and codes.max() >= len(self._events):
            raise UnknownEvent(
                f"event index {int(codes.max())} out of range (machine has {len(self._events)})"
            )
        step = self._step_table()
        for t in range(codes.shape[1] if codes.ndim == 2 else 0):
            col = codes[:, t]
            live = col >= 0
            ids[live] = step[col[live], ids[live]]
        return ids

    # -- persistence ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the machine to `path` atomically: rules, report, and the tables (binary, with a
        SHA-256 content hash checked on load)."""
        write_machine_file(path, FILE_FORMAT, self._arrays())

    def _arrays(self) -> dict[str, npt.NDArray[Any]]:
        """The arrays `save` writes (in the format FILE_FORMAT)."""
        t = self._raw
        return {
            "rules": np.frombuffer(canonical_json(self._rules), dtype=np.uint8),
            "report": np.frombuffer(canonical_json(self._report.to_dict()), dtype=np.uint8),
            "valid_bits": np.packbits(t.valid),
            "repair": t.repair,
            "apply": t.apply,
            "nf": t.nf,
            "initial": np.array([self._initial._id], dtype=np.int64),
            "domain_ids": self._domain_ids,
        }

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, digest: str | None = None) -> Machine:
        """Load a machine saved by `save`, without rebuilding it, but re-checked: the table checker
        extracted from the proof re-checks the stored tables, and the stored normal forms, repair
        depth, CC2, checked domain, causal-order obligations and not-idempotent events must be what it
        finds; when every rule is an expression, the rules checker confirms the tables are what the
        rules mean. (The file's content hash is unkeyed, so it only catches accidents.) With `digest`,
        the loaded machine must also be that machine (`Machine.digest`): pin it to refuse a different,
        equally consistent machine. A machine built by components loads each component so, and has
        the extracted checker re-check its decomposition; a symbolically verified one (no tables) is
        decided again from its rules, and its stored report must be what that finds. A file an older govern
        saved loads when every claim it makes checks: a report worded without the delivery theorems
        (before commit 1073cd4) or saying the rules check was deferred (before 6960c75) is read as this
        version words the same claims, and the loaded report is what the re-check finds.

        Raises `MachineFileError` when the file is unreadable, truncated, of another format, its
        content hash does not match, or it fails the re-check (it says what differs, and that the file
        is of an older govern when it is), and
        `OracleUnavailable` when the oracle cannot be loaded. A file is never decompressed and no array
        is allocated beyond what the file holds: one whose arrays are compressed (`save` stores them as
        they are) or declare more data than is there raises `MachineFileError` before they are read."""
        # Read whole (from one descriptor: a file saved by rename meanwhile is read old or new, whole), so
        # a file larger than the memory left is refused before it is read; a pipe (which blocks) or a
        # device like /dev/zero (which never ends) is refused as not a regular file.
        try:
            data = read_small_file(path, available_memory(), too_large="more than the memory left")
        except OSError as exc:
            raise MachineFileError(
                f"cannot read machine file {os.fspath(path)!r}: {exc.strerror or exc}; give the path of a "
                "file Machine.save wrote"
            ) from exc
        return cls._from_file_bytes(data, os.fspath(path), digest)

    @classmethod
    def _from_file_bytes(cls, data: bytes, where: str, digest: str | None) -> Machine:
        """`load` of a machine file's bytes, read from `where` (named in errors)."""
        try:
            arrays = _read_arrays(data)
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
            raise MachineFileError(f"cannot read machine file {where!r}: {exc}") from exc
        except MemoryError:
            raise MachineFileError(
                f"cannot read machine file {where!r}: its arrays do not fit in the memory left"
            ) from None
        try:
            fmt = bytes(arrays.pop("format")).decode()
            stored = bytes(arrays.pop("content_sha256")).hex()
        except (KeyError, UnicodeDecodeError) as exc:
            raise MachineFileError(f"{where!r} is not a govern machine file") from exc
        if fmt != FILE_FORMAT and fmt not in _LOADERS and fmt not in _LOADER_MODULES:
            raise MachineFileError(
                f"{where!r} has format {fmt!r}; this version reads "
                f"{', '.join(repr(f) for f in [FILE_FORMAT, *sorted({*_LOADERS, *_LOADER_MODULES})])}"
            )
        if _content_hash(arrays) != stored:
            raise MachineFileError(f"{where!r} is corrupted or was altered: content hash mismatch")
        if fmt != FILE_FORMAT:  # built by components, or verified symbolically
            if fmt not in _LOADERS:
                importlib.import_module(_LOADER_MODULES[fmt])  # registers its loader
            return _LOADERS[fmt](where, arrays, digest)
        try:
            rules = json.loads(bytes(arrays["rules"]).decode())
            report = Report.from_dict(json.loads(bytes(arrays["report"]).decode()))
            check_stored_timings(report)
            space = Space(variable_specs(rules["variables"]))
            check_rule_names(rules)
            n = space.n
            if n > MAX_STATES:
                raise ValueError(f"its variables span {n:,} states, more than a machine's tables hold")
            n_ev = len(rules["events"])
            bits = arrays["valid_bits"]
            if bits.dtype != np.uint8 or bits.shape != ((n + 7) // 8,):
                raise ValueError(f"valid_bits has dtype {bits.dtype} and shape {bits.shape}, not {n} bits")
            valid = np.unpackbits(bits, count=n).astype(np.bool_)
            raw = RawTables(
                valid,
                _ids(arrays["repair"], (n,), n, "repair"),
                _ids(arrays["apply"], (n_ev, n), n, "apply"),
                _ids(arrays["nf"], (n,), n, "nf"),
            )
            if not (raw.valid[raw.nf].all() and np.array_equal(raw.nf[raw.nf], raw.nf)):
                raise ValueError("nf does not map every state to a valid fixed point")
            domain_ids = _ids(arrays["domain_ids"], (len(arrays["domain_ids"]),), n, "domain_ids")
            initial = int(_ids(arrays["initial"], (1,), n, "initial")[0])
            if not valid[initial]:
                raise ValueError("the initial state is not a valid state")
            # A file of an older govern words some claims as that version did: read them as this one does.
            report, older = _in_current_words(report, rules, n, n_ev)
            problems, checked_by = recheck(
                rules, space, valid, raw.repair, raw.apply, raw.nf, initial, domain_ids, report
            )
        except (KeyError, ValueError, IndexError, TypeError, AttributeError, OverflowError, RecursionError,
                UnicodeDecodeError, DeclarationError) as exc:
            raise MachineFileError(f"machine file {where!r} is inconsistent: {exc}") from exc
        if problems and older:
            raise MachineFileError(
                f"machine file {where!r} is in the form an older govern saved ({'; '.join(older)}; read "
                "here in this version's words), and the claims it makes contradict the re-check by the "
                "proof-derived oracle: it was altered (or damaged) after it was saved, or the govern that "
                "wrote it got them wrong; rebuild the machine from its registry and save it again:\n  - "
                + "\n  - ".join(problems)
            )
        if problems:
            raise MachineFileError(
                f"machine file {where!r} fails the re-check by the proof-derived oracle, so it "
                "was altered (or damaged) after it was saved; rebuild the machine from its registry:\n  - "
                + "\n  - ".join(problems)
            )
        # Every claim of the report is now what the re-check found; it names the oracle that re-checked it.
        report = replace(report, oracle=checked_by)
        machine = cls(rules, space, raw, initial, domain_ids, report)
        if digest is not None and machine.digest != digest:
            raise MachineFileError(
                f"machine file {where!r} holds machine {machine.digest}, not the expected {digest}"
            )
        return machine

    def __repr__(self) -> str:
        return f"<Machine {self.name!r}: {self._space.n:,} states, {len(self._events)} events>"


# -- files of older govern versions ---------------------------------------------------------------
# Every claim of a loaded report is compared with the re-check (`_load_check`), so the report handed out
# is what the re-check finds, in this version's words. Two forms of older versions word claims otherwise:
#
# - before the delivery theorems (commit 1073cd4, 2026-12-01: govern f8308f0 to 8f74d63) the guarantee
#   and theorems were worded without them and the oracle record had no "delivery" (the obligations and
#   not-idempotent events the oracle derives; the report itself lists both, as now);
# - before the rules check ran on every build (commit 6960c75), a machine of more than 2**22 table entries
#   with expression rules recorded the rules check as deferred.
#
# A report in exactly such a form, of the claims it makes (pair mode, CC2, obligations and not-idempotent
# events, oracle theorem), is read as this version words those claims; the re-check then compares them as
# it compares any file's. Anything else is compared as it stands, so an edited claim is still refused.

#: What a report before the delivery theorems said its guarantee rested on (then without theorem names).
_OLD_TRACE = "trace equivalence from D under eager compensation (WFC + CC1 on D; docs/semantics.md)"
_OLD_CONFLUENCE = "confluence of the full rewrite system (WFC + CC1 + CC2, Newman's lemma)"
_OLD_INTERLEAVED = (
    "interleaved compensation from D (CC2 reduces it to trace equivalence from D; the Rocq "
    "confluence theorem covers only the domain of every valid state)"
)
#: The table entries (states x (events + 1)) above which a build before commit 6960c75 deferred the
#: rules check.
_OLD_RULES_CHECK_MAX_ENTRIES = 1 << 22
_NO_DELIVERY = (
    "its report, from before commit 1073cd4, lacks the delivery theorems (Govern.Delivery."
    "check_tables_delivery, check_tables_replica, check_tables_duplicate) and the oracle's delivery record"
)
_DEFERRED = "its report says the rules check was deferred (before govern 6960c75 ran it on every build)"


def _pre_delivery_words(
    *, cc2: bool, pair_mode: str, obligations: int, domain: str
) -> list[tuple[str, tuple[str, ...]]]:
    """The guarantee and theorems a govern before the delivery theorems wrote for these claims: one
    wording, but with CC2 on the reachable domain f8308f0 cited confluence where later ones do not."""
    where = "From every valid state" if domain == "valid" else (
        "From the initial state (and every state reachable from it)"
    )
    if pair_mode == "all":
        scope = "any two delivery orders of the same events reach the same state"
    else:
        scope = (
            "event sequences that differ only by swapping adjacent declared-independent events reach "
            "the same state"
        )
    text = f"{where}, {scope}, with the state normalized after each event (Machine.apply does this)."
    if pair_mode == "declared":
        text += (
            f" {obligations} undeclared pair(s) do not commute and must be delivered in one fixed causal "
            "order (see obligations)."
            if obligations
            else " Every undeclared pair commutes as well."
        )
    if not cc2:
        return [(text, (_OLD_TRACE,))]
    text += (
        " CC2 holds too, so compensation may interleave with delivery in any way and the result "
        "is still the same valid state."
    )
    words: list[tuple[str, tuple[str, ...]]] = [(text, (_OLD_TRACE, _OLD_CONFLUENCE))]
    if domain != "valid":
        words.append((text, (_OLD_TRACE, _OLD_INTERLEAVED)))
    return words


def _data_rules(rules: dict[str, Any]) -> bool:
    """Every rule is an expression (none is a Python callable)."""
    invariants = all(r.get("holds") is not None and r.get("repair") is not None for r in rules["invariants"])
    events = all(e.get("guard") is not None and e.get("effect") is not None for e in rules["events"])
    return invariants and events


def _in_current_words(report: Report, rules: dict[str, Any], n: int, n_ev: int) -> tuple[Report, list[str]]:
    """`report` with the claims an older govern worded otherwise (see above) in this version's words, and
    what set it apart (empty, and `report` itself, when it is in no older form). It changes no claim: the
    words are those of the claims the report makes, which the re-check then compares."""
    record = report.oracle
    if not isinstance(record, dict):
        return report, []
    record = dict(record)
    older: list[str] = []
    theorem = record.get("theorem")
    if "delivery" not in record:
        cited = (f"oracle: {theorem}",) if theorem else ()
        words = _pre_delivery_words(
            cc2=report.cc2, pair_mode=report.pair_mode, obligations=len(report.obligations),
            domain=str(rules["domain"]),
        )
        if any(report.guarantee == text and report.theorems == (*said, *cited) for text, said in words):
            events = [str(e["name"]) for e in rules["events"]]
            pairs = sorted(
                sorted((events.index(d.events[0]), events.index(d.events[1]))) for d in report.obligations
            )
            guarantee, theorems = guarantee_text(
                cc2=report.cc2,
                pair_mode=report.pair_mode,
                obligations=len(report.obligations),
                not_idempotent=len(report.not_idempotent),
                domain=str(rules["domain"]),
            )
            report = replace(report, guarantee=guarantee, theorems=(*theorems, *cited))
            record["delivery"] = {
                "obligations": pairs,
                "not_idempotent": sorted(events.index(d.events[0]) for d in report.not_idempotent),
                "theorem": oracle_module().THEOREM_DELIVERY,
            }
            older.append(_NO_DELIVERY)
    entries = n * (n_ev + 1)
    if (
        entries > _OLD_RULES_CHECK_MAX_ENTRIES
        and _data_rules(rules)
        and record.get("rules_checked")
        == f"deferred: {entries:,} table entries is above the build-time limit of "
        f"{_OLD_RULES_CHECK_MAX_ENTRIES:,}; govern certify and govern check run it"
    ):
        record["rules_checked"] = (
            f"checked: the tables are exactly what the rules mean ({oracle_module().THEOREM_RULES})"
        )
        older.append(_DEFERRED)
    return (replace(report, oracle=record), older) if older else (report, [])


def _spec(v: dict[str, Any]) -> VarSpec:
    """A variable of a file's rules, read back strictly (`ValueError` for what a build never writes)."""
    return variable_spec(v)


def rules_digest(rules: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a machine's canonical rules JSON, domain "govern.rules.v1"."""
    return hashlib.sha256(_RULES_DOMAIN + canonical_json(rules)).hexdigest()


def machine_digest(rules_digest_hex: str, raw: RawTables) -> str:
    """A machine's identity from its rules digest and raw tables (domain "govern.machine.v1"): what
    `Machine.digest` is, computable from a certificate's rules and tables alone."""
    tables = bytes.fromhex(_tables_digest(raw))
    return hashlib.sha256(_MACHINE_DOMAIN + bytes.fromhex(rules_digest_hex) + tables).hexdigest()


def symbolic_digest(rules_digest_hex: str) -> str:
    """A symbolically verified machine's identity from its rules digest alone (domain
    "govern.machine.symbolic.v1"; it has no tables): what `Machine.digest` is for such a machine,
    computable from its certificate's rules."""
    return hashlib.sha256(_SYMBOLIC_DOMAIN + bytes.fromhex(rules_digest_hex)).hexdigest()


def _tables_digest(t: RawTables) -> str:
    h = hashlib.sha256(_TABLES_DOMAIN)
    h.update(np.array([t.apply.shape[1], t.apply.shape[0]], dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(t.valid, dtype=np.uint8).data)
    h.update(np.ascontiguousarray(t.repair, dtype="<i4").data)
    h.update(np.ascontiguousarray(t.apply, dtype="<i4").data)
    return h.hexdigest()


def _ids(a: npt.NDArray[Any], shape: tuple[int, ...], n: int, what: str) -> IntArray:
    if a.dtype.kind not in "iu" or a.shape != shape:
        raise ValueError(
            f"{what} has dtype {a.dtype} and shape {a.shape}, expected integers of shape {shape}"
        )
    if a.size and (int(a.min()) < 0 or int(a.max()) >= n):
        raise ValueError(f"{what} holds ids outside 0..{n - 1}")
    return a.astype(np.int32, copy=False)


def register_loader(fmt: str, loader: _Loader) -> None:
    """Have `Machine.load` read files of format `fmt` with `loader` (after checking their content hash)."""
    _LOADERS[fmt] = loader


def write_machine_file(path: str | os.PathLike[str], fmt: str, arrays: dict[str, npt.NDArray[Any]]) -> None:
    """Write a machine file (`machine_file_bytes`) at `path`, mode 0644, whole or not at all."""
    # The CLI's writer: an unnamed temporary file renamed over the old one and the directory synced (a
    # killed process leaves nothing behind), readable by replicas running as another user, and a link of
    # one's own written through.
    write_whole(Path(path), machine_file_bytes(fmt, arrays), mode=0o644)


def machine_file_bytes(fmt: str, arrays: dict[str, npt.NDArray[Any]]) -> bytes:
    """A machine file: `arrays`, their SHA-256 content hash and the format tag `fmt`, as one .npz
    (`Machine.load` checks the hash, then hands other formats to their loaders)."""
    arrays = dict(arrays)
    content = _content_hash(arrays)
    arrays["format"] = np.frombuffer(fmt.encode(), dtype=np.uint8)
    arrays["content_sha256"] = np.frombuffer(bytes.fromhex(content), dtype=np.uint8)
    data = io.BytesIO()
    np.savez(data, **arrays)  # type: ignore[arg-type]
    return data.getvalue()


def _read_arrays(data: bytes) -> dict[str, npt.NDArray[Any]]:
    """The arrays of the machine file `data` (an .npz as `write_machine_file` writes it), by name.

    Nothing the file declares is allocated before it is known to be there: members must be stored
    uncompressed (as np.savez stores them), their sizes must add up to at most the file's, and each
    member's .npy header must declare exactly as many bytes as the member holds after it. So a small
    file never takes more memory than its size (a deflate bomb, or a header claiming terabytes, was
    decompressed or allocated first). Raises ValueError or zipfile.BadZipFile saying what is wrong."""
    arrays: dict[str, npt.NDArray[Any]] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = archive.infolist()
        for member in members:
            if member.compress_type != zipfile.ZIP_STORED:
                raise ValueError(
                    f"member {member.filename!r} is compressed; Machine.save stores arrays as they are"
                )
        if sum(member.file_size for member in members) > len(data):
            raise ValueError("its members claim more bytes than the file holds")
        for member in members:
            name = member.filename.removesuffix(".npy")
            if name == member.filename or name in arrays:
                raise ValueError(f"member {member.filename!r} is not one .npy array of a machine file")
            with archive.open(member) as stream:
                arrays[name] = _read_npy(stream, member.file_size, member.filename)
    return arrays


def _read_npy(stream: IO[bytes], size: int, what: str) -> npt.NDArray[Any]:
    """The array in the .npy member `stream` of `size` bytes, allocated only once its header is known to
    describe exactly the bytes that follow it (ValueError otherwise)."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise ValueError(f"member {what!r} is a .npy file of version {version}, which no Machine.save writes")
    # Only the plain numbers a machine file holds: no objects (pickles), strings or records.
    if dtype.kind not in "biu" or any(dim < 0 for dim in shape):
        raise ValueError(f"member {what!r} holds an array of type {dtype} and shape {shape}, not numbers")
    count = 1
    for dim in shape:
        count *= dim
    declared, held = count * dtype.itemsize, size - stream.tell()
    if declared != held:
        raise ValueError(f"member {what!r} declares {declared} bytes of data but holds {held}")
    array = np.empty(count, dtype=dtype)
    flat, done = array.view(np.uint8), 0
    while done < held:
        chunk = stream.read(min(held - done, _READ_CHUNK))
        if not chunk:
            raise ValueError(f"member {what!r} is truncated")
        flat[done : done + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
        done += len(chunk)
    return array.reshape(shape[::-1]).transpose() if fortran_order else array.reshape(shape)


def _content_hash(arrays: Mapping[str, npt.NDArray[Any]]) -> str:
    h = hashlib.sha256(_FILE_DOMAIN)
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}:{a.dtype.str}:{a.shape}\n".encode())
        h.update(a.data)
    return h.hexdigest()
