"""A server that answers 200 with something other than the turn asked for: an error body (a spent quota)
is a `bide.ModelError` that shows the server's message (never a KeyError, nor "the stream ended before
the turn did"), the API key masked in it; a whole JSON completion sent back to a streaming request (a
server that ignores ``stream: true``) is read as the whole turn, as `run` reads it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest
from raw_http import StartServer

import bide
from bide.testing import (
    LoopbackServer,
    Received,
    Reply,
    anthropic_message,
    openai_completion,
    openai_stream,
)

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]
_KEY = "sk-test-0123456789"


def _model(kind: str, url: str) -> bide.OpenAIModel | bide.AnthropicModel:
    once = bide.RetryPolicy(attempts=1)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key=_KEY, base_url=f"{url}/v1", retry=once, timeout=10)
    return bide.AnthropicModel("m", api_key=_KEY, base_url=url, retry=once, timeout=10)


async def _drive(agent: bide.Agent[Any], run_id: str, stream: bool) -> tuple[str, list[str]]:
    """The run's answer and the text deltas its drive gave."""
    if not stream:
        return (await agent.run(run_id, "hi")).answer, []
    deltas: list[str] = []
    async with contextlib.aclosing(agent.stream(run_id, "hi")) as events:
        async for event in events:
            if isinstance(event, bide.TextDelta):
                deltas.append(event.text)
            elif isinstance(event, bide.Finished):
                return event.result.answer, deltas
    raise AssertionError("the stream ended without Finished")


def _errors(kind: str) -> dict[str, Any]:
    said = f"quota exceeded for key {_KEY}; add credits"
    if kind == "openai":
        return {"error": {"message": said, "type": "insufficient_quota"}}
    return {"type": "error", "error": {"type": "billing_error", "message": said}}


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_error_in_a_200_shows_the_servers_message(
    serve: Serve, kind: str, stream: bool
) -> None:
    server = serve(lambda request: Reply(body=_errors(kind)))
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"))
    with pytest.raises(bide.ModelError, match="quota exceeded for key \\*\\*\\*; add credits") as caught:
        asyncio.run(_drive(agent, "r1", stream))
    assert _KEY not in str(caught.value) and _KEY not in (caught.value.body or "")
    assert len(server.requests) == 1  # not retried: the server said what is wrong


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_whole_answer_to_a_streaming_request_is_the_turn(serve: Serve, kind: str) -> None:
    whole = openai_completion("hello whole") if kind == "openai" else anthropic_message("hello whole")
    server = serve(lambda request: whole)
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"))
    assert asyncio.run(_drive(agent, "r1", True)) == ("hello whole", ["hello whole"])
    assert server.requests[0].body["stream"] is True


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_whole_answer_with_tool_calls_to_a_streaming_request_runs_them(serve: Serve, kind: str) -> None:
    """The calls of a whole answer to a streaming request are read and checked as `run` reads them."""
    call = [("call_1", "note", {"text": "milk"})]
    if kind == "openai":
        answers = [openai_completion(calls=call), openai_completion("Noted.")]
    else:
        answers = [anthropic_message(calls=call), anthropic_message("Noted.")]
    server = serve(lambda request: answers[request.n - 1])
    noted: list[str] = []

    @bide.tool
    def note(text: str) -> str:
        """Note something (a side effect)."""
        noted.append(text)
        return "noted"

    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"), tools=[note])
    assert asyncio.run(_drive(agent, "r1", True))[0] == "Noted."
    assert noted == ["milk"]


def _raw(body: bytes, kind: str | None) -> Callable[[socket.socket], None]:
    """An answer of `body` under the Content-Type `kind` (None: none)."""

    def answer(conn: socket.socket) -> None:
        said = f"content-type: {kind}\r\n" if kind else ""
        head = f"HTTP/1.1 200 OK\r\n{said}content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        conn.sendall(head.encode() + body)

    return answer


@pytest.mark.parametrize("kind", ["text/plain", "text/event-stream", None])
def test_json_to_a_streaming_request_is_read_whatever_its_content_type(
    raw_server: StartServer, kind: str | None
) -> None:
    """What the body is, not what its Content-Type says, tells a whole answer from an event stream: an
    error shows its message, a completion is the turn, and an event stream labelled JSON still streams."""
    error = raw_server(_raw(b'\xef\xbb\xbf\n {"error": {"message": "model m is not served here"}}', kind))
    agent = bide.Agent(_model("openai", error.url), store=bide.open_store("memory://"))
    with pytest.raises(bide.ModelError, match="with an error instead of a turn: model m is not served here"):
        asyncio.run(_drive(agent, "r1", True))
    whole = openai_completion("hello whole").body
    served = raw_server(_raw(json.dumps(whole).encode(), kind))
    agent = bide.Agent(_model("openai", served.url), store=bide.open_store("memory://"))
    assert asyncio.run(_drive(agent, "r1", True)) == ("hello whole", ["hello whole"])
    events = openai_stream(["hello ", "stream"]).events or []
    stream = b"".join(b"data: " + data.encode() + b"\n\n" for _, data in events)
    labelled = raw_server(_raw(stream, "application/json"))
    agent = bide.Agent(_model("openai", labelled.url), store=bide.open_store("memory://"))
    assert asyncio.run(_drive(agent, "r2", True)) == ("hello stream", ["hello ", "stream"])
