"""govern: governed shared state machines whose convergence is verified and certified.

Declare variables, ordered invariants with repairs, and guarded events on a `Registry`; `build()`
enumerates the state space, verifies that every delivery order converges (WFC, CC1; CC2 reported),
has the checker extracted from our Rocq proof re-check the tables, and returns a `Machine` whose
every transition is one table lookup. See docs/govern.md and docs/semantics.md.
"""

from __future__ import annotations

from contextlib import suppress as _suppress

from ._agents import event_tool
from ._cert_errors import (
    CertificateError,
    CertificateInvalid,
    CertificateTooLarge,
    CertificateUnreadable,
    SigningKeyError,
)
from ._certificate import Certificate, CheckResult, check_certificate, read_certificate
from ._counterexample import Counterexample, Divergence, RepairCycle, Step
from ._declare import Registry
from ._errors import (
    DeclarationError,
    DomainViolation,
    ForeignState,
    GovernError,
    MachineFileError,
    NotConvergent,
    OracleDisagreement,
    OracleError,
    OracleRejected,
    OracleUnavailable,
    RuleError,
    StateSpaceTooLarge,
    UnknownEvent,
)
from ._eventlog import (
    Appended,
    Event,
    EventConflict,
    EventLog,
    EventLogError,
    InvalidInput,
    LogCorrupted,
    LogFormatError,
    LoggedEvent,
    LogTimeout,
    MachineMismatch,
    MissingDependency,
)
from ._expr import Expr, Var, if_, implies, max_, min_
from ._machine import Machine, MachineTables, State
from ._make_certificate import certify
from ._replica import Checkpoint, Replica, ReplicaError
from ._report import PrunedPair, Report

__all__ = [
    "Appended",
    "Certificate",
    "CertificateError",
    "CertificateInvalid",
    "CertificateTooLarge",
    "CertificateUnreadable",
    "CheckResult",
    "Checkpoint",
    "Counterexample",
    "DeclarationError",
    "Divergence",
    "DomainViolation",
    "Event",
    "EventConflict",
    "EventLog",
    "EventLogError",
    "Expr",
    "ForeignState",
    "GovernError",
    "InvalidInput",
    "LogCorrupted",
    "LogFormatError",
    "LogTimeout",
    "LoggedEvent",
    "Machine",
    "MachineFileError",
    "MachineMismatch",
    "MachineTables",
    "MissingDependency",
    "NotConvergent",
    "OracleDisagreement",
    "OracleError",
    "OracleRejected",
    "OracleUnavailable",
    "PrunedPair",
    "Registry",
    "RepairCycle",
    "Replica",
    "ReplicaError",
    "Report",
    "RuleError",
    "SigningKeyError",
    "State",
    "StateSpaceTooLarge",
    "Step",
    "UnknownEvent",
    "Var",
    "certify",
    "check_certificate",
    "event_tool",
    "if_",
    "implies",
    "max_",
    "min_",
    "read_certificate",
]

# Public names report their public path (govern.Registry, not govern._declare.Registry).
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("govern._"):
        with _suppress(AttributeError, TypeError):
            _obj.__module__ = "govern"
del _name, _obj
