"""`verify_approvals` on a package of many gates: every verdict is what each gate's records make it (an
honest package verifies; one forged gate among hundreds is found), and checking a gate reads only the
records of its call, so the work grows with the package, not with gates times records."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

import bide.approvals._verify as verify_module
from bide._canonical import canonical_json, new_salt
from bide.approvals import verify_approvals
from bide.approvals._policy import ApprovalPolicy, decision_bytes, journal_digest_of
from bide.approvals._tally import count, decision_key, request_data, request_key, tally_data, tally_key
from bide.audit import NotVerified, SigningKey
from bide.audit._formats import EvidencePackage, EvidenceRecord, journal_leaf, sign_head
from bide.audit._tree import MerkleTree

ALICE = SigningKey.generate()
POLICY = ApprovalPolicy.of(1, {"alice": ALICE.public})
LOG_KEY = SigningKey.generate()


def _package(n: int, *, forge: int | None = None) -> EvidencePackage:
    """Run "big": one model turn calling `t` n times, each call approved 1 of 1 and run once. With `forge`,
    that call's attempt carries other arguments than approved."""
    calls = [{"arguments": {"i": i}, "call_id": f"c0.{i}", "id": f"id{i}", "name": "t"} for i in range(n)]
    message = {"content": "", "finish_reason": "", "role": "assistant", "usage": None, "tool_calls": calls}
    header = canonical_json(
        {"key": "@journal", "kind": "header", "format": "bide.journal/1", "salt": new_salt()}
    )
    journal = journal_digest_of(header)
    records: list[dict[str, Any]] = [
        {"key": "run:start", "kind": "start", "entry": "agent:agent", "input": "x"},
        {"key": "model:0", "kind": "model_turn", "model": "m", "turn": 0, "message": message},
    ]
    for i in range(n):
        c, args = f"c0.{i}", {"i": i}
        digest = hashlib.sha256(canonical_json(args)).hexdigest()
        sig = ALICE.sign(decision_bytes("big", c, "t", bytes.fromhex(digest), "alice", True, 1,
                                        POLICY.approvers_digest, journal_digest=journal))
        dkey = decision_key(c, "alice", sig)
        decision = {"type": "decision", "journal_digest": journal.hex(), "call_id": c, "tool": "t",
                    "arguments_digest": digest, "approver": "alice", "decision": "approve", "need": 1,
                    "approvers_digest": POLICY.approvers_digest.hex(), "key_id": ALICE.key_id,
                    "signature": base64.b64encode(sig).decode()}
        counted = count("big", c, "t", digest, POLICY, [(dkey, decision)], journal_digest=journal.hex())
        tally = tally_data(c, "t", digest, POLICY, counted)
        ran = {"i": -1} if i == forge else args
        records += [
            {"key": request_key(c, POLICY), "kind": "gate",
             "data": request_data(c, "t", args, digest, POLICY, journal_digest=journal.hex())},
            {"key": dkey, "kind": "gate", "data": decision},
            {"key": tally_key(c), "kind": "gate", "data": tally},
            {"key": f"attempt:{c}:1", "kind": "attempt", "call_id": c, "tool": "t", "gen": 1,
             "arguments": ran, "at": 0},
        ]
    tree = MerkleTree()
    datas = [header, *(canonical_json({**r, "salt": new_salt()}) for r in records)]
    for data in datas:
        tree.append(journal_leaf(data))
    sth = sign_head(LOG_KEY, "big", tree.size, tree.root())
    items = [EvidenceRecord(index=i, record=b, path=tree.inclusion_proof(i)) for i, b in enumerate(datas)]
    return EvidencePackage(sth=sth, records=items)


def test_every_gate_of_a_large_package_gets_its_own_verdict() -> None:
    verified = verify_approvals(_package(400), LOG_KEY.public)
    calls = verified.facts["calls"]
    assert [c["call_id"] for c in calls] == [f"c0.{i}" for i in range(400)]
    assert all(c["outcome"] == "approved" and c["executed_call_proven"] for c in calls)
    assert all(c["model_calls"] == [2] and len(c["attempts"]) == 1 for c in calls)
    assert verified.facts["executed_calls_proven"] is True
    with pytest.raises(NotVerified, match=r"the attempt of call 'c0\.397' .* not hash to the approved"):
        verify_approvals(_package(400, forge=397), LOG_KEY.public)


class _CountingRecord(dict[str, Any]):
    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        _CountingRecord.reads += 1
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        _CountingRecord.reads += 1
        return super().__getitem__(key)


def _reads(n: int, monkeypatch: pytest.MonkeyPatch) -> int:
    package = _package(n)
    real = verify_module._records

    def counting(*args: Any) -> tuple[list[dict[str, Any]], str]:
        records, signed = real(*args)
        return [_CountingRecord(r) for r in records], signed

    monkeypatch.setattr(verify_module, "_records", counting)
    _CountingRecord.reads = 0
    verify_approvals(package, LOG_KEY.public)
    return _CountingRecord.reads


def test_checking_a_gate_reads_only_its_calls_records(monkeypatch: pytest.MonkeyPatch) -> None:
    # Twice the gates, about twice the record reads (reading every record per gate made it four times).
    small, large = _reads(100, monkeypatch), _reads(200, monkeypatch)
    assert large < 2.5 * small
