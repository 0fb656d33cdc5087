"""The root of every error the `govern` package raises.

Each subclass says whose fault it is and what to do next; catch `GovernError` to catch them all.

    GovernError
    ├── DeclarationError        the registry is malformed (types, names, labels, ranges); fix the declaration
    │   └── RuleError           a rule misbehaved on a concrete state (callable raised, wrong type, ...)
    │       └── DomainViolation an assignment produced a value outside its variable's range
    ├── StateSpaceTooLarge      enumeration would not fit; shrink ranges or split the machine
    ├── NotConvergent           the machine does not converge; `.counterexample` shows why
    ├── OracleError             the proof-derived oracle gate refused the build (fail closed)
    │   ├── OracleUnavailable   the oracle could not be loaded or rejected its input
    │   ├── OracleRejected      the oracle ran and did not certify the tables
    │   └── OracleDisagreement  engine and oracle disagree: a bug in one of them; report it
    ├── MachineFileError        a saved machine file is unreadable, tampered with, or for another version
    ├── UnknownEvent            (also a KeyError) the machine has no event of that name
    └── ForeignState            (also a ValueError) the state belongs to another machine or is no state id
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .verify._counterexample import Counterexample

__all__ = [
    "DeclarationError",
    "DomainViolation",
    "ForeignState",
    "GovernError",
    "MachineFileError",
    "NotConvergent",
    "OracleDisagreement",
    "OracleError",
    "OracleRejected",
    "OracleUnavailable",
    "RuleError",
    "StateSpaceTooLarge",
    "UnknownEvent",
]

Value = bool | int | str


class GovernError(Exception):
    """Base class of every error raised by `govern`."""


class DeclarationError(GovernError):
    """The registry's declarations are malformed: a type error, an unknown label or name, a bad range.

    Raised while declaring (or at `build()` for what can only be seen then); fix the declaration.
    """


class RuleError(DeclarationError):
    """A rule misbehaved on a concrete state: a callable raised, returned the wrong type, or is not
    deterministic. `.state` is that state as `{variable: value}` and `.rule` names the rule."""

    def __init__(self, message: str, *, rule: str, state: Mapping[str, Value]) -> None:
        super().__init__(f"{message}\n  rule:  {rule}\n  state: {_render(state)}")
        self.rule = rule
        self.state = dict(state)


class DomainViolation(RuleError):
    """An assignment produced a value outside its variable's declared range (never clamped).

    `.variable` and `.value` say what was written; widen the range or guard the rule."""

    def __init__(self, *, rule: str, state: Mapping[str, Value], variable: str, value: int | str) -> None:
        super().__init__(
            f"domain violation: {rule} assigns {variable} = {value!r}, outside its declared range; "
            "guard the rule or widen the variable's range (values are never clamped)",
            rule=rule,
            state=state,
        )
        self.variable = variable
        self.value = value


class StateSpaceTooLarge(GovernError):
    """The state space cannot be enumerated here; raised before anything large is allocated.

    `.states` is the number of states, `.bytes_needed` the estimated memory for the build."""

    def __init__(self, message: str, *, states: int, bytes_needed: int) -> None:
        super().__init__(message)
        self.states = states
        self.bytes_needed = bytes_needed


class NotConvergent(GovernError):
    """The machine does not converge. `.counterexample` is a readable witness (a repair cycle or two
    event orders that reach different states); `str()` renders it."""

    def __init__(self, counterexample: Counterexample) -> None:
        super().__init__(counterexample.render())
        self.counterexample = counterexample


class OracleError(GovernError):
    """The proof-derived oracle gate did not let the build through; no machine is produced."""


class OracleUnavailable(OracleError):
    """The oracle could not be imported or refused its input; the build fails closed."""


class OracleRejected(OracleError):
    """The oracle ran and did not certify the tables the engine produced."""


class OracleDisagreement(OracleError):
    """The engine and the proof-derived oracle reached different results on the same tables.

    This is a bug in the engine or in the oracle's front end; please report it with the machine."""


class MachineFileError(GovernError):
    """A saved machine file cannot be loaded: unreadable, truncated, tampered with, or another format."""


class UnknownEvent(GovernError, KeyError):
    """The machine has no event of that name; the message lists the events it has."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ForeignState(GovernError, ValueError):
    """The state belongs to a different machine, or the integer is not a state id of this machine."""


def shown(value: object, *, as_repr: bool = False) -> str:
    """`str(value)` (or `repr`) for a message about a user's object, which may fail to make its own text:
    then its type is named instead, and the message is still about the user's code, not govern's."""
    try:
        return repr(value) if as_repr else str(value)
    except Exception:
        return f"(a {type(value).__name__} whose text cannot be made)"


def _render(state: Mapping[str, Value]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in state.items()) + "}"
