"""Policies and the counting rule: a seat is a key, only valid first decisions count."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bide
from bide.approvals import ApprovalPolicy, Approver, count, decision_bytes
from bide.approvals._tally import OLD_FORMAT, OTHER_JOURNAL, decision_key
from bide.audit import SigningKey

KEYS = {name: SigningKey.generate() for name in ["alice", "bob", "carol", "dave"]}
POLICY = ApprovalPolicy.of(2, {n: KEYS[n].public for n in ["alice", "bob", "carol"]})
DIGEST = hashlib.sha256(b'{"amount":5}').hexdigest()
RUN, CALL, TOOL = "run-1", "c0.0", "pay"
JOURNAL = hashlib.sha256(b"the header of run-1's journal").digest()


def decision(
    name: str,
    approve: bool,
    *,
    key: SigningKey | None = None,
    run: str = RUN,
    call: str = CALL,
    tool: str = TOOL,
    digest: str = DIGEST,
    policy: ApprovalPolicy = POLICY,
    journal: bytes = JOURNAL,
) -> tuple[str, dict[str, Any]]:
    signer = key or KEYS[name]
    sig = signer.sign(
        decision_bytes(
            run,
            call,
            tool,
            bytes.fromhex(digest),
            name,
            approve,
            policy.need,
            policy.approvers_digest,
            journal_digest=journal,
        )
    )
    return decision_key(CALL, name, sig), {
        "type": "decision",
        "journal_digest": JOURNAL.hex(),
        "call_id": CALL,
        "tool": TOOL,
        "arguments_digest": DIGEST,
        "approver": name,
        "decision": "approve" if approve else "deny",
        "need": POLICY.need,
        "approvers_digest": POLICY.approvers_digest.hex(),
        "key_id": signer.key_id,
        "signature": base64.b64encode(sig).decode(),
    }


def tally(*decisions: tuple[str, Any]) -> Any:
    return count(RUN, CALL, TOOL, DIGEST, POLICY, list(decisions), journal_digest=JOURNAL.hex())


def test_policy_refuses_shared_keys_lookalike_names_and_bad_need() -> None:
    k = KEYS["alice"].public
    with pytest.raises(bide.ConfigError, match="share one key"):
        ApprovalPolicy.of(1, {"alice": k, "bob": k})
    with pytest.raises(bide.ConfigError, match="collides"):
        ApprovalPolicy.of(1, {"alice": k, "Alice": KEYS["bob"].public})
    with pytest.raises(bide.ConfigError, match="collides"):
        ApprovalPolicy.of(1, {"ｂob": k, "bob": KEYS["bob"].public})  # fullwidth b
    for need in (0, 4, True):
        with pytest.raises(bide.ConfigError):
            ApprovalPolicy.of(need, {n: KEYS[n].public for n in ["alice", "bob", "carol"]})
    with pytest.raises(bide.ConfigError):
        ApprovalPolicy(1, ())
    with pytest.raises(bide.ConfigError):
        ApprovalPolicy(1, (Approver("", k),))
    # C1 controls (a terminal's CSI, NEL) were let through, and a lone surrogate raised UnicodeEncodeError
    for name in ("ali\x9bce", "ali\x85ce", "ali\x07ce", "ali\x7fce"):
        with pytest.raises(bide.ConfigError, match="control characters"):
            ApprovalPolicy.of(1, {name: k})
    with pytest.raises(bide.ConfigError, match="lone surrogate"):
        ApprovalPolicy.of(1, {"al\ud800ce": k, "bob": KEYS["bob"].public})
    # a name of thousands of characters made every decision's key too long for PostgreSQL's index
    assert ApprovalPolicy.of(1, {"a" * 128: k}).names == ["a" * 128]
    with pytest.raises(bide.ConfigError, match="129 characters long; the limit is 128"):
        ApprovalPolicy.of(1, {"a" * 129: k})
    assert ApprovalPolicy.of(1, {"Zoë Ångström": k}).names == ["Zoë Ångström"]


def test_policy_digest_binds_need_names_and_keys_and_round_trips() -> None:
    same = ApprovalPolicy.of(2, {n: KEYS[n].public for n in ["carol", "alice", "bob"]})
    assert same.digest == POLICY.digest  # order of declaration does not matter
    assert ApprovalPolicy.from_json(POLICY.to_json()) == POLICY
    others = [
        ApprovalPolicy.of(1, {n: KEYS[n].public for n in ["alice", "bob", "carol"]}),
        ApprovalPolicy.of(
            2, {"alice": KEYS["alice"].public, "bob": KEYS["bob"].public, "carol": KEYS["dave"].public}
        ),
        ApprovalPolicy.of(
            2, {"alice": KEYS["alice"].public, "bob": KEYS["bob"].public, "carole": KEYS["carol"].public}
        ),
    ]
    assert len({p.digest for p in [POLICY, *others]}) == 4


def test_decision_bytes_layout() -> None:
    msg = decision_bytes("r", "c", "t", bytes(32), "a", True, 2, b"\x01" * 32, journal_digest=b"\x02" * 32)

    def u(n: int) -> bytes:
        return n.to_bytes(8, "big")

    assert msg == (
        b"bide.approval.decision.v2\x00"
        + b"\x02" * 32
        + u(1)
        + b"r"
        + u(1)
        + b"c"
        + u(1)
        + b"t"
        + bytes(32)
        + u(1)
        + b"a"
        + b"\x01"
        + u(2)
        + b"\x01" * 32
    )


def test_k_of_n_outcomes() -> None:
    assert tally().outcome == "pending"
    assert tally(decision("alice", True)).outcome == "pending"
    c = tally(decision("alice", True), decision("bob", False), decision("carol", True))
    assert (c.outcome, c.approved_by, c.denied_by) == ("approved", ["alice", "carol"], ["bob"])
    assert tally(decision("alice", False)).outcome == "pending"  # 2 of the remaining 2 can still approve
    c = tally(decision("alice", False), decision("bob", False))
    assert (c.outcome, c.denied_by) == ("denied", ["alice", "bob"])


def test_invalid_records_never_occupy_a_seat() -> None:
    d_unknown = decision("dave", True)
    d_other_call = decision("alice", True, call="c9.9")
    d_other_run = decision("alice", True, run="run-2")
    d_other_journal = decision("alice", True, journal=bytes(32))  # signed for another journal
    d_other_args = decision("alice", True, digest=hashlib.sha256(b"x").hexdigest())
    d_wrong_key = decision("bob", True, key=KEYS["alice"])
    other_policy = ApprovalPolicy.of(1, {n: KEYS[n].public for n in ["alice", "bob", "carol"]})
    d_other_policy = decision("alice", True, policy=other_policy)
    key, forged = decision("carol", True)
    forged = {**forged, "decision": "deny"}  # signature was over an approval
    c = tally(
        d_unknown,
        d_other_call,
        d_other_run,
        d_other_journal,
        d_other_args,
        d_wrong_key,
        d_other_policy,
        (key, forged),
        ("approval:decision:c0.0:x:1", "garbage"),
    )
    assert c.outcome == "pending" and c.approved_by == [] and c.denied_by == []
    assert len(c.excluded) == 9
    # after all those, valid decisions still count from a clean slate
    c = tally(d_wrong_key, decision("bob", True), decision("alice", True))
    assert (c.outcome, c.approved_by) == ("approved", ["bob", "alice"])


def test_a_decision_for_another_journal_or_in_the_old_format_counts_nowhere() -> None:
    """A decision names the journal it was made for (the digest of its header, whose salt is random): one
    made in another store's run of the same id does not count, whatever its record claims, and one in the
    format before the binding (no journal_digest, signed as decision.v1) counts nowhere."""
    key, replayed = decision("alice", True, journal=bytes(32))
    relabelled = {**replayed, "journal_digest": bytes(32).hex()}
    c = tally((key, replayed), (key + "x", relabelled), decision("bob", True))
    assert c.approved_by == ["bob"] and c.outcome == "pending"
    assert [e["reason"] for e in c.excluded][1] == OTHER_JOURNAL
    assert "signature does not verify for this journal" in c.excluded[0]["reason"]

    old_key, old = decision("carol", True)
    del old["journal_digest"]
    old["signature"] = base64.b64encode(  # what bide signed before decisions named their journal
        KEYS["carol"].sign(
            b"bide.approval.decision.v1\x00"
            + b"".join(len(x).to_bytes(8, "big") + x for x in (RUN.encode(), CALL.encode(), TOOL.encode()))
            + bytes.fromhex(DIGEST)
            + len(b"carol").to_bytes(8, "big")
            + b"carol\x01"
            + POLICY.need.to_bytes(8, "big")
            + POLICY.approvers_digest
        )
    ).decode()
    c = tally((old_key, old), decision("bob", True))
    assert c.outcome == "pending" and c.excluded == [{"record": old_key, "reason": OLD_FORMAT}]
    assert "counts nowhere" in OLD_FORMAT and "must decide again" in OLD_FORMAT


def test_first_valid_decision_per_approver_counts() -> None:
    first = decision("alice", False)
    again = decision("alice", True)
    c = tally(first, again, decision("bob", True))
    assert c.outcome == "pending" and c.denied_by == ["alice"] and c.superseded == [again[0]]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["alice", "bob", "carol", "dave"]), st.booleans(), st.booleans()),
        max_size=8,
    )
)
def test_count_laws(script: list[tuple[str, bool, bool]]) -> None:
    recs = [
        decision(name, approve) if valid else decision(name, approve, call="zz")
        for name, approve, valid in script
    ]
    c = tally(*recs)
    firsts: dict[str, bool] = {}
    for name, approve, valid in script:
        if valid and name != "dave" and name not in firsts:
            firsts[name] = approve
    approvals = sum(firsts.values())
    denials = len(firsts) - approvals
    assert c.approved_by == [n for n, a in firsts.items() if a]
    assert c.denied_by == [n for n, a in firsts.items() if not a]
    expected = "approved" if approvals >= 2 else "denied" if 3 - denials < 2 else "pending"
    assert c.outcome == expected
    assert c.records == [k for k, _ in recs]


def test_a_policy_naming_a_weak_key_is_refused() -> None:
    value = POLICY.to_json()
    value["approvers"][0]["public_key"] = (b"\x01" + bytes(31)).hex()  # the identity point: anyone can sign
    with pytest.raises(bide.ConfigError, match="weak"):
        ApprovalPolicy.from_json(value)
