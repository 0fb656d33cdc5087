"""The counting rule: one pure function, used by the gate at runtime and by `bide-audit verify-approvals`.

Gate records (kind "gate", under the reserved ``approval:`` keys) for a call `C`:

- ``approval:request:C:<policy digest hex>``: the call put to the approvers and the policy that governs it;
- ``approval:decision:C:<approver>:<hex SHA-256 of the signature>``: one signed decision;
- ``approval:asked:C:<n>``: the gate went back to a policy it had requested before (a rotation rolled
  back): the request it names is again the one the gate waits on (`current_request`);
- ``approval:tally:C``: the gate's final count, journaled before the tool runs (or before the model is
  told of a denial); once it exists the gate is closed and nothing later counts;
- ``approval:turn:C:<n>``: written in one all-or-nothing batch with the n-th decision record on C, or with
  the tally (n = the number of decision records it counted, plus one). Whoever takes turn n first wins:
  a tally cannot be written past a decision it has not read, nor a decision past a tally; the loser
  re-reads and tries again (the gate recounts, the approver sees the gate closed).

Counting, over the decision records in journal order: a record counts only if it is well formed, names a
seat of the policy, is for this call (tool, argument digest) and policy, is signed by that seat's key, and
the signature verifies; invalid records never occupy a seat (they are `excluded`, with a reason). Per
approver the first valid decision counts; later ones are `superseded`. The call is approved when approvals
reach `need`, denied when the approvers left (n minus denials) can no longer reach `need`, pending otherwise.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._policy import ApprovalPolicy, decision_bytes

__all__ = [
    "Count",
    "asked_data",
    "asked_key",
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


def tally_key(call_id: str) -> str:
    return f"approval:tally:{call_id}"


def turn_key(call_id: str, turn: int) -> str:
    return f"approval:turn:{call_id}:{turn}"


def turn_data(call_id: str, turn: int, record: str) -> dict[str, Any]:
    """The data of a turn record: which record (a decision, or the tally) took turn `turn` on the call."""
    return {"type": "turn", "call_id": call_id, "turn": turn, "record": record}


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


def _why_invalid(
    run_id: str, call_id: str, tool: str, arguments_digest: str, policy: ApprovalPolicy, data: Any
) -> tuple[str | None, str, bool]:
    """(reason it does not count or None, approver name, approve?)."""
    if not isinstance(data, dict) or set(data) != _DECISION_FIELDS or data.get("type") != "decision":
        return "not a well-formed decision record", "", False
    approver, decision = data["approver"], data["decision"]
    if not isinstance(approver, str) or decision not in ("approve", "deny"):
        return "not a well-formed decision record", "", False
    seat = policy.seat(approver)
    if seat is None:
        return f"{approver!r} is not an approver of this policy", approver, False
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
        digest = bytes.fromhex(arguments_digest)
    except ValueError:
        return "malformed arguments digest", approver, False
    msg = decision_bytes(
        run_id, call_id, tool, digest, approver, decision == "approve", policy.need, policy.approvers_digest
    )
    if not seat.key.verify(sig, msg):
        return (
            "the signature does not verify for this run, call, arguments, decision and policy",
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
) -> Count:
    """Count decision records `(key, data)` given in journal order (see the module docstring)."""
    approved: list[str] = []
    denied: list[str] = []
    excluded: list[dict[str, str]] = []
    superseded: list[str] = []
    seen: set[str] = set()
    for key, data in decisions:
        reason, who, approve = _why_invalid(run_id, call_id, tool, arguments_digest, policy, data)
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
    call_id: str, tool: str, arguments: Any, arguments_digest: str, policy: ApprovalPolicy
) -> dict[str, Any]:
    """The data of the request record: the call, its validated arguments (so approvers see what they
    sign; their canonical JSON hashes to `arguments_digest`), and the policy."""
    return {
        "type": "request",
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
