"""Build time per phase and peak memory of `govern` machines (a benchmark, not a test).

    python benchmarks/govern_build.py            # chain/horn 16 and 20, the orders machine and a variant
    python benchmarks/govern_build.py --big      # also chain(24): 16.8 M states, ~9.5 GiB peak, minutes

Every machine is built in a fresh subprocess so its peak RSS is its own. The engine's time (tables
and verification) and the oracle's time (the proof-derived checker re-checking every build) are
printed separately; for the small machines the best of three runs is shown. Targets from issue 2:
chain(20) engine under 0.5 s, horn(20) under 0.3 s, chain(24) builds on a 24 GiB machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from govern import Registry


def chain(n: int) -> Registry:
    """n flags; invariant c_i: f_i implies f_(i+1), repaired by setting f_(i+1); events set_i."""
    r = Registry(f"chain{n}")
    f = [r.bool(f"f{i}") for i in range(n)]
    for i in range(n - 1):
        r.invariant(f"c{i}", holds=~f[i] | f[i + 1], repair={f[i + 1]: True})
    for i in range(n):
        r.event(f"set{i}", effect={f[i]: True})
    return r


def horn(n: int) -> Registry:
    """n flags; invariants f_2i implies f_(2i+1); events set_i; all pairs."""
    r = Registry(f"horn{n}")
    f = [r.bool(f"f{i}") for i in range(n)]
    for i in range(n // 2):
        r.invariant(f"h{i}", holds=~f[2 * i] | f[2 * i + 1], repair={f[2 * i + 1]: True})
    for i in range(n):
        r.event(f"set{i}", effect={f[i]: True})
    return r


def orders(variant: bool = False) -> Registry:
    """The orders machine of issue 2; the variant adds cancellation and checks the reachable domain."""
    r = Registry("orders-variant" if variant else "orders")
    status = r.enum("status", ["pending", "paid", "shipped", "cancelled"])
    paid = r.bool("paid")
    stock = r.int("stock", 0, 5)
    r.invariant("no_ship_unpaid", holds=(status != "shipped") | paid, repair={status: "pending"})
    if variant:
        r.invariant("cancelled_refunded", holds=(status != "cancelled") | ~paid, repair={paid: False})
    r.event("pay", guard=status == "pending", effect={status: "paid", paid: True})
    r.event("ship", guard=(status == "paid") & (stock > 0), effect={status: "shipped", stock: stock - 1})
    r.event("restock", guard=stock < 5, effect={stock: stock + 1})
    r.independent("pay", "restock")
    if variant:
        r.event("cancel", guard=status.isin(["pending", "paid"]), effect={status: "cancelled"})
        r.independent("cancel", "restock")
    return r


MACHINES = {
    "chain16": lambda: chain(16),
    "chain20": lambda: chain(20),
    "horn16": lambda: horn(16),
    "horn20": lambda: horn(20),
    "orders": lambda: orders(),
    "orders-variant": lambda: orders(True),
    "chain24": lambda: chain(24),
}


def _child(name: str) -> None:
    reg = MACHINES[name]()
    domain = "reachable" if name == "orders-variant" else "valid"
    start = time.perf_counter()
    machine = reg.build(domain)  # type: ignore[arg-type]
    wall = time.perf_counter() - start
    t = machine.report.timings
    out = {
        "name": name,
        "states": machine.n_states,
        "events": len(machine.events),
        "pairs": len(machine.report.pairs_checked),
        "pruned": len(machine.report.pairs_pruned),
        "wall": wall,
        "oracle": t.get("oracle", 0.0),
        "phases": t,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if name.startswith("orders"):
        out["report"] = machine.report.text(witnesses=False)
    print(json.dumps(out))


def _run(name: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", name], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr}")
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="also build chain(24) (16.8 M states)")
    parser.add_argument("--quick", action="store_true", help="only the small machines (a smoke run)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    names = [n for n in MACHINES if args.big or n != "chain24"]
    if args.quick:
        names = [n for n in names if not n.endswith(("20", "24"))]
    print(
        f"{'machine':16} {'states':>11} {'ev':>3} {'pairs':>5} {'pruned':>6} {'engine s':>9} "
        f"{'oracle s':>9} {'total s':>8} {'peak MiB':>9}"
    )
    reports = []
    for name in names:
        runs = [_run(name) for _ in range(1 if name == "chain24" else 3)]
        best = min(runs, key=lambda r: float(r["wall"]) - float(r["oracle"]))  # type: ignore[arg-type]
        wall, oracle = float(best["wall"]), float(best["oracle"])  # type: ignore[arg-type]
        print(
            f"{name:16} {best['states']:>11,} {best['events']:>3} {best['pairs']:>5} {best['pruned']:>6} "
            f"{wall - oracle:>9.3f} {oracle:>9.3f} {wall:>8.3f} {float(best['peak_mib']):>9.0f}"
        )  # type: ignore[arg-type]
        phases = best["phases"]
        assert isinstance(phases, dict)
        print("    phases: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in phases.items()))
        if "report" in best:
            reports.append(str(best["report"]))
    for text in reports:
        print()
        print(text)


if __name__ == "__main__":
    main()
