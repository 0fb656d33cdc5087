"""The gate never opens on a tally it did not count or recount itself: whoever can write to the store but
holds no approver key cannot open it with a tally record (unsigned, under a policy of their own, or naming
fewer approvals than it claims). The gate raises `ApprovalRecordsInvalid` and the tool does not run."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

import bide
from bide._canonical import canonical_json
from bide.approvals import ApprovalGate, ApprovalPolicy, ApprovalRecordsInvalid, submit_decision
from bide.approvals._policy import decision_bytes, journal_digest_of
from bide.approvals._tally import (
    count,
    decision_key,
    request_data,
    request_key,
    tally_data,
    tally_key,
    turn_data,
    turn_key,
)
from bide.audit import SigningKey
from bide.testing import ScriptedModel, call, reply

from .conftest import RealStore

KEYS = {n: SigningKey.generate() for n in ("alice", "bob", "carol")}
GATE = ApprovalGate.k_of_n(2, {n: k.public for n, k in KEYS.items()})
ARGS = {"amount": 100, "to": "acme"}
DIGEST = hashlib.sha256(canonical_json(ARGS)).hexdigest()
RUN = "invoice-9"


def _agent(store: bide.Store, fired: list[int]) -> bide.Agent:
    @bide.tool(gate=GATE)
    def wire(amount: int, to: str) -> str:
        """Wire money."""
        fired.append(amount)
        return f"sent {amount} to {to}"

    model = ScriptedModel([call("wire", **ARGS), reply("done")])
    return bide.Agent(model, store=store, tools=[wire])


def _waiting(store: bide.Store) -> None:
    with pytest.raises(bide.ApprovalPending):
        _agent(store, []).run_sync(RUN, "pay acme")


def _write(store: bide.Store, records: list[tuple[str, Any]]) -> None:
    """Gate records written around bide, by whoever can write to the store."""
    store.insert_many(
        RUN,
        [(k, bide.encode_record(bide.GateRecord(key=k, data=d))) for k, d in records],
    )


def _decisions(store: bide.Store) -> tuple[list[tuple[str, Any]], str]:
    """The decision records of the run, in journal order, and the hex digest of its journal's header."""
    entries = store.load(RUN)
    decisions = [
        (e.key, json.loads(e.data)["data"]) for e in entries if e.key.startswith("approval:decision:")
    ]
    return decisions, journal_digest_of(entries[0].data).hex()


def _signed(key: SigningKey, name: str, policy: ApprovalPolicy, journal: bytes) -> tuple[str, Any]:
    sig = key.sign(
        decision_bytes(
            RUN, "c0.0", "wire", bytes.fromhex(DIGEST), name, True, policy.need, policy.approvers_digest,
            journal_digest=journal,
        )
    )
    return decision_key("c0.0", name, sig), {
        "type": "decision", "journal_digest": journal.hex(), "call_id": "c0.0", "tool": "wire",
        "arguments_digest": DIGEST, "approver": name, "decision": "approve", "need": policy.need,
        "approvers_digest": policy.approvers_digest.hex(), "key_id": key.key_id,
        "signature": base64.b64encode(sig).decode(),
    }


def _refused(store: bide.Store, match: str) -> None:
    fired: list[int] = []
    with pytest.raises(ApprovalRecordsInvalid, match=match) as refused:
        _agent(store, fired).run_sync(RUN, "pay acme")
    assert fired == []
    text = str(refused.value)
    assert "do not match their signed decisions" in text and "Nothing was run" in text
    assert f"bide cancel {RUN}" in text
    assert isinstance(refused.value, bide.BideError) and not isinstance(refused.value, bide.StoreError)
    assert bide.run_status(store, RUN).status == "awaiting_approval"


def test_an_unsigned_tally_does_not_open_the_gate(real_store: Callable[[str], RealStore]) -> None:
    store = real_store("s").store
    _waiting(store)
    _write(store, [(tally_key("c0.0"), {
        "type": "tally", "call_id": "c0.0", "tool": "wire", "arguments_digest": DIGEST,
        "outcome": "approved", "approved_by": ["mallory"], "denied_by": [],
    })])
    _refused(store, "the tally record is not well formed")


def test_a_record_of_another_kind_under_the_tally_key_does_not_open_the_gate(
    real_store: Callable[[str], RealStore],
) -> None:
    """Not a gate record (a pause here), so the gate read no tally there and retried its own tally write
    100 times, then said it "kept losing its turn to new decisions; run it again"."""
    store = real_store("s").store
    _waiting(store)
    key = tally_key("c0.0")
    pause = bide.Pause(key=key, call_id="c0.0", tool="wire", reason="written around bide")
    store.insert_many(RUN, [(key, bide.encode_record(pause))])
    _refused(store, "the tally record is not well formed")


def test_a_tally_under_a_policy_of_the_writers_own_does_not_open_the_gate(
    real_store: Callable[[str], RealStore],
) -> None:
    """Keys of the writer's own, named alice, bob and carol, a request under their policy, decisions
    signed for this very journal, and a tally whose recount under that policy matches: the gate counts
    under the policy in its code, so it refuses the tally."""
    store = real_store("s").store
    _waiting(store)
    journal = journal_digest_of(store.load(RUN)[0].data)
    evil = {n: SigningKey.generate() for n in ("alice", "bob", "carol")}
    policy = ApprovalPolicy.of(2, {n: k.public for n, k in evil.items()})
    decisions = [_signed(evil[n], n, policy, journal) for n in ("alice", "bob")]
    c = count(RUN, "c0.0", "wire", DIGEST, policy, decisions, journal_digest=journal.hex())
    tally = {**tally_data("c0.0", "wire", DIGEST, policy, c), "outcome": "approved"}
    tally["approved_by"] = ["alice", "bob"]  # what the recount under their policy gives
    _write(store, [
        (request_key("c0.0", policy),
         request_data("c0.0", "wire", ARGS, DIGEST, policy, journal_digest=journal.hex())),
        *decisions,
        (tally_key("c0.0"), tally),
    ])
    _refused(store, f"not this gate's 2-of-3 policy {GATE.policy.digest.hex()}")


def test_a_tally_claiming_more_approvals_than_were_signed_does_not_open_the_gate(
    real_store: Callable[[str], RealStore],
) -> None:
    """alice approved (a real decision through bide); the writer adds a tally under the gate's own policy
    naming her decision but claiming carol approved too."""
    store = real_store("s").store
    _waiting(store)
    submit_decision(store, RUN, "c0.0", KEYS["alice"], approve=True)
    decisions, journal = _decisions(store)
    honest = count(RUN, "c0.0", "wire", DIGEST, GATE.policy, decisions, journal_digest=journal)
    assert honest.outcome == "pending" and honest.approved_by == ["alice"]
    claimed = tally_data("c0.0", "wire", DIGEST, GATE.policy, honest)
    claimed.update(outcome="approved", approved_by=["alice", "carol"])
    tkey = tally_key("c0.0")
    _write(store, [(tkey, claimed), (turn_key("c0.0", 2), turn_data("c0.0", 2, tkey))])
    _refused(store, r"the tally says approved .* but the signed decisions count pending")
    # carol's real approval comes too late: the gate is closed, and stays refused.
    with pytest.raises(bide.approvals.ApprovalRefused, match="is closed"):
        submit_decision(store, RUN, "c0.0", KEYS["carol"], approve=True)
    _refused(store, "count pending")


def test_a_tally_the_gate_did_not_write_opens_it_when_its_recount_agrees(
    real_store: Callable[[str], RealStore],
) -> None:
    """The honest tally of another process (the gate's own rule, the decisions it names) is acted on."""
    store = real_store("s").store
    _waiting(store)
    for name in ("alice", "carol"):
        submit_decision(store, RUN, "c0.0", KEYS[name], approve=True)
    decisions, journal = _decisions(store)
    c = count(RUN, "c0.0", "wire", DIGEST, GATE.policy, decisions, journal_digest=journal)
    _write(store, [
        (tally_key("c0.0"), tally_data("c0.0", "wire", DIGEST, GATE.policy, c)),
        (turn_key("c0.0", 3), turn_data("c0.0", 3, tally_key("c0.0"))),
    ])
    fired: list[int] = []
    assert _agent(store, fired).run_sync(RUN, "pay acme").answer == "done" and fired == [100]
