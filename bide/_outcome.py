"""`Outcome`: what really happened to a side-effect call whose result was lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ._canonical import canonical_json
from ._errors import ConfigError

__all__ = ["Outcome"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The outcome of a call, as established by a person or a reconciler from the system of record.

    - ``Outcome.succeeded(result)``: the effect happened; `result` (JSON) is what the model sees.
    - ``Outcome.failed(message)``: the effect did not happen and should not be retried; the model sees an
      error result with `message`.
    - ``Outcome.not_started()``: the effect did not happen; the next run calls the tool again.

    `evidence` (JSON: a provider id, a ticket, a person) is journaled with the resolution.
    """

    kind: Literal["succeeded", "failed", "not_started"]
    result: Any = None
    evidence: Any = None

    def __post_init__(self) -> None:
        if self.kind not in ("succeeded", "failed", "not_started"):
            raise ConfigError(f"Outcome kind must be succeeded, failed or not_started, got {self.kind!r}")
        canonical_json(self.result)
        canonical_json(self.evidence)

    @classmethod
    def succeeded(cls, result: Any = None, *, evidence: Any = None) -> Outcome:
        """The effect happened; `result` is recorded as the tool's result."""
        return cls("succeeded", result, evidence)

    @classmethod
    def failed(cls, message: str, *, evidence: Any = None) -> Outcome:
        """The effect did not happen and must not be retried; the model sees `message` as an error."""
        return cls("failed", str(message), evidence)

    @classmethod
    def not_started(cls, *, evidence: Any = None) -> Outcome:
        """The effect did not happen; the next run of the run id calls the tool again."""
        return cls("not_started", None, evidence)
