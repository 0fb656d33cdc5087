"""Decisions and the tally race for the same turn: whichever commits first, the tally names every decision
recorded before it, and a decision too late for the tally is refused, never silently left out. Each race
is forced deterministically by a store that runs the competing write just before a chosen batch commits."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import bide
from bide.approvals import ApprovalGate, ApprovalRefused, submit_decision, verify_approvals
from bide.approvals._tally import tally_key
from bide.audit import AuditLog, SigningKey
from bide.testing import ScriptedModel, call, reply

KEYS = {n: SigningKey.generate() for n in ("alice", "bob", "carol")}


class RacingStore(bide.MemoryStore):
    """A memory store that, once, runs `compete()` just before committing the first batch holding a key
    that starts with `trigger` (after the writer of that batch has read the journal)."""

    def __init__(self) -> None:
        super().__init__()
        self.trigger: str | None = None
        self.compete: Callable[[], None] = lambda: None
        self.refused: list[list[str]] = []  # exclusive batches that were not written

    def insert_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, bytes]],
        *,
        exclusive: bool = False,
        fence: tuple[str, int] | None = None,
    ) -> list[bide.Entry]:
        trigger = self.trigger
        if trigger is not None and any(k.startswith(trigger) for k, _ in items):
            self.trigger = None
            self.compete()
        out = super().insert_many(run_id, items, exclusive=exclusive, fence=fence)
        if exclusive and not all(e.inserted for e in out):
            self.refused.append([k for k, _ in items])
        return out


def _agent(store: bide.Store, fired: list[int]) -> bide.Agent:
    gate = ApprovalGate.k_of_n(2, {n: k.public for n, k in KEYS.items()})

    @bide.tool(gate=gate)
    def pay(amount: int) -> str:
        """Pay."""
        fired.append(amount)
        return "paid"

    return bide.Agent(ScriptedModel([call("pay", amount=3), reply("ok")]), store=store, tools=[pay])


def _paused(store: RacingStore, fired: list[int]) -> str:
    with pytest.raises(bide.ApprovalPending) as exc:
        _agent(store, fired).run_sync("r", "go")
    return exc.value.call_id


def _gate_records(store: bide.Store, prefix: str) -> dict[str, Any]:
    return {e.key: json.loads(e.data)["data"] for e in store.load("r") if e.key.startswith(prefix)}


def test_a_decision_landing_between_the_gates_read_and_its_tally_is_named_by_the_tally() -> None:
    store, fired = RacingStore(), []
    call_id = _paused(store, fired)
    submit_decision(store, "r", call_id, KEYS["alice"], approve=True)
    submit_decision(store, "r", call_id, KEYS["bob"], approve=True)
    # the gate has read alice and bob and decided "approved"; carol's deny commits before its tally does
    store.trigger = tally_key(call_id)
    store.compete = lambda: submit_decision(store, "r", call_id, KEYS["carol"], approve=False) and None
    assert _agent(store, fired).run_sync("r", "go").answer == "ok"
    assert fired == [3]
    assert store.refused and tally_key(call_id) in store.refused[0]  # the first tally lost its turn
    tally = _gate_records(store, tally_key(call_id))[tally_key(call_id)]
    decisions = list(_gate_records(store, f"approval:decision:{call_id}:"))
    assert tally["records"] == decisions and len(decisions) == 3  # carol's deny is named
    outcome = (tally["outcome"], tally["approved_by"], tally["denied_by"])
    assert outcome == ("approved", ["alice", "bob"], ["carol"])
    turns = _gate_records(store, f"approval:turn:{call_id}:")
    assert [t["record"] for t in turns.values()] == [*decisions, tally_key(call_id)]
    log_key = SigningKey.generate()
    v = verify_approvals(AuditLog(store, log_key).evidence("r"), log_key.public)
    assert "recount of 3 decision record(s) matches the tally" in v.proven


def test_a_decision_that_loses_its_turn_to_the_tally_is_refused_not_left_out() -> None:
    store, fired = RacingStore(), []
    call_id = _paused(store, fired)
    submit_decision(store, "r", call_id, KEYS["alice"], approve=True)
    submit_decision(store, "r", call_id, KEYS["bob"], approve=True)
    # carol has read the journal (no tally yet) and signed; the run closes the gate before her write commits
    store.trigger = f"approval:decision:{call_id}:carol:"
    store.compete = lambda: _agent(store, fired).run_sync("r", "go") and None
    with pytest.raises(ApprovalRefused, match="is closed"):
        submit_decision(store, "r", call_id, KEYS["carol"], approve=False)
    assert fired == [3]
    assert not _gate_records(store, f"approval:decision:{call_id}:carol:")
    log_key = SigningKey.generate()
    assert verify_approvals(AuditLog(store, log_key).evidence("r"), log_key.public).proven


def test_two_decisions_racing_for_one_turn_are_both_recorded_in_turn_order() -> None:
    store, fired = RacingStore(), []
    call_id = _paused(store, fired)
    store.trigger = f"approval:decision:{call_id}:alice:"
    store.compete = lambda: submit_decision(store, "r", call_id, KEYS["bob"], approve=False) and None
    submit_decision(store, "r", call_id, KEYS["alice"], approve=True)
    decisions = list(_gate_records(store, f"approval:decision:{call_id}:"))
    assert [k.split(":")[3] for k in decisions] == ["bob", "alice"]
    turns = _gate_records(store, f"approval:turn:{call_id}:")
    assert [(t["turn"], t["record"]) for t in turns.values()] == [(1, decisions[0]), (2, decisions[1])]
    submit_decision(store, "r", call_id, KEYS["carol"], approve=True)
    assert _agent(store, fired).run_sync("r", "go").answer == "ok" and fired == [3]
    log_key = SigningKey.generate()
    v = verify_approvals(AuditLog(store, log_key).evidence("r"), log_key.public)
    assert [c["name"] for c in v.facts["calls"][0]["counted"]] == ["alice", "carol"]
    assert "was approved by alice (ed25519:" in v.proven


def test_a_gates_all_or_nothing_write() -> None:
    import asyncio

    store = bide.MemoryStore()
    journal = bide.Journal(store, "r").load()
    journal.write([bide.Start(key="run:start", entry="agent:test", input="go")])
    gj = bide.GateJournal(journal)
    assert asyncio.run(gj.put_all([("approval:a", 1), ("approval:b", 2)]))
    assert not asyncio.run(gj.put_all([("approval:b", 3), ("approval:c", 4)]))  # b exists: c is not written
    assert store.get("r", "approval:c") is None and gj.get("approval:b") == 2
    with pytest.raises(bide.ConfigError, match="approval:"):
        asyncio.run(gj.put_all([("approval:d", 1), ("run:end", 2)]))
    assert store.get("r", "approval:d") is None
