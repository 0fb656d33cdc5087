"""A finished run leaves no reference cycles behind: its objects are freed by reference counting alone.

docs/performance.md relies on this when it suggests raising the garbage collector's first threshold for
services with thousands of runs in flight: the collector then only costs time, it frees nothing of bide's.

The runs are counted in a fresh interpreter (this file run as a script): in the test process, threads that
other tests left behind (a loopback server's connection handler ending when its client goes) free cyclic
garbage of their own at any moment, and it was counted as the runs'."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
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
    child = subprocess.run(
        [sys.executable, __file__, kind, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr
    found, answers = json.loads(child.stdout)
    assert answers == ["done"] * 65
    assert found == 0


def count_garbage(kind: str, tmp_path: Path) -> tuple[int, list[str]]:
    """The objects the collector finds unreachable after 65 runs (30 one after another, 30 at once, 5
    replayed), and their answers."""
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
        return asyncio.run(main())
    finally:
        store.close()


if __name__ == "__main__":
    print(json.dumps(count_garbage(sys.argv[1], Path(sys.argv[2]))))
