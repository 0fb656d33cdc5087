"""What streaming a run costs: `agent.stream` against `agent.run` for the same runs, per event.

    python benchmarks/streaming.py [--quick]

Each run makes `calls` read-only tool calls and then answers (memory store, offline scripted model), so it
journals calls + 1 turns and streams (calls + 1) turn events, calls x (started + finished) events and one
Finished. Prints CPU ms per run for `run` and for `stream` (rounds alternate, medians), the difference per
streamed event, and the same with a streaming model (text deltas of 8 characters in a 200-character
answer). The load average is printed too: figures from a busy machine are not comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import bide
from bide.testing import ScriptedModel, StreamingScriptedModel, Turn, call, reply


@bide.tool(safety=bide.ReadOnly)
def lookup(n: int) -> str:
    """Look something up (read-only)."""
    return f"value {n}"


def script(calls: int, answer: str) -> list[Turn]:
    return [call("lookup", n=i) for i in range(calls)] + [reply(answer)]


async def drive(agent: bide.Agent, n: int, tag: str, streamed: bool) -> tuple[float, int]:
    """CPU seconds of this process for n sequential runs (less sensitive to other processes than wall
    time), and the events streamed (0 for run)."""
    events = 0
    t0 = time.process_time()
    for i in range(n):
        if streamed:
            async for _ in agent.stream(f"{tag}-{i}", "go"):
                events += 1
        else:
            await agent.run(f"{tag}-{i}", "go")
    return time.process_time() - t0, events


def measure(calls: int, n: int, rounds: int, streaming_model: bool) -> None:
    answer = "x" * 200 if streaming_model else "done"
    runs: list[float] = []
    streams: list[float] = []
    events = 0
    for r in range(rounds + 1):  # round 0 warms up and is not counted
        store = bide.open_store("memory://")
        turns = script(calls, answer)
        model = StreamingScriptedModel(turns, chunk=8, record=False) if streaming_model else None
        agent = bide.Agent(model or ScriptedModel(turns, record=False), store=store, tools=[lookup])
        # Alternate which goes first, so a drift in load hits both alike.
        order = [(False, runs), (True, streams)] if r % 2 == 0 else [(True, streams), (False, runs)]
        for streamed, out in order:
            seconds, got = asyncio.run(drive(agent, n, f"{r}-{streamed}", streamed))
            if r:
                out.append(seconds / n)
            events = got or events
        store.close()
    per_run = events / n
    run_ms, stream_ms = statistics.median(runs) * 1000, statistics.median(streams) * 1000
    label = "streaming model, 25 deltas/run" if streaming_model else "non-streaming model"
    print(
        f"{calls} tool calls/run, {label}: run {run_ms:.3f} ms, stream {stream_ms:.3f} ms "
        f"({per_run:.0f} events/run): {1000 * (stream_ms - run_ms) / per_run:.1f} us per streamed event"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller counts (for a smoke run)")
    args = parser.parse_args()
    n, rounds = (100, 3) if args.quick else (500, 7)
    print(f"load average {os.getloadavg()[0]:.2f}; {n} runs x {rounds} rounds (medians)")
    for calls in (0, 3, 10):
        measure(calls, n, rounds, streaming_model=False)
    measure(3, n, rounds, streaming_model=True)


if __name__ == "__main__":
    main()
