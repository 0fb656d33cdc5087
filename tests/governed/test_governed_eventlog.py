"""The shared event log: dense stable positions, idempotence by id, refusals, many concurrent writers."""

from __future__ import annotations

import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from govern.runtime._eventlog import (
    Event,
    EventConflict,
    EventLog,
    EventLogError,
    LogCorrupted,
    LoggedEvent,
    MachineMismatch,
    MissingDependency,
)

DIGEST = "a" * 64
EVENTS = ("pay", "ship", "cancel")
WORKER = Path(__file__).with_name("_append_worker.py")


def bound(url: str, name: str = "main", **options: Any) -> EventLog:
    """A log bound to the test machine (digest DIGEST, events EVENTS)."""
    log = EventLog(url, name=name, **options)
    log.bind(DIGEST, events=EVENTS)
    return log


def ev(
    event_id: str,
    *,
    record: str = "o1",
    name: str = "pay",
    producer: str = "p",
    seq: int = 0,
    deps: tuple[str, ...] = (),
    machine: str = DIGEST,
) -> Event:
    return Event(
        id=event_id,
        machine=machine,
        record=record,
        event=name,
        producer=producer,
        producer_seq=seq,
        deps=deps,
    )


def test_append_assigns_dense_positions_and_record_seqs(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    a = log.append(ev("a", record="o1", seq=0))
    b = log.append(ev("b", record="o2", seq=1))
    c = log.append(ev("c", record="o1", seq=2))
    assert [x.event.position for x in (a, b, c)] == [0, 1, 2]
    assert [x.event.record_seq for x in (a, b, c)] == [0, 0, 1]
    assert all(x.created for x in (a, b, c))
    assert [e.id for e in log.read()] == ["a", "b", "c"]
    assert [e.id for e in log.read(1, 1)] == ["b"]
    assert log.length() == 3 and log.machine() == DIGEST


def test_same_id_same_content_is_a_noop_returning_the_position(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    first = log.append(ev("a", deps=()))
    log.append(ev("b", seq=1, deps=("a",)))
    again = log.append(ev("a"))
    assert not again.created and again.event == first.event
    assert log.length() == 2


def test_same_id_different_content_is_refused(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    log.append(ev("a", name="pay"))
    with pytest.raises(EventConflict, match="names one event forever"):
        log.append(ev("a", name="ship"))
    with pytest.raises(EventConflict, match="sequence number 0"):
        log.append(ev("other", name="pay"))
    assert log.length() == 1


CHANGES: dict[str, st.SearchStrategy[Any]] = {
    "record": st.sampled_from(["o1", "o2", "o9"]),
    "event": st.sampled_from(EVENTS),
    "producer": st.sampled_from(["p", "q", "mallory"]),
    "producer_seq": st.integers(0, 2**63 - 2),
    "deps": st.sampled_from([(), ("a",), ("b",), ("a", "b"), ("missing",)]),
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(CHANGES)), st.data())
def test_an_id_names_one_content_on_every_store(any_log_url: str, field: str, data: st.DataObject) -> None:
    """An event whose id the log holds is taken as a retry (the existing position, nothing written) only
    with the same content; any one field changed is refused with `EventConflict`, whether it is
    appended alone, in a batch (nothing of which is written), or copied from another log."""
    log = bound(any_log_url, f"log-{uuid.uuid4().hex[:12]}")
    log.append_many([ev("a"), ev("b", record="o2", producer="q", seq=0), ev("c", seq=1, deps=("a", "b"))])
    stored = log.read()
    victim = stored[data.draw(st.integers(0, 2), label="victim")]
    fields = victim.model_dump(include=set(Event.model_fields))
    value = data.draw(CHANGES[field].filter(lambda v: v != fields[field]), label=field)
    if field == "deps":
        assume(sorted(value) != sorted(victim.deps))  # the order of dependencies is not content
    changed = Event(**{**fields, field: value})
    # The same change as another log holds it: its own name, position and numbers.
    copied = LoggedEvent(
        **{**victim.model_dump(), field: value, "log": "other", "position": 7, "record_seq": 3}
    )
    for attempt in (
        lambda: log.append(changed),
        lambda: log.append_many([changed]),
        lambda: log.append_many([ev("new", seq=7), changed]),
        lambda: log.append(copied),
    ):
        with pytest.raises(
            EventConflict, match=f"event id {victim.id!r} is already at position {victim.position}"
        ):
            attempt()
        assert log.read() == stored
    again = [log.append(Event(**fields)), log.append(LoggedEvent(**{**victim.model_dump(), "position": 9}))]
    assert [(a.created, a.event) for a in again] == [(False, victim), (False, victim)]
    assert log.read() == stored


def test_dependencies_must_already_be_in_the_log(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    with pytest.raises(MissingDependency, match="append dependencies first"):
        log.append(ev("b", deps=("a",)))
    assert log.length() == 0
    # A dependency earlier in the same batch is fine.
    log.append_many([ev("a"), ev("b", seq=1, deps=("a",))])
    assert [e.id for e in log.read()] == ["a", "b"]


def test_missing_dependencies_are_listed_briefly(any_log_url: str, log_name: str) -> None:
    """An event may name any number of dependencies: the error lists the first few and counts the rest."""
    log = bound(any_log_url, log_name)
    deps = tuple(f"dep-{i}" for i in range(10_000))
    with pytest.raises(MissingDependency, match="append dependencies first") as refused:
        log.append(ev("b", deps=deps))
    message = str(refused.value)
    assert "'dep-0'" in message and "and 9995 more" in message and "'dep-9999'" not in message
    assert len(message) < 500
    assert log.length() == 0


def test_one_event_appends_find_their_dependencies_and_numbers(any_log_url: str, log_name: str) -> None:
    """Appended one at a time (SQLite reads what one event needs as a single row): dependencies given in
    any order, ids that JSON must escape, and each producer's and record's next number."""
    log = bound(any_log_url, log_name)
    odd = 'a "quoted\\ id", é, \u2603, \x01'
    log.append(ev(odd))
    log.append(ev("b", record="o2", producer="q"))
    log.append(ev("e", record="o3", seq=1))
    c = log.append(
        Event(id="c", machine=DIGEST, record="o1", event="ship", producer="p", deps=("b", odd))
    ).event
    assert (c.position, c.after, c.record_seq, c.producer_seq) == (3, (0, 1), 1, 2)
    assert log.append(ev(odd)).created is False  # the same event again: found, not written twice
    with pytest.raises(MissingDependency, match=r"\['x'\]"):
        log.append(ev("d", seq=3, deps=("b", "x")))
    assert log.length() == 4


def test_a_log_holds_one_machine(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    log.bind(DIGEST)
    with pytest.raises(MachineMismatch, match="migration"):
        log.append(ev("a", machine="b" * 64))
    with pytest.raises(MachineMismatch):
        log.bind("b" * 64)
    assert log.length() == 0


def test_a_batch_is_all_or_nothing(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    log.append(ev("a"))
    with pytest.raises(EventConflict):
        log.append_many([ev("b", seq=1), ev("a", name="ship")])
    assert [e.id for e in log.read()] == ["a"]


def test_events_survive_reopening(tmp_path: Path) -> None:
    url = str(tmp_path / "events.db")
    log = bound(url)
    log.append(ev("a"))
    log.close()
    again = EventLog(url)
    assert [e.id for e in again.read()] == ["a"]
    assert not again.append(ev("a")).created


def test_a_gap_is_an_error_not_a_shorter_list(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/events.db"
    log = bound(url)
    log.append_many([ev("a"), ev("b", seq=1), ev("c", seq=2)])
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM govern_events WHERE position = 1"))
    engine.dispose()
    assert [e.id for e in log.read(0, 1)] == ["a"]
    with pytest.raises(LogCorrupted, match="expected position 1"):
        log.read()


def test_bad_input_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        ev("")
    with pytest.raises(ValueError, match="twice"):
        ev("a", deps=("x", "x"))
    with pytest.raises(EventLogError, match="unsupported event log URL"):
        EventLog("redis://localhost")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.sampled_from(["r1", "r2", "r3"])), max_size=30))
def test_positions_are_dense_whatever_is_retried(ops: list[tuple[int, str]]) -> None:
    """Appending with repeats: each distinct id gets exactly one position, 0..n-1 in first-seen order."""
    log = bound("memory://")
    record_of: dict[int, str] = {}
    first_seen: list[int] = []
    for number, record in ops:
        record = record_of.setdefault(number, record)
        if number not in first_seen:
            first_seen.append(number)
        log.append(ev(f"e{number}", record=record, seq=number))
    stored = log.read()
    assert [e.position for e in stored] == list(range(len(first_seen)))
    assert [e.id for e in stored] == [f"e{n}" for n in first_seen]
    for record in {"r1", "r2", "r3"}:
        assert [e.record_seq for e in stored if e.record == record] == list(
            range(sum(1 for e in stored if e.record == record))
        )


@pytest.mark.slow
def test_concurrent_writer_processes_never_gap_or_duplicate(log_url: str, log_name: str) -> None:
    writers, count = 5, 20
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), log_url, log_name, f"w{i}", str(count)])
        for i in range(writers)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * writers
    stored = EventLog(log_url, name=log_name).read()
    assert [e.position for e in stored] == list(range(writers * count))
    assert len({e.id for e in stored}) == writers * count
    for i in range(writers):
        mine = [e for e in stored if e.producer == f"w{i}"]
        # Each writer's dependency chain forces its own events into its order.
        assert [e.producer_seq for e in mine] == list(range(count))
    for record in {e.record for e in stored}:
        seqs = [e.record_seq for e in stored if e.record == record]
        assert seqs == list(range(len(seqs)))


def test_producer_numbers_are_assigned_by_the_log_when_left_out(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)
    a = log.append(Event(id="a", machine=DIGEST, record="r", event="pay", producer="agent"))
    b = log.append(Event(id="b", machine=DIGEST, record="r", event="pay", producer="agent", deps=("a",)))
    log.append(ev("c", producer="other", seq=5))
    assert (a.event.producer_seq, b.event.producer_seq) == (0, 1)
    # A retry without a number matches the stored event whatever number the log gave it.
    assert not log.append(
        Event(id="b", machine=DIGEST, record="r", event="pay", producer="agent", deps=("a",))
    ).created
    assert log.last_by_producer("agent") == b.event
    assert log.last_by_producer("nobody") is None
    assert [e.id for e in log.read_record("r")] == ["a", "b"]
    assert [e.id for e in log.read_record("r", through=0)] == ["a"]
    with pytest.raises(EventConflict, match="sequence number 5"):
        log.append(ev("d", producer="other", seq=5))


def test_memory_logs_are_shared_by_name_and_private_otherwise() -> None:
    shared_a = bound("memory://team", "orders")
    shared_b = EventLog("memory://team", name="orders")
    shared_a.append(ev("x"))
    assert [e.id for e in shared_b.read()] == ["x"]
    assert EventLog("memory://team", name="other").length() == 0
    assert EventLog("memory://").length() == 0


def test_iterating_a_log_pages_through_every_event(tmp_path: Path) -> None:
    for log in (bound("memory://"), bound(str(tmp_path / "pages.db"))):
        log.append_many([ev(f"e{i}", record=f"r{i % 7}", seq=i) for i in range(2345)])
        assert [e.position for e in log] == list(range(2345))
        assert log.in_memory is log.url.startswith("memory://")


def test_concurrent_threads_share_one_log_without_gaps(any_log_url: str, log_name: str) -> None:
    log = bound(any_log_url, log_name)

    def writer(w: int) -> None:
        for i in range(15):
            event = Event(id=f"t{w}-{i}", machine=DIGEST, record=f"r{i % 3}", event="pay", producer=f"t{w}")
            assert log.append(event).event.producer_seq == i
            assert not log.append(event).created

    with ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(writer, w) for w in range(4)]:
            done.result()  # re-raises a writer's failure here
    stored = log.read()
    assert [e.position for e in stored] == list(range(60))
    assert len({e.id for e in stored}) == 60
    for record in ("r0", "r1", "r2"):
        assert [e.record_seq for e in log.read_record(record)] == list(range(20))
