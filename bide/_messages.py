"""Conversation messages and the model port.

A model sees a list of messages and the tool specs and answers with one assistant turn.

Messages are slotted dataclasses, not pydantic models: every live run holds its conversation while the model
thinks, and a dataclass with slots is one object for the garbage collector where a pydantic model is three.
They are values: never change a message after it is made (one system message serves every run of an agent;
use `dataclasses.replace`). They are not declared frozen only because that makes each one about four times
slower to build. They cross the process boundary only inside journal records, which pydantic validates when
they are read back (bide._records), and a model's reply is checked when the agent receives it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "AssistantMessage",
    "Message",
    "Model",
    "ModelRequest",
    "StreamingModel",
    "SystemMessage",
    "TextDelta",
    "ToolCall",
    "ToolMessage",
    "ToolSpec",
    "Usage",
    "UserMessage",
]


# The most tool calls one model turn may hold (bide's agent refuses a turn with more, from any model,
# before any of it is journaled): enough for any real fan-out, and a turn of millions of calls from a
# broken or hostile server cannot take the memory and the journal with it.
MAX_TOOL_CALLS = 256


@dataclass(slots=True, kw_only=True)
class ToolCall:
    """One tool call the model asked for.

    `id` is the provider's identifier (echoed back with the result); `call_id` is bide's own id for the call
    (`c<turn>.<index>`, unique in the run), used in journal keys, halts and `resolve_halt`. `arguments` is the
    decoded JSON object, or the raw text when the model sent something that is not a JSON object.
    """

    id: str
    name: str
    arguments: dict[str, Any] | str
    call_id: str = ""


@dataclass(slots=True, kw_only=True)
class SystemMessage:
    """The system prompt (taken from the live Agent on every drive, never journaled as input)."""

    role: Literal["system"] = "system"
    content: str


@dataclass(slots=True, kw_only=True)
class UserMessage:
    """The run's input."""

    role: Literal["user"] = "user"
    content: str


@dataclass(slots=True, kw_only=True, frozen=True)
class Usage:
    """Tokens a model turn consumed, as the provider reported them (zero when it reported none)."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


@dataclass(slots=True, kw_only=True)
class AssistantMessage:
    """One model turn: optional text and zero or more tool calls. No tool calls means a final answer.

    `usage` and `finish_reason` are what the provider reported for the turn (None and "" when it did not).
    `blocks` is the turn's content as the provider sent it, block by block in their order, kept only when
    it held a block an adapter does not model (an Anthropic server tool's ``server_tool_use`` and
    ``web_search_tool_result``, say): JSON objects, journaled with the turn and sent back as they came on
    later turns, so the model keeps its own context. Empty otherwise: the turn is `content` and
    `tool_calls`.
    """

    role: Literal["assistant"] = "assistant"
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str = ""
    blocks: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class ToolMessage:
    """The result of one tool call as the model sees it."""

    role: Literal["tool"] = "tool"
    tool_call_id: str
    name: str
    content: str
    is_error: bool = False


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage


@dataclass(slots=True, kw_only=True)
class ToolSpec:
    """What the model is told about a tool: name, description and JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(slots=True, kw_only=True)
class ModelRequest:
    """Everything a model needs for one turn. `turn` counts from 0; `run_id` is for logging and scripting.
    `messages` is this request's own list; `tools` is shared by every request of the agent (a tuple)."""

    run_id: str
    turn: int
    messages: list[Message]
    tools: Sequence[ToolSpec]


@dataclass(slots=True, kw_only=True, frozen=True)
class TextDelta:
    """A piece of the assistant's text as a streaming model produces it (never journaled: the turn is)."""

    text: str


@runtime_checkable
class Model(Protocol):
    """The model port: one async method producing the next assistant turn.

    Raise `bide.ModelError` for failures. The agent journals the returned message before acting on it, so a
    model is called at most once per completed turn; a turn that raised is asked again on the next drive.
    """

    name: str

    async def complete(self, request: ModelRequest) -> AssistantMessage: ...


@runtime_checkable
class StreamingModel(Model, Protocol):
    """A model that can also stream a turn: `stream` yields `TextDelta`s and ends with exactly one
    `AssistantMessage`, the whole turn (the same message `complete` would return). The agent journals only
    that final message, so a replayed run is identical whether or not the turn was streamed."""

    def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | AssistantMessage]: ...
