"""A signed decision is for one journal: the digest of the run's header (whose salt is random) is in what
the approver signs, so decisions disclosed by one store's evidence package and replayed into another
store's run of the same id count nowhere, at the gate and offline; decisions in the format before that
binding count nowhere either, and their approvers may decide again."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import bide
from bide.approvals import (
    ApprovalGate,
    ApprovalRecordsInvalid,
    ApprovalRefused,
    pending_approvals,
    submit_decision,
    verify_approvals,
)
from bide.approvals._tally import Count, request_key, tally_data, tally_key, turn_data, turn_key
from bide.audit import AuditLog, NotVerified, SigningKey, generate_key
from bide.testing import ScriptedModel, call, reply

from .conftest import RealStore
from .helpers import LOG_KEY, audit_cli, bide_cli

pytestmark = pytest.mark.slow

RUN = "invoice-7"


def _agent(store: bide.Store, gate: ApprovalGate, fired: list[int]) -> bide.Agent:
    @bide.tool(gate=gate)
    def wire(amount: int, to: str) -> str:
        """Wire money."""
        fired.append(amount)
        return f"sent {amount} to {to}"

    model = ScriptedModel([call("wire", amount=100, to="acme"), reply("done")])
    return bide.Agent(model, store=store, tools=[wire])


def _waiting(store: bide.Store, gate: ApprovalGate) -> None:
    with pytest.raises(bide.ApprovalPending):
        _agent(store, gate, []).run_sync(RUN, "pay acme")


def _records(store: bide.Store, *prefixes: str) -> list[tuple[str, bytes]]:
    """The exact stored bytes of the run's records whose keys start with one of `prefixes`, as disclosed by
    its evidence package."""
    out = []
    for item in AuditLog(store, LOG_KEY).evidence(RUN).records:
        key = json.loads(item.record)["key"]
        if key.startswith(prefixes):
            out.append((key, item.record))
    return out


def test_decisions_replayed_into_another_stores_run_of_the_same_id_count_nowhere(
    real_store: Callable[[str], RealStore], tmp_path: Path
) -> None:
    keys = {n: generate_key(tmp_path / f"{n}.key") for n in ("alice", "bob", "carol")}
    gate = ApprovalGate.k_of_n(2, {n: k.public for n, k in keys.items()})
    a, b, c = real_store("a"), real_store("b"), real_store("c")
    for s in (a, b, c):
        _waiting(s.store, gate)
    for name in ("alice", "carol"):
        submit_decision(a.store, RUN, "c0.0", keys[name], approve=True)
    fired: list[int] = []
    assert _agent(a.store, gate, fired).run_sync(RUN, "pay acme").answer == "done" and fired == [100]

    # Whoever reads A's evidence package and can append to B's journal replays A's decisions into B.
    replayed = _records(a.store, "approval:decision:", turn_key("c0.0", 1), turn_key("c0.0", 2))
    assert len(replayed) == 4
    b.store.insert_many(RUN, replayed)
    with pytest.raises(bide.ApprovalPending) as paused:
        _agent(b.store, gate, fired).run_sync(RUN, "pay acme")
    assert fired == [100]  # B's wire did not run
    assert "has 0; waiting for alice, bob, carol" in paused.value.reason
    assert "2 decision record(s) made for another journal" in paused.value.reason
    [waiting] = pending_approvals(b.store)
    assert waiting.approved_by == [] and waiting.waiting_for == ["alice", "bob", "carol"]
    assert any("made for another journal" in note and "alice, carol" in note for note in waiting.notes)

    # The approvers' own decisions in B still count: a replayed decision is not "already decided".
    for name in ("alice", "carol"):
        done = bide_cli("approve", *b.cli, RUN, "c0.0", "--key", f"{name}.key", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert _agent(b.store, gate, fired).run_sync(RUN, "pay acme").answer == "done" and fired == [100, 100]
    (tmp_path / "b.json").write_bytes(AuditLog(b.store, LOG_KEY).evidence(RUN).to_json())
    (tmp_path / "log.pub").write_bytes(LOG_KEY.public.pem())
    pins = [arg for n in keys for arg in ("--approver", f"{n}={n}.key.pub")] + ["--need", "2"]
    honest = audit_cli("verify-approvals", "b.json", "--pubkey", "log.pub", *pins, cwd=tmp_path)
    assert honest.returncode == 0, honest.stderr
    assert "recount of 4 decision record(s)" in honest.stdout

    # In C the replayer also writes the tally a gate that ignored journals would have written: the gate
    # does not open on it, and the offline check refuses C's export with the policy pinned.
    c.store.insert_many(RUN, replayed)
    names = [k for k, _ in replayed if k.startswith("approval:decision:")]
    digest = json.loads(dict(_records(c.store, "approval:request:"))[request_key("c0.0", gate.policy)])
    forged = tally_data(
        "c0.0",
        "wire",
        digest["data"]["arguments_digest"],
        gate.policy,
        Count("approved", ["alice", "carol"], [], [], [], names),
    )
    c.store.insert_many(
        RUN,
        [
            (tally_key("c0.0"), bide.canonical_json(_gate_record(tally_key("c0.0"), forged))),
            (turn_key("c0.0", 3), bide.canonical_json(
                _gate_record(turn_key("c0.0", 3), turn_data("c0.0", 3, tally_key("c0.0")))
            )),
        ],
    )
    with pytest.raises(ApprovalRecordsInvalid, match="made for another journal") as refused:
        _agent(c.store, gate, fired).run_sync(RUN, "pay acme")
    assert fired == [100, 100]
    assert "Nothing was run" in str(refused.value)
    (tmp_path / "c.json").write_bytes(AuditLog(c.store, LOG_KEY).evidence(RUN).to_json())
    forgery = audit_cli("verify-approvals", "c.json", "--pubkey", "log.pub", *pins, cwd=tmp_path)
    assert forgery.returncode == 1, forgery.stdout
    assert "made for another journal" in forgery.stderr + forgery.stdout


def _gate_record(key: str, data: object) -> dict[str, object]:
    return {"key": key, "kind": "gate", "data": data, "salt": base64.b64encode(bytes(32)).decode()}


def test_a_request_copied_from_another_journal_is_not_signed(
    real_store: Callable[[str], RealStore], tmp_path: Path
) -> None:
    """A request written into a run before its gate asked (copied from another store's run of the same
    id) names the other journal: approvers refuse to sign it."""
    alice = SigningKey.generate()
    gate = ApprovalGate.single("alice", alice.public)
    a, b = real_store("a"), real_store("b")
    _waiting(a.store, gate)
    copied = _records(a.store, "approval:request:")
    bide.Journal(b.store, RUN).load().write([bide.Start(key="run:start", entry="agent:agent", input="x")])
    b.store.insert_many(RUN, copied)  # B's journal has its own header
    with pytest.raises(ApprovalRefused, match="was made in another journal"):
        submit_decision(b.store, RUN, "c0.0", alice, approve=True)


def test_a_decision_in_the_old_format_counts_nowhere_and_its_approver_decides_again(
    real_store: Callable[[str], RealStore], tmp_path: Path
) -> None:
    """Before decisions were bound to their journal they were signed as "bide.approval.decision.v1" over
    run, call, tool, arguments, approver, decision and policy; such a record counts nowhere (the pause
    says so), and its approver is not "already decided"."""
    keys = {n: generate_key(tmp_path / f"{n}.key") for n in ("alice", "bob")}
    gate = ApprovalGate.k_of_n(1, {n: k.public for n, k in keys.items()})
    s = real_store("s")
    _waiting(s.store, gate)
    [(_, raw)] = _records(s.store, "approval:request:")
    request = json.loads(raw)["data"]
    policy = gate.policy

    def field(x: bytes) -> bytes:
        return len(x).to_bytes(8, "big") + x

    signed = (
        b"bide.approval.decision.v1\x00" + field(RUN.encode()) + field(b"c0.0") + field(b"wire")
        + bytes.fromhex(request["arguments_digest"]) + field(b"alice") + b"\x01"
        + policy.need.to_bytes(8, "big") + policy.approvers_digest
    )
    sig = keys["alice"].sign(signed)
    old = {
        "type": "decision", "call_id": "c0.0", "tool": "wire",
        "arguments_digest": request["arguments_digest"], "approver": "alice", "decision": "approve",
        "need": 1, "approvers_digest": policy.approvers_digest.hex(), "key_id": keys["alice"].key_id,
        "signature": base64.b64encode(sig).decode(),
    }
    dkey, tkey = "approval:decision:c0.0:alice:old", turn_key("c0.0", 1)
    s.store.insert_many(RUN, [
        (dkey, bide.canonical_json(_gate_record(dkey, old))),
        (tkey, bide.canonical_json(_gate_record(tkey, turn_data("c0.0", 1, dkey)))),
    ])
    fired: list[int] = []
    with pytest.raises(bide.ApprovalPending, match="signed before decisions were bound to their journal"):
        _agent(s.store, gate, fired).run_sync(RUN, "pay acme")
    assert fired == []
    done = bide_cli("approve", *s.cli, RUN, "c0.0", "--key", "alice.key", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _agent(s.store, gate, fired).run_sync(RUN, "pay acme").answer == "done" and fired == [100]


def test_a_package_without_the_journal_header_proves_no_approval() -> None:
    from .helpers import approved_run

    store, _ = approved_run()
    log = AuditLog(store, LOG_KEY)
    pkg = log.evidence("r", log.sign_head("r"), keys=[e.key for e in store.load("r") if e.key != "@journal"])
    with pytest.raises(NotVerified, match=r"does not hold the journal's header \(position 0\)"):
        verify_approvals(pkg, LOG_KEY.public)


def test_a_request_without_its_journal_is_still_read_and_one_naming_another_journal_fails() -> None:
    """Requests written before they named their journal are read (the decisions' signatures carry the
    binding); a request naming another journal than the package's header is not verified."""
    from .helpers import approved_run, evidence, rewrite

    store, call_id = approved_run()

    def request(change: Callable[[dict[str, Any]], None]) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
        def rewritten(key: str, rec: dict[str, Any]) -> dict[str, Any]:
            if key.startswith("approval:request:"):
                change(rec["data"])
            return rec

        return rewritten

    unnamed = rewrite(store, request(lambda d: d.pop("journal_digest")))
    old = verify_approvals(evidence(unnamed), LOG_KEY.public)
    assert old.facts["calls"][0]["outcome"] == "approved"
    other = request(lambda d: d.update(journal_digest="00" * 32))
    with pytest.raises(NotVerified, match=f"the request of call {call_id!r} names journal digest"):
        verify_approvals(evidence(rewrite(store, other)), LOG_KEY.public)
