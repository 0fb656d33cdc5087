"""Replica edges: checkpoints bound to their log, conflicting events at one position, bad input, and
exact matching of a family's tool arguments."""

from __future__ import annotations

import contextlib
import random
import re
import sqlite3
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

import govern
from bide._tools import ToolArgumentsInvalid
from govern.runtime import _replica
from govern.runtime._eventlog import Event, EventLog, InvalidInput, LogCorrupted, LoggedEvent
from govern.runtime._replica import Checkpoint, Replica, ReplicaError

from .conftest import POSTGRES_URL
from .machines import order_log, order_machine, resealed

RECORDS = ["o1", "o2", "o3"]


def fill(
    log: EventLog, events: list[tuple[str, str]], prefix: str = "e", start: int = 0, chained: bool = False
) -> list[LoggedEvent]:
    """Append (record, event) pairs with ids prefix0, prefix1, ...; return the whole stored log. `chained`:
    each event depends on the one before it."""
    digest = order_machine().digest
    for i, (record, name) in enumerate(events, start):
        deps = (f"{prefix}{i - 1}",) if chained and i > start else ()
        log.append(
            Event(id=f"{prefix}{i}", machine=digest, record=record, event=name, producer="p", deps=deps)
        )
    return log.read()


def synced(log: EventLog) -> Replica:
    replica = Replica(order_machine(), log)
    replica.sync()
    return replica


ops = st.lists(st.tuples(st.sampled_from(RECORDS), st.sampled_from(order_machine().events)), max_size=30)


# -- #3: a checkpoint restores only onto the log it was taken of --------------------------------------------


def test_a_checkpoint_of_another_log_file_with_the_same_name_is_refused(tmp_path: Path) -> None:
    a = order_log(f"sqlite:///{tmp_path}/a.db")
    b = order_log(f"sqlite:///{tmp_path}/b.db")
    fill(a, [("o1", "pay"), ("o1", "restock"), ("o1", "ship")])
    fill(b, [("o1", "restock"), ("o1", "restock"), ("o1", "cancel"), ("o1", "restock")])  # same ids
    saved = synced(a).checkpoint()
    with pytest.raises(ReplicaError, match="another log"):
        Replica(order_machine(), b, checkpoint=saved)
    resumed = Replica(order_machine(), a, checkpoint=saved)
    assert resumed.digest() == synced(a).digest()


def test_a_checkpoint_is_checked_against_the_log_on_every_store(any_log_url: str, log_name: str) -> None:
    """Taken of a memory log, a checkpoint is refused by a durable log of the same name whose event at
    its last position differs, or of another name, and resumes on a durable copy of that log."""
    source = order_log("memory://", name=log_name)
    fill(source, [("o1", "pay"), ("o1", "restock")])
    saved = synced(source).checkpoint()
    target = order_log(any_log_url, name=log_name)
    fill(target, [("o1", "pay"), ("o2", "restock")])
    with pytest.raises(ReplicaError, match="holds an event of that id but other content"):
        Replica(order_machine(), target, checkpoint=saved)
    copy = order_log(any_log_url, name=f"{log_name}-copy")
    fill(copy, [("o1", "pay"), ("o1", "restock"), ("o2", "ship")])
    renamed = resealed(saved, log=f"{log_name}-copy")
    with pytest.raises(ReplicaError, match="another log"):
        Replica(order_machine(), copy, checkpoint=renamed)  # its leaf names the log: renaming is not enough
    twin_source = order_log("memory://", name=f"{log_name}-twin")
    fill(twin_source, [("o1", "pay"), ("o1", "restock")])
    twin = order_log(any_log_url, name=f"{log_name}-twin")
    fill(twin, [("o1", "pay"), ("o1", "restock"), ("o2", "ship")])
    resumed = Replica(order_machine(), twin, checkpoint=synced(twin_source).checkpoint())
    assert resumed.position == 2 and resumed.sync() == 1 and resumed.digest() == synced(twin).digest()


def test_a_checkpoint_past_the_end_of_the_log_is_refused() -> None:
    log = order_log()
    fill(log, [("o1", "restock")] * 3)
    good = synced(log).checkpoint()
    ahead = resealed(good, position=10, record_lengths={"o1": 10})
    with pytest.raises(ReplicaError, match="holds only 3 events"):
        Replica(order_machine(), log, checkpoint=ahead)
    older = order_log()  # the log restored from a backup taken before the checkpoint
    fill(older, [("o1", "restock")] * 2)
    with pytest.raises(ReplicaError, match="holds only 2 events"):
        Replica(order_machine(), older, checkpoint=good)


def test_a_format_1_checkpoint_is_read_checked_against_the_length_and_renewed() -> None:
    log = order_log()
    fill(log, [("o1", "pay"), ("o2", "restock")])
    current = synced(log).checkpoint()
    assert current.format == "govern-replica-checkpoint/3" and current.last_id == "e1"
    old = current.model_dump(exclude={"last_id", "last_leaf", "seal"})
    old["format"] = "govern-replica-checkpoint/1"
    v1 = Checkpoint.model_validate_json(Checkpoint(**old).model_dump_json())
    resumed = Replica(order_machine(), log, checkpoint=v1)
    assert resumed.checkpoint() == current  # renewed in format 3, naming the log's event
    with pytest.raises(ReplicaError, match="holds only 1 events"):
        short = order_log()
        fill(short, [("o1", "pay")])
        Replica(order_machine(), short, checkpoint=v1)


def test_a_checkpoint_whose_record_lengths_were_edited_is_refused_not_left_to_stall() -> None:
    """A record's count of applied events lowered by hand: restored, the replica waited for events the
    checkpoint had already folded, parked the next ordered event of that record for good, and held a
    state other than the log's with no error. The seal (format 3) and the counts' sum refuse it."""
    log = order_log()
    fill(log, [("o1", "restock"), ("o1", "restock"), ("o2", "pay")])
    saved = synced(log).checkpoint()
    assert saved.record_lengths == {"o1": 2, "o2": 1}
    edited = Checkpoint(**{**saved.model_dump(), "record_lengths": {"o1": 1, "o2": 2}})  # still adds up
    with pytest.raises(ReplicaError, match="seal does not match"):
        Replica(order_machine(), log, checkpoint=edited)
    v2 = {**saved.model_dump(exclude={"seal"}), "format": "govern-replica-checkpoint/2"}
    with pytest.raises(InvalidInput, match="add up to 2 events, but the checkpoint folded 3"):
        Checkpoint(**{**v2, "record_lengths": {"o1": 1, "o2": 1}})
    # Format 2 has no seal: a swap that still adds up is caught when it names the last event's record.
    with pytest.raises(ReplicaError, match="counts 2 events of record 'o2'"):
        Replica(order_machine(), log, checkpoint=Checkpoint(**{**v2, "record_lengths": {"o1": 1, "o2": 2}}))
    fill(log, [("o1", "pay")], start=3)
    resumed = Replica(order_machine(), log, checkpoint=Checkpoint(**v2))  # an unedited format 2 is read
    assert resumed.deliver(log.read(3)) == 1 and resumed.digest() == synced(log).digest()
    assert resumed.checkpoint().format == "govern-replica-checkpoint/3"


def test_an_edit_of_the_record_counts_no_restore_check_catches_is_refused_when_its_event_comes() -> None:
    """Format 2 has no seal: counts that still add up and keep the last event's record's count restore.
    The record's next ordered event then waited for events already folded, for good: sync() answered 0,
    pending stayed 1, and checkpoint() kept asking for the sync() that could not help. Once every position
    before it is applied, the event is refused, in any delivery order."""
    log = order_log()
    fill(log, [("o1", "restock"), ("o1", "pay"), ("o1", "restock"), ("o3", "pay"), ("o2", "pay")])
    saved = synced(log).checkpoint()
    v2 = {**saved.model_dump(exclude={"seal"}), "format": "govern-replica-checkpoint/2"}
    edited = Checkpoint(**{**v2, "record_lengths": {"o1": 2, "o2": 1, "o3": 2}})
    fill(log, [("o2", "restock"), ("o1", "ship")], prefix="m", start=5)
    more = log.read(5)
    for order in (more[::-1], more):
        replica = Replica(order_machine(), log, checkpoint=edited)
        with pytest.raises(
            LogCorrupted, match="number 3 of record 'o1', but 2 events of that record are app"
        ):
            for event in order:
                replica.deliver([event])
        assert replica.position == 6 and replica.digest() != synced(log).digest()
        with pytest.raises(LogCorrupted, match="checkpoint this replica was restored from counts"):
            replica.sync()


def test_a_format_1_checkpoint_whose_counts_contradict_the_log_is_not_renewed() -> None:
    log = order_log()
    fill(log, [("o1", "restock"), ("o2", "pay"), ("o2", "restock")])
    saved = synced(log).checkpoint()
    v1 = {
        **saved.model_dump(exclude={"seal", "last_id", "last_leaf"}),
        "format": "govern-replica-checkpoint/1",
    }
    restored = Replica(
        order_machine(), log, checkpoint=Checkpoint(**{**v1, "record_lengths": {"o1": 2, "o2": 1}})
    )
    with pytest.raises(
        ReplicaError, match="counts 1 events of record 'o2', but the log's event at position 2"
    ):
        restored.checkpoint()  # before, sealed as format 3, which the next restore refused as altered


def test_a_checkpoint_is_validated_however_it_is_made() -> None:
    """pydantic's model_copy(update=...) and model_construct take any value unchecked: a copy whose counts
    did not add up restored, and the replica's own checkpoint() then failed. A record key that is not a
    record name (a lone surrogate raised a bare UnicodeEncodeError at restore) is refused as well."""
    log = order_log()
    fill(log, [("o1", "pay"), ("o2", "pay")])
    saved = synced(log).checkpoint()
    with pytest.raises(InvalidInput, match="add up to"):
        saved.model_copy(update={"record_lengths": {"o1": 2, "o2": 1}})
    with pytest.raises(InvalidInput, match="add up to"):
        Checkpoint.model_construct(**{**saved.model_dump(), "record_lengths": {"o1": 2, "o2": 1}})
    assert saved.model_copy() == saved == Checkpoint.model_construct(**saved.model_dump())
    for key in ("\ud800", "", "x" * 201, "a\x00b"):
        with pytest.raises(InvalidInput, match="states: record key"):
            Checkpoint(
                **{
                    **saved.model_dump(),
                    "states": {**saved.states, key: 0},
                    "record_lengths": {**saved.record_lengths, key: 0},
                }
            )


def test_an_event_made_with_model_construct_is_validated() -> None:
    """`Event.model_construct` skipped validation, and the log stored what it was given: a NUL in an id,
    a negative producer_seq, after which every read() of the log raised LogCorrupted."""
    digest = order_machine().digest
    with pytest.raises(InvalidInput, match="NUL"):
        Event.model_construct(id="a\x00", machine=digest, record="o1", event="pay", producer="p")
    with pytest.raises(InvalidInput):
        Event.model_construct(id="a", machine=digest, record="o1", event="pay", producer="p", producer_seq=-5)
    made = Event.model_construct(id="a", machine=digest, record="o1", event="pay", producer="p")
    assert made == Event(id="a", machine=digest, record="o1", event="pay", producer="p")


_EDITS = {
    "machine": st.just("0" * 64),
    "log": st.just("another"),
    "position": st.integers(0, 6),
    "states": st.dictionaries(st.sampled_from(RECORDS), st.integers(0, 40), max_size=3),
    "record_lengths": st.dictionaries(st.sampled_from(RECORDS), st.integers(0, 6), max_size=3),
    "digest": st.just("0" * 64),
    "last_id": st.sampled_from(["e0", "e1", "e2", None]),
    "last_leaf": st.just("0" * 64),
}


@settings(max_examples=60, deadline=None)
@given(ops.filter(bool), st.sampled_from(sorted(_EDITS)), st.data())
def test_any_edit_of_a_checkpoint_that_does_not_reseal_it_is_refused(
    events: list[tuple[str, str]], field: str, data: st.DataObject
) -> None:
    log = order_log()
    fill(log, events)
    saved = synced(log).checkpoint()
    value = data.draw(_EDITS[field])
    assume(value != getattr(saved, field))
    try:
        edited = Checkpoint(**{**saved.model_dump(), field: value})
    except InvalidInput:
        return  # refused as read
    with pytest.raises((ReplicaError, govern.MachineMismatch)):
        Replica(order_machine(), log, checkpoint=edited)


@settings(max_examples=40, deadline=None)
@given(ops, ops, st.data())
def test_a_checkpoint_resumes_on_its_log_and_is_refused_by_a_log_that_differs_at_its_last_event(
    first: list[tuple[str, str]], more: list[tuple[str, str]], data: st.DataObject
) -> None:
    """Checkpointed at any prefix, a restored replica converges to a rebuild however the log grows; a log
    whose event before the checkpoint's position differs refuses it."""
    log = order_log()
    stored = fill(log, first)
    k = data.draw(st.integers(0, len(stored)))
    partial = Replica(order_machine(), log)
    partial.deliver(stored[:k])
    saved = Checkpoint.model_validate_json(partial.checkpoint().model_dump_json())
    fill(log, more, start=len(stored))
    resumed = Replica(order_machine(), log, checkpoint=saved)
    resumed.sync()
    assert resumed.digest() == synced(log).digest() and resumed.position == log.length()
    if k:
        other = order_log()
        changed = [*first[: k - 1], ("o9", "restock")]
        fill(other, changed)
        with pytest.raises(ReplicaError, match="another log"):
            Replica(order_machine(), other, checkpoint=saved)


# -- #4: a different event at a taken position is refused, whatever arrives first ---------------------------


def _restore_online(backup: Path, live: Path) -> None:
    """Restore `backup` into the live log file with SQLite's backup API: same file, same inode, through
    SQLite's own locks, while the replica's process keeps the log open (the file identity check cannot
    see it)."""
    source, target = sqlite3.connect(backup), sqlite3.connect(live)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()


def _backup(live: Path, backup: Path) -> None:
    _restore_online(live, backup)


@pytest.mark.parametrize("how", ["fresh", "checkpoint", "root"])
def test_a_log_rewound_under_a_live_replica_is_refused_not_followed(tmp_path: Path, how: str) -> None:
    """An older backup restored under a live replica, then appended to: sync() went on from the replica's
    position, applying the new events past it and skipping those below it, and its state was no longer any
    fold of the log. The log's event just below the position is compared with the one applied there."""
    live, backup = tmp_path / "live.db", tmp_path / "backup.db"
    log = order_log(f"sqlite:///{live}")
    fill(log, [("o1", "restock"), ("o2", "pay")])
    _backup(live, backup)
    fill(log, [("o1", "pay"), ("o3", "restock"), ("o2", "ship")], start=2)
    if how == "checkpoint":  # restored from a checkpoint, nothing applied since: its last event is compared
        replica = Replica(order_machine(), log, checkpoint=synced(log).checkpoint())
    else:
        replica = Replica(order_machine(), log, track_root=how == "root")
        assert replica.sync() == 5
    before = (replica.position, replica.digest(), replica.applied)
    _restore_online(backup, live)
    with pytest.raises(LogCorrupted, match="no longer holds position 4, which this replica applied"):
        replica.sync()  # shorter than the position: nothing new, and nothing said before
    fill(log, [("o3", "pay"), ("o3", "ship"), ("o1", "ship"), ("o2", "restock")], prefix="n", start=2)
    assert log.length() == 6
    with pytest.raises(LogCorrupted, match="holds event 'n4' at position 4, which is not the event"):
        replica.sync()
    assert (replica.position, replica.digest(), replica.applied) == before
    fresh = synced(log)
    assert fresh.position == 6 and fresh.sync() == 0  # the log itself reads and folds as it is


@pytest.mark.postgres
@pytest.mark.parametrize("where", ["authority", "query"])
def test_a_replica_names_a_postgresql_log_without_its_password(log_name: str, where: str) -> None:
    """The replica's refusals named the log by its URL as given, password and all (in the authority, or
    in the query as libpq also takes it: `?password=`)."""
    url = sa.make_url(POSTGRES_URL)
    secret = url.password or "hunter2-never-shown"  # the test server trusts loopback: any password works
    if where == "authority":
        given = url.set(password=secret).render_as_string(hide_password=False)
    else:
        given = url.set(password=None).update_query_dict({"password": secret}).render_as_string(False)
    log = order_log(given, name=log_name)
    fill(log, [("o1", "restock")] * 3)
    ahead = resealed(synced(log).checkpoint(), position=10, record_lengths={"o1": 10})
    with pytest.raises(ReplicaError, match="holds only 3 events") as refused:
        Replica(order_machine(), log, checkpoint=ahead)
    assert secret not in str(refused.value) and "***" in str(refused.value)
    assert secret not in repr(log)


def test_a_log_rewound_between_two_pages_of_one_sync_is_refused(tmp_path: Path) -> None:
    """Each page after the first is read from the last event of the page before, and compared with it: a
    restore landing between two reads of one sync() mixed both histories, and later syncs said nothing."""
    live, backup = tmp_path / "live.db", tmp_path / "backup.db"
    log = order_log(f"sqlite:///{live}")
    fill(log, [("o1", "restock")])
    _backup(live, backup)
    fill(log, [("o2", "pay"), ("o3", "restock"), ("o3", "restock"), ("o1", "pay"), ("o2", "ship")], start=1)
    replica, reads = Replica(order_machine(), log), []
    real_read = log.read

    def read(start: int = 0, limit: int | None = None) -> list[LoggedEvent]:
        out = real_read(start, limit)
        reads.append(start)
        if len(reads) == 1:  # another process restores the older backup, then appends
            _restore_online(backup, live)
            fill(order_log(f"sqlite:///{live}"), [("o2", "cancel"), ("o3", "restock"), ("o1", "pay")], "n", 1)
        return out

    log.read = read  # type: ignore[method-assign]
    with pytest.raises(LogCorrupted, match="holds event 'n1' at position 1, which is not the event"):
        replica.sync(page=2)
    assert replica.position == 2 and reads == [0, 1]


def test_a_replica_restored_from_a_format_1_checkpoint_refuses_a_rewound_log(tmp_path: Path) -> None:
    """A format-1 checkpoint names no last event: the replica keeps the log's event below its position
    when it is restored, and compares that."""
    live, backup = tmp_path / "live.db", tmp_path / "backup.db"
    log = order_log(f"sqlite:///{live}")
    fill(log, [("o1", "restock")])
    _backup(live, backup)
    fill(log, [("o2", "pay"), ("o3", "restock")], start=1)
    fields = synced(log).checkpoint().model_dump()
    old = {k: v for k, v in fields.items() if k not in ("seal", "last_id", "last_leaf")}
    format_1 = Checkpoint(**{**old, "format": "govern-replica-checkpoint/1"})
    replica = Replica(order_machine(), log, checkpoint=format_1)
    _restore_online(backup, live)
    fill(log, [("o2", "cancel"), ("o1", "pay"), ("o2", "restock")], prefix="n", start=1)
    with pytest.raises(LogCorrupted, match="holds event 'n2' at position 2"):
        replica.sync()


def test_sync_takes_any_page_size() -> None:
    log = order_log()
    fill(log, [("o1", "restock"), ("o2", "pay")])
    replica = Replica(order_machine(), log)
    assert replica.sync(page=2**62 - 1) == 2 and replica.sync(page=2**62 - 1) == 0
    fill(log, [("o1", "pay")], start=2)
    assert replica.sync(page=2**62 - 1) == 1


def test_sync_compares_the_position_below_without_counting_or_applying_it() -> None:
    log = order_log()
    fill(log, [("o1", "restock"), ("o2", "pay"), ("o1", "pay")])
    replica = synced(log)
    assert replica.sync() == 0 and replica.duplicates == 0 and replica.applied == 3
    fill(log, [("o2", "restock")], start=3)
    assert replica.sync() == 1 and replica.applied == 4 and replica.duplicates == 0
    assert replica.digest() == synced(log).digest()


def logged(pos: int, seq: int, name: str, event_id: str, after: tuple[int, ...] = ()) -> LoggedEvent:
    return LoggedEvent(
        id=event_id, machine=order_machine().digest, record="o", event=name, producer="p",
        producer_seq=pos, log="main", position=pos, record_seq=seq, after=after,
    )  # fmt: skip


@pytest.mark.parametrize("order", [(1, 2, 0), (0, 1, 2), (0, 2, 1), (2, 0, 1)])
def test_two_events_at_one_position_are_refused_in_every_arrival_order(order: tuple[int, int, int]) -> None:
    first = logged(0, 0, "restock", "e0")
    pay = logged(1, 1, "pay", "e1", after=(0,))
    forged = logged(1, 1, "cancel", "e1-forged", after=(0,))
    events = [first, pay, forged]
    replica = Replica(order_machine(), order_log())
    with pytest.raises(LogCorrupted, match="two different events claim log position 1"):
        for i in order:
            replica.deliver([events[i]])


def _deliver(replica: Replica, arrivals: list[LoggedEvent], one_at_a_time: bool) -> None:
    """Deliver `arrivals` one event per call, or all in one call."""
    if one_at_a_time:
        for event in arrivals:
            replica.deliver([event])
    else:
        replica.deliver(arrivals)


@settings(max_examples=60, deadline=None)
@given(ops.filter(bool), st.data(), st.randoms(use_true_random=False), st.booleans())
def test_a_conflicting_copy_of_any_position_is_refused_in_any_delivery(
    history: list[tuple[str, str]], data: st.DataObject, rnd: random.Random, one_at_a_time: bool
) -> None:
    log = order_log()
    stored = fill(log, history * 2)  # at least 2 events, often more than a batch
    victim = stored[data.draw(st.integers(0, len(stored) - 1))]
    forged = LoggedEvent(**{**victim.model_dump(), "id": "forged"})
    arrivals = [*stored, forged, *stored[:3]]
    rnd.shuffle(arrivals)
    with pytest.raises(LogCorrupted, match=f"claim log position {victim.position}"):
        _deliver(Replica(order_machine(), log), arrivals, one_at_a_time)


@settings(max_examples=60, deadline=None)
@given(ops.filter(bool), st.data(), st.randoms(use_true_random=False), st.booleans())
def test_two_events_with_one_record_number_are_refused_in_any_delivery(
    history: list[tuple[str, str]], data: st.DataObject, rnd: random.Random, one_at_a_time: bool
) -> None:
    log = order_log()
    stored = fill(log, history * 2)
    victim = stored[data.draw(st.integers(0, len(stored) - 1))]
    forged = LoggedEvent(**{**victim.model_dump(), "id": "forged", "position": len(stored)})
    arrivals = [*stored, forged]
    rnd.shuffle(arrivals)
    with pytest.raises(LogCorrupted, match=f"is number {victim.record_seq} of record"):
        _deliver(Replica(order_machine(), log), arrivals, one_at_a_time)


def test_an_identical_copy_of_an_applied_position_is_a_duplicate() -> None:
    log = order_log()
    stored = fill(log, [("o1", "pay"), ("o1", "restock")])
    replica = synced(log)
    copy = LoggedEvent(**stored[0].model_dump())
    assert replica.deliver([copy, stored[1]]) == 0 and replica.duplicates == 2


# -- a copy of an applied event is a duplicate only when every field is equal -------------------------------

CONTENT = ["record", "event", "record_seq", "producer", "producer_seq", "deps", "after"]
FINGERPRINTED = {"record", "event", "record_seq"}  # with the id: what a replica keeps of an applied event
# How the replica applied the log: its vectorized fold, a shuffled delivery, one event per call, a restore
# from a checkpoint (the positions before it have no fingerprint), or tracking the Merkle root.
BUILT = ["sync", "shuffled", "one_at_a_time", "checkpoint", "track_root"]


def _changed(victim: LoggedEvent, field: str, data: st.DataObject) -> LoggedEvent:
    """`victim` with `field` set to another value (an `after` still names earlier positions only)."""
    values: dict[str, st.SearchStrategy[Any]] = {
        "record": st.sampled_from([*RECORDS, "o9"]),
        "event": st.sampled_from(order_machine().events),
        "record_seq": st.integers(0, 60),
        "producer": st.sampled_from(["p", "q", "mallory"]),
        "producer_seq": st.integers(0, 60),
        "deps": st.sampled_from([(), ("e0",), ("e0", "e1"), ("x",)]),
        "after": st.lists(st.integers(0, max(victim.position - 1, 0)), max_size=2, unique=True).map(
            lambda positions: tuple(sorted(positions))
        ),
    }
    value = data.draw(values[field].filter(lambda v: v != getattr(victim, field)), label=field)
    return LoggedEvent(**{**victim.model_dump(), field: value})


def _built(log: EventLog, stored: list[LoggedEvent], how: str, rnd: random.Random) -> Replica:
    """A replica that applied all of `stored` (the whole log) the way `how` names."""
    if how == "checkpoint":
        first = Replica(order_machine(), log)
        first.deliver(stored[: len(stored) // 2])
        replica = Replica(order_machine(), log, checkpoint=first.checkpoint())
        replica.sync()
        return replica
    replica = Replica(order_machine(), log, track_root=how == "track_root")
    if how == "sync":
        replica.sync()
    else:
        arrivals = list(stored)
        rnd.shuffle(arrivals)
        _deliver(replica, arrivals, how == "one_at_a_time")
    return replica


def _observed(replica: Replica) -> tuple[Any, ...]:
    """Everything a replica's user can read of its state."""
    root = replica.root() if replica._tree is not None else None
    return replica.digest(), replica.states(), replica.position, replica.pending, replica.applied, root


@settings(max_examples=120, deadline=None)
@given(
    ops.filter(bool),
    st.booleans(),
    st.sampled_from(BUILT),
    st.sampled_from(CONTENT),
    st.data(),
    st.randoms(use_true_random=False),
    st.booleans(),
)
def test_a_copy_of_an_applied_event_with_one_field_changed_is_refused_and_changes_nothing(
    history: list[tuple[str, str]],
    chained: bool,
    how: str,
    field: str,
    data: st.DataObject,
    rnd: random.Random,
    one_at_a_time: bool,
) -> None:
    """Among identical copies of the whole log (redelivered, each one a duplicate), a copy of one applied
    event with any one field changed is refused, naming its id and that field; everything delivered
    before it counts as the duplicate it is, and the replica's state is what it was. Identical copies
    delivered afterwards are still duplicates."""
    log = order_log()
    stored = fill(log, history * 2, chained=chained)  # at least 2 events, often more than a batch
    replica = _built(log, stored, how, rnd)
    victim = stored[data.draw(st.integers(0, len(stored) - 1), label="victim")]
    assume(field != "after" or victim.position > 0)
    forged = _changed(victim, field, data)
    copies = [LoggedEvent(**e.model_dump()) for e in stored]  # equal to the applied events, not them
    rnd.shuffle(copies)
    k = data.draw(st.integers(0, len(copies)), label="where")
    before, duplicates = _observed(replica), replica.duplicates
    with pytest.raises(
        LogCorrupted, match=rf"event '{victim.id}' claim log position {victim.position}"
    ) as refused:
        _deliver(replica, [*copies[:k], forged, *copies[k:]], one_at_a_time)
    assert f"in {field} " in str(refused.value) or f", {field} " in str(refused.value)
    assert _observed(replica) == before and replica.duplicates == duplicates + k
    assert replica.deliver(copies) == 0 and replica.duplicates == duplicates + k + len(copies)
    assert _observed(replica) == before


def _applied_a_wrong_copy(
    replica: Replica, arrivals: list[LoggedEvent], one_at_a_time: bool, victim: LoggedEvent
) -> bool:
    """Deliver `arrivals`, one of them a changed copy of `victim`: True when that copy was applied; False
    (noted) when it was refused on its own or waits for an event that never comes."""
    try:
        _deliver(replica, arrivals, one_at_a_time)
    except LogCorrupted:
        event("the changed copy contradicts the log's record numbers on its own")
        return False
    if replica.position <= victim.position:
        event("the changed copy waits for an event that never comes")
        return False
    return True


@settings(max_examples=120, deadline=None)
@given(
    ops.filter(bool),
    st.booleans(),
    st.sampled_from(["shuffled", "one_at_a_time", "track_root"]),
    st.sampled_from(CONTENT),
    st.data(),
    st.booleans(),
)
def test_the_logs_event_after_a_different_copy_was_applied_is_refused(
    history: list[tuple[str, str]],
    chained: bool,
    how: str,
    field: str,
    data: st.DataObject,
    one_at_a_time: bool,
) -> None:
    """A changed copy applied first, the log's own event arriving after it is refused too when they differ
    in what the replica keeps (its fingerprint, and every field when it tracks the root). When they
    differ only in a field that applying ignores (producer, producer_seq, deps, after), a replica that
    does not track the root cannot tell, and its state is the log's either way."""
    log = order_log()
    stored = fill(log, history * 2, chained=chained)
    victim = stored[data.draw(st.integers(0, len(stored) - 1), label="victim")]
    assume(field != "after" or victim.position > 0)
    forged = _changed(victim, field, data)
    replica = Replica(order_machine(), log, track_root=how == "track_root")
    arrivals = [forged if e is victim else e for e in stored]
    if not _applied_a_wrong_copy(replica, arrivals, how == "one_at_a_time" or one_at_a_time, victim):
        return
    before = _observed(replica)
    if field in FINGERPRINTED or how == "track_root":
        event("the log's event is refused")
        with pytest.raises(LogCorrupted, match=rf"claim log position {victim.position}\b") as refused:
            replica.deliver([victim])
        assert f"'{victim.id}'" in str(refused.value)
        assert _observed(replica) == before
    else:
        event("the log's event is a duplicate, and the state is the log's")
        assert replica.deliver([victim]) == 0
        assert replica.digest() == synced(log).digest()


@settings(max_examples=120, deadline=None)
@given(ops.filter(bool), st.booleans(), st.sampled_from(CONTENT), st.data(), st.booleans(), st.booleans())
def test_sync_and_checkpoint_find_a_wrong_copy_that_deliver_applied(
    history: list[tuple[str, str]],
    chained: bool,
    field: str,
    data: st.DataObject,
    one_at_a_time: bool,
    then_checkpoint: bool,
) -> None:
    """The log's own event never arrives by deliver() after a wrong copy was applied: sync() reads the log
    again from the first position deliver() applied and compares, and checkpoint() compares before it
    saves; either refuses a copy that differs in what the replica keeps. A copy differing only in what
    applying ignores leaves the log's state, and the checkpoint names the log's own event."""
    log = order_log()
    stored = fill(log, history * 2, chained=chained)
    victim = stored[data.draw(st.integers(0, len(stored) - 1), label="victim")]
    assume(field != "after" or victim.position > 0)
    forged = _changed(victim, field, data)
    replica = Replica(order_machine(), log)
    upto = data.draw(st.integers(victim.position + 1, len(stored)), label="delivered up to")
    arrivals = [forged if e is victim else e for e in stored[:upto]]
    if not _applied_a_wrong_copy(replica, arrivals, one_at_a_time, victim):
        return
    check = replica.checkpoint if then_checkpoint else replica.sync
    if field in FINGERPRINTED:
        event("the wrong copy is found")
        with pytest.raises(LogCorrupted, match=rf"claim log position {victim.position}"):
            check()
        with pytest.raises(LogCorrupted):  # and again: the state stays refused, not silently the log's
            replica.sync()
    else:
        event("the state is the log's")
        check()
        replica.sync()
        assert replica.digest() == synced(log).digest() and replica.position == len(stored)
        saved = replica.checkpoint()
        assert saved.last_id == stored[-1].id
        Replica(order_machine(), log, checkpoint=saved)  # restores onto the log it names


def test_a_copy_applied_past_the_logs_end_is_compared_when_the_log_reaches_it() -> None:
    """A forged event at the log's next position, applied by deliver(); the log's real event lands there
    later: sync() refuses it instead of reading on past it, and a checkpoint is refused meanwhile (the log
    does not hold what the replica applied)."""
    log = order_log()
    stored = fill(log, [("o1", "restock"), ("o1", "pay")])
    replica = synced(log)
    forged = LoggedEvent(**{**stored[1].model_dump(), "id": "forged", "position": 2, "record_seq": 2,
                            "event": "ship", "after": ()})  # fmt: skip
    assert replica.deliver([forged]) == 1 and replica.position == 3
    with pytest.raises(ReplicaError, match="does not hold position 2"):
        replica.checkpoint()
    assert replica.sync() == 0  # the log holds nothing there yet
    fill(log, [("o1", "cancel"), ("o2", "pay")], start=2)
    # Not "two copies of the log's event": the event applied there had another id ('forged').
    with pytest.raises(LogCorrupted, match="two different events claim log position 2: the log's event '"):
        replica.sync()


@pytest.mark.parametrize("then_checkpoint", [False, True])
def test_a_wrong_copy_buffered_across_a_sync_is_compared_once_it_is_applied(then_checkpoint: bool) -> None:
    """A wrong copy waits in the buffer (an earlier event of its record has not come); a later deliver()
    releases it into the applied events. The sync after that (or a checkpoint) still compares its position
    with the log's event. (A sync that brings the prefix up to the waiting copy refuses it there: no
    position before it holds the event it waits for.)"""
    log = order_log()
    stored = fill(log, [("o1", "restock")])
    replica = synced(log)
    forged = LoggedEvent(**{**stored[0].model_dump(), "id": "z", "position": 2, "record_seq": 2,
                            "event": "cancel", "producer_seq": 2})  # fmt: skip
    assert replica.deliver([forged]) == 0 and replica.pending == 1  # o1 #1 has not come
    fill(log, [("o2", "pay")], start=1)
    waiting = Replica(order_machine(), log)
    waiting.deliver([forged])
    with pytest.raises(LogCorrupted, match="number 2 of record 'o1', but 1 events of that record are app"):
        waiting.sync()  # position 2: the copy waits for an event of o1 no earlier position holds
    stored = fill(log, [("o3", "restock"), ("o1", "pay")], start=2)  # the log's 'z' is o3's restock
    assert replica.deliver([stored[3]]) == 2  # o1 #1, and the forged copy it releases
    assert replica.deliver([stored[1]]) == 1 and replica.position == 4  # the prefix closes past the copy
    with pytest.raises(LogCorrupted, match="claim log position 2"):
        replica.checkpoint() if then_checkpoint else replica.sync()


def test_sync_after_deliver_compares_without_counting_duplicates_or_applying_twice() -> None:
    log = order_log()
    stored = fill(log, [(RECORDS[i % 3], "restock") for i in range(40)])
    replica = Replica(order_machine(), log)
    arrivals = [e for e in stored if e.position != 17]  # one lost in transit
    replica.deliver(arrivals)
    assert replica.position == 17 and replica.pending > 0
    before = replica.applied
    assert replica.sync() == 40 - before  # the lost event, and what waited for it
    assert replica.sync() == 0
    assert replica.duplicates == 0 and replica.applied == 40 and replica.pending == 0
    assert replica.digest() == synced(log).digest() and replica.checkpoint().position == 40


@settings(max_examples=60, deadline=None)
@given(ops.filter(bool), st.randoms(use_true_random=False), st.booleans())
def test_the_logs_own_events_delivered_in_any_order_pass_syncs_comparison(
    history: list[tuple[str, str]], rng: random.Random, checkpoint_first: bool
) -> None:
    log = order_log()
    stored = fill(log, history)
    arrivals = stored[:]
    rng.shuffle(arrivals)
    replica = Replica(order_machine(), log)
    replica.deliver(arrivals)
    if checkpoint_first:
        replica.checkpoint()
    assert replica.sync() == 0
    assert replica.digest() == synced(log).digest() and replica.checkpoint().position == len(stored)


@pytest.mark.parametrize(
    "update",
    [{"position": "3"}, {"record_seq": 2**63}, {"after": ("0",)}, {"event": ""}, {"producer_seq": True}],
)
def test_a_changed_copy_is_validated_as_a_new_event_is(update: dict[str, Any]) -> None:
    """pydantic's model_copy(update=...) takes any value unchecked; an event's copy is validated, so a
    replica never meets a field of another type (a forged position "3" crashed deliver with TypeError)."""
    log = order_log()
    stored = fill(log, [("o1", "restock"), ("o1", "pay"), ("o2", "pay"), ("o1", "ship")])
    with pytest.raises(InvalidInput, match=next(iter(update))):
        stored[3].model_copy(update=update)
    assert stored[3].model_copy() == stored[3]
    assert stored[3].model_copy(update={"event": "cancel"}).event == "cancel"  # a valid change is made


@pytest.mark.parametrize("field", CONTENT)
def test_copies_spread_over_a_long_log_are_compared_with_the_log_too(field: str) -> None:
    """Copies far apart in the log are looked up by id (not by reading the range they span), and a copy
    whose id the log holds at another position by its position."""
    log = order_log()
    stored = fill(log, [(RECORDS[i % 3], "restock") for i in range(300)], chained=True)
    spread = [*stored[0:300:20], stored[299]]  # a batch: the replica compares its copies all at once
    replica = synced(log)
    assert replica.deliver([LoggedEvent(**e.model_dump()) for e in spread]) == 0 and replica.duplicates == 16
    value = {"record": "o9", "event": "pay", "record_seq": 5, "producer": "q", "producer_seq": 1,
             "deps": (), "after": (1,)}[field]  # fmt: skip
    forged = LoggedEvent(**{**stored[140].model_dump(), field: value})
    before = _observed(replica)
    with pytest.raises(LogCorrupted, match=f"event 'e140' claim log position 140.* in {field} "):
        replica.deliver([*spread[:7], forged, *spread[8:]])
    assert _observed(replica) == before and replica.duplicates == 16 + 7
    elsewhere = LoggedEvent(**{**stored[0].model_dump(), "id": "e150"})  # the log holds e150 at 150
    foreign = Replica(order_machine(), log)
    foreign.deliver([elsewhere, *stored[1:]])
    with pytest.raises(LogCorrupted, match="two different events claim log position 0: 'e0' and 'e150'"):
        foreign.deliver([elsewhere, *spread[1:]])


def test_copies_are_compared_with_a_durable_log(log_url: str, log_name: str) -> None:
    """The events a durable log reads back are equal to the ones it was given, so their copies are
    duplicates there too (read by another handle, one at a time or in a batch), and a changed one is
    refused."""
    log = order_log(log_url, name=log_name)
    stored = fill(log, [(RECORDS[i % 3], order_machine().events[i % 5]) for i in range(24)], chained=True)
    replica = synced(log)
    copies = order_log(log_url, name=log_name).read()
    random.Random(1).shuffle(copies)
    assert replica.deliver(copies) == 0 and replica.deliver(copies[:3]) == 0 and replica.duplicates == 27
    forged = LoggedEvent(**{**stored[5].model_dump(), "producer_seq": 99})
    with pytest.raises(LogCorrupted, match="differs from the log's event there in producer_seq 99"):
        replica.deliver([*copies, forged])
    with pytest.raises(LogCorrupted, match="differs from the log's event there in producer_seq 99"):
        replica.deliver([forged])
    assert replica.position == 24 and replica.digest() == synced(log).digest()


def test_a_copy_is_compared_with_a_log_that_does_not_hold_its_event_by_its_fingerprint_only() -> None:
    """Events delivered by hand to a replica of an empty log: a copy of an applied one is refused when its
    id, record, event or record_seq differ, and taken as a duplicate otherwise (the log has nothing to
    compare the rest with)."""
    replica = Replica(order_machine(), order_log())
    first = logged(0, 0, "restock", "e0")
    replica.deliver([first])
    with pytest.raises(LogCorrupted, match="claim log position 0"):
        replica.deliver([logged(0, 0, "pay", "e0")])
    assert replica.deliver([LoggedEvent(**{**first.model_dump(), "producer": "q"})]) == 0
    assert replica.duplicates == 1 and replica.state("o")["stock"] == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=20), st.text(max_size=20), st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)
        ),
        min_size=1,
        max_size=40,
    )
)
def test_the_folds_fingerprints_are_the_ones_a_single_event_gets(
    rows: list[tuple[str, str, int, int]],
) -> None:
    """The fold mixes the hashes of the ids and records with the codes (int32) and the record_seqs for a
    whole batch with numpy (uint64, wrapping): the same numbers `_mix` gives one event at a time."""
    events = [
        LoggedEvent(
            id=f"e{i}-{r[0]!r}", machine="0" * 64, record=f"r-{r[1]!r}", event="pay", producer="p",
            producer_seq=i, record_seq=r[3], position=i, log="l",
        )
        for i, r in enumerate(rows)
    ]
    names = sorted({e.record for e in events})
    rec = np.array([names.index(e.record) for e in events], dtype=np.int64)
    codes = np.array([r[2] for r in rows], dtype=np.int32)
    seqs = np.array([r[3] for r in rows], dtype=np.int64)
    got = array("q", _replica._fingerprints(events, names, rec, codes, seqs)).tolist()
    assert got == [_replica._fingerprint(e, r[2]) for e, r in zip(events, rows, strict=True)]


def test_a_fold_keeps_the_fingerprint_of_each_event() -> None:
    """A fold keeps the fingerprint a single event gets, and a copy that differs from it is refused."""
    log = order_log()
    stored = fill(log, [(RECORDS[i % 3], order_machine().events[i % 5]) for i in range(40)], chained=True)
    replica = synced(log)
    index = {name: i for i, name in enumerate(order_machine().events)}
    assert replica._prints.tolist() == [_replica._fingerprint(e, index[e.event]) for e in stored]
    with pytest.raises(LogCorrupted, match="differs from the event this replica applied there"):
        replica.deliver([*stored, LoggedEvent(**{**stored[7].model_dump(), "event": "refund"})])


# -- dependencies that can never be applied -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "late"),
    [((0,), "position 0 is"), ((1,), "position 1 is"), ((0, 5), "positions [0, 5] are")],
)
@pytest.mark.parametrize("batch", [False, True])
def test_an_event_depending_on_itself_or_a_later_position_is_refused(
    after: tuple[int, ...], late: str, batch: bool
) -> None:
    """The message said "a dependency lies before its event", the one place a dependency may lie: it
    names the positions at or after the event's own."""
    log = order_log()
    stored = fill(log, [("o1", "restock")] * 20)
    bad = logged(0, 0, "restock", "e0", after=after)
    replica = Replica(order_machine(), log)
    with pytest.raises(LogCorrupted, match=rf"{re.escape(late)} at or after its own: .*would wait forever"):
        replica.deliver([bad, *stored[1:]] if batch else [bad])
    assert replica.position == 0 and replica.pending == 0


def test_a_dependency_moved_past_its_event_by_hand_is_named_as_lying_after_it(tmp_path: Path) -> None:
    """Two rows of a SQLite log swapped by hand: the event at position 0 depends on the one now at 2."""
    url = f"sqlite:///{tmp_path}/events.db"
    log = order_log(url)
    digest = order_machine().digest
    log.append(Event(id="e0", machine=digest, record="o1", event="restock", producer="p"))
    log.append(Event(id="e1", machine=digest, record="o2", event="restock", producer="q"))
    log.append(Event(id="e2", machine=digest, record="o1", event="pay", producer="p", deps=("e0",)))
    log.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "events.db")) as raw, raw:
        raw.execute('UPDATE govern_events SET "position" = -1 WHERE "position" = 0')
        raw.execute('UPDATE govern_events SET "position" = 0 WHERE "position" = 2')
        raw.execute('UPDATE govern_events SET "position" = 2 WHERE "position" = -1')
    refused = r"depends on positions \[0\], but position 0 is at or after its own"
    with pytest.raises(LogCorrupted, match=refused):
        Replica(order_machine(), order_log(url)).sync()


# -- #6: bad input names the argument -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "where"),
    [
        (None, "events"),
        ("[]", "events"),
        ({"position": 0}, "events"),
        ([None], "events[0]"),
        (["x"], "events[0]"),
        ([{"id": "e0"}], "events[0]"),
        ([Event(id="x", machine=order_machine().digest, record="r", event="pay", producer="p")], "events[0]"),
    ],
)
def test_deliver_refuses_anything_but_logged_events(events: Any, where: str) -> None:
    replica = Replica(order_machine(), order_log())
    with pytest.raises(InvalidInput) as caught:
        replica.deliver(events)
    assert caught.value.field == where


def test_a_bad_item_in_a_batch_applies_nothing() -> None:
    log = order_log()
    stored = fill(log, [("o1", "restock")] * 20)
    replica = Replica(order_machine(), log)
    with pytest.raises(InvalidInput, match=r"events\[20\].*dict"):
        replica.deliver([*stored, stored[0].model_dump(mode="json")])
    assert replica.position == 0 and replica.pending == 0
    assert replica.deliver(stored) == 20


def test_the_replica_constructor_and_sync_name_a_bad_argument() -> None:
    machine, log = order_machine(), order_log()
    cases: list[tuple[str, Any]] = [
        ("log", lambda: Replica(machine, "memory://")),  # type: ignore[arg-type]
        ("machine", lambda: Replica(machine.digest, log)),  # type: ignore[arg-type]
        ("checkpoint", lambda: Replica(machine, log, checkpoint={"machine": machine.digest})),  # type: ignore[arg-type]
        ("track_root", lambda: Replica(machine, log, track_root="yes")),  # type: ignore[arg-type]
        ("page", lambda: Replica(machine, log).sync(page=0)),
        ("page", lambda: Replica(machine, log).sync(page=True)),
    ]
    for field, call in cases:
        with pytest.raises(InvalidInput) as caught:
            call()
        assert caught.value.field == field


def test_a_checkpoint_refuses_bad_fields() -> None:
    log = order_log()
    fill(log, [("o1", "pay")])
    good = synced(log).checkpoint().model_dump()
    for change, field in [
        ({"format": "nope"}, "format"),
        ({"record_lengths": {"o1": -5}}, "record_lengths.o1"),
        # Beyond a 64-bit log position: the batched fold failed on it with a bare OverflowError.
        ({"record_lengths": {"o1": 2**63}}, "record_lengths.o1"),
        # More events than the prefix holds (the fold would count on from a length no log has).
        ({"record_lengths": {"o1": 2**63 - 1}}, "Checkpoint"),
        ({"position": -1}, "position"),
        ({"position": 2**63}, "position"),
        ({"states": {"o1": True}}, "states.o1"),
        ({"last_id": None, "last_leaf": None}, "Checkpoint"),
        ({"record_lengths": {"o1": 0}}, "Checkpoint"),  # the prefix's events not counted
        ({"record_lengths": {"o1": 1, "o9": 0}}, "Checkpoint"),  # a record without a state
        ({"seal": None}, "Checkpoint"),  # format 3 is sealed
        ({"format": "govern-replica-checkpoint/2"}, "Checkpoint"),  # and only it
    ]:
        with pytest.raises(InvalidInput) as caught:
            Checkpoint(**{**good, **change})
        assert caught.value.field == field
        with pytest.raises(InvalidInput) as caught:
            Checkpoint.model_validate({**good, **change})
        assert caught.value.field == field


@pytest.mark.parametrize(
    ("text", "field"),
    [("{", "Checkpoint"), ("[]", "Checkpoint"), ('{"format": "govern-replica-checkpoint/2"}', "machine")],
)
def test_reading_a_saved_checkpoint_that_is_not_one_names_the_problem(text: str, field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        Checkpoint.model_validate_json(text)
    assert caught.value.field == field


# -- #7: a family's tool arguments match exactly -----------------------------------------------------------


def family_machine() -> govern.Machine:
    r = govern.Registry("fam")
    n = r.int("n", 0, 3)
    flag = r.bool("flag")
    r.event("setn", params={"v": [0, 1, 2]}, effect=lambda v: {n: v})
    r.event("setf", params={"b": [True, False]}, effect=lambda b: {flag: b})
    r.ordered()
    return r.build()


@settings(max_examples=80, deadline=None)
@given(
    st.one_of(
        st.booleans(), st.integers(-3, 5), st.floats(-3, 5, allow_nan=False), st.text(max_size=3), st.none()
    )
)
def test_family_arguments_match_a_declared_value_of_the_same_type_only(value: object) -> None:
    machine = family_machine()
    log = EventLog("memory://", machine=machine)
    tools = {name: govern.event_tool(machine, log, name) for name in ("setn", "setf")}
    for name, param, values in [("setn", "v", [0, 1, 2]), ("setf", "b", [True, False])]:
        exact = any(type(value) is type(v) and value == v for v in values)
        if exact:
            validated = tools[name].validate({param: value, "record": "x"})
            assert validated.model_dump(by_alias=True)[param] is value
        else:
            with pytest.raises(ToolArgumentsInvalid, match=param):
                tools[name].validate({param: value, "record": "x"})
    assert log.length() == 0


def test_family_tool_schema_still_lists_the_values() -> None:
    machine = family_machine()
    tool = govern.event_tool(machine, EventLog("memory://", machine=machine), "setn")
    assert tool.spec.parameters["properties"]["v"]["enum"] == [0, 1, 2]
