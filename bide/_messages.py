"""Conversation messages and the model port.

A model sees a list of messages and the tool specs and answers with one assistant turn. Messages are pydantic
models because assistant turns are journaled verbatim and rebuilt on resume.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AssistantMessage",
    "Message",
    "Model",
    "ModelRequest",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "ToolSpec",
    "UserMessage",
]


class ToolCall(BaseModel):
    """One tool call the model asked for.

    `id` is the provider's identifier (echoed back with the result); `call_id` is bide's own id for the call
    (`c<turn>.<index>`, unique in the run), used in journal keys, halts and `resolve_halt`. `arguments` is the
    decoded JSON object, or the raw text when the model sent something that is not a JSON object.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any] | str
    call_id: str = ""


class SystemMessage(BaseModel):
    """The system prompt (taken from the live Agent on every drive, never journaled as input)."""

    model_config = ConfigDict(frozen=True)
    role: Literal["system"] = "system"
    content: str


class UserMessage(BaseModel):
    """The run's input."""

    model_config = ConfigDict(frozen=True)
    role: Literal["user"] = "user"
    content: str


class AssistantMessage(BaseModel):
    """One model turn: optional text and zero or more tool calls. No tool calls means a final answer."""

    model_config = ConfigDict(frozen=True)
    role: Literal["assistant"] = "assistant"
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ToolMessage(BaseModel):
    """The result of one tool call as the model sees it."""

    model_config = ConfigDict(frozen=True)
    role: Literal["tool"] = "tool"
    tool_call_id: str
    name: str
    content: str
    is_error: bool = False


Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage


class ToolSpec(BaseModel):
    """What the model is told about a tool: name, description and JSON schema of its arguments."""

    model_config = ConfigDict(frozen=True)
    name: str
    description: str
    parameters: dict[str, Any]


class ModelRequest(BaseModel):
    """Everything a model needs for one turn. `turn` counts from 0; `run_id` is for logging and scripting."""

    model_config = ConfigDict(frozen=True)
    run_id: str
    turn: int
    messages: list[Message]
    tools: list[ToolSpec]


@runtime_checkable
class Model(Protocol):
    """The model port: one async method producing the next assistant turn.

    Raise `bide.ModelError` for failures. The agent journals the returned message before acting on it, so a
    model is called at most once per completed turn; a turn that raised is asked again on the next drive.
    """

    name: str

    async def complete(self, request: ModelRequest) -> AssistantMessage: ...
