"""Certificates: a machine, its verdict and its tables as one canonical, digested, optionally signed document.

`certify` turns a built machine into a `Certificate` (and re-checks it before returning it);
`check_certificate` verifies a certificate's bytes offline. Checking never imports or runs anything
but this package: a certificate is data. docs/certificate.md specifies the format.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ._analysis import TableAnalysis, analyse_tables
from ._checked import (
    DIGEST_DOMAIN,
    MAX_CLOCK_SKEW,
    CertificateDocument,
    Signature,
    check_front_matter,
    compute_digest,
)
from ._encoding import DEFAULT_MAX_BYTES, canonical_json, decode_table, encode_table, parse_strict_json
from ._errors import CertificateInvalid, CertificateUnreadable
from ._model import FORMAT, CertificateModel, domain_sizes, initial_state, parse_document
from ._oracle import OracleVerdict, local_oracle_identity, run_rules_oracle, run_tables_oracle
from ._symbolic import (
    SymbolicCertificate,
    SymbolicCertificateModel,
    parse_symbolic,
    redecide,
    render_symbolic_statement,
)

__all__ = [
    "DIGEST_DOMAIN",
    "MAX_CLOCK_SKEW",
    "Certificate",
    "CheckResult",
    "Signature",
    "assemble",
    "check_certificate",
    "compute_digest",
    "read_table_certificate",
    "table_certificate",
]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Certificate(CertificateDocument):
    """A certificate document and its decoded tables. `to_bytes()` is the exact file content."""

    model: CertificateModel
    valid: IntArray = field(repr=False)
    repair: IntArray = field(repr=False)
    apply: IntArray = field(repr=False)

    def document(self) -> dict[str, Any]:
        """The certificate as a JSON value (the signature member only when signed)."""
        return _document_of(self.model)

    def _from_document(self, document: dict[str, Any]) -> Certificate:
        return Certificate(parse_document(document), self.valid, self.repair, self.apply)


def _document_of(model: CertificateModel) -> dict[str, Any]:
    document = model.model_dump(mode="json", exclude={"signature"})
    if model.signature is not None:
        document["signature"] = model.signature.model_dump(mode="json")
    return document


def assemble(
    *,
    machine: dict[str, Any],
    verdict: dict[str, Any],
    valid: npt.ArrayLike,
    repair: npt.ArrayLike,
    apply: npt.ArrayLike,
    oracle: dict[str, str],
    version: str,
) -> Certificate:
    """Build a certificate document from its parts and compute its digest; nothing is checked here
    beyond the format (use `check_certificate` on `to_bytes()` to verify the claims)."""
    # repair and apply are stored as differences from the state id: most entries are 0 (no change) or
    # one stride, so they compress about a hundred times better than the ids themselves.
    valid_flags = np.asarray(valid).astype(np.uint8)
    states = len(valid_flags)
    ids = np.arange(states, dtype=np.int64)
    repair_ids = np.asarray(repair, dtype=np.int64)
    apply_ids = np.asarray(apply, dtype=np.int64)
    document: dict[str, Any] = {
        "format": FORMAT,
        "tool": {"name": "govern", "version": version},
        "machine": machine,
        "verdict": verdict,
        "tables": {
            "valid": encode_table(valid_flags, "u8"),
            "repair": encode_table(repair_ids - ids, "i32le"),
            "apply": encode_table((apply_ids.reshape(-1, states) - ids).reshape(-1), "i32le"),
        },
        "oracle": dict(oracle),
    }
    document["digest"] = compute_digest(document)
    return read_table_certificate(canonical_json(document) + b"\n")


def read_table_certificate(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Certificate:
    """Parse and decode a table certificate (`govern-certificate/1`) strictly, without judging its claims.

    Raises `CertificateUnreadable` for anything that is not a well-formed table certificate.
    """
    return table_certificate(parse_strict_json(data, max_bytes=max_bytes))


def table_certificate(value: Any) -> Certificate:
    """The table certificate whose parsed JSON is `value` (`CertificateUnreadable` when it is none)."""
    model = parse_document(value)
    # The model must say exactly what the bytes say: no value may have been coerced on the way in
    # (1 read as true, say), or the digest of the model would not be the digest of the file.
    if canonical_json(_document_of(model)) != canonical_json(value):
        raise CertificateUnreadable("a field has a value of the wrong JSON type")
    if model.signature is not None:
        # Base64 with non-zero padding bits decodes to the same bytes as the canonical spelling: refused,
        # so no byte of a certificate can change without changing what is checked.
        for name in ("public_key", "value"):
            text = getattr(model.signature, name)
            if base64.b64encode(base64.b64decode(text)).decode("ascii") != text:
                raise CertificateUnreadable(f"signature.{name} is not canonical base64")
    sizes = domain_sizes(model.machine)
    states = 1
    for _, size in sizes:
        states *= size
    events = len(model.machine.events)
    valid = decode_table(model.tables.valid, "u8", states, what="tables.valid")
    ids = np.arange(states, dtype=np.int64)
    repair = decode_table(model.tables.repair, "i32le", states, what="tables.repair") + ids
    apply = decode_table(model.tables.apply, "i32le", states * events, what="tables.apply")
    apply = (apply.reshape(events, states) + ids).reshape(-1)
    return Certificate(model, valid, repair, apply)


@dataclass(frozen=True, eq=False)
class CheckResult:
    """What `check_certificate` verified. It exists only when every check passed."""

    certificate: Certificate | SymbolicCertificate
    signature: Signature | None
    rules_checked: bool
    oracle: dict[str, str]
    tables_verdict: OracleVerdict | None  # None for a symbolic certificate (no tables)
    analysis: TableAnalysis | None
    steps: list[str]
    #: The solver a symbolic certificate's verdict rests on, as installed where it was checked.
    solver: dict[str, str] | None = None

    def statement(self) -> str:
        """One paragraph: what was verified and what it means, and no more."""
        model = self.certificate.model
        if isinstance(model, SymbolicCertificateModel):
            signed = None if self.signature is None else (self.signature.key_id, self.signature.signed_at)
            return render_symbolic_statement(model, signed, (self.solver or {}).get("version", "?"))
        return render_statement(self)


def _verdict_from_analysis(analysis: TableAnalysis, model: CertificateModel) -> dict[str, Any]:
    machine = model.machine
    return {
        "wfc": True,
        "cc1": True,
        "max_repair_depth": analysis.max_repair_depth,
        "states": analysis.states,
        "valid_states": analysis.valid_states,
        "domain": machine.domain,
        "domain_states": analysis.domain_states,
        "pairs": "all" if machine.independent is None else "declared",
        "pairs_checked": analysis.pairs_checked,
        "cc2": analysis.cc2,
        "causal_order_obligations": analysis.causal_order_obligations,
        "not_idempotent": analysis.not_idempotent,
        "guarantee": "interleaved-repair" if analysis.cc2 else "repair-before-apply",
    }


def check_certificate(
    data: bytes,
    *,
    public_key: Ed25519PublicKey | None = None,
    require_signature: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    now: datetime | None = None,
    max_clock_skew: float = MAX_CLOCK_SKEW,
) -> CheckResult:
    """Verify a certificate's bytes offline; returns what was verified or raises.

    `CertificateUnreadable`: the bytes are not a well-formed certificate. `CertificateInvalid`: a claim
    does not hold (digest, signature, oracle verdict, tables vs rules, verdict vs tables). With
    `public_key` (an Ed25519 public key) the certificate must be signed by that key; with
    `require_signature` it must be signed by the key it names. A signature is refused under a weak key
    (one anyone can sign for) or dated beyond `now` (default: this clock) plus `max_clock_skew` seconds.
    Runs no code from the certificate. A symbolic certificate (`govern-symbolic-certificate/1`, no
    tables) is re-decided from its rules by the local CP-SAT, and its statement says it rests on that.
    """
    value = parse_strict_json(data, max_bytes=max_bytes)
    if isinstance(value, dict) and value.get("format") == "govern-symbolic-certificate/1":
        return _check_symbolic(
            SymbolicCertificate(parse_symbolic(value)), public_key, require_signature, now, max_clock_skew
        )
    certificate = table_certificate(value)
    model = certificate.model
    steps, signature = check_front_matter(
        certificate,
        "parsed strictly: canonical JSON, known fields only, well-formed tables",
        public_key=public_key,
        require_signature=require_signature,
        now=now,
        max_clock_skew=max_clock_skew,
    )
    initial = initial_state(model.machine)
    analysis = analyse_tables(
        certificate.valid,
        certificate.repair,
        certificate.apply,
        events=len(model.machine.events),
        initial=initial,
        independent=model.machine.independent,
        domain=model.machine.domain,
    )
    if analysis.problem is not None:
        raise CertificateInvalid(f"the tables do not converge: {analysis.problem}")
    recomputed = _verdict_from_analysis(analysis, model)
    stated = model.verdict.model_dump(mode="json")
    wrong = sorted(k for k in recomputed if recomputed[k] != stated[k])
    if wrong:
        details = "; ".join(f"{k}: claims {stated[k]!r}, tables give {recomputed[k]!r}" for k in wrong)
        raise CertificateInvalid(f"the verdict does not match the tables: {details}")
    steps.append("verdict recomputed from the tables: every field matches")
    tables_verdict = run_tables_oracle(
        model.machine, certificate.valid, certificate.repair, certificate.apply
    )
    if not tables_verdict.certified:
        raise CertificateInvalid(
            f"the proof-derived table checker rejects the tables: {tables_verdict.reason}"
        )
    steps.append(
        f"proof-derived table checker accepted the tables ({tables_verdict.theorem}); its causal-order "
        "obligations and not-idempotent events equal the certificate's "
        "(Govern.Delivery.check_tables_delivery)"
    )
    claims = model.verdict
    oracle_checks: list[tuple[str, object, object]] = [
        ("CC2", tables_verdict.cc2, claims.cc2),
        ("max repair depth", tables_verdict.max_depth, claims.max_repair_depth),
        ("checked domain size", tables_verdict.domain_size, claims.domain_states),
        # Exactly right on the checked domain: Govern.Delivery.check_tables_delivery.
        ("causal-order obligations", tables_verdict.obligations, claims.causal_order_obligations),
        ("not-idempotent events", tables_verdict.not_idempotent, claims.not_idempotent),
    ]
    for label, found, claim in oracle_checks:
        if found is not None and found != claim:
            raise CertificateInvalid(
                f"{label}: the certificate claims {claim!r}, the table checker finds {found!r}"
            )
    rules_checked = certificate.has_rules
    if rules_checked:
        reason, theorem = run_rules_oracle(
            model.machine, certificate.valid, certificate.repair, certificate.apply
        )
        if reason is not None:
            raise CertificateInvalid(f"the rules checker does not confirm the tables: {reason}")
        steps.append(
            f"proof-derived rules checker recomputed the tables from the rules: identical ({theorem})"
        )
    else:
        steps.append("some rules are Python callables: the tables could not be re-derived from the rules")
    return CheckResult(
        certificate=certificate,
        signature=signature,
        rules_checked=rules_checked,
        oracle=local_oracle_identity(),
        tables_verdict=tables_verdict,
        analysis=analysis,
        steps=steps,
    )


def _check_symbolic(
    certificate: SymbolicCertificate,
    public_key: Ed25519PublicKey | None,
    require_signature: bool,
    now: datetime | None,
    max_clock_skew: float,
) -> CheckResult:
    """A symbolic certificate: strict parse, digest, signature, then every verdict field re-decided
    from the rules by the local CP-SAT (`_symbolic.redecide`)."""
    steps, signature = check_front_matter(
        certificate,
        "parsed strictly: canonical JSON, known fields only (a symbolic certificate: no tables)",
        public_key=public_key,
        require_signature=require_signature,
        now=now,
        max_clock_skew=max_clock_skew,
    )
    solver, more = redecide(certificate.model)
    return CheckResult(
        certificate=certificate,
        signature=signature,
        rules_checked=True,
        oracle={},
        tables_verdict=None,
        analysis=None,
        steps=steps + more,
        solver=solver,
    )


def symbolic_certificate(document: dict[str, Any]) -> SymbolicCertificate:
    """A symbolic certificate from its document (`_symbolic.symbolic_document`), with its digest."""
    document = dict(document)
    document["digest"] = compute_digest(document)
    return SymbolicCertificate(parse_symbolic(document))


def _names(model: CertificateModel, indices: list[int]) -> str:
    names = [model.machine.events[i].name for i in indices]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def render_statement(result: CheckResult) -> str:
    """The one-paragraph statement `govern check` prints."""
    model = result.certificate.model
    assert isinstance(model, CertificateModel)
    verdict = model.verdict
    events = model.machine.events
    who = (
        f" and signed by {result.signature.key_id} at {result.signature.signed_at}"
        if result.signature is not None
        else " (unsigned, so anyone could have produced it; this says nothing about who)"
    )
    domain = (
        f"every valid state ({verdict.domain_states:,} of {verdict.states:,})"
        if verdict.domain == "valid"
        else f"every state reachable from the initial state ({verdict.domain_states:,} of {verdict.states:,})"
    )
    if verdict.pairs == "all":
        pairs = "every pair of distinct events commutes"
    elif verdict.pairs_checked:
        listed = ", ".join(f"{events[a].name}/{events[b].name}" for a, b in verdict.pairs_checked)
        pairs = f"the declared independent pairs ({listed}) commute"
    else:
        pairs = "no pair was declared independent, so none was checked to commute"
    if verdict.pairs == "all":
        meaning = (
            "from any state of that domain, every delivery order of the same events reaches the same state"
        )
    else:
        meaning = (
            "from any state of that domain, two delivery orders of the same events that differ only by "
            "swapping adjacent declared-independent events reach the same state"
        )
    if verdict.cc2:
        meaning += ", however compensation (repair) interleaves with delivery."
    else:
        meaning += (
            ", provided each event is applied to a fully repaired state, as Machine.apply does "
            "(CC2 does not hold)."
        )
    if verdict.causal_order_obligations:
        listed = ", ".join(f"{events[a].name}/{events[b].name}" for a, b in verdict.causal_order_obligations)
        meaning += (
            f" These pairs do not commute and must be delivered in causal order: {listed}; every other "
            "pair commutes on that domain (Govern.Delivery.check_tables_delivery), and any delivery order "
            "keeping these pairs in log order reaches the log-order state "
            "(Govern.Delivery.check_tables_replica)."
        )
    elif verdict.pairs == "declared":
        meaning += " The undeclared pairs commute too (Govern.Delivery.check_tables_delivery)."
    if verdict.not_idempotent:
        meaning += (
            f" Delivering {_names(model, verdict.not_idempotent)} twice changes the state, "
            "so duplicates must be filtered out (Govern.Delivery.check_tables_duplicate)."
        )
    basis = (
        "the proof-derived rules checker recomputed the tables from the rules, so the claim is about "
        "the rules as written"
        if result.rules_checked
        else "some of the machine's rules are Python callables, so only the tables were checked: they "
        "converge, but that they are what the code computes was not checked offline"
    )
    return (
        f"Verified: certificate for machine {model.machine.name!r} is intact (digest {model.digest}){who}. "
        f"The proof-derived table checker accepted its tables: repair terminates from every state "
        f"(at most {verdict.max_repair_depth} step{'s' if verdict.max_repair_depth != 1 else ''}) and "
        f"{pairs} on {domain}; {basis}. "
        f"Meaning: {meaning} Nothing more is claimed: not that the rules express your intent, not "
        "that events are ever delivered, and nothing about code or state outside this machine."
    )
