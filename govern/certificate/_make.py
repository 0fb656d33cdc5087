"""Turning a built `Machine` into a `Certificate`: its rules, the engine's verdict, its tables.

The verdict written into a certificate is the engine's (from `Machine.report`), translated to event
positions; `certify` then checks the certificate exactly as `govern check` would, so a certificate
is only handed out when the independent recomputation and the proof-derived oracle agree with the
engine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import OracleDisagreement
from ._certificate import Certificate, CheckResult, assemble, check_certificate, symbolic_certificate
from ._composed import ComposedCertificate, ComposedCheckResult, check_composed, composed_certificate_for
from ._encoding import MAX_NESTING, nesting_depth
from ._errors import CertificateInvalid, CertificateTooLarge, CertificateUnreadable
from ._model import MAX_NAME, MAX_STATES, MAX_TABLE_ENTRIES
from ._oracle import local_oracle_identity
from ._signing import load_private_key
from ._symbolic import SymbolicCertificate, symbolic_document

if TYPE_CHECKING:
    from ..machine._machine import Machine
    from ..machine._registry import Registry

__all__ = ["certificate_for", "certify", "self_check", "tool_version"]


def tool_version() -> str:
    """The installed version of govern (the `bide` distribution)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bide")
    except PackageNotFoundError:
        return "0+unknown"


def _verdict(machine: Machine) -> dict[str, Any]:
    report = machine.report
    position = {name: i for i, name in enumerate(machine.events)}

    def pair(a: str, b: str) -> list[int]:
        return sorted((position[a], position[b]))

    return {
        "wfc": bool(report.wfc),
        "cc1": bool(report.cc1),
        "max_repair_depth": int(report.max_repair_depth),
        "states": int(report.states),
        "valid_states": int(report.valid_states),
        "domain": str(report.domain),
        "domain_states": int(report.domain_states),
        "pairs": str(report.pair_mode),
        "pairs_checked": sorted(pair(a, b) for a, b in report.pairs_checked),
        "cc2": bool(report.cc2),
        "causal_order_obligations": sorted(pair(d.events[0], d.events[1]) for d in report.obligations),
        "not_idempotent": sorted(position[d.events[0]] for d in report.not_idempotent),
        "guarantee": "interleaved-repair" if report.cc2 else "repair-before-apply",
    }


def certificate_for(
    machine: Machine, *, version: str | None = None
) -> Certificate | ComposedCertificate | SymbolicCertificate:
    """The certificate of a built machine (unsigned, not yet re-checked: see `certify`): a machine built
    by components gets a composed certificate (one table set per component), a symbolically verified
    one a symbolic certificate (no tables: its verdict rests on the solver), any other a table one."""
    from ..machine._composed import ComposedMachine

    version = version or tool_version()
    composed = isinstance(machine, ComposedMachine)
    _refuse_too_deep(machine.rules(), level=_COMPONENT_MACHINE_LEVEL if composed else _MACHINE_LEVEL)
    _refuse_long_names(machine.rules())
    if isinstance(machine, ComposedMachine):
        for part in machine.components:
            _refuse_long_names(part.rules())
        parts = [_plain_certificate(p, version) for p in machine.components]
        return composed_certificate_for(machine, parts, version=version)
    if machine.report.method == "symbolic":
        return symbolic_certificate(symbolic_document(machine, version=version))
    return _plain_certificate(machine, version)


#: The nesting level of the machine JSON in a certificate (the document itself is level 1): a member of the
#: document, and, in a composed certificate, also of each component's certificate, which is a member of an
#: object in the `components` array: level 5.
_MACHINE_LEVEL = 2
_COMPONENT_MACHINE_LEVEL = 5


def _refuse_too_deep(rules: dict[str, Any], *, level: int) -> None:
    """Raise CertificateTooLarge when the machine JSON `rules`, placed at nesting `level` of its certificate,
    would nest the certificate deeper than `MAX_NESTING`: no checker could read it back (`govern check`
    exits 4 on it), so it is refused before anything is encoded. The message names the deepest rule."""
    excess = level - 1 + nesting_depth(rules) - MAX_NESTING
    if excess <= 0:
        return
    rules_by_depth = sorted(
        ((nesting_depth(rule), f"{kind[:-1]} {rule['name']!r}") for kind in ("invariants", "events")
         for rule in rules[kind]),
        reverse=True,
    )
    deepest = f"the rules of {rules_by_depth[0][1]}" if rules_by_depth else "its rules"
    levels = f"{excess} level{'s' if excess > 1 else ''}"
    raise CertificateTooLarge(
        f"machine {rules['name']!r}: {deepest} are nested {levels} too deep for a certificate, which "
        f"nests at most {MAX_NESTING} levels so that every checker can read it back (each operator of an "
        "expression is a level); write the expression less deeply nested"
    )


def _refuse_long_names(rules: dict[str, Any]) -> None:
    """Raise CertificateTooLarge when a name in the machine JSON `rules` (the machine's, a variable's, a
    label, an invariant's or an event's) is longer than a certificate holds (`MAX_NAME` characters): no
    checker could read it back, so it is refused before anything is encoded."""
    names: list[tuple[str, str]] = [("machine", rules["name"])]
    for variable in rules["variables"]:
        names.append(("variable", variable["name"]))
        labels = variable.get("labels", ())
        names.extend((f"label of variable {variable['name'][:40]!r}", label) for label in labels)
    names.extend(("invariant", rule["name"]) for rule in rules["invariants"])
    names.extend(("event", rule["name"]) for rule in rules["events"])
    for what, name in names:
        if len(name) > MAX_NAME:
            raise CertificateTooLarge(
                f"the {what} name {name[:40]!r}... is {len(name)} characters long; a certificate holds names "
                f"of at most {MAX_NAME} characters (so that every checker can read it back): shorten it"
            )


def _plain_certificate(machine: Machine, version: str) -> Certificate:
    states, events = machine.n_states, len(machine.events)
    if states > MAX_STATES or states * events > MAX_TABLE_ENTRIES:
        raise CertificateTooLarge(
            f"machine {machine.name!r} has {states:,} states and {events} events; a certificate holds at "
            f"most {MAX_STATES:,} states and {MAX_TABLE_ENTRIES:,} apply entries (checkers refuse larger "
            "tables); split the machine or narrow its variables' ranges"
        )
    tables = machine.tables()
    return assemble(
        machine=machine.rules(),
        verdict=_verdict(machine),
        valid=tables.valid,
        repair=tables.repair,
        apply=tables.apply.reshape(-1),
        oracle=local_oracle_identity(),
        version=version,
    )


def self_check(
    certificate: Certificate | ComposedCertificate | SymbolicCertificate,
) -> CheckResult | ComposedCheckResult:
    """Check a freshly made certificate as `govern check` would; raises if it does not pass."""
    if isinstance(certificate, ComposedCertificate):
        return check_composed(certificate.to_bytes())
    return check_certificate(certificate.to_bytes())


def certify(
    machine: Machine | Registry, *, sign_with: str | os.PathLike[str] | None = None
) -> Certificate | ComposedCertificate | SymbolicCertificate:
    """Certify a machine (a `Registry` is built first, over the valid domain).

    The certificate is checked before it is returned, exactly as `govern check` checks it: strictly
    re-read, digest, the verdict recomputed from the tables, the proof-derived table checker and,
    for rules given as expressions, the rules checker (a symbolically verified machine gets a symbolic
    certificate, whose verdict is re-decided from its rules by CP-SAT). `sign_with` names an Ed25519
    private key file (`govern keygen`). Raises `NotConvergent` (from the build) for a machine that does
    not converge, and `OracleDisagreement` when the re-check disagrees with the engine (a bug: please
    report it).
    """
    from ..machine._registry import Registry

    built = machine.build() if isinstance(machine, Registry) else machine
    certificate = certificate_for(built)
    try:
        self_check(certificate)
    except (CertificateInvalid, CertificateUnreadable) as exc:
        raise OracleDisagreement(
            f"the engine certified {built.name!r} but its certificate does not check: {exc}; "
            "this is a bug in govern, please report it with the machine"
        ) from exc
    if sign_with is not None:
        certificate = certificate.signed(load_private_key(Path(sign_with)))
    return certificate
