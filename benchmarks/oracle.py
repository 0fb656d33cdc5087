"""Re-check time and peak memory of the extracted oracle (govern.oracle.check_tables) on chain(n), horn(n).

chain(n): n bool flags; invariants f_i -> f_(i+1) repaired by setting f_(i+1); events set_i; all pairs.
horn(n): n bool flags; invariants f_(2i) -> f_(2i+1) repaired by setting f_(2i+1); events set_i; all pairs.
The tables are built here with plain numpy (state id = sum of f_i << i, as docs/semantics.md numbers them),
then handed to the oracle exactly as the engine hands them (int32 tables, every pair checked), once
without and once with the witness a build hands it (normal forms and repair depths, which the oracle
checks instead of iterating repair itself).  Prints best-of-3 wall and CPU time (CPU time is the
steadier figure on a loaded machine; it exceeds wall time when the oracle's two threads overlap) and
the peak RSS of the process.

Also times the rules checker (govern.oracle.check_rules) tying the same tables to the machine's rules.

Usage: python3 benchmarks/oracle.py [n ...]   (default: 16 20)
"""

from __future__ import annotations

import resource
import sys
import time

import numpy as np
import numpy.typing as npt

from govern.oracle import ORACLE_IDENTITY, check_rules, check_tables

Tables = tuple[npt.NDArray[np.bool_], npt.NDArray[np.int32], npt.NDArray[np.int32]]


def _tables(n: int, implications: list[tuple[int, int]]) -> Tables:
    ids = np.arange(1 << n, dtype=np.int64)
    bit = [((ids >> i) & 1).astype(np.bool_) for i in range(n)]
    valid = np.ones(1 << n, dtype=np.bool_)
    repair = ids.copy()
    done = np.zeros(1 << n, dtype=np.bool_)
    for a, b in implications:  # declaration order: the first violated invariant repairs
        viol = bit[a] & ~bit[b]
        valid &= ~viol
        fire = viol & ~done
        repair[fire] = ids[fire] | (1 << b)
        done |= viol
    apply = np.stack([ids | (1 << i) for i in range(n)])
    return valid, repair.astype(np.int32), apply.astype(np.int32)


def witness(valid: npt.NDArray[np.bool_], repair: npt.NDArray[np.int32]) -> tuple[
        npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """The normal form and the number of repair steps of every state (what the engine hands the oracle
    in a build), by iterating repair until every state is valid."""
    nf = repair.copy()
    depth = (~valid).astype(np.int32)
    while not valid[nf].all():
        moving = ~valid[nf]
        nf = np.where(moving, repair[nf], nf)
        depth += moving
    return nf, depth


def chain_pairs(n: int) -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(n - 1)]


def horn_pairs(n: int) -> list[tuple[int, int]]:
    return [(2 * i, 2 * i + 1) for i in range(n // 2)]


def chain(n: int) -> Tables:
    return _tables(n, chain_pairs(n))


def horn(n: int) -> Tables:
    return _tables(n, horn_pairs(n))


def rules(name: str, n: int, implications: list[tuple[int, int]]) -> dict[str, object]:
    """The machine JSON (docs/semantics.md) of the same machine, for the rules checker."""
    return {
        "name": name,
        "variables": [{"name": f"f{i}", "kind": "bool"} for i in range(n)],
        "initial": [0] * n,
        "invariants": [{"name": f"c{a}", "holds": ["or", ["not", ["var", a]], ["var", b]],
                        "repair": [[b, ["lit", 1]]]} for a, b in implications],
        "events": [{"name": f"set{i}", "guard": ["lit", 1], "effect": [[i, ["lit", 1]]]} for i in range(n)],
        "independent": None,
        "domain": "valid",
    }


def bench(name: str, tables: Tables, machine: dict[str, object]) -> None:
    valid, repair, apply = tables
    nf, depth = witness(valid, repair)
    times = {}
    verdict = None
    for label, extra in (("recheck", {}), ("with witness", {"nf": nf, "depth": depth})):
        best = cpu = float("inf")
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            verdict = check_tables(valid=valid, repair=repair, apply=apply, pairs=None, domain="valid",
                                   initial=0, **extra)
            best = min(best, time.perf_counter() - t0)
            cpu = min(cpu, time.process_time() - c0)
        times[label] = (best, cpu)
    assert verdict is not None
    e = apply.shape[0]
    print(
        f"{name:10s} states={valid.shape[0]:>9,d} events={e:>3d} pairs={e * (e - 1) // 2:>4d} "
        f"valid={int(valid.sum()):>7,d} certified={verdict.certified} cc2={verdict.cc2} "
        f"depth={verdict.max_depth:>3d} "
        + " ".join(f"{label}={wall:.3f}s (cpu {cpu:.3f}s)" for label, (wall, cpu) in times.items())
    )
    t0, c0 = time.perf_counter(), time.process_time()
    match = check_rules(rules=machine, valid=valid, repair=repair, apply=apply)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{'':10s} rules checker: tables are the rules' = {match.matches} in {took:.3f}s (cpu {cpu:.3f}s)")


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [16, 20]
    ident = ORACLE_IDENTITY
    print(f"oracle generated_sha256={ident.generated_sha256[:16]} coq={ident.coq_version}")
    for n in sizes:
        bench(f"chain({n})", chain(n), rules(f"chain{n}", n, chain_pairs(n)))
        bench(f"horn({n})", horn(n), rules(f"horn{n}", n, horn_pairs(n)))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS {peak_kib / 1024:.0f} MiB (includes the tables themselves)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
