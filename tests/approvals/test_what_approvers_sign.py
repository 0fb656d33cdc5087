"""What the approvers signed is the whole call that ran, and an auditor is told whose approval counted.

Three holes, each found by driving a real run and verifying its evidence offline:

- a gated tool whose arguments model left a value out of its dump (`exclude=True`) or masked it
  (`SecretStr`) ran with values no approver saw or signed, and verify-approvals still said its attempt
  carried "exactly the approved tool and arguments";
- `--need K` alone counted as pinning the policy ("Every gate counted under a policy you pinned"), so a run
  gated by anyone's keys passed as trusted;
- a call put to its approvers that then ran with no decision (a deploy took the gate off its tool) went
  unmentioned when another gate of the run verified.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field, SecretStr

import bide
from bide.approvals import ApprovalGate, ApprovalTrust, UntrustedPolicy, submit_decision, verify_approvals
from bide.audit import AuditLog, NotVerified, SigningKey
from bide.testing import ScriptedModel, call, reply

from .helpers import LOG_KEY, approved_run, audit_cli, evidence, records


def _alice_gate() -> tuple[SigningKey, ApprovalGate]:
    alice = SigningKey.generate()
    return alice, ApprovalGate.single("alice", alice.public)


@pytest.mark.parametrize("hidden", ["excluded", "secret"])
def test_a_gated_call_whose_recorded_arguments_differ_from_its_own_never_runs(hidden: str) -> None:
    _, gate = _alice_gate()
    ran: list[Any] = []
    if hidden == "excluded":

        @bide.tool(gate=gate)
        def wire(amount: int, to: Annotated[str, Field(exclude=True)]) -> str:
            """Wire money."""
            ran.append((amount, to))
            return "sent"

        arguments: dict[str, Any] = {"amount": 100, "to": "mallory"}
    else:

        @bide.tool(gate=gate)
        def wire(amount: int, pin: SecretStr) -> str:
            """Wire money."""
            ran.append((amount, pin))
            return "sent"

        arguments = {"amount": 100, "pin": "1234"}
    store = bide.MemoryStore()
    agent = bide.Agent(ScriptedModel([call("wire", **arguments), reply("done")]), store=store, tools=[wire])
    with pytest.raises(bide.ConfigError, match="are not the ones it is called with"):
        agent.run_sync("r", "pay")
    assert ran == []
    keys = [r.key for r in bide.Journal(store, "r").load().records()]
    assert not [k for k in keys if k.startswith(("approval:", "attempt:", "result:"))]  # nothing to sign


def _fresh_reference() -> str:
    return uuid.uuid4().hex


def test_an_excluded_argument_the_model_left_out_and_the_tool_makes_anew_never_runs() -> None:
    """The model's call and the dump agree (neither has `reference`), but the tool is called with a value
    made on each drive, which no marker or approver would see."""
    ran: list[Any] = []

    @bide.tool
    def wire(
        amount: int, reference: Annotated[str, Field(exclude=True, default_factory=_fresh_reference)]
    ) -> str:
        """Wire money."""
        ran.append(reference)
        return "sent"

    agent = bide.Agent(
        ScriptedModel([call("wire", amount=1), reply("done")]), store=bide.MemoryStore(), tools=[wire]
    )
    with pytest.raises(bide.ConfigError, match="are not the ones it is called with"):
        agent.run_sync("r", "pay")
    assert ran == []


def test_a_side_effect_whose_marker_would_hide_an_argument_never_runs() -> None:
    ran: list[Any] = []

    @bide.tool
    def wire(amount: int, to: Annotated[str, Field(exclude=True)]) -> str:
        """Wire money (its marker, and so its reconciler, would not know where to)."""
        ran.append(to)
        return "sent"

    agent = bide.Agent(
        ScriptedModel([call("wire", amount=1, to="x"), reply("done")]), store=bide.MemoryStore(), tools=[wire]
    )
    with pytest.raises(bide.ConfigError, match="exclude=True"):
        agent.run_sync("r", "pay")
    assert ran == []


def _approved_by(keys: dict[str, SigningKey], need: int) -> bide.MemoryStore:
    gate = ApprovalGate.k_of_n(need, {n: k.public for n, k in keys.items()})

    @bide.tool(gate=gate)
    def wire(amount: int, to: str) -> str:
        """Wire money."""
        return "sent"

    store = bide.MemoryStore()

    def drive() -> None:
        bide.Agent(
            ScriptedModel([call("wire", amount=10**6, to="mallory"), reply("ok")]), store=store, tools=[wire]
        ).run_sync("r", "x")

    with pytest.raises(bide.ApprovalPending):
        drive()
    for name in list(keys)[:need]:
        submit_decision(store, "r", "c0.0", keys[name], approve=True)
    drive()
    return store


def test_pinning_only_how_many_approvals_pins_no_approver(tmp_path: Path) -> None:
    impostors = {n: SigningKey.generate() for n in ("alice", "bob", "carol")}
    store = _approved_by(impostors, 2)
    verified = verify_approvals(evidence(store), LOG_KEY.public, trust=ApprovalTrust.of(need=2))
    assert verified.facts["pinned"] is False
    assert "pinned" not in verified.proven
    assert "that these approvers are the ones you trust" in verified.not_proven
    (tmp_path / "evidence.json").write_bytes(evidence(store).to_json())
    done = audit_cli(
        "verify-approvals",
        "evidence.json",
        "--pubkey",
        LOG_KEY.public.hex,
        "--need",
        "2",
        "--json",
        cwd=tmp_path,
    )
    out = json.loads(done.stdout)
    assert out["pinned"] is False and "Every gate counted under a policy you pinned" not in done.stdout
    # A need that differs from the policy's still refuses it (exit 5), as before.
    done = audit_cli(
        "verify-approvals", "evidence.json", "--pubkey", LOG_KEY.public.hex, "--need", "3", cwd=tmp_path
    )
    assert done.returncode == 5


def test_a_call_that_ran_without_its_gate_deciding_fails_verification(tmp_path: Path) -> None:
    alice, gate = _alice_gate()

    def tools(delete_gate: ApprovalGate | None) -> list[bide.Tool]:
        @bide.tool(gate=gate)
        def wire(amount: int, to: str) -> str:
            """Wire money."""
            return "sent"

        @bide.tool(gate=delete_gate)
        def delete_all(table: str) -> str:
            """Delete everything."""
            return f"deleted {table}"

        return [wire, delete_all]

    store = bide.MemoryStore()
    script = [call("wire", amount=100, to="acme"), call("delete_all", table="customers"), reply("done")]

    def drive(delete_gate: ApprovalGate | None) -> None:
        bide.Agent(ScriptedModel(list(script)), store=store, tools=tools(delete_gate)).run_sync("r", "go")

    with pytest.raises(bide.ApprovalPending):
        drive(gate)
    submit_decision(store, "r", "c0.0", alice, approve=True)
    with pytest.raises(bide.ApprovalPending):
        drive(gate)  # wire ran; delete_all's request is journaled
    drive(None)  # a later deploy took the gate off delete_all: it ran with no decision
    trust = ApprovalTrust.of(approvers={"alice": alice.public}, need=1)
    with pytest.raises(NotVerified, match=r"call 'c1\.0' was put to its approvers but never decided"):
        verify_approvals(evidence(store), LOG_KEY.public, trust=trust)
    # The approved call alone still verifies when it is the one asked about.
    assert verify_approvals(evidence(store), LOG_KEY.public, call_id="c0.0", trust=trust).facts["pinned"]
    # A partial package may leave a tally out: there the call is not proven, not a forgery.
    keys = [r.key for r in bide.Journal(store, "r").load().records() if r.key != "run:end"]
    partial = AuditLog(store, LOG_KEY).evidence("r", keys=keys)
    verified = verify_approvals(partial, LOG_KEY.public, trust=trust)
    assert "call 'c1.0', put to its approvers, ran only once approved: the package is partial" in (
        verified.not_proven
    )
    assert verified.facts["executed_calls_proven"] is False
    (tmp_path / "evidence.json").write_bytes(evidence(store).to_json())
    done = audit_cli(
        "verify-approvals", "evidence.json", "--pubkey", LOG_KEY.public.hex,
        "--approver", f"alice={alice.public.hex}", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and json.loads(done.stdout)["result"] == "not_verified"


def test_a_later_call_of_a_gated_tool_that_ran_with_no_request_is_not_proven() -> None:
    """The gate of wire approved c0.0; a deploy then took the gate off and the same run's next call of wire
    (c1.0, to mallory) ran with no request at all. Verification said every executed call was proven
    (`executed_calls_proven: true`) and named only c0.0. A gate may decide some calls alone, so the package
    cannot call this a forgery: it is not proven."""
    alice, gate = _alice_gate()

    def wire_tool(gated: bool) -> bide.Tool:
        def wire(amount: int, to: str) -> str:
            """Wire money."""
            return f"sent {amount} to {to}"

        return bide.Tool.from_function(wire, gate=gate if gated else None)

    store = bide.MemoryStore()
    script = [call("wire", amount=100, to="acme"), call("wire", amount=99999, to="mallory"), reply("done")]
    with pytest.raises(bide.ApprovalPending):
        bide.Agent(ScriptedModel(list(script)), store=store, tools=[wire_tool(True)]).run_sync("r", "go")
    submit_decision(store, "r", "c0.0", alice, approve=True)
    with pytest.raises(bide.ModelError):  # c0.0 ran; the model is gone before the next call
        bide.Agent(ScriptedModel(script[:1]), store=store, tools=[wire_tool(True)]).run_sync("r", "go")
    assert bide.Agent(ScriptedModel(list(script)), store=store, tools=[wire_tool(False)]).run_sync(
        "r", "go"
    ).answer == "done"
    trust = ApprovalTrust.of(approvers={"alice": alice.public}, need=1)
    verified = verify_approvals(evidence(store), LOG_KEY.public, trust=trust)
    assert verified.facts["executed_calls_proven"] is False
    assert "that call 'c1.0' of tool 'wire', whose calls are put to approvers, was approved" in (
        verified.not_proven
    )
    # Asked about c0.0 alone, its gate is all there is to prove.
    only = verify_approvals(evidence(store), LOG_KEY.public, call_id="c0.0", trust=trust)
    assert only.facts["executed_calls_proven"] is True


def test_approvers_pinned_under_each_others_keys_are_named_as_such() -> None:
    """Pinning alice and bob with their keys swapped said the package had seats "not pinned" and lacked
    "pinned seats" alice and bob, which it has."""
    keys = {n: SigningKey.generate() for n in ("alice", "bob")}
    store = _approved_by(keys, 1)
    swapped = ApprovalTrust.of(approvers={"alice": keys["bob"].public, "bob": keys["alice"].public})
    with pytest.raises(UntrustedPolicy) as refused:
        verify_approvals(evidence(store), LOG_KEY.public, trust=swapped)
    said = str(refused.value)
    assert "(seats under another key than pinned: alice, bob)" in said
    assert "lacks" not in said and "not pinned:" not in said


@pytest.mark.parametrize("copied", ["approval:tally:", "@journal"])
def test_a_package_holding_a_record_key_twice_or_a_second_header_is_refused(copied: str) -> None:
    """A journal writes each key once and its header at position 0. A package signed with the log key
    that held the tally twice listed the gate twice and verified; one with a second header verified and
    counted two headers. Neither was written by a store."""
    store, _ = approved_run()
    forged = bide.MemoryStore()
    for key, rec in records(store):
        forged.insert_many("r", [(key, bide.canonical_json(rec))])
        if key.startswith(copied):
            forged.insert_many("r", [(f"copy-of-{key}", bide.canonical_json(rec))])
    with pytest.raises(NotVerified, match=r"the same key|a header record at position 1"):
        verify_approvals(evidence(forged), LOG_KEY.public)
    # Without the log key, the package's own structure is checked all the same: only its head's signature
    # is left unchecked (verify-approvals skipped these checks and answered "verified").
    with pytest.raises(NotVerified, match=r"the same key|a header record at position 1"):
        verify_approvals(evidence(forged), None)
