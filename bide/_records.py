"""Journal records: pydantic models, their keys, and their canonical bytes.

Every record is a JSON object with `kind`, `key` (equal to its storage key) and `salt` (32 random bytes,
base64), encoded with `canonical_json`. The stored bytes are exactly those bytes and are never rewritten,
so an audit log can commit to them. Keys of one run::

    @journal                     header: {"kind":"header","format":"bide.journal/1"}; always first
    run:start                    input and entry point, pinned by the first drive
    model:<n>                    the n-th assistant turn (n from 0)
    attempt:<call>:<gen>         side-effect attempt marker with a random claim id (gen 0, 1, ...)
    not-started:<call>:<gen>     proof that attempt <gen> never called the tool (voids it)
    result:<call>                the outcome of a call (tool output, error, or a resolution)
    pause:<call>                 the call is waiting for a gate's approval
    approval:...                 reserved for approval gates (free-form `gate` records)
    run:end                      the final answer; the first end record is the run's end
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ._canonical import canonical_json, new_salt
from ._errors import StoreError
from ._messages import AssistantMessage

__all__ = [
    "FORMAT",
    "HEADER_KEY",
    "RESERVED_GATE_PREFIX",
    "Attempt",
    "End",
    "GateRecord",
    "Header",
    "ModelTurn",
    "NotStarted",
    "Pause",
    "Record",
    "Start",
    "ToolResult",
    "attempt_key",
    "decode_record",
    "encode_record",
    "model_key",
    "not_started_key",
    "pause_key",
    "result_key",
]

FORMAT = "bide.journal/1"
HEADER_KEY = "@journal"
START_KEY = "run:start"
END_KEY = "run:end"
RESERVED_GATE_PREFIX = "approval:"


def model_key(turn: int) -> str:
    return f"model:{turn}"


def attempt_key(call_id: str, gen: int) -> str:
    return f"attempt:{call_id}:{gen}"


def not_started_key(call_id: str, gen: int) -> str:
    return f"not-started:{call_id}:{gen}"


def result_key(call_id: str) -> str:
    return f"result:{call_id}"


def pause_key(call_id: str) -> str:
    return f"pause:{call_id}"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    key: str
    salt: str = Field(default_factory=new_salt)


class Header(_Record):
    """First record of every run: the journal format it is written in."""

    kind: Literal["header"] = "header"
    format: str = FORMAT


class Start(_Record):
    """The run's input and entry point; a later drive with other values is refused."""

    kind: Literal["start"] = "start"
    entry: str
    input: str


class ModelTurn(_Record):
    """One assistant turn as the model produced it (with bide's call ids filled in)."""

    kind: Literal["model_turn"] = "model_turn"
    turn: int
    message: AssistantMessage
    model: str = ""


class Attempt(_Record):
    """Written before a side effect is called. Only the driver whose claim is stored may call the tool.

    `by` is "driver" for a drive and "resolver" for `resolve_halt`/reconcilers. Times are Unix milliseconds
    from the writer's clock; `deadline_ms` is when the call is over at the latest (its timeout).
    """

    kind: Literal["attempt"] = "attempt"
    call_id: str
    tool: str
    arguments: dict[str, Any]
    gen: int
    claim: str
    attempted_at_ms: int
    deadline_ms: int
    by: Literal["driver", "resolver"] = "driver"


class NotStarted(_Record):
    """Proof that attempt `gen` (holding `claim`) never called the tool; the next drive may claim gen+1."""

    kind: Literal["not_started"] = "not_started"
    call_id: str
    gen: int
    claim: str
    reason: str


class ToolResult(_Record):
    """The outcome of a call, as the model will see it.

    `safety` is the safety the call ran under. `reconciled` marks outcomes recorded by `resolve_halt` or a
    reconciler, with their `evidence`. `approval` holds the gate's evidence when a gate approved the call.
    """

    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    tool: str
    result: Any = None
    is_error: bool = False
    safety: str
    idempotency_key: str | None = None
    approval: Any = None
    reconciled: bool = False
    evidence: Any = None


class Pause(_Record):
    """The call waits for approval; the run's status is awaiting_approval until a drive gets past it."""

    kind: Literal["pause"] = "pause"
    call_id: str
    tool: str
    reason: str


class GateRecord(_Record):
    """A free-form record written by an approval gate under the reserved `approval:` prefix."""

    kind: Literal["gate"] = "gate"
    data: Any = None


class End(_Record):
    """The run's end: its final answer."""

    kind: Literal["end"] = "end"
    status: Literal["completed"] = "completed"
    answer: str


Record = Header | Start | ModelTurn | Attempt | NotStarted | ToolResult | Pause | GateRecord | End
_ADAPTER: TypeAdapter[Record] = TypeAdapter(Annotated[Record, Field(discriminator="kind")])


def encode_record(record: Record) -> bytes:
    """The canonical bytes of a record (what the store keeps and the audit log commits to)."""
    return canonical_json(record.model_dump(mode="json"))


def decode_record(key: str, data: bytes) -> Record:
    """Decode stored bytes; refuses bytes that are not a record or whose `key` is not their storage key."""
    try:
        record = _ADAPTER.validate_python(json.loads(data))
    except (ValueError, ValidationError) as exc:
        raise StoreError(f"journal record {key!r} cannot be decoded: {exc}") from exc
    if record.key != key:
        raise StoreError(
            f"journal record stored under {key!r} says it is {record.key!r}; the store is corrupt"
        )
    return record
