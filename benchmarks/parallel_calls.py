"""Parallel tool calls: wall time of one model turn that calls three tools taking 1 s each.

    python benchmarks/parallel_calls.py [--seconds S]

Prints, for SQLite (WAL, synchronous=FULL) and memory, the wall time of the run with the calls run
concurrently (the default `max_parallel=8`) and one after another (`max_parallel=1`), for three async
read-only tools and for three async side effects (each with its own attempt marker and result). The
scripted model is offline and answers at once, so the figure is the calls plus bide's journal writes.
For SQLite it prints the durable transactions of each run too (the lease grant is not one). The load
average is printed too: figures from a busy machine are not comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import bide
from bide.testing import Call, ScriptedModel, Turn, reply


def tools(seconds: float) -> list[bide.Tool]:
    async def lookup(i: int) -> str:
        """A slow read."""
        await asyncio.sleep(seconds)
        return f"value {i}"

    async def charge(i: int) -> str:
        """A slow side effect."""
        await asyncio.sleep(seconds)
        return f"charged {i}"

    return [
        bide.Tool.from_function(lookup, safety=bide.ReadOnly, timeout=seconds + 30),
        bide.Tool.from_function(charge, timeout=seconds + 30),
    ]


async def one_run(store: bide.Store, tool: str, max_parallel: int, run_id: str, seconds: float) -> float:
    model = ScriptedModel([Turn(calls=tuple(Call(tool, {"i": i}) for i in range(3))), reply("done")])
    agent = bide.Agent(model, store=store, tools=tools(seconds), max_parallel=max_parallel)
    t0 = time.perf_counter()
    result = await agent.run(run_id, "go")
    dt = time.perf_counter() - t0
    assert result.answer == "done"
    return dt


def commits(store: bide.Store) -> int:
    return int(getattr(store, "commits", 0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0, help="how long each tool call takes")
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load:.1f}")
    print(f"one turn calling three tools of {args.seconds:g} s each, then the answer (wall seconds per run):")
    with tempfile.TemporaryDirectory() as tmp:
        stores = {
            "SQLite": bide.open_store(f"sqlite:///{Path(tmp) / 'parallel.db'}"),
            "memory": bide.open_store("memory://"),
        }
        for name, store in stores.items():
            for tool, kind in (("lookup", "read-only"), ("charge", "side effects")):
                c0 = commits(store)
                par = asyncio.run(one_run(store, tool, 8, f"{tool}-par", args.seconds))
                c1 = commits(store)
                seq = asyncio.run(one_run(store, tool, 1, f"{tool}-seq", args.seconds))
                c2 = commits(store)
                txs = f" (durable transactions {c1 - c0} and {c2 - c1})" if name == "SQLite" else ""
                print(
                    f"  {name:6} {kind:12}: parallel (max_parallel=8) {par:.3f} s, "
                    f"one after another (max_parallel=1) {seq:.3f} s{txs}"
                )
            store.close()


if __name__ == "__main__":
    main()
