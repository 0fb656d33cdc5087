"""A stream that sends only pieces adding nothing to the answer (OpenAI ``data: {}`` or empty deltas,
Anthropic ``ping`` events) is cut off after `timeout`, however fast they come: decoding and handling each
piece counts as reading the stream, as the reading of its lines does. The time the caller's own code takes
between the text pieces it is handed still does not count."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable

import pytest
from raw_http import StartServer, one_turn

import bide
from bide.testing import LoopbackServer, Received, Reply, anthropic_stream, openai_stream

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]

# Each piece carries 100 empty objects no answer needs: costly to decode, cheap to split into lines, as a
# server (or a proxy) flooding the stream with them makes it.
_PAD = b'"pad":[' + b",".join([b"{}"] * 100) + b"]"
_FLOODS = {
    "openai-empty-delta": ("openai", b'data: {"choices":[{"index":0,"delta":{}}],' + _PAD + b"}\n\n"),
    "openai-empty-object": ("openai", b"data: {" + _PAD + b"}\n\n"),
    "anthropic-ping": ("anthropic", b'event: ping\ndata: {"type":"ping",' + _PAD + b"}\n\n"),
    # Pieces of the API's shape that carry nothing: they counted as progress, and a stream of them ran to
    # `stream_timeout` (600 s by default) or the size limit.
    "openai-empty-call-arguments": (
        "openai",
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]}}],'
        + _PAD + b"}\n\n",
    ),
    "anthropic-empty-message-delta": (
        "anthropic",
        b'event: message_delta\ndata: {"type":"message_delta","delta":{},"usage":{},' + _PAD + b"}\n\n",
    ),
}


def _flooding(piece: bytes) -> Callable[[socket.socket], None]:
    """Answer 200 with an event stream of `piece` again and again, as fast as the client reads (for at most
    30 s, or until it hangs up)."""

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        block = piece * (65536 // len(piece) + 1)
        ends = time.monotonic() + 30
        while time.monotonic() < ends:
            conn.sendall(block)

    return answer


def _model(kind: str, url: str, timeout: float, stream_timeout: float = 600) -> bide.Model:
    once = bide.RetryPolicy(attempts=1)
    if kind == "openai":
        return bide.OpenAIModel(
            "m", api_key="k", base_url=f"{url}/v1", retry=once, timeout=timeout, stream_timeout=stream_timeout
        )
    return bide.AnthropicModel(
        "m", api_key="k", base_url=url, retry=once, timeout=timeout, stream_timeout=stream_timeout
    )


@pytest.mark.parametrize("flood", list(_FLOODS))
def test_a_flood_of_pieces_that_add_nothing_is_cut_off_after_the_timeout(
    raw_server: StartServer, flood: str
) -> None:
    """Before, only splitting the stream into lines counted against `timeout`, not decoding and handling
    each event: such a flood was cut off after 4 to 5 times `timeout` (2.5 to 4 times with pieces that
    carry nothing). Now it is cut off after about `timeout`."""
    kind, piece = _FLOODS[flood]
    server = raw_server(_flooding(piece))
    started = time.monotonic()
    with pytest.raises(bide.ModelError, match="adds to the answer for 1s"):
        asyncio.run(one_turn(_model(kind, server.url, timeout=1), True))
    assert time.monotonic() - started < 2.5  # loose, for a loaded machine: it was 4 s and more


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_the_callers_time_between_text_pieces_does_not_count(serve: Serve, kind: str) -> None:
    """Unchanged: a caller that takes 0.6 s over each of three text pieces (1.8 s in all) is not cut off by a
    `stream_timeout` of 1.5 s, nor by a `timeout` of 1 s: the bounds are on the server, not the caller."""
    reply = openai_stream(["a", "b", "c"]) if kind == "openai" else anthropic_stream(["a", "b", "c"])
    server = serve(lambda request: reply)
    model = _model(kind, server.url, timeout=1, stream_timeout=1.5)
    request = bide.ModelRequest(
        run_id="r", turn=0, messages=[bide.UserMessage(content="hi")], tools=()
    )

    async def slowly() -> list[object]:
        got: list[object] = []
        stream = model.stream(request)  # type: ignore[attr-defined]
        async with contextlib.aclosing(stream) as pieces:
            async for piece in pieces:
                got.append(piece)
                if isinstance(piece, bide.TextDelta):
                    await asyncio.sleep(0.6)
        return got

    got = asyncio.run(slowly())
    assert [p.text for p in got if isinstance(p, bide.TextDelta)] == ["a", "b", "c"]
    last = got[-1]
    assert isinstance(last, bide.AssistantMessage) and last.content == "abc"
