"""Streaming: `agent.stream` yields events as they are journaled (replayed ones marked), the model's text
deltas while a turn streams, and ends with Finished or Halted; an interrupted stream leaves a journal a
later drive resumes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bide
from bide.testing import ScriptedModel, StreamingScriptedModel, Turn, call, reply


def tools(fired: list[str]) -> list[bide.Tool]:
    @bide.tool
    def charge(customer: str) -> str:
        """Charge a customer (a side effect)."""
        fired.append(customer)
        return f"charged {customer}"

    @bide.tool(safety=bide.ReadOnly)
    def lookup(customer: str) -> str:
        """Look a customer up."""
        return f"{customer} is fine"

    return [charge, lookup]


async def collect(events: Any, stop: int | None = None) -> list[Any]:
    out = []
    async with contextlib.aclosing(events) as stream:
        async for event in stream:
            out.append(event)
            if stop is not None and len(out) >= stop:
                break
    return out


def plain(events: list[Any]) -> list[Any]:
    """Events without text deltas, run id and replayed flag, and Finished as its answer."""
    out: list[Any] = []
    for e in events:
        if isinstance(e, bide.TextDelta):
            continue
        if isinstance(e, bide.Finished):
            out.append(("finished", e.result.answer, e.result.status))
        else:
            out.append(dataclasses.replace(e, run_id="", replayed=False))
    return out


def test_events_follow_the_journal_and_deltas_spell_the_turn(store: bide.Store) -> None:
    fired: list[str] = []
    model = StreamingScriptedModel(
        [call("lookup", customer="alice"), call("charge", customer="alice"), reply("Alice was charged.")],
        chunk=5,
    )
    agent = bide.Agent(model, store=store, tools=tools(fired))
    events = asyncio.run(collect(agent.stream("r", "charge alice")))
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "ModelTurnEvent", "ToolCallStarted", "ToolCallFinished",
        "ModelTurnEvent", "ToolCallStarted", "ToolCallFinished",
        "TextDelta", "TextDelta", "TextDelta", "TextDelta", "ModelTurnEvent", "Finished",
    ]  # fmt: skip
    assert "".join(e.text for e in events if isinstance(e, bide.TextDelta)) == "Alice was charged."
    assert events[2] == bide.ToolCallFinished("r", "c0.0", "lookup", "alice is fine", False)
    assert events[4] == bide.ToolCallStarted("r", "c1.0", "charge", {"customer": "alice"})
    final = events[-1]
    assert isinstance(final, bide.Finished) and final.result.answer == "Alice was charged."
    assert not any(getattr(e, "replayed", False) for e in events) and fired == ["alice"]
    # Streaming it again replays the journaled events (marked), no deltas, no model call, no effect.
    calls = len(model.requests)
    again = asyncio.run(collect(agent.stream("r", "charge alice")))
    assert plain(again) == plain(events)
    assert all(e.replayed for e in again)
    assert len(model.requests) == calls and fired == ["alice"]


def test_a_model_that_does_not_stream_gives_no_deltas(store: bide.Store) -> None:
    agent = bide.Agent(ScriptedModel([reply("hello")]), store=store)
    events = asyncio.run(collect(agent.stream("r", "hi")))
    assert [type(e).__name__ for e in events] == ["ModelTurnEvent", "Finished"]


def test_a_halt_is_the_last_event(store: bide.Store) -> None:
    @bide.tool
    def explode() -> str:
        """A side effect whose outcome is lost."""
        raise RuntimeError("connection reset")

    agent = bide.Agent(ScriptedModel([call("explode"), reply("never")]), store=store, tools=[explode])
    events = asyncio.run(collect(agent.stream("r", "go")))
    assert [type(e).__name__ for e in events] == ["ModelTurnEvent", "ToolCallStarted", "Halted"]
    halted = events[-1]
    assert isinstance(halted, bide.Halted) and isinstance(halted.error, bide.OutcomeUnknown)


def test_other_errors_are_raised_by_the_stream(store: bide.Store) -> None:
    agent = bide.Agent(ScriptedModel([]), store=store)
    with pytest.raises(bide.ModelError):
        asyncio.run(collect(agent.stream("r", "go")))
    with pytest.raises(bide.ConfigError):
        agent.stream("r", 5)  # type: ignore[arg-type]


def test_a_thread_streams_only_the_message_it_answers(store: bide.Store) -> None:
    fired: list[str] = []
    script = [call("charge", customer="a"), reply("one"), call("lookup", customer="b"), reply("two")]
    model = ScriptedModel(script)
    thread = bide.Agent(model, store=store, tools=tools(fired)).thread("t")
    first = asyncio.run(collect(thread.stream("charge a")))
    second = asyncio.run(collect(thread.stream("look b up")))
    assert [e.turn for e in second if isinstance(e, bide.ModelTurnEvent)] == [2, 3]
    assert [e.turn for e in first if isinstance(e, bide.ModelTurnEvent)] == [0, 1]
    final = second[-1]
    assert isinstance(final, bide.Finished) and final.result.segment == 1
    replay = asyncio.run(collect(thread.stream("charge a", segment=0)))
    assert plain(replay) == plain(first) and all(e.replayed for e in replay)


def test_breaking_out_of_a_stream_leaves_a_run_that_resumes(store: bide.Store) -> None:
    fired: list[str] = []

    # An async tool with no await inside runs in one step of the event loop: the reader's break can land
    # before or after it, never inside it. (A break inside a side effect is a real crash: the resumed run
    # halts; the law below covers that case.)
    @bide.tool
    async def charge(customer: str) -> str:
        """Charge a customer (a side effect)."""
        fired.append(customer)
        return f"charged {customer}"

    script = [call("charge", customer="a"), call("charge", customer="b"), reply("done")]
    agent = bide.Agent(ScriptedModel(script), store=store, tools=[charge])
    head = asyncio.run(collect(agent.stream("r", "charge both"), stop=3))  # up to the first result
    assert isinstance(head[-1], bide.ToolCallFinished) and head[-1].call_id == "c0.0"
    assert fired in (["a"], ["a", "b"])  # the drive may have gone on while the reader took the event
    # The drive does not wait for its reader: it may have claimed the next call when it was cancelled
    # (this process knows that claim never called the tool, so the next drive voids it).
    assert bide.run_status(store, "r").status in ("running", "halted", "completed")
    assert agent.run_sync("r", "charge both").answer == "done"
    assert fired == ["a", "b"]


# -- laws ------------------------------------------------------------------------------------------------

step = st.sampled_from(["lookup", "charge", "text"])


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(step, max_size=5), cut=st.integers(0, 12), chunk=st.integers(1, 6))
def test_replayed_and_resumed_streams_equal_the_first_drives(steps: list[str], cut: int, chunk: int) -> None:
    """An uninterrupted stream, the replay of the finished run, and a stream cut after `cut` events then
    resumed, all give the same events (replayed flags and deltas aside), and effects fire at most once
    (exactly once unless the cut landed inside a side effect, which then halts)."""
    script: list[Turn] = []
    for i, s in enumerate(steps):
        script.append(reply(f"thinking {i}") if s == "text" else call(s, customer=f"c{i}"))
    script = [t for t in script if t.calls] + [reply("final words " * 3)]

    def drive(run_id: str, fired: list[str], store: bide.Store, stop: int | None = None) -> list[Any]:
        agent = bide.Agent(StreamingScriptedModel(script, chunk=chunk), store=store, tools=tools(fired))
        return asyncio.run(collect(agent.stream(run_id, "go"), stop=stop))

    store = bide.open_store("memory://")
    fired: list[str] = []
    whole = drive("a", fired, store)
    replay = drive("a", fired, store)
    assert plain(replay) == plain(whole) and all(e.replayed for e in replay)
    effects = list(fired)
    fired.clear()
    head = drive("b", fired, store, stop=cut or None)
    tail = drive("b", fired, store)
    # The head saw a prefix of the run's events.
    assert plain(head) == plain(whole)[: len(plain(head))]
    if isinstance(tail[-1], bide.Halted):
        # The head was cancelled while a side effect was running: its outcome is unknown, and the resumed
        # drive halts rather than call it again. Nothing fired twice.
        assert isinstance(tail[-1].error, bide.OutcomeUnknown)
        assert len(set(fired)) == len(fired) and set(fired) <= set(effects)
        return
    assert fired == effects
    # The resumed stream replays what was journaled (the drive may have gone on past what the head read)
    # and then goes on live, to the same whole.
    replayed = [e for e in tail if getattr(e, "replayed", False)]
    live = [e for e in tail if not getattr(e, "replayed", False)]
    assert plain(replayed) + plain(live) == plain(whole)
    texts = "".join(e.text for e in whole if isinstance(e, bide.TextDelta))
    assert texts == "".join(e.message.content for e in whole if isinstance(e, bide.ModelTurnEvent))
