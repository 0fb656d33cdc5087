"""The counting rule: one pure function, used by the gate at runtime and by `bide-audit verify-approvals`.

Gate records (kind "gate", under the reserved ``approval:`` keys) for a call `C`:

- ``approval:request:C:<policy digest hex>``: the call put to the approvers and the policy that governs it;
- ``approval:decision:C:<approver>:<hex SHA-256 of the signature>``: one signed decision;
- ``approval:asked:C:<n>``: the gate went back to a policy it had requested before (a rotation rolled
  back): the request it names is again the one the gate waits on (`current_request`);
- ``approval:changed:C``: the call's arguments validated to another digest on a later drive than the one
  the approvers were asked about (a tool that fills in an argument anew on each drive): no approval of
  them can count; written once, so that `bide pending` can say so;
- ``approval:tally:C``: the gate's final count, journaled before the tool runs (or before the model is
  told of a denial); once it exists the gate is closed and nothing later counts;
- ``approval:turn:C:<n>``: written in one all-or-nothing batch with the n-th decision record on C, or with
  the tally (n = the number of decision records it counted, plus one). Whoever takes turn n first wins:
  a tally cannot be written past a decision it has not read, nor a decision past a tally; the loser
  re-reads and tries again (the gate recounts, the approver sees the gate closed).

Counting, over the decision records in journal order: a record counts only if it is well formed, names a
seat of the policy, is for this journal (the digest of its header), this call (tool, argument digest) and
policy, is signed by that seat's key, and the signature verifies (a decision in the format before the
journal digest was signed never counts); invalid records never occupy a seat (they are `excluded`, with a
reason). Per approver the first valid decision counts; later ones are `superseded`. The call is approved
when approvals reach `need`, denied when the approvers left (n minus denials) can no longer reach `need`,
pending otherwise.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._policy import ApprovalPolicy, decision_bytes

__all__ = [
    "OLD_FORMAT",
    "OTHER_JOURNAL",
    "TALLY_FIELDS",
    "Count",
    "asked_data",
    "asked_key",
    "changed_data",
    "changed_key",
    "changed_text",
    "count",
    "current_request",
    "decision_key",
    "decision_prefix",
    "request_key",
    "request_prefix",
    "tally_key",
    "turn_data",
    "turn_key",
]


def request_key(call_id: str, policy: ApprovalPolicy) -> str:
    return f"{request_prefix(call_id)}{policy.digest.hex()}"


def request_prefix(call_id: str) -> str:
    return f"approval:request:{call_id}:"


def asked_prefix(call_id: str) -> str:
    return f"approval:asked:{call_id}:"


def asked_key(call_id: str, n: int) -> str:
    return f"{asked_prefix(call_id)}{n}"


def asked_data(call_id: str, request: str) -> dict[str, Any]:
    """The data of an asked record: the gate of `call_id` waits on the request under key `request` again."""
    return {"type": "asked", "call_id": call_id, "request": request}


def current_request(call_id: str, records: Iterable[tuple[str, Any]]) -> str | None:
    """The key of the request the gate of `call_id` waits on, from approval records `(key, data)` in
    journal order: the latest request record, unless a later asked record names an earlier request (the
    gate's policy was rotated and then rolled back). None before the gate has asked."""
    current = None
    for key, data in records:
        if key.startswith(request_prefix(call_id)):
            current = key
        elif key.startswith(asked_prefix(call_id)) and isinstance(data, dict):
            named = data.get("request")
            if isinstance(named, str) and named.startswith(request_prefix(call_id)):
                current = named
    return current


def decision_prefix(call_id: str) -> str:
    return f"approval:decision:{call_id}:"


def decision_key(call_id: str, approver: str, signature: bytes) -> str:
    import hashlib

    return f"{decision_prefix(call_id)}{approver}:{hashlib.sha256(signature).hexdigest()}"


def changed_key(call_id: str) -> str:
    return f"approval:changed:{call_id}"


def changed_data(
    call_id: str, tool: str, requested_digest: str, arguments: Any, arguments_digest: str
) -> dict[str, Any]:
    """The data of a changed record: the approvers were asked about `requested_digest`, but a later drive
    validated the call's arguments to `arguments` (hashing to `arguments_digest`)."""
    return {
        "type": "changed",
        "call_id": call_id,
        "tool": tool,
        "requested_digest": requested_digest,
        "arguments": arguments,
        "arguments_digest": arguments_digest,
    }


def changed_text(run_id: str, call_id: str, requested_digest: str, arguments_digest: str) -> str:
    """What to say when the call's arguments no longer hash to the digest the approvers were asked about."""
    return (
        f"the arguments of call {call_id!r} changed between drives: the approvers were asked to sign "
        f"arguments digest {requested_digest}, but a later drive validated them to digest "
        f"{arguments_digest}, so no approval given can count. Most likely the tool fills in an argument "
        "anew on each drive (a default_factory making a uuid or a timestamp); a gated tool's arguments must "
        "validate the same way every time: give such a value a fixed default or let the model pass it, then "
        f"cancel this run (`bide cancel {run_id}`) and start the work as a new run"
    )


def tally_key(call_id: str) -> str:
    return f"approval:tally:{call_id}"


def turn_key(call_id: str, turn: int) -> str:
    return f"approval:turn:{call_id}:{turn}"


def turn_data(call_id: str, turn: int, record: str) -> dict[str, Any]:
    """The data of a turn record: which record (a decision, or the tally) took turn `turn` on the call."""
    return {"type": "turn", "call_id": call_id, "turn": turn, "record": record}


TALLY_FIELDS = frozenset(
    {
        "type",
        "call_id",
        "tool",
        "arguments_digest",
        "need",
        "approvers",
        "policy_digest",
        "outcome",
        "approved_by",
        "denied_by",
        "excluded",
        "superseded",
        "records",
    }
)


@dataclass(frozen=True)
class Count:
    """The result of counting: the outcome and who counted, and why other records did not."""

    outcome: Literal["approved", "denied", "pending"]
    approved_by: list[str] = field(default_factory=list)
    denied_by: list[str] = field(default_factory=list)
    excluded: list[dict[str, str]] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    records: list[str] = field(default_factory=list)


_DECISION_FIELDS = {
    "type",
    "journal_digest",
    "call_id",
    "tool",
    "arguments_digest",
    "approver",
    "decision",
    "need",
    "approvers_digest",
    "key_id",
    "signature",
}
# A decision as bide wrote it before decisions were bound to their journal: valid for any journal of the run
# id, so it counts nowhere.
_OLD_DECISION_FIELDS = _DECISION_FIELDS - {"journal_digest"}
OLD_FORMAT = (
    "the decision is in the format before decisions were bound to their journal (it carries no "
    "journal_digest) and counts nowhere: the approver must decide again"
)
OTHER_JOURNAL = (
    "the decision was made for another journal (a run of the same id in another store, or a copy of one) "
    "and counts nowhere"
)


def _why_invalid(
    run_id: str,
    call_id: str,
    tool: str,
    arguments_digest: str,
    policy: ApprovalPolicy,
    journal_digest: str,
    data: Any,
) -> tuple[str | None, str, bool]:
    """(reason it does not count or None, approver name, approve?)."""
    if isinstance(data, dict) and set(data) == _OLD_DECISION_FIELDS and data.get("type") == "decision":
        approver = data["approver"]
        return OLD_FORMAT, approver if isinstance(approver, str) else "", False
    if not isinstance(data, dict) or set(data) != _DECISION_FIELDS or data.get("type") != "decision":
        return "not a well-formed decision record", "", False
    approver, decision = data["approver"], data["decision"]
    if not isinstance(approver, str) or decision not in ("approve", "deny"):
        return "not a well-formed decision record", "", False
    seat = policy.seat(approver)
    if seat is None:
        return f"{approver!r} is not an approver of this policy", approver, False
    if data["journal_digest"] != journal_digest:
        return OTHER_JOURNAL, approver, False
    if (data["call_id"], data["tool"], data["arguments_digest"]) != (call_id, tool, arguments_digest):
        return "the decision is for another call or other arguments", approver, False
    if data["need"] != policy.need or data["approvers_digest"] != policy.approvers_digest.hex():
        return "the decision is for another policy", approver, False
    if data["key_id"] != seat.key.key_id:
        return f"signed with key {data['key_id']}, not the seat's key {seat.key.key_id}", approver, False
    sig_text = data["signature"]
    try:
        sig = base64.b64decode(sig_text, validate=True) if isinstance(sig_text, str) else b""
    except ValueError:  # binascii.Error, or text that is not ASCII
        sig = b""
    try:
        digest, journal = bytes.fromhex(arguments_digest), bytes.fromhex(journal_digest)
    except ValueError:
        return "malformed arguments or journal digest", approver, False
    if len(digest) != 32 or len(journal) != 32:
        return "malformed arguments or journal digest", approver, False
    msg = decision_bytes(
        run_id,
        call_id,
        tool,
        digest,
        approver,
        decision == "approve",
        policy.need,
        policy.approvers_digest,
        journal_digest=journal,
    )
    if not seat.key.verify(sig, msg):
        return (
            "the signature does not verify for this journal, run, call, arguments, decision and policy",
            approver,
            False,
        )
    return None, approver, decision == "approve"


def count(
    run_id: str,
    call_id: str,
    tool: str,
    arguments_digest: str,
    policy: ApprovalPolicy,
    decisions: Sequence[tuple[str, Any]],
    *,
    journal_digest: str,
) -> Count:
    """Count decision records `(key, data)` given in journal order, in the journal whose header hashes to
    `journal_digest` (hex; see `journal_digest_of`), as the module docstring says."""
    approved: list[str] = []
    denied: list[str] = []
    excluded: list[dict[str, str]] = []
    superseded: list[str] = []
    seen: set[str] = set()
    for key, data in decisions:
        reason, who, approve = _why_invalid(
            run_id, call_id, tool, arguments_digest, policy, journal_digest, data
        )
        if reason is not None:
            excluded.append({"record": key, "reason": reason})
            continue
        if who in seen:
            superseded.append(key)
            continue
        seen.add(who)
        (approved if approve else denied).append(who)
    n = len(policy.approvers)
    outcome: Literal["approved", "denied", "pending"]
    if len(approved) >= policy.need:
        outcome = "approved"
    elif n - len(denied) < policy.need:
        outcome = "denied"
    else:
        outcome = "pending"
    return Count(outcome, approved, denied, excluded, superseded, [k for k, _ in decisions])


def tally_data(
    call_id: str, tool: str, arguments_digest: str, policy: ApprovalPolicy, c: Count
) -> dict[str, Any]:
    """The data of the tally record for a decided count."""
    return {
        "type": "tally",
        "call_id": call_id,
        "tool": tool,
        "arguments_digest": arguments_digest,
        "need": policy.need,
        "approvers": policy.names,
        "policy_digest": policy.digest.hex(),
        "outcome": c.outcome,
        "approved_by": c.approved_by,
        "denied_by": c.denied_by,
        "excluded": c.excluded,
        "superseded": c.superseded,
        "records": c.records,
    }


def request_data(
    call_id: str,
    tool: str,
    arguments: Any,
    arguments_digest: str,
    policy: ApprovalPolicy,
    *,
    journal_digest: str,
) -> dict[str, Any]:
    """The data of the request record: the journal it is made in (the digest of its header), the call, its
    validated arguments (so approvers see what they sign; their canonical JSON hashes to
    `arguments_digest`), and the policy."""
    return {
        "type": "request",
        "journal_digest": journal_digest,
        "call_id": call_id,
        "tool": tool,
        "arguments": arguments,
        "arguments_digest": arguments_digest,
        "policy": policy.to_json(),
        "policy_digest": policy.digest.hex(),
    }


def arguments_match(data: dict[str, Any]) -> bool:
    """True when a request record's arguments hash (canonical JSON, SHA-256) to its arguments digest."""
    import hashlib

    from .._canonical import canonical_json
    from .._errors import ConfigError

    try:
        return hashlib.sha256(canonical_json(data.get("arguments"))).hexdigest() == data.get(
            "arguments_digest"
        )
    except ConfigError:
        return False
