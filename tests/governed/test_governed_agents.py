"""event_tool: agents append governed events; a retry after a crash appends nothing new."""

from __future__ import annotations

import asyncio
import time

import pytest

import bide
import govern
from bide.testing import Call, CrashingStore, ScriptedModel, SimulatedCrash, Turn, reply
from govern._agents import event_id_for, event_tool
from govern._eventlog import EventLog
from govern._replica import Replica

from .machines import order_machine

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


def test_a_retried_call_appends_nothing_new() -> None:
    machine = order_machine()
    log = EventLog("memory://")
    tool = event_tool(machine, log, "pay")
    ctx = bide.CallContext("run-7", "c0.0", "pay", "key", 0)
    first = asyncio.run(tool.invoke(tool.validate({"record": "o1"}), ctx))
    again = asyncio.run(tool.invoke(tool.validate({"record": "o1"}), ctx))
    assert log.length() == 1
    assert first["newly_recorded"] and not again["newly_recorded"]
    assert {k: v for k, v in first.items() if k != "newly_recorded"} == {
        k: v for k, v in again.items() if k != "newly_recorded"
    }
    assert log.read()[0].id == event_id_for("run-7", "c0.0", "pay", "o1")


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
    from govern._rules import delivery_rules

    r = govern.Registry("lamp")
    on = r.bool("on")
    r.event("switch_off", effect={on: False})  # no guard: at "off" it writes the value already there
    machine = r.build()
    rules = delivery_rules(machine)
    outcome = rules.explain(machine.initial.id, rules.index["switch_off"])
    assert outcome.kind == "no-op"
    assert "or its effect leaves that state as it is" in outcome.why
