"""`OpenAIModel`: any OpenAI-compatible chat-completions endpoint, over httpx."""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

import httpx

from ._errors import ConfigError, ModelError
from ._messages import AssistantMessage, ModelRequest, ToolCall, ToolMessage

__all__ = ["OpenAIModel"]

_TRANSIENT = {408, 409, 425, 429, 500, 502, 503, 504}
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class OpenAIModel:
    """A model served by an OpenAI-compatible ``/chat/completions`` endpoint.

    `api_key` defaults to ``OPENAI_API_KEY`` and `base_url` to ``OPENAI_BASE_URL`` (else
    ``https://api.openai.com/v1``). Transient failures (connection errors, timeouts, 408/409/425/429/5xx) are
    retried up to `max_retries` times with full-jitter exponential backoff from `backoff` seconds (capped at
    `max_backoff`), honouring ``Retry-After``; any other 4xx raises `ModelError` at once with the server's
    message. `timeout` bounds each HTTP request (seconds). `temperature` and extra body fields are optional.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        temperature: float | None = None,
        extra_body: dict[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not model:
            raise ConfigError("OpenAIModel needs a model name, e.g. OpenAIModel('gpt-4o-mini')")
        self.name = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip(
            "/"
        )
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        self._transport = transport

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (public so it can be inspected and tested)."""
        messages: list[dict[str, Any]] = []
        for m in request.messages:
            if m.role in ("system", "user"):
                messages.append({"role": m.role, "content": m.content})
            elif m.role == "assistant":
                item: dict[str, Any] = {"role": "assistant", "content": m.content or None}
                if m.tool_calls:
                    item["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {
                                "name": c.name,
                                "arguments": c.arguments
                                if isinstance(c.arguments, str)
                                else json.dumps(c.arguments),
                            },
                        }
                        for c in m.tool_calls
                    ]
                messages.append(item)
            elif isinstance(m, ToolMessage):
                content = f"Error: {m.content}" if m.is_error else m.content
                messages.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": content})
        body: dict[str, Any] = {"model": self.name, "messages": messages}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(self.extra_body)
        return body

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        body = self.body(request)
        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        url = f"{self.base_url}/chat/completions"
        last: str = ""
        async with httpx.AsyncClient(timeout=self.timeout, transport=self._transport) as client:
            for attempt in range(self.max_retries + 1):
                retry_after: float | None = None
                try:
                    response = await client.post(url, json=body, headers=headers)
                except httpx.TransportError as exc:  # connection refused/reset, timeouts
                    last = f"{type(exc).__name__}: {exc}"
                else:
                    if response.status_code == 200:
                        if len(response.content) > MAX_RESPONSE_BYTES:
                            raise ModelError(f"model {self.name!r}: response larger than 32 MiB")
                        return _parse(self.name, response)
                    text = response.text[:2000]
                    if response.status_code not in _TRANSIENT:
                        raise ModelError(
                            f"model {self.name!r} at {url} answered {response.status_code}: "
                            f"{_message(text)}; this is not retried (check the model name, API key "
                            "and request)",
                            status=response.status_code,
                            body=text,
                        )
                    last = f"HTTP {response.status_code}: {_message(text)}"
                    retry_after = _retry_after(response.headers.get("retry-after"))
                if attempt == self.max_retries:
                    break
                delay = random.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))
                if retry_after is not None:
                    delay = min(max(delay, retry_after), self.max_backoff)
                await asyncio.sleep(delay)
        raise ModelError(
            f"model {self.name!r} at {url} failed after {self.max_retries + 1} attempts: {last}; "
            "nothing was journaled, run again to retry"
        )


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _message(text: str) -> str:
    try:
        data = json.loads(text)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except ValueError:
        pass
    return text or "(empty body)"


def _parse(name: str, response: httpx.Response) -> AssistantMessage:
    try:
        data = response.json()
        message = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"model {name!r} returned a response without choices[0].message: {exc}") from exc
    calls: list[ToolCall] = []
    for i, raw in enumerate(message.get("tool_calls") or []):
        fn = raw.get("function") or {}
        text = fn.get("arguments") or "{}"
        args: dict[str, Any] | str
        try:
            decoded = json.loads(text) if isinstance(text, str) else text
            args = decoded if isinstance(decoded, dict) else str(text)
        except ValueError:
            args = str(text)
        calls.append(
            ToolCall(id=str(raw.get("id") or f"call_{i}"), name=str(fn.get("name") or ""), arguments=args)
        )
    content = message.get("content")
    return AssistantMessage(content=content if isinstance(content, str) else "", tool_calls=calls)
