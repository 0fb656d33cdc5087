"""An Anthropic turn may hold at most `MAX_CONTENT_BLOCKS` (10,000) content blocks: each streamed block is
kept to the turn's end (every later piece's index is checked against them), so a stream of empty blocks
grew memory by some 800 bytes a block, 360 MB for 31 MB of them. A turn with more is refused, streamed or
whole, and nothing is journaled; one with exactly that many is read."""

from __future__ import annotations

import asyncio
import json
import socket
import tracemalloc
from typing import Any

import pytest
from raw_http import StartServer, one_turn

import bide

MAX_CONTENT_BLOCKS = 10_000  # bide._anthropic.MAX_CONTENT_BLOCKS, as docs/bide.md states it


def _data(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


_START = _data({"type": "message_start", "message": {"usage": {"input_tokens": 1, "output_tokens": 0}}})
_END = _data({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}})
_END += _data({"type": "message_stop"})


def _empty_blocks(count: int, stopped: bool) -> bytes:
    """`count` empty text blocks (started, and stopped if `stopped`), the first one with text."""
    out = [_START]
    for i in range(count):
        empty = {"type": "text", "text": ""}
        out.append(_data({"type": "content_block_start", "index": i, "content_block": empty}))
        if i == 0:
            delta = {"type": "text_delta", "text": "hello"}
            out.append(_data({"type": "content_block_delta", "index": 0, "delta": delta}))
        if stopped:
            out.append(_data({"type": "content_block_stop", "index": i}))
    out.append(_END)
    return b"".join(out)


def _serve(raw_server: StartServer, body: bytes, kind: bytes) -> str:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\nconnection: close\r\n"
    raw = head + f"content-length: {len(body)}\r\n\r\n".encode() + body

    def answer(conn: socket.socket) -> None:
        conn.sendall(raw)

    return raw_server(answer).url


def _model(url: str) -> bide.AnthropicModel:
    return bide.AnthropicModel("m", api_key="k", base_url=url, retry=bide.RetryPolicy(attempts=1), timeout=30)


def test_a_flood_of_empty_blocks_is_refused_in_bounded_memory(raw_server: StartServer) -> None:
    """Before, 60,000 empty blocks (never stopped, as the re-tester sent them) were all kept: some 50 MB.
    Now the 10,001st is refused, the memory held well under that."""
    url = _serve(raw_server, _empty_blocks(60_000, stopped=False), b"text/event-stream")
    tracemalloc.start()
    try:
        with pytest.raises(bide.ModelError, match="more than 10,000 content blocks in one turn") as caught:
            asyncio.run(one_turn(_model(url), True))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "nothing was journaled" in str(caught.value)
    assert peak < 25 * 2**20, f"{peak / 2**20:.1f} MiB"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_turn_of_exactly_the_limit_is_read_and_one_more_is_refused(
    raw_server: StartServer, stream: bool
) -> None:
    for count, fits in ((MAX_CONTENT_BLOCKS, True), (MAX_CONTENT_BLOCKS + 1, False)):
        if stream:
            url = _serve(raw_server, _empty_blocks(count, stopped=True), b"text/event-stream")
        else:
            blocks = [{"type": "text", "text": "hello"}] + [{"type": "text", "text": ""}] * (count - 1)
            usage = {"input_tokens": 1, "output_tokens": 1}
            whole = {"content": blocks, "stop_reason": "end_turn", "usage": usage}
            url = _serve(raw_server, json.dumps(whole).encode(), b"application/json")
        if fits:
            assert asyncio.run(one_turn(_model(url), stream)).content == "hello"
        else:
            with pytest.raises(bide.ModelError, match="more than 10,000 content blocks"):
                asyncio.run(one_turn(_model(url), stream))
