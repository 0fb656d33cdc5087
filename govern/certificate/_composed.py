"""Certificates of machines built by components (format `govern-certificate/composed-1`).

Such a certificate holds the whole machine's rules, one ordinary certificate (rules, verdict, tables)
per component, and the whole machine's verdict. Checking it (`check_composed`, run by `govern check`)
reads only its bytes:

1. strict parse, canonical form, digest, signature (as for any certificate);
2. the components partition the variables, invariants and events;
3. the extracted decomposition checker (`Govern.Compose.check_decomposition_sound`) confirms from the
   whole machine's rules AST that every rule reads and writes only its own component (the engine's
   split, made with networkx, is not trusted);
4. each component's machine is exactly the whole machine's projection on it, and each component
   certificate passes `check_certificate` (the proof-derived table and rules checkers included);
5. the whole verdict is recomputed from the components' verdicts; by `Govern.Compose` it holds for the
   whole machine. A pair across components needs no table (`Govern.Compose.compose_cross`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from itertools import combinations
from typing import TYPE_CHECKING, Any

from .._errors import OracleError
from ..verify._compose import Component, project_rules
from ._certificate import Certificate, CheckResult, check_certificate
from ._checked import MAX_CLOCK_SKEW, CertificateDocument, Signature, check_front_matter, compute_digest
from ._encoding import DEFAULT_MAX_BYTES, canonical_json, parse_strict_json
from ._errors import CertificateInvalid, CertificateUnreadable
from ._model import COMPOSED_FORMAT, ComposedCertificateModel, has_rules, validate_machine, validate_model
from ._oracle import local_oracle_identity

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from ..machine._composed import ComposedMachine

__all__ = [
    "ComposedCertificate",
    "ComposedCheckResult",
    "check_composed",
    "composed_certificate_for",
    "composed_of",
    "is_composed",
    "read_composed",
]


@dataclass(frozen=True, eq=False)
class ComposedCertificate(CertificateDocument):
    """A composed certificate: its document (as read, canonical), its bytes and its components'
    certificates."""

    model: ComposedCertificateModel
    components: tuple[Certificate, ...] = field(repr=False)
    raw: dict[str, Any] = field(repr=False)
    data: bytes = field(repr=False)

    def document(self) -> dict[str, Any]:
        """The certificate as a JSON value (a fresh copy)."""
        copy: dict[str, Any] = json.loads(self.data)
        return copy

    def to_bytes(self) -> bytes:
        """The canonical file content: canonical JSON and one newline."""
        return self.data

    def _from_document(self, document: dict[str, Any]) -> ComposedCertificate:
        return read_composed(canonical_json(document) + b"\n")


def is_composed(data: bytes) -> bool:
    """True when `data` is a certificate whose top-level format member names a composed certificate
    (nothing else is checked). Unreadable data is not composed: the table reader then says why."""
    # Only the top-level member counts: the same text inside a nested object (a certificate's free-form
    # oracle record) does not make a table certificate a composed one.
    try:
        value = parse_strict_json(data, max_bytes=max(len(data), 1))
    except CertificateUnreadable:
        return False
    return isinstance(value, dict) and value.get("format") == COMPOSED_FORMAT


def _whole_verdict(machine: ComposedMachine) -> dict[str, Any]:
    report = machine.report
    decomp = machine.decomposition
    position = {name: i for i, name in enumerate(machine.events)}

    def pair(a: str, b: str) -> list[int]:
        return sorted((position[a], position[b]))

    checked = []
    for part in machine.components:
        checked += [pair(a, b) for a, b in part.report.pairs_checked]
    return {
        "wfc": True,
        "cc1": True,
        "components": len(decomp.components),
        "max_repair_depth": int(report.max_repair_depth),
        "states": int(report.states),
        "valid_states": int(report.valid_states),
        "domain": str(report.domain),
        "domain_states": int(report.domain_states),
        "pairs": str(report.pair_mode),
        "pairs_checked": sorted(checked),
        "cc2": bool(report.cc2),
        "causal_order_obligations": sorted(pair(d.events[0], d.events[1]) for d in report.obligations),
        "not_idempotent": sorted(position[d.events[0]] for d in report.not_idempotent),
        "guarantee": "interleaved-repair" if report.cc2 else "repair-before-apply",
    }


def composed_certificate_for(
    machine: ComposedMachine, parts: list[Certificate], *, version: str
) -> ComposedCertificate:
    """The certificate of a machine built by components, given its components' certificates (unsigned,
    not yet re-checked)."""
    document: dict[str, Any] = {
        "format": COMPOSED_FORMAT,
        "tool": {"name": "govern", "version": version},
        "machine": machine.rules(),
        "verdict": _whole_verdict(machine),
        "components": [
            {
                "variables": list(comp.variables),
                "invariants": list(comp.invariants),
                "events": list(comp.events),
                "certificate": cert.document(),
            }
            for comp, cert in zip(machine.decomposition.components, parts, strict=True)
        ],
        "oracle": local_oracle_identity(),
    }
    document["digest"] = compute_digest(document)
    data = canonical_json(document) + b"\n"
    # The parts were made here and are well formed; `self_check` re-reads everything from the bytes.
    model = ComposedCertificateModel.model_validate(document)
    return ComposedCertificate(model, tuple(parts), document, data)


def read_composed(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ComposedCertificate:
    """Parse a composed certificate strictly, without judging its claims (`CertificateUnreadable`)."""
    return composed_of(parse_strict_json(data, max_bytes=max_bytes), max_bytes=max_bytes)


def composed_of(value: Any, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ComposedCertificate:
    """The composed certificate whose parsed JSON is `value`, read strictly (`CertificateUnreadable`); each
    component's certificate is held to `max_bytes` too."""
    from ._certificate import read_table_certificate

    model = validate_model(ComposedCertificateModel, value, "govern composed certificate")
    # The model must say exactly what the document says (strict types: no 1 read as true); each
    # component's document is held to the same by read_table_certificate.
    top = model.model_dump(mode="json", exclude={"signature", "components"})
    if top != {k: v for k, v in value.items() if k not in ("signature", "components")} or [
        {k: v for k, v in e.items() if k != "certificate"} for e in value["components"]
    ] != [e.model_dump(mode="json", exclude={"certificate"}) for e in model.components]:
        raise CertificateUnreadable("a field has a value of the wrong JSON type")
    validate_machine(model.machine, bounded=False)
    if not has_rules(model.machine):
        raise CertificateUnreadable("a composed certificate's rules must all be expressions (no callables)")
    components = []
    for i, entry in enumerate(value["components"]):
        try:
            part = canonical_json(entry["certificate"]) + b"\n"
            components.append(read_table_certificate(part, max_bytes=max_bytes))
        except CertificateUnreadable as exc:
            raise CertificateUnreadable(f"components.{i}.certificate: {exc}") from None
    return ComposedCertificate(model, tuple(components), value, canonical_json(value) + b"\n")


@dataclass(frozen=True, eq=False)
class ComposedCheckResult:
    """What `check_composed` verified (it exists only when every check passed)."""

    certificate: ComposedCertificate
    signature: Signature | None
    components: tuple[CheckResult, ...]
    oracle: dict[str, str]
    steps: list[str]
    rules_checked: bool = True

    def statement(self) -> str:
        model = self.certificate.model
        verdict = model.verdict
        events = model.machine.events
        who = (
            f" and signed by {self.signature.key_id} at {self.signature.signed_at}"
            if self.signature is not None
            else " (unsigned, so anyone could have produced it; this says nothing about who)"
        )
        pairs = (
            "every pair of distinct events commutes"
            if verdict.pairs == "all"
            else "the declared independent pairs commute"
        )
        text = (
            f"Verified: composed certificate for machine {model.machine.name!r} is intact (digest "
            f"{model.digest}){who}. The extracted decomposition checker confirmed from the rules that the "
            f"machine splits into {verdict.components} components with disjoint closed footprints "
            "(Govern.Compose.check_decomposition_sound); each component's certificate passed the "
            "proof-derived table and rules checkers; so, by Govern.Compose "
            "(compose_unique_normal_forms, compose_stream_convergence, compose_cross), repair terminates "
            f"from every state of the whole machine ({verdict.states:,} states, at most "
            f"{verdict.max_repair_depth} repair steps) and {pairs} on its "
            f"{'valid' if verdict.domain == 'valid' else 'reachable'} states "
            f"({verdict.domain_states:,}); pairs across components commute at every state and needed no "
            "table."
        )
        if verdict.cc2:
            text += " CC2 holds: compensation may interleave with delivery in any way."
        else:
            text += " CC2 does not hold: apply each event to a repaired state, as Machine.apply does."
        if verdict.causal_order_obligations:
            listed = ", ".join(
                f"{events[a].name}/{events[b].name}" for a, b in verdict.causal_order_obligations
            )
            text += f" These pairs must be delivered in causal order: {listed}."
        if verdict.not_idempotent:
            names = ", ".join(events[e].name for e in verdict.not_idempotent)
            text += f" Deduplicate redeliveries of: {names}."
        return text + (
            " Nothing more is claimed: not that the rules express your intent, nor that events are delivered."
        )


def _partition(entries: list[list[int]], n: int, what: str) -> None:
    seen = sorted(x for e in entries for x in e)
    if seen != list(range(n)) or any(e != sorted(set(e)) for e in entries):
        raise CertificateInvalid(
            f"the components' {what} are not a partition of the machine's {n} {what} (each listed once, "
            "increasing)"
        )


def check_composed(
    data: bytes,
    *,
    public_key: Ed25519PublicKey | None = None,
    require_signature: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    now: datetime | None = None,
    max_clock_skew: float = MAX_CLOCK_SKEW,
) -> ComposedCheckResult:
    """Verify a composed certificate's bytes offline (see the module docstring); returns what was
    verified or raises `CertificateUnreadable` / `CertificateInvalid`."""
    from .. import oracle

    certificate = read_composed(data, max_bytes=max_bytes)
    model = certificate.model
    steps, signature = check_front_matter(
        certificate,
        "parsed strictly: canonical JSON, known fields only, well-formed component tables",
        public_key=public_key,
        require_signature=require_signature,
        now=now,
        max_clock_skew=max_clock_skew,
    )
    rules = model.machine.model_dump(mode="json")
    entries = model.components
    n_vars, n_invs, n_evs = len(rules["variables"]), len(rules["invariants"]), len(rules["events"])
    _partition([e.variables for e in entries], n_vars, "variables")
    _partition([e.invariants for e in entries], n_invs, "invariants")
    _partition([e.events for e in entries], n_evs, "events")
    labels = {"variables": [0] * n_vars, "invariants": [0] * n_invs, "events": [0] * n_evs}
    for c, e in enumerate(entries):
        for kind, items in (("variables", e.variables), ("invariants", e.invariants), ("events", e.events)):
            for x in items:
                labels[kind][x] = c
    try:
        ok = oracle.check_decomposition(rules=rules, **labels)
    except OracleError as exc:
        raise CertificateInvalid(f"the extracted decomposition checker gave no verdict: {exc}") from exc
    if not ok:
        raise CertificateInvalid(
            "the extracted decomposition checker rejects the components: some rule reads or writes a "
            "variable outside its own component"
        )
    steps.append(
        f"extracted decomposition checker: {len(entries)} components with disjoint closed footprints "
        f"({oracle.THEOREM_DECOMPOSITION})"
    )
    results = []
    tables: list[Certificate] = []
    for c, (entry, part) in enumerate(zip(entries, certificate.components, strict=True)):
        comp = Component(tuple(entry.variables), tuple(entry.invariants), tuple(entry.events))
        part_document = certificate.raw["components"][c]["certificate"]
        if canonical_json(project_rules(rules, comp, c)) != canonical_json(part_document["machine"]):
            raise CertificateInvalid(
                f"component {c}'s machine is not the whole machine's projection on its variables, "
                "invariants and events"
            )
        try:
            result = check_certificate(canonical_json(part_document) + b"\n", max_bytes=max_bytes)
        except CertificateInvalid as exc:
            raise CertificateInvalid(f"component {c} ({part.name!r}): {exc}") from None
        if not isinstance(result.certificate, Certificate):  # a symbolic one rests on a solver, not tables
            raise CertificateInvalid(f"component {c} ({part.name!r}) is not a table certificate")
        results.append(result)
        tables.append(result.certificate)
    steps.append(
        f"every component is the projection of the whole machine, and its certificate passed the "
        f"proof-derived table and rules checkers ({len(results)} components)"
    )
    recomputed = _recompute_verdict(model, entries, tables)
    stated = model.verdict.model_dump(mode="json")
    wrong = sorted(k for k in recomputed if recomputed[k] != stated[k])
    if wrong:
        details = "; ".join(f"{k}: claims {stated[k]!r}, components give {recomputed[k]!r}" for k in wrong)
        raise CertificateInvalid(f"the whole verdict does not follow from the components': {details}")
    steps.append(
        "whole verdict recomputed from the components' verdicts: every field matches "
        "(Govern.Compose: compose_unique_normal_forms, compose_cross, compose_commute_iff, compose_idem_iff)"
    )
    return ComposedCheckResult(
        certificate=certificate,
        signature=signature,
        components=tuple(results),
        oracle=local_oracle_identity(),
        steps=steps,
    )


def _recompute_verdict(
    model: ComposedCertificateModel, entries: Any, parts: list[Certificate]
) -> dict[str, Any]:
    states = valid = domain = 1
    depth = 0
    checked: list[list[int]] = []
    obligations: list[list[int]] = []
    not_idem: list[int] = []
    cc2 = True
    for entry, part in zip(entries, parts, strict=True):
        v = part.model.verdict
        ev = entry.events
        states *= v.states
        valid *= v.valid_states
        domain *= v.domain_states
        depth += v.max_repair_depth
        cc2 = cc2 and v.cc2
        checked += [sorted((ev[a], ev[b])) for a, b in v.pairs_checked]
        obligations += [sorted((ev[a], ev[b])) for a, b in v.causal_order_obligations]
        not_idem += [ev[e] for e in v.not_idempotent]
    machine = model.machine
    n_evs = len(machine.events)
    declared = machine.independent
    label = [0] * n_evs
    for c, entry in enumerate(entries):
        for e in entry.events:
            label[e] = c
    # The declared pairs inside a component are the ones its certificate checked; across: none needed.
    expect = [sorted(p) for p in (declared if declared is not None else combinations(range(n_evs), 2))]
    inside = sorted(p for p in expect if label[p[0]] == label[p[1]])
    if sorted(checked) != inside:
        checked = [[-1, -1]]  # makes the comparison below fail, naming pairs_checked
    return {
        "wfc": True,
        "cc1": True,
        "components": len(parts),
        "max_repair_depth": depth,
        "states": states,
        "valid_states": valid,
        "domain": machine.domain,
        "domain_states": domain,
        "pairs": "declared" if declared is not None else "all",
        "pairs_checked": sorted(checked),
        "cc2": cc2,
        "causal_order_obligations": sorted(obligations),
        "not_idempotent": sorted(not_idem),
        "guarantee": "interleaved-repair" if cc2 else "repair-before-apply",
    }
