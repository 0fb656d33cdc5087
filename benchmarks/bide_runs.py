"""Durable runs per second for a one-tool run (model turn, side-effect tool, final answer).

    python benchmarks/bide_runs.py [--quick] [--skip-postgres] [--latency-ms MS]

Prints: the bare durable SQLite commit rate on this machine; sequential ms/run on SQLite (synchronous=FULL,
WAL) and memory; concurrent runs/s (group commit) against that commit rate, for 5,000 runs started at once
and by runs in flight (with CPython's default garbage collector setting, then with the one
docs/performance.md suggests for services); 5,000 concurrent runs whose model call sleeps 100 ms; records
and transactions per run; on PostgreSQL (when reachable): ms per sequential run on loopback and through a
proxy that delays every packet by `--latency-ms` each way (a server across a data centre, where round
trips set the time), and runs/s with 2,000 at once. The scripted model is offline. The load average is
printed too: figures from a busy machine are not comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from _latency import add_latency_option, proxied, round_trip_ms

import bide
from bide.testing import ScriptedModel, call, reply

# The reference figures, measured on the project's machines: a bare durable SQLite commit about
# 0.17 ms (about 6,000 commits/s); LangGraph 1.2 + SqliteSaver 5.9 ms and DBOS 3.4 10.6 ms per three-step
# durable workflow. This machine's own bare commit rate is measured below and is the bar used.
REFERENCE_COMMITS_PER_S = 6_000
# The garbage collector setting docs/performance.md suggests for a service with thousands of runs in flight.
SERVICE_GC = (50_000, 20, 20)
POSTGRES_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
T = TypeVar("T")


def bare_commit_rate(path: Path, n: int) -> float:
    """Commits/s of one-row INSERT transactions with WAL and synchronous=FULL (the floor we compare to)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v BLOB)")
    rates = []
    for r in range(3):
        t0 = time.perf_counter()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?, ?)", (f"{r}-{i}", b"x" * 300))
            conn.execute("COMMIT")
        rates.append(n / (time.perf_counter() - t0))
    conn.close()
    return statistics.median(rates)


async def charge_card(customer: str, cents: int) -> str:
    """Charge a card (the side effect; here it only answers)."""
    return f"charged {customer} {cents}"


TOOL = bide.Tool.from_function(charge_card)


def make_agent(store: bide.Store, delay: float = 0.0) -> bide.Agent:
    model = ScriptedModel(
        [call("charge_card", customer="alice", cents=500), reply("done")], delay=delay, record=False
    )
    return bide.Agent(model, store=store, tools=[TOOL], system="You charge cards.")


async def sequential(store: bide.Store, n: int, tag: str) -> float:
    """Median ms per run over three rounds of n runs, one at a time (median CPU us per run of this process
    kept in CPU[tag])."""
    agent = make_agent(store)
    await agent.run(f"{tag}-warm", "go")
    rounds = []
    cpu = []
    for r in range(3):
        c0 = time.process_time()
        t0 = time.perf_counter()
        for i in range(n):
            await agent.run(f"{tag}-{r}-{i}", "go")
        rounds.append((time.perf_counter() - t0) / n * 1000)
        cpu.append((time.process_time() - c0) / n * 1e6)
    CPU[tag] = statistics.median(cpu)
    return statistics.median(rounds)


CPU: dict[str, float] = {}


async def concurrent(
    store: bide.Store, n: int, tag: str, delay: float = 0.0, width: int | None = None
) -> float:
    """Wall seconds for n runs, all started at once or, with `width`, at most `width` in flight (CPU
    seconds of this process kept in CPU[tag])."""
    agent = make_agent(store, delay)
    answers: list[str] = []

    async def one(i: int) -> None:
        result = await agent.run(f"{tag}-{i}", "go")
        # A replayed run (an id used before) would cost one read: every measured run must be new.
        answers.append("replayed" if result.replayed else result.answer)

    async def worker(ids: range) -> None:
        # A service with `width` runs in flight: each worker starts its next run when one finishes, and
        # nothing of a finished run is kept (gathering n tasks would keep n finished tasks alive).
        for i in ids:
            await one(i)

    c0 = time.process_time()
    t0 = time.perf_counter()
    if width is None:
        await asyncio.gather(*(one(i) for i in range(n)))
    else:
        await asyncio.gather(*(worker(range(w, n, width)) for w in range(width)))
    dt = time.perf_counter() - t0
    CPU[tag] = time.process_time() - c0
    assert len(answers) == n and all(a == "done" for a in answers)
    return dt


def commits(store: bide.Store) -> int:
    return int(getattr(store, "commits", 0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller counts (for a smoke run)")
    parser.add_argument(
        "--tune-gc",
        action="store_true",
        help=f"gc.set_threshold{SERVICE_GC} for everything (what docs/performance.md suggests for services)",
    )
    parser.add_argument("--skip-postgres", action="store_true", help="do not try the PostgreSQL server")
    add_latency_option(parser, "run on PostgreSQL")
    args = parser.parse_args()
    if args.tune_gc:
        gc.set_threshold(*SERVICE_GC)
    seq_n, conc_n, big_n = (50, 500, 1000) if args.quick else (300, 5000, 5000)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load:.1f}, "
        f"gc thresholds {gc.get_threshold()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        rate = bare_commit_rate(tmpdir / "bare.db", 200 if args.quick else 1000)
        print(f"bare durable SQLite commit (WAL, synchronous=FULL): {1000 / rate:.3f} ms = {rate:,.0f}/s")

        sql = bide.open_store(f"sqlite:///{tmpdir / 'seq.db'}")
        ms_sql = asyncio.run(sequential(sql, seq_n, "seq-sql"))
        ms_mem = asyncio.run(sequential(bide.open_store("memory://"), seq_n, "seq-mem"))
        # The floor again, right after: the disk's commit time drifts on a shared machine.
        rate = statistics.median([rate, bare_commit_rate(tmpdir / "bare2.db", 200 if args.quick else 1000)])
        floor_ms = 1000 / rate
        records = len(sql.load("seq-sql-0-0"))
        before = commits(sql)
        asyncio.run(make_agent(sql).run("count-1", "go"))
        tx = commits(sql) - before
        print(
            f"sequential one-tool run: SQLite {ms_sql:.3f} ms/run ({1000 / ms_sql:,.0f} runs/s) = "
            f"{ms_sql / floor_ms:.2f} bare commits of {floor_ms:.3f} ms (the floor measured before and "
            f"after, averaged; the run needs {tx} durable commits, its lower bound; issue 17's 0.5 ms is "
            f"{0.5 / floor_ms:.2f} of these commits here, {0.5 * REFERENCE_COMMITS_PER_S / 1000:.1f} on the "
            f"issue's machine); CPU {CPU['seq-sql']:.0f} us/run; memory {ms_mem:.3f} ms/run "
            f"({1000 / ms_mem:,.0f} runs/s, CPU {CPU['seq-mem']:.0f} us/run)"
        )
        print(
            f"writes per run: {records} records in {tx} durable transactions "
            "(header+start+first model turn+attempt marker | tool result | final turn+end), plus the run's "
            "lease grant, not synced, in the transaction of the first load"
        )
        sql.close()

        sql = bide.open_store(f"sqlite:///{tmpdir / 'conc.db'}")
        before = commits(sql)
        dt_sql = asyncio.run(concurrent(sql, conc_n, "conc-sql"))
        used = commits(sql) - before
        dt_mem = asyncio.run(concurrent(bide.open_store("memory://"), conc_n, "conc-mem"))
        print(
            f"concurrent, {conc_n:,} runs at once: SQLite {conc_n / dt_sql:,.0f} runs/s = "
            f"{conc_n / dt_sql / rate:.2f}x this machine's bare commit rate (target > 1x; "
            f"{conc_n / dt_sql / REFERENCE_COMMITS_PER_S:.2f}x the issue's ~6,000/s) "
            f"({used:,} commits for {conc_n * tx:,} run "
            f"transactions; CPU {CPU['conc-sql'] / conc_n * 1e6:.0f} us/run); memory "
            f"{conc_n / dt_mem:,.0f} runs/s (CPU {CPU['conc-mem'] / conc_n * 1e6:.0f} us/run)"
        )
        sql.close()

        # How throughput depends on how many runs are in flight: every live run holds objects the garbage
        # collector scans, so full collections grow with concurrency.
        sweep = (50, 200, 1000) if args.quick else (100, 500, 2000, 5000)
        sql = bide.open_store(f"sqlite:///{tmpdir / 'sweep.db'}")
        asyncio.run(concurrent(sql, 200, "sweep-warm"))  # the database file and connection exist first
        settings = [("", gc.get_threshold())]
        if not args.tune_gc:
            settings.append((f" with gc.set_threshold{SERVICE_GC}", SERVICE_GC))
        for round_, (label, threshold) in enumerate(settings):
            saved = gc.get_threshold()
            gc.set_threshold(*threshold)
            figures = []
            for k in sweep:
                runs = max(k * 2, 1000 if args.quick else 4000)
                dt = asyncio.run(concurrent(sql, runs, f"sweep{round_}-{k}", width=k))  # new runs each time
                figures.append(f"{k:,}: {runs / dt:,.0f}/s ({runs / dt / rate:.2f}x)")
            gc.set_threshold(*saved)
            print(f"  SQLite runs/s by runs in flight{label} (x bare commit rate): " + ", ".join(figures))
        sql.close()

        if not args.skip_postgres:
            postgres_runs(seq_n, conc_n // 10 * 4, args.latency_ms)

        # Each in a fresh interpreter, as a service would run them: the garbage the earlier scenarios left
        # in this process would otherwise be scanned by every collection of this one.
        wall_mem, cpu_mem = in_fresh_process(big_case, "memory://", big_n, args.tune_gc)
        wall_sql, cpu_sql = in_fresh_process(big_case, f"sqlite:///{tmpdir / 'big.db'}", big_n, args.tune_gc)
        print(
            f"{big_n:,} concurrent runs, model sleeps 100 ms per turn (2 turns), each in a fresh process: "
            f"wall {wall_mem:.3f} s memory (target < 0.6 s; CPU {cpu_mem:.3f} s), {wall_sql:.3f} s SQLite "
            f"(target < 1.5 s; CPU {cpu_sql:.3f} s)"
        )


def postgres_runs(seq_n: int, conc_n: int, latency_ms: float) -> None:
    """The one-tool run on PostgreSQL: sequential ms per run on loopback and, with `latency_ms`, through a
    `DelayingProxy`; runs/s with `conc_n` at once. Each in tables of a prefix of its own, dropped after."""
    prefix = f"bench{os.getpid()}_"
    try:
        store = bide.open_store(POSTGRES_URL, table_prefix=prefix)
    except bide.BideError as exc:
        print(f"PostgreSQL: skipped, server not reachable ({str(exc).splitlines()[0][:100]})")
        return
    try:
        ms = asyncio.run(sequential(store, seq_n, "pg-seq"))
        dt = asyncio.run(concurrent(store, conc_n, "pg-conc"))
        rtt = round_trip_ms(POSTGRES_URL)
        line = (
            f"PostgreSQL on loopback (round trip {rtt:.2f} ms): sequential one-tool run {ms:.3f} ms/run "
            f"(CPU {CPU['pg-seq']:.0f} us/run); {conc_n:,} runs at once {conc_n / dt:,.0f} runs/s"
        )
        if latency_ms > 0:
            proxy, url = proxied(POSTGRES_URL, latency_ms)
            far = bide.open_store(url, table_prefix=prefix)
            try:
                far_ms = asyncio.run(sequential(far, max(seq_n // 10, 10), "pg-far"))
                rtt = round_trip_ms(url)
                line += (
                    f"; through a proxy adding {latency_ms:g} ms each way (round trip {rtt:.2f} ms): "
                    f"{far_ms:.2f} ms/run = {far_ms / rtt:.1f} round trips"
                )
            finally:
                far.close()
                proxy.close()
        print(line)
    finally:
        store.close()
        engine = sa.create_engine(POSTGRES_URL)
        with engine.begin() as conn:
            for table in ("records", "runs"):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {prefix}{table}")
        engine.dispose()


def big_case(url: str, n: int, tune_gc: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of n concurrent runs on `url` whose model sleeps 100 ms per turn."""
    if tune_gc:
        gc.set_threshold(*SERVICE_GC)
    store = bide.open_store(url)
    try:
        wall = asyncio.run(concurrent(store, n, "big", delay=0.1))
    finally:
        store.close()
    return wall, CPU["big"]


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a new interpreter (spawned, so it inherits nothing of this process's heap)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


if __name__ == "__main__":
    main()
