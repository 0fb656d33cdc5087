"""govern: governed shared state machines whose convergence is verified and certified.

Declare variables, ordered invariants with repairs, and guarded events on a `Registry`; `build()`
enumerates the state space, verifies that every delivery order converges (WFC, CC1; CC2 reported),
has the checker extracted from our Rocq proof re-check the tables, and returns a `Machine` whose
every transition is one table lookup. See docs/govern.md and docs/semantics.md.

Data flows one way, and so do imports: each layer imports only layers below it (each subpackage's
docstring names what it may import; tests/govern/test_layout.py checks it from the source).

    6  cli/                the `govern` command and its pictures
    5  runtime/            the event log, replicas, delivery rules, agents as producers
    4  certificate/        the certificate format, encodings, signing, making and checking
    3  machine/            `Registry`, the build pipeline, the built `Machine`
    2  verify/, oracle/    the engine's verification; the checker extracted from Rocq and its gate
    1  model/              expressions, variables and the state space, declarations as data
    0  _errors.py          every exception type (certificate errors: certificate/_errors.py)

The names below are loaded lazily: `import govern` loads the exceptions only, and the first use of a name
imports the module that defines it, so building a machine does not load the event log's database layer.
"""

from __future__ import annotations

import typing as _typing

from bide._lazy import LazyExports as _LazyExports

if _typing.TYPE_CHECKING:  # type checkers and IDEs see the real objects; at run time `__getattr__` loads them
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
    from .certificate._certificate import Certificate, CheckResult, check_certificate
    from .certificate._errors import (
        CertificateError,
        CertificateInvalid,
        CertificateTooLarge,
        CertificateUnreadable,
        SigningKeyError,
    )
    from .certificate._make import certify
    from .certificate._read import read_certificate
    from .machine._machine import Machine, MachineTables, State
    from .machine._registry import Registry
    from .model._expr import Expr, Var, if_, implies, max_, min_
    from .model._families import EventFamily, Param
    from .runtime._agents import event_tool
    from .runtime._eventlog import (
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
        LogURLError,
        MachineMismatch,
        MissingDependency,
    )
    from .runtime._replica import Checkpoint, Replica, ReplicaError
    from .verify._counterexample import Counterexample, Divergence, RepairCycle, Step
    from .verify._report import PrunedPair, Report

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
    "EventFamily",
    "EventLog",
    "EventLogError",
    "Expr",
    "ForeignState",
    "GovernError",
    "InvalidInput",
    "LogCorrupted",
    "LogFormatError",
    "LogTimeout",
    "LogURLError",
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
    "Param",
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

# Where each public name is defined: module (below govern) -> its public names.
# fmt: off
_MODULE_NAMES: dict[str, tuple[str, ...]] = {
    "_errors": (
        "DeclarationError", "DomainViolation", "ForeignState", "GovernError", "MachineFileError",
        "NotConvergent", "OracleDisagreement", "OracleError", "OracleRejected", "OracleUnavailable",
        "RuleError", "StateSpaceTooLarge", "UnknownEvent",
    ),
    "certificate._certificate": ("Certificate", "CheckResult", "check_certificate"),
    "certificate._errors": (
        "CertificateError", "CertificateInvalid", "CertificateTooLarge", "CertificateUnreadable",
        "SigningKeyError",
    ),
    "certificate._make": ("certify",),
    "certificate._read": ("read_certificate",),
    "machine._machine": ("Machine", "MachineTables", "State"),
    "machine._registry": ("Registry",),
    "model._expr": ("Expr", "Var", "if_", "implies", "max_", "min_"),
    "model._families": ("EventFamily", "Param"),
    "runtime._agents": ("event_tool",),
    "runtime._eventlog": (
        "Appended", "Event", "EventConflict", "EventLog", "EventLogError", "InvalidInput", "LogCorrupted",
        "LogFormatError", "LoggedEvent", "LogTimeout", "LogURLError", "MachineMismatch", "MissingDependency",
    ),
    "runtime._replica": ("Checkpoint", "Replica", "ReplicaError"),
    "verify._counterexample": ("Counterexample", "Divergence", "RepairCycle", "Step"),
    "verify._report": ("PrunedPair", "Report"),
}
# fmt: on
_EXPORTS = _LazyExports(__name__, globals(), __all__, _MODULE_NAMES)

# Hidden from type checkers: with a visible module `__getattr__`, mypy would accept any `govern.<typo>`.
if not _typing.TYPE_CHECKING:
    __getattr__ = _EXPORTS.load
__dir__ = _EXPORTS.names  # the loaded names and every public one, loaded or not


# The exceptions are published now (two small modules): a traceback names govern.NotConvergent, not
# govern._errors.NotConvergent, even when the program never spelled the class's name.
_EXPORTS.publish("_errors")
_EXPORTS.publish("certificate._errors")
