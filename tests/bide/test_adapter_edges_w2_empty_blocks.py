"""An Anthropic stream that opens new content blocks without anything in them (an empty text block started,
no delta, and ended) adds nothing to the answer: a server sending only those is cut off after the model's
`timeout`, as one sending only pings is, not kept alive until `stream_timeout`. A block that does carry
something (a tool call's start, a text delta) still counts."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable

import pytest
from raw_http import StartServer, one_turn

import bide


def _event(payload: dict[str, object]) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
_USAGE = {"input_tokens": 1, "output_tokens": 0}
_MESSAGE_START = _event({"type": "message_start", "message": {"role": "assistant", "usage": _USAGE}})


def _empty_blocks(with_stop: bool) -> Callable[[socket.socket], None]:
    """Answer with message_start, then a new empty text block every 20 ms (ended, or not), for 20 s at most
    or until the client hangs up."""

    def answer(conn: socket.socket) -> None:
        conn.sendall(_HEAD + _MESSAGE_START)
        ends = time.monotonic() + 20
        index = 0
        while time.monotonic() < ends:
            empty = {"type": "text", "text": ""}
            piece = _event({"type": "content_block_start", "index": index, "content_block": empty})
            if with_stop:
                piece += _event({"type": "content_block_stop", "index": index})
            conn.sendall(piece)
            index += 1
            time.sleep(0.02)  # the pace of the flood, not an assertion

    return answer


@pytest.mark.parametrize("with_stop", [False, True], ids=["started", "started-and-ended"])
def test_a_stream_of_new_empty_blocks_is_cut_off_after_the_timeout(
    raw_server: StartServer, with_stop: bool
) -> None:
    """Before, each new block's start (and end) counted as progress: the stream ran until stream_timeout
    (4 s here; 600 s by default). Now it is cut off after `timeout` (1 s) of nothing added."""
    server = raw_server(_empty_blocks(with_stop))
    model = bide.AnthropicModel(
        "m", api_key="k", base_url=server.url, retry=bide.RetryPolicy(attempts=1), timeout=1, stream_timeout=4
    )
    started = time.monotonic()
    with pytest.raises(bide.ModelError, match="sent nothing that adds to the answer for 1s"):
        asyncio.run(one_turn(model, True))
    assert time.monotonic() - started < 3.5


def _slow_tool_calls(conn: socket.socket) -> None:
    """A stream whose blocks each carry a tool call, 0.6 s apart (each start adds to the answer), then its
    end: no wait for a piece that adds is as long as the 1 s timeout."""
    conn.sendall(_HEAD + _MESSAGE_START)
    for index in range(4):
        time.sleep(0.6)  # the server's pace, not an assertion
        block = {"type": "tool_use", "id": f"toolu_{index}", "name": "noop", "input": {}}
        conn.sendall(
            _event({"type": "content_block_start", "index": index, "content_block": block})
            + _event({"type": "content_block_stop", "index": index})
        )
    conn.sendall(
        _event({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}})
        + _event({"type": "message_stop"})
    )


def test_blocks_that_carry_a_call_still_count(raw_server: StartServer) -> None:
    """Unchanged: a tool_use block's start adds to the answer (its id and name), and so does its end."""
    server = raw_server(_slow_tool_calls)
    once = bide.RetryPolicy(attempts=1)
    model = bide.AnthropicModel("m", api_key="k", base_url=server.url, retry=once, timeout=1)
    nothing = {"type": "object", "properties": {}, "additionalProperties": False}
    noop = bide.ToolSpec(name="noop", description="", parameters=nothing)
    request = bide.ModelRequest(run_id="r", turn=0, messages=[bide.UserMessage(content="hi")], tools=(noop,))
    turn = asyncio.run(one_turn(model, True, request))
    assert [c.id for c in turn.tool_calls] == ["toolu_0", "toolu_1", "toolu_2", "toolu_3"]
