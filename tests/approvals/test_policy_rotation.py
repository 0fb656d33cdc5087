"""A gate whose policy is rotated and then rolled back waits on its first request again: `submit_decision`
and `pending_approvals` follow the request the gate is waiting on (an `approval:asked:` record names it),
so the approvers it names can open it, and the package still verifies offline."""

from __future__ import annotations

import json
from typing import Any

import pytest

import bide
from bide.approvals import ApprovalGate, ApprovalRefused, pending_approvals, submit_decision, verify_approvals
from bide.audit import AuditLog, SigningKey
from bide.testing import ScriptedModel, call, reply

KEYS = {n: SigningKey.generate() for n in ("alice", "bob", "carol", "dave")}
P1 = ApprovalGate.k_of_n(1, {n: KEYS[n].public for n in ("alice", "bob")})
P2 = ApprovalGate.k_of_n(1, {n: KEYS[n].public for n in ("carol", "dave")})


def _drive(store: bide.Store, gate: ApprovalGate, fired: list[int]) -> str:
    @bide.tool(gate=gate)
    def wire(amount: int) -> str:
        """Wire."""
        fired.append(amount)
        return f"sent {amount}"

    model = ScriptedModel([call("wire", amount=5), reply("done")])
    try:
        return bide.Agent(model, store=store, tools=[wire]).run_sync("r", "go").answer
    except bide.ApprovalPending as pending:
        return "pending: " + pending.reason


def _asked(store: bide.Store) -> list[dict[str, Any]]:
    return [json.loads(e.data)["data"] for e in store.load("r") if e.key.startswith("approval:asked:")]


def test_a_rolled_back_policy_is_the_one_approvers_answer_and_its_decisions_open_the_gate() -> None:
    store = bide.MemoryStore()
    fired: list[int] = []
    assert "waiting for alice, bob" in _drive(store, P1, fired)
    assert "waiting for carol, dave" in _drive(store, P2, fired)
    assert "waiting for alice, bob" in _drive(store, P1, fired)  # rolled back
    [waiting] = pending_approvals(store)
    assert (waiting.approvers, waiting.waiting_for) == (["alice", "bob"], ["alice", "bob"])
    with pytest.raises(ApprovalRefused, match="approvers: alice, bob"):
        submit_decision(store, "r", waiting.call_id, KEYS["carol"], approve=True)
    submit_decision(store, "r", waiting.call_id, KEYS["alice"], approve=True)
    assert _drive(store, P1, fired) == "done" and fired == [5]
    [asked] = _asked(store)
    assert asked["request"].startswith(f"approval:request:{waiting.call_id}:{P1.policy.digest.hex()}")
    log_key = SigningKey.generate()
    verified = verify_approvals(AuditLog(store, log_key).evidence("r"), log_key.public)
    assert f"was approved by alice ({KEYS['alice'].key_id}) under the 1-of-2 policy" in verified.proven
    assert verified.facts["executed_calls_proven"] is True


def test_rotating_forward_again_asks_under_the_new_policy_again_once_per_change() -> None:
    store = bide.MemoryStore()
    fired: list[int] = []
    for gate in (P1, P2, P1, P1, P2, P2):
        assert _drive(store, gate, fired).startswith("pending")
    assert [a["request"].rsplit(":", 1)[1] for a in _asked(store)] == [
        P1.policy.digest.hex(),
        P2.policy.digest.hex(),
    ]
    [waiting] = pending_approvals(store)
    assert waiting.approvers == ["carol", "dave"]
    with pytest.raises(ApprovalRefused):
        submit_decision(store, "r", waiting.call_id, KEYS["alice"], approve=True)
    submit_decision(store, "r", waiting.call_id, KEYS["dave"], approve=True)
    assert _drive(store, P2, fired) == "done" and fired == [5]
