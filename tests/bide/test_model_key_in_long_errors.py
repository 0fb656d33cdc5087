"""A server's error that quotes the API key is shown with the key masked, wherever the key sits in it. bide
shows the first 2,000 characters of an error body: the key is masked before the body is cut, so a key
across the cut is not shown but for its last characters (in the message, in `ModelError.body` and in the
WARNING logged when the retries run out)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

import pytest
from raw_http import StartServer, one_turn

import bide
from bide.testing import LoopbackServer, Received, Reply

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]
KEY = "sk-proj-SECRETabcdefghijklmnopqrstuvwxyz0123456789"
_CUT = 2000  # the most of an error body bide shows


def _error(kind: str, sent: str) -> dict[str, Any]:
    """An error quoting `sent` (the credential a request carried), the key ending 2 characters past the
    cut."""

    def body(filler: int) -> dict[str, Any]:
        said = "Incorrect API key provided: " + "x" * filler + " " + sent
        error = {"type": "authentication_error", "message": said}
        return {"error": error} if kind == "openai" else {"type": "error", "error": error}

    starts = json.dumps(body(0)).index(KEY)
    return body(_CUT - len(KEY) + 2 - starts)


def _model(kind: str, url: str) -> bide.OpenAIModel | bide.AnthropicModel:
    policy = bide.RetryPolicy(attempts=2, initial=0.01, maximum=0.01)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key=KEY, base_url=f"{url}/v1", retry=policy, timeout=10)
    return bide.AnthropicModel("m", api_key=KEY, base_url=url, retry=policy, timeout=10)


async def _drive(agent: bide.Agent[Any], stream: bool) -> None:
    if not stream:
        await agent.run("r1", "hi")
        return
    stream_events: Any = agent.stream("r1", "hi")
    async with contextlib.aclosing(stream_events) as events:
        async for _ in events:
            pass


def _shown(text: str) -> int:
    """How many of the key's first characters `text` shows (0 up to 11: none that tells anything)."""
    return max((n for n in range(12, len(KEY) + 1) if KEY[:n] in text), default=0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("status", [401, 429, 200])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_key_across_the_cut_of_an_error_body_is_masked(
    serve: Serve, caplog: pytest.LogCaptureFixture, kind: str, status: int, stream: bool
) -> None:
    """Before, the body was cut first and masked after: 48 of the key's 50 characters were shown in
    str(ModelError), in ModelError.body and in the WARNING log. Now none is."""
    text = json.dumps(_error(kind, KEY))
    assert text.index(KEY) < _CUT < text.index(KEY) + len(KEY)
    header = "authorization" if kind == "openai" else "x-api-key"
    server = serve(lambda request: Reply(status=status, body=_error(kind, request.headers[header])))
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"))
    with caplog.at_level(logging.INFO, logger="bide"), pytest.raises(bide.ModelError) as caught:
        asyncio.run(_drive(agent, stream))
    error = caught.value
    assert "Incorrect API key provided: xxx" in str(error)  # the server's message is still shown
    assert "***" in (error.body or "")
    assert len(error.body or "") <= _CUT
    assert (_shown(str(error)), _shown(error.body or ""), _shown(caplog.text)) == (0, 0, 0)
    assert len(server.requests) == (2 if status == 429 else 1)


PLUS_KEY = "sk-proj-SECRET+abcdefghijklmnopqrstuvwxyz0123456789"


@pytest.mark.parametrize("filler", [10, 1940], ids=["short", "across the cut"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_key_the_server_escaped_otherwise_than_slashes_is_masked(
    raw_server: StartServer, kind: str, filler: int
) -> None:
    """A server that JSON-escapes a character of the key other than "/" (.NET writes "+" as \\u002B): the
    whole escaped key stood in `ModelError.body`, and with a body cut near the key, its first 15 characters
    in the message too. Every JSON escape of any of its characters is masked."""
    quoted = PLUS_KEY.replace("+", "\\u002B")
    said = "Incorrect API key provided: " + "x" * filler + " Bearer " + quoted
    body = ('{"error":{"type":"authentication_error","message":"' + said + '"}}').encode()

    def answer(conn: socket.socket) -> None:
        head = f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        conn.sendall(b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n" + head + body)

    server = raw_server(answer)
    once = bide.RetryPolicy(attempts=1)
    model: bide.Model = (
        bide.OpenAIModel("m", api_key=PLUS_KEY, base_url=f"{server.url}/v1", retry=once, timeout=10)
        if kind == "openai"
        else bide.AnthropicModel("m", api_key=PLUS_KEY, base_url=server.url, retry=once, timeout=10)
    )
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, False))
    shown = str(caught.value) + (caught.value.body or "")
    assert "SECRET" not in shown and "k-proj-S" not in shown, shown
