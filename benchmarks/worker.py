"""The recovery worker: how many crashed runs one `bide.Worker` resumes per second, and how long a run
whose driver died waits before it is resumed.

    python benchmarks/worker.py [--runs 2000] [--quick]

Figures printed (one line each), on the memory store and on a SQLite file:

- resumed runs/s: `runs` runs whose first drive failed after its first turn (a read-only tool call),
  resumed by one `Worker.run_once()` (concurrency 64); each resumed drive journals the tool's result, a
  final turn and the end;
- recovery latency: a run whose driver died holding its lease (lease_ttl 1 s) is finished by a worker
  polling every 0.2 s; the figure is the time from the death to the finished run, expected at about
  lease_ttl plus up to one poll interval;
- an idle worker beside `--halted` runs halted for a person (SQLite): the CPU share it takes once it has
  read them all (polling every second), and the recovery latency of a run whose driver dies meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
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


@bide.tool(timeout=5)
def send(to: str) -> str:
    """Send a message (the connection drops after the request went out)."""
    raise OSError("lost after the request went out")


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def idle_worker(store: bide.Store, halted: int, settle: float, measure: float) -> tuple[float, float, float]:
    """(the first pass's seconds, the CPU share of a worker serving `halted` halted runs once it read them
    all, the recovery latency of a run whose driver died meanwhile)."""
    behind = lambda: time.time() - 60  # noqa: E731  (deadlines already past: each halts at once)
    for i in range(halted):
        model = ScriptedModel([call("send", to="x"), reply("sent")], record=False)
        with contextlib.suppress(bide.OutcomeUnknown):
            bide.Agent(model, store=store, tools=[send], name="h", clock=behind).run_sync(f"h{i:06d}", "go")
    ttl = 1.0
    dying = ScriptedModel([call("look", n=0), Fail(bide.ModelError("down"))], record=False)
    dead = bide.Agent(dying, store=store, tools=[look], name="b", lease_ttl=ttl)
    agents = [
        bide.Agent(ScriptedModel([call("send", to="x"), reply("sent")]), store=store, tools=[send], name="h"),
        bide.Agent(ScriptedModel([call("look", n=0), reply("done")]), store=store, tools=[look], name="b",
                   lease_ttl=ttl),
    ]  # fmt: skip

    async def serve() -> tuple[float, float, float]:
        worker = bide.Worker(store, agents, poll_interval=1.0)
        started = time.monotonic()
        forever = asyncio.create_task(worker.run_forever())
        while len(worker._state) < halted or worker.in_flight:
            await asyncio.sleep(0.2)
        first_pass = time.monotonic() - started
        await asyncio.sleep(settle)  # past the one re-read of a run the worker halted itself
        cpu, wall = _cpu(), time.monotonic()
        await asyncio.sleep(measure)
        share = (_cpu() - cpu) / (time.monotonic() - wall)
        # A driver of "victim" dies now, holding its lease (a SIGKILL leaves it until it expires).
        with contextlib.suppress(bide.ModelError):
            await dead.run("victim", "go")
        store.lease("victim", "dead-driver", now_ms=int(time.time() * 1000), ttl_ms=int(ttl * 1000))
        died = time.time()
        while bide.run_status(store, "victim").status != "completed":
            await asyncio.sleep(0.005)
        latency = time.time() - died
        worker.stop()
        await forever
        return first_pass, share, latency

    return asyncio.run(serve())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument(
        "--halted", type=int, default=10_000, help="runs halted beside an idle worker (0: skip)"
    )
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    runs = 50 if args.quick else args.runs
    halted = min(args.halted, 50) if args.quick else args.halted
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
        if halted:
            store = stores["SQLite"]()
            settle, measure = (1.0, 1.0) if args.quick else (35.0, 20.0)
            first_pass, share, latency = idle_worker(store, halted, settle, measure)
            store.close()
            print(
                f"idle worker, SQLite, {halted:,} runs halted for a person: first pass {first_pass:.1f} s; "
                f"then {share:.3f} of a core over {measure:.0f} s (poll 1 s); a driver dying meanwhile "
                f"(lease 1 s) recovered after {latency:.2f} s; load average {os.getloadavg()[0]:.1f}"
            )


if __name__ == "__main__":
    main()
