"""Journal records: their types, keys and canonical bytes.

Every record is a JSON object with `kind`, `key` (equal to its storage key) and `salt` (32 random bytes,
base64), encoded with `canonical_json`. The stored bytes are exactly those bytes and are never rewritten,
so an audit log can commit to them. Keys of one run::

    @journal                     header: {"kind":"header","format":"bide.journal/1"}; always first
    run:start                    input and entry point, written with the first turn
    model:<n>                    the n-th assistant turn (n from 0)
    attempt:<call>:<gen>         side-effect attempt marker with a random claim id (gen 0, 1, ...)
    not-started:<call>:<gen>     proof that attempt <gen> never called the tool (voids it)
    result:<call>                the outcome of a call (tool output, error, or a resolution)
    pause:<call>                 the call is waiting for a gate's approval
    approval:...                 reserved for approval gates (free-form `gate` records)
    run:end                      the final answer; the first end record is the run's end
    seg:<k>                      a conversation thread's k-th user message (k from 1; message 0 is in
                                 run:start), written with the segment's first turn
    seg:<k>:end                  the answer to a thread's k-th message (a thread's run:end closes it)
    retry:<n>                    model turn n's final answer failed output validation: the error the model
                                 is shown, written with the turn

Records are slotted dataclasses, validated by pydantic at the boundary: `decode_record` checks every
stored record against its type (unknown fields ignored), and `encode_record` writes canonical bytes.
Inside the process they are plain dataclasses because thousands of live runs each hold several of them, and
a slotted dataclass is one object for the garbage collector where a pydantic model is three. They are values:
never change one after it is made (records are cached and shared; use `dataclasses.replace`). They are not
declared frozen only because a frozen dataclass is built about four times slower, on every journal write.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _s
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from ._canonical import canonical_json, json_text, known_json_text, new_salt
from ._errors import RecordDamaged, StoreError
from ._messages import AssistantMessage, ToolCall, Usage

__all__ = [
    "CANCEL_KEY",
    "FORMAT",
    "HEADER_KEY",
    "RESERVED_GATE_PREFIX",
    "Attempt",
    "Cancel",
    "End",
    "GateRecord",
    "Header",
    "ModelTurn",
    "NotStarted",
    "OutputRetry",
    "Pause",
    "Record",
    "Segment",
    "Start",
    "Timer",
    "ToolResult",
    "attempt_key",
    "damage_in_words",
    "decode_record",
    "encode_new_turn",
    "encode_record",
    "model_key",
    "not_started_key",
    "pause_key",
    "result_key",
    "retry_key",
    "segment_end_key",
    "segment_key",
    "timer_key",
]

FORMAT = "bide.journal/1"
HEADER_KEY = "@journal"
START_KEY = "run:start"
END_KEY = "run:end"
CANCEL_KEY = "run:cancel"
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


def timer_key(call_id: str) -> str:
    return f"timer:{call_id}"


def segment_key(index: int) -> str:
    return f"seg:{index}"


def segment_end_key(index: int) -> str:
    return f"seg:{index}:end"


def retry_key(turn: int) -> str:
    return f"retry:{turn}"


@dataclass(slots=True, kw_only=True)
class _Record:
    key: str
    salt: str = field(default_factory=new_salt)


@dataclass(slots=True, kw_only=True)
class Header(_Record):
    """First record of every run: the journal format it is written in."""

    kind: Literal["header"] = "header"
    format: str = FORMAT


@dataclass(slots=True, kw_only=True)
class Start(_Record):
    """The run's input and entry point; a later drive with other values is refused."""

    kind: Literal["start"] = "start"
    entry: str
    input: str


@dataclass(slots=True, kw_only=True)
class ModelTurn(_Record):
    """One assistant turn as the model produced it (with bide's call ids filled in), with the token `usage`
    and `finish_reason` the provider reported in its message (journals written before they existed read
    back as None and "")."""

    kind: Literal["model_turn"] = "model_turn"
    turn: int
    message: AssistantMessage
    model: str = ""


@dataclass(slots=True, kw_only=True)
class Attempt(_Record):
    """Written before a side effect is called. Only the driver whose claim is stored may call the tool.

    `by` is "driver" for a drive and "resolver" for `resolve_halt`/reconcilers. Times are Unix milliseconds
    from the writer's clock; `deadline_ms` is when the call is over at the latest (its timeout), and
    `clock_skew_ms` how far the writer's clock may be off (its `clock_skew`): whoever decides the call once
    it is over waits at least that long past the deadline (see `settle_margin`). Markers written before it
    existed read back as 0.
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
    clock_skew_ms: int = 0

    def settle_margin(self, clock_skew: float) -> float:
        """The seconds past `deadline_ms` a decider whose own margin is `clock_skew` waits before it takes
        the call as over: the larger of the two margins. A driver's clock behind the decider's by up to its
        own margin may still be calling the tool until then (a person resolving at the default margin, or
        an agent configured with a smaller one, would otherwise decide a call still in flight)."""
        return max(clock_skew, self.clock_skew_ms / 1000)


@dataclass(slots=True, kw_only=True)
class NotStarted(_Record):
    """Proof that attempt `gen` (holding `claim`) never called the tool; the next drive may claim gen+1."""

    kind: Literal["not_started"] = "not_started"
    call_id: str
    gen: int
    claim: str
    reason: str


@dataclass(slots=True, kw_only=True)
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


@dataclass(slots=True, kw_only=True)
class Pause(_Record):
    """The call waits for approval; the run's status is awaiting_approval until a drive gets past it."""

    kind: Literal["pause"] = "pause"
    call_id: str
    tool: str
    reason: str


@dataclass(slots=True, kw_only=True)
class GateRecord(_Record):
    """A free-form record written by an approval gate under the reserved `approval:` prefix."""

    kind: Literal["gate"] = "gate"
    data: Any = None


@dataclass(slots=True, kw_only=True)
class Timer(_Record):
    """A durable timer set by a timer tool's call: the run sleeps until `wake_at_ms` (Unix ms), and a
    resumed run waits only for what is left."""

    kind: Literal["timer"] = "timer"
    call_id: str
    wake_at_ms: int


@dataclass(slots=True, kw_only=True)
class Cancel(_Record):
    """A durable request to cancel the run, honoured by its drive at the next turn boundary."""

    kind: Literal["cancel"] = "cancel"
    reason: str = ""
    requested_at_ms: int = 0


@dataclass(slots=True, kw_only=True)
class Segment(_Record):
    """A conversation thread's next user message (`index` from 1; message 0 is the run's start input),
    answered from model turn `turn` on."""

    kind: Literal["segment"] = "segment"
    index: int
    input: str
    turn: int


@dataclass(slots=True, kw_only=True)
class OutputRetry(_Record):
    """Model turn `turn` gave a final answer that failed the agent's output validation; `error` is what the
    model was told (as a user message) before it was asked again."""

    kind: Literal["output_retry"] = "output_retry"
    turn: int
    error: str


@dataclass(slots=True, kw_only=True)
class End(_Record):
    """The end of a run (key run:end) or of a thread's segment (seg:<k>:end): its final answer, the answer
    saying it was cancelled (`status` "cancelled"), or why its output never validated ("failed")."""

    kind: Literal["end"] = "end"
    status: Literal["completed", "cancelled", "failed"] = "completed"
    answer: str


Record = (
    Header
    | Start
    | ModelTurn
    | Attempt
    | NotStarted
    | ToolResult
    | Pause
    | GateRecord
    | Timer
    | Cancel
    | End
    | Segment
    | OutputRetry
)
_ADAPTER: TypeAdapter[Record] = TypeAdapter(Annotated[Record, Field(discriminator="kind")])


def encode_record(record: Record) -> bytes:
    """The canonical bytes of a record (what the store keeps and the audit log commits to)."""
    last = _LAST_TURN
    if last[0] is record:
        return last[1]
    fast = _FAST.get(type(record))
    if fast is not None:
        return fast(record).encode("utf-8")
    return canonical_json(as_json(record))


def encode_new_turn(record: ModelTurn) -> bytes:
    """`encode_record` of a turn the model just produced, checked: raises ValueError, TypeError, UnicodeError
    or RecursionError when something the model wrote has no JSON form (a lone surrogate, NaN or an
    infinity, a value that is not JSON), where `encode_record` would write null for NaN or pydantic's form
    of a foreign value. The bytes are kept for the write that follows (see `_LAST_TURN`)."""
    global _LAST_TURN
    m = record.message
    if type(record) is ModelTurn and type(m) is AssistantMessage:
        for c in m.tool_calls:
            args = c.arguments
            if type(args) is dict and _flat(args):
                for v in args.values():  # `_any` would write NaN or an infinity as null
                    if type(v) is float and not math.isfinite(v):
                        raise ValueError(f"Out of range float values are not JSON compliant: {v!r}")
            elif type(args) is not str:
                json_text(args)  # a value that is not JSON raises
        if m.blocks:
            json_text(m.blocks)  # `_any` would write NaN or an infinity as null
        data = encode_record(record)  # a lone surrogate anywhere raises here
    else:
        json_text(
            [m.content, m.finish_reason, [[c.id, c.name, c.arguments] for c in m.tool_calls], m.blocks]
        )
        data = encode_record(record)
    _LAST_TURN = (record, data)
    return data


# The last turn `encode_new_turn` checked and its bytes: the turn is journaled right after (nothing is awaited
# between them in the common case), and `encode_record` answers it from here instead of encoding it again.
# One tuple, replaced whole: readers in other threads see a record with its own bytes. Records are values,
# never changed after they are made, so the bytes stay theirs.
_LAST_TURN: tuple[object, bytes] = (None, b"")


def as_json(record: Record) -> Any:
    """The record as a JSON value (what `encode_record` encodes canonically)."""
    return _ADAPTER.dump_python(record, mode="json")


# Direct encoders for the record kinds every run writes. They produce exactly the bytes of the generic path
# above (canonical_json of as_json: keys sorted, compact, UTF-8; proven by
# tests/bide/test_bide_encoding.py) without building the intermediate dicts. Fields declared `Any` go
# through pydantic's serializer with as_json's settings; strings through the encoder canonical_json uses
# (`_s`: json's own, no ASCII escaping).


def _any(value: Any) -> str:
    t = type(value)
    if t is str:
        return _s(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    known = known_json_text(value)  # a tool's result, encoded when it was checked
    if known is not None:
        return known
    if t is dict and _flat(value):
        # A flat object of string keys and JSON scalars (what tool arguments usually are) is encoded as is.
        # Anything else goes through pydantic first: it converts other types (models, dates, bytes, NaN),
        # and turns non-string keys into strings before they are sorted.
        try:
            return json_text(value)
        except ValueError:  # NaN or an infinity: pydantic makes it null
            pass
    return canonical_json(to_jsonable_python(value, inf_nan_mode="null")).decode("utf-8")


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _flat(value: dict[Any, Any]) -> bool:
    for k, v in value.items():  # noqa: SIM110 (a loop is cheaper than all() over a generator here)
        if type(k) is not str or type(v) not in _SCALARS:
            return False
    return True


def _opt(value: str | None) -> str:
    return "null" if value is None else _s(value)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _header(r: Any) -> str:
    return f'{{"format":{_s(r.format)},"key":{_s(r.key)},"kind":"header","salt":{_s(r.salt)}}}'


def _start(r: Any) -> str:
    return (
        f'{{"entry":{_s(r.entry)},"input":{_s(r.input)},"key":{_s(r.key)},"kind":"start",'
        f'"salt":{_s(r.salt)}}}'
    )


def _tool_call(c: Any) -> str:
    return (
        f'{{"arguments":{_any(c.arguments)},"call_id":{_s(c.call_id)},"id":{_s(c.id)},"name":{_s(c.name)}}}'
    )


def _model_turn(r: Any) -> str:
    m = r.message
    if type(m) is not AssistantMessage:
        # Subclasses serialize as the declared types in the generic path; leave those to it.
        return canonical_json(as_json(r)).decode("utf-8")
    parts = []
    for c in m.tool_calls:  # a loop, not any() over a generator: this runs for every turn
        if type(c) is not ToolCall:
            return canonical_json(as_json(r)).decode("utf-8")  # a subclass: as above
        parts.append(_tool_call(c))
    calls = ",".join(parts)
    u = m.usage
    if u is None:
        usage = "null"
    elif type(u) is Usage and type(u.input_tokens) is int and type(u.output_tokens) is int:
        usage = (
            f'{{"input_tokens":{int.__repr__(u.input_tokens)},'
            f'"output_tokens":{int.__repr__(u.output_tokens)}}}'
        )
    else:  # anything else is left to the generic path
        return canonical_json(as_json(r)).decode("utf-8")
    if type(m.finish_reason) is not str or type(m.blocks) is not list:
        return canonical_json(as_json(r)).decode("utf-8")
    blocks = _any(m.blocks) if m.blocks else "[]"
    return (
        f'{{"key":{_s(r.key)},"kind":"model_turn","message":{{"blocks":{blocks},"content":{_s(m.content)},'
        f'"finish_reason":{_s(m.finish_reason)},"role":{_s(m.role)},"tool_calls":[{calls}],'
        f'"usage":{usage}}},"model":{_s(r.model)},"salt":{_s(r.salt)},"turn":{int.__repr__(r.turn)}}}'
    )


def _attempt(r: Any) -> str:
    return (
        f'{{"arguments":{_any(r.arguments)},"attempted_at_ms":{int.__repr__(r.attempted_at_ms)},'
        f'"by":{_s(r.by)},"call_id":{_s(r.call_id)},"claim":{_s(r.claim)},'
        f'"clock_skew_ms":{int.__repr__(r.clock_skew_ms)},'
        f'"deadline_ms":{int.__repr__(r.deadline_ms)},"gen":{int.__repr__(r.gen)},"key":{_s(r.key)},'
        f'"kind":"attempt","salt":{_s(r.salt)},"tool":{_s(r.tool)}}}'
    )


def _tool_result(r: Any) -> str:
    return (
        f'{{"approval":{_any(r.approval)},"call_id":{_s(r.call_id)},"evidence":{_any(r.evidence)},'
        f'"idempotency_key":{_opt(r.idempotency_key)},"is_error":{_bool(r.is_error)},"key":{_s(r.key)},'
        f'"kind":"tool_result","reconciled":{_bool(r.reconciled)},"result":{_any(r.result)},'
        f'"safety":{_s(r.safety)},"salt":{_s(r.salt)},"tool":{_s(r.tool)}}}'
    )


def _end(r: Any) -> str:
    return (
        f'{{"answer":{_s(r.answer)},"key":{_s(r.key)},"kind":"end","salt":{_s(r.salt)},'
        f'"status":{_s(r.status)}}}'
    )


_FAST: dict[type, Callable[[Any], str]] = {
    Header: _header,
    Start: _start,
    ModelTurn: _model_turn,
    Attempt: _attempt,
    ToolResult: _tool_result,
    End: _end,
}


def decode_record(key: str, data: bytes) -> Record:
    """Decode stored bytes; refuses bytes that are not a record or whose `key` is not their storage key."""
    try:
        record = _ADAPTER.validate_python(json.loads(data))
    except (ValueError, ValidationError) as exc:
        raise RecordDamaged(f"journal record {key!r} cannot be decoded: {exc}", key=key) from exc
    except RecursionError as exc:  # JSON nested deeper than the interpreter decodes: bide writes none such
        why = "it is nested too deeply"
        raise RecordDamaged(f"journal record {key!r} cannot be decoded: {why}", key=key) from exc
    if record.key != key:
        raise RecordDamaged(
            f"journal record stored under {key!r} says it is {record.key!r}; the store is corrupt", key=key
        )
    return record


def damage_in_words(exc: StoreError) -> str:
    """What is wrong with a record `decode_record` refused (`exc`, or a `StoreError` caused by it), in a
    few words: not the decoder's multi-line report."""
    cause = exc.__cause__
    while isinstance(cause, StoreError) and cause.__cause__ is not None:  # an unreadable header's cause
        cause = cause.__cause__
    if isinstance(cause, ValidationError):
        first = cause.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        more = f" (and {cause.error_count() - 1} more)" if cause.error_count() > 1 else ""
        if first.get("type") == "union_tag_not_found":
            return f"it has no 'kind' field{more}"
        if first.get("type") == "union_tag_invalid":
            got = first.get("input")
            kind = got.get("kind") if isinstance(got, dict) else None
            return f"its kind {kind!r} is not a kind of record bide writes{more}"
        return f"{where + ': ' if where else ''}{first.get('msg', 'invalid')}{more}"
    if isinstance(cause, ValueError):
        return "it is not JSON"
    if isinstance(cause, RecursionError):
        return "it is nested too deeply"
    return str(exc).splitlines()[0]
