"""A user message that is empty or only white space: the Anthropic API refuses a text block without text
(a 400, "text content blocks must be non-empty"), so `AnthropicModel` refuses it with `ConfigError` before
any request, and nothing is journaled (a run's first turn, or a thread message's, is journaled with its
message). The OpenAI API takes an empty message: `OpenAIModel` sends it as it is."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest

import bide
from bide.testing import LoopbackServer, Received, Reply, anthropic_message, openai_completion

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]
BLANKS = {"empty": "", "white space": " \n\t "}


def _anthropic(url: str) -> bide.AnthropicModel:
    return bide.AnthropicModel("m", api_key="k", base_url=url, retry=bide.RetryPolicy(attempts=1), timeout=10)


def _refusing_blank_text(request: Received) -> Reply:
    """What the API answers: 400 for a text block without text, else an answer."""
    for message in request.body["messages"]:
        for block in message["content"]:
            if block.get("type") == "text" and not block["text"].strip():
                error = {"type": "invalid_request_error", "message": "text content blocks must be non-empty"}
                return Reply(status=400, body={"type": "error", "error": error})
    return anthropic_message("hello")


async def _drive(agent: bide.Agent[Any], run_id: str, text: str, stream: bool) -> bide.RunResult[Any]:
    if not stream:
        return await agent.run(run_id, text)
    events: Any = agent.stream(run_id, text)
    async with contextlib.aclosing(events) as each:
        async for event in each:
            if isinstance(event, bide.Finished):
                return event.result
    raise AssertionError("the stream ended without Finished")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("blank", list(BLANKS))
def test_a_blank_input_is_refused_before_any_request(serve: Serve, blank: str, stream: bool) -> None:
    """Before, the blank text block was sent, and the run failed on the API's 400 (a ModelError saying to
    check the model name and API key). Now ConfigError says which message and what to do, no request is
    made and nothing is journaled: the run id is free for the input meant."""
    server = serve(_refusing_blank_text)
    store = bide.open_store("memory://")
    agent = bide.Agent(_anthropic(server.url), store=store)
    with pytest.raises(bide.ConfigError) as caught:
        asyncio.run(_drive(agent, "r1", BLANKS[blank], stream))
    said = str(caught.value)
    what = "empty" if blank == "empty" else "only white space"
    assert f"run 'r1': the message it was sent is {what}" in said
    assert "Anthropic API refuses" in said and "send a message with some text" in said
    assert server.requests == [] and store.load("r1") == []
    assert asyncio.run(_drive(agent, "r1", "hi", stream)).answer == "hello"


@pytest.mark.parametrize("blank", list(BLANKS))
def test_a_blank_thread_message_is_refused_and_the_thread_goes_on(serve: Serve, blank: str) -> None:
    """Before, the blank message failed on the API's 400 after a request. Now it is refused before one, the
    thread's journal holds nothing of it, and the next message is answered."""
    server = serve(_refusing_blank_text)
    agent = bide.Agent(_anthropic(server.url), store=bide.open_store("memory://"))
    thread = agent.thread("t1")
    assert thread.send_sync("first").answer == "hello"
    with pytest.raises(bide.ConfigError, match="the message it was sent is "):
        thread.send_sync(BLANKS[blank])
    assert len(server.requests) == 1
    assert [m.content for m in asyncio.run(thread.history()) if m.role == "user"] == ["first"]
    assert thread.send_sync("second").answer == "hello"
    assert [m.content for m in asyncio.run(thread.history()) if m.role == "user"] == ["first", "second"]


def test_a_blank_message_another_model_journaled_is_named(serve: Serve) -> None:
    """A thread whose blank message an OpenAI-compatible model answered, continued with AnthropicModel:
    refused before any request, naming the message and what to do."""
    store = bide.open_store("memory://")
    openai = serve(lambda request: openai_completion("hello"))
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{openai.url}/v1", timeout=10)
    bide.Agent(model, store=store).thread("t1").send_sync("")
    anthropic = serve(_refusing_blank_text)
    thread = bide.Agent(_anthropic(anthropic.url), store=store).thread("t1")
    with pytest.raises(bide.ConfigError, match=r"user message 1 of 2 in its conversation is empty") as caught:
        thread.send_sync("next")
    assert "continue this conversation with that model, or start a new one" in str(caught.value)
    assert anthropic.requests == []


@pytest.mark.parametrize("blank", list(BLANKS))
def test_openai_sends_a_blank_message_as_it_is(serve: Serve, blank: str) -> None:
    """The OpenAI API takes a user message without text: it is sent unchanged, and answered."""
    server = serve(lambda request: openai_completion("hello"))
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{server.url}/v1", timeout=10)
    agent = bide.Agent(model, store=bide.open_store("memory://"))
    assert agent.run_sync("r1", BLANKS[blank]).answer == "hello"
    assert server.requests[0].body["messages"] == [{"role": "user", "content": BLANKS[blank]}]
