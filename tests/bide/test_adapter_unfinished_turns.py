"""Answers that are not a finished turn never end a run: a refusal, the deprecated OpenAI `function_call`
form, an Anthropic turn paused (``pause_turn``), a finish or stop reason bide does not know, an answer the
provider's filter stopped, and one cut off at the token limit before it wrote anything are each a
`bide.ModelError` that says what the model did (a refusal's text in it), with nothing journaled and no tool
run, so the run is driven again later and finishes with the model's real answer. An Anthropic turn with
thinking blocks beside tool calls is refused the same way: the blocks cannot be sent back with the tools'
results, which the API requires (extended thinking with tools is not supported yet)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest

import bide
from bide.testing import (
    LoopbackServer,
    Received,
    Reply,
    anthropic_message,
    anthropic_stream,
    openai_completion,
)
from bide.testing import openai_stream as openai_text_stream

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]

# -- answers ---------------------------------------------------------------------------------------------


def _oa_whole(message: dict[str, Any], finish: str | None) -> Reply:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return Reply(body={"choices": [choice]})


def _oa_stream(deltas: list[dict[str, Any]], finish: str) -> Reply:
    def chunk(delta: dict[str, Any], ends: str | None = None) -> tuple[str, str]:
        return "", json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": ends}]})

    events = [chunk({"role": "assistant"}), *(chunk(d) for d in deltas), chunk({}, finish), ("", "[DONE]")]
    return Reply(events=events)


def _ev(kind: str, **data: Any) -> tuple[str, str]:
    return kind, json.dumps({"type": kind, **data})


def _an_whole(content: list[dict[str, Any]], stop: str) -> Reply:
    usage = {"input_tokens": 3, "output_tokens": 2}
    body = {"type": "message", "role": "assistant", "content": content, "stop_reason": stop, "usage": usage}
    return Reply(body=body)


def _an_stream(content: list[dict[str, Any]], stop: str) -> Reply:
    """`content` streamed as Anthropic does: text and thinking in deltas, tool input as input_json pieces,
    other blocks whole in their start."""
    usage = {"input_tokens": 3, "output_tokens": 1}
    events = [_ev("message_start", message={"role": "assistant", "content": [], "usage": usage})]
    for i, block in enumerate(content):
        kind = block["type"]
        if kind == "text":
            events.append(_ev("content_block_start", index=i, content_block={"type": "text", "text": ""}))
            said = {"type": "text_delta", "text": block["text"]}
            events.append(_ev("content_block_delta", index=i, delta=said))
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            events.append(_ev("content_block_start", index=i, content_block=start))
            said = {"type": "thinking_delta", "thinking": block["thinking"]}
            events.append(_ev("content_block_delta", index=i, delta=said))
            signed = {"type": "signature_delta", "signature": block["signature"]}
            events.append(_ev("content_block_delta", index=i, delta=signed))
        elif kind == "tool_use":
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            events.append(_ev("content_block_start", index=i, content_block=start))
            piece = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events.append(_ev("content_block_delta", index=i, delta=piece))
        else:
            events.append(_ev("content_block_start", index=i, content_block=block))
        events.append(_ev("content_block_stop", index=i))
    events.append(_ev("message_delta", delta={"stop_reason": stop}, usage={"output_tokens": 2}))
    events.append(_ev("message_stop"))
    return Reply(events=events)


_PAY = {"type": "tool_use", "id": "toolu_1", "name": "pay", "input": {"vendor": "acme", "cents": 1}}
_SEARCH = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "acme"}}
_THOUGHT = {"type": "thinking", "thinking": "I should pay acme.", "signature": "c2lnbmVk"}
_OA_CALL = {"name": "pay", "arguments": '{"vendor": "acme", "cents": 1}'}


def _openai(message: dict[str, Any], deltas: list[dict[str, Any]], finish: str) -> Callable[[bool], Reply]:
    return lambda stream: _oa_stream(deltas, finish) if stream else _oa_whole(message, finish)


def _anthropic(content: list[dict[str, Any]], stop: str) -> Callable[[bool], Reply]:
    return lambda stream: _an_stream(content, stop) if stream else _an_whole(content, stop)


# name: (provider, the answer (whole or streamed), what the error says)
_CASES: dict[str, tuple[str, Callable[[bool], Reply], str]] = {
    "openai-refusal": (
        "openai",
        _openai(
            {"content": None, "refusal": "I can't help with paying acme."},
            [{"refusal": "I can't help "}, {"refusal": "with paying acme."}],
            "stop",
        ),
        r"refused to answer: \"I can't help with paying acme.\"",
    ),
    "openai-function-call": (
        "openai",
        _openai(
            {"content": None, "function_call": _OA_CALL},
            [{"function_call": {"name": "pay", "arguments": ""}}, {"function_call": {"arguments": "{}"}}],
            "function_call",
        ),
        "deprecated `function_call` form",
    ),
    "openai-unknown-finish": (
        "openai",
        _openai({"content": "I will now pay ac"}, [{"content": "I will now pay ac"}], "something_new"),
        "finish reason 'something_new', which bide does not know",
    ),
    "openai-content-filter": (
        "openai",
        _openai({"content": "The card number is 4"}, [{"content": "The card number is 4"}], "content_filter"),
        "content filter .finish reason 'content_filter'. after writing 'The card number is 4'",
    ),
    "openai-length-empty": (
        "openai",
        _openai({"content": None}, [], "length"),
        "output token limit .finish reason 'length'. before it wrote any answer",
    ),
    "anthropic-pause-turn": ("anthropic", _anthropic([_SEARCH], "pause_turn"), "pause_turn"),
    "anthropic-unknown-stop": (
        "anthropic",
        _anthropic([{"type": "text", "text": "I will now pay ac"}], "something_new"),
        "stop reason 'something_new', which bide does not know",
    ),
    "anthropic-refusal": (
        "anthropic",
        _anthropic([{"type": "text", "text": "Here is how to"}], "refusal"),
        "content filter .finish reason 'refusal'. after writing 'Here is how to'",
    ),
    "anthropic-max-tokens-empty": (
        "anthropic",
        _anthropic([_THOUGHT], "max_tokens"),
        "output token limit .finish reason 'max_tokens'. before it wrote any answer",
    ),
    "anthropic-thinking-with-tools": (
        "anthropic",
        _anthropic([_THOUGHT, _PAY], "tool_use"),
        "extended thinking with tools is not supported yet",
    ),
}

# -- runs ------------------------------------------------------------------------------------------------


def _model(kind: str, url: str) -> bide.OpenAIModel | bide.AnthropicModel:
    once = bide.RetryPolicy(attempts=1)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key="k", base_url=f"{url}/v1", retry=once, timeout=10)
    return bide.AnthropicModel("m", api_key="k", base_url=url, retry=once, timeout=10)


async def _drive(agent: bide.Agent[Any], run_id: str, stream: bool) -> bide.RunResult[Any]:
    if not stream:
        return await agent.run(run_id, "pay acme 1 cent")
    async with contextlib.aclosing(agent.stream(run_id, "pay acme 1 cent")) as events:
        async for event in events:
            if isinstance(event, bide.Finished):
                return event.result
            if isinstance(event, bide.Halted):
                raise event.error
    raise AssertionError("the stream ended without Finished")


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
@pytest.mark.parametrize("case", list(_CASES))
def test_an_answer_that_is_no_finished_turn_does_not_end_the_run(
    serve: Serve, case: str, stream: bool
) -> None:
    kind, bad, says = _CASES[case]
    good = openai_completion("Done.") if kind == "openai" else anthropic_message("Done.")
    if stream:
        good = openai_text_stream(["Done."]) if kind == "openai" else anthropic_stream(["Done."])
    answers = [bad(stream), good]
    server = serve(lambda request: answers[min(request.n, 2) - 1])
    paid: list[str] = []

    @bide.tool
    def pay(vendor: str, cents: int) -> str:
        """Pay a vendor (a side effect)."""
        paid.append(vendor)
        return "paid"

    store = bide.open_store("memory://")
    agent = bide.Agent(_model(kind, server.url), store=store, tools=[pay])
    with pytest.raises(bide.ModelError, match=says):
        asyncio.run(_drive(agent, "r1", stream))
    assert paid == []
    assert not [r for r in bide.Journal(store, "r1").load().records() if isinstance(r, bide.ModelTurn)]
    # Not ended for good: the next drive asks again and finishes with the answer.
    again = asyncio.run(_drive(agent, "r1", stream))
    assert (again.answer, again.replayed, again.turns) == ("Done.", False, 1)


def test_a_refusal_keeps_its_text_in_the_error(serve: Serve) -> None:
    refusal = {"content": None, "refusal": "I can't help with that."}
    server = serve(lambda request: _oa_whole(refusal, "stop"))
    agent = bide.Agent(_model("openai", server.url), store=bide.open_store("memory://"))
    with pytest.raises(bide.ModelError) as caught:
        agent.run_sync("r1", "help")
    assert caught.value.body == "I can't help with that."
    assert len(server.requests) == 1  # a refusal is not retried


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
def test_thinking_beside_a_text_answer_is_still_an_answer(serve: Serve, stream: bool) -> None:
    """Only thinking beside tool calls is refused: a final answer needs no thinking block sent back. (Here
    with a turn before it that thought and called a tool, refused, so the test fails where that ran.)"""
    answers = [
        _anthropic([_THOUGHT, _PAY], "tool_use")(stream),
        _anthropic([_THOUGHT, {"type": "text", "text": "No need to pay."}], "end_turn")(stream),
    ]
    server = serve(lambda request: answers[min(request.n, 2) - 1])
    agent = bide.Agent(_model("anthropic", server.url), store=bide.open_store("memory://"))
    with pytest.raises(bide.ModelError, match="extended thinking with tools"):
        asyncio.run(_drive(agent, "r1", stream))
    assert asyncio.run(_drive(agent, "r1", stream)).answer == "No need to pay."
