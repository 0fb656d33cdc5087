"""event_tool: agents append governed events; a retry after a crash appends nothing new."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

import bide
import govern
from bide.testing import Call, CrashingStore, ScriptedModel, SimulatedCrash, Turn, reply
from govern.runtime._agents import event_id_for, event_tool, producer_for
from govern.runtime._eventlog import Appended, Event, EventLog, EventLogError, LogTimeout
from govern.runtime._replica import Replica

from .machines import order_log, order_machine

SCRIPT = [
    Turn(calls=(Call("pay", {"record": "o1"}),)),
    Turn(calls=(Call("ship", {"record": "o1"}), Call("restock", {"record": "o1"}))),
    Turn(calls=(Call("ship", {"record": "o1"}),)),
    Turn(calls=(Call("cancel", {"record": "o1"}),)),
    reply("done"),
]


def agent_for(store: bide.Store, log: EventLog, *, later: float = 0.0) -> bide.Agent:
    """`later`: the agent's clock runs that many seconds ahead (a restart after a crashed driver's lease
    expired)."""
    machine = order_machine()
    tools = [event_tool(machine, log, e) for e in machine.events]
    return bide.Agent(
        ScriptedModel(SCRIPT), store=store, tools=tools, name="clerk", clock=lambda: time.time() + later
    )


def results(store: bide.Store, run_id: str) -> list[dict[str, object]]:
    journal = bide.Journal(store, run_id).load()
    return [r.result for r in journal.records() if isinstance(r, bide.ToolResult)]


def test_the_model_sees_the_consequence_of_each_event() -> None:
    store, log = bide.MemoryStore(), EventLog("memory://")
    assert agent_for(store, log).run_sync("r1", "go").answer == "done"
    seen = results(store, "r1")
    assert [(r["event"], r["outcome"]) for r in seen] == [
        ("pay", "applied"),
        ("ship", "no-op"),  # no stock yet: the guard does not hold
        ("restock", "applied"),
        ("ship", "applied"),
        ("cancel", "no-op"),  # already shipped
    ]
    assert "guard does not hold" in str(seen[1]["why"])
    assert seen[3]["state"] == {"status": "shipped", "paid": True, "stock": 0}
    assert all(r["newly_recorded"] for r in seen)
    stored = log.read()
    assert [e.event for e in stored] == ["pay", "ship", "restock", "ship", "cancel"]
    assert {e.producer for e in stored} == {"r1"}
    # Each event depends on the producer's previous one, so replicas keep an agent's own order.
    assert [e.after for e in stored] == [(), (0,), (1,), (2,), (3,)]


def test_a_run_id_longer_than_a_producer_name_produces_under_a_shortened_one() -> None:
    """bide takes run ids up to 256 characters, a log's producer names up to 200: a run of a longer id
    (a host name prefix, say) had every governed call fail at run time, nothing appended, and the run
    still answered as if it had acted."""
    store, log = bide.MemoryStore(), EventLog("memory://")
    long_id = "host-eu-west-1.example.internal/" + "r" * 178
    other_id = long_id[:-1] + "s"  # the same first 209 characters
    for run_id in (long_id, other_id):
        assert agent_for(store, log).run_sync(run_id, "go").answer == "done"
        assert all(isinstance(r, dict) and r["newly_recorded"] for r in results(store, run_id))  # none failed
    producers = [e.producer for e in log.read()]
    assert len(producers) == 10 and set(producers) == {producer_for(long_id), producer_for(other_id)}
    assert producer_for(long_id) != producer_for(other_id) and len(producer_for(long_id)) <= 200
    assert producer_for("r1") == "r1"


def test_compensation_is_reported() -> None:
    machine = order_machine()
    log = EventLog("memory://")
    tools = {e: event_tool(machine, log, e, record="o9") for e in ("pay", "restock", "ship", "refund")}
    assert all(t.safety is bide.Idempotent for t in tools.values())
    assert tools["ship"].spec.parameters.get("properties", {}) == {}
    seen = []
    for i, name in enumerate(["pay", "restock", "ship", "refund"]):
        ctx = bide.CallContext("run-c", f"c{i}.0", name, "key", 0)
        seen.append(asyncio.run(tools[name].invoke(tools[name].validate({}), ctx)))
    last = seen[-1]
    assert last["outcome"] == "compensated"
    assert "status: 'shipped' -> 'open'" in str(last["why"])
    assert last["state"] == {"status": "open", "paid": False, "stock": 0}


def test_a_retried_call_appends_nothing_new(any_log_url: str, log_name: str) -> None:
    """A retry right after the call, and one after a later event of the same producer (the tool appends
    without reading its id first: the log's conflict tells it the event is there), on every backend."""
    machine = order_machine()
    log = EventLog(any_log_url, name=log_name)
    tool, later = event_tool(machine, log, "pay"), event_tool(machine, log, "restock")
    ctx = bide.CallContext("run-7", "c0.0", "pay", "key", 0)
    first = asyncio.run(tool.invoke(tool.validate({"record": "o1"}), ctx))
    again = asyncio.run(tool.invoke(tool.validate({"record": "o1"}), ctx))
    assert log.length() == 1
    assert first["newly_recorded"] and not again["newly_recorded"]
    assert {k: v for k, v in first.items() if k != "newly_recorded"} == {
        k: v for k, v in again.items() if k != "newly_recorded"
    }
    assert log.read()[0].id == event_id_for("run-7", "c0.0", "pay", "o1")
    later_ctx = bide.CallContext("run-7", "c1.0", "restock", "key", 0)
    asyncio.run(later.invoke(later.validate({"record": "o1"}), later_ctx))
    late = asyncio.run(tool.invoke(tool.validate({"record": "o1"}), ctx))
    assert log.length() == 2 and not late["newly_recorded"] and late["outcome"] == first["outcome"]


def call_tool(tool: bide.Tool, run_id: str, call_id: str, record: str = "o1") -> dict[str, Any]:
    """One call of an event tool, as bide makes it."""
    ctx = bide.CallContext(run_id, call_id, tool.name, "key", 0)
    result: dict[str, Any] = asyncio.run(tool.invoke(tool.validate({"record": record}), ctx))
    return result


def invoke_tool(log: EventLog, event: str, run_id: str, call_id: str) -> dict[str, Any]:
    """One call of a fresh event tool for `event` on record o1."""
    return call_tool(event_tool(order_machine(), log, event), run_id, call_id)


def test_once_the_event_is_in_the_log_the_call_succeeds_even_if_reading_the_record_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = order_log()

    def unreadable(*args: object, **kwargs: object) -> list[object]:
        raise LogTimeout("read on event log 'main' kept failing for 30 s: the connection broke")

    monkeypatch.setattr(log, "read_record", unreadable)
    result = invoke_tool(log, "pay", "run-r", "c0.0")
    assert result["outcome"] == "recorded" and result["state"] is None and result["newly_recorded"] is True
    assert "is recorded at log position 0" in str(result["why"]) and "instead of repeating" in str(
        result["why"]
    )
    assert [e.event for e in log.read()] == ["pay"]


def test_a_history_holding_a_name_the_machine_lacks_does_not_fail_the_call(tmp_path: Path) -> None:
    """A log written before names were checked may hold one: the tool still reports its own event as
    recorded (it is in the log) instead of failing with a KeyError after appending."""
    log = order_log(str(tmp_path / "events.db"))
    invoke_tool(log, "pay", "run-h", "c0.0")
    with sqlite3.connect(tmp_path / "events.db") as raw:
        raw.execute("UPDATE govern_events SET event = 'shipp' WHERE position = 0")
    result = invoke_tool(log, "restock", "run-h", "c1.0")
    assert result["outcome"] == "recorded" and result["newly_recorded"] is True and result["position"] == 1
    assert "names 'shipp'" in str(result["why"])


def test_an_append_that_failed_after_its_commit_is_reported_as_done(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The event carries the failed append's own token: this call recorded it."""
    log = order_log(str(tmp_path / "events.db"))
    append = log._append_items

    def committed_then_lost(items: list[Event], writer: str | None = None) -> list[Appended]:
        append(items, writer)
        raise LogTimeout("append kept failing: the connection broke at commit")

    monkeypatch.setattr(log, "_append_items", committed_then_lost)
    result = invoke_tool(log, "pay", "run-a", "c0.0")
    assert result["outcome"] == "applied" and result["newly_recorded"] is True
    assert log.length() == 1


def test_an_append_that_failed_before_its_commit_is_an_error_or_in_doubt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not in the log after a failure of this call's own append: the call failed. Not in the log after a
    wait on the log's lock that timed out: in doubt, as the session holding the lock may be an earlier drive
    of this call whose append can still commit (tests/governed/test_governed_paused_driver.py)."""
    log = order_log()

    def broken(items: list[Event], writer: str | None = None) -> list[Appended]:
        raise EventLogError("append failed: the disk holding the log is full")

    monkeypatch.setattr(log, "_append_items", broken)
    with pytest.raises(EventLogError, match="disk holding the log is full"):
        invoke_tool(log, "pay", "run-b", "c0.0")

    def waited(items: list[Event], writer: str | None = None) -> list[Appended]:
        raise LogTimeout("append gave up: another session holds the log's lock")

    monkeypatch.setattr(log, "_append_items", waited)
    with pytest.raises(bide.CallInDoubt, match=r"holds the log's lock.*earlier drive of this call"):
        invoke_tool(log, "pay", "run-b", "c0.0")
    get = log.get

    def unreadable(event_id: str) -> object:
        if log.length() == 0 and event_id.startswith("ev-"):
            calls.append(event_id)  # the tool reads its id only after a failed append: the read back
            raise LogTimeout("read kept failing")
        return get(event_id)

    calls: list[str] = []
    monkeypatch.setattr(log, "get", unreadable)
    with pytest.raises(bide.CallInDoubt, match="may or may not be in the log"):
        invoke_tool(log, "pay", "run-b", "c1.0")
    assert log.length() == 0 and len(calls) == 1


def test_an_append_in_doubt_stops_the_drive_and_the_next_drive_appends_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commit landed, its answer was lost and the log stayed unreachable past the read back: the call
    is in doubt. The model is not told it failed (it would call again, a new call with a new event id, and
    the event would be recorded twice): nothing is journaled for the call, the drive raises CallInDoubt,
    and the next drive calls again with the same event id, which finds the event already appended."""
    log = order_log()
    append, get = log._append_items, log.get
    down = [True]

    def committed_then_lost(items: list[Event], writer: str | None = None) -> list[Appended]:
        appended = append(items, writer)
        if down[0]:
            raise LogTimeout("append kept failing: the connection broke at commit")
        return appended

    def unreadable(event_id: str) -> object:
        if down[0]:
            raise LogTimeout("read kept failing: the log is unreachable")
        return get(event_id)

    monkeypatch.setattr(log, "_append_items", committed_then_lost)
    monkeypatch.setattr(log, "get", unreadable)
    store = bide.MemoryStore()
    machine = order_machine()
    model = ScriptedModel([Turn(calls=(Call("restock", {"record": "o1"}),)), reply("restocked")])
    agent = bide.Agent(model, store=store, tools=[event_tool(machine, log, "restock")], name="clerk")
    with pytest.raises(bide.CallInDoubt, match="may or may not be in the log"):
        agent.run_sync("r", "restock o1")
    journal = bide.Journal(store, "r").load()
    assert not [r for r in journal.records() if isinstance(r, bide.ToolResult)]  # the model was told nothing
    assert log.length() == 1  # the commit landed
    down[0] = False
    assert agent.run_sync("r", "restock o1").answer == "restocked"
    assert [e.event for e in log.read()] == ["restock"]  # once
    [result] = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.ToolResult)]
    assert not result.is_error and result.result["newly_recorded"] is False
    assert len(model.requests) == 2  # turn 0 once, then turn 1 with the settled result


def test_unknown_event_is_refused() -> None:
    with pytest.raises(govern.UnknownEvent, match="no event 'teleport'"):
        event_tool(order_machine(), EventLog("memory://"), "teleport")


def test_a_crash_at_every_store_write_never_duplicates_or_loses_an_event() -> None:
    """Crash the agent at each crash point of a clean run, resume, and compare with the clean run."""
    clean_store, clean_log = bide.MemoryStore(), EventLog("memory://")
    counter = CrashingStore(clean_store, None)
    agent_for(counter, clean_log).run_sync("r", "go")
    expected = [(e.id, e.event) for e in clean_log.read()]
    points = 3 * counter.writes
    assert points > 10
    for crash_at in range(1, points + 1):
        store, log = bide.MemoryStore(), EventLog("memory://")
        try:
            agent_for(CrashingStore(store, crash_at), log).run_sync("r", "go")
        except SimulatedCrash:
            pass
        else:
            assert crash_at == points, "only the point after the last write has nothing left to crash"
        assert agent_for(store, log, later=3600).run_sync("r", "go").answer == "done"
        assert [(e.id, e.event) for e in log.read()] == expected, f"crash point {crash_at}"
        replica = Replica(order_machine(), log)
        replica.sync()
        assert replica.state("o1") == {"status": "shipped", "paid": True, "stock": 0}


def test_a_no_op_without_a_false_guard_is_not_blamed_on_the_guard() -> None:
    from govern.runtime._rules import delivery_rules

    r = govern.Registry("lamp")
    on = r.bool("on")
    r.event("switch_off", effect={on: False})  # no guard: at "off" it writes the value already there
    machine = r.build()
    rules = delivery_rules(machine)
    outcome = rules.explain(machine.initial.id, rules.index["switch_off"])
    assert outcome.kind == "no-op"
    assert "or its effect leaves that state as it is" in outcome.why
