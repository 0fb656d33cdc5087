"""The agent loop against tools and models that misbehave: the journal holds what happened, and a tool
runs only on what the journal holds.

Each case was found by driving real runs: a `Tool(args=Model)` dropped an argument its model did not
declare (`dry_run` sent for `dryrun`) and moved the money anyway; a model client that reused its arguments
dict after returning had the tool pay someone other than the journaled turn named; a side effect that
completed but returned an object that cannot be shown, or raised a ToolError whose message cannot be
made, was left halted as an unknown outcome (or the drive died on a raw exception), although its outcome
was known.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from pydantic import BaseModel

import bide
from bide import AssistantMessage, ToolCall
from bide.testing import ScriptedModel, call, reply


class TransferArgs(BaseModel):
    to: str
    cents: int
    dryrun: bool = False


def test_an_argument_a_tool_model_does_not_declare_is_refused_not_dropped(store: bide.Store) -> None:
    moved: list[tuple[str, int]] = []

    async def transfer(args: TransferArgs) -> str:
        if not args.dryrun:
            moved.append((args.to, args.cents))
        return "moved"

    tool = bide.Tool(name="transfer", description="Move money.", args=TransferArgs, fn=transfer)
    assert tool.spec.parameters["additionalProperties"] is False  # the model is told, too
    script = [call("transfer", to="acme", cents=10_000, dry_run=True), reply("done")]
    assert (
        bide.Agent(ScriptedModel(script), store=store, tools=[tool]).run_sync("r", "try it").answer == "done"
    )
    assert moved == []
    [result] = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.ToolResult)]
    assert result.is_error and "dry_run: Extra inputs are not permitted" in result.result


class _ReusingModel:
    """A client that reuses the arguments dict it returned for its next piece of work."""

    name = "reusing"

    async def complete(self, request: Any) -> AssistantMessage:
        if any(m.role == "tool" for m in request.messages):
            return AssistantMessage(content="done")
        arguments: dict[str, Any] = {"to": "alice", "cents": 5}

        def reuse() -> None:
            arguments.update(to="mallory", cents=999_999)

        asyncio.get_running_loop().call_soon(reuse)
        # Two calls: a parallel turn is journaled (an await) before its calls' arguments are validated.
        calls = [
            ToolCall(id="1", name="pay", arguments=arguments),
            ToolCall(id="2", name="pay", arguments={"to": "bob", "cents": 7}),
        ]
        return AssistantMessage(content="", tool_calls=calls)


def test_a_tool_runs_on_the_journaled_arguments_whatever_the_client_does_with_its_own(
    store: bide.Store,
) -> None:
    paid: list[tuple[str, int]] = []

    @bide.tool
    async def pay(to: str, cents: int) -> str:
        """Pay someone."""
        await asyncio.sleep(0)
        paid.append((to, cents))
        return "paid"

    assert bide.Agent(_ReusingModel(), store=store, tools=[pay]).run_sync("r", "pay alice").answer == "done"
    assert sorted(paid) == [("alice", 5), ("bob", 7)]
    turn = json.loads(next(e.data for e in store.load("r") if e.key == "model:0"))
    assert turn["message"]["tool_calls"][0]["arguments"] == {"to": "alice", "cents": 5}


class _Receipt:
    """An object of an SDK whose text cannot be made before it is loaded."""

    def __str__(self) -> str:
        raise RuntimeError("receipt not loaded")

    __repr__ = __str__


@pytest.mark.parametrize("value", [_Receipt(), 10**5000], ids=["unprintable-object", "int-of-5000-digits"])
def test_a_side_effect_that_returned_what_cannot_be_shown_is_recorded_as_done(
    store: bide.Store, value: object
) -> None:
    fired: list[int] = []

    @bide.tool
    def charge(cents: int) -> object:
        """Charge a card."""
        fired.append(cents)
        return value

    agent = bide.Agent(ScriptedModel([call("charge", cents=500), reply("ok")]), store=store, tools=[charge])
    assert agent.run_sync("r", "charge").answer == "ok"
    assert agent.run_sync("r", "charge").replayed
    assert fired == [500]
    [result] = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.ToolResult)]
    assert not result.is_error and "returned a value that cannot be journaled as JSON" in result.result


class _Declined(bide.ToolError):
    def __init__(self, reason: bytes) -> None:
        super().__init__()
        self.reason = reason

    def __str__(self) -> str:
        return self.reason.decode()  # the tool's own bug: not UTF-8


def test_a_known_failure_whose_message_cannot_be_made_is_still_recorded(store: bide.Store) -> None:
    fired: list[int] = []

    @bide.tool
    def charge(cents: int) -> str:
        """Charge a card."""
        fired.append(cents)
        raise _Declined(b"card \xff declined")

    agent = bide.Agent(ScriptedModel([call("charge", cents=5), reply("ok")]), store=store, tools=[charge])
    assert agent.run_sync("r", "charge").answer == "ok"
    assert fired == [5]
    [result] = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.ToolResult)]
    assert result.is_error and "_Declined (its message cannot be shown)" in result.result


@pytest.mark.parametrize("honest_reads", [1, 2, 3, 5])
def test_a_reply_whose_calls_change_when_read_again_gets_nothing_past_the_checks(honest_reads: int) -> None:
    """The reply's tool calls were checked on one read and journaled from another: a reply answering one
    call to the checks and then 1,000 under one provider id had all of them journaled and run."""

    class Shifty(AssistantMessage):
        reads = 0

        @property  # type: ignore[override]
        def tool_calls(self) -> list[ToolCall]:
            type(self).reads += 1
            if type(self).reads <= honest_reads:
                return [ToolCall(id="a", name="ping", arguments={})]
            return [ToolCall(id="same", name="ping", arguments={}) for _ in range(1000)]

        @tool_calls.setter
        def tool_calls(self, value: list[ToolCall]) -> None:
            pass

    class Model:
        name = "shifty"

        async def complete(self, request: Any) -> AssistantMessage:
            if any(m.role == "tool" for m in request.messages):
                return AssistantMessage(content="done")
            return Shifty(content="")

    pings: list[int] = []

    @bide.tool(safety=bide.ReadOnly)
    async def ping() -> str:
        """Ping."""
        pings.append(1)
        return "pong"

    store = bide.MemoryStore()
    with contextlib.suppress(bide.ModelError):  # refused whole: nothing journaled, nothing run
        bide.Agent(Model(), store=store, tools=[ping]).run_sync("r", "go")
    assert Shifty.reads >= 1  # the reply was looked at
    turns = [json.loads(e.data) for e in store.load("r") if e.key == "model:0"]
    journaled = turns[0]["message"]["tool_calls"] if turns else []
    assert len(journaled) <= 1 and len(pings) == len(journaled)


def test_a_result_nested_too_deeply_is_not_said_to_refer_to_itself() -> None:
    from bide._tools import journal_safe

    cyclic: list[Any] = []
    cyclic.append(cyclic)
    deep: list[Any] = []
    inner = deep
    for _ in range(300):
        inner.append([])
        inner = inner[0]
    assert "(it refers to itself)" in journal_safe("t", cyclic)
    assert "(it is nested too deeply, or refers to itself)" in journal_safe("t", deep)
