"""Anthropic content blocks the adapter does not model (a server tool's `server_tool_use` and
`web_search_tool_result`, a block type of the future) are kept: journaled as they came and sent back, in
their order among the text and tool_use blocks, on the turns after, whole or streamed, read back from the
journal by another process's agent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import bide
from bide.testing import LoopbackServer, Received, Reply

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]

_SEARCH = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "oslo"}}
_RESULTS = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": [{"type": "web_search_result", "url": "https://x.example", "encrypted_content": "Eq0="}],
}
_CITED = {
    "type": "text",
    "text": "Sunny.",
    "citations": [{"type": "web_search_result_location", "url": "https://x.example", "cited_text": "sun"}],
}
_FUTURE = {"type": "a_block_of_the_future", "data": {"z": 1, "a": [2, {"y": None, "b": "c"}]}}
_CALL = {"type": "tool_use", "id": "toolu_1", "name": "note", "input": {"text": "sunny"}}
# What the first turn holds, in its order: text, the server tool's call and results, cited text, a block
# type nobody knows yet, a call of ours.
_TURN = [{"type": "text", "text": "Let me look. "}, _SEARCH, _RESULTS, _CITED, _FUTURE, _CALL]


def _sorted(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


def _events(blocks: list[dict[str, Any]], stop: str) -> list[tuple[str, str]]:
    """`blocks` as the API streams them: text in deltas, input in input_json pieces, citations in
    citations_delta pieces, anything else whole in its start."""
    out = [("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 1}}})]
    for index, block in enumerate(blocks):
        at = {"index": index}
        kind = block["type"]
        if kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas: list[dict[str, Any]] = [{"type": "text_delta", "text": block["text"]}]
            deltas += [{"type": "citations_delta", "citation": c} for c in block.get("citations", [])]
        elif "input" in block:
            start = {**block, "input": {}}
            text = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": part} for part in (text[:5], text[5:])]
        else:
            start, deltas = block, []
        out.append(("content_block_start", {"type": "content_block_start", **at, "content_block": start}))
        for delta in deltas:
            out.append(("content_block_delta", {"type": "content_block_delta", **at, "delta": delta}))
        out.append(("content_block_stop", {"type": "content_block_stop", **at}))
    ended = {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 2}}
    out.append(("message_delta", ended))
    out.append(("message_stop", {"type": "message_stop"}))
    return [(event, json.dumps(data)) for event, data in out]


def _answer(blocks: list[dict[str, Any]], stop: str, stream: bool) -> Reply:
    if stream:
        return Reply(events=_events(blocks, stop))
    usage = {"input_tokens": 1, "output_tokens": 2}
    body = {"type": "message", "role": "assistant", "content": blocks, "stop_reason": stop, "usage": usage}
    return Reply(body=body)


@bide.tool(safety=bide.ReadOnly)
def note(text: str) -> str:
    """Note something."""
    return "noted"


async def _drive(agent: bide.Agent[Any], stream: bool, run_id: str, text: str) -> str:
    if not stream:
        return (await agent.run(run_id, text)).answer
    async for event in agent.stream(run_id, text):
        if isinstance(event, bide.Finished):
            return str(event.result.answer)
    raise AssertionError("no Finished event")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_blocks_the_adapter_does_not_model_are_sent_back_in_their_order(serve: Serve, stream: bool) -> None:
    """Before, the server tool's blocks (and the citations, and the unknown block) were dropped, and the
    text blocks around them merged into one: the model lost what it had searched and found."""

    def answer(request: Received) -> Reply:
        if request.n == 1:
            return _answer(_TURN, "tool_use", stream)
        return _answer([{"type": "text", "text": "Done."}], "end_turn", stream)

    server = serve(answer)
    model = bide.AnthropicModel("m", api_key="test-key-123456", base_url=server.url, timeout=30)
    agent = bide.Agent(model, store=bide.open_store("memory://"), tools=[note])
    assert asyncio.run(_drive(agent, stream, "r1", "weather?")) == "Done."
    sent = server.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == [*_sorted(_TURN[:-1]), _CALL]
    assert sent[2]["content"][0]["tool_use_id"] == "toolu_1"


def test_a_turn_of_modelled_blocks_only_keeps_none(serve: Serve) -> None:
    """A turn of text and calls is journaled as before: no blocks, sent back as text and tool_use."""
    turn = [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}, _CALL]

    server = serve(lambda request: _answer(turn, "tool_use", False))
    model = bide.AnthropicModel("m", api_key="test-key-123456", base_url=server.url, timeout=30)
    request = bide.ModelRequest(run_id="r", turn=0, messages=[bide.UserMessage(content="hi")], tools=())
    first = asyncio.run(model.complete(request))
    assert first.blocks == [] and first.content == "One.Two."


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_kept_blocks_are_journaled_and_sent_back_by_another_agent_on_the_threads_next_message(
    serve: Serve, tmp_path: Path, stream: bool
) -> None:
    """A final answer with server tool blocks ends the first message; the next message, sent by a new agent
    on the same store (the turn read back from the journal, not held in memory), carries them back."""
    answer_blocks = [_SEARCH, _RESULTS, _CITED, _FUTURE]

    def answer(request: Received) -> Reply:
        if request.n == 1:
            return _answer(answer_blocks, "end_turn", stream)
        return _answer([{"type": "text", "text": "Still sunny."}], "end_turn", stream)

    server = serve(answer)
    url = f"sqlite:///{tmp_path / 'bide.db'}"

    def agent() -> bide.Agent[Any]:
        model = bide.AnthropicModel("m", api_key="test-key-123456", base_url=server.url, timeout=30)
        return bide.Agent(model, store=bide.open_store(url), name="chat")

    async def send(text: str) -> str:
        thread = agent().thread("t1")
        if not stream:
            return (await thread.send(text)).answer
        async for event in thread.stream(text):
            if isinstance(event, bide.Finished):
                return str(event.result.answer)
        raise AssertionError("no Finished event")

    assert asyncio.run(send("weather?")) == "Sunny."
    assert asyncio.run(send("and now?")) == "Still sunny."
    sent = server.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == _sorted(answer_blocks)
    # The same bytes whether the turn was live or read back: the journal's key order is sent live too.
    live = json.dumps(_sorted(answer_blocks))
    assert json.dumps(sent[1]["content"]) == live


def test_an_unknown_streamed_block_without_its_end_is_refused(serve: Serve) -> None:
    events = _events([{"type": "text", "text": "hi"}, _FUTURE], "end_turn")
    events = [e for e in events if not (e[0] == "content_block_stop" and '"index": 1' in e[1])]
    server = serve(lambda request: Reply(events=events))
    model = bide.AnthropicModel("m", api_key="test-key-123456", base_url=server.url, timeout=30)
    request = bide.ModelRequest(run_id="r", turn=0, messages=[bide.UserMessage(content="hi")], tools=())

    async def turn() -> None:
        async for _ in model.stream(request):
            pass

    refused = "'a_block_of_the_future' block \\(block 1\\) without its content_block_stop"
    with pytest.raises(bide.ModelError, match=refused):
        asyncio.run(turn())
