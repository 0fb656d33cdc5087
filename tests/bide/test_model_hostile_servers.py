"""Model servers that misbehave, part three: pieces of a turn of the wrong type (an arguments piece that is
not text, a delta or block that is not an object), a Retry-After no clock can use, a character split
between its UTF-16 halves across pieces, a lone surrogate in a server's error message, a `timeout=` no
clock can use, and a flood of keep-alive lines that inflates from a few KiB. A malformed turn is a
`bide.ModelError` with nothing journaled and no tool fired; the rest is read, waited or refused as the
docs say, and never escapes as another Python error."""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from raw_http import StartServer, hi, one_turn, tool_results_sent

import bide
from bide._http import parse_retry_after
from bide.testing import (
    LoopbackServer,
    Received,
    Reply,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_stream,
)

KINDS = ["openai", "anthropic"]


Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]


def _model(kind: str, url: str, **options: Any) -> bide.OpenAIModel | bide.AnthropicModel:
    options.setdefault("retry", bide.RetryPolicy(attempts=1))
    options.setdefault("timeout", 10)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key="k", base_url=f"{url}/v1", **options)
    return bide.AnthropicModel("m", api_key="k", base_url=url, **options)


def _turn(model: bide.Model, stream: bool, request: bide.ModelRequest | None = None) -> bide.AssistantMessage:
    return asyncio.run(asyncio.wait_for(one_turn(model, stream, request), 30))


def _events(*payloads: Any) -> Reply:
    """An event stream of `payloads`, each sent as JSON (a str as it is)."""
    return Reply(events=[("", p if isinstance(p, str) else json.dumps(p)) for p in payloads])


def _oa(delta: Any, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _oa_piece(arguments: Any, first: bool = False) -> dict[str, Any]:
    call: dict[str, Any] = {"index": 0, "function": {"arguments": arguments}}
    if first:
        call["id"] = "call_1"
        call["type"] = "function"
        call["function"]["name"] = "pay"
    return _oa({"tool_calls": [call]})


def _openai_turn(*chunks: Any) -> Reply:
    return _events(*chunks, _oa({}, "tool_calls"), "[DONE]")


def _an(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, **data}


def _anthropic_turn(*events: Any, stop: str = "tool_use") -> Reply:
    return _events(
        _an("message_start", message={"usage": {"input_tokens": 1, "output_tokens": 1}}),
        *events,
        _an("message_delta", delta={"stop_reason": stop}, usage={"output_tokens": 1}),
        _an("message_stop"),
    )


def _an_tool(index: int = 0) -> dict[str, Any]:
    block = {"type": "tool_use", "id": "toolu_1", "name": "pay", "input": {}}
    return _an("content_block_start", index=index, content_block=block)


def _an_json(partial: Any, index: int = 0) -> dict[str, Any]:
    return _an(
        "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial}
    )


def _an_text(text: str, index: int = 0) -> dict[str, Any]:
    return _an("content_block_delta", index=index, delta={"type": "text_delta", "text": text})


def _an_text_block(index: int = 0) -> dict[str, Any]:
    return _an("content_block_start", index=index, content_block={"type": "text", "text": ""})


def _an_stop(index: int = 0) -> dict[str, Any]:
    return _an("content_block_stop", index=index)


class _Payments:
    """A side-effect tool `pay(to, amount=100)`: its default matters, a call that lost `amount` still runs."""

    def __init__(self) -> None:
        self.paid: list[tuple[str, int]] = []
        paid = self.paid

        @bide.tool
        def pay(to: str, amount: int = 100) -> str:
            """Pay someone (amount in cents)."""
            paid.append((to, amount))
            return "paid"

        self.tool = pay


def _good(kind: str, request: Received) -> Reply:
    """A model that behaves: it pays alice 5000 once, then answers "done"."""
    stream = bool(request.body.get("stream"))
    calls = [("g1", "pay", {"to": "alice", "amount": 5000})]
    if kind == "openai":
        if tool_results_sent(request):
            return openai_stream(["done"]) if stream else openai_completion("done")
        return openai_stream(calls=calls) if stream else openai_completion(calls=calls)
    if tool_results_sent(request):
        return anthropic_stream(["done"]) if stream else anthropic_message("done")
    return anthropic_stream(calls=calls) if stream else anthropic_message(calls=calls)


async def _drive(agent: bide.Agent[Any], stream: bool) -> bide.RunResult[Any]:
    if not stream:
        return await agent.run("run", "pay alice 5000")
    last: object = None
    async for event in agent.stream("run", "pay alice 5000"):
        last = event
    assert isinstance(last, bide.Finished)
    return last.result  # type: ignore[no-any-return]


def _refused_then_resumed(serve: Serve, kind: str, stream: bool, hostile: Reply, match: str) -> None:
    """A run whose first turn is `hostile`: ModelError matching `match`, nothing paid, nothing journaled;
    run again on a model that behaves, it pays what that model asks, once."""
    server = serve(lambda request: hostile if request.n == 1 else _good(kind, request))
    payments = _Payments()
    store = bide.open_store("memory://")
    agent = bide.Agent(_model(kind, server.url), store=store, tools=[payments.tool])
    with pytest.raises(bide.ModelError, match=match):
        asyncio.run(asyncio.wait_for(_drive(agent, stream), 30))
    assert payments.paid == []
    assert store.load("run") == []
    result = asyncio.run(asyncio.wait_for(_drive(agent, stream), 30))
    assert result.answer == "done"
    assert payments.paid == [("alice", 5000)]


# -- an arguments piece that is not text ---------------------------------------------------------------------


@pytest.mark.parametrize("piece", [{"amount": 5000}, 5000, ["amount", 5000], True])
def test_an_openai_arguments_piece_that_is_not_text_fires_no_tool(serve: Serve, piece: Any) -> None:
    """The pieces around it still make a JSON object: skipped, it ran the tool on its default amount."""
    hostile = _openai_turn(_oa_piece('{"to": "alice"', first=True), _oa_piece(piece), _oa_piece("}"))
    _refused_then_resumed(serve, "openai", True, hostile, "arguments that is not a string")


@pytest.mark.parametrize("piece", [{"amount": 5000}, 5000, None])
def test_an_anthropic_partial_json_that_is_not_text_fires_no_tool(serve: Serve, piece: Any) -> None:
    hostile = _anthropic_turn(
        _an_tool(), _an_json('{"to": "alice"'), _an_json(piece), _an_json("}"), _an_stop()
    )
    _refused_then_resumed(serve, "anthropic", True, hostile, "partial_json is not a string")


def test_openai_pieces_without_arguments_or_with_null_are_still_read(serve: Serve) -> None:
    """A piece may leave its arguments out or send null (the first, naming the call, often does)."""
    first = _oa_piece(None, first=True)
    bare = _oa({"tool_calls": [{"index": 0}]})
    server = serve(
        lambda _: _openai_turn(first, bare, _oa_piece('{"to": "alice",'), _oa_piece(' "amount": 7}'))
    )
    turn = _turn(_model("openai", server.url), True)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("pay", {"to": "alice", "amount": 7})]


# -- deltas, choices and blocks that are not objects ---------------------------------------------------------

_CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "pay", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("chunk", "match"),
    [
        (_oa({"tool_calls": _CALL}), "tool_calls that is not a list"),
        (_oa("I paid alice 5000"), "delta that is not an object"),
        (_oa(["content", "hi"]), "delta that is not an object"),
        ({"choices": ["paid"]}, "choice that is not an object"),
        ({"choices": {"index": 0, "delta": {"content": "paid"}}}, "choices that is not a list"),
        (["paid"], "event that is not a JSON object"),
        ("42", "event that is not a JSON object"),
    ],
)
def test_an_openai_stream_piece_of_another_shape_is_a_model_error(
    serve: Serve, chunk: Any, match: str
) -> None:
    """Dropped, the turn was journaled as an empty final answer: the run ended for good, the tool unrun."""
    _refused_then_resumed(serve, "openai", True, _openai_turn(chunk), match)


def test_an_openai_stream_with_null_or_absent_optional_parts_is_read(serve: Serve) -> None:
    """What the API leaves out or sends as null: a finish without a delta, tool_calls null, a usage chunk
    without choices or with an empty list."""
    events = _events(
        _oa({"role": "assistant", "content": "Sun", "tool_calls": None}),
        {"choices": [{"index": 0, "delta": None, "finish_reason": None}]},
        _oa({"content": "ny"}),
        {"choices": [{"index": 0, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
        {"choices": None, "usage": None},
        {"usage": {"prompt_tokens": 3, "completion_tokens": 2}},
        "[DONE]",
    )
    server = serve(lambda _: events)
    turn = _turn(_model("openai", server.url), True)
    assert (turn.content, turn.finish_reason) == ("Sunny", "stop")
    assert turn.usage == bide.Usage(input_tokens=3, output_tokens=2)


@pytest.mark.parametrize(
    "block", ["I paid alice.", ["tool_use", "toolu_1", "pay", {"to": "alice", "amount": 5000}], None, 7]
)
def test_an_anthropic_answer_block_that_is_not_an_object_is_a_model_error(serve: Serve, block: Any) -> None:
    hostile = Reply(body={"content": [block], "stop_reason": "tool_use", "usage": {"output_tokens": 1}})
    _refused_then_resumed(serve, "anthropic", False, hostile, "content block that is not an object")


@pytest.mark.parametrize(
    ("events", "match"),
    [
        (
            [_an("content_block_start", index=0, content_block="tool_use"), _an_json("{}"), _an_stop()],
            "content_block_start without a block object",
        ),
        (
            [_an("content_block_start", index=0), _an_json('{"to": "alice"}'), _an_stop()],
            "content_block_start without a block object",
        ),
        (
            [_an_tool(), _an("content_block_delta", index=0, delta='{"to": "alice"}'), _an_stop()],
            "content_block_delta without a delta object",
        ),
        ([_an_tool(), ["content_block_stop", 0]], "event that is not a JSON object"),
    ],
)
def test_an_anthropic_stream_piece_of_another_shape_is_a_model_error(
    serve: Serve, events: list[Any], match: str
) -> None:
    _refused_then_resumed(serve, "anthropic", True, _anthropic_turn(*events), match)


# -- Retry-After -------------------------------------------------------------------------------------------


def _headers(**fields: str) -> httpx.Headers:
    return httpx.Headers({k.replace("_", "-"): v for k, v in fields.items()})


@pytest.mark.parametrize(
    "value",
    [
        "Mon, 01 Jan 99999999999999999999 00:00:00 GMT",  # OverflowError in the date parser
        "inf",
        "-inf",
        "nan",
        "1e400",
        "soon",
        "Mon, 99 Foo 2024 00:00:00 GMT",
    ],
)
def test_a_retry_after_no_clock_can_use_is_no_hint(value: str) -> None:
    assert parse_retry_after(_headers(retry_after=value)) is None


def test_retry_after_ms_that_is_no_number_of_seconds_falls_back_to_retry_after() -> None:
    assert parse_retry_after(_headers(retry_after_ms="inf", retry_after="3")) == 3.0
    assert parse_retry_after(_headers(retry_after_ms="nan")) is None
    assert parse_retry_after(_headers(retry_after_ms="1500", retry_after="3")) == 1.5


def test_readable_retry_afters_are_still_read() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after(_headers(retry_after="7")) == 7.0
    assert parse_retry_after(_headers(retry_after="-5")) == 0.0
    date = "Tue, 14 Nov 2023 22:13:30 GMT"  # 10 s after `now`
    assert parse_retry_after(_headers(retry_after=date), now=lambda: now) == pytest.approx(10.0)


@pytest.fixture
def berlin() -> Iterator[None]:
    """The local time zone is Berlin's (UTC+1 in winter), as on a server there."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_an_http_date_without_a_zone_is_gmt_whatever_the_local_zone(berlin: None) -> None:
    """'-0000' parses without a zone: read in local time, the last second of 9999 in Berlin was a year no
    datetime holds (ValueError); an HTTP date is GMT."""
    now = 253402300789.0  # 9999-12-31T23:59:49Z
    wait = parse_retry_after(_headers(retry_after="Fri, 31 Dec 9999 23:59:59 -0000"), now=lambda: now)
    assert wait == pytest.approx(10.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_429_with_a_retry_after_no_clock_can_use_is_retried(serve: Serve, kind: str, stream: bool) -> None:
    """The raw OverflowError escaped the adapter and the 429 was not retried."""
    limited = Reply(
        status=429,
        headers={"retry-after": "Mon, 01 Jan 99999999999999999999 00:00:00 GMT"},
        body={"error": {"message": "slow down"}},
    )

    def respond(request: Received) -> Reply:
        if request.n == 1:
            return limited
        if kind == "openai":
            return openai_stream(["hello"]) if stream else openai_completion("hello")
        return anthropic_stream(["hello"]) if stream else anthropic_message("hello")

    server = serve(respond)
    model = _model(kind, server.url, retry=bide.RetryPolicy(attempts=3, initial=0.01, maximum=0.05))
    started = time.monotonic()
    assert _turn(model, stream).content == "hello"
    assert len(server.requests) == 2
    assert time.monotonic() - started < 5  # the policy's own short wait, not an endless one


# -- a character split into its UTF-16 halves ----------------------------------------------------------------

_HIGH, _LOW = "\ud83d", "\ude00"  # U+1F600 as a JavaScript proxy slicing by code unit sends it


def _stream_of_text(kind: str, pieces: list[str]) -> Reply:
    if kind == "openai":
        return _events(*[_oa({"content": p}) for p in pieces], _oa({}, "stop"), "[DONE]")
    deltas = [_an_text(p) for p in pieces]
    return _anthropic_turn(_an_text_block(), *deltas, _an_stop(), stop="end_turn")


async def _deltas_and_turn(model: Any) -> tuple[list[str], bide.AssistantMessage]:
    out = [piece async for piece in model.stream(hi())]
    *deltas, turn = out
    return [d.text for d in deltas], turn


@pytest.mark.parametrize("kind", KINDS)
def test_a_character_split_into_its_utf16_halves_is_one_character(serve: Serve, kind: str) -> None:
    """The turn was refused every time (the journal cannot hold the halves), and each delta held one."""
    server = serve(lambda _: _stream_of_text(kind, ["Hi ", _HIGH, _LOW + "!", f"a{_HIGH}", f"{_LOW}b"]))
    deltas, turn = asyncio.run(_deltas_and_turn(_model(kind, server.url)))
    assert turn.content == "Hi \U0001f600!a\U0001f600b"
    assert "".join(deltas) == turn.content
    for text in deltas:
        text.encode("utf-8")  # no delta holds half a character


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_streams_a_split_character_and_journals_it(serve: Serve, kind: str) -> None:
    server = serve(lambda _: _stream_of_text(kind, ["Hi ", _HIGH, _LOW]))
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"))

    async def answer() -> str:
        last: object = None
        async for event in agent.stream("r", "hi"):
            last = event
        assert isinstance(last, bide.Finished)
        return str(last.result.answer)

    assert asyncio.run(asyncio.wait_for(answer(), 30)) == "Hi \U0001f600"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "pieces", [["Hi ", _HIGH], ["Hi ", _LOW], [f"a{_HIGH}b"], [_HIGH, _HIGH, _LOW], [_LOW, _HIGH]]
)
def test_a_lone_surrogate_in_streamed_text_is_a_model_error(
    serve: Serve, kind: str, pieces: list[str]
) -> None:
    server = serve(lambda _: _stream_of_text(kind, pieces))
    with pytest.raises(bide.ModelError, match="lone UTF-16 surrogate") as caught:
        _turn(_model(kind, server.url), True)
    str(caught.value).encode("utf-8")


@pytest.mark.parametrize("kind", KINDS)
def test_arguments_split_inside_a_character_are_read_whole(serve: Serve, kind: str) -> None:
    """A piece of a call's arguments ends with the first half of a character, the next begins with the
    second (raw halves in the JSON text, as a proxy slicing the arguments string sends them)."""
    parts = ['{"to": "al' + _HIGH, _LOW + 'ice"}']
    if kind == "openai":
        reply = _openai_turn(_oa_piece(parts[0], first=True), _oa_piece(parts[1]))
    else:
        reply = _anthropic_turn(_an_tool(), _an_json(parts[0]), _an_json(parts[1]), _an_stop())
    server = serve(lambda _: reply)
    turn = _turn(_model(kind, server.url), True)
    assert turn.tool_calls[0].arguments == {"to": "al\U0001f600ice"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_lone_surrogate_in_streamed_arguments_is_a_model_error(serve: Serve, kind: str) -> None:
    parts = ['{"to": "al' + _HIGH, 'ice"}']
    if kind == "openai":
        reply = _openai_turn(_oa_piece(parts[0], first=True), _oa_piece(parts[1]))
    else:
        reply = _anthropic_turn(_an_tool(), _an_json(parts[0]), _an_json(parts[1]), _an_stop())
    server = serve(lambda _: reply)
    with pytest.raises(bide.ModelError, match="lone UTF-16 surrogate"):
        _turn(_model(kind, server.url), True)


# -- a lone surrogate in a server's error message ------------------------------------------------------------


def _printable(error: BaseException) -> str:
    text = str(error)
    text.encode("utf-8")  # raised UnicodeEncodeError: printing or logging the error failed
    return text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [400, 503])
def test_an_error_message_with_a_lone_surrogate_can_be_printed(serve: Serve, kind: str, status: int) -> None:
    server = serve(lambda _: Reply(status=status, body={"error": {"message": "model \ud800 not found"}}))
    with pytest.raises(bide.ModelError) as caught:
        _turn(_model(kind, server.url), False)
    assert "model \\ud800 not found" in _printable(caught.value)


@pytest.mark.parametrize("kind", KINDS)
def test_a_mid_stream_error_with_a_lone_surrogate_can_be_printed(serve: Serve, kind: str) -> None:
    error = {"type": "overloaded_error", "message": "busy \udc80 now"}
    if kind == "openai":
        reply = _events(_oa({"content": "Hi"}), {"error": error})
    else:
        reply = _events(_an("message_start", message={}), {"type": "error", "error": error})
    server = serve(lambda _: reply)
    with pytest.raises(bide.ModelError, match="failed mid-stream") as caught:
        _turn(_model(kind, server.url), True)
    assert "busy \\udc80 now" in _printable(caught.value)


# -- timeout= ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, None, "5", True, 0, -1.0, 1e12])
def test_timeout_must_be_a_positive_number_of_seconds(kind: str, value: Any) -> None:
    """NaN raised a raw ValueError at the first request, None and infinity hung it, "5" a TypeError."""
    with pytest.raises(bide.ConfigError, match="needs timeout, a positive number of seconds"):
        _model(kind, "http://127.0.0.1:9", timeout=value)


@pytest.mark.parametrize("kind", KINDS)
def test_a_timeout_in_seconds_is_kept(kind: str) -> None:
    assert _model(kind, "http://127.0.0.1:9", timeout=5).timeout == 5.0
    assert _model(kind, "http://127.0.0.1:9", timeout=0.25).timeout == 0.25
    assert _model(kind, "http://127.0.0.1:9").timeout == 10.0
    assert bide.OpenAIModel("m", api_key="k").timeout == 60.0


# -- a flood of keep-alive lines -----------------------------------------------------------------------------


def _gzip(data: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return z.compress(data) + z.flush()


def _flood(kind: str, line: bytes) -> bytes:
    """A gzip stream of about 32 MiB of `line` (a few dozen KiB sent), then a whole turn saying "hi"."""
    if kind == "openai":
        tail = _events(_oa({"content": "hi"}, "stop"), "[DONE]")
    else:
        tail = _anthropic_turn(_an_text_block(), _an_text("hi"), _an_stop(), stop="end_turn")
    assert tail.events is not None
    end = b"".join(b"data: " + data.encode() + b"\n\n" for _, data in tail.events)
    return _gzip(line * ((32 * 2**20 - 4096) // len(line)) + end)


def _send(body: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        head = (
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        conn.sendall(head.encode() + body)

    return answer


async def _timed_turn(model: Any) -> tuple[bide.AssistantMessage | bide.ModelError, float, float]:
    """The stream's turn (or its ModelError), how long it took, and the longest the event loop stalled."""
    stall = 0.0

    async def beat() -> None:
        nonlocal stall
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            stall = max(stall, now - last - 0.01)
            last = now

    heart = asyncio.create_task(beat())
    started = time.monotonic()
    result: bide.AssistantMessage | bide.ModelError
    try:
        result = await one_turn(model, True)
    except bide.ModelError as exc:
        result = exc
    took = time.monotonic() - started
    await asyncio.sleep(0.05)
    heart.cancel()
    return result, took, stall


@pytest.mark.parametrize("kind", KINDS)
def test_a_flood_of_keep_alive_comments_is_cut_off_within_the_timeout(
    raw_server: StartServer, kind: str
) -> None:
    """32 MiB of ':' comments from 32 KiB of gzip: the event loop was blocked ~16 s and neither timeout
    fired (the time went on reading, not waiting); reading counts as waiting, and the loop gets turns."""
    server = raw_server(_send(_flood(kind, b":\n")))
    model = _model(kind, server.url, timeout=1, stream_timeout=3)
    result, took, stall = asyncio.run(_timed_turn(model))
    assert isinstance(result, bide.ModelError), result
    assert "adds to the answer for 1s" in str(result)
    # Loose bounds, for a loaded machine: the flood used to take ~16 s here, all of it one stall.
    assert took < 10
    assert stall < 5


@pytest.mark.parametrize("kind", KINDS)
def test_a_flood_of_blank_lines_is_read_without_stalling_the_loop(raw_server: StartServer, kind: str) -> None:
    """Blank lines after blank lines do nothing: a run of them is read at once, then the turn."""
    server = raw_server(_send(_flood(kind, b"\n")))
    model = _model(kind, server.url, timeout=2, stream_timeout=5)
    result, took, stall = asyncio.run(_timed_turn(model))
    assert isinstance(result, bide.AssistantMessage), result
    assert result.content == "hi"
    assert took < 10
    assert stall < 5


# -- an answer that decodes into far more than its bytes -----------------------------------------------------

_JUNK = [{}] * 300_000  # 600 KB of JSON; decoded, each {} is a dict of its own


def _answer_with_junk(kind: str, stream: bool, junk: Any) -> Reply:
    """A good answer ("hello") of `kind`, whole or streamed, whose first object also holds `junk`."""
    if kind == "openai":
        good = openai_stream(["hello"]) if stream else openai_completion("hello")
    else:
        good = anthropic_stream(["hello"]) if stream else anthropic_message("hello")
    if stream:
        assert good.events is not None
        event, data = good.events[0]
        return Reply(events=[(event, json.dumps(json.loads(data) | {"junk": junk})), *good.events[1:]])
    return Reply(body=good.body | {"junk": junk})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_answer_opening_more_json_objects_than_any_answer_holds_is_refused(
    serve: Serve, kind: str, stream: bool
) -> None:
    """The byte cap did not bound what decoding costs: `{"junk": [{}, {}, ...]}` under 32 MiB (32 KiB of
    gzip) decoded into 11 million dicts, about 830 MB, and the answer was taken. A text opening more than
    MAX_JSON_CONTAINERS objects and arrays is refused before it is decoded."""
    bloated = _answer_with_junk(kind, stream, _JUNK)
    server = serve(lambda request: bloated)
    with pytest.raises(bide.ModelError, match=r"opening 300,0\d\d objects and arrays, more than the 250,000"):
        _turn(_model(kind, server.url), stream)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_answer_of_more_values_than_any_answer_holds_is_refused(
    serve: Serve, kind: str, stream: bool
) -> None:
    """Only containers were counted: 32 MiB of `[0.5,0.5,...]` (a few hundred KiB of gzip) decoded into
    some 500 MB of floats. An answer holding more than MAX_JSON_SEPARATORS commas is refused before it is
    decoded."""
    bloated = _answer_with_junk(kind, stream, [0.5] * 1_100_000)
    server = serve(lambda request: bloated)
    with pytest.raises(bide.ModelError, match=r"holding 1,1\d\d,\d\d\d commas, more than the 1,000,000"):
        _turn(_model(kind, server.url), stream)


def test_a_call_whose_arguments_open_too_many_json_objects_never_runs(serve: Serve) -> None:
    """Arguments are text inside the answer: their objects count toward the answer's (the turn is a
    ModelError, nothing journaled, the tool not run), and the run goes on once the model answers sanely."""
    fired: list[int] = []

    @bide.tool()
    def take(items: list[dict[str, Any]]) -> str:
        """Take items."""
        fired.append(len(items))
        return "taken"

    answers = iter(
        [
            openai_completion(calls=[("call_1", "take", {"items": _JUNK})]),
            openai_completion(calls=[("call_1", "take", {"items": [{}, {}]})]),
            openai_completion("taken two"),
        ]
    )
    server = serve(lambda request: next(answers))
    agent = bide.Agent(_model("openai", server.url), store=bide.open_store("memory://"), tools=[take])
    with pytest.raises(bide.ModelError, match="objects and arrays"):
        agent.run_sync("r", "take them")
    assert fired == [] and bide.run_status(agent.store, "r").status == "not_started"
    assert agent.run_sync("r", "take them").answer == "taken two"
    assert fired == [2]
