"""Model servers that misbehave, part two: compressed bodies that inflate past any limit, turns cut off at
the token limit, pieces of two tool calls spliced into one, streams that never end or end empty, bytes
that are not UTF-8, turns with millions of tool calls, keys named twice, tool calls without arguments,
answers with several choices. Each is a `bide.ModelError` with nothing of the turn journaled (or, for
arguments, an error the model sees), never a side-effect tool fired on the strength of it, in bounded
memory and time; and the run resumes on a model that behaves. A byte-order mark opening an answer is
not part of it."""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import os
import socket
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from raw_http import StartServer, hi, one_turn, tool_results_sent

import bide
from bide.testing import Call as ScriptedCall
from bide.testing import (
    LoopbackServer,
    Received,
    Reply,
    ScriptedModel,
    Turn,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_stream,
)

# -- servers -------------------------------------------------------------------------------------------------


def _answer(
    body: bytes, *, status: int = 200, stream: bool = False, headers: dict[str, str] | None = None
) -> Callable[[socket.socket], None]:
    """An answer of `body` with its length, as JSON or an event stream, with extra `headers`."""

    def answer(conn: socket.socket) -> None:
        kind = "text/event-stream" if stream else "application/json"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {len(body)}\r\n{extra}"
        conn.sendall(head.encode() + b"connection: close\r\n\r\n" + body)

    return answer


def _forever(head: bytes, piece: bytes, every: float) -> Callable[[socket.socket], None]:
    """An event stream that sends `head`, then `piece` every `every` seconds until the client leaves."""

    def answer(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + head
        )
        for _ in range(100_000):
            conn.sendall(piece)
            time.sleep(every)

    return answer


# -- models, requests and runs -------------------------------------------------------------------------------

_ONCE = bide.RetryPolicy(attempts=1)


def _model(kind: str, url: str, **options: Any) -> bide.OpenAIModel | bide.AnthropicModel:
    options.setdefault("retry", _ONCE)
    options.setdefault("timeout", 10)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key="k", base_url=f"{url}/v1", **options)
    return bide.AnthropicModel("m", api_key="k", base_url=url, **options)


def _turn(
    model: bide.Model, stream: bool, *, within: float = 30, request: bide.ModelRequest | None = None
) -> bide.AssistantMessage:
    """One turn of `model`; a call that outlasts `within` seconds fails the test (instead of hanging)."""
    return asyncio.run(asyncio.wait_for(one_turn(model, stream, request), within))


def _sse(*payloads: Any) -> bytes:
    return b"".join(
        b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + b"\n\n" for p in payloads
    )


def _oa_chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {"choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


def _oa_call_piece(index: int, args: str, cid: str | None = None, name: str | None = None) -> dict[str, Any]:
    piece: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if cid is not None:
        piece["id"] = cid
        piece["type"] = "function"
    if name is not None:
        piece["function"]["name"] = name
    return _oa_chunk({"tool_calls": [piece]})


def _ev(kind: str, **data: Any) -> tuple[str, str]:
    return kind, json.dumps({"type": kind, **data})


def _an_events(blocks: list[tuple[str, str]], stop: str = "tool_use", start: bool = True) -> Reply:
    """An Anthropic stream: message_start (unless not `start`), `blocks`, message_delta with `stop`,
    message_stop."""
    events = (
        [_ev("message_start", message={"usage": {"input_tokens": 1, "output_tokens": 1}})] if start else []
    )
    events += blocks
    events.append(_ev("message_delta", delta={"stop_reason": stop}, usage={"output_tokens": 1}))
    events.append(_ev("message_stop"))
    return Reply(events=events)


def _tool_start(index: int, cid: str = "t1", given: Any = None, name: str = "fire") -> tuple[str, str]:
    block = {"type": "tool_use", "id": cid, "name": name, "input": {} if given is None else given}
    return _ev("content_block_start", index=index, content_block=block)


def _json_delta(index: int, text: str) -> tuple[str, str]:
    return _ev("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": text})


def _block_stop(index: int) -> tuple[str, str]:
    return _ev("content_block_stop", index=index)


class _Fired:
    """A side-effect tool `fire(n=1, note="")` (its defaults matter: a call without arguments still runs)
    and the `n` of each call it fired."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        fired = self.calls

        @bide.tool
        def fire(n: int = 1, note: str = "") -> str:
            """Fire the side effect."""
            fired.append(n)
            return f"fired {n} {note}"

        self.tool = fire


def _good(kind: str, request: Received) -> Reply:
    """A model that behaves: it calls fire(n=3) once, then answers "done"."""
    stream = bool(request.body.get("stream"))
    if kind == "openai":
        if tool_results_sent(request):
            return openai_stream(["done"]) if stream else openai_completion("done")
        calls = [("g1", "fire", {"n": 3})]
        return openai_stream(calls=calls) if stream else openai_completion(calls=calls)
    if tool_results_sent(request):
        return anthropic_stream(["done"]) if stream else anthropic_message("done")
    calls = [("g1", "fire", {"n": 3})]
    return anthropic_stream(calls=calls) if stream else anthropic_message(calls=calls)


async def _drive_async(agent: bide.Agent[Any], run_id: str, stream: bool) -> bide.RunResult[Any]:
    if not stream:
        return await agent.run(run_id, "please fire once")
    last: object = None
    async for event in agent.stream(run_id, "please fire once"):
        last = event
    assert isinstance(last, bide.Finished)
    return last.result  # type: ignore[no-any-return]


def _drive(agent: bide.Agent[Any], run_id: str, stream: bool) -> bide.RunResult[Any]:
    return asyncio.run(asyncio.wait_for(_drive_async(agent, run_id, stream), 30))


def _refused_then_resumed(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
    kind: str,
    stream: bool,
    hostile: Reply,
    match: str,
) -> None:
    """A run whose first model turn is `hostile`: ModelError matching `match`, the tool not fired, nothing
    journaled; run again on a model that behaves, it completes and fires once, with that model's n=3."""
    server = serve(lambda request: hostile if request.n == 1 else _good(kind, request))
    fired = _Fired()
    store = bide.open_store("memory://")
    agent = bide.Agent(_model(kind, server.url), store=store, tools=[fired.tool])
    with pytest.raises(bide.ModelError, match=match):
        _drive(agent, "run", stream)
    assert fired.calls == []
    assert store.load("run") == []  # nothing of the turn (nor of the run) was journaled
    result = _drive(agent, "run", stream)
    assert result.answer == "done"
    assert fired.calls == [3]


# -- compressed bodies ---------------------------------------------------------------------------------------

_BOMB_BYTES = 256 * 2**20


@functools.cache
def _bomb() -> bytes:
    """gzip of 256 MiB of zeros (about 250 KB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(2**20)
    return b"".join([z.compress(block) for _ in range(_BOMB_BYTES // len(block))] + [z.flush()])


def _peak(call: Callable[[], object]) -> tuple[int, bide.ModelError]:
    """The most memory Python held while `call` ran, and the ModelError it raised."""
    tracemalloc.start()
    try:
        with pytest.raises(bide.ModelError) as caught:
            call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, caught.value


@pytest.mark.parametrize("stream", [False, True])
def test_a_body_gzipped_twice_is_refused_unread(
    raw_server: StartServer, stream: bool
) -> None:
    """`Content-Encoding: gzip, gzip`, a few hundred bytes that inflate to 256 MiB: httpx inflated each
    network chunk in one call, so the whole 256 MiB was held before the size limit was checked (a
    2 GiB one took 2 GB). bide decodes one layer itself and refuses a second."""
    server = raw_server(
        _answer(gzip.compress(_bomb()), stream=stream, headers={"content-encoding": "gzip, gzip"})
    )
    peak, error = _peak(functools.partial(_turn, _model("openai", server.url), stream))
    assert peak < 16 * 2**20, peak
    assert "Content-Encoding 'gzip, gzip'" in str(error)
    assert server.headers[0]["accept-encoding"] == "gzip, deflate"  # what bide decodes, nothing else


@pytest.mark.parametrize("stream", [False, True])
def test_a_gzip_bomb_is_inflated_only_a_step_past_the_limit(
    raw_server: StartServer, stream: bool
) -> None:
    """One layer of gzip inflating to 256 MiB: refused at 32 MiB, each network chunk inflated a bounded
    step at a time (httpx inflated a 64 KiB chunk to 64 MiB at once)."""
    server = raw_server(_answer(_bomb(), stream=stream, headers={"content-encoding": "gzip"}))
    peak, error = _peak(functools.partial(_turn, _model("openai", server.url), stream))
    assert peak < 40 * 2**20, peak  # the 32 MiB read up to the limit, and a little
    assert "larger than 32 MiB" in str(error)


_PEAK_OF_A_TURN = """
import asyncio, resource, sys
import bide
async def main():
    model = bide.OpenAIModel("m", api_key="k", base_url=sys.argv[1], max_retries=0, timeout=120)
    request = bide.ModelRequest(run_id="r", turn=0, messages=[bide.UserMessage(content="hi")], tools=())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        async with model:
            async for _ in model.stream(request):
                pass
    except bide.ModelError as exc:
        print(exc)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
asyncio.run(main())
"""


def test_a_stream_of_tiny_data_lines_is_refused_at_the_limit_without_ten_times_the_memory(
    raw_server: StartServer,
) -> None:
    """An event of millions of `data:xy` lines (never ended by a blank line) was refused at 32 MiB, after
    holding one string per line: some 300 MiB more memory. The lines of an event are joined as they come.
    (In a process of its own, whose peak memory is the turn's.)"""
    lines = b"data:xy\n" * (33 * 2**20 // 8)
    server = raw_server(_answer(gzip.compress(lines), stream=True, headers={"content-encoding": "gzip"}))
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_OF_A_TURN, server.url + "/v1"], capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    said, grew = done.stdout.strip().splitlines()
    assert "larger than 32 MiB" in said, done.stdout + done.stderr
    assert int(grew) < 100, f"the turn took {grew} MiB more"


def test_an_error_body_gzipped_twice_is_not_inflated_and_the_status_still_counts(
    raw_server: StartServer,
) -> None:
    """A 429 whose body inflates to 256 MiB: its text is not read, and it is still waited out and retried
    like any 429 (two tries here), then reported."""
    bomb = gzip.compress(_bomb())
    server = raw_server(
        _answer(bomb, status=429, headers={"content-encoding": "gzip, gzip", "retry-after": "0"})
    )
    model = _model("openai", server.url, retry=bide.RetryPolicy(attempts=2, initial=0.01))
    peak, error = _peak(functools.partial(_turn, model, False))
    assert peak < 16 * 2**20, peak
    assert "failed after 2 attempts: HTTP 429" in str(error)
    assert len(server.headers) == 2


def _deflate_raw(data: bytes) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return z.compress(data) + z.flush()


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),  # zlib-wrapped, as the standard says
        ("deflate", _deflate_raw),  # raw, as some servers send it
        ("identity", lambda data: data),
        ("GZIP, identity", gzip.compress),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_in_one_layer_of_gzip_or_deflate_is_read(
    raw_server: StartServer,
    encoding: str,
    encode: Callable[[bytes], bytes],
    stream: bool,
) -> None:
    long_text = "Sunny in Paris. " * 20_000  # 320 KB: many steps of inflation
    if stream:
        body = _sse(_oa_chunk({"content": long_text}), _oa_chunk({}, "stop"), b"[DONE]")
    else:
        body = json.dumps(openai_completion(long_text).body).encode()
    server = raw_server(_answer(encode(body), stream=stream, headers={"content-encoding": encoding}))
    turn = _turn(_model("openai", server.url), stream)
    assert turn.content == long_text


@pytest.mark.parametrize(
    ("encoding", "body", "match"),
    [
        ("gzip", b"\x1f\x8b\x08\x00garbage, not gzip" * 10, "corrupt"),
        ("deflate", b"\x78\x9c" + b"\xff" * 40, "corrupt"),
        ("gzip", gzip.compress(b'{"choices": []}', mtime=0)[:-6], "ended in the middle"),
        ("gzip", gzip.compress(b'{"choices": []}', mtime=0) + b"trailing junk", "follows the end"),
        ("br", b"\x0b\x02\x80{}\x03", "Content-Encoding 'br'"),
        ("gzip, deflate", zlib.compress(gzip.compress(b"{}", mtime=0)), "Content-Encoding 'gzip, deflate'"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_body_bide_cannot_decode_is_a_model_error(
    raw_server: StartServer,
    encoding: str,
    body: bytes,
    match: str,
    stream: bool,
) -> None:
    """Corrupt, cut-off, trailing or unasked-for encodings: ModelError (httpx raised its own DecodingError
    for a corrupt body, which is no bide error)."""
    server = raw_server(_answer(body, stream=stream, headers={"content-encoding": encoding}))
    with pytest.raises(bide.ModelError, match=match):
        _turn(_model("openai", server.url), stream)


# -- a turn cut off at the token limit -----------------------------------------------------------------------


def _cut_off(kind: str, stream: bool) -> Reply:
    """A turn the token limit cut off right after its tool call's name: no arguments at all."""
    if kind == "openai" and not stream:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "fire"}}],
        }
        return Reply(body={"choices": [{"index": 0, "message": message, "finish_reason": "length"}]})
    if kind == "openai":
        events = [
            _sse_event(_oa_call_piece(0, "", "c1", "fire")),
            _sse_event(_oa_chunk({}, "length")),
            ("", "[DONE]"),
        ]
        return Reply(events=events)
    if not stream:
        block = {"type": "tool_use", "id": "t1", "name": "fire", "input": {}}
        return Reply(body={"content": [block], "stop_reason": "max_tokens"})
    return _an_events([_tool_start(0)], stop="max_tokens")


def _sse_event(payload: Any) -> tuple[str, str]:
    return "", json.dumps(payload)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_cut_off_at_the_token_limit_fires_no_tool(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str, stream: bool
) -> None:
    """The missing arguments used to become {} and the side effect fired with its defaults."""
    _refused_then_resumed(serve, kind, stream, _cut_off(kind, stream), "cut off at its output token limit")


def _finished_twice(kind: str, how: str) -> Reply:
    """A streamed turn whose finish is contradicted: a second, other finish ("length" then "tool_calls"),
    or a tool call streamed after the answer was finished as text."""
    if kind == "openai":
        call = _sse_event(_oa_call_piece(0, '{"n": 7}', "c1", "fire"))
        if how == "second finish":
            events = [call, _sse_event(_oa_chunk({}, "length")), _sse_event(_oa_chunk({}, "tool_calls"))]
        else:
            answered = _sse_event(_oa_chunk({"content": "ok"}, "stop"))
            events = [answered, call, _sse_event(_oa_chunk({}, "tool_calls"))]
        return Reply(events=[*events, ("", "[DONE]")])
    start = _ev("message_start", message={"usage": {"input_tokens": 1, "output_tokens": 1}})
    fire = [_tool_start(0), _json_delta(0, '{"n": 7}'), _block_stop(0)]
    if how == "second finish":
        middle = [*fire, _ev("message_delta", delta={"stop_reason": "max_tokens"})]
    else:
        middle = [_ev("message_delta", delta={"stop_reason": "end_turn"}), *fire]
    end = [_ev("message_delta", delta={"stop_reason": "tool_use"}), _ev("message_stop")]
    return Reply(events=[start, *middle, *end])


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("how", ["second finish", "call after the finish"])
def test_a_stream_that_contradicts_its_finish_fires_no_tool(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str, how: str
) -> None:
    """A later finish overwrote the first: a turn cut off at its token limit ("length", then "tool_calls")
    ran its call, and so did a call streamed after the answer had finished as text."""
    reason = "(finish reason|stop_reason)"
    said = f"second {reason}" if how == "second finish" else f"after the {reason}"
    _refused_then_resumed(serve, kind, True, _finished_twice(kind, how), said)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_tool_arguments_with_a_number_json_cannot_hold_go_back_to_the_model(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str, stream: bool, number: float
) -> None:
    """Arguments holding NaN, Infinity or 1e400 (read as an infinity) failed the whole turn ("a turn the
    journal cannot hold"), every time the run was driven again: the run was stuck for good. They are
    arguments the model got wrong: the model is told, the tool does not run, the run goes on."""
    calls = [("g1", "fire", {"n": number})]

    def answer(request: Received) -> Reply:
        if tool_results_sent(request):
            return _good(kind, request)
        if kind == "openai":
            return openai_stream(calls=calls) if stream else openai_completion(calls=calls)
        return anthropic_stream(calls=calls) if stream else anthropic_message(calls=calls)

    server = serve(answer)
    fired = _Fired()
    store = bide.open_store("memory://")
    agent = bide.Agent(_model(kind, server.url), store=store, tools=[fired.tool])
    assert _drive(agent, "run", stream).answer == "done"
    assert fired.calls == []
    [told] = [r for r in bide.Journal(store, "run").load().records() if isinstance(r, bide.ToolResult)]
    assert told.is_error and told.tool == "fire"


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_api_key_quoted_back_with_json_escapes_is_masked_too(raw_server: StartServer, kind: str) -> None:
    """PHP writes `/` as `\\/` in JSON: the raw body did not hold the key as given, and the decoded
    message printed in the 401's ModelError did."""
    key = "sk-AbCd/EfGh+IjKl0123=="
    quoted = key.replace("/", "\\/")
    body = ('{"error": {"message": "bad key ' + quoted + '"}}').encode()
    server = raw_server(_answer(body, status=401))
    cls = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    model = cls("m", api_key=key, base_url=server.url, retry=_ONCE)
    with pytest.raises(bide.ModelError, match=r"answered 401: bad key \*\*\*") as info:
        _turn(model, False)
    assert key not in str(info.value) and "EfGh" not in (info.value.body or "")


def _filtered(kind: str, stream: bool) -> Reply:
    """A turn with a whole tool call that the provider's content filter stopped."""
    if kind == "openai" and not stream:
        call = {"id": "c1", "type": "function", "function": {"name": "fire", "arguments": '{"n": 7}'}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return Reply(body={"choices": [{"index": 0, "message": message, "finish_reason": "content_filter"}]})
    if kind == "openai":
        piece = _sse_event(_oa_call_piece(0, '{"n": 7}', "c1", "fire"))
        events = [piece, _sse_event(_oa_chunk({}, "content_filter"))]
        return Reply(events=[*events, ("", "[DONE]")])
    if not stream:
        block = {"type": "tool_use", "id": "t1", "name": "fire", "input": {"n": 7}}
        return Reply(body={"content": [block], "stop_reason": "refusal"})
    return _an_events([_tool_start(0), _json_delta(0, '{"n": 7}'), _block_stop(0)], stop="refusal")


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_the_content_filter_stopped_fires_no_tool(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str, stream: bool
) -> None:
    """A turn stopped by the provider's filter ("content_filter", "refusal") with a tool call in it ran the
    call, which the filter may have cut short."""
    said = "stopped by the provider's content filter"
    _refused_then_resumed(serve, kind, stream, _filtered(kind, stream), said)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "1e400"])
def test_openai_arguments_sent_as_an_object_with_a_number_json_cannot_hold_go_back_to_the_model(
    raw_server: StartServer, number: str
) -> None:
    """Some servers send a call's arguments as a JSON object, not as text: one holding NaN failed the whole
    turn every time, as text arguments did before."""
    arguments = '{"n": ' + number + "}"  # not JSON: written by hand
    call = '{"id": "c1", "type": "function", "function": {"name": "fire", "arguments": ' + arguments + "}}"
    first = ('{"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", '
             '"content": null, "tool_calls": [' + call + "]}}]}").encode()  # fmt: skip
    done = json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                       "content": "done"}}]}).encode()  # fmt: skip
    answers = iter([_answer(first), _answer(done)])
    server = raw_server(lambda conn: next(answers)(conn))
    fired = _Fired()
    store = bide.open_store("memory://")
    agent = bide.Agent(_model("openai", server.url), store=store, tools=[fired.tool])
    assert _drive(agent, "run", False).answer == "done"
    assert fired.calls == []
    [told] = [r for r in bide.Journal(store, "run").load().records() if isinstance(r, bide.ToolResult)]
    assert told.is_error


def test_a_cut_off_text_answer_is_still_an_answer(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
) -> None:
    """Only tool calls are refused: a text answer cut short is the model's answer, its finish reason
    journaled with it."""
    server = serve(lambda request: openai_completion("Sunny in", finish_reason="length"))
    turn = _turn(_model("openai", server.url), False)
    assert turn.content == "Sunny in" and turn.finish_reason == "length"


# -- OpenAI: pieces of two calls, or of two choices, spliced into one ----------------------------------------


def _spliced(how: str) -> Reply:
    first = _sse_event(_oa_call_piece(0, '{"n": ', "A", "fire"))
    if how == "id":
        second = _sse_event(_oa_call_piece(0, "7}", "B"))
    elif how == "name":
        second = _sse_event(_oa_call_piece(0, "7}", "A", "other"))
    else:
        second = _sse_event(
            {
                "choices": [
                    {"index": 1, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "7}"}}]}}
                ]
            }
        )
    return Reply(events=[first, second, _sse_event(_oa_chunk({}, "tool_calls")), ("", "[DONE]")])


@pytest.mark.parametrize(
    ("how", "match"), [("id", "ids 'A' and 'B'"), ("name", "names"), ("choice", "second choice")]
)
def test_pieces_of_two_openai_calls_are_not_spliced_into_one(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], how: str, match: str
) -> None:
    """`{"n": ` of call A and `7}` of call B (or of choice 1) made one call {"n": 7} that fired."""
    _refused_then_resumed(serve, "openai", True, _spliced(how), match)


def test_openai_pieces_that_repeat_their_id_and_name_are_one_call(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
) -> None:
    """Some servers repeat a call's id and name in each piece (or send an empty name): still one call."""
    events = [
        _sse_event(_oa_call_piece(0, '{"n": ', "A", "fire")),
        _sse_event(_oa_call_piece(0, "4", "A", "")),
        _sse_event(_oa_call_piece(0, "}", "A", "fire")),
        _sse_event(_oa_chunk({}, "tool_calls")),
        ("", "[DONE]"),
    ]
    server = serve(lambda request: Reply(events=events))
    [call] = _turn(_model("openai", server.url), True).tool_calls
    assert (call.id, call.name, call.arguments) == ("A", "fire", {"n": 4})


# -- Anthropic: blocks out of order --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocks", "match"),
    [
        ([_json_delta(0, '{"n": 5}'), _tool_start(0), _block_stop(0)], "before its content_block_start"),
        (
            [_tool_start(0), _json_delta(0, '{"n": 5}'), _tool_start(0, "t2"), _block_stop(0)],
            "second content_block_start",
        ),
        ([_tool_start(0), _json_delta(0, '{"n": 5}')], "without its content_block_stop"),
        ([_tool_start(0), _block_stop(0), _json_delta(0, '{"n": 5}')], "after its content_block_stop"),
        ([_tool_start(0, given={"n": 5}), _json_delta(0, '{"n": 6}'), _block_stop(0)], "input in its start"),
        ([_tool_start(0, given="n=5"), _block_stop(0)], "input is not an object"),
        ([_block_stop(0)], "without its content_block_start"),
    ],
    ids=[
        "delta-before-start",
        "started-twice",
        "no-stop",
        "delta-after-stop",
        "input-twice",
        "bad-input",
        "stop-only",
    ],
)
def test_anthropic_blocks_out_of_order_fire_no_tool(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], blocks: list[tuple[str, str]], match: str
) -> None:
    """A delta before its start, or a block started again, dropped the received input and the tool ran
    with its defaults; a block never stopped may be cut short."""
    _refused_then_resumed(serve, "anthropic", True, _an_events(blocks), match)


def test_an_anthropic_input_given_in_the_block_start_is_the_calls_input(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
) -> None:
    """A start carrying the whole input, and no deltas, came out as {}."""
    server = serve(lambda request: _an_events([_tool_start(0, given={"n": 9}), _block_stop(0)]))
    [call] = _turn(_model("anthropic", server.url), True).tool_calls
    assert call.arguments == {"n": 9}


# -- streams that never end ----------------------------------------------------------------------------------

_OPENAI_TEXT = _sse(_oa_chunk({"content": "Sunny"}))


@pytest.mark.parametrize(
    ("kind", "piece"),
    [
        ("openai", b": keep-alive\n\n"),
        ("openai", _sse(_oa_chunk({}))),  # an empty delta
        ("openai", _sse(_oa_chunk({"role": "assistant", "content": ""}))),
        ("openai", b":"),  # one line of colons that never ends
        ("anthropic", b'event: ping\ndata: {"type": "ping"}\n\n'),
        (
            "anthropic",
            _sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}),
        ),
        # The same counts, or the same finish, again and again: only the first adds (each used to count).
        ("openai", _sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})),
        ("openai", _sse(_oa_chunk({}, "stop"))),
    ],
    ids=["comment", "empty-delta", "role-only", "colons", "ping", "empty-text", "same-usage", "same-finish"],
)
def test_a_stream_of_keep_alives_is_cut_off_after_the_timeout(
    raw_server: StartServer, kind: str, piece: bytes
) -> None:
    """A piece every 0.05 s that adds nothing to the answer held a stream forever (each wait between
    pieces was bounded, nothing else): now the wait for a piece that adds is bounded by `timeout`."""
    head = b""
    if kind == "anthropic":
        head = _sse(
            {"type": "message_start", "message": {"usage": {}}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )
    server = raw_server(_forever(head, piece, 0.05))
    started = time.monotonic()
    with pytest.raises(bide.ModelError, match=r"nothing that adds to the answer for 0\.5s"):
        _turn(_model(kind, server.url, timeout=0.5), True, within=20)
    assert time.monotonic() - started < 5


def test_a_stream_that_writes_forever_is_cut_off_at_the_stream_timeout(
    raw_server: StartServer,
) -> None:
    """Real text every 0.05 s, forever: every piece adds, so only the bound of the whole stream ends it."""
    server = raw_server(_forever(b"", _OPENAI_TEXT, 0.05))
    started = time.monotonic()
    with pytest.raises(bide.ModelError, match="did not end within the model's stream_timeout of 1s"):
        _turn(_model("openai", server.url, timeout=0.5, stream_timeout=1), True, within=20)
    assert time.monotonic() - started < 5


def test_a_run_on_a_stream_that_never_ends_fails_and_resumes(
    raw_server: StartServer,
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
) -> None:
    """Through `agent.stream`: the stream of keep-alives ends the drive with ModelError (it held it
    forever), nothing is journaled, and the run resumes on a model that behaves."""
    hostile = raw_server(_forever(b"", b": keep-alive\n\n", 0.05))
    fired = _Fired()
    store = bide.open_store("memory://")
    agent = bide.Agent(_model("openai", hostile.url, timeout=0.5), store=store, tools=[fired.tool])
    with pytest.raises(bide.ModelError, match="nothing that adds"):
        _drive(agent, "run", True)
    assert store.load("run") == []
    good = serve(lambda request: _good("openai", request))
    agent = bide.Agent(_model("openai", good.url), store=store, tools=[fired.tool])
    assert _drive(agent, "run", True).answer == "done" and fired.calls == [3]


def test_keep_alives_between_pieces_that_add_do_not_cut_a_stream(
    raw_server: StartServer,
) -> None:
    """A slow but honest stream: a piece of text every 0.3 s, keep-alives between, a timeout of 1 s, which
    the whole stream (1.8 s) outlasts. The timeout is well over the gap between pieces, so that a server
    thread held up on a loaded machine does not cut the stream."""

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        for word in ("It ", "is ", "sunny ", "in ", "Paris ", "today."):
            for _ in range(3):
                conn.sendall(b": keep-alive\n\n")
                time.sleep(0.1)
            conn.sendall(_sse(_oa_chunk({"content": word})))
        conn.sendall(_sse(_oa_chunk({}, "stop"), b"[DONE]"))

    server = raw_server(answer)
    assert _turn(_model("openai", server.url, timeout=1.0), True).content == "It is sunny in Paris today."


def test_the_time_a_caller_takes_between_pieces_is_not_the_servers(
    raw_server: StartServer,
) -> None:
    """The bounds count the waits for the server: a caller that takes 0.4 s over each piece of a stream
    sent at once is not cut off by a timeout of 0.3 s or a stream_timeout of 1 s."""
    words = [f"w{i} " for i in range(4)]
    body = _sse(*[_oa_chunk({"content": w}) for w in words], _oa_chunk({}, "stop"), b"[DONE]")
    server = raw_server(_answer(body, stream=True))
    model = _model("openai", server.url, timeout=0.3, stream_timeout=1)

    async def slow_reader() -> bide.AssistantMessage:
        async for piece in model.stream(hi()):
            if isinstance(piece, bide.AssistantMessage):
                return piece
            await asyncio.sleep(0.4)
        raise AssertionError("no turn")

    assert asyncio.run(slow_reader()).content == "".join(words)


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "60", True, None])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_stream_timeout_must_be_a_positive_number(kind: str, value: Any) -> None:
    with pytest.raises(bide.ConfigError, match="stream_timeout"):
        _model(kind, "http://127.0.0.1:9", stream_timeout=value)


def test_stream_timeout_defaults_to_ten_minutes() -> None:
    assert _model("openai", "http://127.0.0.1:9").stream_timeout == 600.0
    assert _model("anthropic", "http://127.0.0.1:9", stream_timeout=30).stream_timeout == 30.0


# -- bytes that are not UTF-8 --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["arguments", "text"])
def test_a_stream_line_that_is_not_utf8_is_a_model_error(
    raw_server: StartServer,
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
    where: str,
) -> None:
    """The bytes were replaced by U+FFFD and the tool fired with arguments the model did not write (a
    whole answer with the same bytes was refused already)."""
    if where == "arguments":
        piece = b'{"index":0,"function":{"arguments":"{\\"n\\": 1, \\"note\\": \\"caf\xe9\\"}"}}'
        bad = b'{"choices":[{"index":0,"delta":{"tool_calls":[' + piece + b"]}}]}"
    else:
        bad = b'{"choices":[{"index":0,"delta":{"content":"caf\xe9 \xff"}}]}'
    body = _sse(_oa_call_piece(0, "", "c1", "fire"), bad, _oa_chunk({}, "tool_calls"), b"[DONE]")
    hostile = raw_server(_answer(body, stream=True))
    fired = _Fired()
    store = bide.open_store("memory://")
    agent = bide.Agent(_model("openai", hostile.url), store=store, tools=[fired.tool])
    with pytest.raises(bide.ModelError, match="not UTF-8"):
        _drive(agent, "run", True)
    assert fired.calls == [] and store.load("run") == []
    good = serve(lambda request: _good("openai", request))
    agent = bide.Agent(_model("openai", good.url), store=store, tools=[fired.tool])
    assert _drive(agent, "run", True).answer == "done" and fired.calls == [3]


def test_utf8_split_across_network_chunks_is_read(
    raw_server: StartServer,
) -> None:
    """Strict decoding is of whole lines: a character split between two chunks is one character."""
    line = b"data: " + json.dumps(_oa_chunk({"content": "café ☕"}), ensure_ascii=False).encode() + b"\n\n"
    cut = line.index("☕".encode()) + 1

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        conn.sendall(line[:cut])
        time.sleep(0.1)
        conn.sendall(line[cut:] + _sse(_oa_chunk({}, "stop"), b"[DONE]"))

    assert _turn(_model("openai", raw_server(answer).url), True).content == "café ☕"


# -- streams that end without a turn -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "reply"),
    [
        ("openai", Reply(events=[("", "[DONE]")])),
        ("openai", Reply(events=[_sse_event(_oa_chunk({"content": "partial"})), ("", "[DONE]")])),
        ("anthropic", Reply(events=[_ev("message_stop")])),
        (
            "anthropic",
            Reply(
                events=[
                    _ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
                    _ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "partial"}),
                    _ev("content_block_stop", index=0),
                    _ev("message_stop"),
                ]
            ),
        ),
        (
            "anthropic",
            Reply(events=[_ev("message_start", message={"usage": {}}), _ev("message_stop")]),
        ),
    ],
    ids=["done-only", "no-finish-reason", "stop-only", "no-message-start", "no-stop-reason"],
)
def test_a_stream_that_ends_without_its_turn_ends_no_run(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str, reply: Reply
) -> None:
    """An empty (or unfinished) answer used to end the run for good."""
    _refused_then_resumed(serve, kind, True, reply, "the stream ended before the turn did")


# -- millions of tool calls ----------------------------------------------------------------------------------


def test_the_agent_refuses_a_turn_with_more_tool_calls_than_its_limit() -> None:
    """From any model (here a scripted one): 257 calls are refused before anything is journaled; 256 run."""
    fired: list[int] = []

    @bide.tool(safety=bide.ReadOnly)
    def look(n: int) -> str:
        """Look something up."""
        fired.append(n)
        return "ok"

    def turn(count: int) -> Turn:
        return Turn(calls=tuple(ScriptedCall("look", {"n": i}) for i in range(count)))

    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([turn(257), Turn(text="done")]), store=store, tools=[look])
    with pytest.raises(bide.ModelError, match="257 tool calls in one turn, more than bide's limit of 256"):
        agent.run_sync("many", "go")
    assert fired == [] and store.load("many") == []
    agent = bide.Agent(ScriptedModel([turn(256), Turn(text="done")]), store=store, tools=[look])
    assert agent.run_sync("enough", "go").answer == "done"
    assert sorted(fired) == list(range(256))


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_adapter_stops_reading_calls_past_the_limit(
    raw_server: StartServer, kind: str, stream: bool
) -> None:
    """20,000 calls in one answer: refused by the adapter, before it makes a ToolCall of each."""
    count = 20_000
    if kind == "openai" and not stream:
        calls = [{"id": f"c{i}", "function": {"name": "fire", "arguments": "{}"}} for i in range(count)]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        body = json.dumps({"choices": [{"message": message, "finish_reason": "tool_calls"}]}).encode()
    elif kind == "openai":
        pieces = [
            {"index": i, "id": f"c{i}", "function": {"name": "fire", "arguments": "{}"}} for i in range(count)
        ]
        body = _sse(_oa_chunk({"tool_calls": pieces}), _oa_chunk({}, "tool_calls"), b"[DONE]")
    elif not stream:
        blocks = [{"type": "tool_use", "id": f"t{i}", "name": "fire", "input": {}} for i in range(count)]
        body = json.dumps({"content": blocks, "stop_reason": "tool_use"}).encode()
    else:
        events: list[dict[str, Any]] = [{"type": "message_start", "message": {"usage": {}}}]
        for i in range(count):
            block = {"type": "tool_use", "id": f"t{i}", "name": "fire", "input": {}}
            events += [
                {"type": "content_block_start", "index": i, "content_block": block},
                {"type": "content_block_stop", "index": i},
            ]
        events += [{"type": "message_delta", "delta": {"stop_reason": "tool_use"}}, {"type": "message_stop"}]
        body = _sse(*events)
    server = raw_server(_answer(body, stream=stream))
    with pytest.raises(bide.ModelError, match="more than 256 tool calls in one turn"):
        _turn(_model(kind, server.url), stream)


# -- keys named twice ----------------------------------------------------------------------------------------


_TWICE = '{"n": 1, "n": 2}'


@pytest.mark.parametrize(
    ("kind", "stream", "hostile"),
    [
        (
            "openai",
            False,
            Reply(
                body={
                    "choices": [
                        {
                            "message": {
                                "content": None,
                                "tool_calls": [
                                    {"id": "c1", "function": {"name": "fire", "arguments": _TWICE}}
                                ],
                            },
                            "finish_reason": "tool_calls",
                        }
                    ]
                }
            ),
        ),
        (
            "openai",
            True,
            Reply(
                events=[
                    _sse_event(_oa_call_piece(0, _TWICE, "c1", "fire")),
                    _sse_event(_oa_chunk({}, "tool_calls")),
                    ("", "[DONE]"),
                ]
            ),
        ),
        ("anthropic", True, _an_events([_tool_start(0), _json_delta(0, _TWICE), _block_stop(0)])),
    ],
    ids=["openai", "openai-stream", "anthropic-stream"],
)
def test_arguments_that_name_a_key_twice_are_invalid_arguments(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str, stream: bool, hostile: Reply
) -> None:
    """{"n": 1, "n": 2} ran the tool with n=2 (the last won). As any arguments that are not one JSON
    object, they go back to the model as invalid and the tool does not run."""
    server = serve(lambda request: hostile if request.n == 1 else _good(kind, request))
    fired = _Fired()
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"), tools=[fired.tool])
    assert _drive(agent, "run", stream).answer == "done"  # the model was told, then answered
    assert fired.calls == []
    [told] = [r for r in server.requests if tool_results_sent(r)]
    assert "arguments must be a JSON object" in json.dumps(told.body)


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_that_names_a_key_twice_is_a_model_error(
    raw_server: StartServer, stream: bool
) -> None:
    """Elsewhere than in arguments text (here a whole Anthropic answer, whose `input` is part of the body's
    JSON, or a stream event), JSON with a key twice is not read: which one the model meant is unknown."""
    if stream:
        twice = b'{"choices": [{"delta": {"content": "a"}}], "choices": [{"delta": {"content": "b"}}]}'
        body = _sse(twice, _oa_chunk({}, "stop"), b"[DONE]")
        model = _model("openai", raw_server(_answer(body, stream=True)).url)
    else:
        body = b'{"content": [{"type": "tool_use", "id": "t1", "name": "fire", "input": {"n": 1, "n": 2}}], '
        body += b'"stop_reason": "tool_use"}'
        model = _model("anthropic", raw_server(_answer(body)).url)
    with pytest.raises(bide.ModelError, match=r"key '(n|choices)' twice"):
        _turn(model, stream)


# -- tool calls without arguments ----------------------------------------------------------------------------


def _without_arguments(kind: str, stream: bool, how: str, tool: str) -> Reply:
    """A turn with one call of `tool` whose arguments are absent, null or empty (`how`), as `kind` sends
    it whole or streamed."""
    if kind == "openai":
        function: dict[str, Any] = {"name": tool}
        if how != "absent":
            function["arguments"] = None if how == "null" else ""
        if not stream:
            call = {"id": "c1", "type": "function", "function": function}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            return Reply(body={"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
        pieces = [{"index": 0, "id": "c1", "type": "function", "function": function}]
        pieces.append({"index": 0, "function": {k: v for k, v in function.items() if k != "name"}})
        events = [_sse_event(_oa_chunk({"tool_calls": [piece]})) for piece in pieces]
        return Reply(events=[*events, _sse_event(_oa_chunk({}, "tool_calls")), ("", "[DONE]")])
    if not stream:
        block: dict[str, Any] = {"type": "tool_use", "id": "t1", "name": tool}
        if how == "null":
            block["input"] = None
        return Reply(body={"content": [block], "stop_reason": "tool_use"})
    if how == "absent":  # a start without an input, and no pieces
        start = _ev(
            "content_block_start", index=0, content_block={"type": "tool_use", "id": "t1", "name": tool}
        )
        return _an_events([start, _block_stop(0)])
    # "placeholder": the start's placeholder input {} and not one input_json piece
    return _an_events([_tool_start(0, name=tool), _block_stop(0)])


_NO_ARGUMENTS = [
    ("openai", False, "absent"),
    ("openai", False, "null"),
    ("openai", False, "empty"),
    ("openai", True, "absent"),
    ("openai", True, "null"),
    ("openai", True, "empty"),
    ("anthropic", False, "absent"),
    ("anthropic", False, "null"),
    ("anthropic", True, "absent"),
    ("anthropic", True, "placeholder"),
]


def _pinged() -> tuple[bide.Tool, list[str]]:
    """A side-effect tool that takes no arguments, and the list of its calls."""
    pings: list[str] = []

    @bide.tool
    def ping() -> str:
        """Ping the service."""
        pings.append("ping")
        return "pong"

    return ping, pings


@pytest.mark.parametrize(("kind", "stream", "how"), _NO_ARGUMENTS)
def test_a_call_without_arguments_does_not_run_a_tool_on_its_defaults(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str, stream: bool, how: str
) -> None:
    """The missing arguments became {} and fire ran with n=1, a value the model never sent. As arguments
    that are not a JSON object, they go back to the model as invalid and the tool does not run."""
    hostile = _without_arguments(kind, stream, how, "fire")
    server = serve(lambda request: hostile if request.n == 1 else _good(kind, request))
    fired, (ping, pings) = _Fired(), _pinged()
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"), tools=[fired.tool, ping])
    assert _drive(agent, "run", stream).answer == "done"  # the model was told, then answered
    assert fired.calls == [] and pings == []
    [told] = [r for r in server.requests if tool_results_sent(r)]
    assert "arguments must be a JSON object, got ''" in json.dumps(told.body)


@pytest.mark.parametrize(("kind", "stream", "how"), _NO_ARGUMENTS)
def test_a_call_without_arguments_runs_a_tool_that_takes_none(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str, stream: bool, how: str
) -> None:
    """A tool without parameters has no defaults to fall back on: a call of it needs no arguments."""
    hostile = _without_arguments(kind, stream, how, "ping")
    server = serve(lambda request: hostile if request.n == 1 else _good(kind, request))
    fired, (ping, pings) = _Fired(), _pinged()
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"), tools=[fired.tool, ping])
    assert _drive(agent, "run", stream).answer == "done"
    assert pings == ["ping"] and fired.calls == []
    [sent] = [r for r in server.requests if tool_results_sent(r)]
    assert "pong" in json.dumps(sent.body) and "arguments must be" not in json.dumps(sent.body)


_PING_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}


def _offer(name: str, parameters: dict[str, Any]) -> bide.ToolSpec:
    return bide.ToolSpec(name=name, description="", parameters=parameters)


@pytest.mark.parametrize(
    ("offered", "arguments"),
    [
        ([_offer("ping", _PING_SCHEMA)], {}),
        ([_offer("ping", {"type": "object", "properties": {}})], {}),  # extra keys ignored
        ([], ""),
        ([_offer("pong", _PING_SCHEMA)], ""),
        ([_offer("ping", {"type": "object", "properties": {"n": {"type": "integer"}}})], ""),
        ([_offer("ping", {**_PING_SCHEMA, "additionalProperties": True})], ""),
        ([_offer("ping", {"anyOf": [_PING_SCHEMA, {"type": "object"}]})], ""),
    ],
    ids=["no-parameters", "no-properties", "not-offered", "another-tool", "a-parameter", "any-key", "anyOf"],
)
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_call_without_arguments_is_empty_only_for_a_tool_offered_without_parameters(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
    kind: str,
    stream: bool,
    offered: list[bide.ToolSpec],
    arguments: Any,
) -> None:
    """Read from the schema the request offered the model: a tool it may call only with {} gets {}; for
    any other (not offered, or that takes something), the arguments are the absent text ""."""
    server = serve(lambda request: _without_arguments(kind, stream, "absent", "ping"))
    [call] = _turn(_model(kind, server.url), stream, request=hi(offered)).tool_calls
    assert call.arguments == arguments


@pytest.mark.parametrize(
    ("kind", "stream", "hostile"),
    [
        ("openai", False, openai_completion(calls=[("c1", "fire", {})])),
        ("openai", True, openai_stream(calls=[("c1", "fire", {})])),
        ("anthropic", False, anthropic_message(calls=[("t1", "fire", {})])),
        ("anthropic", True, anthropic_stream(calls=[("t1", "fire", {})])),
        # How the API streams an input of {}: the start's placeholder, then one empty input_json piece
        # (this ran the tool before arguments were checked, and was refused for a while after).
        ("anthropic", True, _an_events([_tool_start(0, name="fire"), _json_delta(0, ""), _block_stop(0)])),
    ],
    ids=["openai", "openai-stream", "anthropic", "anthropic-stream", "anthropic-stream-one-empty-piece"],
)
def test_an_empty_object_the_model_sent_is_its_arguments(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str, stream: bool, hostile: Reply
) -> None:
    """`{}` sent as the arguments is the model's choice of every default: the tool runs, with n=1."""
    server = serve(lambda request: hostile if request.n == 1 else _good(kind, request))
    fired = _Fired()
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"), tools=[fired.tool])
    assert _drive(agent, "run", stream).answer == "done"
    assert fired.calls == [1]


# -- several choices -----------------------------------------------------------------------------------------


def test_a_whole_answer_with_several_choices_is_a_model_error(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
) -> None:
    """bide asks for one choice; choice 0 of two was run and choice 1 dropped, which the run had no
    ground to prefer. (A stream with a piece of a second choice was refused already.)"""
    choices = [
        {
            "index": i,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{i}", "function": {"name": "fire", "arguments": json.dumps({"n": n})}}
                ],
            },
            "finish_reason": "tool_calls",
        }
        for i, n in enumerate((5, 6))
    ]
    hostile = Reply(body={"choices": choices})
    _refused_then_resumed(serve, "openai", False, hostile, "2 choices where bide asks for one.*remove `n`")


# -- byte-order marks ----------------------------------------------------------------------------------------

_BOM = "\ufeff".encode()


def _opening_with(head: bytes, body: bytes, stream: bool, split: bool) -> Callable[[socket.socket], None]:
    """An answer of `head` + `body` (unsized), the bytes of `head` sent one at a time when `split`."""

    def answer(conn: socket.socket) -> None:
        kind = "text/event-stream" if stream else "application/json"
        conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\nconnection: close\r\n\r\n".encode())
        for piece in [bytes([b]) for b in head] if split else [head]:
            conn.sendall(piece)
            time.sleep(0.05 if split else 0)
        conn.sendall(body)

    return answer


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_a_byte_order_mark_opening_a_stream_is_dropped(
    raw_server: StartServer, kind: str, split: bool
) -> None:
    """The SSE standard ignores one BOM opening a stream: it was read as part of the first field's name,
    so the first event was dropped (OpenAI's first text, Anthropic's message_start and the turn)."""
    if kind == "openai":
        body = _sse(
            _oa_chunk({"content": "Sunny "}), _oa_chunk({"content": "in Paris."}), _oa_chunk({}, "stop")
        )
        body += _sse(b"[DONE]")
    else:
        text = {"type": "text", "text": ""}
        body = _sse(
            {"type": "message_start", "message": {"usage": {"input_tokens": 1, "output_tokens": 1}}},
            {"type": "content_block_start", "index": 0, "content_block": text},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Sunny in Paris."},
            },
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}},
            {"type": "message_stop"},
        )
    server = raw_server(_opening_with(_BOM, body, True, split))
    turn = _turn(_model(kind, server.url), True)
    assert turn.content == "Sunny in Paris."


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_byte_order_mark_opening_a_whole_answer_is_dropped(raw_server: StartServer, kind: str) -> None:
    """Read before too (json.loads of bytes drops one); now bide drops it itself, as in a stream."""
    reply = openai_completion("Sunny in Paris.") if kind == "openai" else anthropic_message("Sunny in Paris.")
    server = raw_server(_opening_with(_BOM, json.dumps(reply.body).encode(), False, False))
    assert _turn(_model(kind, server.url), False).content == "Sunny in Paris."


def test_a_byte_order_mark_opening_an_error_body_is_dropped(raw_server: StartServer) -> None:
    """The server's message was lost: the body with its BOM did not read as JSON, so the whole text was
    shown instead of the message."""
    body = _BOM + json.dumps({"error": {"message": "no such model"}}).encode()
    server = raw_server(_answer(body, status=404))
    with pytest.raises(bide.ModelError, match="answered 404: no such model; this is not retried"):
        _turn(_model("openai", server.url), False)


@pytest.mark.parametrize(
    "body",
    [
        _BOM + _BOM + json.dumps(openai_completion("Sunny.").body).encode(),
        json.dumps(openai_completion("Sunny.").body).encode("utf-16"),
    ],
    ids=["two-boms", "utf-16"],
)
def test_a_whole_answer_is_utf8_with_at_most_one_byte_order_mark(
    raw_server: StartServer, body: bytes
) -> None:
    """Exactly one BOM is dropped, and the body is read as UTF-8: json.loads of the bytes took any UTF-16
    or UTF-32 body too, while a stream must be UTF-8."""
    server = raw_server(_answer(body))
    with pytest.raises(bide.ModelError, match="not JSON"):
        _turn(_model("openai", server.url), False)


# -- answers whose calls cannot be trusted, or whose ids and names are of the wrong type --------------------


def _an_whole(blocks: list[dict[str, Any]], stop: str) -> Reply:
    return Reply(body={"content": blocks, "stop_reason": stop})


def _oa_whole(calls: Any, finish: str = "tool_calls") -> Reply:
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return Reply(body={"choices": [{"index": 0, "message": message, "finish_reason": finish}]})


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_turn_cut_off_at_the_context_window_fires_no_tool(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], stream: bool
) -> None:
    """stop_reason "model_context_window_exceeded" cuts an answer short as max_tokens does: the call ran on
    the defaults of the arguments that had not come."""
    stop = "model_context_window_exceeded"
    if stream:
        hostile = _an_events([_tool_start(0, given={"note": "x"}), _block_stop(0)], stop=stop)
    else:
        hostile = _an_whole([{"type": "tool_use", "id": "t1", "name": "fire", "input": {"note": "x"}}], stop)
    _refused_then_resumed(serve, "anthropic", stream, hostile, "stopped at its context window")


_NO_CALLS_STREAM = Reply(events=[_sse_event(_oa_chunk({}, "tool_calls")), ("", "[DONE]")])


@pytest.mark.parametrize(
    ("kind", "stream", "hostile", "match"),
    [
        ("openai", False, _oa_whole({}), "not a list"),
        ("openai", False, _oa_whole(False), "not a list"),
        ("openai", False, _oa_whole([]), "holds no call"),
        ("openai", True, _NO_CALLS_STREAM, "holds no call"),
        ("anthropic", False, _an_whole([], "tool_use"), "holds no call"),
        ("anthropic", True, _an_events([], stop="tool_use"), "holds no call"),
    ],
    ids=["oa-object", "oa-false", "oa-empty", "oa-stream", "an-whole", "an-stream"],
)
def test_a_turn_that_stopped_to_call_tools_but_holds_none_is_refused(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
    kind: str,
    stream: bool,
    hostile: Reply,
    match: str,
) -> None:
    """`tool_calls: {}` (or false) in a whole OpenAI answer, or a finish reason saying the model called
    tools with no call in the turn, was journaled as an empty final answer: the run ended on it for good."""
    _refused_then_resumed(serve, kind, stream, hostile, match)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("cid", "name"), [(["t1"], "fire"), (7, "fire"), ("t1", 7), ("t1", {"x": 1})])
def test_a_call_whose_id_or_name_is_not_a_string_is_refused(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
    kind: str,
    stream: bool,
    cid: Any,
    name: Any,
) -> None:
    """An id ["t1"] was read as the text "['t1']": the side effect fired and its result went back under an
    id the model never sent; a name 7 became the tool "7"."""
    if kind == "openai":
        call = {"id": cid, "type": "function", "function": {"name": name, "arguments": '{"n": 1}'}}
        if stream:
            finish = _sse_event(_oa_chunk({}, "tool_calls"))
            hostile = Reply(events=[_sse_event(_oa_chunk({"tool_calls": [{"index": 0, **call}]})), finish,
                                    ("", "[DONE]")])  # fmt: skip
        else:
            hostile = _oa_whole([call])
    else:
        block = {"type": "tool_use", "id": cid, "name": name, "input": {"n": 1}}
        if stream:
            hostile = _an_events([_ev("content_block_start", index=0, content_block=block), _block_stop(0)])
        else:
            hostile = _an_whole([block], "tool_use")
    _refused_then_resumed(serve, kind, stream, hostile, "is not a string")


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_made_up_id_never_takes_the_id_of_another_call(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer], kind: str
) -> None:
    """A call without an id was given call_<i> (toolu_<i>), which another call of the turn could carry: the
    turn was refused as one with two calls of one id, an error the model never made."""

    def answer(request: Received) -> Reply:
        if tool_results_sent(request):
            return openai_completion("done") if kind == "openai" else anthropic_message("done")
        if kind == "openai":
            return _oa_whole([
                {"id": "", "function": {"name": "fire", "arguments": '{"n": 1}'}},
                {"id": "call_0", "function": {"name": "fire", "arguments": '{"n": 2}'}},
            ])  # fmt: skip
        return _an_whole([
            {"type": "tool_use", "name": "fire", "input": {"n": 1}},
            {"type": "tool_use", "id": "toolu_0", "name": "fire", "input": {"n": 2}},
        ], "tool_use")  # fmt: skip

    server = serve(answer)
    fired = _Fired()
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"), tools=[fired.tool])
    assert _drive(agent, "run", False).answer == "done"
    assert sorted(fired.calls) == [1, 2]


def test_stream_pieces_without_an_index_make_one_call_each(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
) -> None:
    """Some servers leave `index` out of tool-call pieces: each piece after the first became a call of its
    own, with no name ("unknown tool ''"), journaled and sent back to the model on every later turn."""
    first = {"id": "a", "type": "function", "function": {"name": "fire", "arguments": '{"n": '}}
    rest = {"function": {"arguments": "4}"}}
    second = {"id": "b", "type": "function", "function": {"name": "fire", "arguments": '{"n": 5}'}}

    def answer(request: Received) -> Reply:
        if tool_results_sent(request):
            return openai_stream(["done"])
        return Reply(events=[
            _sse_event(_oa_chunk({"tool_calls": [first]})),
            _sse_event(_oa_chunk({"tool_calls": [rest]})),
            _sse_event(_oa_chunk({"tool_calls": [second]})),
            _sse_event(_oa_chunk({}, "tool_calls")),
            ("", "[DONE]"),
        ])  # fmt: skip

    server = serve(answer)
    fired = _Fired()
    agent = bide.Agent(_model("openai", server.url), store=bide.open_store("memory://"), tools=[fired.tool])
    assert _drive(agent, "run", True).answer == "done"
    assert fired.calls == [4, 5]


def test_whole_calls_in_one_delta_without_index_or_id_are_calls_of_their_own(
    serve: Callable[[Callable[[Received], Reply]], LoopbackServer],
) -> None:
    """Servers that send every call whole in one delta, with neither index nor id: each is a call (a piece
    without either was taken as more of the last call, and two calls of one tool were glued into one)."""
    calls = [{"function": {"name": "fire", "arguments": f'{{"n": {n}}}'}} for n in (6, 7)]

    def answer(request: Received) -> Reply:
        if tool_results_sent(request):
            return openai_stream(["done"])
        finish = _sse_event(_oa_chunk({}, "tool_calls"))
        return Reply(events=[_sse_event(_oa_chunk({"tool_calls": calls})), finish, ("", "[DONE]")])

    server = serve(answer)
    fired = _Fired()
    agent = bide.Agent(_model("openai", server.url), store=bide.open_store("memory://"), tools=[fired.tool])
    assert _drive(agent, "run", True).answer == "done"
    assert sorted(fired.calls) == [6, 7]
