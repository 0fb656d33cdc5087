"""Replica batches: one `deliver()` of many events (the vectorized and sorted paths, from 16 events) has
exactly the outcome of delivering the same events one per call in arrival order, for hostile streams too
(forged copies, duplicates, shuffles): the same state, buffer, counters and position, and the same event
refused with the same error, after the same events were applied."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import govern
from govern.runtime._eventlog import Event, EventLog, LoggedEvent
from govern.runtime._replica import _BATCH_MIN, Replica

from .machines import order_log, order_machine

RECORDS = ["o1", "o2", "o3"]
REFUSALS = (govern.LogCorrupted, govern.ReplicaError, govern.MachineMismatch)
# How a forged copy differs from a genuine event. The first four take a record number another event has.
FORGERIES = [
    "position_new", "position_other", "record_seq", "record", "event", "id", "producer", "producer_seq",
    "deps", "after", "after_forward", "log", "machine", "equal_copy",
]  # fmt: skip


def _fill(log: EventLog, ops: list[tuple[str, str, int | None]]) -> list[LoggedEvent]:
    """Append (record, event, index of an earlier event it depends on) operations; return the log."""
    digest = order_machine().digest
    for i, (record, name, dep) in enumerate(ops):
        deps = (f"e{dep % i}",) if dep is not None and i else ()
        log.append(
            Event(id=f"e{i}", machine=digest, record=record, event=name, producer=f"p{i % 3}", deps=deps)
        )
    return log.read()


def _forge(event: LoggedEvent, kind: str, stored: list[LoggedEvent], rnd: random.Random) -> LoggedEvent:
    """A copy of `event` changed as `kind` says (`equal_copy`: an equal copy that is another object)."""
    n = len(stored)
    changes: dict[str, Any] = {
        "position_new": {"position": n + rnd.randrange(3)},
        "position_other": {"position": (event.position + 1 + rnd.randrange(n - 1)) % n if n > 1 else n},
        "record_seq": {"record_seq": event.record_seq + rnd.choice([1, 2, 50])},
        "record": {"record": rnd.choice([r for r in [*RECORDS, "o9"] if r != event.record])},
        "event": {"event": rnd.choice([e for e in order_machine().events if e != event.event])},
        "id": {"id": event.id + "x"},
        "producer": {"producer": "mallory"},
        "producer_seq": {"producer_seq": event.producer_seq + 100},
        "deps": {"deps": (*event.deps, "zz")},
        "after": {"after": () if event.after else (0,) if event.position else ()},
        "after_forward": {"after": (event.position,)},
        "log": {"log": "other"},
        "machine": {"machine": "0" * 64},
        "equal_copy": {},
    }[kind]
    return LoggedEvent(**{**event.model_dump(), **changes})


def _observed(replica: Replica) -> tuple[Any, ...]:
    """Everything a replica's user can read of it."""
    root = replica.root() if replica._tree is not None else None
    return (
        replica.digest(), replica.states(), replica.position, replica.pending, replica.applied,
        replica.duplicates, root,
    )  # fmt: skip


def _outcome(exc: BaseException | None) -> tuple[type[BaseException], str, Any] | None:
    if exc is None:
        return None
    return type(exc), str(exc), getattr(exc, "event", None)


@st.composite
def hostile_deliveries(draw: st.DrawFn) -> tuple[EventLog, list[list[LoggedEvent]], bool, int]:
    """A log, and the deliveries of a hostile stream: genuine events (some missing), duplicates, equal
    copies and forged ones, shuffled and cut into batches some of which cross the batch threshold. Also
    whether the replicas track the root, and how many log events they fold first."""
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(RECORDS),
                st.sampled_from(order_machine().events),
                st.none() | st.integers(0, 1000),
            ),
            min_size=8,
            max_size=45,
        ),
        label="ops",
    )
    log = order_log()
    stored = _fill(log, ops)
    rnd = draw(st.randoms(use_true_random=False), label="rnd")
    synced = draw(st.integers(0, len(stored)), label="synced") if draw(st.booleans()) else 0
    later = stored[synced:]
    if draw(st.booleans(), label="lossy"):
        later = [e for e in later if rnd.random() < 0.9]  # some genuine events never arrive
    stream = list(later)
    stream += rnd.sample(stored, min(len(stored), draw(st.integers(0, 10), label="duplicates")))
    if draw(st.booleans(), label="shuffled"):
        rnd.shuffle(stream)
    for _ in range(draw(st.integers(0, 4), label="forgeries")):
        kind = draw(st.sampled_from(FORGERIES[:4]) | st.sampled_from(FORGERIES), label="forgery")
        victim = rnd.choice(later if later and rnd.random() < 0.8 else stored)
        stream.insert(rnd.randrange(len(stream) + 1), _forge(victim, kind, stored, rnd))
    if draw(st.booleans(), label="one delivery"):
        return log, [stream], draw(st.booleans(), label="track_root"), synced
    sizes = st.sampled_from([200, 40, _BATCH_MIN, _BATCH_MIN - 1, 20, 3, 1])
    batches: list[list[LoggedEvent]] = []
    done = 0
    while done < len(stream):
        size = draw(sizes, label="size")
        batches.append(stream[done : done + size])
        done += size
    return log, batches, draw(st.booleans(), label="track_root"), synced


@settings(max_examples=400, deadline=None)
@given(hostile_deliveries())
def test_a_batch_delivery_is_exactly_one_event_per_call_in_arrival_order(
    case: tuple[EventLog, list[list[LoggedEvent]], bool, int],
) -> None:
    log, batches, track_root, synced = case
    stored = log.read()
    batched = Replica(order_machine(), log, track_root=track_root)
    single = Replica(order_machine(), log, track_root=track_root)
    for replica in (batched, single):
        replica.deliver(stored[:synced])
    for batch in batches:
        refused: BaseException | None = None
        try:
            batched.deliver(batch)
        except REFUSALS as exc:
            refused = exc
        refused_one: BaseException | None = None
        for event in batch:
            try:
                single.deliver([event])
            except REFUSALS as exc:
                refused_one = exc
                break
        assert _outcome(refused) == _outcome(refused_one)
        assert _observed(batched) == _observed(single)


def test_a_forged_copy_first_in_a_long_delivery_stops_it_where_one_event_per_call_does() -> None:
    """The adversarial tester's case: a copy of e1 claiming position 20, then the log's 20 events. One
    at a time, the copy is applied ahead and the log's own e1 refused (its record number is taken); one
    delivery of all 21 must stop at the same event, with nothing after it applied."""
    log = order_log()
    stored = _fill(log, [("o1", "restock", None)] * 3 + [("o2", "restock", None)] * 17)
    forged = LoggedEvent(**{**stored[1].model_dump(), "position": 20})
    delivery = [forged, *stored]
    outcomes = []
    for one_at_a_time in (False, True):
        replica = Replica(order_machine(), log)
        try:
            if one_at_a_time:
                for event in delivery:
                    replica.deliver([event])
            else:
                replica.deliver(delivery)
        except govern.LogCorrupted as exc:
            outcomes.append((str(exc), _observed(replica)))
    assert len(outcomes) == 2 and outcomes[0] == outcomes[1]
    message, observed = outcomes[0]
    assert "'e1' at log position 1 is number 1 of record 'o1'" in message
    assert observed[2:5] == (1, 0, 2)  # position, pending, applied: e0 and the forged copy
