"""The approver's side: sign and record a decision, and list what waits for whom."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .._errors import ConfigError, RecordDamaged, StoreError
from .._journal import Journal
from .._records import HEADER_KEY, GateRecord, encode_record, pause_key
from .._resolve import status_of
from .._store import Store, announce
from ..audit._keys import SigningKey
from ._policy import ApprovalPolicy, decision_bytes, run_journal_digest
from ._tally import (
    OLD_FORMAT,
    OTHER_JOURNAL,
    arguments_match,
    changed_key,
    count,
    current_request,
    decision_key,
    decision_prefix,
    request_key,
    tally_key,
    turn_data,
    turn_key,
)

__all__ = [
    "ApprovalRefused",
    "NoWaitingCall",
    "PendingApproval",
    "pending_approvals",
    "pending_in",
    "submit_decision",
]


class ApprovalRefused(ConfigError):
    """A decision was not recorded: the gate is closed, the key holds no seat, or the approver already
    decided. The message says which."""


class NoWaitingCall(ApprovalRefused):
    """The run does not exist, or has no call waiting for approval under that id (see `bide pending`)."""


@dataclass(frozen=True)
class PendingApproval:
    """A call waiting for approvers: who approved and denied so far, who has not spoken, and `notes`:
    sentences approvers must read (the call's arguments changed between drives, so no approval can count;
    decisions that count nowhere because of their format or journal)."""

    run_id: str
    call_id: str
    tool: str
    arguments: Any
    arguments_digest: str
    need: int
    approvers: list[str]
    approved_by: list[str]
    denied_by: list[str]
    waiting_for: list[str]
    notes: tuple[str, ...] = ()
    #: What the gate will decide when the agent runs again and counts these decisions: "approved" or
    #: "denied" once enough are in (no one else need speak), else "pending".
    outcome: Literal["approved", "denied", "pending"] = "pending"


def journal_digest(journal: Journal) -> str:
    """The hex digest of the loaded run's header record, which every decision in it signs."""
    entry = journal.entry(HEADER_KEY)
    return run_journal_digest(journal.run_id, None if entry is None else entry.data)


_Open = tuple[str, dict[str, Any], ApprovalPolicy]


def _open_requests(journal: Journal) -> dict[str, _Open | RecordDamaged]:
    """Per call whose gate has no tally yet: (request key, data, policy) of the request its gate waits on
    (`current_request`: the latest, or the one an asked record names again), or why that request is
    damaged (raised by whoever asks about that call, so a damaged call keeps no other from a decision)."""
    asked: dict[str, list[tuple[str, Any]]] = {}
    for rec in journal.records():
        if isinstance(rec, GateRecord) and rec.key.startswith(("approval:request:", "approval:asked:")):
            # The call a record is filed under is in its key (approval:request:CALL:POLICY,
            # approval:asked:CALL:N), which the gate looks up: a record whose data was edited stays there.
            call = rec.key.split(":", 2)[2].rpartition(":")[0]
            asked.setdefault(call, []).append((rec.key, rec.data))
    out: dict[str, _Open | RecordDamaged] = {}
    for call, records in asked.items():
        rkey = current_request(call, records)
        request = journal.get(rkey) if rkey is not None else None
        if not isinstance(request, GateRecord) or journal.get(tally_key(call)) is not None:
            continue
        out[call] = _read_request(journal, call, request)
    return out


def _read_request(journal: Journal, call: str, request: GateRecord) -> _Open | RecordDamaged:
    """The request the gate of `call` waits on, or why it is damaged: the gate never writes such a
    request, so it was edited. Said as any damaged record is (the CLI's exit 4), not a KeyError read as a
    bug after a decision was recorded, nor "a custom gate" that leaves the call waiting forever."""
    data = request.data
    problem = None
    if not isinstance(data, dict) or data.get("call_id") != call:
        problem = f"is not the request of call {call!r} its key names"
    else:
        try:
            policy = ApprovalPolicy.from_json(data.get("policy"), recorded=True)
        except ConfigError as exc:
            problem = f"holds no valid policy ({exc})"
        else:
            tool, digest = data.get("tool"), data.get("arguments_digest")
            if request.key != request_key(call, policy):
                problem = "holds another policy than the one its key names"
            elif not isinstance(tool, str) or not (isinstance(digest, str) and _HEX_DIGEST.fullmatch(digest)):
                problem = "names no tool or no arguments digest (64 hex digits)"
            else:
                return request.key, data, policy
    return RecordDamaged(
        f"the approval request of call {call!r} in run {journal.run_id!r} {problem}", key=request.key
    )


_HEX_DIGEST = re.compile("[0-9a-f]{64}")


def _state(journal: Journal, data: dict[str, Any], policy: ApprovalPolicy) -> PendingApproval:
    call = data["call_id"]
    decisions = [
        (r.key, r.data)
        for r in journal.records()
        if isinstance(r, GateRecord) and r.key.startswith(decision_prefix(call))
    ]
    c = count(
        journal.run_id,
        call,
        data["tool"],
        data["arguments_digest"],
        policy,
        decisions,
        journal_digest=journal_digest(journal),
    )
    waiting = [n for n in policy.names if n not in c.approved_by and n not in c.denied_by]
    return PendingApproval(
        journal.run_id,
        call,
        data["tool"],
        data.get("arguments"),
        data["arguments_digest"],
        policy.need,
        policy.names,
        c.approved_by,
        c.denied_by,
        waiting,
        _notes(journal, data, dict(decisions), c.excluded),
        c.outcome,
    )


def _notes(
    journal: Journal, request: dict[str, Any], decisions: dict[str, Any], excluded: list[dict[str, str]]
) -> tuple[str, ...]:
    """What approvers must be told beside the count (see `PendingApproval`)."""
    notes = []
    changed = journal.get(changed_key(request["call_id"]))
    now = (
        changed.data.get("arguments_digest")
        if isinstance(changed, GateRecord) and isinstance(changed.data, dict)
        else None
    )
    if now is not None and now != request["arguments_digest"]:
        # A record of what one drive saw, not of what the next one will: drives that validate the arguments
        # as asked again (the deploy that differed is gone) count the approvals as usual.
        call, run = request["call_id"], journal.run_id
        notes.append(
            f"a drive validated the arguments of call {call!r} to digest {now}, not to the digest "
            f"{request['arguments_digest']} the approvers were asked about; while drives do so, no approval "
            "can count. If every drive does (a default_factory making a uuid or a timestamp: a gated tool's "
            f"arguments must validate the same way every time), cancel the run (`bide cancel {run}`) and "
            "start the work as a new run; if one deploy differed, approvals count once drives validate the "
            "arguments as asked"
        )
    for reason in (OLD_FORMAT, OTHER_JOURNAL):
        names = sorted(
            {str(decisions[e["record"]].get("approver")) for e in excluded if e["reason"] == reason}
        )
        if names:
            notes.append(f"the decision record(s) of {', '.join(names)}: {reason}")
    return tuple(notes)


def submit_decision(
    store: Store,
    run_id: str,
    call_id: str,
    key: SigningKey,
    *,
    approve: bool,
    sending: Callable[[], None] | None = None,
) -> str:
    """Sign and journal one decision on a waiting call; returns the record key.

    Refused (ConfigError) when the call has no open approval request, the gate already closed (a tally
    exists), the key fills no seat of the policy, or this approver already decided. The decision is
    written with the call's next turn, all or nothing: if the gate's tally (or another decision) takes
    that turn first, the journal is read again and the checks are made again, so a decision is never
    recorded unseen by a tally that precedes it. The run itself continues on its next drive
    (`agent.run(run_id, ...)` again; a `bide.Worker` drives it at its next pass). `sending`, if given, is
    called just before a decision goes to the store (the `bide approve` command learns there that an
    interrupt can no longer stop it).
    """
    for _ in range(100):
        dkey, items = _decision(store, run_id, call_id, key, approve)
        if sending is not None:
            sending()
        written = store.insert_many(run_id, items, exclusive=True)
        if len(written) == len(items) and all(e.inserted for e in written):
            announce(store, run_id)
            return dkey
    raise StoreError(
        f"call {call_id!r} in run {run_id!r} kept changing while this decision was being recorded; "
        "try again"
    )


def _not_waiting(journal: Journal, call_id: str) -> str:
    """Why no decision can be recorded for `call_id`, which has no open approval request: it waits at a
    gate of the application's own (no signed decision opens that), or it waits for nothing."""
    status = status_of(journal)
    if status.status == "awaiting_approval" and status.call_id == call_id:
        reason = getattr(journal.get(pause_key(call_id)), "reason", None) or "no reason given"
        return (
            f"call {call_id!r} of run {journal.run_id!r} waits at a custom gate, not an approval gate (its "
            f"gate says {reason!r}): signed decisions open only a bide.approvals.ApprovalGate; open this "
            "gate as its code checks, then run the agent again (same run id and input) and it asks the "
            "gate again"
        )
    return f"run {journal.run_id!r} has no call {call_id!r} waiting for approval (see `bide pending`)"


def _decision(
    store: Store, run_id: str, call_id: str, key: SigningKey, approve: bool
) -> tuple[str, list[tuple[str, bytes]]]:
    """Check the call as the journal stands now; the decision record and its turn record, encoded."""
    journal = Journal(store, run_id).load()
    if not journal.exists:
        raise NoWaitingCall(f"run {run_id!r} does not exist in {store.url}")
    if journal.get(tally_key(call_id)) is not None:
        raise ApprovalRefused(
            f"the approval gate of call {call_id!r} in run {run_id!r} is closed (its tally is "
            "recorded); a decision now would not count"
        )
    waiting = _open_requests(journal).get(call_id)
    if waiting is None:
        raise NoWaitingCall(_not_waiting(journal, call_id))
    if isinstance(waiting, RecordDamaged):
        raise waiting
    _, data, policy = waiting
    journal_id = journal_digest(journal)
    if data.get("journal_digest", journal_id) != journal_id:
        raise ApprovalRefused(
            f"the request of call {call_id!r} in run {run_id!r} was made in another journal (its journal "
            f"digest is {data.get('journal_digest')!r}, this run's is {journal_id}): it was copied from "
            "another store or forged; do not sign"
        )
    if not arguments_match(data):
        raise ApprovalRefused(
            f"the request of call {call_id!r} shows arguments that do not hash to the digest "
            "it asks approvers to sign; the journal is damaged or forged: do not sign"
        )
    seat = policy.seat_of_key(key.public)
    if seat is None:
        raise ApprovalRefused(
            f"key {key.key_id} is not the key of any approver of call {call_id!r} "
            f"(approvers: {', '.join(policy.names)})"
        )
    state = _state(journal, data, policy)
    if seat.name in state.approved_by or seat.name in state.denied_by:
        raise ApprovalRefused(
            f"{seat.name!r} has already decided on call {call_id!r}; one decision per approver"
            + "".join(f". Note: {note}" for note in state.notes)
        )
    msg = decision_bytes(
        run_id,
        call_id,
        data["tool"],
        bytes.fromhex(data["arguments_digest"]),
        seat.name,
        approve,
        policy.need,
        policy.approvers_digest,
        journal_digest=bytes.fromhex(journal_id),
    )
    sig = key.sign(msg)
    dkey = decision_key(call_id, seat.name, sig)
    record = GateRecord(
        key=dkey,
        data={
            "type": "decision",
            "journal_digest": journal_id,
            "call_id": call_id,
            "tool": data["tool"],
            "arguments_digest": data["arguments_digest"],
            "approver": seat.name,
            "decision": "approve" if approve else "deny",
            "need": policy.need,
            "approvers_digest": policy.approvers_digest.hex(),
            "key_id": key.key_id,
            "signature": base64.b64encode(sig).decode("ascii"),
        },
    )
    # The turn after every decision record on the call so far (the gate counts the same records).
    turn = sum(1 for r in journal.records() if r.key.startswith(decision_prefix(call_id))) + 1
    marker = GateRecord(key=turn_key(call_id, turn), data=turn_data(call_id, turn, dkey))
    return dkey, [(dkey, encode_record(record)), (marker.key, encode_record(marker))]


def pending_in(journal: Journal, *, call_id: str | None = None) -> list[PendingApproval]:
    """The calls of one loaded run waiting for approvers (what `pending_approvals` lists for each run), or
    only call `call_id`. Raises `bide.RecordDamaged` for a call whose request record was edited."""
    out = []
    for call, waiting in _open_requests(journal).items():
        if call_id is not None and call != call_id:
            continue
        if isinstance(waiting, RecordDamaged):
            raise waiting
        _, data, policy = waiting
        out.append(_state(journal, data, policy))
    return out


def pending_approvals(store: Store, *, prefix: str = "") -> list[PendingApproval]:
    """Every call, in every run of `store` (whose id starts with `prefix`) that has not ended, waiting for
    approvers (a run that ended takes no more decisions)."""
    out: list[PendingApproval] = []
    after = ""
    while True:
        runs = store.runs(prefix=prefix, after=after, limit=500, open_only=True)
        if not runs:
            return out
        for run_id in runs:
            out.extend(pending_in(Journal(store, run_id).load()))
        after = runs[-1]
