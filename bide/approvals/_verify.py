"""`verify_approvals`: recount every approval gate of an evidence package offline, and check that the call
which ran is the call the approvers signed.

For each decided gate (a tally record): the request, the policy, the decisions and the recount (see
docs/audit.md), with every decision bound to this journal (the digest of the header at position 0, which the
package must hold), then the executed call. Every record of the call (its model tool call, attempt markers,
result, pause) must name the approved tool, and every attempt marker (what the tool was called with) must
carry arguments whose canonical JSON hashes to the approved arguments digest; none may come before the
tally. A package that leaves records out cannot show that no other attempt exists: it proves less, and says
so (`executed_call_proven` is false in the facts); so does one whose approved call had not run as of its
signed head (it may run after it).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from .._canonical import canonical_json
from .._errors import ConfigError
from .._records import RESERVED_GATE_PREFIX, attempt_key, not_started_key, pause_key, result_key
from ..audit._errors import NotVerified, UnreadableInput
from ..audit._formats import MAX_SKEW_NS, EvidencePackage, decode_record_bytes
from ..audit._keys import PublicKey
from ..audit._verify import Verified, check_evidence_proofs, verify_evidence
from ._policy import MAX_SEATS, ApprovalPolicy, journal_digest_of
from ._tally import (
    OLD_FORMAT,
    OTHER_JOURNAL,
    TALLY_FIELDS,
    Count,
    arguments_match,
    count,
    decision_prefix,
    tally_key,
)
from ._trust import ApprovalTrust, UntrustedPolicy

__all__ = ["verify_approvals"]

# A request written before requests named their journal lacks journal_digest; it is still read (what binds
# a decision to the journal is its signature, checked against the header the package holds).
_OLD_REQUEST_FIELDS = {"type", "call_id", "tool", "arguments", "arguments_digest", "policy", "policy_digest"}
_REQUEST_FIELDS = _OLD_REQUEST_FIELDS | {"journal_digest"}

# The most distinct approver keys the policies of one package may name between them. Each is checked to be
# strong once (milliseconds of arithmetic; `is_strong_public_key` caches 4096 by their bytes), so this
# bounds what a package made up by anyone costs before it is refused (a few seconds). A run's gates share a
# policy or a few rotated ones: no real package names more than a few dozen keys.
MAX_PACKAGE_KEYS = 1024
# The most characters the approver names of a package's distinct policies hold between them. Reading a
# policy normalizes each name (NFKC, case folded, several times), far slower than reading the bytes: a
# package of made-up names megabytes long took minutes. A policy recorded by an older bide may hold names
# past today's 128 characters, but a run's few policies of short names come nowhere near 262,144.
MAX_PACKAGE_NAME_CHARS = 1 << 18


def _records(
    pkg: EvidencePackage, key: PublicKey | None, max_skew_ns: int
) -> tuple[list[dict[str, Any]], str]:
    if key is not None:
        return verify_evidence(pkg, key, max_skew_ns=max_skew_ns).records, f"signed by {key.key_id}"
    # Every check of the package's own structure holds without the key too (a header past position 0, a
    # key written twice): only the head's signature is left unchecked.
    return check_evidence_proofs(pkg).records, "whose signature was NOT checked (pass --pubkey)"


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


@dataclass
class _Index:
    """The package's records indexed once, so that checking a gate reads only the records of its call
    (checking every gate against every record took time quadratic in the package)."""

    by_key: dict[str, dict[str, Any]]
    decisions: list[tuple[str, int, dict[str, Any]]]  # (key, position, record), sorted: see decisions_on
    by_call_id: dict[str, list[dict[str, Any]]]  # records whose call_id field names the call
    by_key_call: dict[str, list[dict[str, Any]]]  # attempt/not-started/result/pause records, by their key
    model_calls: dict[str, list[tuple[dict[str, Any], Any]]]  # (model turn, its tool call), by call id
    malformed_turns: list[dict[str, Any]]

    @classmethod
    def of(cls, records: list[dict[str, Any]]) -> _Index:
        index = cls({}, [], {}, {}, {}, [])
        for r in records:
            key = r["key"]
            misfiled = _misfiled(r)
            if misfiled is not None:
                raise NotVerified(
                    f"record {key!r} at position {r['index']} {misfiled}: bide never writes such a record, "
                    "so the journal was edited (the checks below find a call's records by their keys)"
                )
            index.by_key[key] = r
            if key.startswith("approval:decision:"):
                index.decisions.append((key, r["index"], r))
            call_id = r.get("call_id")
            if isinstance(call_id, str):
                index.by_call_id.setdefault(call_id, []).append(r)
            named = _call_of_key(key)
            if named is not None:
                index.by_key_call.setdefault(named, []).append(r)
            if r.get("kind") == "model_turn":
                message = r.get("message")
                calls = message.get("tool_calls") if isinstance(message, dict) else None
                if not isinstance(calls, list):
                    index.malformed_turns.append(r)
                    continue
                for c in calls:
                    if isinstance(c, dict) and isinstance(c.get("call_id"), str):
                        index.model_calls.setdefault(c["call_id"], []).append((r, c))
        index.decisions.sort(key=lambda d: (d[0], d[1]))
        return index

    def decisions_on(self, call: str) -> list[dict[str, Any]]:
        """The decision records on `call` (keys starting with its decision prefix), in journal order."""
        # The keys with a given prefix are one run of the sorted list, found by bisection.
        prefix = decision_prefix(call)
        decisions = self.decisions
        out = []
        for i in range(bisect.bisect_left(decisions, (prefix,)), len(decisions)):
            key, _, record = decisions[i]
            if not key.startswith(prefix):
                break
            out.append(record)
        return sorted(out, key=lambda r: r["index"])

    def of_call(self, call: str) -> list[tuple[dict[str, Any], list[Any]]]:
        """What `_check_executed` must look at for `call`, in journal order: each record with, for a model
        turn, its tool calls with this call id (a malformed model turn comes with none, and fails)."""
        found: dict[int, tuple[dict[str, Any], list[Any]]] = {}
        for r in (*self.by_call_id.get(call, ()), *self.by_key_call.get(call, ()), *self.malformed_turns):
            found[r["index"]] = (r, [])
        for r, c in self.model_calls.get(call, ()):
            found.setdefault(r["index"], (r, []))[1].append(c)
        return [found[i] for i in sorted(found)]


def _journal_digest(pkg: EvidencePackage) -> str:
    """The hex digest of the journal's header record (position 0), which every decision signs."""
    first = pkg.records[0] if pkg.records else None
    if first is None or first.index != 0:
        raise NotVerified(
            "the package does not hold the journal's header (position 0), to which every approval decision "
            "is bound, so no decision can be checked; export the whole run (`bide-audit export --run RUN`)"
        )
    header = decode_record_bytes(first.record)
    if header.get("key") != "@journal" or header.get("kind") != "header":
        raise NotVerified(f"the record at position 0 is {header.get('key')!r}, not the journal's header")
    return journal_digest_of(first.record).hex()


def _check_policy_bounds(index: _Index) -> None:
    """Refuse (UnreadableInput) a package whose requests list a policy of more than `MAX_SEATS` seats, more
    than `MAX_PACKAGE_KEYS` distinct keys between them, or distinct policies whose approver names hold more
    than `MAX_PACKAGE_NAME_CHARS` characters between them: counted before any policy is read."""
    keys: set[str] = set()
    policies: set[str] = set()
    name_chars = 0
    for key, record in index.by_key.items():
        data = record.get("data") if key.startswith(_REQUEST_PREFIX) else None
        policy = data.get("policy") if isinstance(data, dict) else None
        seats = policy.get("approvers") if isinstance(policy, dict) else None
        if not isinstance(seats, list):
            continue  # not a policy at all: its gate's checks say so
        text = json.dumps(policy, sort_keys=True)
        if text not in policies:
            policies.add(text)
            names = [s.get("name") for s in seats if isinstance(s, dict)]
            name_chars += sum(len(name) for name in names if isinstance(name, str))
            if name_chars > MAX_PACKAGE_NAME_CHARS:
                raise UnreadableInput(
                    f"the approval policies of this package hold more than {MAX_PACKAGE_NAME_CHARS:,} "
                    "characters of approver names between them, far more than any run's gates use; refused "
                    "before reading them (each name is normalized, which takes far longer than reading it)"
                )
        if len(seats) > MAX_SEATS:
            raise UnreadableInput(
                f"the request {key!r} lists a policy of {len(seats)} approvers; a policy has at most "
                f"{MAX_SEATS} (far more than a call is put to), refused before checking their keys (each "
                "takes milliseconds to check)"
            )
        for seat in seats:
            if isinstance(seat, dict) and isinstance(seat.get("public_key"), str):
                keys.add(seat["public_key"])
        if len(keys) > MAX_PACKAGE_KEYS:
            raise UnreadableInput(
                f"the approval requests of this package name more than {MAX_PACKAGE_KEYS} distinct approver "
                "keys, far more than any run's gates use; refused before checking them (each key takes "
                "milliseconds to check)"
            )


class _PolicyReader:
    """Reads each distinct policy of a package once: a run's gates share one policy, or a few rotated ones,
    and reading one (its names normalized, its keys checked) costs far more than comparing its text."""

    def __init__(self) -> None:
        self._read: dict[tuple[str, bool], ApprovalPolicy] = {}

    def read(self, call: str, value: Any, *, check_keys: bool) -> ApprovalPolicy:
        text = json.dumps(value, sort_keys=True)
        policy = self._read.get((text, check_keys))
        if policy is None:
            try:
                policy = ApprovalPolicy.from_json(value, recorded=True, check_keys=check_keys)
            except ConfigError as exc:
                raise NotVerified(f"the policy of call {call!r} is invalid: {exc}") from exc
            self._read[text, check_keys] = policy
        return policy


def _check_gate(
    run_id: str,
    journal: str,
    tally: dict[str, Any],
    index: _Index,
    complete: bool,
    trust: ApprovalTrust,
    head_size: int,
    policies: _PolicyReader,
) -> _Gate:
    td = tally.get("data")
    ti = tally["index"]
    if not isinstance(td, dict) or set(td) != TALLY_FIELDS or td.get("type") != "tally":
        raise NotVerified(f"record {tally['key']!r} is not a well-formed tally")
    call = td["call_id"]
    if not isinstance(call, str) or tally["key"] != tally_key(call):
        raise NotVerified(f"tally {tally['key']!r} is stored under the wrong key")
    if not (isinstance(td["tool"], str) and _hex64(td["arguments_digest"]) and _hex64(td["policy_digest"])):
        raise NotVerified(f"the tally of call {call!r} has a malformed tool or digest")
    by_key = index.by_key
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
    if (
        req.get("kind") != "gate"
        or not isinstance(rd, dict)
        or set(rd) not in (_REQUEST_FIELDS, _OLD_REQUEST_FIELDS)
        or rd.get("type") != "request"
    ):
        raise NotVerified(f"record {rkey!r} is not a well-formed request")
    if rd.get("journal_digest", journal) != journal:
        raise NotVerified(
            f"the request of call {call!r} names journal digest {rd.get('journal_digest')!r}, but this "
            f"journal's header hashes to {journal}: it was made in another journal (copied from another "
            "store's run of this id)"
        )
    # Its keys are checked to be strong (milliseconds each) only once the cheap checks pass, and only when
    # the pins hold for it: a policy they do not match is refused whatever its keys (`UntrustedPolicy`,
    # once every gate is checked), so a package cannot make the verifier check many keys nobody trusts.
    policy = policies.read(call, rd.get("policy"), check_keys=False)
    if policy.digest.hex() != rd.get("policy_digest") or policy.digest.hex() != td["policy_digest"]:
        raise NotVerified(
            f"the policy of call {call!r} was changed: its digest does not match the request and the tally"
        )
    if trust.problem(policy) is None:
        policy = policies.read(call, rd.get("policy"), check_keys=True)
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
        if rec.get("kind") != "gate":
            raise NotVerified(f"decision {k!r} named by the tally of call {call!r} is not a gate record")
        if not k.startswith(decision_prefix(call)) or rec["index"] >= ti or rec["index"] <= last:
            raise NotVerified(
                f"decision {k!r} named by the tally of call {call!r} is not a decision on this call "
                "recorded before the tally, in order"
            )
        last = rec["index"]
        decisions.append((k, rec.get("data")))
    c = count(run_id, call, td["tool"], td["arguments_digest"], policy, decisions, journal_digest=journal)
    recorded = (td["outcome"], td["approved_by"], td["denied_by"], td["excluded"], td["superseded"])
    if (c.outcome, c.approved_by, c.denied_by, c.excluded, c.superseded) != recorded:
        why = sorted({e["reason"] for e in c.excluded} & {OLD_FORMAT, OTHER_JOURNAL})
        raise NotVerified(
            f"the recount of call {call!r} differs from its recorded tally: recount {c.outcome} "
            f"(approved by {c.approved_by}, denied by {c.denied_by}), tally {td['outcome']} "
            f"(approved by {td['approved_by']}, denied by {td['denied_by']})"
            + "".join(f"; {w}" for w in why)
            + (
                " (approvals given with a bide that did not yet bind decisions to their journal cannot "
                "be verified by this one)"
                if OLD_FORMAT in why
                else ""
            )
        )
    if c.outcome == "pending":
        raise NotVerified(f"the tally of call {call!r} records an undecided gate")
    on_call = index.decisions_on(call)
    counted = set(named)
    unnamed = [r for r in on_call if r["index"] < ti and r["key"] not in counted]
    if unnamed:
        raise NotVerified(
            f"decision(s) {[r['key'] for r in unnamed]} recorded before the tally of call {call!r} "
            "are not named by it (an omitted decision)"
        )
    gate = _Gate(call, td["tool"], td["arguments_digest"], policy, c, ti, len(named), head_size)
    after = [r for r in on_call if r["index"] > ti]
    if after:
        gate.notes.append(
            f"{len(after)} decision(s) on call {call!r} came after its gate closed and do not count"
        )
    _check_executed(gate, req["index"], tally["key"], index.of_call(call), complete)
    return gate


@dataclass
class _Gate:
    """One verified gate: the call, the policy it counted under, the recount, and what the package shows
    of the call that ran."""

    call: str
    tool: str
    digest: str
    policy: ApprovalPolicy
    count: Count
    tally_index: int
    decisions: int
    head_size: int  # the records the signed head commits to: what the package shows is as of it
    attempts: list[int] = field(default_factory=list)
    results: list[int] = field(default_factory=list)
    model_calls: list[int] = field(default_factory=list)
    model_arguments_match: bool = True
    executed_proven: bool = False
    complete: bool = False  # the package holds every record the signed head commits to
    notes: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)

    def key_of(self, name: str) -> str:
        seat = self.policy.seat(name)
        return seat.key.key_id if seat is not None else "?"

    def counted(self) -> list[str]:
        return self.count.approved_by if self.count.outcome == "approved" else self.count.denied_by

    def text(self) -> str:
        verb = "approved" if self.count.outcome == "approved" else "denied"
        who = ", ".join(f"{n} ({self.key_of(n)})" for n in self.counted()) or "nobody"
        p = self.policy
        out = (
            f"call {self.call!r} ({self.tool}) was {verb} by {who} under the {p.need}-of-"
            f"{len(p.approvers)} policy {p.digest.hex()}; the recount of {self.decisions} decision "
            f"record(s) matches the tally journaled at position {self.tally_index}"
        )
        ran = len(self.attempts) + len(self.results)
        if self.count.outcome == "denied":
            if not self.executed_proven:
                return out + ", and no attempt of it is in the package"
            result = "its result is the denial" if self.results else "no result is journaled yet"
            return out + (
                f", and the call had not run as of the signed head of size {self.head_size} (no attempt; "
                f"{result})"
            )
        if self.attempts and not self.executed_proven:
            return out + (
                f"; the {len(self.attempts)} attempt(s) and {len(self.results)} result(s) of the call it "
                f"holds carry the approved tool and arguments (digest {self.digest}), but the package is "
                "partial, so what ran is not proven"
            )
        if self.attempts:
            first = min(self.attempts + self.results)
            return out + (
                f", before the tool ran: its {len(self.attempts)} attempt(s) (from position {first}) "
                f"and {len(self.results)} result(s) carry exactly the approved tool and arguments "
                f"(digest {self.digest})"
            )
        if self.results and self.executed_proven:
            return out + (
                f", before the tool ran (at position {min(self.results)}, without an attempt marker, as "
                "tools safe to retry do) on the model's call, whose arguments hash to the approved digest"
            )
        if not ran and self.complete:
            return out + (
                f"; the tool had not run as of the signed head of size {self.head_size} (the journal it "
                "commits to holds no attempt or result of the call)"
            )
        return out + "; the package shows no attempt of the call, so what ran is not proven"

    def facts(self) -> dict[str, Any]:
        p = self.policy
        return {
            "call_id": self.call,
            "tool": self.tool,
            "arguments_digest": self.digest,
            "outcome": self.count.outcome,
            "policy_digest": p.digest.hex(),
            "need": p.need,
            "approvers": [{"name": a.name, "key_id": a.key.key_id} for a in p.approvers],
            "counted": [{"name": n, "key_id": self.key_of(n)} for n in self.counted()],
            "approved_by": self.count.approved_by,
            "denied_by": self.count.denied_by,
            "tally_index": self.tally_index,
            "attempts": self.attempts,
            "results": self.results,
            "model_calls": self.model_calls,
            "model_arguments_match": self.model_arguments_match,
            "executed_call_proven": self.executed_proven,
            "not_proven": self.gaps,
        }


def _digest_of(arguments: Any) -> str | None:
    try:
        return hashlib.sha256(canonical_json(arguments)).hexdigest()
    except ConfigError:
        return None


def _model_calls(record: dict[str, Any]) -> list[Any]:
    message = record.get("message")
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        raise NotVerified(f"model turn {record['key']!r} is not a well-formed model turn")
    return calls


_REQUEST_PREFIX = "approval:request:"


def _requests(index: _Index) -> tuple[set[str], set[str]]:
    """The calls the package shows were put to approvers (they have a request record), and their tools."""
    prefix = _REQUEST_PREFIX
    calls: set[str] = set()
    tools: set[str] = set()
    for key, record in index.by_key.items():
        if key.startswith(prefix):
            calls.add(key[len(prefix) :].rpartition(":")[0])
            data = record.get("data")
            if isinstance(data, dict) and isinstance(data.get("tool"), str):
                tools.add(data["tool"])
    return calls, tools


def _ran(record: dict[str, Any], call: str) -> str | None:
    """"attempt" or "result" when `record` shows that `call` ran (an attempt marker, or a result that is
    not an error), else None."""
    kind = _kind_of_key(record["key"], call)
    if kind == "attempt":
        return "attempt"
    if kind == "tool_result" and record.get("is_error") is not True:
        return "result"
    return None


def _undecided_calls(index: _Index, requested: set[str], only: str | None, complete: bool) -> list[str]:
    """Check the calls put to approvers (`requested`) that have no tally (all of them, or the call `only`):
    raise NotVerified for one with an attempt or a successful result, since it ran while its gate was
    undecided (a deploy that removed the gate, say); return a gap for one with only an error result, which
    may or may not have run. A call still waiting for its approvers has neither, and passes. In a partial
    package the tally may be one of the records left out: such a call is a gap, not a forgery."""
    gaps: list[str] = []
    for call in sorted(requested):
        if (only is not None and call != only) or tally_key(call) in index.by_key:
            continue
        for r in index.by_key_call.get(call, []):
            ran = _ran(r, call)
            if ran and not complete:
                gaps.append(
                    f"that call {call!r}, put to its approvers, ran only once approved: the package is "
                    "partial and holds no tally for it"
                )
                break
            if ran:
                raise NotVerified(
                    f"call {call!r} was put to its approvers but never decided (no tally), yet its {ran} "
                    f"at position {r['index']} shows it ran: it ran without an approval"
                )
            if _kind_of_key(r["key"], call) == "tool_result":
                gaps.append(
                    f"that call {call!r}, put to its approvers but never decided, did not run: its result "
                    f"at position {r['index']} is an error, which does not tell"
                )
    return gaps


def _unrequested_calls(index: _Index, requested: set[str], gated: set[str], only: str | None) -> list[str]:
    """Gaps for the calls that ran with no request to approvers of their own, of a tool whose other calls
    were put to approvers (`gated`), or after a gate paused them (a pause record): nothing in the package
    shows they were approved. (A gate may decide some calls without approvers, say small amounts, and a
    gate of another kind pauses calls too, so this is a gap, not a forgery; a deploy that took the gate off
    leaves the same records, and so does a request removed from the journal.)"""
    gaps: list[str] = []
    for call in sorted(index.by_key_call):
        if (only is not None and call != only) or call in requested:
            continue
        paused = pause_key(call) in index.by_key
        for r in index.by_key_call[call]:
            ran = _ran(r, call)
            if ran and r.get("tool") in gated:
                gaps.append(
                    f"that call {call!r} of tool {r.get('tool')!r}, whose calls are put to approvers, was "
                    f"approved: it ran with no request to approvers ({ran} at position {r['index']}; its "
                    "gate decided alone, or was taken off)"
                )
                break
            if ran and paused:
                gaps.append(
                    f"that call {call!r} of tool {r.get('tool')!r}, which a gate paused, was approved: it "
                    f"ran with no request to approvers ({ran} at position {r['index']}; a gate of another "
                    "kind decided it, or its request is not in the journal)"
                )
                break
    return gaps


# The record kinds bide files under a key made from the call's id (see `_call_of_key`).
_CALL_KEYED_KINDS = frozenset({"attempt", "not_started", "tool_result", "pause"})


def _misfiled(record: dict[str, Any]) -> str | None:
    """Why `record` is not filed under the key bide gives a record of its kind, or None when it is. Only the
    kinds the approval checks look up matter: a gate record is filed under the reserved ``approval:``
    prefix and nothing else is; an attempt, not-started, result or pause record of call C is filed under
    exactly its key for C (and its generation), with its tool's name a string, and no other kind under such
    a key. A record filed otherwise would be skipped by one check and counted by another (a decoy under a
    tally's key, an attempt under a key no lookup finds)."""
    key, kind = record["key"], record.get("kind")
    if key.startswith(RESERVED_GATE_PREFIX) != (kind == "gate"):
        return (
            f"is a record of kind {kind!r} under an approval key"
            if kind != "gate"
            else f"is a gate record outside the reserved {RESERVED_GATE_PREFIX!r} keys"
        )
    if key.startswith(_REQUEST_PREFIX):
        # Which calls were put to approvers, and which tools are gated, is read off these keys and records.
        call, _, digest = key[len(_REQUEST_PREFIX) :].rpartition(":")
        data = record.get("data")
        if not (call and _hex64(digest) and isinstance(data, dict) and data.get("call_id") == call):
            return "is not a request filed under approval:request:<its call id>:<its policy digest>"
        if not isinstance(data.get("tool"), str):
            return "is a request whose tool is not a name"
    named = _call_of_key(key)
    if named is None and kind not in _CALL_KEYED_KINDS:
        return None
    call, gen = record.get("call_id"), record.get("gen")
    if not isinstance(call, str):
        return f"is a record of kind {kind!r} under a call's key, without a call id"
    if kind == "attempt" or kind == "not_started":
        if type(gen) is not int or gen < 0:
            return f"is a record of kind {kind!r} without a generation"
        expected = attempt_key(call, gen) if kind == "attempt" else not_started_key(call, gen)
    elif kind == "tool_result" or kind == "pause":
        expected = result_key(call) if kind == "tool_result" else pause_key(call)
    else:
        return (
            f"is a record of kind {kind!r} under the key of an attempt, not-started, result or pause of "
            f"{named!r}"
        )
    if key != expected:
        return f"is the {kind!r} record of call {call!r} under another key than its own ({expected!r})"
    if kind != "not_started" and not isinstance(record.get("tool"), str):
        return f"is a record of kind {kind!r} whose tool is not a name"
    return None


def _call_of_key(key: str) -> str | None:
    """The call whose attempt, not-started, result or pause record `key` is the key of (the call for which
    `_kind_of_key` is not None), or None."""
    for kind in ("result:", "pause:"):
        if key.startswith(kind):
            return key[len(kind):]
    head, _, gen = key.rpartition(":")
    if gen.isascii() and gen.isdigit():
        for kind in ("attempt:", "not-started:"):
            if head.startswith(kind):
                return head[len(kind):]
    return None


def _kind_of_key(key: str, call: str) -> str | None:
    """The record kind `key` is the key of for exactly call `call` (``attempt:<call>:<gen>``,
    ``not-started:<call>:<gen>``, ``result:<call>``, ``pause:<call>``), or None. Matched exactly, never by
    prefix: call ``c0.1`` owns ``pause:c0.1``, not ``pause:c0.10``."""
    if key == f"result:{call}":
        return "tool_result"
    if key == f"pause:{call}":
        return "pause"
    head, _, gen = key.rpartition(":")
    if gen.isascii() and gen.isdigit():
        if head == f"attempt:{call}":
            return "attempt"
        if head == f"not-started:{call}":
            return "not_started"
    return None


def _check_executed(
    gate: _Gate,
    request_index: int,
    tally_key_: str,
    records: list[tuple[dict[str, Any], list[Any]]],
    complete: bool,
) -> None:
    """Bind every record of the call that the package holds (`records`: those `_Index.of_call` gives, in
    journal order) to the approved tool and arguments; raise
    NotVerified on any that differs, and decide whether the package proves what ran (`executed_proven`)."""
    call, tool, digest, ti = gate.call, gate.tool, gate.digest, gate.tally_index
    approved = gate.count.outcome == "approved"
    gate.complete = complete
    side_effect_result = False
    for r, calls in records:
        key, kind, idx = r["key"], r.get("kind"), r["index"]
        if kind == "model_turn":
            _model_calls(r)  # a malformed model turn fails
            for c in calls:
                if c.get("name") != tool:
                    raise NotVerified(
                        f"the model's call {call!r} at position {idx} names tool {c.get('name')!r}, but "
                        f"the approvers signed a call of {tool!r}"
                    )
                if idx > request_index:
                    raise NotVerified(f"the model's call {call!r} is recorded after its approval request")
                gate.model_calls.append(idx)
                if _digest_of(c.get("arguments")) != digest:
                    gate.model_arguments_match = False
            continue
        key_kind = _kind_of_key(key, call)
        if key_kind is None and r.get("call_id") != call:
            continue
        expected = key_kind or kind
        if kind != expected or r.get("call_id") != call:
            raise NotVerified(
                f"record {key!r} at position {idx} is not a well-formed {expected} record of call {call!r}"
            )
        if kind == "gate":
            continue
        if kind in ("attempt", "tool_result", "pause") and r.get("tool") != tool:
            raise NotVerified(
                f"the {kind} record of call {call!r} at position {idx} names tool {r.get('tool')!r}, but "
                f"the approvers signed a call of {tool!r}"
            )
        if kind in ("attempt", "tool_result") and idx < ti:
            raise NotVerified(
                f"call {call!r} has {'an attempt' if kind == 'attempt' else 'a result'} record before its "
                "approval tally: the tool ran (or was recorded) before the gate decided"
            )
        if kind == "attempt":
            if not approved:
                raise NotVerified(f"call {call!r} was denied but an attempt to run it is recorded")
            if _digest_of(r.get("arguments")) != digest:
                raise NotVerified(
                    f"the attempt of call {call!r} at position {idx} ran the tool with arguments that do "
                    f"not hash to the approved digest {digest}: the approvers did not sign this call"
                )
            gate.attempts.append(idx)
        elif kind == "tool_result":
            if not approved and r.get("is_error") is not True:
                raise NotVerified(f"call {call!r} was denied but its result is not an error")
            evidence = r.get("approval")
            # A result the gate's decision led to carries its evidence; one a resolver recorded may not.
            expected_evidence = {
                "tally": tally_key_,
                "policy_digest": gate.policy.digest.hex(),
                "approved_by": gate.count.approved_by,
                "denied_by": gate.count.denied_by,
            }
            if (evidence is not None or r.get("reconciled") is not True) and evidence != expected_evidence:
                raise NotVerified(
                    f"the result of call {call!r} at position {idx} does not carry its gate's decision "
                    "(tally, policy and approvers)"
                )
            side_effect_result = side_effect_result or r.get("safety") == "side_effect"
            gate.results.append(idx)
    if not complete:
        gate.gaps.append(
            f"what call {call!r} ran with: the package is partial, and records of the call it leaves out "
            "(another attempt, the model's call) could not be checked"
        )
    elif not approved or gate.attempts:
        gate.executed_proven = True
    elif gate.results:
        # Tools safe to retry run without an attempt marker: what they ran with is the model's call.
        if side_effect_result:
            gate.gaps.append(f"what call {call!r} ran with: its result has no attempt marker before it")
        elif not gate.model_calls or not gate.model_arguments_match:
            gate.gaps.append(
                f"what call {call!r} ran with: it has no attempt marker, and the model's call does not "
                "carry the approved arguments verbatim"
            )
        else:
            gate.executed_proven = True
    else:
        # An approved call that had not run as of the signed head may run after it, with records this
        # package does not hold: nothing executed is proven (a later head's package shows what ran).
        gate.gaps.append(
            f"what call {call!r} runs with: it had not run as of the signed head of size {gate.head_size} "
            "(check a package exported at a later head)"
        )
    if gate.model_calls and not gate.model_arguments_match:
        gate.gaps.append(
            f"that the model asked for exactly the approved arguments of call {call!r}: its own arguments "
            "differ (validation converted or completed them; the package does not hold the tool's schema)"
        )
    if complete and not gate.model_calls:
        gate.gaps.append(f"which model turn made call {call!r}: no model turn in the journal holds it")


def verify_approvals(
    pkg: EvidencePackage,
    key: PublicKey | None = None,
    *,
    call_id: str | None = None,
    trust: ApprovalTrust | None = None,
    max_skew_ns: int = MAX_SKEW_NS,
) -> Verified:
    """Recount every decided approval gate (or only `call_id`'s) in an evidence package, and bind the call
    that ran to the approval.

    Detected (`NotVerified`): a package without the journal's header (position 0), to which every decision is
    bound; a decision made for another journal, or in the format before decisions named their journal (neither
    counts, so the recount differs); a decision the tally names but the package omits; a decision recorded
    before the tally but left out of it; a recount that differs from the recorded tally; a policy changed
    between the request, the decisions and the tally; a tool attempt or result recorded before the tally; a
    denied call that ran; an attempt whose arguments do not hash to the approved digest; an attempt, result,
    pause or model call of the call naming another tool; a call put to its approvers that ran (an attempt,
    or a result that is not an error) with no tally in a complete package. A call that ran of a tool whose
    other calls were put to approvers, with no request of its own, is a gap in `not_proven` (its gate may
    have decided it alone) and makes `executed_calls_proven` false. With `key` the package's signed
    head is checked too (`verify_evidence`). With `trust`, a gate under a policy it does not pin raises
    `UntrustedPolicy` (after every gate was checked, so a forgery is reported as such; the pins are compared
    before the policy's keys are checked to be strong, and an untrusted policy's keys are not). A package
    whose requests list a policy of more than `MAX_SEATS` approvers, or more than `MAX_PACKAGE_KEYS`
    distinct keys between them, raises `UnreadableInput` before any key is checked.

    Everything is proven as of the package's signed head, which may not be the latest.

    `facts` holds, for machines: `complete` (the package holds every record), `pinned`,
    `executed_calls_proven` (every checked call's executed call is proven; an approved call that had not run
    as of the signed head is not, since it may run later, with records this package does not hold) and
    `calls` (per gate: outcome, policy digest, approvers and counted approvers with key ids, positions,
    `executed_call_proven`).
    """
    records, signed = _records(pkg, key, max_skew_ns)
    run_id = pkg.sth.log_id
    tallies = [r for r in records if r.get("kind") == "gate" and r["key"].startswith("approval:tally:")]
    if call_id is not None:
        tallies = [r for r in tallies if r["key"] == tally_key(call_id)]
    if not tallies:
        what = f"call {call_id!r}" if call_id is not None else "any call"
        raise NotVerified(f"the package holds no decided approval gate for {what}")
    complete = len(records) == pkg.sth.size
    journal = _journal_digest(pkg)
    index = _Index.of(records)
    _check_policy_bounds(index)
    trust = trust or ApprovalTrust()
    policies = _PolicyReader()
    gates = [_check_gate(run_id, journal, t, index, complete, trust, pkg.sth.size, policies) for t in tallies]
    requested, gated = _requests(index)
    undecided = _undecided_calls(index, requested, call_id, complete)
    undecided += _unrequested_calls(index, requested, gated, call_id)
    untrusted = [(g, why) for g in gates if (why := trust.problem(g.policy)) is not None]
    if untrusted:
        raise UntrustedPolicy(
            "; ".join(
                f"the gate of call {g.call!r} counted under policy {g.policy.digest.hex()}, not one you "
                f"trust: {why}"
                for g, why in untrusted
            )
        )
    gaps = [gap for g in gates for gap in g.gaps] + undecided
    notes = [note for g in gates for note in g.notes]
    if not complete:
        notes.append("the package is partial: decisions it does not disclose could not be checked")
    proven = (
        f"In run {run_id!r} (journal of {pkg.sth.size} records {signed}): "
        + "; ".join(g.text() for g in gates)
        + "."
    )
    if trust.pinned and trust.need_pinned:
        proven += " Every gate counted under a policy you pinned."
    elif trust.pinned:
        proven += " Every gate counted with the approvers you pinned."
        gaps.append(
            "that each gate needed as many approvals as you trust: the number comes from the package (pin "
            "it with --need K)"
        )
    else:
        gaps.append(
            "that these approvers are the ones you trust: the policy comes from the package itself "
            "(pin it with --policy-digest, --approver NAME=KEY or --policy FILE)"
        )
    not_proven = (
        "Not proven: "
        + "; ".join(
            [
                *gaps,
                "who holds the approvers' keys (the policy names them), that this head is the latest or "
                "was anchored (compare it with your anchor), or that the tool's effect happened as recorded"
                + ("" if key is not None else ", or who signed the journal head"),
            ]
        )
        + (". Notes: " + "; ".join(notes) if notes else "")
        + "."
    )
    facts = {
        "complete": complete,
        "pinned": trust.pinned,
        "head_signature_checked": key is not None,
        "executed_calls_proven": all(g.executed_proven for g in gates) and not undecided,
        "calls": [g.facts() for g in gates],
    }
    return Verified(proven=proven, not_proven=not_proven, records=records, facts=facts)
