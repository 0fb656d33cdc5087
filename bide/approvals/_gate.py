"""`ApprovalGate`: a tool waits for k of n signed human decisions before it runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import StoreError
from .._gate import Approved, Denied, GateDecision, GateRequest, Pending
from ..audit._keys import PublicKey
from ._policy import ApprovalPolicy
from ._tally import (
    Count,
    asked_data,
    asked_key,
    asked_prefix,
    count,
    current_request,
    decision_prefix,
    request_data,
    request_key,
    request_prefix,
    tally_data,
    tally_key,
    turn_data,
    turn_key,
)

__all__ = ["ApprovalGate"]


class ApprovalGate:
    """A `bide.Gate` that approves a call once `policy.need` of its approvers have signed an approval of
    this exact call (run, call id, tool, argument digest) under this policy, and denies it once so many have
    denied that `need` can no longer be reached (the model is told it was denied).

    On first consultation it journals a request record (the call and the policy, with the approvers' public
    keys) and pauses the run (``awaiting_approval``); approvers sign with `bide approve` / `bide deny` or
    `bide.approvals.submit_decision`. When the count is decided it journals the tally, naming every
    decision record it read, before the tool runs; from then on the gate is closed and the tally is final,
    even if the policy in code changes later. The tally and each decision take numbered turns (see
    `bide.approvals._tally`), so a decision is either named by the tally or refused as too late.
    """

    def __init__(self, policy: ApprovalPolicy) -> None:
        self.policy = policy

    @classmethod
    def k_of_n(cls, need: int, approvers: Mapping[str, PublicKey | str | bytes]) -> ApprovalGate:
        """`need` of the named approvers ({name: public key, PEM path or 64 hex characters})."""
        return cls(ApprovalPolicy.of(need, approvers))

    @classmethod
    def single(cls, name: str, key: PublicKey | str | bytes) -> ApprovalGate:
        """One named approver decides (1 of 1)."""
        return cls(ApprovalPolicy.of(1, {name: key}))

    def _closed(self, request: GateRequest, tally: Any) -> GateDecision:
        if not isinstance(tally, dict) or (tally.get("tool"), tally.get("arguments_digest")) != (
            request.tool,
            request.arguments_digest,
        ):
            return Denied("the journaled approval tally does not match this call; refusing to run it")
        evidence = {
            "tally": tally_key(request.call_id),
            "policy_digest": tally.get("policy_digest"),
            "approved_by": tally.get("approved_by"),
            "denied_by": tally.get("denied_by"),
        }
        if tally.get("outcome") == "approved":
            return Approved(evidence)
        denied_by = ", ".join(tally.get("denied_by") or []) or "nobody"
        return Denied(
            f"{tally.get('need')} approvals of {len(tally.get('approvers') or [])} can no longer be "
            f"reached (denied by {denied_by})",
            evidence,
        )

    async def check(self, request: GateRequest) -> GateDecision:
        """Approved, Denied or Pending for this call, from the decisions in the journal."""
        journal = request.journal
        await journal.refresh()
        tkey = tally_key(request.call_id)
        tally = journal.get(tkey)
        if tally is not None:
            return self._closed(request, tally)
        policy = self.policy
        rkey = request_key(request.call_id, policy)
        if journal.get(rkey) is None:
            await journal.put(
                rkey,
                request_data(
                    request.call_id, request.tool, request.arguments, request.arguments_digest, policy
                ),
            )
        else:
            await self._ask_again(request, rkey)
        # The tally is written together with the next turn (one past the decision records it counts), all
        # or nothing. A decision that lands after our read takes that turn first; then the tally is not
        # written, and we read again and recount, so a tally always names every decision before it.
        for _ in range(100):
            c = self._count(request)
            if c.outcome == "pending":
                waiting = [n for n in policy.names if n not in c.approved_by and n not in c.denied_by]
                return Pending(
                    f"needs {policy.need} of {len(policy.approvers)} approvals, has {len(c.approved_by)}; "
                    f"waiting for {', '.join(waiting)}"
                )
            data = tally_data(request.call_id, request.tool, request.arguments_digest, policy, c)
            turn = len(c.records) + 1
            written = await journal.put_all(
                [(tkey, data), (turn_key(request.call_id, turn), turn_data(request.call_id, turn, tkey))]
            )
            if written:
                return self._closed(request, data)
            await journal.refresh()
            stored = journal.get(tkey)
            if stored is not None:  # another process closed the gate first: its tally is final
                return self._closed(request, stored)
        raise StoreError(
            f"the approval gate of call {request.call_id!r} kept losing its turn to new decisions; "
            "run it again"
        )

    async def _ask_again(self, request: GateRequest, rkey: str) -> None:
        """Make the request under `rkey` the one approvers answer again, when the call's latest request is
        another policy's: the policy was rotated, then rolled back to this one. Without the asked record,
        `bide approve` and `bide pending` would follow the other policy's request, which this gate does
        not count."""
        journal, call = request.journal, request.call_id
        prefixes = (request_prefix(call), asked_prefix(call))
        mine = [k for k in journal.keys("approval:") if k.startswith(prefixes)]
        if current_request(call, [(k, journal.get(k)) for k in mine]) == rkey:
            return
        n = sum(1 for k in mine if k.startswith(asked_prefix(call))) + 1
        await journal.put(asked_key(call, n), asked_data(call, rkey))

    def _count(self, request: GateRequest) -> Count:
        journal = request.journal
        decisions = [(k, journal.get(k)) for k in journal.keys(decision_prefix(request.call_id))]
        return count(
            journal.run_id, request.call_id, request.tool, request.arguments_digest, self.policy, decisions
        )
