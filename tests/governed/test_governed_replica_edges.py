"""Replica edges: checkpoints bound to their log, conflicting events at one position, bad input, and
exact matching of a family's tool arguments."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import govern
from bide._tools import ToolArgumentsInvalid
from govern.runtime._eventlog import Event, EventLog, InvalidInput, LogCorrupted, LoggedEvent
from govern.runtime._replica import Checkpoint, Replica, ReplicaError

from .machines import order_log, order_machine

RECORDS = ["o1", "o2", "o3"]


def fill(
    log: EventLog, events: list[tuple[str, str]], prefix: str = "e", start: int = 0
) -> list[LoggedEvent]:
    """Append (record, event) pairs with ids prefix0, prefix1, ...; return the whole stored log."""
    digest = order_machine().digest
    for i, (record, name) in enumerate(events, start):
        log.append(Event(id=f"{prefix}{i}", machine=digest, record=record, event=name, producer="p"))
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
    renamed = Checkpoint(**{**saved.model_dump(), "log": f"{log_name}-copy"})
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
    ahead = Checkpoint(**{**good.model_dump(), "position": 10})
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
    assert current.format == "govern-replica-checkpoint/2" and current.last_id == "e1"
    old = current.model_dump(exclude={"last_id", "last_leaf"})
    old["format"] = "govern-replica-checkpoint/1"
    v1 = Checkpoint.model_validate_json(Checkpoint(**old).model_dump_json())
    resumed = Replica(order_machine(), log, checkpoint=v1)
    assert resumed.checkpoint() == current  # renewed in format 2, naming the log's event
    with pytest.raises(ReplicaError, match="holds only 1 events"):
        short = order_log()
        fill(short, [("o1", "pay")])
        Replica(order_machine(), short, checkpoint=v1)


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


# -- dependencies that can never be applied -----------------------------------------------------------------


@pytest.mark.parametrize("after", [(0,), (1,), (0, 5)])
@pytest.mark.parametrize("batch", [False, True])
def test_an_event_depending_on_itself_or_a_later_position_is_refused(
    after: tuple[int, ...], batch: bool
) -> None:
    log = order_log()
    stored = fill(log, [("o1", "restock")] * 20)
    bad = logged(0, 0, "restock", "e0", after=after)
    replica = Replica(order_machine(), log)
    with pytest.raises(LogCorrupted, match="would wait forever"):
        replica.deliver([bad, *stored[1:]] if batch else [bad])
    assert replica.position == 0 and replica.pending == 0


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
        ({"position": -1}, "position"),
        ({"states": {"o1": True}}, "states.o1"),
        ({"last_id": None, "last_leaf": None}, "Checkpoint"),
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
            assert getattr(tools[name].validate({param: value, "record": "x"}), param) is value
        else:
            with pytest.raises(ToolArgumentsInvalid, match=param):
                tools[name].validate({param: value, "record": "x"})
    assert log.length() == 0


def test_family_tool_schema_still_lists_the_values() -> None:
    machine = family_machine()
    tool = govern.event_tool(machine, EventLog("memory://", machine=machine), "setn")
    assert tool.spec.parameters["properties"]["v"]["enum"] == [0, 1, 2]
