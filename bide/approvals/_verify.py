"""`verify_approvals`: recount every approval gate of an evidence package offline."""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError
from ..audit._errors import NotVerified
from ..audit._formats import MAX_SKEW_NS, EvidencePackage, decode_record_bytes, journal_leaf
from ..audit._keys import PublicKey
from ..audit._merkle import leaf_hash, verify_inclusion
from ..audit._verify import Verified, verify_evidence
from ._policy import ApprovalPolicy
from ._tally import arguments_match, count, decision_prefix, tally_key

__all__ = ["verify_approvals"]

_TALLY_FIELDS = {
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


def _records(
    pkg: EvidencePackage, key: PublicKey | None, max_skew_ns: int
) -> tuple[list[dict[str, Any]], str]:
    if key is not None:
        return verify_evidence(pkg, key, max_skew_ns=max_skew_ns).records, f"signed by {key.key_id}"
    out = []
    last = -1
    for item in pkg.records:
        if item.index <= last or item.index >= pkg.sth.size:
            raise NotVerified("record positions must strictly increase and lie inside the signed tree")
        last = item.index
        if not verify_inclusion(
            item.index, pkg.sth.size, leaf_hash(journal_leaf(item.record)), item.path, pkg.sth.root
        ):
            raise NotVerified(f"record at position {item.index} is not in the package's tree")
        out.append({"index": item.index, **decode_record_bytes(item.record)})
    return out, "whose signature was NOT checked (pass --pubkey)"


def _check_gate(
    run_id: str,
    tally: dict[str, Any],
    by_key: dict[str, dict[str, Any]],
    records: list[dict[str, Any]],
    complete: bool,
) -> tuple[str, list[str]]:
    td = tally.get("data")
    ti = tally["index"]
    if not isinstance(td, dict) or set(td) != _TALLY_FIELDS or td.get("type") != "tally":
        raise NotVerified(f"record {tally['key']!r} is not a well-formed tally")
    call = td["call_id"]
    if not isinstance(call, str) or tally["key"] != tally_key(call):
        raise NotVerified(f"tally {tally['key']!r} is stored under the wrong key")
    rkey = f"approval:request:{call}:{td['policy_digest']}"
    req = by_key.get(rkey)
    if req is None:
        raise NotVerified(
            f"the request record {rkey!r} holding the tally's policy is not in the package "
            "(omitted, or the tally names a policy that was never requested)"
        )
    if req["index"] >= ti:
        raise NotVerified(f"the request of call {call!r} is recorded after its tally")
    rd = req.get("data")
    if not isinstance(rd, dict):
        raise NotVerified(f"record {rkey!r} is not a well-formed request")
    try:
        policy = ApprovalPolicy.from_json(rd.get("policy"))
    except ConfigError as exc:
        raise NotVerified(f"the policy of call {call!r} is invalid: {exc}") from exc
    if policy.digest.hex() != rd.get("policy_digest") or policy.digest.hex() != td["policy_digest"]:
        raise NotVerified(
            f"the policy of call {call!r} was changed: its digest does not match the request and the tally"
        )
    if td["need"] != policy.need or td["approvers"] != policy.names:
        raise NotVerified(f"the tally of call {call!r} states another policy than the one requested")
    if (rd.get("call_id"), rd.get("tool"), rd.get("arguments_digest")) != (
        call,
        td["tool"],
        td["arguments_digest"],
    ):
        raise NotVerified(
            f"the tally of call {call!r} is for another call or other arguments than its request"
        )
    if not arguments_match(rd):
        raise NotVerified(
            f"the request of call {call!r} shows arguments that do not hash to its arguments digest"
        )
    named = td["records"]
    if (
        not isinstance(named, list)
        or not all(isinstance(k, str) for k in named)
        or len(set(named)) != len(named)
    ):
        raise NotVerified(f"the tally of call {call!r} has a malformed record list")
    decisions: list[tuple[str, Any]] = []
    last = -1
    for k in named:
        rec = by_key.get(k)
        if rec is None:
            raise NotVerified(
                f"decision {k!r} counted by the tally of call {call!r} is not in the package "
                "(an omitted decision)"
            )
        if not k.startswith(decision_prefix(call)) or rec["index"] >= ti or rec["index"] <= last:
            raise NotVerified(
                f"decision {k!r} named by the tally of call {call!r} is not a decision on this call "
                "recorded before the tally, in order"
            )
        last = rec["index"]
        decisions.append((k, rec.get("data")))
    c = count(run_id, call, td["tool"], td["arguments_digest"], policy, decisions)
    recorded = (td["outcome"], td["approved_by"], td["denied_by"], td["excluded"], td["superseded"])
    if (c.outcome, c.approved_by, c.denied_by, c.excluded, c.superseded) != recorded:
        raise NotVerified(
            f"the recount of call {call!r} differs from its recorded tally: recount {c.outcome} "
            f"(approved by {c.approved_by}, denied by {c.denied_by}), tally {td['outcome']} "
            f"(approved by {td['approved_by']}, denied by {td['denied_by']})"
        )
    if c.outcome == "pending":
        raise NotVerified(f"the tally of call {call!r} records an undecided gate")
    notes: list[str] = []
    before = [r for r in records if r["key"].startswith(decision_prefix(call)) and r["index"] < ti]
    unnamed = [r for r in before if r["key"] not in set(named)]
    if unnamed:
        raise NotVerified(
            f"decision(s) {[r['key'] for r in unnamed]} recorded before the tally of call {call!r} "
            "are not named by it (an omitted decision)"
        )
    after = [r for r in records if r["key"].startswith(decision_prefix(call)) and r["index"] > ti]
    if after:
        notes.append(f"{len(after)} decision(s) on call {call!r} came after its gate closed and do not count")
    for r in records:
        if r.get("call_id") == call and r.get("kind") in ("attempt", "tool_result") and r["index"] < ti:
            raise NotVerified(
                f"call {call!r} has a {r['kind']} record before its approval tally: the tool ran "
                "(or was recorded) before the gate decided"
            )
        if c.outcome == "denied" and r.get("call_id") == call:
            if r.get("kind") == "attempt":
                raise NotVerified(f"call {call!r} was denied but an attempt to run it is recorded")
            if r.get("kind") == "tool_result" and r.get("is_error") is not True:
                raise NotVerified(f"call {call!r} was denied but its result is not an error")
    if not complete:
        notes.append("the package is partial: decisions it does not disclose could not be checked")
    who = c.approved_by if c.outcome == "approved" else c.denied_by
    verb = "approved" if c.outcome == "approved" else "denied"
    text = (
        f"call {call!r} ({td['tool']}) was {verb} by {', '.join(who) or 'nobody'} under a {policy.need}-of-"
        f"{len(policy.approvers)} policy; the recount of {len(named)} decision record(s) matches the tally "
        f"journaled at position {ti}, before the tool ran"
    )
    return text, notes


def verify_approvals(
    pkg: EvidencePackage,
    key: PublicKey | None = None,
    *,
    call_id: str | None = None,
    max_skew_ns: int = MAX_SKEW_NS,
) -> Verified:
    """Recount every decided approval gate (or only `call_id`'s) in an evidence package.

    Detected: a decision the tally names but the package omits; a decision recorded before the tally but
    left out of it; a recount that differs from the recorded tally; a policy changed between the
    request, the decisions and the tally; a tool attempt or result recorded before the tally; a denied call
    that ran. With `key` the package's signed head is checked too (`verify_evidence`).
    """
    records, signed = _records(pkg, key, max_skew_ns)
    by_key = {r["key"]: r for r in records}
    run_id = pkg.sth.log_id
    tallies = [r for r in records if r.get("kind") == "gate" and r["key"].startswith("approval:tally:")]
    if call_id is not None:
        tallies = [r for r in tallies if r["key"] == tally_key(call_id)]
    if not tallies:
        what = f"call {call_id!r}" if call_id is not None else "any call"
        raise NotVerified(f"the package holds no decided approval gate for {what}")
    complete = len(records) == pkg.sth.size
    texts: list[str] = []
    notes: list[str] = []
    for t in tallies:
        text, more = _check_gate(run_id, t, by_key, records, complete)
        texts.append(text)
        notes.extend(more)
    proven = f"In run {run_id!r} (journal of {pkg.sth.size} records {signed}): " + "; ".join(texts) + "."
    not_proven = (
        "Not proven: who holds the approvers' keys (the policy names them), that the tool's effect "
        "happened as recorded"
        + ("" if key is not None else ", or who signed the journal head")
        + (". Notes: " + "; ".join(notes) if notes else "")
        + "."
    )
    return Verified(proven=proven, not_proven=not_proven, records=records)
