"""Governed agents: how fast the shared event log appends, how fast replicas fold, and how many governed
agents per second run end to end (stub model, memory stores), with their memory.

    python benchmarks/governed.py [--agents 100000] [--million]

Figures printed (one line each):

- events appended/s to the event log: SQLite file and PostgreSQL (when reachable), one event per
  transaction and batches of 100 per transaction;
- replica fold rate (events/s): one event per `deliver` call, shuffled delivery (rules enforced), and
  batched (one vectorized replay per page, `Machine.replay_ids`);
- governed agents/s end to end: each agent is a bide agent with its own memory store and a stub model
  that calls one event tool on its own order record and answers; the shared log is in memory. After
  the run a replica folds the log in shuffled order and must equal the log-order fold (the inline
  convergence check). Peak RSS is reported at every checkpoint of the run, so a flat heap shows as a
  flat column. The Go reference drives ~12,500-20,000 governed agents/s with a flat heap.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

import bide
import govern
from bide.testing import ScriptedModel, call, reply

POSTGRES_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def order_machine() -> govern.Machine:
    """The demo's order machine (examples/demo.py), so the benchmark measures what the demo runs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    try:
        from demo import orders
    finally:
        sys.path.pop(0)
    return orders.build()


def rss_mb() -> float:
    """Current resident set size in MB (Linux /proc), falling back to the peak."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def events_for(machine: govern.Machine, n: int, records: int, seed: int) -> list[govern.Event]:
    rng = random.Random(seed)
    tag = uuid.uuid4().hex[:8]
    return [
        govern.Event(
            id=f"{tag}-{i}",
            machine=machine.digest,
            record=f"order-{rng.randrange(records)}",
            event=rng.choice(machine.events),
            producer=f"agent-{i % 16}",
        )
        for i in range(n)
    ]


def bench_append(machine: govern.Machine, url: str, label: str, single: int, batched: int) -> None:
    log = govern.EventLog(url, name=f"bench-{uuid.uuid4().hex[:8]}", machine=machine)
    events = events_for(machine, single, 1000, 1)
    t = time.perf_counter()
    for e in events:
        log.append(e)
    one = single / (time.perf_counter() - t)
    events = events_for(machine, batched, 1000, 2)
    t = time.perf_counter()
    for i in range(0, batched, 100):
        log.append_many(events[i : i + 100])
    many = batched / (time.perf_counter() - t)
    print(
        f"append {label:<10} {one:>10,.0f} events/s one per transaction   "
        f"{many:>10,.0f} events/s in batches of 100"
    )
    log.close()


def bench_fold(machine: govern.Machine, n: int) -> None:
    log = govern.EventLog("memory://", machine=machine)
    for i in range(0, n, 5000):
        log.append_many(events_for(machine, min(5000, n - i), 10_000, 10 + i))
    stored = log.read()
    replica = govern.Replica(machine, log)
    t = time.perf_counter()
    for e in stored:
        replica.deliver([e])
    single = n / (time.perf_counter() - t)
    reference = replica.digest()

    shuffled = list(stored)
    random.Random(3).shuffle(shuffled)
    replica = govern.Replica(machine, log)
    t = time.perf_counter()
    replica.deliver(shuffled)
    rate_shuffled = n / (time.perf_counter() - t)
    assert replica.pending == 0 and replica.digest() == reference

    replica = govern.Replica(machine, log)
    t = time.perf_counter()
    for i in range(0, n, 5000):
        replica.deliver(stored[i : i + 5000])
    batched = n / (time.perf_counter() - t)
    assert replica.digest() == reference

    replica = govern.Replica(machine, log)
    t = time.perf_counter()
    replica.deliver(stored)
    whole = n / (time.perf_counter() - t)
    assert replica.digest() == reference

    replica = govern.Replica(machine, log)
    t = time.perf_counter()
    replica.sync()
    synced = n / (time.perf_counter() - t)
    assert replica.digest() == reference
    print(
        f"fold {n:,} events over 10,000 records: {single:>10,.0f} events/s one at a time, "
        f"{rate_shuffled:>10,.0f} shuffled (rules enforced), "
        f"{batched:>10,.0f} batched by 5,000 (vectorized), {whole:>10,.0f} in one batch, "
        f"{synced:>10,.0f} sync() incl. reading the log"
    )


async def run_agents(machine: govern.Machine, log: govern.EventLog, total: int, report_every: int) -> None:
    tools = {e: govern.event_tool(machine, log, e) for e in ("pay", "restock")}
    t0 = time.perf_counter()
    last = t0
    for i in range(total):
        event = "pay" if i % 2 == 0 else "restock"
        model = ScriptedModel([call(event, record=f"order-{i}"), reply("ok")])
        store = bide.MemoryStore()
        agent = bide.Agent(model, store=store, tools=[tools[event]], name="governed")
        result = await agent.run(f"agent-{i}", "go")
        assert result.answer == "ok"
        done = i + 1
        if done % report_every == 0 or done == total:
            now = time.perf_counter()
            gc.collect()
            print(
                f"  agents {done:>9,}: {done / (now - t0):>8,.0f} agents/s overall, "
                f"{report_every / (now - last):>8,.0f} in the last {report_every:,}, "
                f"RSS {rss_mb():>7,.1f} MB",
                flush=True,
            )
            last = now


def bench_agents(machine: govern.Machine, total: int) -> None:
    log = govern.EventLog("memory://", machine=machine)
    print(
        f"governed agents end to end ({total:,} agents, stub model, one memory store each, "
        "shared memory log):"
    )
    t = time.perf_counter()
    asyncio.run(run_agents(machine, log, total, max(total // 10, 1000)))
    elapsed = time.perf_counter() - t
    t = time.perf_counter()
    stored = log.read()
    assert len(stored) == total and len({e.id for e in stored}) == total
    in_order = govern.Replica(machine, log)
    in_order.sync()
    random.Random(5).shuffle(stored)
    shuffled = govern.Replica(machine, log)
    shuffled.deliver(stored)
    assert shuffled.pending == 0 and shuffled.digest() == in_order.digest()
    check = time.perf_counter() - t
    print(
        f"  {total:,} agents in {elapsed:,.1f}s = {total / elapsed:,.0f} agents/s; convergence check "
        f"(log order vs shuffled) {check:,.1f}s: identical; RSS {rss_mb():,.1f} MB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--agents", type=int, default=100_000, help="governed agents to run (default 100,000)"
    )
    parser.add_argument("--million", action="store_true", help="also run 1,000,000 agents (takes long)")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    parser.add_argument("--agents-only", action="store_true", help="skip the log and replica figures")
    args = parser.parse_args()
    machine = order_machine()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; machine {machine.name}: "
        f"{machine.n_states} states, {len(machine.events)} events"
    )
    single, batched, fold_n, agents = (
        (200, 2000, 20_000, 2000) if args.quick else (2000, 20_000, 200_000, args.agents)
    )
    if not args.agents_only:
        with tempfile.TemporaryDirectory() as tmp:
            bench_append(machine, str(Path(tmp) / "events.db"), "SQLite", single, batched)
        try:
            bench_append(machine, POSTGRES_URL, "PostgreSQL", single, batched)
        except govern.EventLogError as exc:
            print(f"append PostgreSQL: skipped, server not reachable ({str(exc).splitlines()[0][:100]})")
        bench_fold(machine, fold_n)
    bench_agents(machine, agents)
    if args.million and not args.quick:
        bench_agents(machine, 1_000_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
