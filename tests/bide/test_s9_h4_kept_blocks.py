"""Anthropic content blocks the adapter does not model are kept whole, or the turn is refused:

- a streamed block of an unknown type gets what its deltas carry, as the API's deltas add to the blocks it
  documents (text, input_json, citations, thinking, signature): it is sent back on the next turn as the
  same block given whole would be; a delta the adapter cannot add to it raises `ModelError` (before, it
  was dropped: the block went back without it, and nobody was told);
- a content block whose `type` is absent, null, empty or not a string raises `ModelError` naming the
  block, whole or streamed (before, it was left out silently);
- a kept block whose input (a server tool's) is not a JSON object raises `ModelError`, whole or streamed
  (before, it was kept, to be sent back on every later turn); so does one with an input in its start and
  input_json pieces (before, the pieces replaced the start's input).

A journal that holds such blocks already (written before) is still sent back as it is."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from raw_http import one_turn

import bide
from bide.testing import LoopbackServer, Received, Reply

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]

_CITATION = {"type": "web_search_result_location", "url": "https://x.example", "cited_text": "sun"}
# A block of a type nobody knows yet, as a whole answer holds it.
_FUTURE = {
    "type": "a_block_of_the_future",
    "id": "fut_1",
    "text": "Looked it up.",
    "thinking": "hmm",
    "signature": "c2ln",
    "citations": [_CITATION],
    "input": {"query": "oslo", "depth": [1, {"b": None, "a": "ü"}]},
}


def _event(kind: str, **fields: Any) -> tuple[str, str]:
    return kind, json.dumps({"type": kind, **fields})


def _stream(blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> list[tuple[str, str]]:
    """A streamed answer of `blocks` (each a start and its deltas), then the text "Done." as the last."""
    events = [_event("message_start", message={"usage": {"input_tokens": 1}})]
    done: tuple[dict[str, Any], list[dict[str, Any]]] = (
        {"type": "text", "text": ""},
        [{"type": "text_delta", "text": "Done."}],
    )
    for index, (start, deltas) in enumerate([*blocks, done]):
        events.append(_event("content_block_start", index=index, content_block=start))
        events += [_event("content_block_delta", index=index, delta=delta) for delta in deltas]
        events.append(_event("content_block_stop", index=index))
    events.append(_event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}))
    events.append(_event("message_stop"))
    return events


def _whole(blocks: list[dict[str, Any]]) -> Reply:
    content = [*blocks, {"type": "text", "text": "Done."}]
    usage = {"input_tokens": 1, "output_tokens": 1}
    return Reply(body={"type": "message", "role": "assistant", "content": content, "stop_reason": "end_turn",
                       "usage": usage})  # fmt: skip


def _model(url: str) -> bide.AnthropicModel:
    once = bide.RetryPolicy(attempts=1)
    return bide.AnthropicModel("m", api_key="test-key-123456", base_url=url, retry=once, timeout=10)


def _turn(serve: Serve, reply: Reply, stream: bool) -> bide.AssistantMessage:
    server = serve(lambda request: reply)
    return asyncio.run(one_turn(_model(server.url), stream))


def _sent_back(serve: Serve, first: Reply, stream: bool) -> str:
    """The bytes of the assistant turn a thread's second message sends back, its first answered by
    `first` (to a streaming request if `stream`)."""
    later = Reply(events=_stream([])) if stream else _whole([])
    server = serve(lambda request: first if request.n == 1 else later)
    thread = bide.Agent(_model(server.url), store=bide.open_store("memory://")).thread("t1")

    async def send(text: str) -> str:
        if not stream:
            return (await thread.send(text)).answer
        async for event in thread.stream(text):
            if isinstance(event, bide.Finished):
                return str(event.result.answer)
        raise AssertionError("no Finished event")

    assert asyncio.run(send("weather?")) == "Done."
    assert asyncio.run(send("and now?")) == "Done."
    messages = server.requests[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    return json.dumps(messages[1]["content"], ensure_ascii=False)


def test_a_streamed_unknown_block_is_sent_back_with_what_its_deltas_carried(serve: Serve) -> None:
    """Its start held none of its text, input or citations: the deltas carried them all, in the API's known
    patterns. Before, the text delta was refused ("a text delta for block 0"), and the other pieces were
    left to what the start held."""
    start = {"type": "a_block_of_the_future", "id": "fut_1", "text": "", "input": {}}
    text = json.dumps(_FUTURE["input"], ensure_ascii=False)
    deltas = [
        {"type": "text_delta", "text": "Looked "},
        {"type": "input_json_delta", "partial_json": text[:7]},
        {"type": "text_delta", "text": "it up."},
        {"type": "thinking_delta", "thinking": "hm"},
        {"type": "thinking_delta", "thinking": "m"},
        {"type": "citations_delta", "citation": _CITATION},
        {"type": "input_json_delta", "partial_json": text[7:]},
        {"type": "signature_delta", "signature": "c2ln"},
    ]
    streamed = _sent_back(serve, Reply(events=_stream([(start, deltas)])), True)
    assert streamed == _sent_back(serve, _whole([_FUTURE]), False)
    assert json.loads(streamed)[0] == _FUTURE


def test_a_streamed_unknown_block_adds_its_deltas_to_what_its_start_held(serve: Serve) -> None:
    start = {"type": "a_block_of_the_future", "text": "Looked ", "citations": [_CITATION]}
    deltas = [{"type": "text_delta", "text": "it up."}, {"type": "citations_delta", "citation": _CITATION}]
    turn = _turn(serve, Reply(events=_stream([(start, deltas)])), True)
    assert turn.content == "Done."  # a kept block's text is not the turn's
    wanted = {"type": "a_block_of_the_future", "text": "Looked it up.", "citations": [_CITATION, _CITATION]}
    assert turn.blocks[0] == wanted


@pytest.mark.parametrize(
    "delta",
    [{"type": "foo_delta", "foo": "what the model said"}, {"foo": "x"}, {"type": 7, "foo": "x"}],
    ids=["unknown", "no-type", "number"],
)
def test_a_delta_the_adapter_cannot_add_to_an_unknown_block_refuses_the_turn(
    serve: Serve, delta: dict[str, Any]
) -> None:
    """Before, the delta was dropped and the block kept as its start held it: journaled so, and sent back
    so on every later turn, what the model said in it lost without a word."""
    start = {"type": "a_block_of_the_future", "id": "fut_1"}
    events = _stream([({"type": "text", "text": "Hi."}, []), (start, [delta])])
    server = serve(lambda request: Reply(events=events))
    store = bide.open_store("memory://")
    agent = bide.Agent(_model(server.url), store=store)

    async def drive() -> None:
        async for _ in agent.stream("r1", "weather?"):
            pass

    with pytest.raises(bide.ModelError, match="for block 1, a 'a_block_of_the_future' block") as caught:
        asyncio.run(drive())
    said = str(caught.value)
    assert "nothing was journaled" in said and "does not know how this delta adds to it" in said
    shown = {"unknown": "of the type 'foo_delta'", "no-type": "without a type", "number": "of the type 7"}
    assert any(part in said for part in shown.values())
    assert [e.key for e in store.load("r1") if e.key.startswith("model:")] == []


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ({"text": "x"}, "without a type"),
        ({"type": None, "text": "x"}, "without a type"),
        ({"type": 3, "text": "x"}, "whose type is not a string: 3"),
        ({"type": "", "text": "x"}, "whose type is empty"),
        ({"type": ["text"], "text": "x"}, r"whose type is not a string: \['text'\]"),
    ],
    ids=["missing", "null", "number", "empty", "array"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_block_without_a_string_type_is_a_malformed_answer(
    serve: Serve, stream: bool, block: dict[str, Any], said: str
) -> None:
    """Before, the block was left out, whole or streamed, and the turn journaled without it."""
    first = {"type": "text", "text": "Hi."}
    reply = Reply(events=_stream([(first, []), (block, [])])) if stream else _whole([first, block])
    refused = rf"sent a content block \(block 1\) {said}; nothing was journaled"
    with pytest.raises(bide.ModelError, match=refused):
        _turn(serve, reply, stream)


_SEARCH = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search"}


@pytest.mark.parametrize("given", [["oslo"], None, "oslo"], ids=["array", "null", "string"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_server_tool_input_that_is_not_an_object_is_refused_whole_or_streamed(
    serve: Serve, stream: bool, given: Any
) -> None:
    """Streamed, the input comes in input_json pieces (a null one as the start's input). Before, both
    were kept, and sent back on every later turn, which the API refuses (a tool's input is an object)."""
    if not stream:
        reply = _whole([{**_SEARCH, "input": given}])
    elif given is None:
        reply = Reply(events=_stream([({**_SEARCH, "input": None}, [])]))
    else:
        text = json.dumps(given)
        pieces = [{"type": "input_json_delta", "partial_json": part} for part in (text[:3], text[3:])]
        reply = Reply(events=_stream([({**_SEARCH, "input": {}}, pieces)]))
    refused = r"a 'server_tool_use' block \(block 0\) whose input is not an object"
    with pytest.raises(bide.ModelError, match=refused):
        _turn(serve, reply, stream)


def test_a_streamed_server_tool_input_in_both_its_start_and_pieces_is_refused(serve: Serve) -> None:
    """Before, the pieces' input replaced the start's without a word (as for a tool_use block, which was
    refused so already)."""
    pieces = [{"type": "input_json_delta", "partial_json": '{"query": "bergen"}'}]
    reply = Reply(events=_stream([({**_SEARCH, "input": {"query": "oslo"}}, pieces)]))
    with pytest.raises(bide.ModelError, match="with an input in its start and input_json pieces"):
        _turn(serve, reply, True)


def test_a_server_tool_input_that_is_an_object_is_kept_whole_or_streamed(serve: Serve) -> None:
    block = {**_SEARCH, "input": {"query": "oslo"}}
    whole = _turn(serve, _whole([block]), False)
    pieces = [{"type": "input_json_delta", "partial_json": '{"query": "oslo"}'}]
    streamed = _turn(serve, Reply(events=_stream([({**_SEARCH, "input": {}}, pieces)])), True)
    assert whole.blocks == streamed.blocks == [block, {"type": "text", "text": "Done."}]


def test_blocks_journaled_before_are_sent_back_as_they_are() -> None:
    """A turn journaled by an earlier bide may hold a kept block these checks now refuse in an answer (a
    server tool's input that is an array): the next request sends it as the journal holds it, so a run
    resumed after the upgrade is asked with the bytes it was asked with before."""
    kept = [{"id": "srvtoolu_1", "input": ["oslo"], "name": "web_search", "type": "server_tool_use"},
            {"id": "fut_1", "type": "a_block_of_the_future"}, {"text": "Done.", "type": "text"}]  # fmt: skip
    messages: list[bide.Message] = [
        bide.UserMessage(content="weather?"),
        bide.AssistantMessage(content="Done.", blocks=kept, finish_reason="end_turn"),
        bide.UserMessage(content="and now?"),
    ]
    request = bide.ModelRequest(run_id="r", turn=1, messages=messages, tools=())
    body = _model("http://127.0.0.1:9").body(request)
    assert body["messages"][1] == {"role": "assistant", "content": kept}
