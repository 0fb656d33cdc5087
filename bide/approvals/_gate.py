"""`ApprovalGate`: a tool waits for k of n signed human decisions before it runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import BideError, StoreError
from .._gate import Approved, Denied, GateDecision, GateJournal, GateRequest, Pending
from ..audit._keys import PublicKey
from ._policy import ApprovalPolicy, run_journal_digest
from ._tally import (
    OLD_FORMAT,
    OTHER_JOURNAL,
    TALLY_FIELDS,
    Count,
    asked_data,
    asked_key,
    asked_prefix,
    changed_data,
    changed_key,
    changed_text,
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

__all__ = ["ApprovalGate", "ApprovalRecordsInvalid"]


class ApprovalRecordsInvalid(BideError):
    """The journaled approval tally of a call does not match the signed decisions journaled for it (a tally
    written around bide, one under another policy than the gate's own, or one that counted decisions which
    no longer count). The gate refused to act on it: nothing was run. The message says what to do."""


def journal_digest(journal: GateJournal) -> str:
    """The hex digest of the run's header record (`journal_digest_of`), which every decision signs."""
    return run_journal_digest(journal.run_id, journal.header_bytes())


class ApprovalGate:
    """A `bide.Gate` that approves a call once `policy.need` of its approvers have signed an approval of
    this exact call (journal, run, call id, tool, argument digest) under this policy, and denies it once so
    many have denied that `need` can no longer be reached (the model is told it was denied).

    On first consultation it journals a request record (the journal, the call and the policy, with the
    approvers' public keys) and pauses the run (``awaiting_approval``); approvers sign with `bide approve` /
    `bide deny` or `bide.approvals.submit_decision`. When the count is decided it journals the tally, naming
    every decision record it read, before the tool runs; from then on the gate is closed and later decisions
    do not count. The tally and each decision take numbered turns (see `bide.approvals._tally`), so a
    decision is either named by the tally or refused as too late.

    A tally is never taken on trust: before acting on one it did not write in this consultation, the gate
    recounts the signed decisions it names under its own policy (from code) and this journal, and raises
    `ApprovalRecordsInvalid` unless the recount is the tally.
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

    def _decided(self, request: GateRequest, tally: dict[str, Any]) -> GateDecision:
        """What a tally the gate counted (or recounted) decides."""
        evidence = {
            "tally": tally_key(request.call_id),
            "policy_digest": tally["policy_digest"],
            "approved_by": tally["approved_by"],
            "denied_by": tally["denied_by"],
        }
        if tally["outcome"] == "approved":
            return Approved(evidence)
        denied_by = ", ".join(tally["denied_by"]) or "nobody"
        return Denied(
            f"{tally['need']} approvals of {len(tally['approvers'])} can no longer be reached "
            f"(denied by {denied_by})",
            evidence,
        )

    def _closed(self, request: GateRequest, tally: Any, journal: str, keys: list[str]) -> GateDecision:
        """Act on a stored tally only once the recount of its signed decisions is that tally (`keys`: the
        journal's approval keys, in journal order)."""
        problem = self._tally_problem(request, tally, journal, keys)
        if problem is None:
            return self._decided(request, tally)
        run, call = request.run_id, request.call_id
        raise ApprovalRecordsInvalid(
            f"the approval records of call {call!r} in run {run!r} ({request.tool}) do not match their "
            f"signed decisions: {problem}. Nothing was run, and the gate will not open on this tally. A "
            "record was written around bide (forged or damaged), the gate's policy in code changed after it "
            "counted (give it back the policy it counted under to go on), or an earlier bide counted "
            f"decisions that no longer count. Check the run (`bide show {run}`, or `bide-audit "
            "verify-approvals` on its export); unless it is the policy, cancel the run "
            f"(`bide cancel {run}`) and start the work as a new run, whose approvers sign again"
        )

    def _tally_problem(self, request: GateRequest, tally: Any, journal: str, keys: list[str]) -> str | None:
        """Why the stored tally is not this gate's count of the decisions journaled before it, or None."""
        policy, call = self.policy, request.call_id
        if not isinstance(tally, dict) or set(tally) != TALLY_FIELDS or tally.get("type") != "tally":
            return "the tally record is not well formed"
        if (tally["call_id"], tally["tool"]) != (call, request.tool):
            return f"the tally is for call {tally['call_id']!r} of tool {tally['tool']!r}"
        if tally["arguments_digest"] != request.arguments_digest:
            return (
                f"the tally is for arguments digest {tally['arguments_digest']}, but this drive's arguments "
                f"hash to {request.arguments_digest} (if the tool fills in an argument anew on each drive, "
                "a default_factory making a uuid or a timestamp, the approvals never match what runs)"
            )
        if (tally["policy_digest"], tally["need"], tally["approvers"]) != (
            policy.digest.hex(),
            policy.need,
            policy.names,
        ):
            return (
                f"the tally was counted under policy {tally['policy_digest']!r}, not this gate's "
                f"{policy.need}-of-{len(policy.approvers)} policy {policy.digest.hex()} (from code)"
            )
        before = []
        for key in keys:
            if key == tally_key(call):
                break
            if key.startswith(decision_prefix(call)):
                before.append(key)
        if tally["records"] != before:
            return (
                f"the tally names decision records {tally['records']}, but the decisions journaled before "
                f"it are {before}"
            )
        decisions = [(k, request.journal.get(k)) for k in before]
        c = count(
            request.run_id,
            call,
            request.tool,
            request.arguments_digest,
            policy,
            decisions,
            journal_digest=journal,
        )
        recorded = [tally[k] for k in ("outcome", "approved_by", "denied_by", "excluded", "superseded")]
        if (
            c.outcome == "pending"
            or [c.outcome, c.approved_by, c.denied_by, c.excluded, c.superseded] != recorded
        ):
            why = {e["reason"] for e in c.excluded} & {OLD_FORMAT, OTHER_JOURNAL}
            return (
                f"the tally says {tally['outcome']} (approved by {tally['approved_by']}, denied by "
                f"{tally['denied_by']}), but the signed decisions count {c.outcome} (approved by "
                f"{c.approved_by}, denied by {c.denied_by})" + "".join(f"; {w}" for w in sorted(why))
            )
        return None

    async def check(self, request: GateRequest) -> GateDecision:
        """Approved, Denied or Pending for this call, from the decisions in the journal."""
        journal = request.journal
        await journal.refresh()
        digest = journal_digest(journal)
        keys = journal.keys("approval:")  # in journal order; read again after each refresh
        tkey = tally_key(request.call_id)
        tally = journal.get(tkey)
        if tally is not None or tkey in keys:  # (a record there that is no gate record reads as None)
            return self._closed(request, tally, digest, keys)
        changed = await self._arguments_changed(request, keys)
        if changed is not None:
            return Pending(changed)
        policy = self.policy
        rkey = request_key(request.call_id, policy)
        if journal.get(rkey) is None:
            await journal.put(
                rkey,
                request_data(
                    request.call_id,
                    request.tool,
                    request.arguments,
                    request.arguments_digest,
                    policy,
                    journal_digest=digest,
                ),
            )
        else:
            await self._ask_again(request, rkey, keys)
        # The tally is written together with the next turn (one past the decision records it counts), all
        # or nothing. A decision that lands after our read takes that turn first; then the tally is not
        # written, and we read again and recount, so a tally always names every decision before it.
        for _ in range(100):
            c = self._count(request, digest, keys)
            if c.outcome == "pending":
                return Pending(_pending_text(policy, c))
            data = tally_data(request.call_id, request.tool, request.arguments_digest, policy, c)
            turn = len(c.records) + 1
            written = await journal.put_all(
                [(tkey, data), (turn_key(request.call_id, turn), turn_data(request.call_id, turn, tkey))]
            )
            if written:
                return self._decided(request, data)
            await journal.refresh()
            keys = journal.keys("approval:")
            stored = journal.get(tkey)
            if stored is not None:  # another process closed the gate first: recounted before it is acted on
                return self._closed(request, stored, digest, keys)
        raise StoreError(
            f"the approval gate of call {request.call_id!r} kept losing its turn to new decisions; "
            "run it again"
        )

    async def _arguments_changed(self, request: GateRequest, keys: list[str]) -> str | None:
        """Why the call cannot be approved when the approvers were asked about other arguments than this
        drive validated (a tool that fills in an argument anew on each drive), or None. Journals it once
        (`approval:changed:<call>`), so that `bide pending` can say it too."""
        journal, call = request.journal, request.call_id
        asked = [journal.get(k) for k in keys if k.startswith(request_prefix(call))]
        digests = {d.get("arguments_digest") for d in asked if isinstance(d, dict)}
        if not digests or digests == {request.arguments_digest}:
            return None
        requested = next(  # the first request asked about other arguments
            str(d.get("arguments_digest"))
            for d in asked
            if isinstance(d, dict) and d.get("arguments_digest") != request.arguments_digest
        )
        data = changed_data(call, request.tool, requested, request.arguments, request.arguments_digest)
        await journal.put(changed_key(call), data)
        return changed_text(request.run_id, call, requested, request.arguments_digest)

    async def _ask_again(self, request: GateRequest, rkey: str, keys: list[str]) -> None:
        """Make the request under `rkey` the one approvers answer again, when the call's latest request is
        another policy's: the policy was rotated, then rolled back to this one. Without the asked record,
        `bide approve` and `bide pending` would follow the other policy's request, which this gate does
        not count."""
        journal, call = request.journal, request.call_id
        prefixes = (request_prefix(call), asked_prefix(call))
        mine = [k for k in keys if k.startswith(prefixes)]
        if current_request(call, [(k, journal.get(k)) for k in mine]) == rkey:
            return
        n = sum(1 for k in mine if k.startswith(asked_prefix(call))) + 1
        await journal.put(asked_key(call, n), asked_data(call, rkey))

    def _count(self, request: GateRequest, journal_digest: str, keys: list[str]) -> Count:
        journal = request.journal
        prefix = decision_prefix(request.call_id)
        decisions = [(k, journal.get(k)) for k in keys if k.startswith(prefix)]
        return count(
            journal.run_id,
            request.call_id,
            request.tool,
            request.arguments_digest,
            self.policy,
            decisions,
            journal_digest=journal_digest,
        )


def _pending_text(policy: ApprovalPolicy, c: Count) -> str:
    """The reason a call still waits: the count, who is waited for, and decisions that do not count
    because of their format or journal (their approvers are waited for again)."""
    waiting = [n for n in policy.names if n not in c.approved_by and n not in c.denied_by]
    text = (
        f"needs {policy.need} of {len(policy.approvers)} approvals, has {len(c.approved_by)}; "
        f"waiting for {', '.join(waiting)}"
    )
    for reason, what in (
        (
            OLD_FORMAT,
            "signed before decisions were bound to their journal (by an earlier bide) do not count: those "
            "approvers must decide again",
        ),
        (
            OTHER_JOURNAL,
            "made for another journal (another store's run of this id, or a copy) do not count here: an "
            "approver who means this run must decide on it",
        ),
    ):
        n = sum(1 for e in c.excluded if e["reason"] == reason)
        if n:
            text += f"; {n} decision record(s) {what}"
    return text
