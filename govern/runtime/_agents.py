"""Agents as producers: a governed event as a bide tool.

`event_tool(machine, log, "ship")` is a tool whose only effect is to append the event `ship` for one
record to the shared log. Its event id is derived from the run id and the call id, so a retry of the same
call after a crash (bide re-runs Idempotent tools) appends nothing new: the tool is idempotent by
construction and never needs to halt. It answers the model with the consequence: the record's state right
after the event in the log order, and whether the event applied, was a no-op (its guard did not hold), or
was compensated (an invariant's repair changed the outcome).

Once the append has committed, the call succeeds: the model is never told "failed" about an event that is
in the log (it would retry, and a non-idempotent event would be recorded twice). If the record's history
cannot be read afterwards, the result says the event is recorded and that its consequence is not known.
An append whose outcome is uncertain (the connection dropped at commit) is resolved by reading the event
id back; if that fails too (the log stayed down), the call raises `bide.CallInDoubt`: nothing is journaled,
the drive stops, and the next drive calls again with the same event id.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from .._errors import DeclarationError, UnknownEvent
from ..machine._machine import Machine
from ..model._families import EventFamily
from ._eventlog import (
    Event,
    EventConflict,
    EventLog,
    EventLogError,
    InvalidInput,
    LogCorrupted,
    LoggedEvent,
    LogTimeout,
    MachineMismatch,
    MissingDependency,
)
from ._rules import DeliveryRules, delivery_rules

if TYPE_CHECKING:
    import bide

__all__ = ["event_id_for", "event_tool"]


def event_id_for(run_id: str, call_id: str, event: str, record: str) -> str:
    """The id of the event a tool call appends: stable across every retry of that call."""
    text = "\0".join(("govern.event.v1", run_id, call_id, event, record))
    return "ev-" + hashlib.sha256(text.encode()).hexdigest()[:40]


_PRODUCER_MAX = 200  # a log name's limit (Event's producer); bide takes run ids up to 256 characters


def producer_for(run_id: str) -> str:
    """The producer a run's events are appended under when `event_tool` is given none: the run id itself,
    or, for one longer than a producer name may be, its first 120 characters and the SHA-256 of the whole
    id (stable across drives, and distinct for distinct ids)."""
    if len(run_id) <= _PRODUCER_MAX:
        return run_id
    return f"{run_id[:120]}~{hashlib.sha256(run_id.encode()).hexdigest()}"


def _param_field(i: int) -> str:
    """The field of a family's i-th parameter in a tool's argument model (its alias: the parameter's name)."""
    return f"param_{i}"


def _arguments(tool_name: str, takes_record: bool, family: EventFamily | None) -> type[BaseModel]:
    """The tool's argument model: the record key (unless fixed) and a family's parameters, each limited
    to its declared values so a model cannot ask for an instance the machine was not verified with.

    A value matches only one of its own type: `Literal` alone matches by equality, so `true` or `1.0`
    would pass for 1, and 1 for true."""
    # Local imports: only the argument models of families need them.
    from typing import Annotated

    from pydantic import BeforeValidator

    def exact(values: tuple[Any, ...]) -> BeforeValidator:
        def check(value: object) -> object:
            if not any(type(value) is type(v) and value == v for v in values):
                raise ValueError(
                    f"must be exactly one of {list(values)}, not {value!r} ({type(value).__name__})"
                )
            return value

        return BeforeValidator(check)

    fields: dict[str, Any] = {}
    if takes_record:
        fields["record"] = (
            str,
            Field(min_length=1, max_length=200, description="the key of the shared record"),
        )
    for i, param in enumerate(family.params if family is not None else ()):
        if takes_record and param.name == "record":
            raise DeclarationError(
                f"event family {family.name if family else ''!r} has a parameter named 'record', which is "
                "the tool's own argument for the record key: rename the parameter, or give event_tool a "
                "fixed record (record='KEY')"
            )
        values = tuple(param.values)
        # Named by position, the parameter's own name its alias: a name pydantic reserves (model_config,
        # model_dump, _x, __class__) would otherwise be taken as configuration or refused.
        fields[_param_field(i)] = (
            Annotated[Literal[values], exact(values)],
            Field(
                alias=param.name,
                description=f"{param.name} of {family.name if family else ''}: one of {list(values)}",
            ),
        )
    model: type[BaseModel] = create_model(
        f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    return model


def event_tool(
    machine: Machine,
    log: EventLog,
    event: str,
    *,
    name: str | None = None,
    description: str | None = None,
    record: str | None = None,
    producer: str | None = None,
) -> bide.Tool:
    """A bide tool (safety Idempotent) that appends `event` to `log` and tells the model what it did.

    With `record=None` (the default) the model passes the record key as the argument ``record`` (for
    example an order id); with `record="order-7"` the tool always acts on that record and takes no
    arguments. `producer` names the producer in the log (default: the run id, shortened with its hash
    when it is longer than a producer name's 200 characters: `producer_for`). Each event depends
    causally on the producer's previous event, so replicas apply one agent's events in its own order.
    """
    import bide  # here, not at the top: `import govern` must not pull in the agent runtime
    from bide._deadline import ended_by_deadline

    rules = delivery_rules(machine)
    family = machine.families.get(event) if event not in rules.index else None
    if event not in rules.index and family is None:
        known = ", ".join(rules.names)
        raise UnknownEvent(f"machine {rules.name!r} has no event {event!r}; its events are {known}")
    log.bind(machine)
    folded = _folded_records(log, rules.digest)
    tool_name = name or event
    what = description or (
        f"Record the event {event!r} on a shared {rules.name} record. The result is the record's state "
        "right after the event, and whether the event applied, was a no-op or was compensated."
    )
    arguments = _arguments(tool_name, record is None, family)
    in_memory = log.in_memory  # a log keeps its backend
    # The tool's timeout is set so that it need not end a call whose append may still commit: each log call
    # ends within twice the log's timeout (its retries stop at the timeout; the last try may run that long
    # again), and a call makes at most five (the producer's last event, the append, reading it back and,
    # after a failure the commit may have followed, who wrote it, the record's history). A timeout that
    # ends one all the same (lowered, or a process frozen past it) leaves the call in doubt, never failed:
    # see effect_async.
    per_log_call = 2 * log.timeout
    timeout = _LOG_CALLS * per_log_call + _SLACK

    def effect(validated: BaseModel) -> dict[str, Any]:
        ctx = bide.current_call()
        key = record if record is not None else str(validated.record)  # type: ignore[attr-defined]
        who = producer or producer_for(ctx.run_id)
        instance = event
        if family is not None:
            instance = family.instance(
                {p.name: getattr(validated, _param_field(i)) for i, p in enumerate(family.params)}
            )
        event_id = event_id_for(ctx.run_id, ctx.call_id, instance, key)
        # No read of the id first: a retry of a call whose event is already in the log is refused as a
        # conflict (its producer's last event is now the event itself, so the dependency differs) and
        # resolved by reading the id back, like a concurrent retry. A first call saves a read.
        # Nothing tells this drive whether an earlier one (killed after its append, or paused inside it and
        # still able to commit) already put this call's event in the log: no failure before the append may
        # reach the model as "failed", and the call never ends without appending its event id.
        try:
            previous = log.last_by_producer(who)
        except EventLogError as exc:
            try:
                stored = _read_back(log, event_id, exc)
            except _InDoubt as doubt:
                raise bide.CallInDoubt(str(doubt)) from exc
            return _consequence(rules, log, stored, False, folded)  # an earlier drive appended it
        writer = log._new_writer()
        try:
            [appended] = log._append_items(
                [Event(
                    id=event_id,
                    machine=rules.digest,
                    record=key,
                    event=instance,
                    producer=who,
                    deps=() if previous is None else (previous.id,),
                )],
                writer,
            )
        except (InvalidInput, MachineMismatch, MissingDependency, LogCorrupted):
            raise  # refused: nothing was appended
        except EventLogError as exc:
            # EventConflict: this call's event is already in the log (a retry, or a concurrent retry
            # won). Any other failure may have come after the commit landed. Either way the log knows:
            # read the id back. Found after another failure, it was written by this append if it carries
            # this append's token, else by an earlier drive of this call.
            try:
                stored = _read_back(log, event_id, exc)
            except _InDoubt as doubt:
                # The model must not be told the call failed (it would call again, as a new call with a
                # new event id): the drive stops, and the next one calls again with this event id.
                raise bide.CallInDoubt(str(doubt)) from exc
            created = not isinstance(exc, EventConflict) and _wrote(log, writer, stored)
        else:
            stored, created = appended.event, appended.created
        # The event is in the log: from here on the call has succeeded, whatever a read does.
        return _consequence(rules, log, stored, created, folded)

    async def effect_async(validated: BaseModel) -> dict[str, Any]:
        # A database log blocks on I/O: run it in a worker thread (the call context travels with it). A
        # memory log answers in microseconds, so the thread hop would cost more than the work.
        if in_memory:
            return effect(validated)
        limit = made.timeout  # bide's timeout for this call (it may be changed for later calls)
        try:
            return await asyncio.to_thread(effect, validated)
        except asyncio.CancelledError as exc:
            if not ended_by_deadline(exc):
                raise  # the drive was cancelled: nothing is journaled, and the next drive calls again
            # bide's timeout ended the call (lowered, or the process was frozen past it) while the thread,
            # which nothing can stop, may be appending or have appended the event: telling the model the
            # call failed would have it call again, and record a second event. In doubt instead: the next
            # drive calls again with this event id, which the log appends at most once.
            hint = (
                f" (this tool's timeout, {limit:g} s, is below the {timeout:g} s the log may take)"
                if limit < timeout
                else ""
            )
            raise bide.CallInDoubt(
                f"the tool's timeout ended the call of {tool_name!r} while its append to the log may still "
                f"commit{hint}: the next drive of the run calls again with the same event id, which appends "
                "it at most once"
            ) from None

    made = bide.Tool(
        name=tool_name,
        description=what,
        args=arguments,
        fn=effect_async,
        safety=bide.Idempotent,
        timeout=timeout,
    )
    return made


_LOG_CALLS = 5  # the most log calls one tool call makes (see event_tool)
_FOLDED_RECORDS = 4096  # records whose folded state a tool keeps (see _FoldedRecords)
_FOLD_KEPT_FROM = 8  # events a record's history holds before its folded state is kept
_SLACK = 5.0  # seconds for the rest of the call (a worker thread to start, the result to encode)


class _InDoubt(EventLogError):
    """An append whose outcome the log could not tell, even by reading the event back."""


def _read_back(log: EventLog, event_id: str, failure: EventLogError) -> LoggedEvent:
    """The event with `event_id` after an append that raised `failure`: stored, or `failure` re-raised
    (`_InDoubt` when it cannot be read back either, or when it is not there but `failure` was a wait that
    timed out: another session, maybe an earlier drive of this call, may still commit it)."""
    try:
        stored = log.get(event_id)
    except EventLogError as exc:
        raise _InDoubt(
            f"{failure}; reading event {event_id!r} back failed too ({exc}), so it may or may not be in "
            "the log: the next drive of the run calls again with the same event id, which appends it at "
            "most once"
        ) from failure
    if stored is None:
        if isinstance(failure, LogTimeout):
            # This call's append wrote nothing, but the session holding the lock it waited for may be an
            # earlier drive of this same call (paused past its lease, say), whose append of this event id
            # can still commit: telling the model the call failed would have it call again as a new call.
            raise _InDoubt(
                f"{failure}; event {event_id!r} is not in the log, but the session that held the log may be "
                "an earlier drive of this call whose append can still commit: the next drive of the run "
                "calls again with the same event id, which appends it at most once"
            ) from failure
        raise failure
    return stored


def _wrote(log: EventLog, writer: str, stored: LoggedEvent) -> bool:
    """Whether the append of token `writer` wrote `stored` (read back after it failed). When the log cannot
    tell now, True: the event is this call's own, and the read just before it succeeded."""
    try:
        return log._wrote(writer, stored.id)
    except EventLogError:
        return True


def _consequence(
    rules: DeliveryRules, log: EventLog, event: LoggedEvent, created: bool, folded: _FoldedRecords
) -> dict[str, Any]:
    state_after: dict[str, Any] | None
    try:
        state = _state_before(rules, log, event, folded)
    except EventLogError as exc:
        kind, state_after = "recorded", None
        why = (
            f"{event.event} is recorded at log position {event.position}, but the record's history could not "
            f"be read to tell its effect ({exc}); read the record again later instead of repeating the event"
        )
    else:
        outcome = rules.explain(state, rules.index[event.event])
        kind, why, state_after = outcome.kind, outcome.why, rules.decode(outcome.after)
    return {
        "event": event.event,
        "event_id": event.id,
        "record": event.record,
        "position": event.position,
        "outcome": kind,
        "why": why,
        "state": state_after,
        "newly_recorded": created,
    }


def _state_before(rules: DeliveryRules, log: EventLog, event: LoggedEvent, folded: _FoldedRecords) -> int:
    """The state of `event`'s record just before it, in log order: its earlier events folded, on from the
    state `folded` kept of its first ones when it kept one (only the events after them are read). Then
    `folded` keeps the state after `event`."""
    kept = folded.get(event.record)
    if kept is not None and kept.count <= event.record_seq:
        # Read from the last event kept, to see it still stands where it stood, as it was (a log restored
        # from a backup or edited under this handle holds another event there): else the record is folded
        # from its start.
        history = log.read_record(event.record, through=event.position, start=kept.count - 1)
        if history and history[0] == kept.last:
            return _fold(rules, kept.state, history[1:], event, folded)
    return _fold(rules, rules.initial, log.read_record(event.record, through=event.position), event, folded)


def _fold(
    rules: DeliveryRules, state: int, history: list[LoggedEvent], event: LoggedEvent, folded: _FoldedRecords
) -> int:
    """`state` after the events of `history` before its last, which is `event`; `folded` keeps the state
    after `event` too."""
    if not history or history[-1].id != event.id:
        raise LogCorrupted(f"the log does not hold event {event.id!r} at position {event.position} any more")
    index = rules.index
    for earlier in history[:-1]:
        code = index.get(earlier.event)
        if code is None:
            raise LogCorrupted(f"event {earlier.id!r} at position {earlier.position} names {earlier.event!r}")
        state = rules.step(state, code)
    if event.record_seq + 1 >= _FOLD_KEPT_FROM:  # a short history costs less to read than to keep
        after = rules.step(state, index[event.event])
        folded.keep(event.record, _Folded(event.record_seq + 1, history[-1], after))
    return state


@dataclass(frozen=True)
class _Folded:
    """A record's first `count` events folded: the last of them, and the state after them."""

    count: int
    last: LoggedEvent
    state: int


class _FoldedRecords:
    """The state the event tools of one log handle and machine folded of each record lately, so that the
    next call on a record reads only the events after: a hot record's history grows by every call, and
    reading it whole each time made each call slower than the last (3 s a call at 100,000 events on
    SQLite). At most `_FOLDED_RECORDS` records, the least lately used dropped; shared by the tools' calls
    on all threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: OrderedDict[str, _Folded] = OrderedDict()

    def get(self, record: str) -> _Folded | None:
        with self._lock:
            kept = self._records.get(record)
            if kept is not None:
                self._records.move_to_end(record)
            return kept

    def keep(self, record: str, folded: _Folded) -> None:
        with self._lock:
            kept = self._records.get(record)
            if kept is not None and kept.count >= folded.count:
                return  # a later call on another thread folded further
            self._records[record] = folded
            self._records.move_to_end(record)
            if len(self._records) > _FOLDED_RECORDS:
                self._records.popitem(last=False)


# The folded records of each log handle, by machine digest (equal digests: the same states), for as long as
# the handle lives.
_FOLDED: weakref.WeakKeyDictionary[EventLog, dict[str, _FoldedRecords]] = weakref.WeakKeyDictionary()
_FOLDED_LOCK = threading.Lock()


def _folded_records(log: EventLog, digest: str) -> _FoldedRecords:
    """The folded records the event tools of `log` and the machine `digest` share."""
    with _FOLDED_LOCK:
        return _FOLDED.setdefault(log, {}).setdefault(digest, _FoldedRecords())
