"""`AnthropicModel`: the Anthropic Messages API (``POST /v1/messages``), over one pooled httpx client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ._errors import ConfigError, ModelError
from ._http import (
    HTTPModel,
    error_message,
    json_event,
    json_index,
    json_object,
    malformed,
    read_json,
    sse_events,
    unfinished,
)
from ._messages import AssistantMessage, ModelRequest, TextDelta, ToolCall, ToolMessage, Usage
from ._retry import RetryPolicy

if TYPE_CHECKING:
    import httpx  # imported when a client is made (bide._http): `import bide` stays light

__all__ = ["ANTHROPIC_VERSION", "AnthropicModel"]

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicModel(HTTPModel):
    """A model served by the Anthropic Messages API.

    `api_key` defaults to ``ANTHROPIC_API_KEY`` and `base_url` to ``ANTHROPIC_BASE_URL`` (else
    ``https://api.anthropic.com``); requests carry ``x-api-key`` and ``anthropic-version``. The system prompt
    goes in the request's ``system`` field, tool calls and results as ``tool_use``/``tool_result`` content
    blocks; `max_tokens` bounds each answer (the API requires it). `usage` counts input tokens with the
    cache's (``cache_creation_input_tokens`` and ``cache_read_input_tokens``); `finish_reason` is the
    ``stop_reason`` ("end_turn", "tool_use", "max_tokens", ...).

    Pooling, retries (the same statuses, 529 overloaded among them, and connection errors; ``Retry-After``
    honoured), `aclose` and
    streaming work as for `bide.OpenAIModel`.
    """

    provider = "anthropic"
    _env = "ANTHROPIC"
    _default_url = "https://api.anthropic.com"
    _example_model = "claude-sonnet-4-5"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        retry: RetryPolicy | None = None,
        temperature: float | None = None,
        extra_body: dict[str, Any] | None = None,
        anthropic_version: str = ANTHROPIC_VERSION,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits | None = None,
    ) -> None:
        self._init_http(
            model,
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            retry=retry,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            temperature=temperature,
            extra_body=extra_body,
            transport=transport,
            limits=limits,
        )
        if not (isinstance(max_tokens, int) and max_tokens > 0):
            raise ConfigError("AnthropicModel needs max_tokens, a positive number of tokens per answer")
        self.max_tokens = max_tokens
        self.anthropic_version = anthropic_version

    def _url(self) -> str:
        return f"{self.base_url}/v1/messages"

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "anthropic-version": self.anthropic_version}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (public so it can be inspected and tested)."""
        system: list[str] = []
        messages: list[dict[str, Any]] = []

        def add(role: str, blocks: list[dict[str, Any]]) -> None:
            # The API wants user and assistant turns to alternate: blocks of one role in a row are merged
            # (the results of one turn's tool calls travel in one user message).
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": role, "content": blocks})

        for m in request.messages:
            if m.role == "system":
                system.append(m.content)
            elif m.role == "user":
                add("user", [{"type": "text", "text": m.content}])
            elif m.role == "assistant":
                blocks: list[dict[str, Any]] = []
                if m.content:
                    blocks.append({"type": "text", "text": m.content})
                for c in m.tool_calls:
                    blocks.append(
                        {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)}
                    )
                add("assistant", blocks or [{"type": "text", "text": ""}])
            elif isinstance(m, ToolMessage):
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id,
                    "content": m.content,
                }
                if m.is_error:
                    block["is_error"] = True
                add("user", [block])
        body: dict[str, Any] = {"model": self.name, "max_tokens": self.max_tokens, "messages": messages}
        if system:
            body["system"] = "\n\n".join(system)
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
        return self._with_options(body)

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        return _parse(self.name, await self._post(self.body(request)))

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | AssistantMessage]:
        body = self.body(request)
        body["stream"] = True
        response = await self._open_stream(body)
        blocks: dict[int, dict[str, Any]] = {}
        usage: dict[str, Any] = {}
        finish = ""
        done = False
        try:
            async for event, data in sse_events(response, self.name):
                payload = json_event(self.name, data)
                if not isinstance(payload, dict):
                    continue
                kind = payload.get("type", event)
                if kind == "message_start":
                    usage.update(json_object(json_object(payload.get("message")).get("usage")))
                elif kind == "content_block_start":
                    start = json_object(payload.get("content_block"))
                    first_text = start.get("text")
                    blocks[json_index(self.name, payload.get("index"), len(blocks))] = {
                        "type": start.get("type"),
                        "id": start.get("id"),
                        "name": start.get("name"),
                        "text": [first_text if isinstance(first_text, str) else ""],
                        "json": [],
                    }
                elif kind == "content_block_delta":
                    index = json_index(self.name, payload.get("index"), 0)
                    block = blocks.setdefault(index, {"type": "text", "text": [], "json": []})
                    delta = json_object(payload.get("delta"))
                    if delta.get("type") == "text_delta":
                        piece = delta.get("text")
                        if not isinstance(piece, str):
                            raise malformed(self.name, f"a text delta that is not a string: {piece!r:.200}")
                        block["text"].append(delta["text"])
                        yield TextDelta(text=delta["text"])
                    elif delta.get("type") == "input_json_delta" and isinstance(
                        delta.get("partial_json"), str
                    ):
                        block["json"].append(delta["partial_json"])
                elif kind == "message_delta":
                    delta = json_object(payload.get("delta"))
                    if isinstance(delta.get("stop_reason"), str) and delta["stop_reason"]:
                        finish = delta["stop_reason"]
                    usage.update(json_object(payload.get("usage")))
                elif kind == "message_stop":
                    done = True
                    break
                elif kind == "error":
                    raise ModelError(
                        f"model {self.name!r} failed mid-stream: {error_message(data)}; nothing was "
                        "journaled, run again to retry"
                    )
        finally:
            await response.aclose()
        if not done:
            raise unfinished(self.name)
        text: list[str] = []
        calls: list[ToolCall] = []
        for _, block in sorted(blocks.items()):
            if block["type"] == "text":
                text.extend(block["text"])
            elif block["type"] == "tool_use":
                raw = "".join(block["json"]) or "{}"
                try:
                    args: dict[str, Any] | str = read_json(raw)
                except ValueError:
                    args = raw
                calls.append(
                    ToolCall(
                        id=str(block.get("id") or f"toolu_{len(calls)}"),
                        name=str(block.get("name") or ""),
                        arguments=args if isinstance(args, dict) else raw,
                    )
                )
        yield AssistantMessage(
            content="".join(text), tool_calls=calls, usage=_usage(usage), finish_reason=finish
        )


def _input(arguments: dict[str, Any] | str) -> dict[str, Any]:
    """A tool call's arguments as the API's `input` object (raw text that is not one goes under "raw")."""
    if isinstance(arguments, dict):
        return arguments
    try:
        decoded = read_json(arguments)
    except ValueError:
        decoded = None
    return decoded if isinstance(decoded, dict) else {"raw": arguments}


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    counts = [raw.get(k) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
    out = raw.get("output_tokens")
    if not isinstance(out, int) or isinstance(out, bool):
        return None
    inp = sum(c for c in counts if isinstance(c, int) and not isinstance(c, bool))
    return Usage(input_tokens=max(inp, 0), output_tokens=max(out, 0))


def _parse(name: str, data: Any) -> AssistantMessage:
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise ModelError(f"model {name!r} returned a response without a content list")
    text: list[str] = []
    calls: list[ToolCall] = []
    for block in data["content"]:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            if not isinstance(block.get("text"), str):
                # Not the API's shape: skipping it would journal an answer the model did not give.
                raise malformed(name, f"a text block whose text is not a string: {block.get('text')!r:.200}")
            text.append(block["text"])
        elif block.get("type") == "tool_use":
            args = block.get("input")
            calls.append(
                ToolCall(
                    id=str(block.get("id") or f"toolu_{len(calls)}"),
                    name=str(block.get("name") or ""),
                    arguments=args if isinstance(args, dict) else json.dumps(args),
                )
            )
    reason = data.get("stop_reason")
    return AssistantMessage(
        content="".join(text),
        tool_calls=calls,
        usage=_usage(data.get("usage")),
        finish_reason=reason if isinstance(reason, str) else "",
    )
