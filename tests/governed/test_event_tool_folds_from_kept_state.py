"""event_tool reads only what is new of a record it has folded before.

Each call tells the model the record's state right after its event, which needs the record's history
before it. The tool read the whole history every call: on a hot record (a stock counter every order
touches) each call read more than the last, 3 s a call at 100,000 events on SQLite. It keeps the state it
folded of each record now, and reads only the events after it, from the last one it folded (to see it still
stands where it stood: a log edited or restored under the handle is folded from the start again).

The oracle is the whole history folded anew, as the tool did before.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bide
from bide.testing import Call, ScriptedModel, Turn, reply
from govern.runtime._agents import event_tool
from govern.runtime._eventlog import Event, EventLog, LoggedEvent
from govern.runtime._rules import delivery_rules

from .machines import order_log, order_machine

EVENTS = ("pay", "ship", "cancel", "restock", "refund")


def expected(log: EventLog, result: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What the tool's result should say of its event: the record's whole history up to it, folded."""
    rules = delivery_rules(order_machine())
    history = log.read_record(str(result["record"]), through=int(str(result["position"])))
    assert history[-1].id == result["event_id"]
    state = rules.initial
    for earlier in history[:-1]:
        state = rules.step(state, rules.index[earlier.event])
    outcome = rules.explain(state, rules.index[history[-1].event])
    return outcome.kind, rules.decode(outcome.after)


def calls_in_one_run(log: EventLog, calls: list[tuple[str, str]], run_id: str) -> list[dict[str, Any]]:
    """Run one agent whose model makes `calls` (event, record) one turn each; the tool results in order."""
    machine = order_machine()
    tools = [event_tool(machine, log, e) for e in EVENTS]
    script = [Turn(calls=(Call(event, {"record": record}),)) for event, record in calls] + [reply("done")]
    store = bide.MemoryStore()
    agent = bide.Agent(ScriptedModel(script), store=store, tools=tools, name="clerk", max_turns=len(script))
    assert agent.run_sync(run_id, "go").answer == "done"
    journal = bide.Journal(store, run_id).load()
    return [r.result for r in journal.records() if isinstance(r, bide.ToolResult)]


def outside(log: EventLog, record: str, event: str, n: int) -> None:
    """An event appended by another producer, not through the tool."""
    digest = order_machine().digest
    log.append(Event(id=f"outside-{n}", machine=digest, record=record, event=event, producer="x"))


def test_calls_on_a_hot_record_read_only_what_is_new(tmp_path: Path) -> None:
    log = order_log(f"sqlite:///{tmp_path}/events.db")
    for n in range(300):  # a record with a long history already
        outside(log, "hot", EVENTS[n % 5], n)
    reads: list[tuple[int, int]] = []
    backend = log._backend  # type: ignore[attr-defined]
    read_record = backend.read_record

    def counted(record: str, start: int, through: int) -> list[LoggedEvent]:
        out: list[LoggedEvent] = read_record(record, start, through)
        reads.append((start, len(out)))
        return out

    backend.read_record = counted
    calls = [(EVENTS[n % 5], "hot") for n in range(40)]
    results = calls_in_one_run(log, calls, "r1")
    backend.read_record = read_record
    # The first call reads the whole history (301 events); each later one the event it folded last and its
    # own: two.
    assert reads == [(0, 301)] + [(299 + n, 2) for n in range(1, 40)]
    assert [(r["outcome"], r["state"]) for r in results] == [expected(log, r) for r in results]


def test_events_appended_by_others_between_calls_are_folded_in(tmp_path: Path) -> None:
    log = order_log(f"sqlite:///{tmp_path}/events.db")
    first = calls_in_one_run(log, [("pay", "o1"), ("restock", "o1")], "r1")
    outside(log, "o1", "restock", 1)
    outside(log, "o1", "restock", 2)
    later = calls_in_one_run(log, [("ship", "o1"), ("restock", "o1")], "r2")
    for result in first + later:
        assert (result["outcome"], result["state"]) == expected(log, result)
    assert later[0]["state"] == {"status": "shipped", "paid": True, "stock": 2}


def test_a_record_edited_under_the_tool_is_folded_from_its_start(tmp_path: Path) -> None:
    """The event the tool folded last no longer stands where it stood (its row edited by hand, as a restore
    from a backup would leave it): the tool folds the record's whole history again, and says what it holds."""
    path = tmp_path / "events.db"
    log = order_log(f"sqlite:///{path}")
    machine = order_machine()
    tools = [event_tool(machine, log, e) for e in EVENTS]  # one set of tools: the same kept states
    store = bide.MemoryStore()

    def run(run_id: str, calls: list[tuple[str, str]]) -> list[dict[str, Any]]:
        script = [Turn(calls=(Call(e, {"record": r}),)) for e, r in calls] + [reply("done")]
        agent = bide.Agent(ScriptedModel(script), store=store, tools=tools, name="clerk")
        assert agent.run_sync(run_id, "go").answer == "done"
        journal = bide.Journal(store, run_id).load()
        return [r.result for r in journal.records() if isinstance(r, bide.ToolResult)]

    for n in range(10):  # a history long enough for its folded state to be kept
        outside(log, "o1", "refund", n)
    [paid] = run("r1", [("pay", "o1")])
    assert paid["state"] == {"status": "paid", "paid": True, "stock": 0}
    with sqlite3.connect(path) as raw:  # the paid event becomes a cancel, under another id
        raw.execute("UPDATE govern_events SET event_id = 'edited', event = 'cancel' WHERE event_id = ?",
                    (paid["event_id"],))
    [restocked] = run("r2", [("restock", "o1")])
    assert restocked["state"] == {"status": "cancelled", "paid": False, "stock": 1}
    assert (restocked["outcome"], restocked["state"]) == expected(log, restocked)


operations = st.lists(
    st.tuples(st.sampled_from(["tool", "outside"]), st.sampled_from(EVENTS), st.sampled_from(["a", "b"])),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_every_result_is_the_whole_history_folded(ops: list[tuple[str, str, str]]) -> None:
    """Calls of one set of tools, on two records, interleaved with other producers' events: each result
    says what folding the record's whole history would (a record's state is kept from its 8th event on)."""
    log = order_log()
    machine = order_machine()
    tools = [event_tool(machine, log, e) for e in EVENTS]
    store = bide.MemoryStore()
    for n, (kind, event, record) in enumerate(ops):
        if kind == "outside":
            outside(log, record, event, n)
            continue
        agent = bide.Agent(
            ScriptedModel([Turn(calls=(Call(event, {"record": record}),)), reply("done")]),
            store=store, tools=tools, name="clerk",
        )  # fmt: skip
        agent.run_sync(f"r{n}", "go")
        [result] = [
            r.result for r in bide.Journal(store, f"r{n}").load().records() if isinstance(r, bide.ToolResult)
        ]
        assert (result["outcome"], result["state"]) == expected(log, result)
