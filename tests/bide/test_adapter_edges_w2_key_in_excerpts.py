"""An error about an answer bide cannot read shows a part of it (its first 200 characters, or the bytes
around one that is not UTF-8): the API key, should the server quote it there, is masked before that part
is cut, so a key across the cut shows none of its characters, in a stream or a whole answer, for both
adapters."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest
from raw_http import StartServer, one_turn

import bide

KEY = "sk-proj-Q7vT2mXk9LpR4wYz8NbC3dFh6JsG1aEu5oIy0rMq"
PAD = "x" * 170  # the key runs from about character 170 to 218 of what is shown: across the cut at 200
QUOTED = PAD + KEY


def _longest_part_of_the_key(text: str) -> int:
    """The length of the longest run of the key's characters that `text` shows."""
    return max(
        (n for n in range(1, len(KEY) + 1) for i in range(len(KEY) - n + 1) if KEY[i : i + n] in text),
        default=0,
    )


def _sse(*events: bytes) -> bytes:
    return b"".join(events)


def _data(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


_USAGE = {"input_tokens": 1, "output_tokens": 0}
_ANTHROPIC_START = _data({"type": "message_start", "message": {"usage": _USAGE}})
_OPENAI_START = _data({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})

# (the adapter, whether streamed, the body sent, what the error says)
CASES: dict[str, tuple[str, bool, bytes, str]] = {
    "openai event not JSON": ("openai", True, b"data: " + QUOTED.encode() + b"\n\n", "not JSON"),
    "anthropic event not JSON": ("anthropic", True, b"data: " + QUOTED.encode() + b"\n\n", "not JSON"),
    "openai event not an object": ("openai", True, _data(QUOTED), "not a JSON object"),
    "anthropic event not an object": ("anthropic", True, _data(QUOTED), "not a JSON object"),
    "anthropic block not an object": (
        "anthropic",
        True,
        _sse(_ANTHROPIC_START, _data({"type": "content_block_start", "index": 0, "content_block": [QUOTED]})),
        "without a block object",
    ),
    "openai content not a string": (
        "openai",
        True,
        _sse(_OPENAI_START, _data({"choices": [{"index": 0, "delta": {"content": [QUOTED]}}]})),
        "content is not a string",
    ),
    "openai line not UTF-8": (
        "openai",
        True,
        _sse(_OPENAI_START, b'data: {"choices":"' + QUOTED.encode() + b'\xff"}\n\n'),
        "not UTF-8",
    ),
    "anthropic line not UTF-8": (
        "anthropic",
        True,
        _sse(_ANTHROPIC_START, b'data: {"type":"' + QUOTED.encode() + b'\xff"}\n\n'),
        "not UTF-8",
    ),
    "openai whole content not a string": (
        "openai",
        False,
        json.dumps({"choices": [{"message": {"content": [QUOTED]}, "finish_reason": "stop"}]}).encode(),
        "content that is not a string",
    ),
    "anthropic whole block not an object": (
        "anthropic",
        False,
        json.dumps({"content": [QUOTED], "stop_reason": "end_turn"}).encode(),
        "a content block that is not an object",
    ),
}


def _answer(body: bytes, stream: bool) -> Callable[[socket.socket], None]:
    kind = b"text/event-stream" if stream else b"application/json"

    def answer(conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\nconnection: close\r\n"
        conn.sendall(head + f"content-length: {len(body)}\r\n\r\n".encode() + body)

    return answer


@pytest.mark.parametrize("case", list(CASES))
def test_a_key_across_the_cut_of_a_shown_answer_is_masked(raw_server: StartServer, case: str) -> None:
    """Before, these parts of the answer were cut and never masked: 30 and more of the key's characters
    were shown (20 around a byte that is not UTF-8). Now the key is masked first: none is shown."""
    kind, stream, body, says = CASES[case]
    server = raw_server(_answer(body, stream))
    once = bide.RetryPolicy(attempts=1)
    model: bide.Model = (
        bide.OpenAIModel("m", api_key=KEY, base_url=f"{server.url}/v1", retry=once, timeout=10)
        if kind == "openai"
        else bide.AnthropicModel("m", api_key=KEY, base_url=server.url, retry=once, timeout=10)
    )
    with pytest.raises(bide.ModelError, match=says) as caught:
        asyncio.run(one_turn(model, stream))
    shown = str(caught.value)
    assert "xxxxxxxxxx***" in shown, shown  # the part is shown, the key masked in it
    assert _longest_part_of_the_key(shown) < 5, shown
