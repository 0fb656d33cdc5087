"""Composition: build and certify machines of many independent copies of a 32-state booking machine.

    python benchmarks/compose.py [--copies 10,40] [--repeat 3]

Each copy has a stage (free/held/booked/closed as 0..3), a paid flag and a seat count 0..3 (32 states),
five events and one invariant with a repair; k copies have 32^k states (10 copies: 1.1e15; 40 copies:
1.5e60), far beyond enumeration (about 2^25 states). The build splits the machine into its k components
(networkx), verifies each with the engine and the proof-derived oracle, and has the extracted
decomposition checker confirm the split; certifying writes one table set per component and re-checks
the whole certificate exactly as `govern check` does.

Prints, per size: the states, the build time, the certify time (make + offline re-check), each as wall
and CPU time (CPU time is less disturbed by other load on the machine), a replay of 10,000 events, and
the peak Python heap (tracemalloc) and the process's peak RSS (getrusage). Asserts nothing (speed is
measured here, never in tests); each time is the median of --repeat runs.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
import tracemalloc

import govern
from govern import Registry, implies


def booking(copies: int, name: str = "bookings") -> Registry:
    """`copies` independent 32-state booking records in one registry (every pair of events commutes)."""
    reg = Registry(name)
    for i in range(copies):
        stage = reg.int(f"stage{i}", 0, 3)  # 0 free, 1 held, 2 booked, 3 closed
        paid = reg.bool(f"paid{i}")
        seats = reg.int(f"seats{i}", 0, 3)
        reg.invariant(f"booked_paid{i}", holds=implies(stage >= 2, paid), repair={paid: True})
        reg.event(f"hold{i}", effect={stage: govern.max_(stage, 1)})
        reg.event(f"book{i}", effect={stage: govern.max_(stage, 2)})
        reg.event(f"close{i}", effect={stage: 3})
        reg.event(f"pay{i}", effect={paid: True})
        reg.event(f"seat{i}", effect={seats: govern.min_(seats + 1, 3)})
    return reg


def measure(copies: int, repeat: int) -> None:
    builds, certs, build_cpu, cert_cpu = [], [], [], []
    machine = None
    tracemalloc.start()
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        machine = booking(copies).build()
        t1, c1 = time.perf_counter(), time.process_time()
        certificate = govern.certify(machine)
        t2, c2 = time.perf_counter(), time.process_time()
        builds.append(t1 - t0)
        certs.append(t2 - t1)
        build_cpu.append(c1 - c0)
        cert_cpu.append(c2 - c1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert machine is not None
    events = [e for e in machine.events]
    stream = [events[(i * 7919) % len(events)] for i in range(10_000)]
    t0 = time.perf_counter()
    final = machine.replay(stream)
    t1 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{copies:>3} copies: {machine.n_states:.3e} states, {len(machine.components)} components, "
        f"{len(events)} events | build {statistics.median(builds):.3f} s (CPU "
        f"{statistics.median(build_cpu):.3f} s) | certify (make + check) {statistics.median(certs):.3f} s "
        f"(CPU {statistics.median(cert_cpu):.3f} s) | "
        f"certificate {len(certificate.to_bytes()) / 1024:.0f} KiB | "
        f"replay 10k events {1000 * (t1 - t0):.1f} ms | peak heap {peak / 2**20:.1f} MiB | "
        f"peak RSS {rss:.0f} MiB"
    )
    del final


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", default="10,40")
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args()
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().split()[0]}")
    for copies in (int(x) for x in ns.copies.split(",")):
        measure(copies, ns.repeat)


if __name__ == "__main__":
    main()
