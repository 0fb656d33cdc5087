"""Replicas: fold a shared event log into one machine state per record, in any delivery order the rules allow.

A replica holds, for every record key it has seen, one state of the machine (records it has not seen are
at the machine's initial state). It can be fed two ways:

- `sync()` pulls the log from where the replica stands and applies it in log order;
- `deliver(events)` takes events in whatever order a transport brings them (duplicates included) and
  applies each one as soon as the delivery rules allow, buffering the rest.

The delivery rules (docs/governed-agents.md) come from the machine's build report:

1. An event is applied at most once: duplicates are dropped by log position (the log gives every event id
   exactly one position). The report's not-idempotent events are the ones for which this is essential.
   A copy is a duplicate only when it is the same event, every field equal: it is compared with the
   event buffered or applied at its position. Of an event applied in the folded prefix the replica
   keeps a fingerprint (id, record, event, record_seq), and compares every field with the tree's leaf
   (`track_root=True`) or else with the log's event at that position. A different copy raises
   `LogCorrupted` and changes nothing.
2. An event is applied after every event it declares as a causal dependency.
3. For every causal-order obligation `{a, b}` of the report, two events of the same record named `a` and
   `b` are applied in log order. To know which earlier events of a record exist, an event with an
   obligation waits until every earlier event of its record (by `record_seq`) has arrived.

Every other pair commutes on the checked domain (events on different records touch different states), so
any order obeying these rules reaches the state the log order reaches: that is the convergence guarantee,
under these delivery conditions. Replicas built from the same log with different delivery orders end with
equal `digest()`s.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import operator
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Self

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from .._errors import ForeignState
from ..machine._machine import Machine
from ._eventlog import (
    Event,
    EventLog,
    EventLogError,
    InvalidInput,
    LogCorrupted,
    LoggedEvent,
    MachineMismatch,
    _invalid,
    _name_problem,
    _unwrapped,
)
from ._rules import DeliveryRules, delivery_rules

__all__ = ["Checkpoint", "Replica", "ReplicaError"]

_BATCH_MIN = 16  # shorter in-order runs fold faster one lookup at a time


class ReplicaError(EventLogError):
    """A replica cannot apply what it was given (an event unknown to its machine, or an event of another
    log). Nothing was skipped: the replica stops exactly after the last event it applied, and `.event`
    is the event it could not apply (None when the error is not about one event)."""

    def __init__(self, message: str, event: LoggedEvent | None = None) -> None:
        super().__init__(message)
        self.event = event


_FORMAT_V1 = "govern-replica-checkpoint/1"  # not bound to the log's contents: read, never written
_FORMAT_V2 = "govern-replica-checkpoint/2"  # not sealed: read, never written
_FORMAT = "govern-replica-checkpoint/3"
_OLDER = (_FORMAT_V2, _FORMAT_V1)
_Count = Annotated[StrictInt, Field(ge=0, lt=2**63)]  # a log position is a signed 64-bit number


class Checkpoint(BaseModel):
    """A replica's state after folding the log prefix `[0, position)`: restart a replica from it with
    `Replica(machine, log, checkpoint=...)`. `states` maps record keys to machine state ids.

    `last_id` and `last_leaf` (the SHA-256 of `LoggedEvent.leaf()`) name the event at `position - 1`, so
    a restore checks that the log holds that very event there (None at position 0, and in the older
    format 1, which has neither). `seal` is the SHA-256 of every other field (None in the older formats 1
    and 2): a restore refuses a checkpoint edited without recomputing it. A value of a wrong type or
    range, or `record_lengths` that do not add up to `position`, raises `InvalidInput` naming it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: StrictStr = _FORMAT
    machine: StrictStr
    log: StrictStr
    position: _Count
    states: dict[StrictStr, StrictInt]
    record_lengths: dict[StrictStr, _Count]
    digest: StrictStr
    last_id: StrictStr | None = None
    last_leaf: StrictStr | None = None
    seal: StrictStr | None = None

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _invalid(exc, "Checkpoint") from None

    @classmethod
    def model_validate(cls, obj: Any, **options: Any) -> Self:
        """A checkpoint from a dict; a bad one raises `InvalidInput` naming the field."""
        try:
            return super().model_validate(obj, **options)
        except ValidationError as exc:
            raise _unwrapped(exc, "Checkpoint") from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **options: Any) -> Self:
        """A checkpoint from its JSON (a saved file); a bad one raises `InvalidInput` naming the field."""
        try:
            return super().model_validate_json(json_data, **options)
        except ValidationError as exc:
            raise _unwrapped(exc, "Checkpoint") from None

    @field_validator("format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value != _FORMAT and value not in _OLDER:
            older = " or ".join(map(repr, _OLDER))
            raise ValueError(f"must be {_FORMAT!r} (or the older {older}), not {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        has_last = self.last_id is not None and self.last_leaf is not None
        if self.format != _FORMAT_V1 and has_last != (self.position > 0):
            raise ValueError(
                "last_id and last_leaf name the event at position - 1: both are needed when position > 0 "
                f"and absent at 0 (position {self.position}, last_id {self.last_id!r})"
            )
        if self.format == _FORMAT_V1 and (self.last_id is not None or self.last_leaf is not None):
            raise ValueError(f"format {_FORMAT_V1!r} has no last_id or last_leaf")
        if (self.seal is None) != (self.format in _OLDER):
            raise ValueError(f"format {_FORMAT!r} needs a seal, and only it has one (format {self.format!r})")
        if self.record_lengths.keys() != self.states.keys():
            raise ValueError("record_lengths must name exactly the records of states")
        for key in self.states:
            problem = _name_problem(key)
            if problem is not None:
                raise ValueError(f"states: record key {key!r} {problem}")
        for key, length in self.record_lengths.items():
            if length > self.position:  # a record holds events of the folded prefix only
                raise ValueError(
                    f"record_lengths[{key!r}] is {length}, more events than the {self.position} folded"
                )
        # Every event of the folded prefix is one more applied event of its record, and nothing else is.
        total = sum(self.record_lengths.values())
        if total != self.position:
            raise ValueError(
                f"record_lengths add up to {total} events, but the checkpoint folded {self.position}: "
                "the checkpoint was altered"
            )
        return self

    def expected_seal(self) -> str:
        """The seal of this checkpoint's other fields: what `seal` holds unless the checkpoint was edited.
        A checksum, not a signature: it catches damage and hand edits, not an edit that recomputes it."""
        return _seal_of(self.model_dump(exclude={"seal"}))

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with `update`, validated as a checkpoint read from a file is (pydantic's own copy takes
        any value unchecked)."""
        if not update:
            return super().model_copy(deep=deep)
        return type(self)(**{**self.model_dump(), **update})

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> Self:  # type: ignore[override]
        """A checkpoint from `values`, validated (pydantic's own `model_construct` checks nothing)."""
        return cls(**values)


def _seal_of(fields: Mapping[str, Any]) -> str:
    """SHA-256 of a checkpoint's fields but its seal, in one canonical JSON text."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(f"govern.replica.checkpoint.v3\n{text}".encode()).hexdigest()


_ID = operator.attrgetter("id")
_POSITION = operator.attrgetter("position")
_EVENT_TYPES = frozenset({LoggedEvent})
_FIELDS = tuple(LoggedEvent.model_fields)


def _fingerprint(event: LoggedEvent, code: int) -> int:
    """What a replica keeps of each event it applied (8 bytes): a mix of its id, record, event (`code`, its
    index in the machine) and record_seq, the fields that decide what applying it does. A copy that
    matches it is compared in every field on the duplicate path only (`Replica._unlike_applied`), and
    `machine` and `log` are checked on every event.

    The string hashes are keyed per process, so a different copy with the same fingerprint is not found
    by accident; it is still a hash, not a proof (a signed Merkle root is that)."""
    return _mix(hash(event.id), hash(event.record), code, event.record_seq)


# Odd 64-bit multipliers: each is invertible modulo 2**64, so a change in any one input changes the mix.
_K_RECORD, _K_EVENT, _K_SEQ = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_K = np.array([_K_RECORD, _K_EVENT, _K_SEQ], dtype=np.uint64)
_MASK = 2**64 - 1


def _mix(id_hash: int, record_hash: int, code: int, record_seq: int) -> int:
    """id_hash + K1 * record_hash + K2 * code + K3 * record_seq modulo 2**64, as a signed 64-bit int:
    the same number `_fingerprints` computes with numpy for a whole batch."""
    mixed = (id_hash + _K_RECORD * record_hash + _K_EVENT * code + _K_SEQ * record_seq) & _MASK
    return mixed - (1 << 64) if mixed >> 63 else mixed


def _fingerprints(
    events: list[LoggedEvent], names: list[str], rec: np.ndarray, codes: np.ndarray, seqs: np.ndarray
) -> bytes:
    """The `_fingerprint`s of `events` (their record keys are `names[rec[i]]`, their codes and record_seqs
    `codes` and `seqs`, integers >= 0), as the bytes of an array("q"): `_mix` in uint64 arithmetic, which
    wraps modulo 2**64."""
    ids = np.fromiter(map(hash, map(_ID, events)), dtype=np.int64, count=len(events)).view(np.uint64)
    records = np.fromiter(map(hash, names), dtype=np.int64, count=len(names)).view(np.uint64)[rec]
    mixed = ids + records * _K[0] + codes.astype(np.uint64) * _K[1] + seqs.astype(np.uint64) * _K[2]
    return bytes(mixed.view(np.int64).tobytes())


def _differences(copy: LoggedEvent, other: LoggedEvent) -> str:
    """The fields in which `copy` differs from `other`, with both values."""
    return ", ".join(
        f"{name} {getattr(copy, name)!r} (there: {getattr(other, name)!r})"
        for name in _FIELDS
        if getattr(copy, name) != getattr(other, name)
    )


def _leaf_digest(event: LoggedEvent) -> str:
    return hashlib.sha256(event.leaf()).hexdigest()


def _not_an_event(index: int, item: object) -> InvalidInput:
    if isinstance(item, Mapping):
        hint = "a dict: make it a LoggedEvent first (govern.LoggedEvent(**item)), which checks every field"
    elif isinstance(item, Event):
        hint = "a plain Event, which has no log position: deliver the LoggedEvents of log.read()"
    else:
        hint = f"a {type(item).__name__}"
    return InvalidInput(f"events[{index}]", f"must be a govern.LoggedEvent (read from a log), not {hint}")


@dataclass(slots=True)
class _Record:
    """One record's state, and the index of its buffered events by what each one waits for."""

    state: int
    applied_prefix: int = 0  # every record_seq below this is applied
    ahead: set[int] = field(default_factory=set)  # applied record_seqs at or above applied_prefix
    known: dict[int, int] = field(default_factory=dict)  # record_seq -> event index, for unapplied arrivals
    frontier: int = 0  # a lower bound of the first record_seq that has not arrived
    # Buffered events with an obligation that wait for an earlier record_seq to arrive: (record_seq, pos).
    gap_waiters: list[tuple[int, int]] = field(default_factory=list)
    # Buffered events that wait for the unapplied event at a record_seq to be applied: seq -> positions.
    seq_waiters: dict[int, list[int]] = field(default_factory=dict)
    # Unapplied arrived record_seqs by event index (min-heaps; applied seqs are dropped lazily).
    unapplied: dict[int, list[int]] = field(default_factory=dict)

    def arrived(self, seq: int) -> bool:
        return seq < self.applied_prefix or seq in self.ahead or seq in self.known

    def advance_frontier(self) -> None:
        self.frontier = max(self.frontier, self.applied_prefix)
        while self.arrived(self.frontier):
            self.frontier += 1


@dataclass(slots=True)
class _FoldPlan:
    """Consecutive log events grouped by record for one vectorized replay (`Replica._fold_plan`)."""

    names: list[str]  # record keys, by record index
    known: list[_Record | None]  # their entries (None: a record not seen yet)
    rec: np.ndarray  # record index of each event
    codes: np.ndarray  # event code of each event
    seqs: np.ndarray  # record_seq of each event
    order: np.ndarray  # event indexes grouped by record (stable)
    counts: np.ndarray  # events per record
    grouped: np.ndarray  # rec[order]
    column: np.ndarray  # each event's place among its record's events, in `order`


class Replica:
    """One replica of a machine's records, fed from an `EventLog` (see the module docstring).

    `machine` is a built `govern.Machine`; the log must be bound to the same machine digest.
    """

    def __init__(
        self,
        machine: Machine,
        log: EventLog,
        *,
        checkpoint: Checkpoint | None = None,
        track_root: bool = False,
    ) -> None:
        if not isinstance(machine, Machine):
            raise InvalidInput(
                "machine",
                f"must be a built govern.Machine (Registry.build() or Machine.load()), not {machine!r}",
            )
        if not isinstance(log, EventLog):
            raise InvalidInput("log", f"must be a govern.EventLog (govern.EventLog(url)), not {log!r}")
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise InvalidInput(
                "checkpoint",
                f"must be a govern.Checkpoint (read a saved one with Checkpoint.model_validate_json), "
                f"not a {type(checkpoint).__name__}",
            )
        if not isinstance(track_root, bool):
            raise InvalidInput("track_root", f"must be True or False, not {track_root!r}")
        self.machine = machine
        self.log = log
        self._rules: DeliveryRules = delivery_rules(machine)
        bound = log.machine()
        if bound is not None and bound != self._rules.digest:
            raise MachineMismatch(
                f"log {log.name!r} holds events of machine {bound}, but this replica runs "
                f"{self._rules.digest}; a machine change is a migration: replay that log with its machine"
            )
        self._records: dict[str, _Record] = {}
        self._position = 0  # every log position below this is applied
        # Applied events at positions at or above _position, kept until the prefix reaches them.
        self._ahead: dict[int, LoggedEvent] = {}
        # The fingerprint of every event applied at positions _base.. _position - 1 (8 bytes each), so a
        # different event claiming an applied position is refused whenever it arrives.
        self._base = 0
        self._prints = array("q")
        self._last: LoggedEvent | None = None  # the event at _position - 1, when this replica applied it
        self._restored: Checkpoint | None = None
        # The log's event at position _base - 1 when this replica was restored from a checkpoint there: what
        # sync() compares that position with until the replica applies an event of its own.
        self._at_base: LoggedEvent | None = None
        # The lowest position deliver() may have applied from a copy not compared with the log's own event
        # since (None: none): sync() reads the log again from there, so a wrong copy applied first is found
        # when the log's event comes, and checkpoint() waits for that.
        self._unconfirmed: int | None = None
        self._buffer: dict[int, LoggedEvent] = {}
        # How many record_seqs are applied ahead of their record's applied prefix, over every record. Only an
        # event with a forged record_seq leaves one when nothing is applied ahead (`_ahead` empty): the
        # batch paths then deliver one event at a time.
        self._gapped = 0
        self._dep_waiters: dict[int, list[int]] = defaultdict(list)  # position -> buffered positions waiting
        self.applied = 0
        self.duplicates = 0
        self._tree: Any = None
        self._leaves: dict[int, bytes] = {}  # leaves of events applied ahead of the prefix
        if track_root:
            if checkpoint is not None:
                raise ReplicaError("track_root needs every event from position 0: do not pass a checkpoint")
            from bide.audit import MerkleTree  # here: only auditing needs bide

            self._tree = MerkleTree()
        if checkpoint is not None:
            self._restore(checkpoint)

    # -- reading the state --------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Every log position below this has been applied (the folded prefix)."""
        return self._position

    @property
    def pending(self) -> int:
        """How many delivered events wait in the buffer for their turn under the delivery rules."""
        return len(self._buffer)

    def records(self) -> list[str]:
        """The record keys this replica has received events for, sorted."""
        return sorted(self._records)

    def state_id(self, record: str) -> int:
        """The machine state id of `record` (the initial state for a record without events)."""
        entry = self._records.get(record)
        return self._rules.initial if entry is None else entry.state

    def state(self, record: str) -> dict[str, Any]:
        """The state of `record` as `{variable: value}` (bools, enum labels, ints)."""
        return self._rules.decode(self.state_id(record))

    def states(self) -> dict[str, dict[str, Any]]:
        """Every record's state, by record key (sorted)."""
        return {key: self.state(key) for key in self.records()}

    def digest(self) -> str:
        """SHA-256 over the machine digest and every (record, state id), sorted: equal iff equal states."""
        h = hashlib.sha256(f"govern.replica.v1\n{self._rules.digest}\n".encode())
        for key in sorted(self._records):
            state = self._records[key].state
            if state != self._rules.initial:
                h.update(f"{len(key)}:{key}={state}\n".encode())
        return h.hexdigest()

    def root(self) -> str:
        """The RFC 6962 Merkle root (hex) of the log prefix this replica applied, computed from the events
        themselves; equal to `log.root(replica.position)` when the replica folded the log's own events.
        Needs `track_root=True`."""
        if self._tree is None:
            raise ReplicaError(
                "this replica does not track the log's Merkle root; create it with track_root=True"
            )
        return str(self._tree.root().hex())

    def checkpoint(self) -> Checkpoint:
        """The replica's state as a `Checkpoint`; only at a clean prefix (nothing buffered or ahead). It
        names the last event applied, so that it restores only onto a log holding that event there."""
        if self._buffer or self._ahead:
            first, waiting = min([*self._buffer, *self._ahead]), len(self._buffer) + len(self._ahead)
            raise ReplicaError(
                f"a checkpoint needs a clean log prefix, and {waiting} delivered "
                f"event(s) wait to be applied (the first at log position {first}; applied so far: "
                f"{self._position}): call sync() first; an event delivered for a position the log has not "
                "reached (a transport ahead of the log this replica reads) waits until the log holds it"
            )
        self._confirm_delivered()
        last_id = last_leaf = None
        if self._last is not None:
            last_id, last_leaf = self._last.id, _leaf_digest(self._last)
        elif self._restored is not None and self._restored.last_id is not None:
            last_id, last_leaf = self._restored.last_id, self._restored.last_leaf
        elif self._position > 0:
            # Restored from a format-1 checkpoint and nothing applied since: name the log's own event.
            held = self.log.read(self._position - 1, 1)
            if not held:
                raise ReplicaError(
                    f"log {self.log.name!r} no longer holds position {self._position - 1}, which this "
                    "replica folded: rebuild it from scratch with Replica(machine, log)"
                )
            last = held[0]
            rec = self._records.get(last.record)
            if rec is None or rec.applied_prefix != last.record_seq + 1:
                raise ReplicaError(
                    f"the format-1 checkpoint this replica was restored from counts "
                    f"{0 if rec is None else rec.applied_prefix} events of record {last.record!r}, but the "
                    f"log's event at position {last.position} is that record's event {last.record_seq + 1}: "
                    "it was altered; rebuild the replica with Replica(machine, log)"
                )
            last_id, last_leaf = last.id, _leaf_digest(last)
        fields: dict[str, Any] = {
            "format": _FORMAT,
            "machine": self._rules.digest,
            "log": self.log.name,
            "position": self._position,
            "states": {k: r.state for k, r in self._records.items()},
            "record_lengths": {k: r.applied_prefix for k, r in self._records.items()},
            "digest": self.digest(),
            "last_id": last_id,
            "last_leaf": last_leaf,
        }
        return Checkpoint(**fields, seal=_seal_of(fields))

    def _confirm_delivered(self) -> None:
        """Compare what deliver() applied below `position` since the log was last read there with the log's
        own events (`LogCorrupted` for a copy that was not the log's event; `ReplicaError` when the log does
        not hold the position), so that a checkpoint holds only the log's state."""
        start, end = self._unconfirmed, self._position
        if start is None:
            return
        held: list[LoggedEvent] = []
        while start < end:
            held = self.log.read(start, min(end - start, 5000))
            if not held or held[0].position != start:
                raise ReplicaError(
                    f"log {self.log.name!r} does not hold position {start}, which this replica applied from "
                    "an event given to deliver(): a checkpoint holds only what the log holds; call sync() "
                    "once the log has it, or rebuild the replica with Replica(machine, log)"
                )
            self._compare_applied(held)  # nothing is buffered or ahead: every one of them is applied
            start = held[-1].position + 1
        if held and self._last is not None and self._last.position == end - 1:
            self._last = held[-1]  # equal in what applying it does; the log's copy names it in the checkpoint
        self._unconfirmed = None

    # -- feeding ------------------------------------------------------------------------------------------

    def sync(self, *, page: int = 5000) -> int:
        """Apply every event of the log not applied yet, in log order, reading `page` events at a time;
        return how many were applied.

        Positions applied from copies `deliver()` was given are read again and compared with the log's
        own events (`LogCorrupted` when the copy applied was not the log's event)."""
        if isinstance(page, bool) or not isinstance(page, int) or page < 1:
            raise InvalidInput("page", f"must be an integer >= 1 (events read at a time), got {page!r}")
        before = self.applied
        start = self._position if self._unconfirmed is None else min(self._unconfirmed, self._position)
        last: LoggedEvent | None = None
        page = min(page, _MAX_PAGE)
        # Each read takes the event just below `start` too, and compares it with the one applied there (on
        # later pages, the last event of the page before): a log rewound under a live replica (an older
        # backup restored, then appended to), before this sync or between two of its pages, would
        # otherwise be followed from a position whose events are no longer the ones applied, without a word.
        below, seen = start - 1, None
        while True:
            if below >= 0:
                events = self.log.read(below, page + 1)
                self._check_still_held(below, events[0] if events else None, seen)
                del events[0]
            else:
                events = self.log.read(start, page)
            if not events:
                break
            fresh = self._compare_applied(events)
            if fresh:
                self._feed(fresh)
            last = events[-1]
            start = last.position + 1
            if len(events) < page:
                break
            below, seen = last.position, last
        self._refuse_stuck()  # (a buffered copy of the log's next event is compared, not fed again)
        if last is not None and last.position == self._position - 1:
            self._last = last  # the log's own copy names the prefix's end in a checkpoint
        # Every position below `start` was read from the log and compared; a copy deliver() was given at or
        # past it (applied, applied ahead, or buffered, to be applied later) was not.
        self._unconfirmed = start if self._position > start or self._ahead or self._buffer else None
        return self.applied - before

    def _check_still_held(self, pos: int, event: LoggedEvent | None, seen: LoggedEvent | None) -> None:
        """Raise `LogCorrupted` unless `event`, the log's event at `pos` (an applied position), is `seen`
        (the log's event there in this sync's page before), or else the one applied there (below the
        checkpoint this replica was restored from: the log's event there when it was restored)."""
        where = f"log {self.log.name!r} ({self.log._shown_url})"
        rebuild = "rebuild the replica with Replica(machine, log) and sync()"
        if event is None or event.position != pos:
            raise LogCorrupted(
                f"{where} no longer holds position {pos}, which this replica applied: the log was rewound "
                f"under it (an older backup restored) or is another log now; {rebuild}. Nothing more was "
                f"applied (the replica stays at position {self._position})"
            )
        if seen is not None:
            same = event is seen or event == seen
        elif pos >= self._base or self._tree is not None:
            same = self._applied_here(event)
        elif self._at_base is not None and pos == self._base - 1:
            same = event is self._at_base or event == self._at_base
        else:
            return  # (never: a replica restored at a position holds the log's event below it)
        if not same:
            raise LogCorrupted(
                f"{where} holds event {event.id!r} at position {pos}, which is not the event this replica "
                f"applied there: the log was rewound under it (an older backup restored, then appended to) "
                f"or rewritten, so the replica's state is not the log's; {rebuild}. Nothing more was applied "
                f"(the replica stays at position {self._position})"
            )

    def _compare_applied(self, events: list[LoggedEvent]) -> list[LoggedEvent]:
        """Compare the log's `events` at positions this replica applied or holds from copies deliver() was
        given with those copies (the fingerprint or the tree's leaf of the prefix; every field of one
        applied ahead or buffered): one that is not the log's event raises `LogCorrupted`. Return the
        events it has no copy of."""
        position, ahead, buffer = self._position, self._ahead, self._buffer
        if events[0].position >= position and not ahead and not buffer:
            return events  # the common sync: nothing of the page is here yet
        fresh: list[LoggedEvent] = []
        for event in events:
            pos = event.position
            if pos < position:
                if not self._applied_here(event):
                    raise self._not_applied(event)
                continue
            held = ahead.get(pos) or buffer.get(pos)
            if held is None:
                fresh.append(event)
            elif held is not event and held != event:
                where = "applied there (ahead of its prefix)" if pos in ahead else "holds there (not applied)"
                raise LogCorrupted(
                    f"two different events claim log position {pos}: the log's is {event.id!r}, and the copy "
                    f"this replica {where} differs from it in {_differences(held, event)}: rebuild the "
                    "replica with Replica(machine, log) and sync(), and fix what delivered the other copy"
                )
        return fresh

    def deliver(self, events: Iterable[LoggedEvent]) -> int:
        """Accept events in any order (duplicates allowed); apply each once the rules allow; return how many
        were applied by this call (including earlier buffered events this delivery unblocked).

        A run of consecutive log positions starting exactly at `position`, with nothing buffered, is log
        order: every rule holds by construction, and it is folded in one vectorized replay.

        Anything but an iterable of `LoggedEvent`s raises `InvalidInput` naming it, before any event of the
        call is applied or buffered. What is applied is compared with the log's own events by the next
        `sync()`."""
        if type(events) is list:
            batch = events  # the common call, and a list is what it must be
        elif isinstance(events, (str, bytes, Mapping, BaseModel)) or not isinstance(events, Iterable):
            raise InvalidInput(
                "events",
                f"must be a list of govern.LoggedEvent (for one event: deliver([event])), "
                f"not a {type(events).__name__}",
            )
        else:
            batch = list(events)
        if not set(map(type, batch)) <= _EVENT_TYPES:  # one set of types, not a check per event
            for i, item in enumerate(batch):
                if not isinstance(item, LoggedEvent):
                    raise _not_an_event(i, item)
        return self._feed(batch, delivered=True)

    def _note_delivered(self, lowest: int) -> None:
        """Note that positions from `lowest` on (not below `position`) may be applied from copies a caller
        delivered, for the next `sync()` to compare with the log: before any of them is applied."""
        low = max(lowest, self._position)
        if self._unconfirmed is None or low < self._unconfirmed:
            self._unconfirmed = low

    def _feed(self, batch: list[LoggedEvent], *, delivered: bool = False) -> int:
        """`deliver` of a list of `LoggedEvent`s (checked), from a caller (`delivered`) or read from the
        log. The lowest position of a delivered batch is noted before anything is applied, in the pass its
        path makes over the batch anyway: on a large shuffled batch each pass costs a cache miss per event."""
        before = self.applied
        if not batch:
            return 0
        if len(batch) >= _BATCH_MIN and not self._buffer and not self._ahead and not self._gapped:
            start = self._position
            if all(e.position == start + i for i, e in enumerate(batch)):
                if delivered:
                    self._note_delivered(start)
                folded = self._fold_in_order(batch)
            else:
                folded = self._deliver_sorted(batch, delivered)
            if folded:
                self._refuse_stuck()
                return self.applied - before
        if delivered:
            self._note_delivered(min(map(_POSITION, batch)))
        # One event at a time, in delivery order: what every batch path must match exactly.
        buffer = self._buffer
        for event in batch:
            self._accept(event)
            if buffer and self._position in buffer:
                self._refuse_stuck()  # as a call delivering this event alone would
        return self.applied - before

    def _refuse_stuck(self) -> None:
        """Every position before `position` is applied, so the buffered event at `position` waits for
        nothing the log can still bring: its record's numbering contradicts the log, or the checkpoint this
        replica was restored from counted that record's events wrongly. Say so rather than wait forever."""
        event = self._buffer.get(self._position)
        if event is None:
            return
        rec = self._records.get(event.record)
        raise self._misnumbered(event, 0 if rec is None else rec.applied_prefix)

    def _misnumbered(self, event: LoggedEvent, before: int) -> LogCorrupted:
        """The error for `event`, at `position`, whose record number is not the count of its record's
        events applied before it (`before`)."""
        cause = "a copy given to deliver() that is not the log's event, or a damaged log"
        if self._restored is not None:
            cause = (
                f"{cause}, or the checkpoint this replica was restored from counts that record's events "
                "wrongly (it was altered); rebuild the replica with Replica(machine, log)"
            )
        return LogCorrupted(
            f"event {event.id!r} at position {event.position} is number {event.record_seq} of record "
            f"{event.record!r}, but {before} events of that record are applied before it: {cause}; the "
            f"replica stopped after the events before it (position {self._position})"
        )

    def _deliver_sorted(self, batch: list[LoggedEvent], delivered: bool) -> bool:
        """Deliver a batch in any order, with nothing buffered or applied ahead: put it in log order, fold
        the run of consecutive positions from `position` in one vectorized replay, and hand the rest (what
        lies past the first missing position) to the per-event rules, in log order.

        Log order is one of the orders the rules allow (every dependency and every earlier event of a
        record comes first), and which events the rules let apply is the same whatever order a batch is
        examined in (applying an event never makes another one wait), so the outcome is the one
        event-by-event delivery reaches, as long as no event of the batch is refused. Which one is refused,
        and what was applied before it, depends on the delivery order, so this returns False, having
        changed nothing, whenever one event-by-event delivery could refuse one (or count a copy
        differently): an event of another log or machine, an unknown name or a forward dependency; two
        different events at one position; a copy of an applied event that is not the same event; an
        identical pair of copies that differ from the log's event at their position (the second one is
        compared with the log once the first is folded); two events at different positions with one
        record and record_seq, or one with the record_seq of an applied event; a record_seq that does
        not follow its record's in the folded run. The caller then delivers the batch one event at a
        time, in delivery order."""
        rules = self._rules
        name, digest, index = self.log.name, rules.digest, rules.index
        start = self._position
        by_position: dict[int, LoggedEvent] = {}
        duplicates = 0
        # Copies of applied events, and their positions: compared with the log before anything changes.
        copies: list[LoggedEvent] = []
        positions: list[int] = []
        twins: list[int] = []  # positions >= start delivered more than once (identical copies)
        base, prints = self._base, self._prints
        for event in batch:
            after = event.after
            if event.log != name or event.machine != digest or event.event not in index:
                return False
            if after and max(after) >= event.position:  # _forward(event), inline: once per event
                return False
            pos = event.position
            if pos < start:
                if pos >= base and prints[pos - base] != _fingerprint(event, index[event.event]):
                    return False
                copies.append(event)
                positions.append(pos)
                continue
            held = by_position.get(pos)
            if held is None:
                by_position[pos] = event
            elif held is event or held == event:
                duplicates += 1
                twins.append(pos)
            else:
                return False
        below = bool(copies)  # a copy below `start`: the lowest position delivered counts as `start`
        if twins and self._tree is None:
            # One at a time, a copy that arrives after the first is folded is compared with the log's event
            # (a replica tracking the root compares it with the leaf of the first: equal).
            for pos in twins:
                copies.append(by_position[pos])
                positions.append(pos)
            if self._unlike_applied(copies, positions) is not None:
                return False
        elif copies and self._unlike_applied(copies, positions) is not None:
            return False
        duplicates += len(copies) - (len(twins) if self._tree is None else 0)
        ordered = sorted(by_position)
        run = 0
        for pos in ordered:  # positions are distinct and >= start: the run ends at the first gap
            if pos != start + run:
                break
            run += 1
        events = [by_position[p] for p in ordered[:run]]
        plan = self._fold_plan(events) if run else None
        if run and plan is None:
            return False  # a record_seq out of its record's order in the run
        rest = [by_position[p] for p in ordered[run:]]
        if rest and not self._distinct_numbers(rest, plan):
            return False
        self.duplicates += duplicates
        if delivered:
            self._note_delivered(start if below or not ordered else ordered[0])
        if plan is not None:
            self._fold_commit(events, plan)
        for event in rest:
            self._accept(event)  # past the run's gap: nothing here is refused (checked above)
        return True

    def _distinct_numbers(self, rest: list[LoggedEvent], plan: _FoldPlan | None) -> bool:
        """True when no event of `rest` has the record and record_seq of another one, of an event folded
        in `plan`, or of an applied event (below its record's applied prefix: nothing is applied ahead)."""
        folded = {} if plan is None else dict(zip(plan.names, plan.counts.tolist(), strict=True))
        records = self._records
        seen: set[tuple[str, int]] = set()
        for event in rest:
            key, seq = event.record, event.record_seq
            entry = records.get(key)
            if seq < (0 if entry is None else entry.applied_prefix) + folded.get(key, 0):
                return False
            number = (key, seq)
            if number in seen:
                return False
            seen.add(number)
        return True

    def _fold_in_order(self, events: list[LoggedEvent]) -> bool:
        """Fold consecutive log events from `position` in one vectorized replay; False, having changed
        nothing, when one of them is not of this log, machine and event names, depends on a later
        position, or has a record_seq other than its record's next one (the caller then delivers them one
        at a time, which applies every event before that one and refuses it)."""
        rules = self._rules
        name = self.log.name
        for e in events:
            if (
                e.machine != rules.digest
                or e.event not in rules.index
                or e.log != name
                or (e.after and max(e.after) >= e.position)  # _forward(e), inline
            ):
                return False
        plan = self._fold_plan(events)
        if plan is None:
            return False
        self._fold_commit(events, plan)
        return True

    def _fold_plan(self, events: list[LoggedEvent]) -> _FoldPlan | None:
        """Group consecutive log events from `position` (each of this log, machine and event names) by
        record with numpy, for `_fold_commit`; None when an event's record_seq is not its record's next
        one. Changes nothing."""
        rules = self._rules
        n = len(events)
        keys: dict[str, int] = {}
        rec = np.fromiter((keys.setdefault(e.record, len(keys)) for e in events), dtype=np.int64, count=n)
        codes_flat = np.fromiter((rules.index[e.event] for e in events), dtype=np.int32, count=n)
        seqs = np.fromiter((e.record_seq for e in events), dtype=np.int64, count=n)
        names = list(keys)
        known = [self._records.get(k) for k in names]
        first_seq = np.array([0 if r is None else r.applied_prefix for r in known], dtype=np.int64)
        order = np.argsort(rec, kind="stable")
        counts = np.bincount(rec, minlength=len(names))
        grouped = rec[order]
        column = np.arange(n, dtype=np.int64) - (np.cumsum(counts) - counts)[grouped]
        if np.any(seqs[order] != first_seq[grouped] + column):
            return None
        return _FoldPlan(names, known, rec, codes_flat, seqs, order, counts, grouped, column)

    def _fold_commit(self, events: list[LoggedEvent], plan: _FoldPlan) -> None:
        """Run the vectorized replay `plan` groups (`Machine.replay_ids`, every record's stream at once)
        and apply its outcome."""
        rules = self._rules
        names, known, counts = plan.names, plan.known, plan.counts
        n = len(events)
        # Python ints: a machine built by components has ids beyond 32 (and 64) bits.
        starts = [rules.initial if r is None else r.state for r in known]
        codes = np.full((len(names), int(counts.max())), -1, dtype=np.int32)
        codes[plan.grouped, plan.column] = plan.codes[plan.order]
        finals = self.machine.replay_ids(codes, starts).tolist()
        for i, key in enumerate(names):
            entry = known[i]
            if entry is None:
                self._records[key] = _Record(finals[i], int(counts[i]))
            else:
                entry.state = finals[i]
                entry.applied_prefix += int(counts[i])
        if self._tree is not None:
            for event in events:
                self._tree.append(event.leaf())
        self._prints.frombytes(_fingerprints(events, names, plan.rec, plan.codes, plan.seqs))
        self._last = events[-1]
        self._position += n
        self.applied += n

    def _check(self, event: LoggedEvent) -> None:
        rules = self._rules
        stop = (
            f"; the replica applied what came before it and stops here (position {self._position}, "
            f"{self.pending} buffered): nothing after it is applied until it is resolved"
        )
        if event.log != self.log.name:
            raise ReplicaError(
                f"event {event.id!r} is from log {event.log!r}, but this replica folds log "
                f"{self.log.name!r}{stop}",
                event,
            )
        if event.machine != rules.digest:
            raise MachineMismatch(
                f"event {event.id!r} is for machine {event.machine}, this replica runs {rules.digest}{stop}"
            )
        if event.event not in rules.index:
            raise ReplicaError(
                f"event {event.id!r} at log position {event.position} names {event.event!r}, which machine "
                f"{rules.name!r} does not have (its events: {', '.join(rules.names)}){stop}",
                event,
            )
        if _forward(event):
            late = [p for p in event.after if p >= event.position]
            shown = f"position {late[0]} is" if len(late) == 1 else f"positions {late} are"
            raise LogCorrupted(
                f"event {event.id!r} at log position {event.position} depends on positions "
                f"{list(event.after)}, but {shown} at or after its own: a dependency must lie before its "
                "event, so it would wait forever (a damaged log, or a copy given to deliver() that is not "
                f"the log's event){stop}"
            )

    def _unlike_applied(self, copies: list[LoggedEvent], positions: list[int]) -> LogCorrupted | None:
        """The error for the first of `copies` (of events applied in the folded prefix, at `positions`,
        their fingerprints equal to the applied ones) that is not the event applied at its position, or
        None when each one is.

        A replica tracking the root compares every field with the tree's leaf of that position. Others
        compare every field with the log's event at that position, read on the duplicate path only: in
        one read of the range the copies span when they are dense in it (a redelivered window), else in
        one read of their ids and one of each position whose id the log holds elsewhere or not at all. A
        position the log does not hold (a replica fed events its log never had) leaves the fingerprint as
        all there was to compare."""
        tree = self._tree
        if tree is not None:
            from bide.audit import leaf_hash  # here: only auditing needs bide

            for copy in copies:
                if tree.leaf(copy.position) != leaf_hash(copy.leaf()):
                    return self._not_applied(copy)
            return None
        low, high = min(positions), max(positions)
        if high - low < 2 * len(positions) + 64:  # reading the range costs little more than the copies
            held = self.log.read(low, high - low + 1)
            logged = [held[p - low] if p - low < len(held) else None for p in positions]
        else:
            found = {e.position: e for e in self.log._stored(list(map(_ID, copies))).values()}
            for pos in set(positions) - found.keys():
                found.update((e.position, e) for e in self.log.read(pos, 1))
            logged = [found.get(p) for p in positions]
        for copy, other in zip(copies, logged, strict=True):
            if other is not None and other is not copy and other != copy:
                return self._conflict(copy, other, "the log's event there", True)
        return None

    def _not_applied(self, event: LoggedEvent) -> LogCorrupted:
        """The error for a copy that differs from the event applied at its position, of which the replica
        kept a fingerprint (and the tree's leaf, tracking the root): the log's event there tells which of
        the two is not the log's, and names the differences when it is the one applied."""
        pos = event.position
        stays = f"Nothing was applied from this copy (the replica stays at position {self._position})"
        try:
            held = self.log.read(pos, 1)
        except EventLogError:
            held = []
        logged = held[0] if held and held[0].position == pos else None
        if logged is not None and self._applied_here(logged):
            return self._conflict(event, logged, "the event this replica applied there, the log's", True)
        if logged is not None and (logged is event or logged == event):
            # The replica kept only a fingerprint of what it applied: that event's id is not known here.
            return LogCorrupted(
                f"two different events claim log position {pos}: the log's event {event.id!r}, and the one "
                "this replica applied there, which differs from it (forged, damaged, or rewritten in "
                "transit), so the replica's state is not the log's: rebuild it with Replica(machine, log) "
                f"and sync(), and fix what delivered the other event. {stays}"
            )
        kept = "any field" if self._tree is not None else "its id, record, event or record_seq"
        return LogCorrupted(
            f"two different events claim log position {pos}: the replica applied one there, and this copy "
            f"of {event.id!r} differs from it in {kept}; compare both with the log's (log.read({pos}, 1)) "
            f"and fix what delivered the wrong one. {stays}"
        )

    def _applied_here(self, event: LoggedEvent) -> bool:
        """True when what the replica kept of the event applied at `event.position` matches `event`."""
        pos = event.position
        if self._tree is not None:
            from bide.audit import leaf_hash

            return bool(self._tree.leaf(pos) == leaf_hash(event.leaf()))
        code = self._rules.index.get(event.event)
        return (
            code is not None
            and pos >= self._base
            and _fingerprint(event, code) == self._prints[pos - self._base]
        )

    def _conflict(self, event: LoggedEvent, other: LoggedEvent, where: str, logs: bool) -> LogCorrupted:
        """The error for `event`, a copy at a position where `other` (described by `where`; `logs`: it is
        the log's own event) differs."""
        pos = event.position
        stays = f"Nothing was applied from this copy (the replica stays at position {self._position})"
        if event.id != other.id:
            return LogCorrupted(
                f"two different events claim log position {pos}: {other.id!r} and {event.id!r}. {stays}"
            )
        if logs:
            which = (
                "this copy is not the log's event (forged, damaged, or rewritten in transit): fix what "
                "delivered it"
            )
        else:
            which = (
                "so one of them is not the log's event (forged, damaged, or rewritten in transit): compare "
                f"both with log.get({event.id!r}) and fix what delivered the wrong one"
            )
        return LogCorrupted(
            f"two different copies of event {event.id!r} claim log position {pos}: this one differs from "
            f"{where} in {_differences(event, other)}. An event id names one event forever: {which}. {stays}"
        )

    def _accept(self, event: LoggedEvent) -> None:
        rules = self._rules
        self._check(event)
        pos = event.position
        if pos < self._position or pos in self._ahead:
            ahead = self._ahead.get(pos)
            if ahead is not None:
                if ahead is not event and ahead != event:
                    raise self._conflict(event, ahead, "the event this replica applied there", False)
            else:
                if pos >= self._base and self._prints[pos - self._base] != _fingerprint(
                    event, rules.index[event.event]
                ):
                    raise self._not_applied(event)
                error = self._unlike_applied([event], [pos])
                if error is not None:
                    raise error
            self.duplicates += 1
            return
        held = self._buffer.get(pos)
        if held is not None:
            if held is not event and held != event:
                raise self._conflict(
                    event, held, "the event this replica holds there, not applied yet", False
                )
            self.duplicates += 1
            return
        if not self._buffer and pos == self._position and self._in_record_order(event):
            # The common case (log order): nothing can be waiting, so apply directly. (Its record_seq is
            # the record's next one, which nothing buffered or applied ahead can hold.)
            self._apply(event)
            return
        known = self._records.get(event.record)
        if known is not None and known.arrived(event.record_seq):
            raise LogCorrupted(
                f"event {event.id!r} at log position {pos} is number {event.record_seq} of record "
                f"{event.record!r}, but an event at another position has that number (the replica stays at "
                f"position {self._position})"
            )
        if pos == self._position:
            # Every earlier position is applied, so every earlier event of its record is: it must be the
            # record's next number (a number from the future would wait for events the log cannot hold).
            before = 0 if known is None else known.applied_prefix
            if event.record_seq != before:
                raise self._misnumbered(event, before)
        self._buffer[pos] = event
        rec = self._record(event.record)
        code = rules.index[event.event]
        rec.known[event.record_seq] = code
        heapq.heappush(rec.unapplied.setdefault(code, []), event.record_seq)
        work = [pos]
        # The arrival may close the record's first gap: events waiting for it get checked again.
        rec.advance_frontier()
        while rec.gap_waiters and rec.gap_waiters[0][0] < rec.frontier:
            work.append(heapq.heappop(rec.gap_waiters)[1])
        self._drain(work)

    def _in_record_order(self, event: LoggedEvent) -> bool:
        rec = self._records.get(event.record)
        return event.record_seq == (0 if rec is None else rec.applied_prefix) and all(
            self._is_applied(p) for p in event.after
        )

    def _record(self, key: str) -> _Record:
        rec = self._records.get(key)
        if rec is None:
            rec = self._records[key] = _Record(self._rules.initial)
        return rec

    def _is_applied(self, pos: int) -> bool:
        return pos < self._position or pos in self._ahead

    def _ready(self, event: LoggedEvent) -> bool:
        """True when the rules let `event` apply now; otherwise it is filed under the one thing it waits
        for (a dependency, the arrival of an earlier event of its record, or the application of one), so
        that only that thing's arrival or application checks it again."""
        pos = event.position
        for dep in event.after:
            if not self._is_applied(dep):
                self._dep_waiters[dep].append(pos)
                return False
        partners = self._rules.partners[self._rules.index[event.event]]
        if not partners:
            return True
        rec = self._record(event.record)
        seq = event.record_seq
        rec.advance_frontier()
        if rec.frontier < seq:
            heapq.heappush(rec.gap_waiters, (seq, pos))  # an earlier event of the record is unseen
            return False
        for partner in partners:
            heap = rec.unapplied.get(partner)
            while heap and rec.known.get(heap[0]) != partner:
                heapq.heappop(heap)  # applied since it was filed
            if heap and heap[0] < seq:
                rec.seq_waiters.setdefault(heap[0], []).append(pos)  # an earlier partner must go first
                return False
        return True

    def _drain(self, work: list[int]) -> None:
        """Check the buffered events at `work` (positions), applying each that is ready and checking
        again, in log order, whatever its application wakes."""
        heapq.heapify(work)
        while work:
            pos = heapq.heappop(work)
            event = self._buffer.get(pos)
            if event is None or not self._ready(event):
                continue
            del self._buffer[pos]
            self._apply(event)
            for waiter in self._dep_waiters.pop(pos, ()):
                heapq.heappush(work, waiter)
            for waiter in self._records[event.record].seq_waiters.pop(event.record_seq, ()):
                heapq.heappush(work, waiter)

    def _apply(self, event: LoggedEvent) -> None:
        record, seq = event.record, event.record_seq
        rec = self._record(record)
        code = self._rules.index[event.event]
        rec.state = self._rules.step(rec.state, code)
        if rec.known.pop(seq, None) is not None:
            heap = rec.unapplied[code]
            while heap and rec.known.get(heap[0]) != code:
                heapq.heappop(heap)  # keep the heaps as small as what is still buffered
        if seq == rec.applied_prefix:
            rec.applied_prefix += 1
            while rec.applied_prefix in rec.ahead:
                rec.ahead.discard(rec.applied_prefix)
                self._gapped -= 1
                rec.applied_prefix += 1
        else:
            rec.ahead.add(seq)
            self._gapped += 1
        tree = self._tree
        if event.position == self._position:
            if tree is not None:
                tree.append(event.leaf())
            self._prints.append(_mix(hash(event.id), hash(record), code, seq))  # _fingerprint, inline
            self._last = event
            self._position += 1
            while self._position in self._ahead:
                self._last = self._ahead.pop(self._position)
                self._prints.append(_fingerprint(self._last, self._rules.index[self._last.event]))
                if tree is not None:
                    tree.append(self._leaves.pop(self._position))
                self._position += 1
        else:
            self._ahead[event.position] = event
            if tree is not None:
                self._leaves[event.position] = event.leaf()
        self.applied += 1

    def _restore(self, checkpoint: Checkpoint) -> None:
        if checkpoint.seal is not None and checkpoint.seal != checkpoint.expected_seal():
            raise ReplicaError(
                "checkpoint seal does not match its contents: the checkpoint was altered or damaged; "
                "rebuild the replica from scratch with Replica(machine, log)"
            )
        if checkpoint.machine != self._rules.digest:
            raise MachineMismatch(
                f"checkpoint is for machine {checkpoint.machine}, this replica runs {self._rules.digest}"
            )
        if checkpoint.log != self.log.name:
            raise ReplicaError(f"checkpoint is of log {checkpoint.log!r}, not {self.log.name!r}")
        self._check_log(checkpoint)
        for key, state in checkpoint.states.items():
            try:
                self._rules.decode(state)
            except ForeignState as exc:
                raise ReplicaError(
                    f"checkpoint puts record {key!r} in state {state}, which is not a state of the machine: "
                    f"the checkpoint was altered ({exc})"
                ) from exc
            if not self.machine.in_domain(state):
                # The guarantees start from D only, and a replica only ever holds normal forms.
                raise ReplicaError(
                    f"checkpoint puts record {key!r} in state {state}, which is not in the machine's "
                    f"checked domain ({self.machine.domain} states): the checkpoint was altered"
                )
            self._records[key] = _Record(state, checkpoint.record_lengths.get(key, 0))
        self._position = self._base = checkpoint.position
        self._restored = checkpoint
        if self.digest() != checkpoint.digest:
            raise ReplicaError("checkpoint digest does not match its states: the checkpoint was altered")

    def _check_log(self, checkpoint: Checkpoint) -> None:
        """Refuse a checkpoint the log cannot continue: one past the log's end (a log restored from an
        older backup, or another log), or one whose last event is not the log's event at that position."""
        length = self.log.length()
        where = f"log {self.log.name!r} ({self.log._shown_url})"
        if checkpoint.position > length:
            raise ReplicaError(
                f"checkpoint is at position {checkpoint.position}, but {where} holds only {length} events: "
                "it is of another log or of a later state of this one (a log restored from an older backup); "
                "rebuild the replica from scratch with Replica(machine, log)"
            )
        if checkpoint.position == 0:
            return
        held = self.log.read(checkpoint.position - 1, 1)
        if checkpoint.last_id is None:  # format 1, which does not name its last event: the log's is kept
            self._at_base = held[0] if held else None
            return
        if not held or held[0].id != checkpoint.last_id or _leaf_digest(held[0]) != checkpoint.last_leaf:
            if not held:
                found = "no event"
            elif held[0].id == checkpoint.last_id:
                found = "an event of that id but other content"
            else:
                found = f"event {held[0].id!r}"
            raise ReplicaError(
                f"checkpoint was taken after event {checkpoint.last_id!r} at position "
                f"{checkpoint.position - 1}, but {where} holds {found} there: the checkpoint is of another "
                "log; rebuild the replica from scratch with Replica(machine, log)"
            )
        last = self._at_base = held[0]
        if checkpoint.record_lengths.get(last.record) != last.record_seq + 1:
            # Caught here for the unsealed format 2: its digest covers the states only.
            raise ReplicaError(
                f"checkpoint counts {checkpoint.record_lengths.get(last.record, 0)} events of record "
                f"{last.record!r}, but its last event is that record's event {last.record_seq + 1}: the "
                "checkpoint was altered; rebuild the replica from scratch with Replica(machine, log)"
            )


# The most events one read of sync() asks for (a larger `page` is read this many at a time): its read of
# `page + 1` events must stay below the log's own bound.
_MAX_PAGE = 2**40


def _forward(event: LoggedEvent) -> bool:
    """True when the event depends on its own position or a later one: it could never apply."""
    return bool(event.after) and max(event.after) >= event.position


def fold(machine: Machine, events: Iterable[LoggedEvent]) -> Mapping[str, int]:
    """Fold events strictly in the given order (no rules, no buffering): what a replica must match."""
    rules = delivery_rules(machine)
    states: dict[str, int] = {}
    for event in events:
        states[event.record] = rules.step(states.get(event.record, rules.initial), rules.index[event.event])
    return states
