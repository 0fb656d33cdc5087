"""Governed agents: how fast the shared event log appends, how fast replicas fold, and how many governed
agents per second run end to end (stub model, memory stores), with their memory.

    python benchmarks/governed.py [--agents 100000] [--million]

Figures printed (one line each):

- events appended/s to the event log: SQLite file and PostgreSQL (when reachable), one event per
  transaction and batches of 100 and 1,000 per transaction, beside the machine's floor measured just
  before in the same run: bare durable commits/s of a one-row insert on the same database; and the
  client's CPU time per event in each mode (steadier than wall time when the machine is busy);
- replica fold rate (events/s): one event per `deliver` call, the whole log shuffled in one delivery
  and in deliveries of 1,000 (rules enforced), and in log order batched (one vectorized replay per
  page, `Machine.replay_ids`);
- governed agents/s end to end: each agent is a bide agent with its own memory store and a stub model
  that calls one event tool on its own order record and answers; the shared log is in memory. After
  the run a replica folds the log in shuffled order and must equal the log-order fold (the inline
  convergence check). Beside it, the floor measured in the same run: the same agents with a tool
  that does nothing (bide alone). The RSS is reported at every checkpoint, with the log's own share
  (its bytes per stored event, measured by walking the log's objects, times the events stored) and the
  rest: a flat heap shows as a flat last column. The Go reference drives ~12,500-20,000 governed
  agents/s with a flat heap.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import resource
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pydantic import BaseModel

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


def floor_commits(url: str, n: int) -> float:
    """The machine's floor for a durable append: bare commits/s of a one-row INSERT, on the same kind of
    database (SQLite: a file beside the log's, WAL, synchronous=FULL, as the log opens it; PostgreSQL: a
    plain table in the same database, default fsync settings)."""
    if url.startswith("postgresql"):
        import psycopg

        table = f"govern_floor_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            conn.execute(f"CREATE TABLE {table} (id bigint primary key, body text)")
            conn.commit()
            try:
                t = time.perf_counter()
                for i in range(n):
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (i, "x" * 64))
                    conn.commit()
                took = time.perf_counter() - t
            finally:
                conn.execute(f"DROP TABLE {table}")
                conn.commit()
        return n / took
    path = Path(url.removeprefix("sqlite:///")).with_name("floor.db")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
        t = time.perf_counter()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * 64))
            conn.execute("COMMIT")
        return n / (time.perf_counter() - t)
    finally:
        conn.close()


def bench_append(machine: govern.Machine, url: str, label: str, single: int, batched: int) -> None:
    """Events/s appended one per transaction and in batches of 100 and 1,000 per transaction
    (`EventLog.append_many`), beside the bare durable commit rate measured just before; with this
    process's CPU time per event (`time.process_time`: the client's share, steadier than wall time on a
    busy machine; the database server's own CPU is not in it)."""
    floor = floor_commits(url, single)
    log = govern.EventLog(url, name=f"bench-{uuid.uuid4().hex[:8]}", machine=machine)
    events = events_for(machine, single, 1000, 1)
    t, cpu = time.perf_counter(), time.process_time()
    for e in events:
        log.append(e)
    one = single / (time.perf_counter() - t)
    cpus = [(time.process_time() - cpu) / single]
    rates = []
    for size, seed in ((100, 2), (1000, 3)):
        events = events_for(machine, batched, 1000, seed)
        t, cpu = time.perf_counter(), time.process_time()
        for i in range(0, batched, size):
            log.append_many(events[i : i + size])
        rates.append(batched / (time.perf_counter() - t))
        cpus.append((time.process_time() - cpu) / batched)
    print(
        f"append {label:<10} bare durable commit {floor:>8,.0f}/s; {one:>8,.0f} events/s one per "
        f"transaction ({one / floor:.2f}x the floor), {rates[0]:>9,.0f} in batches of 100, "
        f"{rates[1]:>9,.0f} in batches of 1,000; client CPU per event "
        + " / ".join(f"{c * 1e6:,.1f}" for c in cpus)
        + " µs",
        flush=True,
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
    for i in range(0, n, 1000):
        replica.deliver(shuffled[i : i + 1000])
    chunked = n / (time.perf_counter() - t)
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
        f"{rate_shuffled:>10,.0f} shuffled in one delivery (rules enforced), "
        f"{chunked:>10,.0f} shuffled in deliveries of 1,000, "
        f"{batched:>10,.0f} batched by 5,000 (vectorized), {whole:>10,.0f} in one batch, "
        f"{synced:>10,.0f} sync() incl. reading the log"
    )


class _Record(BaseModel):
    record: str


async def _no_effect(arguments: _Record) -> dict[str, bool]:
    return {"ok": True}


async def run_agents(
    machine: govern.Machine | None, log: govern.EventLog | None, total: int, report_every: int
) -> list[tuple[int, float, float, float]]:
    """Run `total` agents one after another; return (agents done, agents/s since the last checkpoint,
    RSS MB, seconds the agents of that stretch took) at every checkpoint. Without a machine, the floor:
    the same agents with a tool that does nothing (bide alone)."""
    if machine is not None and log is not None:
        tools = {e: govern.event_tool(machine, log, e) for e in ("pay", "restock")}
    else:
        tools = {
            e: bide.Tool(name=e, description=e, args=_Record, fn=_no_effect, safety=bide.Idempotent)
            for e in ("pay", "restock")
        }
    checkpoints = []
    last, counted = time.perf_counter(), 0
    for i in range(total):
        event = "pay" if i % 2 == 0 else "restock"
        model = ScriptedModel([call(event, record=f"order-{i}"), reply("ok")])
        store = bide.MemoryStore()
        agent = bide.Agent(model, store=store, tools=[tools[event]], name="governed")
        result = await agent.run(f"agent-{i}", "go")
        assert result.answer == "ok"
        done = i + 1
        if done % report_every == 0 or done == total:
            took = time.perf_counter() - last
            gc.collect()
            checkpoints.append((done, (done - counted) / took, rss_mb(), took))
            counted = done
            last = time.perf_counter()  # the checkpoint's own gc.collect is not counted
    return checkpoints


def deep_size(root: object) -> int:
    """Bytes held by every object reachable from `root` (each counted once)."""
    seen: set[int] = set()
    todo = [root]
    total = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


def bench_agents(machine: govern.Machine, total: int) -> None:
    every = max(total // 10, 1000)
    log = govern.EventLog("memory://", machine=machine)
    checkpoints = asyncio.run(run_agents(machine, log, total, every))
    # The agents' own time: the checkpoints' forced gc.collect() and RSS reads are not counted (the
    # floor's figure has none of them either).
    elapsed = sum(took for *_, took in checkpoints)
    # The floor after the governed run, so that its memory does not hide the governed run's growth.
    floor_n = min(total, 20_000)
    floor = asyncio.run(run_agents(None, None, floor_n, floor_n))[-1][1]
    print(
        f"governed agents end to end ({total:,} agents one after another, stub model, one memory store "
        f"each, shared memory log); the floor, bide alone with a tool that does nothing: {floor:,.0f} "
        f"agents/s ({floor_n:,} agents, measured after)"
    )
    # The log itself grows by one stored event per agent: measured once, reported beside the RSS.
    per_event = deep_size(log._backend.mem) / log.length()  # type: ignore[attr-defined]
    for done, rate, rss, _ in checkpoints:
        held = done * per_event / 2**20
        print(
            f"  agents {done:>9,}: {rate:>8,.0f} agents/s; RSS {rss:>7,.1f} MB, of which the log "
            f"~{held:,.1f} MB; without the log {rss - held:>7,.1f} MB",
            flush=True,
        )
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
    rate = total / elapsed
    print(
        f"  {total:,} agents in {elapsed:,.1f}s (checkpoints not counted) = {rate:,.0f} agents/s "
        f"({rate / floor:.2f}x the floor); the log holds {per_event:,.0f} bytes per event; convergence check "
        f"(log order vs shuffled) {check:,.1f}s: identical"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--agents", type=int, default=100_000, help="governed agents to run (default 100,000; 0: none)"
    )
    parser.add_argument("--million", action="store_true", help="also run 1,000,000 agents (takes long)")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    parser.add_argument("--agents-only", action="store_true", help="skip the log and replica figures")
    parser.add_argument(
        "--appends", type=int, default=2000, help="events appended one per transaction (10x in batches)"
    )
    parser.add_argument("--fold", type=int, default=200_000, help="events the replicas fold")
    args = parser.parse_args()
    machine = order_machine()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; machine {machine.name}: "
        f"{machine.n_states} states, {len(machine.events)} events; load average "
        + " ".join(f"{x:.1f}" for x in os.getloadavg())
    )
    single, batched, fold_n, agents = (
        (200, 2000, 20_000, 2000) if args.quick else (args.appends, 10 * args.appends, args.fold, args.agents)
    )
    if not args.agents_only and single:
        with tempfile.TemporaryDirectory() as tmp:
            bench_append(machine, str(Path(tmp) / "events.db"), "SQLite", single, batched)
        try:
            bench_append(machine, POSTGRES_URL, "PostgreSQL", single, batched)
        except govern.EventLogError as exc:
            print(f"append PostgreSQL: skipped, server not reachable ({str(exc).splitlines()[0][:100]})")
    if not args.agents_only and fold_n:
        bench_fold(machine, fold_n)
    if agents:  # --agents 0: only the log and fold figures
        bench_agents(machine, agents)
    if args.million and not args.quick:
        bench_agents(machine, 1_000_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
