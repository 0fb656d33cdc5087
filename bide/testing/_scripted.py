"""`ScriptedModel`: an offline model that plays a script of turns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError, ModelError
from .._messages import AssistantMessage, ModelRequest, TextDelta, ToolCall

__all__ = ["Call", "Fail", "ScriptedModel", "StreamingScriptedModel", "Turn", "call", "reply"]


@dataclass(frozen=True, slots=True)
class Call:
    """One scripted tool call. `arguments` may be a dict or raw text (to script malformed arguments)."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Turn:
    """One scripted assistant turn: text and tool calls (no calls means a final answer)."""

    text: str = ""
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True, slots=True)
class Fail:
    """A scripted model failure: raised once, the first time the following turn is asked for."""

    error: BaseException


def reply(text: str) -> Turn:
    """A final-answer turn."""
    return Turn(text=text)


def call(name: str, /, **arguments: Any) -> Turn:
    """A turn with one tool call."""
    return Turn(calls=(Call(name, arguments),))


Script = Turn | Fail | Callable[[ModelRequest], Turn]


class ScriptedModel:
    """A model that answers turn n with the n-th `Turn` of its script (n = assistant messages seen so far).

    A `Fail` entry raises its error once, the first time this object is asked for the turn after it. A
    callable entry builds its turn from the request. `requests` lists every request received, so tests can
    count model calls (`record=False` keeps none, for long benchmarks). `delay` (seconds) makes each call
    sleep, to model a slow model.
    """

    def __init__(
        self, script: Sequence[Script], *, name: str = "scripted", delay: float = 0.0, record: bool = True
    ) -> None:
        self.name = name
        self.delay = delay
        self.record = record
        self.requests: list[ModelRequest] = []
        self._turns: list[Turn | Callable[[ModelRequest], Turn]] = []
        self._fails: dict[int, list[BaseException]] = {}
        for item in script:
            if isinstance(item, Fail):
                self._fails.setdefault(len(self._turns), []).append(item.error)
            elif isinstance(item, Turn) or callable(item):
                self._turns.append(item)
            else:
                raise ConfigError(f"script entries must be Turn, Fail or a callable, got {item!r}")

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        if self.record:
            self.requests.append(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        index = 0
        for m in request.messages:
            if m.role == "assistant":
                index += 1
        pending = self._fails.get(index)
        if pending:
            raise pending.pop(0)
        if index >= len(self._turns):
            raise ModelError(
                f"scripted model has {len(self._turns)} turns and was asked for turn {index + 1}"
            )
        item = self._turns[index]
        turn = item if isinstance(item, Turn) else item(request)
        calls: list[ToolCall] = []
        for i, c in enumerate(turn.calls):  # a loop, not a comprehension: no cell kept alive by the sleep
            calls.append(ToolCall(id=f"call_{index}_{i}", name=c.name, arguments=c.arguments))
        return AssistantMessage(content=turn.text, tool_calls=calls)


class StreamingScriptedModel(ScriptedModel):
    """A `ScriptedModel` that also streams (a `bide.StreamingModel`): `stream` yields each turn's text in
    `TextDelta`s of `chunk` characters, then the whole turn."""

    def __init__(self, script: Sequence[Script], *, chunk: int = 8, **options: Any) -> None:
        if not (isinstance(chunk, int) and chunk > 0):
            raise ConfigError("chunk must be a positive number of characters")
        super().__init__(script, **options)
        self.chunk = chunk

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | AssistantMessage]:
        message = await self.complete(request)
        text = message.content
        for i in range(0, len(text), self.chunk):
            yield TextDelta(text=text[i : i + self.chunk])
        yield message
