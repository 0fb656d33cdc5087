"""Symbolic certificates (format `govern-symbolic-certificate/1`): a machine verified on its rules by
CP-SAT, with no tables. Its verdict rests on the solver, and the check says so.

A symbolic certificate holds the rules (every rule an expression), the verdict and the solver that
reached it (name, package, version), under the same digest and signature scheme as a table
certificate. There are no tables, so the proof-derived checkers have nothing to check: `govern check`
re-decides every condition from the rules with the CP-SAT installed where it runs (counterexamples
replayed through the concrete semantics, unsatisfiable answers taken on the solver's word), compares
the verdict field by field, and states the weaker claim: "rests on CP-SAT <version>".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import BaseModel, Field

from .._errors import DeclarationError, GovernError, NotConvergent, StateSpaceTooLarge
from ..machine._rules_snapshot import snapshot_from_rules
from ..model._declarations import Snapshot
from ..verify._symbolic import SymbolicVerdict as _Decided
from ..verify._symbolic import solver_identity, verify_symbolic
from ..verify._timing import PhaseTimer
from ._checked import CertificateDocument
from ._encoding import DEFAULT_MAX_BYTES, canonical_json, parse_strict_json
from ._errors import CertificateInvalid, CertificateUnreadable
from ._model import (
    _STRICT,
    Digest,
    MachineRules,
    NonNeg,
    SignatureBlock,
    ToolInfo,
    has_rules,
    validate_machine,
    validate_model,
)
from ._signing import is_signing_time

if TYPE_CHECKING:
    from ..machine._machine import Machine

__all__ = [
    "SYMBOLIC_FORMAT",
    "SymbolicCertificate",
    "SymbolicCertificateModel",
    "is_symbolic",
    "parse_symbolic",
    "read_symbolic",
    "redecide",
    "render_symbolic_statement",
    "snapshot_of",
    "symbolic_document",
]

SYMBOLIC_FORMAT: Final = "govern-symbolic-certificate/1"
Pair = Annotated[list[NonNeg], Field(min_length=2, max_length=2)]


class SolverInfo(BaseModel):
    """The solver the verdict rests on."""

    model_config = _STRICT
    name: Literal["CP-SAT"]
    package: Literal["ortools"]
    version: Annotated[str, Field(min_length=1, max_length=100)]


class SymbolicVerdictModel(BaseModel):
    """What the symbolic build established (states are not counted; the domain is every valid state, or
    every state a run from the initial state reaches)."""

    model_config = _STRICT
    wfc: Literal[True]
    cc1: Literal[True]
    max_repair_depth: NonNeg
    states: Annotated[int, Field(ge=1)]
    domain: Literal["valid", "reachable"]
    pairs: Literal["declared", "all"]
    pairs_checked: list[Pair]
    cc2: bool
    causal_order_obligations: list[Pair]
    not_idempotent: list[NonNeg]
    guarantee: Literal["interleaved-repair", "repair-before-apply"]


class SymbolicCertificateModel(BaseModel):
    """A whole symbolic certificate document."""

    model_config = _STRICT
    format: Literal["govern-symbolic-certificate/1"]
    tool: ToolInfo
    machine: MachineRules
    verdict: SymbolicVerdictModel
    solver: SolverInfo
    digest: Digest
    signature: SignatureBlock | None = None

    @property
    def oracle(self) -> dict[str, str]:
        """No proof-derived oracle took part (the interface of a table certificate's model)."""
        return {}


def _document_of(model: SymbolicCertificateModel) -> dict[str, Any]:
    document = model.model_dump(mode="json", exclude={"signature"})
    if model.signature is not None:
        document["signature"] = model.signature.model_dump(mode="json")
    return document


@dataclass(frozen=True, eq=False)
class SymbolicCertificate(CertificateDocument):
    """A symbolic certificate document. `to_bytes()` is the exact file content."""

    model: SymbolicCertificateModel

    def document(self) -> dict[str, Any]:
        """The certificate as a JSON value (the signature member only when signed)."""
        return _document_of(self.model)

    def _from_document(self, document: dict[str, Any]) -> SymbolicCertificate:
        return SymbolicCertificate(parse_symbolic(document))


def parse_symbolic(value: dict[str, Any]) -> SymbolicCertificateModel:
    """Validate a parsed JSON object as a symbolic certificate (strictly, like a table certificate)."""
    model = validate_model(SymbolicCertificateModel, value, "govern symbolic certificate")
    validate_machine(model.machine, bounded=False)
    if not has_rules(model.machine):
        raise CertificateUnreadable("a symbolic certificate needs every rule as an expression")
    if model.machine.domain != model.verdict.domain:
        raise CertificateUnreadable("the verdict's domain is not the machine's checked domain")
    if model.signature is not None and not is_signing_time(model.signature.signed_at):
        raise CertificateUnreadable("signature.signed_at is not a date and time that exists")
    if canonical_json(_document_of(model)) != canonical_json(value):
        raise CertificateUnreadable("a field has a value of the wrong JSON type")
    return model


def is_symbolic(data: bytes) -> bool:
    """True when `data` looks like a symbolic certificate (by its format member; nothing is checked).
    The member can only occur as structure: quotes inside JSON strings are escaped."""
    return f'"format":"{SYMBOLIC_FORMAT}"'.encode() in data


def read_symbolic(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> SymbolicCertificate:
    """Parse a symbolic certificate strictly, without judging its claims (`CertificateUnreadable`)."""
    value = parse_strict_json(data, max_bytes=max_bytes)
    if not isinstance(value, dict):
        raise CertificateUnreadable("a certificate is a JSON object")
    return SymbolicCertificate(parse_symbolic(value))


def snapshot_of(machine: MachineRules) -> Snapshot:
    """The declarations a symbolic check re-decides, rebuilt from the certificate's rules."""
    return snapshot_from_rules(machine.model_dump(mode="json"))


# -- making and checking ------------------------------------------------------------------------------


def _verdict(d: _Decided, states: int, names: list[str], domain: str) -> dict[str, Any]:
    def positions(events: tuple[str, ...]) -> list[int]:
        return sorted(names.index(e) for e in events)

    return {
        "wfc": True,
        "cc1": True,
        "max_repair_depth": d.depth_max,
        "states": states,
        "domain": domain,
        "pairs": d.pair_mode,
        "pairs_checked": sorted([a, b] for a, b in d.pairs_checked),
        "cc2": d.cc2,
        "causal_order_obligations": sorted(positions(w.events) for w in d.obligations),
        "not_idempotent": sorted(positions(w.events)[0] for w in d.not_idempotent),
        "guarantee": "interleaved-repair" if d.cc2 else "repair-before-apply",
    }


def symbolic_document(machine: Machine, *, version: str) -> dict[str, Any]:
    """The document of a symbolically verified machine's certificate, without its digest."""
    report = machine.report
    position = {name: i for i, name in enumerate(machine.events)}
    solver = report.solver or {}
    verdict = {
        "wfc": True,
        "cc1": True,
        "max_repair_depth": int(report.max_repair_depth),
        "states": int(report.states),
        "domain": report.domain,
        "pairs": report.pair_mode,
        "pairs_checked": sorted(sorted([position[a], position[b]]) for a, b in report.pairs_checked),
        "cc2": bool(report.cc2),
        "causal_order_obligations": sorted(
            sorted([position[w.events[0]], position[w.events[1]]]) for w in report.obligations
        ),
        "not_idempotent": sorted(position[w.events[0]] for w in report.not_idempotent),
        "guarantee": "interleaved-repair" if report.cc2 else "repair-before-apply",
    }
    document: dict[str, Any] = {
        "format": SYMBOLIC_FORMAT,
        "tool": {"name": "govern", "version": version},
        "machine": machine.rules(),
        "verdict": verdict,
        "solver": {k: str(solver.get(k, "")) for k in ("name", "package", "version")},
    }
    return document


def redecide(model: SymbolicCertificateModel) -> tuple[dict[str, str], list[str]]:
    """Re-decide every verdict field from the rules with the local CP-SAT; returns the local solver's
    identity and the steps done, or raises `CertificateInvalid`."""
    try:
        local = solver_identity()
    except ImportError:
        raise CertificateInvalid(
            "this certificate's verdict rests on CP-SAT, which is not installed here (pip install "
            "ortools); it cannot be checked without it"
        ) from None
    try:
        snap = snapshot_of(model.machine)
        decided = verify_symbolic(snap, model.machine.domain, PhaseTimer())
    except NotConvergent as exc:
        raise CertificateInvalid(f"the rules do not converge:\n{exc}") from None
    except StateSpaceTooLarge as exc:
        raise CertificateInvalid(f"CP-SAT could not re-decide the rules here: {exc}") from None
    except (DeclarationError, GovernError) as exc:
        raise CertificateInvalid(f"the rules fail on a concrete state: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CertificateInvalid(f"the rules cannot be read back as declarations: {exc}") from None
    states = 1
    for v in snap.vars:
        states *= v.size
    recomputed = _verdict(decided, states, [e.name for e in snap.events], model.machine.domain)
    stated = model.verdict.model_dump(mode="json")
    wrong = sorted(k for k in recomputed if recomputed[k] != stated[k])
    if wrong:
        details = "; ".join(f"{k}: claims {stated[k]!r}, CP-SAT gives {recomputed[k]!r}" for k in wrong)
        raise CertificateInvalid(f"the verdict does not match the rules: {details}")
    made = model.solver.version
    steps = [
        f"every verdict field re-decided from the rules by CP-SAT {local['version']} (ortools) here "
        f"({decided.queries} queries; counterexamples replayed through the concrete semantics): every "
        "field matches"
        + (f" (the certificate was made with CP-SAT {made})" if made != local["version"] else ""),
        "no tables: the proof-derived checkers did not run; the verdict rests on CP-SAT's "
        "unsatisfiable answers, not on a proof",
    ]
    return local, steps


def render_symbolic_statement(
    model: SymbolicCertificateModel, signed: tuple[str, str] | None, local: str
) -> str:
    """The one-paragraph statement `govern check` prints for a symbolic certificate (`signed` is the
    verified signer's key id and time, `local` the CP-SAT version that re-decided it)."""
    verdict = model.verdict
    events = model.machine.events
    # On the reachable domain the claims hold from every state a run from the initial state reaches.
    where = "valid" if verdict.domain == "valid" else "reachable"
    who = (
        f" and signed by {signed[0]} at {signed[1]}"
        if signed is not None
        else " (unsigned, so anyone could have produced it; this says nothing about who)"
    )
    if verdict.pairs == "all":
        pairs = "every pair of distinct events commutes"
        meaning = f"from any {where} state, every delivery order of the same events reaches the same state"
    else:
        listed = ", ".join(f"{events[a].name}/{events[b].name}" for a, b in verdict.pairs_checked) or "none"
        pairs = f"the declared independent pairs ({listed}) commute"
        meaning = (
            f"from any {where} state, two delivery orders that differ only by swapping adjacent "
            "declared-independent events reach the same state"
        )
    meaning += (
        ", however compensation interleaves with delivery."
        if verdict.cc2
        else ", provided each event is applied to a fully repaired state, as Machine.apply does."
    )
    if verdict.causal_order_obligations:
        listed = ", ".join(f"{events[a].name}/{events[b].name}" for a, b in verdict.causal_order_obligations)
        meaning += f" These pairs do not commute and must be delivered in causal order: {listed}."
    if verdict.not_idempotent:
        names = ", ".join(events[i].name for i in verdict.not_idempotent)
        meaning += f" Delivering {names} twice changes the state: filter duplicates."
    return (
        f"Verified, resting on CP-SAT {local} (ortools): certificate for machine {model.machine.name!r} is "
        f"intact (digest {model.digest}){who}. It carries no tables ({verdict.states:,} states), so no "
        "proof-derived checker ran: CP-SAT re-decided from the rules as written that repair terminates "
        f"from every state (at most {verdict.max_repair_depth} step"
        f"{'s' if verdict.max_repair_depth != 1 else ''}) and that {pairs} on every {where} state. "
        "Its counterexamples would have been replayed through the concrete semantics; its "
        "'no counterexample' answers are taken on the solver's word, with no proof object checked. "
        f"If they are right, then (by the Rocq theorems on WFC, CC1 and CC2): {meaning} Nothing more is "
        "claimed: not that the rules express your intent, not that events are ever delivered, and "
        "nothing about code or state outside this machine."
    )
