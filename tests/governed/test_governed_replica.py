"""Replicas: incremental folds, rebuilds, checkpoints, and convergence under any delivery the rules allow."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from govern.runtime._eventlog import Event, EventLog, LogCorrupted, LoggedEvent, MachineMismatch
from govern.runtime._replica import Replica, ReplicaError, fold

from .machines import order_log, order_machine, resealed

RECORDS = ["o1", "o2", "o3"]


def fill(log: EventLog, ops: list[tuple[str, str, bool]]) -> list[LoggedEvent]:
    """Append (record, event, depends_on_previous) operations; return the stored log."""
    digest = order_machine().digest
    previous: str | None = None
    for i, (record, name, chained) in enumerate(ops):
        deps = (previous,) if chained and previous is not None else ()
        log.append(
            Event(id=f"e{i}", machine=digest, record=record, event=name, producer=f"p{i % 3}", deps=deps)
        )
        previous = f"e{i}"
    return log.read()


ops_strategy = st.lists(
    st.tuples(st.sampled_from(RECORDS), st.sampled_from(order_machine().events), st.booleans()),
    max_size=40,
)


def test_sync_folds_the_log_in_order_and_incrementally() -> None:
    machine = order_machine()
    log = order_log()
    fill(log, [("o1", "pay", False), ("o1", "restock", False), ("o2", "cancel", False)])
    replica = Replica(machine, log)
    assert replica.sync() == 3 and replica.position == 3
    fill_more = Event(id="x", machine=machine.digest, record="o1", event="ship", producer="q")
    log.append(fill_more)
    assert replica.sync() == 1 and replica.sync() == 0
    assert replica.state("o1") == {"status": "shipped", "paid": True, "stock": 0}
    assert replica.state("o2")["status"] == "cancelled"
    assert replica.state("never-seen") == dict(machine.initial)


@settings(max_examples=60, deadline=None)
@given(ops_strategy, st.randoms(use_true_random=False))
def test_any_arrival_order_converges_to_the_log_order_state(
    ops: list[tuple[str, str, bool]], rnd: random.Random
) -> None:
    """Events arrive shuffled and duplicated; the replica applies them within the rules and ends where the
    log order ends. A rebuild from scratch reproduces the same state."""
    machine = order_machine()
    log = order_log()
    stored = fill(log, ops)
    reference = fold(machine, stored)
    arrivals = stored + rnd.sample(stored, k=len(stored) // 2)
    rnd.shuffle(arrivals)
    replica = Replica(machine, log)
    replica.deliver(arrivals)
    assert replica.pending == 0 and replica.position == len(stored)
    assert replica.duplicates == len(arrivals) - len(stored)
    assert {k: replica.state_id(k) for k in replica.records()} == dict(reference)
    rebuilt = Replica(machine, log)
    rebuilt.sync()
    assert rebuilt.digest() == replica.digest()
    for key in replica.records():
        assert machine.is_valid(replica.state_id(key))


def test_obligations_are_enforced_where_a_naive_replica_diverges() -> None:
    """pay and cancel do not commute (an obligation): arriving reversed, the replica waits for pay."""
    machine = order_machine()
    assert ("pay", "cancel") in {
        tuple(sorted(p, key=machine.events.index)) for p in (w.events for w in machine.report.obligations)
    }
    log = order_log()
    stored = fill(log, [("o1", "pay", False), ("o1", "cancel", False)])
    naive = fold(machine, reversed(stored))
    replica = Replica(machine, log)
    assert replica.deliver([stored[1]]) == 0 and replica.pending == 1
    assert replica.deliver([stored[0]]) == 2
    assert replica.state("o1")["status"] == "paid"
    assert machine.state_of(naive["o1"])["status"] == "cancelled"


def test_a_non_idempotent_event_delivered_twice_is_applied_once() -> None:
    machine = order_machine()
    assert "restock" in {w.events[0] for w in machine.report.not_idempotent}
    log = order_log()
    stored = fill(log, [("o1", "restock", False)])
    replica = Replica(machine, log)
    replica.deliver(stored + stored + stored)
    assert replica.state("o1")["stock"] == 1 and replica.duplicates == 2


def test_events_of_other_records_apply_without_waiting() -> None:
    machine = order_machine()
    log = order_log()
    stored = fill(log, [("o1", "pay", False), ("o1", "restock", False), ("o2", "pay", False)])
    replica = Replica(machine, log)
    # o2's pay is first on its record: it applies although positions 0 and 1 have not arrived. restock
    # has an obligation with ship, so it waits until it knows o1's earlier event.
    assert replica.deliver([stored[1], stored[2]]) == 1
    assert replica.pending == 1 and replica.position == 0
    assert replica.deliver([stored[0]]) == 2
    assert replica.position == 3


def test_declared_dependencies_are_waited_for() -> None:
    machine = order_machine()
    log = order_log()
    stored = fill(log, [("o1", "restock", False), ("o2", "restock", True)])
    replica = Replica(machine, log)
    assert replica.deliver([stored[1]]) == 0 and replica.pending == 1
    assert replica.deliver([stored[0]]) == 2


def test_checkpoints_resume_and_refuse_tampering() -> None:
    machine = order_machine()
    log = order_log()
    fill(log, [("o1", "pay", False), ("o2", "restock", False), ("o1", "ship", False)])
    first = Replica(machine, log)
    first.sync()
    checkpoint = first.checkpoint()
    log.append(Event(id="late", machine=machine.digest, record="o2", event="pay", producer="z"))
    resumed = Replica(machine, log, checkpoint=checkpoint)
    assert resumed.position == 3 and resumed.sync() == 1
    scratch = Replica(machine, log)
    scratch.sync()
    assert resumed.digest() == scratch.digest()
    forged = checkpoint.model_copy(update={"states": {**checkpoint.states, "o1": machine.initial.id}})
    with pytest.raises(ReplicaError, match="altered"):
        Replica(machine, log, checkpoint=forged)
    invalid = next(s for s in range(machine.n_states) if not machine.is_valid(s))
    outside = Replica(machine, order_log())
    for key, state in {**checkpoint.states, "o1": invalid}.items():
        outside._record(key).state = state  # forged states that still match their (unkeyed) digest
    forged_state = resealed(checkpoint, states={**checkpoint.states, "o1": invalid}, digest=outside.digest())
    with pytest.raises(ReplicaError, match="checked domain"):
        Replica(machine, log, checkpoint=forged_state)
    # A state id the machine does not have at all (it raised govern.ForeignState, which a caller catching
    # the replica's errors missed).
    for foreign in (-1, machine.n_states, 10**6):
        outside._record("o1").state = foreign
        forged_id = resealed(checkpoint, states={**checkpoint.states, "o1": foreign}, digest=outside.digest())
        with pytest.raises(ReplicaError, match="not a state of the machine"):
            Replica(machine, log, checkpoint=forged_id)
    ahead = Replica(machine, log)
    ahead.deliver(log.read(1, 1))
    with pytest.raises(ReplicaError, match="sync"):
        ahead.checkpoint()


def test_a_replica_refuses_another_machine_and_unknown_events() -> None:
    machine = order_machine()
    log = order_log()
    log.bind("f" * 64, events=["pay"])
    with pytest.raises(MachineMismatch, match="migration"):
        Replica(machine, log)
    other = order_log()
    replica = Replica(machine, other)
    bogus = LoggedEvent(
        log=other.name,
        id="b",
        machine=machine.digest,
        record="o",
        event="teleport",
        producer="p",
        producer_seq=0,
        position=0,
        record_seq=0,
    )
    with pytest.raises(ReplicaError, match="teleport"):
        replica.deliver([bogus])


@pytest.mark.parametrize("batched", [True, False])
def test_a_bad_event_stops_the_replica_exactly_after_the_last_event_it_applied(batched: bool) -> None:
    """A forged record number or an event name the machine lacks: everything before it is applied (in
    the vectorized fold too), nothing after it, and the error names the event and the reason."""
    machine = order_machine()
    log = order_log()
    stored = fill(log, [(RECORDS[i % 2], "restock", False) for i in range(20)])

    def feed(replica: Replica, events: list[LoggedEvent]) -> None:
        if batched:
            replica.deliver(events)
        else:
            for event in events:
                replica.deliver([event])

    def prefix_digest(n: int) -> str:
        reference = Replica(machine, log)
        reference.deliver(stored[:n])
        return reference.digest()

    # In log order, every event before it is applied: a record number from the future contradicts the log.
    forged = [*stored[:10], stored[10].model_copy(update={"record_seq": 99}), *stored[11:]]
    replica = Replica(machine, log)
    applied = "number 99 of record 'o1', but 5 events of that record are applied before it: a copy"
    with pytest.raises(LogCorrupted, match=applied):
        feed(replica, forged)
    assert replica.position == 10 and replica.pending == 0 and replica.digest() == prefix_digest(10)

    bogus = [*stored[:19], stored[19].model_copy(update={"event": "teleport"})]
    replica = Replica(machine, log)
    with pytest.raises(ReplicaError, match="position 19 names 'teleport'") as refused:
        feed(replica, bogus)
    assert refused.value.event is not None and refused.value.event.position == 19
    assert "stops here (position 19" in str(refused.value)
    assert replica.position == 19 and replica.digest() == prefix_digest(19)
    replica.deliver(stored[19:])
    assert replica.position == 20 and replica.state("o1")["stock"] == 3


def test_events_of_another_log_are_refused() -> None:
    machine = order_machine()
    mine, theirs = order_log(), order_log(name="other")
    fill(theirs, [("o1", "pay", False)])
    with pytest.raises(ReplicaError, match="from log 'other'"):
        Replica(machine, mine).deliver(theirs.read())


@settings(max_examples=25, deadline=None)
@given(ops_strategy, st.randoms(use_true_random=False))
def test_a_replica_recomputes_the_logs_merkle_root_whatever_the_arrival_order(
    ops: list[tuple[str, str, bool]], rnd: random.Random
) -> None:
    machine = order_machine()
    log = order_log()
    stored = fill(log, ops)
    arrivals = stored + rnd.sample(stored, k=len(stored) // 3)
    rnd.shuffle(arrivals)
    replica = Replica(machine, log, track_root=True)
    replica.deliver(arrivals)
    assert replica.root() == log.root()
    half = len(stored) // 2
    prefix = Replica(machine, log, track_root=True)
    prefix.deliver(stored[:half])
    assert prefix.root() == log.root(half)


def test_the_root_commits_to_every_field_of_every_event() -> None:
    machine = order_machine()
    log = order_log()
    stored = fill(log, [("o1", "pay", False), ("o2", "restock", False)])
    honest = log.root()
    assert len(honest) == 64 and log.root(0) != honest
    forged = [stored[0], stored[1].model_copy(update={"producer": "mallory"})]
    replica = Replica(machine, log, track_root=True)
    replica.deliver(forged)
    assert replica.root() != honest
    with pytest.raises(ValueError, match="fewer than size=3"):
        log.root(3)
    with pytest.raises(ReplicaError, match="track_root=True"):
        Replica(machine, log).root()
    with pytest.raises(ReplicaError, match="checkpoint"):
        synced = Replica(machine, log)
        synced.sync()
        Replica(machine, log, checkpoint=synced.checkpoint(), track_root=True)


def test_a_late_first_event_is_handled_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every event of one busy record waits for its first event; when it finally arrives, each buffered
    event is checked a bounded number of times (the buffer is indexed by what each event waits for),
    not once per arrival (which made the replica quadratic)."""
    machine = order_machine()
    log = order_log()
    n = 2000
    log.append_many(
        [
            Event(
                id=f"e{i}",
                machine=machine.digest,
                record="busy",
                event=("pay", "cancel")[i % 2],
                producer="p",
            )
            for i in range(n)
        ]
    )
    stored = log.read()
    checks = 0
    ready = Replica._ready

    def counted(self: Replica, event: LoggedEvent) -> bool:
        nonlocal checks
        checks += 1
        return ready(self, event)

    monkeypatch.setattr(Replica, "_ready", counted)
    replica = Replica(machine, log)
    for event in stored[1:]:
        replica.deliver([event])
    assert replica.pending == n - 1 and replica.position == 0
    replica.deliver([stored[0]])
    assert replica.pending == 0 and replica.position == n
    assert checks <= 3 * n, f"{checks} readiness checks for {n} events"
    reference = Replica(machine, log)
    reference.sync()
    assert replica.digest() == reference.digest()


def test_sync_stops_exactly_after_the_last_event_it_could_apply(tmp_path: Path) -> None:
    """A log written by an older govern may hold a name the machine lacks: sync (a vectorized page)
    applies everything before it, then stops there every time, naming the event."""
    machine = order_machine()
    path = tmp_path / "events.db"
    log = order_log(str(path))
    stored = fill(log, [(RECORDS[i % 3], "restock", False) for i in range(40)])
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE govern_events SET event = 'shipp' WHERE position = 30")
    replica = Replica(machine, log)
    for _ in range(2):
        with pytest.raises(ReplicaError, match="position 30 names 'shipp'"):
            replica.sync()
        assert replica.position == 30
    reference = Replica(machine, log)
    reference.deliver(stored[:30])
    assert replica.digest() == reference.digest()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 60), st.integers(1, 9), st.data())
def test_the_logs_root_is_read_page_by_page_and_equals_the_whole_trees(
    n: int, page: int, data: st.DataObject
) -> None:
    """`EventLog.root` reads the log a page at a time and keeps only the roots of its complete subtrees
    (it read the whole log at once: 2 GB for a million events); whatever the page and the size, the root
    is the RFC 6962 root of the tree over every leaf."""
    import govern.runtime._eventlog as eventlog
    from bide.audit import MerkleTree

    log = order_log()
    stored = fill(log, [(f"o{i % 7}", ("pay", "restock")[i % 2], False) for i in range(n)])
    asked: list[int] = []
    read = log.read

    def counted(start: int = 0, limit: int | None = None) -> list[LoggedEvent]:
        asked.append(10**9 if limit is None else limit)
        return read(start, limit)

    size = data.draw(st.integers(0, len(stored)))
    old_page, eventlog._ROOT_PAGE = eventlog._ROOT_PAGE, page
    try:
        log.read = counted  # type: ignore[method-assign]
        assert log.root(size) == MerkleTree(e.leaf() for e in stored[:size]).root().hex()
        assert log.root() == MerkleTree(e.leaf() for e in stored).root().hex()
    finally:
        eventlog._ROOT_PAGE = old_page
    assert max(asked, default=0) <= page
