"""A stream of turns whose calls run in parallel (`max_parallel=8`): the law for random turns.

The calls of a turn finish in a random order (each waits, with random extra event-loop steps, until the
calls before it in that order have finished), with mixed tool kinds: async side effects, idempotent and
read-only tools, and synchronous read-only tools run in worker threads. Whatever the order:

- a turn streams its `ModelTurnEvent`, then one `ToolCallStarted` per call in the order the model made the
  calls, then one `ToolCallFinished` per call in the order the results were journaled (docs/bide.md,
  "Streaming"), before the next turn;
- replaying the finished run (a second `stream`) yields the same events, marked `replayed`, and calls
  neither the model nor a tool;
- every call ran once, and the model got each turn's results back in call order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_URL, drop_prefix
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bide_stream import collect, plain

import bide
from bide.testing import Call, StreamingScriptedModel, Turn, reply

# tool kind -> (safety, runs in a worker thread)
KINDS = {
    "side": (bide.SideEffect, False),
    "idem": (bide.Idempotent, False),
    "read": (bide.ReadOnly, False),
    "sync_read": (bide.ReadOnly, True),
}


@st.composite
def turns(draw: st.DrawFn) -> list[tuple[list[str], list[int], list[int]]]:
    """1 to 3 turns, each: the kinds of its calls, the order they finish in, extra loop steps per call."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=5))
        order = draw(st.permutations(range(len(kinds))))
        steps = draw(st.lists(st.integers(0, 3), min_size=len(kinds), max_size=len(kinds)))
        out.append((kinds, list(order), steps))
    return out


class World:
    """The tools of one example: each call waits for the calls before it in its turn's finish order."""

    def __init__(self, plan: list[tuple[list[str], list[int], list[int]]]) -> None:
        self.plan = plan
        self.done: set[tuple[int, int]] = set()
        self.ran: dict[tuple[int, int], int] = {}

    def _before_me_done(self, t: int, i: int) -> bool:
        order = self.plan[t][1]
        return all((t, j) in self.done for j in order[: order.index(i)])

    def _finish(self, t: int, i: int) -> str:
        self.ran[t, i] = self.ran.get((t, i), 0) + 1
        self.done.add((t, i))
        return f"done {t}.{i}"

    def tools(self) -> list[bide.Tool]:
        world = self

        async def act(t: int, i: int) -> str:
            """Act (async)."""
            give_up = time.monotonic() + 10  # never wait forever, whatever went wrong
            while not world._before_me_done(t, i) and time.monotonic() < give_up:
                await asyncio.sleep(0.001)
            for _ in range(world.plan[t][2][i]):
                await asyncio.sleep(0)
            return world._finish(t, i)

        def act_sync(t: int, i: int) -> str:
            """Act (in a worker thread)."""
            give_up = time.monotonic() + 10
            while not world._before_me_done(t, i) and time.monotonic() < give_up:
                time.sleep(0.001)
            return world._finish(t, i)

        return [
            bide.Tool.from_function(act_sync if sync else act, name=f"t_{kind}", safety=safety, timeout=30)
            for kind, (safety, sync) in KINDS.items()
        ]

    def script(self) -> list[Turn]:
        script = [
            Turn(
                text=f"turn {t} asks for {len(kinds)} calls",
                calls=tuple(Call(f"t_{k}", {"t": t, "i": i}) for i, k in enumerate(kinds)),
            )
            for t, (kinds, _, _) in enumerate(self.plan)
        ]
        return [*script, reply("all done")]


@pytest.fixture(
    scope="module", params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def shared_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[bide.Store]:
    """One store per kind for all examples (each example is a run of its own)."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    url = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{Path(tmp_path_factory.mktemp('stream')) / 'bide.db'}",
        "postgres": PG_URL,
    }[request.param]
    store = bide.open_store(url, table_prefix=prefix)
    yield store
    store.close()
    if request.param == "postgres":
        drop_prefix(PG_URL, prefix)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=turns(), chunk=st.integers(1, 8))
def test_parallel_streams_report_results_in_journal_order_and_replay_the_same(
    shared_store: bide.Store, plan: list[tuple[list[str], list[int], list[int]]], chunk: int
) -> None:
    world = World(plan)
    run_id = f"r-{uuid.uuid4().hex}"

    def agent() -> bide.Agent[str]:
        model = StreamingScriptedModel(world.script(), chunk=chunk)
        return bide.Agent(model, store=shared_store, tools=world.tools(), max_parallel=8)

    live_agent = agent()
    live = asyncio.run(collect(live_agent.stream(run_id, "go")))
    assert isinstance(live[-1], bide.Finished) and live[-1].result.answer == "all done"
    assert not any(getattr(e, "replayed", False) for e in live)

    # The ordering rule: per turn, the turn, its calls started in call order, their results in journal order.
    journaled = [
        e.key.removeprefix("result:") for e in shared_store.load(run_id) if e.key.startswith("result:")
    ]
    events = [e for e in plain(live) if not isinstance(e, tuple)]
    expected: list[tuple[str, str]] = []
    for t, (kinds, _, _) in enumerate(plan):
        calls = [f"c{t}.{i}" for i in range(len(kinds))]
        expected += [("turn", str(t))] + [("started", c) for c in calls]
        expected += [("finished", c) for c in journaled if c in calls]
    expected.append(("turn", str(len(plan))))
    assert [kind_of(e) for e in events] == expected
    # Every call ran once, and each turn's results went back to the model in call order.
    assert world.ran == {(t, i): 1 for t, (kinds, _, _) in enumerate(plan) for i in range(len(kinds))}
    model = live_agent.model
    assert isinstance(model, StreamingScriptedModel)
    for t, (kinds, _, _) in enumerate(plan):
        tool_messages = [m.content for m in model.requests[t + 1].messages if m.role == "tool"]
        assert tool_messages[-len(kinds) :] == [f"done {t}.{i}" for i in range(len(kinds))]

    replay_agent = agent()
    replay = asyncio.run(collect(replay_agent.stream(run_id, "go")))
    assert plain(replay) == plain(live)
    assert all(e.replayed for e in replay)
    assert world.ran == {(t, i): 1 for t, (kinds, _, _) in enumerate(plan) for i in range(len(kinds))}
    assert isinstance(replay_agent.model, StreamingScriptedModel) and replay_agent.model.requests == []


def kind_of(event: Any) -> tuple[str, str]:
    if isinstance(event, bide.ModelTurnEvent):
        return ("turn", str(event.turn))
    if isinstance(event, bide.ToolCallStarted):
        return ("started", event.call_id)
    assert isinstance(event, bide.ToolCallFinished), event
    return ("finished", event.call_id)
