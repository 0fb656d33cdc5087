"""The recovery worker: how many crashed runs one `bide.Worker` resumes per second, and how long a run
whose driver died waits before it is resumed.

    python benchmarks/worker.py [--runs 2000] [--quick]

Figures printed (one line each), on the memory store and on a SQLite file:

- resumed runs/s: `runs` runs whose first drive failed after its first turn (a read-only tool call),
  resumed by one `Worker.run_once()` (concurrency 64); each resumed drive journals the tool's result, a
  final turn and the end;
- recovery latency: a run whose driver died holding its lease (lease_ttl 1 s) is finished by a worker
  polling every 0.2 s; the figure is the time from the death to the finished run, expected at about
  lease_ttl plus up to one poll interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time

import bide
from bide.testing import Fail, ScriptedModel, call, reply


@bide.tool(safety=bide.ReadOnly)
def look(n: int) -> str:
    """Look something up."""
    return f"seen {n}"


def crashed_runs(store: bide.Store, runs: int) -> None:
    for i in range(runs):
        model = ScriptedModel([call("look", n=i), Fail(bide.ModelError("down"))], record=False)
        with contextlib.suppress(bide.ModelError):
            bide.Agent(model, store=store, tools=[look], name="b").run_sync(f"r{i}", "go")


def resumed_per_second(store: bide.Store, runs: int) -> float:
    crashed_runs(store, runs)
    agent = bide.Agent(ScriptedModel([call("look", n=0), reply("done")], record=False), store=store,
                       tools=[look], name="b")  # fmt: skip
    worker = bide.Worker(store, agent, concurrency=64)
    start = time.perf_counter()
    report = asyncio.run(worker.run_once())
    elapsed = time.perf_counter() - start
    assert report.completed == runs, report
    return runs / elapsed


def recovery_latency(store: bide.Store, ttl: float, poll: float) -> float:
    model = ScriptedModel([call("look", n=0), Fail(bide.ModelError("down"))], record=False)
    dead = bide.Agent(model, store=store, tools=[look], name="b", lease_ttl=ttl)
    with contextlib.suppress(bide.ModelError):
        dead.run_sync("victim", "go")
    # The driver dies holding its lease (a SIGKILL leaves it until it expires).
    store.lease("victim", "dead-driver", now_ms=int(time.time() * 1000), ttl_ms=int(ttl * 1000))
    died = time.time()
    agent = bide.Agent(ScriptedModel([call("look", n=0), reply("done")]), store=store, tools=[look],
                       name="b", lease_ttl=ttl)  # fmt: skip

    async def until_done() -> float:
        worker = bide.Worker(store, agent, poll_interval=poll)
        forever = asyncio.create_task(worker.run_forever())
        while bide.run_status(store, "victim").status != "completed":
            await asyncio.sleep(0.005)
        done = time.time()
        worker.stop()
        await forever
        return done

    return asyncio.run(until_done()) - died


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    runs = 50 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as tmp:
        stores = {
            "memory": lambda: bide.open_store("memory://"),
            "SQLite": lambda: bide.open_store(f"sqlite:///{os.path.join(tmp, f'w{time.time_ns()}.db')}"),
        }
        for name, make in stores.items():
            store = make()
            rate = resumed_per_second(store, runs)
            store.close()
            print(f"worker, {name}: {rate:,.0f} crashed runs resumed/s ({runs} runs, concurrency 64)")
        for name, make in stores.items():
            store = make()
            latency = recovery_latency(store, ttl=1.0, poll=0.2)
            store.close()
            print(f"recovery latency, {name}: {latency:.2f} s after the driver died (lease 1 s, poll 0.2 s)")


if __name__ == "__main__":
    main()
