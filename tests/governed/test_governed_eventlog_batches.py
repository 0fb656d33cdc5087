"""Every backend appends a batch exactly as the memory log does: the same positions, numbers, dependency
positions and `created` flags, whether the batch is one event, a few, or large enough for PostgreSQL's
COPY path; with repeated ids, dependencies inside the batch and on stored events, and keys seen before
and new."""

from __future__ import annotations

import random
from typing import Any

import pytest

from govern.runtime._eventlog import _COPY_FROM, Event, EventLog, LoggedEvent, _trusted

DIGEST = "b" * 64
EVENTS = ("pay", "ship", "cancel")


def _outcome(log: EventLog, batches: list[list[Event]]) -> tuple[list[list[tuple[Any, ...]]], list[Any]]:
    outcomes = []
    for batch in batches:
        appended = log.append_many(batch)
        outcomes.append([(a.event.model_dump(exclude={"log"}), a.created) for a in appended])
    stored = [e.model_dump(exclude={"log"}) for e in log.read()]
    return outcomes, stored


def _batches(seed: int) -> list[list[Event]]:
    """Batches of sizes around the COPY threshold, mixing new events, exact repeats of stored or earlier
    events of the same batch, dependencies on both, and producers and records old and new."""
    rng = random.Random(seed)
    made: list[Event] = []
    batches = []
    for size in (1, 3, _COPY_FROM - 1, _COPY_FROM, 3 * _COPY_FROM, 1, 2):
        batch: list[Event] = []
        for _ in range(size):
            if made and rng.random() < 0.15:
                batch.append(rng.choice(made + batch))  # a retry: same id, same content
                continue
            pool = made + batch
            deps = tuple({d.id for d in rng.sample(pool, min(len(pool), rng.randrange(3)))})
            event = Event(
                id=f"e{seed}-{len(made) + len(batch)}",
                machine=DIGEST,
                record=f"r{rng.randrange(8 + len(made))}",
                event=rng.choice(EVENTS),
                producer=f"p{rng.randrange(4)}",
                deps=deps,
            )
            batch.append(event)
        made.extend(batch)
        batches.append(batch)
    return batches


@pytest.mark.parametrize("seed", [1, 2])
def test_every_backend_appends_batches_as_the_memory_log_does(log_url: str, log_name: str, seed: int) -> None:
    batches = _batches(seed)
    memory = EventLog("memory://", name=log_name)
    memory.bind(DIGEST, events=EVENTS)
    durable = EventLog(log_url, name=log_name)
    durable.bind(DIGEST, events=EVENTS)
    try:
        assert _outcome(durable, batches) == _outcome(memory, batches)
    finally:
        durable.close()


def test_a_trusted_logged_event_is_the_validated_one() -> None:
    """The append builds stored events without validating again (`_trusted`): they must be the very
    objects pydantic builds, equal, hashed, dumped and shown alike."""
    fields: dict[str, Any] = {
        "id": "e1",
        "machine": DIGEST,
        "record": "r1",
        "event": "pay",
        "producer": "p",
        "producer_seq": 3,
        "deps": ("e0",),
        "log": "main",
        "position": 7,
        "record_seq": 2,
        "after": (5,),
    }
    trusted, validated = _trusted(dict(fields)), LoggedEvent(**fields)
    assert trusted == validated and hash(trusted) == hash(validated)
    assert repr(trusted) == repr(validated)
    assert trusted.model_dump() == validated.model_dump()
    assert trusted.model_fields_set == validated.model_fields_set
    assert trusted.leaf() == validated.leaf()
    assert LoggedEvent.model_validate(trusted.model_dump()) == trusted
