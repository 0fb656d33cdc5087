"""Time and peak memory to decide machines with one integer of 10^9 values (issue 18), symbolically.

    python benchmarks/symbolic.py [--repeat 3] [--corpus | --corpus-only]

Two machines over `limit` in 0 .. 10^9 - 1 with the invariant `limit >= 10` (repair: limit = 10):

- "commuting": three events (raise to at least 1k, raise to at least 1M, cap at 900M); it converges,
  so every query but the few counterexample searches is an unsatisfiable CP-SAT answer.
- "non-commuting": the same plus `add_300m` (guarded so it stays in range), which does not commute
  with the cap: the build raises NotConvergent and the counterexample is printed.

With `--corpus` (about 40 s of deciding, a process per machine): the small-but-nasty machines of
tests/govern/symbolic_corpus.py (nested min/max/if, guards with comparisons, cascading repairs, two
and three integer variables, commuting and non-commuting pairs), each at 10^9 and 10^12 values per
variable, on the "valid" and "reachable" domains: the time to decide (`verify_symbolic`, the route
itself: three variables of 10^9 values have no 64-bit state ids, so no machine object is built),
the CP-SAT queries, the verdict, and the process's peak resident memory.

Enumeration cannot build either (10^9 states x 3 events of tables is beyond int32 ids' memory budget
here); the symbolic route decides them. Each case runs in a fresh subprocess, so its peak resident
memory (ru_maxrss) is its own; the figure after imports is printed too. Time is the median of
`--repeat` runs (wall clock; the load average is printed, since the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def _machine(non_commuting: bool) -> object:
    _corpus_on_path()
    from symbolic_corpus import limits  # type: ignore[import-not-found]

    return limits(non_commuting)


def _corpus_on_path() -> None:
    """The machines are the test corpus's (tests/govern/symbolic_corpus.py), so both decide the same."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "govern"))


def _child(case: str) -> None:
    from govern import NotConvergent

    reg = _machine(case == "non-commuting")
    out: dict[str, object] = {}
    t0 = time.perf_counter()
    from ortools.sat.python import cp_model  # noqa: F401  (its import is timed apart from deciding)

    out["import_seconds"] = time.perf_counter() - t0
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    try:
        m = reg.build()  # type: ignore[attr-defined]
        out["seconds"] = time.perf_counter() - start
        out["verdict"] = "converges"
        out["report"] = m.report.text(witnesses=False)
        out["queries"] = m.report.solver["queries"]
        s = m.replay(["floor_1k", "cap_900m", "floor_1m"] * 1000)
        out["replay"] = dict(s)
        out["replay_seconds"] = time.perf_counter() - start - float(out["seconds"])  # type: ignore[arg-type]
        from govern import certify, check_certificate

        t1 = time.perf_counter()
        certificate = certify(m)  # builds the symbolic certificate and re-checks it once
        out["certify_seconds"] = time.perf_counter() - t1
        data = certificate.to_bytes()
        t2 = time.perf_counter()
        result = check_certificate(data)
        out["check_seconds"] = time.perf_counter() - t2
        out["certificate_bytes"] = len(data)
        out["statement"] = result.statement()
    except NotConvergent as exc:
        out["seconds"] = time.perf_counter() - start
        out["verdict"] = "NotConvergent"
        out["counterexample"] = str(exc)
    out["rss_after_imports_kib"] = base
    out["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out))


def _corpus_child(name: str) -> None:
    """Decide one corpus machine at each scale and domain; one JSON line per case."""
    _corpus_on_path()
    from ortools.sat.python import cp_model  # noqa: F401  (imported before timing)
    from symbolic_corpus import CORPUS  # type: ignore[import-not-found]

    from govern import DomainViolation, NotConvergent, StateSpaceTooLarge
    from govern.verify._symbolic import verify_symbolic
    from govern.verify._timing import PhaseTimer

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for n in (10**9, 10**12):
        for domain in ("valid", "reachable"):
            snap = CORPUS[name](n).snapshot()
            cpu, start = time.process_time(), time.perf_counter()
            try:
                v = verify_symbolic(snap, domain, PhaseTimer())
                verdict = (
                    f"converges, depth {v.depth_max}, CC2 {'holds' if v.cc2 else 'fails'}, "
                    f"{len(v.obligations)} obligations, {len(v.not_idempotent)} not idempotent; "
                    f"{v.queries} queries"
                )
            except NotConvergent as exc:
                cx = exc.counterexample
                verdict = (
                    f"NotConvergent: {getattr(cx, 'condition', 'repair cycle')} {getattr(cx, 'events', '')}"
                )
            except (DomainViolation, StateSpaceTooLarge) as exc:
                verdict = f"{type(exc).__name__}: {str(exc)[:100]}"
            out = {
                "n": n,
                "domain": domain,
                "seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu,
                "verdict": verdict,
                "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "rss_before_kib": base,
            }
            print(json.dumps(out), flush=True)


def _corpus() -> None:
    _corpus_on_path()
    from symbolic_corpus import CORPUS

    print("\n== corpus (tests/govern/symbolic_corpus.py), decided by verify_symbolic; one fresh process")
    print("   per machine, so 'peak MiB' is that process's peak so far (after imports: the last column)")
    print(
        f"   {'machine':<22} {'n':>6} {'domain':<9} {'wall s':>7} {'cpu s':>6} {'peak MiB':>8} "
        f"{'(imports)':>9}  verdict"
    )
    total = 0.0
    for name in CORPUS:
        proc = subprocess.run(
            [sys.executable, __file__, "--corpus-child", name], capture_output=True, text=True, check=True
        )
        for line in proc.stdout.strip().splitlines():
            r = json.loads(line)
            total += r["seconds"]
            print(
                f"   {name:<22} {'1e' + str(len(str(r['n'])) - 1):>6} {r['domain']:<9} {r['seconds']:>7.3f} "
                f"{r['cpu_seconds']:>6.3f} {r['peak_rss_kib'] / 1024:>8.0f} "
                f"{r['rss_before_kib'] / 1024:>9.0f}  {r['verdict']}"
            )
    print(f"   total wall time to decide the corpus: {total:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", choices=["commuting", "non-commuting"])
    ap.add_argument("--corpus-child", metavar="NAME")
    ap.add_argument("--corpus", action="store_true", help="also decide the corpus (about 40 s)")
    ap.add_argument("--corpus-only", action="store_true")
    args = ap.parse_args()
    if args.child:
        _child(args.child)
        return
    if args.corpus_child:
        _corpus_child(args.corpus_child)
        return
    print(f"load average: {os.getloadavg()}")
    if args.corpus or args.corpus_only:
        _corpus()
    if args.corpus_only:
        print(f"\nload average: {os.getloadavg()}")
        return
    for case in ("commuting", "non-commuting"):
        runs = []
        for _ in range(args.repeat):
            proc = subprocess.run(
                [sys.executable, __file__, "--child", case], capture_output=True, text=True, check=True
            )
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        secs = statistics.median(r["seconds"] for r in runs)
        peak = max(r["peak_rss_kib"] for r in runs) / 1024
        base = max(r["rss_after_imports_kib"] for r in runs) / 1024
        print(f"\n== {case}: one integer of 10^9 values, {3 + (case == 'non-commuting')} events")
        each = ", ".join(f"{r['seconds']:.3f}" for r in runs)
        print(
            f"   decide: median {secs:.3f} s over {args.repeat} runs ({each}); "
            f"peak RSS {peak:.0f} MiB (after imports {base:.0f} MiB); "
            f"importing ortools took {statistics.median(r['import_seconds'] for r in runs):.3f} s more"
        )
        first = runs[0]
        if first["verdict"] == "converges":
            print(
                f"   CP-SAT queries: {first['queries']}; 3000 steps replayed by the table-free runtime in "
                f"{first['replay_seconds']:.3f} s -> {first['replay']}"
            )
            print(
                f"   symbolic certificate: {first['certificate_bytes']:,} bytes; certify (with its "
                f"self-check) {first['certify_seconds']:.3f} s; govern check {first['check_seconds']:.3f} s"
            )
            print("   check statement: " + str(first["statement"])[:160] + " ...")
            print("   " + "\n   ".join(str(first["report"]).splitlines()))
        else:
            print("   NotConvergent, counterexample (replayed through the concrete semantics):")
            print("   " + "\n   ".join(str(first["counterexample"]).splitlines()))
    print(f"\nload average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
