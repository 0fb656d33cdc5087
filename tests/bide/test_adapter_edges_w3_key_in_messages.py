"""Every error about an answer bide will not journal shows the server's text with the API key masked, in
its message, its `body`, the exceptions chained to it and the log: a sweep of malformed answers of both
adapters, whole and streamed, with the key planted in each field an error names (a stream index, a stop or
finish reason, a key that came twice, a refusal, text a content filter cut, a header, a broken chunk), for
keys that JSON and `repr` escape (a backslash, quotes) as well as a plain one."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import traceback
from collections.abc import Callable
from typing import Any

import pytest
from raw_http import StartServer, one_turn

import bide

KEYS = {
    "plain": "sk-ant-api03-AbCdEfGh_IjKlMnOp-QrStUvWx0123456789",
    "backslash": "sk-AbCdEfGhIj\\KlMnOpQrStUv",
    "quotes": "sk-AbCdEfGhIj'KlMnOp\"QrStUv",
    "slash": "sk-AbCd/EfGhIj+KlMnOp/QrStUv",
}


def _shows_the_key(text: str, key: str) -> bool:
    """Whether `text` holds 8 characters of `key` in a row, as it is or as JSON or repr escape it."""
    forms = {key, json.dumps(key)[1:-1], repr(key)[1:-1], key.replace("/", "\\/")}
    return any(form[i : i + 8] in text for form in forms for i in range(len(form) - 7))


def _http(body: bytes, kind: bytes, head: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\nconnection: close\r\n" + head
        + f"content-length: {len(body)}\r\n\r\n".encode() + body
    )


def _stream(*events: Any) -> bytes:
    return _http(b"".join(_event(e) for e in events), b"text/event-stream")


def _event(payload: Any) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return b"data: " + data.encode() + b"\n\n"


def _whole(payload: Any) -> bytes:
    return _http((payload if isinstance(payload, str) else json.dumps(payload)).encode(), b"application/json")


def _twice(key: str) -> str:
    """A JSON object with the key (JSON-escaped) as a key twice."""
    quoted = json.dumps(key)
    return "{" + quoted + ": 1, " + quoted + ": 2}"


_A_START = {"type": "message_start", "message": {"usage": {"input_tokens": 1, "output_tokens": 0}}}
_TEXT = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}


def _a_stop(reason: str) -> list[dict[str, Any]]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]


def _o_piece(delta: dict[str, Any], finish: str | None = None, index: Any = 0) -> dict[str, Any]:
    return {"choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


def _o_whole(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def _a_whole(content: list[Any], stop: str = "end_turn") -> dict[str, Any]:
    return {"content": content, "stop_reason": stop, "usage": {"input_tokens": 1, "output_tokens": 1}}


def _chunked(first: bytes) -> bytes:
    """A chunked answer whose first chunk header is `first`, which is no chunk size."""
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + first


_X = "x" * 290  # the key runs across where a shown text is cut (300 characters)
Answer = Callable[[str], bytes]
# (the adapter, whether streamed, the raw answer made with the key, what the error says)
CASES: dict[str, tuple[str, bool, Answer, str]] = {
    "anthropic stream block index": (
        "anthropic", True, lambda k: _stream(_A_START, {**_TEXT, "index": k}), "with the index '***'"
    ),
    "anthropic stream delta index": (
        "anthropic",
        True,
        lambda k: _stream(_A_START, _TEXT, {"type": "content_block_delta", "index": [k], "delta": {}}),
        "with the index ['***']",
    ),
    "anthropic stream stop index": (
        "anthropic",
        True,
        lambda k: _stream(_A_START, _TEXT, {"type": "content_block_stop", "index": {k: 0}}),
        "with the index {'***': 0}",
    ),
    "anthropic stream unknown stop_reason": (
        "anthropic", True, lambda k: _stream(_A_START, *_a_stop(k)), "the stop reason '***', which bide"
    ),
    "anthropic stream second stop_reason": (
        "anthropic",
        True,
        lambda k: _stream(_A_START, *_a_stop("end_turn")[:1], *_a_stop(k)),
        "a second stop_reason '***' after 'end_turn'",
    ),
    "anthropic stream block after the stop_reason": (
        "anthropic",
        True,
        lambda k: _stream(_A_START, *_a_stop(k)[:1], _TEXT),
        "a content_block_start after the stop_reason '***'",
    ),
    "anthropic stream block object a list": (
        "anthropic",
        True,
        lambda k: _stream(_A_START, {**_TEXT, "content_block": [k]}),
        "without a block object: ['***']",
    ),
    "anthropic stream tool id a dict key": (
        "anthropic",
        True,
        lambda k: _stream(_A_START, {**_TEXT, "content_block": {"type": "tool_use", "id": {k: 1}}}),
        "whose id is not a string: {'***': 1}",
    ),
    "anthropic stream event with a key twice": (
        "anthropic", True, lambda k: _stream(_A_START, _twice(k)), "with the key '***' twice"
    ),
    "anthropic stream error event": (
        "anthropic",
        True,
        lambda k: _stream(_A_START, {"type": "error", "error": {"details": [k]}}),
        "failed mid-stream",
    ),
    "anthropic stream refusal": (
        "anthropic",
        True,
        lambda k: _stream(
            _A_START,
            _TEXT,
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": _X + k}},
            {"type": "content_block_stop", "index": 0},
            *_a_stop("refusal"),
        ),
        "after writing 'xxxxxxxx",
    ),
    "anthropic stream content-encoding": (
        "anthropic", True, lambda k: _http(b"", b"text/event-stream", f"content-encoding: {k}\r\n".encode()),
        "Content-Encoding '***'",
    ),
    "anthropic stream broken chunk": (
        "anthropic", True, lambda k: _chunked(k.encode() + b"\r\n"), "the stream broke off"
    ),
    "anthropic whole unknown stop_reason": (
        "anthropic",
        False,
        lambda k: _whole(_a_whole([{"type": "text", "text": "hi"}], k)),
        "the stop reason '***', which bide",
    ),
    "anthropic whole a key twice": ("anthropic", False, lambda k: _whole(_twice(k)), "key '***' twice"),
    "anthropic whole refusal": (
        "anthropic",
        False,
        lambda k: _whole(_a_whole([{"type": "text", "text": "x" * 290 + k}], "refusal")),
        "after writing 'xxxxxxxx",
    ),
    "anthropic whole error in a 200": (
        "anthropic", False, lambda k: _whole({"error": {"type": "x", "details": {k: [k]}}}), "with an error"
    ),
    "anthropic whole content-encoding": (
        "anthropic",
        False,
        lambda k: _http(b"{}", b"application/json", f"content-encoding: gzip, {k}\r\n".encode()),
        "Content-Encoding 'gzip, ***'",
    ),
    "anthropic whole broken chunk": (
        "anthropic", False, lambda k: _chunked(k.encode() + b"\r\n"), "failed after 1 attempts"
    ),
    "openai stream choice index": (
        "openai", True, lambda k: _stream(_o_piece({"content": "a"}, index=k)), "with the index '***'"
    ),
    "openai stream call index": (
        "openai",
        True,
        lambda k: _stream(_o_piece({"tool_calls": [{"index": [k], "function": {"name": "t"}}]})),
        "with the index ['***']",
    ),
    "openai stream unknown finish": (
        "openai", True, lambda k: _stream(_o_piece({"content": "a"}, k), "[DONE]"), "the finish reason '***'"
    ),
    "openai stream second finish": (
        "openai",
        True,
        lambda k: _stream(_o_piece({"content": "a"}, "stop"), _o_piece({}, k)),
        "a second finish reason '***' after 'stop'",
    ),
    "openai stream piece after the finish": (
        "openai",
        True,
        lambda k: _stream(_o_piece({}, k), _o_piece({"content": "a"})),
        "a piece after the finish reason '***'",
    ),
    "openai stream refusal": (
        "openai",
        True,
        lambda k: _stream(_o_piece({"refusal": "no " + k}, "stop"), "[DONE]"),
        "refused to answer: 'no ***'",
    ),
    "openai stream content filter": (
        "openai",
        True,
        lambda k: _stream(_o_piece({"content": "x" * 290 + k}, "content_filter"), "[DONE]"),
        "after writing 'xxxxxxxx",
    ),
    "openai stream error without a message": (
        "openai", True, lambda k: _stream({"error": {"details": {k: k}}}), "failed mid-stream"
    ),
    "openai stream event with a key twice": ("openai", True, lambda k: _stream(_twice(k)), "key '***' twice"),
    "openai stream broken chunk": ("openai", True, lambda k: _chunked(k.encode() + b"\r\n"), "broke off"),
    "openai whole unknown finish": (
        "openai", False, lambda k: _whole(_o_whole({"content": "a"}, k)), "the finish reason '***'"
    ),
    "openai whole a key twice": ("openai", False, lambda k: _whole(_twice(k)), "with the key '***' twice"),
    "openai whole refusal": (
        "openai",
        False,
        lambda k: _whole(_o_whole({"content": None, "refusal": "x" * 990 + k})),
        "refused to answer: 'xxxxxxxx",
    ),
    "openai whole content filter": (
        "openai",
        False,
        lambda k: _whole(_o_whole({"content": "x" * 290 + k}, "content_filter")),
        "after writing 'xxxxxxxx",
    ),
    "openai whole content-encoding": (
        "openai",
        False,
        lambda k: _http(b"{}", b"application/json", f"content-encoding: {k}\r\n".encode()),
        "Content-Encoding '***'",
    ),
    "openai whole bad header line": (
        "openai",
        False,
        lambda k: b"HTTP/1.1 200 OK\r\nx-note " + k.encode() + b"\r\ncontent-length: 2\r\n\r\n{}",
        "failed after 1 attempts",
    ),
}


def _model(kind: str, key: str, url: str) -> bide.Model:
    once = bide.RetryPolicy(attempts=1)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key=key, base_url=f"{url}/v1", retry=once, timeout=10)
    return bide.AnthropicModel("m", api_key=key, base_url=url, retry=once, timeout=10)


@pytest.mark.parametrize("key", list(KEYS))
@pytest.mark.parametrize("case", list(CASES))
def test_the_key_is_masked_in_every_error_about_an_answer(
    raw_server: StartServer, caplog: pytest.LogCaptureFixture, case: str, key: str
) -> None:
    """Before, a stream index, a stop or finish reason, a key that came twice, a refusal and text a content
    filter cut were shown as they came (cut before masking, for the last two), and a key JSON or repr
    escapes (a backslash, a quote) escaped the mask wherever a value was shown as its repr. Now none of the
    key is shown, in the message, the body, what is chained to it or the log; the masked part still is."""
    kind, stream, answer, says = CASES[case]
    secret = KEYS[key]
    raw = answer(secret)

    def send(conn: socket.socket) -> None:
        conn.sendall(raw)

    server = raw_server(send)
    caplog.set_level(logging.DEBUG, logger="bide")
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(_model(kind, secret, server.url), stream))
    error = caught.value
    assert says in str(error), str(error)
    # bide's own log (httpcore's DEBUG trace shows the headers as they came: see docs/bide.md).
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("bide"))
    everything = "".join(traceback.format_exception(error)) + f"\n{error.body}\n{error.args}\n{logged}"
    assert not _shows_the_key(everything, secret), everything


def test_a_refusal_is_kept_whole_in_the_body_with_the_key_masked(raw_server: StartServer) -> None:
    """The body keeps the whole refusal (the message shows its first 1,000 characters), the key masked."""
    key = KEYS["quotes"]
    said = "y" * 3000 + key + " and more"
    raw = _whole(_o_whole({"content": None, "refusal": said}))
    server = raw_server(lambda conn: conn.sendall(raw))
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(_model("openai", key, server.url), False))
    assert caught.value.body == "y" * 3000 + "*** and more"
    assert f"refused to answer: '{'y' * 1000}';" in str(caught.value)
