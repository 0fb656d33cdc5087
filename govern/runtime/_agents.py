"""Agents as producers: a governed event as a bide tool.

`event_tool(machine, log, "ship")` is a tool whose only effect is to append the event `ship` for one
record to the shared log. Its event id is derived from the run id and the call id, so a retry of the same
call after a crash (bide re-runs Idempotent tools) appends nothing new: the tool is idempotent by
construction and never needs to halt. It answers the model with the consequence: the record's state right
after the event in the log order, and whether the event applied, was a no-op (its guard did not hold), or
was compensated (an invariant's repair changed the outcome).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from .._errors import UnknownEvent
from ..machine._machine import Machine
from ._eventlog import Event, EventConflict, EventLog, LoggedEvent
from ._rules import DeliveryRules, delivery_rules

if TYPE_CHECKING:
    import bide

__all__ = ["event_id_for", "event_tool"]


def event_id_for(run_id: str, call_id: str, event: str, record: str) -> str:
    """The id of the event a tool call appends: stable across every retry of that call."""
    text = "\0".join(("govern.event.v1", run_id, call_id, event, record))
    return "ev-" + hashlib.sha256(text.encode()).hexdigest()[:40]


class _FixedRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _record_arguments(tool_name: str) -> type[BaseModel]:
    model: type[BaseModel] = create_model(
        f"{tool_name}_arguments",
        __config__=ConfigDict(extra="forbid"),
        record=(str, Field(min_length=1, max_length=200, description="the key of the shared record")),
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
    arguments. `producer` names the producer in the log (default: the run id). Each event depends
    causally on the producer's previous event, so replicas apply one agent's events in its own order.
    """
    import bide  # here, not at the top: `import govern` must not pull in the agent runtime

    rules = delivery_rules(machine)
    if event not in rules.index:
        known = ", ".join(rules.names)
        raise UnknownEvent(f"machine {rules.name!r} has no event {event!r}; its events are {known}")
    log.bind(rules.digest)
    tool_name = name or event
    what = description or (
        f"Record the event {event!r} on a shared {rules.name} record. The result is the record's state "
        "right after the event, and whether the event applied, was a no-op or was compensated."
    )
    arguments = _FixedRecord if record is not None else _record_arguments(tool_name)

    def effect(validated: BaseModel) -> dict[str, Any]:
        ctx = bide.current_call()
        key = record if record is not None else str(validated.record)  # type: ignore[attr-defined]
        who = producer or ctx.run_id
        event_id = event_id_for(ctx.run_id, ctx.call_id, event, key)
        stored = log.get(event_id)
        created = False
        if stored is None:
            previous = log.last_by_producer(who)
            try:
                appended = log.append(
                    Event(
                        id=event_id,
                        machine=rules.digest,
                        record=key,
                        event=event,
                        producer=who,
                        deps=() if previous is None else (previous.id,),
                    )
                )
            except EventConflict:
                # A concurrent retry of this very call won the append; report what it stored.
                stored = log.get(event_id)
                if stored is None:
                    raise
            else:
                stored, created = appended.event, appended.created
        return _consequence(rules, log, stored, created)

    async def effect_async(validated: BaseModel) -> dict[str, Any]:
        # A database log blocks on I/O: run it in a worker thread (the call context travels with it). A
        # memory log answers in microseconds, so the thread hop would cost more than the work.
        if log.in_memory:
            return effect(validated)
        return await asyncio.to_thread(effect, validated)

    return bide.Tool(
        name=tool_name, description=what, args=arguments, fn=effect_async, safety=bide.Idempotent
    )


def _consequence(rules: DeliveryRules, log: EventLog, event: LoggedEvent, created: bool) -> dict[str, Any]:
    history = log.read_record(event.record, through=event.position)
    state = rules.initial
    for earlier in history[:-1]:
        state = rules.step(state, rules.index[earlier.event])
    outcome = rules.explain(state, rules.index[event.event])
    return {
        "event": event.event,
        "event_id": event.id,
        "record": event.record,
        "position": event.position,
        "outcome": outcome.kind,
        "why": outcome.why,
        "state": rules.decode(outcome.after),
        "newly_recorded": created,
    }
