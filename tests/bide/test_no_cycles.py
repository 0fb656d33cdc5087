"""A finished run leaves no reference cycles behind: its objects are freed by reference counting alone.

docs/performance.md relies on this when it suggests raising the garbage collector's first threshold for
services with thousands of runs in flight: the collector then only costs time, it frees nothing of bide's."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

import bide
from bide.testing import ScriptedModel, call, reply


async def charge(customer: str, cents: int) -> str:
    """A side effect (here it only answers)."""
    return f"charged {customer} {cents}"


async def lookup(customer: str) -> str:
    """A read-only tool."""
    return f"{customer}: 1200"


TOOLS = [bide.Tool.from_function(charge), bide.Tool.from_function(lookup, safety=bide.ReadOnly)]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_finished_runs_leave_no_cyclic_garbage(kind: str, tmp_path: Path) -> None:
    store = bide.open_store("memory://" if kind == "memory" else f"sqlite:///{tmp_path / 'c.db'}")
    model = ScriptedModel(
        [call("lookup", customer="alice"), call("charge", customer="alice", cents=500), reply("done")],
        record=False,
    )
    agent = bide.Agent(model, store=store, tools=TOOLS, system="You charge cards.")

    async def main() -> tuple[int, list[str]]:
        await agent.run("warm", "go")  # imports, caches and the store's connection exist first
        gc.collect()
        gc.disable()
        try:
            answers = [(await agent.run(f"one-{i}", "go")).answer for i in range(30)]
            results = await asyncio.gather(*(agent.run(f"many-{i}", "go") for i in range(30)))
            answers += [r.answer for r in results]
            answers += [(await agent.run(f"one-{i}", "go")).answer for i in range(5)]  # replayed
            del results
            return gc.collect(), answers
        finally:
            gc.enable()

    try:
        found, answers = asyncio.run(main())
    finally:
        store.close()
    assert answers == ["done"] * 65
    assert found == 0
