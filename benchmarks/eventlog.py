"""The shared event log at its edges: append rates, read latency under concurrent writers, and how a
replica copes with an early event that arrives late.

    python benchmarks/eventlog.py [--quick] [--skip-postgres] [--latency-ms MS]

Figures printed (one line each):

- events appended/s, SQLite file and PostgreSQL (when reachable): one event per transaction, and
  batches of 100 and 1,000 per transaction (`EventLog.append_many`), beside the machine's floor
  measured in the same run (bare durable commits/s of a one-row insert on the same database);
- the same PostgreSQL figures through a proxy on loopback that delays every packet by `--latency-ms`
  each way (0.5 ms by default: a server in the same data centre), where round trips, not the server,
  set the rate: a small append is two round trips, the bare commit three (BEGIN, INSERT, COMMIT)
  (the client CPU figures of these lines include the proxy's own threads);
- pages a SQLite commit writes to the WAL, a one-event append's beside the bare one-row commit's:
  counted, not timed, so the same on a busy machine (each page is 4 KiB written and synced);
- read latency of `length()` and `read()` on SQLite while 4 writer processes append as fast as they
  can (p50, p99, max, and how many reads failed): readers take WAL snapshots and never wait for the
  write lock;
- late arrival: all events of one busy record delivered to a replica except the first, then the first;
  the time until everything is applied, for 1k, 4k and 16k events (and in log order, for comparison).
  Buffering is linear in the events held, so the time grows linearly.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _latency import add_latency_option, proxied, round_trip_ms
from governed import bench_append  # the same measurement as benchmarks/governed.py, on this machine

import govern

POSTGRES_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def counter_machine() -> govern.Machine:
    """A small machine whose two events do not commute (an obligation), so a late event blocks its
    record's later events in a replica's buffer: the hard case for buffering."""
    r = govern.Registry("bench_counter")
    level = r.int("level", 0, 7)
    seen = r.bool("seen")
    r.event("up", guard=level < 7, effect={level: level + 1})
    r.event("reset", effect={level: 0})
    r.event("look", effect={seen: True})
    r.independent("up", "look")  # pairs are declared: up/reset, left undeclared, is an obligation
    return r.build()


def events_for(machine: govern.Machine, n: int, records: int, tag: str) -> list[govern.Event]:
    return [
        govern.Event(
            id=f"{tag}-{i}",
            machine=machine.digest,
            record=f"r{i % records}",
            event=("up", "reset")[i % 2],
            producer=f"p{i % 16}",
        )
        for i in range(n)
    ]


def open_log(url: str, machine: govern.Machine, name: str) -> govern.EventLog:
    log = govern.EventLog(url, name=name)
    log.bind(machine)
    return log


def _writer(url: str, name: str, tag: str, stop: Any) -> None:
    machine = counter_machine()
    log = govern.EventLog(url, name=name, machine=machine)
    i = 0
    while not stop.is_set():
        log.append(
            govern.Event(
                id=f"{tag}-{i}", machine=machine.digest, record=f"r{i % 50}", event="up", producer=tag
            )
        )
        i += 1
    log.close()


def bench_reads_under_writers(machine: govern.Machine, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/events.db"
        log = open_log(url, machine, "main")
        log.append_many(events_for(machine, 1000, 50, "seed"))
        spawn = multiprocessing.get_context("spawn")
        stop = spawn.Event()
        writers = [spawn.Process(target=_writer, args=(url, "main", f"w{i}", stop)) for i in range(4)]
        for w in writers:
            w.start()
        # Measure only while all four write (interpreter start-up and imports take a while).
        deadline = time.time() + 120
        while any(log.last_by_producer(f"w{i}") is None for i in range(4)) and time.time() < deadline:
            time.sleep(0.05)
        start_length, stop_at = log.length(), time.time() + seconds
        lengths: list[float] = []
        reads: list[float] = []
        failed = 0
        while time.time() < stop_at:
            for target, out in ((log.length, lengths), (lambda: log.read(0, 100), reads)):
                t = time.perf_counter()
                try:
                    target()
                except govern.EventLogError:
                    failed += 1
                out.append(time.perf_counter() - t)
        appended = log.length() - start_length
        stop.set()
        for w in writers:
            w.join()
        for label, samples in (("length()", lengths), ("read(0, 100)", reads)):
            samples.sort()
            p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
            print(
                f"SQLite {label:<13} under 4 writers: p50 {p50 * 1000:7.2f} ms  p99 {p99 * 1000:7.2f} ms  "
                f"max {samples[-1] * 1000:7.2f} ms  ({len(samples):,} reads, {failed} failed; the writers "
                f"appended {appended / seconds:,.0f} events/s meanwhile)",
                flush=True,
            )
        log.close()


def _wal_pages(path: Path, commit: Any, n: int) -> float:
    """WAL pages per commit of `commit(i)` on the SQLite file `path`, over `n` commits: the WAL is
    emptied first, and `n` is small enough that no automatic checkpoint (at 1,000 pages) runs between."""
    counter = sqlite3.connect(path, isolation_level=None)
    try:
        counter.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for i in range(n):
            commit(i)
        # (busy, pages in the WAL, pages checkpointed); a PASSIVE checkpoint leaves the WAL as it is.
        return int(counter.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]) / n
    finally:
        counter.close()


def bench_wal_pages(machine: govern.Machine) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = govern.EventLog(f"sqlite:///{tmp}/events.db", name="main", machine=machine)
        events = events_for(machine, 1100, 50, "pages")
        for e in events[:1000]:  # a log past its first pages, whose B-trees have grown a level
            log.append(e)
        appended = _wal_pages(Path(tmp) / "events.db", lambda i: log.append(events[1000 + i]), 100)
        log.close()
        floor = sqlite3.connect(Path(tmp) / "floor.db", isolation_level=None)
        floor.execute("PRAGMA journal_mode=WAL")
        floor.execute("PRAGMA synchronous=FULL")
        floor.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")

        def bare(i: int) -> None:
            floor.execute("BEGIN IMMEDIATE")
            floor.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * 64))
            floor.execute("COMMIT")

        for i in range(1000):
            bare(i)
        bare_pages = _wal_pages(Path(tmp) / "floor.db", lambda i: bare(1000 + i), 100)
        floor.close()
    print(
        f"SQLite WAL pages per commit: {appended:.2f} for a one-event append, {bare_pages:.2f} for the bare "
        "one-row commit",
        flush=True,
    )


def bench_late_arrival(machine: govern.Machine, sizes: list[int]) -> None:
    for n in sizes:
        log = govern.EventLog("memory://")
        log.bind(machine)
        log.append_many(events_for(machine, n, 1, f"late{n}"))
        stored = log.read()
        replica = govern.Replica(machine, log)
        t = time.perf_counter()
        for e in stored[1:]:
            replica.deliver([e])
        waiting = replica.pending
        replica.deliver([stored[0]])
        late = time.perf_counter() - t
        assert waiting == n - 1 and replica.pending == 0 and replica.position == n
        in_order = govern.Replica(machine, log)
        t = time.perf_counter()
        for e in stored:
            in_order.deliver([e])
        ordered = time.perf_counter() - t
        assert in_order.digest() == replica.digest()
        print(
            f"late arrival, {n:>6,} events of one record: first event last {late:8.3f} s   "
            f"in log order {ordered:8.3f} s",
            flush=True,
        )


def bench_append_far(machine: govern.Machine, latency_ms: float, single: int, batched: int) -> None:
    """`bench_append` on PostgreSQL through a `DelayingProxy` of `latency_ms` each way, with the round trip
    it adds measured beside."""
    proxy, url = proxied(POSTGRES_URL, latency_ms)
    try:
        label = f"PostgreSQL, {latency_ms:g} ms each way (round trip {round_trip_ms(url):.2f} ms)"
        bench_append(machine, url, label, single, batched)
    finally:
        proxy.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    parser.add_argument("--skip-postgres", action="store_true", help="do not try the PostgreSQL server")
    add_latency_option(parser, "append to PostgreSQL")
    args = parser.parse_args()
    machine = counter_machine()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    single, batched = (100, 1000) if args.quick else (1000, 20_000)
    with tempfile.TemporaryDirectory() as tmp:
        bench_append(machine, str(Path(tmp) / "events.db"), "SQLite", single, batched)
    bench_wal_pages(machine)
    if not args.skip_postgres:
        try:
            bench_append(machine, POSTGRES_URL, "PostgreSQL", single, batched)
            if args.latency_ms > 0:
                bench_append_far(machine, args.latency_ms, single // 4, batched // 10)
        except govern.EventLogError as exc:
            print(f"append PostgreSQL: skipped, server not reachable ({str(exc).splitlines()[0][:100]})")
    bench_reads_under_writers(machine, 2.0 if args.quick else 8.0)
    bench_late_arrival(machine, [1000, 4000] if args.quick else [1000, 4000, 16_000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
