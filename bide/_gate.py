"""The approval-gate hook: a tool may carry a gate consulted before each of its calls.

The agent consults `gate.check(request)` after the model's arguments validated and before anything else
(before the attempt marker of a side effect, before any call of a retry-safe tool). The answer:

- `Approved(evidence)`: the call proceeds; `evidence` (JSON) is journaled in the call's result record.
- `Denied(reason)`: the tool is not called; the model gets an error result saying the call was denied.
- `Pending(reason)`: the run pauses durably (a `pause:<call>` record; status "awaiting_approval") and
  `run` raises `bide.ApprovalPending`. The next `run` of the run id consults the gate again.

A gate keeps its own state in the run's journal, through `request.journal`, under keys starting with
``approval:`` (the only keys it may write). Records it writes are journal records like any other (salted,
canonical, append-only), so the audit log covers them. A gate may be consulted many times for one call
(once per drive until it answers approved or denied), so `check` must be a pure function of the journal.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._canonical import canonical_json
from ._errors import ConfigError
from ._records import HEADER_KEY, RESERVED_GATE_PREFIX, GateRecord

if TYPE_CHECKING:
    from ._journal import Journal

__all__ = ["Approved", "Denied", "Gate", "GateDecision", "GateJournal", "GateRequest", "Pending"]


@dataclass(frozen=True, slots=True)
class Approved:
    """The call may proceed. `evidence` (any JSON value) is journaled with the call's result."""

    evidence: Any = None


@dataclass(frozen=True, slots=True)
class Denied:
    """The call must not run; the model sees "tool call denied: <reason>" as an error result."""

    reason: str
    evidence: Any = None


@dataclass(frozen=True, slots=True)
class Pending:
    """No decision yet: the run pauses with status awaiting_approval."""

    reason: str = "awaiting approval"


GateDecision = Approved | Denied | Pending


class GateJournal:
    """A gate's window on the run's journal: read any record's data, write free-form records under
    ``approval:``. Writes are insert-if-absent: `put` returns the data stored under the key (another
    writer's, if it got there first) and whether this call wrote it."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    @property
    def run_id(self) -> str:
        return self._journal.run_id

    def header_bytes(self) -> bytes | None:
        """The stored bytes of the run's header record (its random salt names this journal and no other),
        or None before the run has one."""
        entry = self._journal.entry(HEADER_KEY)
        return None if entry is None else entry.data

    def keys(self, prefix: str = RESERVED_GATE_PREFIX) -> list[str]:
        """Keys of the loaded journal starting with `prefix`, in journal order."""
        return [r.key for r in self._journal.records() if r.key.startswith(prefix)]

    def get(self, key: str) -> Any:
        """The `data` of the gate record under `key`, or None if there is none."""
        rec = self._journal.get(key)
        return rec.data if isinstance(rec, GateRecord) else None

    async def refresh(self) -> None:
        """Read records written since the journal was loaded (for example, approvals from another process)."""
        await self._journal.aload()

    async def put(self, key: str, data: Any) -> tuple[Any, bool]:
        """Write `data` under `key` (which must start with ``approval:``) unless the key exists."""
        _check_key(key)
        canonical_json(data)
        stored, inserted = await self._journal.awrite_one(GateRecord(key=key, data=data))
        return (stored.data if isinstance(stored, GateRecord) else None), inserted

    async def put_all(self, items: list[tuple[str, Any]]) -> bool:
        """Write every (key, data) in one transaction, or none of them if any key exists already (then the
        stored records of the existing keys can be read with `get`; `refresh` reads everything else).
        True when all were written. This is how a gate writes conditionally: include a key whose presence
        means the state it read is stale."""
        for key, data in items:
            _check_key(key)
            canonical_json(data)
        return await self._journal.awrite_exclusive([GateRecord(key=k, data=d) for k, d in items])


def _check_key(key: str) -> None:
    if not key.startswith(RESERVED_GATE_PREFIX):
        raise ConfigError(f"a gate may only write keys starting with {RESERVED_GATE_PREFIX!r}, got {key!r}")


@dataclass(frozen=True, slots=True)
class GateRequest:
    """What a gate is asked about: one call, with its arguments in canonical JSON and their SHA-256 digest
    (what an approver signs over), and the run's journal."""

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    arguments_json: bytes
    arguments_digest: str
    journal: GateJournal

    @staticmethod
    def digest_of(arguments: dict[str, Any]) -> tuple[bytes, str]:
        """Canonical JSON bytes of arguments and their SHA-256 hex digest."""
        data = canonical_json(arguments)
        return data, hashlib.sha256(data).hexdigest()


@runtime_checkable
class Gate(Protocol):
    """An approval gate. `check` may be a plain or an async method."""

    def check(self, request: GateRequest) -> GateDecision | Any:
        """Approved, Denied or Pending for this call (may return an awaitable of one)."""
        ...
