"""A blank user message already in the journal (a run started with input "" on a model that takes it,
resumed with `AnthropicModel`): the API cannot take it and no new message can replace it, so the error
says so, and what it says to do works: continue the run with the model that answered it, or cancel it.
Before, it said nothing was journaled and to send a message with text, which raised RunMismatch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest

import bide
from bide.testing import Fail, LoopbackServer, Received, Reply, ScriptedModel, anthropic_message, call, reply

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]


@bide.tool(safety=bide.ReadOnly)
def look_up(order: str) -> str:
    """Look an order up."""
    return f"{order}: paid"


def _started_blank(store: bide.Store) -> None:
    """Run "t7" with input "": its first turn (a call) journaled by a scripted model, its second failed."""
    model = ScriptedModel([call("look_up", order="o-7"), Fail(bide.ModelError("503"))])
    with pytest.raises(bide.ModelError, match="503"):
        bide.Agent(model, store=store, tools=[look_up]).run_sync("t7", "")


def _anthropic_agent(url: str, store: bide.Store) -> bide.Agent[Any]:
    once = bide.RetryPolicy(attempts=1)
    model = bide.AnthropicModel("m", api_key="k", base_url=url, retry=once, timeout=10)
    return bide.Agent(model, store=store, tools=[look_up])


async def _stream(agent: bide.Agent[Any], run_id: str, text: str) -> None:
    events: Any = agent.stream(run_id, text)
    async with contextlib.aclosing(events) as each:
        async for _ in each:
            pass


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_journaled_blank_input_is_named_as_journaled(serve: Serve, stream: bool) -> None:
    server = serve(lambda request: anthropic_message("hello"))
    store = bide.open_store("memory://")
    _started_blank(store)
    agent = _anthropic_agent(server.url, store)
    with pytest.raises(bide.ConfigError) as caught:
        if stream:
            asyncio.run(_stream(agent, "t7", ""))
        else:
            agent.run_sync("t7", "")
    said = str(caught.value)
    assert "user message 1 of 1 in its conversation is empty" in said
    assert "journaled when another model answered it" in said and "Anthropic API refuses" in said
    assert "continue this conversation with that model" in said and "`bide cancel t7`" in said
    assert "nothing was journaled" not in said and "send a message with some text" not in said
    assert server.requests == []


def test_what_the_error_says_to_do_works(serve: Serve) -> None:
    """Continued with a model that takes the blank input, the run finishes; a run cancelled as told ends
    cancelled when the Anthropic agent drives it next, with no request sent."""
    server = serve(lambda request: anthropic_message("hello"))
    store = bide.open_store("memory://")
    _started_blank(store)
    with pytest.raises(bide.ConfigError):
        _anthropic_agent(server.url, store).run_sync("t7", "")
    that_model = ScriptedModel([call("look_up", order="o-7"), reply("paid")])  # its second turn is asked
    finished = bide.Agent(that_model, store=store, tools=[look_up]).run_sync("t7", "")
    assert finished.answer == "paid"

    other = bide.open_store("memory://")
    _started_blank(other)
    assert bide.cancel_run(other, "t7", reason="blank input")
    ended = _anthropic_agent(server.url, other).run_sync("t7", "")
    assert ended.status == "cancelled" and bide.run_status(other, "t7").status == "cancelled"
    assert server.requests == []


def test_a_new_blank_message_after_journaled_turns_is_still_new(serve: Serve) -> None:
    """A thread's blank message sent after answered ones is the request's last message: nothing of it is
    journaled, and the error says to send one with text (which then works)."""
    server = serve(lambda request: anthropic_message("hello"))
    thread = _anthropic_agent(server.url, bide.open_store("memory://")).thread("t1")
    assert thread.send_sync("first").answer == "hello"
    with pytest.raises(bide.ConfigError, match="nothing was journaled: send a message with some text"):
        thread.send_sync(" ")
    assert thread.send_sync("second").answer == "hello"
