"""A journaled turn can always be sent back. A model may answer with nothing (OpenAI: finish "stop" with
empty or null content and no tool calls; Anthropic: "end_turn" with an empty text block, which the real
API sends), and an Anthropic turn may hold text of white space only beside its tool calls. Such a turn is
journaled, and sent back when the run goes on: a thread's next message, a retry after an answer that
failed `output_type`, the request after the tool results. The loopback server here checks each request as
the real APIs do and answers 400 with their messages where they would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
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
    openai_stream,
)

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]
KINDS = ["openai", "anthropic"]


def _refused(kind: str, body: dict[str, Any]) -> str | None:
    """The 400 message the real API gives for the messages of `body`, None if it takes them."""
    for i, m in enumerate(body["messages"]):
        if kind == "openai":
            if m["role"] == "assistant" and m.get("content") is None and not m.get("tool_calls"):
                return f"Invalid value for 'messages.[{i}].content': expected a string, got null."
            continue
        blocks = m["content"]
        if not blocks:
            return f"messages.{i}: all messages must have non-empty content"
        texts = [b["text"] for b in blocks if b["type"] == "text"]
        if any(t == "" for t in texts):
            return f"messages.{i}: text content blocks must be non-empty"
        if texts and not any(t.strip() for t in texts):
            return f"messages.{i}: text content blocks must contain non-whitespace text"
    return None


def _api(kind: str, answers: list[Reply]) -> Callable[[Received], Reply]:
    """A server that checks each request as the API does, then gives the next of `answers`."""

    def respond(request: Received) -> Reply:
        said = _refused(kind, request.body)
        if said is not None:
            error = {"type": "invalid_request_error", "message": said}
            body = {"type": "error", "error": error} if kind == "anthropic" else {"error": error}
            return Reply(status=400, body=body)
        return answers[min(request.n, len(answers)) - 1]

    return respond


def _answer(
    kind: str, stream: bool, text: str, calls: Sequence[tuple[str, str, dict[str, Any]]] = ()
) -> Reply:
    """An answer of `kind`, whole or streamed: `text` (an empty one too), then `calls`."""
    if kind == "openai":
        return openai_stream([text] if text else [], calls) if stream else openai_completion(text, calls)
    if stream:
        return anthropic_stream([text], calls)  # an empty text block too: start, an empty delta, stop
    reply = anthropic_message("", calls)
    reply.body["content"].insert(0, {"type": "text", "text": text})  # as the API sends an empty answer
    return reply


def _empty(kind: str, stream: bool) -> Reply:
    return _answer(kind, stream, "")


def _model(kind: str, url: str) -> bide.OpenAIModel | bide.AnthropicModel:
    once = bide.RetryPolicy(attempts=1)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key="k", base_url=f"{url}/v1", retry=once, timeout=10)
    return bide.AnthropicModel("m", api_key="k", base_url=url, retry=once, timeout=10)


async def _finish(events: Any) -> bide.RunResult[Any]:
    async with contextlib.aclosing(events) as stream:
        async for event in stream:
            if isinstance(event, bide.Finished):
                return event.result  # type: ignore[no-any-return]
            if isinstance(event, bide.Halted):
                raise event.error
    raise AssertionError("the stream ended without Finished")


def _sent_back(request: Received) -> list[dict[str, Any]]:
    """The assistant messages a request sends back."""
    return [m for m in request.body["messages"] if m["role"] == "assistant"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_threads_next_message_after_an_empty_answer_is_answered(
    serve: Serve, kind: str, stream: bool
) -> None:
    """Before, the empty answer went back as {"role": "assistant", "content": null} (OpenAI) or with an empty
    text block (Anthropic): the API refused every later message of the thread with a 400, for ever. Now
    OpenAI gets "" and Anthropic no assistant message at all (the two user messages are merged), and the
    thread goes on."""
    server = serve(_api(kind, [_empty(kind, stream), _answer(kind, stream, "42")]))
    thread = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://")).thread("chat-1")

    async def send(text: str) -> bide.RunResult[Any]:
        return await (_finish(thread.stream(text)) if stream else thread.send(text))

    assert asyncio.run(send("Hello?")).answer == ""
    assert asyncio.run(send("Are you there?")).answer == "42"
    assert len(server.requests) == 2
    if kind == "openai":
        assert _sent_back(server.requests[1]) == [{"role": "assistant", "content": ""}]
    else:
        said = [{"type": "text", "text": "Hello?"}, {"type": "text", "text": "Are you there?"}]
        assert server.requests[1].body["messages"] == [{"role": "user", "content": said}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_answer_that_fails_the_output_type_is_asked_again(
    serve: Serve, kind: str, stream: bool
) -> None:
    """Before, the retry after an empty answer that is no int sent that answer back in a form the API
    refuses (400 on every drive: the run was stuck). Now the retry is taken and the run ends with 42."""
    server = serve(_api(kind, [_empty(kind, stream), _answer(kind, stream, "42")]))
    agent = bide.Agent(_model(kind, server.url), store=bide.open_store("memory://"), output_type=int)

    async def run() -> bide.RunResult[Any]:
        ask = "A number, please"
        return await (_finish(agent.stream("out-1", ask)) if stream else agent.run("out-1", ask))

    result = asyncio.run(run())
    assert (result.output, result.turns, len(server.requests)) == (42, 2, 2)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_white_space_beside_an_anthropic_tool_call_is_not_sent_back(serve: Serve, stream: bool) -> None:
    """Before, text of white space only beside a tool_use block went back as a text block of its own, which
    the API refuses ("text content blocks must contain non-whitespace text"): the run stopped on the request
    that carries the tool's result, for good. Now only the tool_use block goes back, and the run ends."""
    calls = [("toolu_1", "pay", {"cents": 1})]
    answers = [_answer("anthropic", stream, "\n\n", calls), _answer("anthropic", stream, "Paid.")]
    server = serve(_api("anthropic", answers))
    paid: list[int] = []

    @bide.tool
    def pay(cents: int) -> str:
        """Pay."""
        paid.append(cents)
        return "paid"

    agent = bide.Agent(_model("anthropic", server.url), store=bide.open_store("memory://"), tools=[pay])

    async def run() -> bide.RunResult[Any]:
        return await (_finish(agent.stream("r1", "pay 1 cent")) if stream else agent.run("r1", "pay 1 cent"))

    assert asyncio.run(run()).answer == "Paid."
    assert paid == [1]
    sent = _sent_back(server.requests[1])
    assert [[b["type"] for b in m["content"]] for m in sent] == [["tool_use"]]
    assert sent[0]["content"][0]["input"] == {"cents": 1}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_openai_tool_call_without_text_is_still_sent_with_null_content(serve: Serve, stream: bool) -> None:
    """Unchanged: beside tool calls, no text is sent as null content, as the API itself answers them."""
    calls = [("call_1", "pay", {"cents": 1})]
    answers = [_answer("openai", stream, "", calls), _answer("openai", stream, "Paid.")]
    server = serve(_api("openai", answers))

    @bide.tool
    def pay(cents: int) -> str:
        """Pay."""
        return "paid"

    agent = bide.Agent(_model("openai", server.url), store=bide.open_store("memory://"), tools=[pay])

    async def run() -> bide.RunResult[Any]:
        return await (_finish(agent.stream("r1", "pay 1 cent")) if stream else agent.run("r1", "pay 1 cent"))

    assert asyncio.run(run()).answer == "Paid."
    (sent,) = _sent_back(server.requests[1])
    assert sent["content"] is None and [c["id"] for c in sent["tool_calls"]] == ["call_1"]
