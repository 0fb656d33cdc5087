"""verify-approvals finds a call's records by their keys, so a record filed under another key than bide
gives its kind is refused as an edit, whatever else the package holds.

Found by an adversarial review: with the log key and every approver pinned, a forger hid a call that ran
while its gate was undecided by adding a record of another kind under the call's tally key (the check for
undecided calls saw "a tally", the recount took only gate records, so nobody checked the call), or by
filing the call's attempt under a key no lookup matched (`attempt:c1.0:0b`). An attempt whose tool was a
JSON list stopped the verifier with an internal error (exit 3) instead of a verdict. And approvers pinned
without `--need` were reported as "a policy you pinned", though the number of approvals came from the
package.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import bide
from bide.approvals import ApprovalGate, ApprovalTrust, submit_decision, verify_approvals
from bide.audit import NotVerified, SigningKey
from bide.testing import ScriptedModel, call, reply

from .helpers import APPROVERS, LOG_KEY, approved_run, audit_cli, evidence, records

ALICE = SigningKey.generate()
SALT = base64.b64encode(bytes(32)).decode()  # every record carries 32 bytes of salt
TRUST = ApprovalTrust.of(approvers={"alice": ALICE.public}, need=1)


def _wire(gated: bool) -> bide.Tool:
    def wire(amount: int, to: str) -> str:
        """Wire money."""
        return f"sent {amount} to {to}"

    return bide.Tool.from_function(wire, gate=ApprovalGate.single("alice", ALICE.public) if gated else None)


def _run(second_call_requested: bool) -> bide.MemoryStore:
    """c0.0 of `wire` approved by alice and run; then c1.0 of `wire` (to mallory) ran without a decision:
    put to alice first when `second_call_requested`, else with no request at all (the gate taken off)."""
    store = bide.MemoryStore()
    script = [call("wire", amount=100, to="acme"), call("wire", amount=99999, to="mallory"), reply("done")]

    def drive(gated: bool, turns: int = 3) -> None:
        bide.Agent(ScriptedModel(script[:turns]), store=store, tools=[_wire(gated)]).run_sync("r", "go")

    with pytest.raises(bide.ApprovalPending):
        drive(True)
    submit_decision(store, "r", "c0.0", ALICE, approve=True)
    if second_call_requested:
        with pytest.raises(bide.ApprovalPending):
            drive(True)  # c0.0 ran; c1.0's request is journaled
    else:
        with pytest.raises(bide.ModelError):  # c0.0 ran; the model is gone before the next call
            drive(True, turns=1)
    drive(False)  # a deploy took the gate off: c1.0 ran with no decision
    return store


def _forged(store: bide.Store, change: Callable[[list[dict[str, Any]]], None]) -> bide.MemoryStore:
    """A copy of the run whose decoded records `change` edited in place (what the log key's holder can
    export and sign)."""
    recs = [rec for _, rec in records(store)]
    change(recs)
    forged = bide.MemoryStore()
    forged.insert_many("r", [(rec["key"], bide.canonical_json(rec)) for rec in recs])
    return forged


def _of(recs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    [found] = [r for r in recs if r["key"] == key]
    return found


def test_a_record_of_another_kind_under_a_tally_key_does_not_decide_the_call() -> None:
    store = _run(second_call_requested=True)
    with pytest.raises(NotVerified, match=r"call 'c1\.0' was put to its approvers but never decided"):
        verify_approvals(evidence(store), LOG_KEY.public, trust=TRUST)

    def decoy(recs: list[dict[str, Any]]) -> None:
        recs.insert(-1, {"key": "approval:tally:c1.0", "kind": "note", "salt": SALT})  # before run:end

    with pytest.raises(NotVerified, match=r"'approval:tally:c1\.0' .* is a record of kind 'note'"):
        verify_approvals(evidence(_forged(store, decoy)), LOG_KEY.public, trust=TRUST)


def test_an_attempt_filed_under_a_key_no_lookup_matches_is_refused() -> None:
    store = _run(second_call_requested=True)

    def hide(recs: list[dict[str, Any]]) -> None:
        _of(recs, "attempt:c1.0:0")["key"] = "attempt:c1.0:0b"
        recs.remove(_of(recs, "result:c1.0"))

    with pytest.raises(NotVerified, match=r"under another key than its own \('attempt:c1\.0:0'\)"):
        verify_approvals(evidence(_forged(store, hide)), LOG_KEY.public, trust=TRUST)


def test_an_unrequested_call_filed_under_an_odd_key_does_not_lose_its_gap() -> None:
    store = _run(second_call_requested=False)
    verified = verify_approvals(evidence(store), LOG_KEY.public, trust=TRUST)
    assert verified.facts["executed_calls_proven"] is False and "'c1.0'" in verified.not_proven

    def hide(recs: list[dict[str, Any]]) -> None:
        _of(recs, "attempt:c1.0:0")["key"] = "attempt:c1.0:x"
        _of(recs, "result:c1.0")["key"] = "outcome:c1.0"

    with pytest.raises(NotVerified, match=r"under another key than its own"):
        verify_approvals(evidence(_forged(store, hide)), LOG_KEY.public, trust=TRUST)


@pytest.mark.parametrize("tool", [["wire"], {"name": "wire"}])
def test_a_tool_name_that_is_not_a_string_is_a_verdict_not_a_crash(tmp_path: Path, tool: Any) -> None:
    store = _run(second_call_requested=False)

    def odd(recs: list[dict[str, Any]]) -> None:
        _of(recs, "attempt:c1.0:0")["tool"] = tool

    (tmp_path / "evidence.json").write_bytes(evidence(_forged(store, odd)).to_json())
    done = audit_cli(
        "verify-approvals", "evidence.json", "--pubkey", LOG_KEY.public.hex, "--json", cwd=tmp_path
    )
    out = json.loads(done.stdout)
    assert (done.returncode, out["result"]) == (1, "not_verified"), done
    assert "whose tool is not a name" in out["message"]


@pytest.mark.parametrize(
    "edit",
    [
        ("result:c0.0", "kind", "pause"),  # a result key holding a pause
        ("result:c0.0", "call_id", "c9.9"),  # another call's result under this call's key
        ("attempt:c0.0:0", "gen", 1),  # generation 1 under generation 0's key
        ("attempt:c0.0:0", "gen", True),
        ("model:1", "key", "approval:note"),  # a model turn under an approval key
    ],
)
def test_records_bide_never_writes_are_refused(edit: tuple[str, str, Any]) -> None:
    store = _run(second_call_requested=False)
    key, field, value = edit

    def change(recs: list[dict[str, Any]]) -> None:
        _of(recs, key)[field] = value

    with pytest.raises(NotVerified, match="bide never writes such a record"):
        verify_approvals(evidence(_forged(store, change)), LOG_KEY.public, call_id="c0.0", trust=TRUST)


def test_approvers_pinned_without_need_do_not_claim_the_policy_pinned() -> None:
    """The log key's holder lists the pinned seats but needs one approval where the auditor's policy needs
    two: pinned seats alone verify it (the seats hold), but the output must not say the policy was
    pinned, and says the number of approvals came from the package."""
    store = _run_one_of_three()
    seats = ApprovalTrust.of(approvers={n: k.public for n, k in APPROVERS.items()})
    verified = verify_approvals(evidence(store), LOG_KEY.public, trust=seats)
    assert "a policy you pinned" not in verified.proven
    assert "with the approvers you pinned" in verified.proven
    assert "the number comes from the package (pin it with --need K)" in verified.not_proven
    full = ApprovalTrust.of(approvers={n: k.public for n, k in APPROVERS.items()}, need=1)
    assert "Every gate counted under a policy you pinned" in (
        verify_approvals(evidence(store), LOG_KEY.public, trust=full).proven
    )


def _run_one_of_three() -> bide.MemoryStore:
    gate = ApprovalGate.k_of_n(1, {n: k.public for n, k in APPROVERS.items()})
    tool = bide.Tool.from_function(_wire(False).fn, gate=gate)
    store = bide.MemoryStore()

    def drive() -> bide.RunResult[Any]:
        model = ScriptedModel([call("wire", amount=100, to="acme"), reply("done")])
        return bide.Agent(model, store=store, tools=[tool]).run_sync("r", "go")

    with pytest.raises(bide.ApprovalPending):
        drive()
    submit_decision(store, "r", "c0.0", APPROVERS["alice"], approve=True)
    assert drive().answer == "done"
    return store


def test_an_honest_run_still_verifies() -> None:
    store, call_id = approved_run()
    assert verify_approvals(evidence(store), LOG_KEY.public, call_id=call_id).facts["executed_calls_proven"]


def _run_with_an_ungated_delete() -> bide.MemoryStore:
    """delete put to alice (c0.0, never decided), then run after a deploy took its gate off; wire (c1.0)
    approved by alice and run."""
    gate = ApprovalGate.single("alice", ALICE.public)

    def delete(path: str) -> str:
        """Delete."""
        return f"deleted {path}"

    store = bide.MemoryStore()

    def drive(gated: bool) -> bide.RunResult[Any]:
        tools = [_wire(True), bide.Tool.from_function(delete, gate=gate if gated else None)]
        model = ScriptedModel(
            [call("delete", path="/prod"), call("wire", amount=1, to="acme"), reply("done")]
        )
        return bide.Agent(model, store=store, tools=tools).run_sync("r", "go")

    with pytest.raises(bide.ApprovalPending):
        drive(True)
    with pytest.raises(bide.ApprovalPending):
        drive(False)  # delete ran; wire waits
    submit_decision(store, "r", "c1.0", ALICE, approve=True)
    assert drive(False).answer == "done"
    return store


def test_a_request_filed_under_another_key_or_dropped_beside_its_pause_hides_nothing() -> None:
    """The log key's holder moved the undecided call's request to `approval:request:c0.0` (no policy
    digest), naming the other tool, or dropped it and kept the call's pause record: both verified with every
    executed call proven, though the call ran without an approval."""
    store = _run_with_an_ungated_delete()
    with pytest.raises(NotVerified, match=r"call 'c0\.0' was put to its approvers but never decided"):
        verify_approvals(evidence(store), LOG_KEY.public, trust=TRUST)

    def rekey(recs: list[dict[str, Any]]) -> None:
        [request] = [r for r in recs if r["key"].startswith("approval:request:c0.0:")]
        request["key"], request["data"]["tool"] = "approval:request:c0.0", "wire"

    with pytest.raises(NotVerified, match="is not a request filed under approval:request:<its call id>"):
        verify_approvals(evidence(_forged(store, rekey)), LOG_KEY.public, trust=TRUST)

    def drop(recs: list[dict[str, Any]]) -> None:
        recs[:] = [r for r in recs if not r["key"].startswith("approval:request:c0.0:")]

    dropped = verify_approvals(evidence(_forged(store, drop)), LOG_KEY.public, trust=TRUST)
    assert dropped.facts["executed_calls_proven"] is False
    assert "that call 'c0.0' of tool 'delete', which a gate paused, was approved" in dropped.not_proven
