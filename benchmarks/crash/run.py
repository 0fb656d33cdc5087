"""Crash benchmark: one workflow (a read, two side effects, an answer) in bide, DBOS and LangGraph, killed
with SIGKILL on the same schedule and recovered by each framework's own recovery.

    python benchmarks/crash/run.py [--trials 50] [--overhead-runs 150] [--jobs 2] [--json out.json]

The peers are an optional extra (`pip install -e '.[peers]'`); a peer that is not installed is reported as
"not installed". Every figure printed is measured in this run.

Schedules (each trial in a fresh state directory, its first process killed, then recovered):

- `after:charge`, `after:send_receipt`: SIGKILL in the window after the side effect fired (its ledger line
  appended and fsynced) and before the framework could record it;
- `before:charge`: SIGKILL just before the first side effect (a run that halts here fired nothing);
- `random`: SIGKILL at a random moment of the run (trial i dies at the same fraction of every framework's
  own clean run time, so all face the same schedule);
- `before:send_receipt` (only with `--schedules`): SIGKILL just before the second side effect.

Then the framework's own recovery runs once, in a new process: the run completes, halts or fails. Times
fired are counted in the effect ledger (outside every process). Rows: bide without a reconciler (a halt
waits for a human), bide with a reconciler that checks the ledger, DBOS on its SQLite system database,
LangGraph with SqliteSaver and durability="sync". Overhead is the median time of a clean workflow, run one
after another in one process, with the same fsynced effects; the machine's floor (a bare durable SQLite
commit, an fsynced append) is measured in the same run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WINDOW_SCHEDULES = ("after:charge", "after:send_receipt")
# bide's tool names for the ledger's effect names
BIDE_TOOLS = {"charge_card": "charge", "send_receipt": "send_receipt"}
CHILD_TIMEOUT = 180.0


@dataclass(frozen=True)
class Framework:
    """One row of the table: the workflow script that runs it, and what must be installed for it."""

    key: str
    label: str
    script: str
    args: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # modules that must import (the peers are optional)
    dist: str = ""  # distribution whose version is shown

    def installed(self) -> bool:
        try:
            return all(importlib.util.find_spec(m) is not None for m in self.needs)
        except (ImportError, ValueError):  # a parent package missing, or a module without a spec
            return False

    def title(self) -> str:
        if self.dist and self.installed():
            return self.label.format(version=importlib.metadata.version(self.dist))
        return self.label.format(version="").replace("  ", " ")


FRAMEWORKS = (
    Framework("bide", "bide (SQLite), no reconciler", "bide_flow.py"),
    Framework("bide+reconciler", "bide (SQLite), reconciler", "bide_flow.py", ("--reconcile",)),
    Framework("dbos", "DBOS {version} (SQLite)", "dbos_flow.py", needs=("dbos",), dist="dbos"),
    Framework(
        "langgraph",
        "LangGraph {version} (SqliteSaver, sync)",
        "langgraph_flow.py",
        needs=("langgraph", "langgraph.checkpoint.sqlite"),
        dist="langgraph",
    ),
)


@dataclass
class Trial:
    """One crash trial after recovery: times each effect fired, and how the run ended."""

    schedule: str
    fired: Counter[str]
    status: str  # completed | halted | failed
    killed: bool  # the first process really died of the SIGKILL
    halted_effect: str = ""
    error: str = ""


@dataclass
class Row:
    """A framework's measured figures: its clean-run overhead and every crash trial."""

    framework: Framework
    overhead_ms: float = 0.0
    window_s: float = 0.0
    trials: list[Trial] = field(default_factory=list)

    def of(self, schedule: str | None) -> list[Trial]:
        return [t for t in self.trials if schedule is None or t.schedule == schedule]

    def summary(self, schedule: str | None = None) -> dict[str, Any]:
        trials = self.of(schedule)
        halts = [t for t in trials if t.status == "halted"]
        failed = [t for t in trials if t.status == "failed"]
        return {
            "trials": len(trials),
            "killed": sum(t.killed for t in trials),
            "max_fired": max((n for t in trials for n in t.fired.values()), default=0),
            "fired_twice": sum(n >= 2 for t in trials for n in t.fired.values()),
            "completed": sum(t.status == "completed" for t in trials),
            "missed": sum(t.status == "completed" and set(t.fired) != set(common.EFFECTS) for t in trials),
            "halts": len(halts),
            "halts_never_started": sum(t.fired[t.halted_effect] == 0 for t in halts),
            "human_resolutions": len(halts) + len(failed),
            "failed": len(failed),
            "errors": sorted({t.error for t in failed})[:3],
        }


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def run_child(fw: Framework, state: Path, *extra: str) -> tuple[int, dict[str, Any] | None, str]:
    """Run one workflow process; return its exit code, its last JSON line (None if it printed none) and the
    end of its stderr."""
    cmd = [sys.executable, str(HERE / fw.script), "--state", str(state), *fw.args, *extra]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT, env=child_env())
    except subprocess.TimeoutExpired:
        return -1, None, f"timed out after {CHILD_TIMEOUT:.0f} s"
    out = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            out = json.loads(line)
            break
    return proc.returncode, out, proc.stderr.strip()[-400:]


def trial(fw: Framework, schedule: str, kill_after: float | None, root: Path, index: int) -> Trial:
    """One crash trial in a fresh state directory: the first process dies, then recovery."""
    state = root / f"{fw.key}-{schedule.replace(':', '-')}-{index}"
    state.mkdir()
    workflow = f"order-{index}"
    common.write_order(state, workflow)
    crash = ("--kill-after", f"{kill_after:.6f}") if kill_after is not None else ("--crash", schedule)
    code, out, err = run_child(fw, state, "--workflow", workflow, *crash)
    killed = code == -9
    if out is None and killed:  # the framework's own recovery, in a new process
        code, out, err = run_child(fw, state, "--workflow", workflow)
    if out is None:
        last = err.splitlines()[-1] if err else f"exit {code}"
        return Trial(schedule, common.fired(state, workflow), "failed", killed, error=last)
    if out["status"] not in ("completed", "halted"):
        return Trial(schedule, common.fired(state, workflow), "failed", killed, error=out.get("reason", ""))
    halted = BIDE_TOOLS.get(out.get("tool", ""), "") if out["status"] == "halted" else ""
    return Trial(schedule, common.fired(state, workflow), out["status"], killed, halted)


def clean_runs(fw: Framework, runs: int, root: Path, tag: str) -> dict[str, Any]:
    """`runs` clean workflows one after another in one fresh process: their durations (seconds), and for
    bide the journal's durable commits per workflow."""
    state = root / f"{fw.key}-bench-{tag}"
    state.mkdir()
    common.write_order(state, "bench")
    code, out, err = run_child(fw, state, "--bench", str(runs))
    if out is None:
        raise SystemExit(f"{fw.title()}: the overhead run failed (exit {code}): {err}")
    return out


def overheads(frameworks: list[Framework], runs: int, root: Path, rounds: int = 3) -> dict[str, float]:
    """Median ms per clean workflow for each framework. The frameworks take turns (`rounds` rounds of a
    fresh process each), so a change in the machine's load falls on all of them alike."""
    durations: dict[str, list[float]] = {fw.key: [] for fw in frameworks}
    for r in range(rounds):
        for fw in frameworks:
            out = clean_runs(fw, max(1, runs // rounds), root, str(r))
            durations[fw.key] += out["durations"]
            if r == 0 and "commits_per_workflow" in out:
                print(f"{fw.title()}: {out['commits_per_workflow']:g} durable journal commits per workflow")
    return {key: statistics.median(d) * 1e3 for key, d in durations.items()}


def window(fw: Framework, root: Path, runs: int) -> float:
    """How long a clean first run takes in a fresh process (the longest of `runs`): random kills land in
    it."""
    longest = 0.0
    for i in range(runs):
        state = root / f"{fw.key}-window-{i}"
        state.mkdir()
        common.write_order(state, "w")
        code, out, err = run_child(fw, state, "--workflow", "w")
        if out is None or out["status"] != "completed":
            raise SystemExit(f"{fw.title()}: a clean run failed (exit {code}): {err}")
        longest = max(longest, float(out["elapsed"]))
    return longest


def floor(root: Path, n: int = 200) -> tuple[float, float]:
    """ms per bare durable SQLite commit (WAL, synchronous=FULL) and per fsynced 100-byte append."""
    conn = sqlite3.connect(root / "floor.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
    t0 = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?, ?)", (i, b"x" * 300))
        conn.execute("COMMIT")
    commit = (time.perf_counter() - t0) / n * 1e3
    conn.close()
    fd = os.open(root / "floor.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    t0 = time.perf_counter()
    for _ in range(n):
        os.write(fd, b"x" * 100)
        os.fsync(fd)
    append = (time.perf_counter() - t0) / n * 1e3
    os.close(fd)
    return commit, append


def print_tables(rows: list[Row], missing: list[Framework], schedules: list[str], trials: int) -> None:
    print(f"\nPer schedule ({trials} trials each; fired = times a side effect ran, counted in the ledger;")
    print("  killed = the first process died of the SIGKILL, a random kill possibly after its work was done)")
    head = f"  {'framework':<36} {'schedule':<20} {'killed':>6} {'max fired':>9} {'fired 2x':>8} "
    print(head + f"{'completed':>9} {'halts (never started)':>22}")
    for row in rows:
        for schedule in schedules:
            s = row.summary(schedule)
            halts = f"{s['halts']} ({s['halts_never_started']})"
            print(
                f"  {row.framework.title():<36} {schedule:<20} {s['killed']:>6} {s['max_fired']:>9} "
                f"{s['fired_twice']:>8} {s['completed']:>9} {halts:>22}"
            )
    base = next((r.overhead_ms for r in rows if r.framework.key == "bide"), None)
    total = trials * len(schedules)
    print(f"\nCrash table: all schedules, {total} trials per framework")
    print(
        f"  {'framework':<36} {'max fired/call':>14} {'fired 2x':>8} {'completed':>10} "
        f"{'halts (never started)':>22} {'human resolutions':>17} {'overhead ms':>11} {'vs bide':>7}"
    )
    for row in rows:
        s = row.summary()
        ratio = f"{row.overhead_ms / base:.2f}x" if base else "-"
        print(
            f"  {row.framework.title():<36} {s['max_fired']:>14} {s['fired_twice']:>8} "
            f"{s['completed']:>4}/{s['trials']:<5} {s['halts']:>13} ({s['halts_never_started']:>3})     "
            f"{s['human_resolutions']:>17} {row.overhead_ms:>11.2f} {ratio:>7}"
        )
        if s["failed"] or s["missed"]:
            missed, errors = s["missed"], s["errors"]
            print(f"    ! failed runs {s['failed']}, completed with an effect missing {missed}: {errors}")
    for fw in missing:
        print(f"  {fw.title():<36} not installed (pip install -e '.[peers]')")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--trials", type=int, default=50, help="trials per framework per schedule")
    ap.add_argument("--overhead-runs", type=int, default=150, help="clean workflows timed per framework")
    ap.add_argument("--jobs", type=int, default=2, help="crash trials run at once (overhead runs alone)")
    ap.add_argument(
        "--schedules",
        default=",".join((*WINDOW_SCHEDULES, "before:charge", "random")),
        help=f"comma-separated, from {', '.join((*common.CRASH_POINTS, 'random'))}",
    )
    ap.add_argument("--frameworks", default=",".join(f.key for f in FRAMEWORKS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--quick", action="store_true", help="smoke mode: one overhead process and one calibration run each"
    )
    args = ap.parse_args()
    if args.trials < 1 or args.overhead_runs < 1 or args.jobs < 1:
        ap.error("--trials, --overhead-runs and --jobs must be at least 1")
    schedules = [s for s in args.schedules.split(",") if s]
    for s in schedules:
        if s not in (*common.CRASH_POINTS, "random"):
            ap.error(f"unknown schedule {s!r}")
    keys = [k for k in args.frameworks.split(",") if k]
    for k in keys:
        if k not in {f.key for f in FRAMEWORKS}:
            ap.error(f"unknown framework {k!r}; known: {', '.join(f.key for f in FRAMEWORKS)}")
    chosen = [f for f in FRAMEWORKS if f.key in keys]
    present = [f for f in chosen if f.installed()]
    missing = [f for f in chosen if not f.installed()]
    rng = random.Random(args.seed)
    fractions = [rng.random() for _ in range(args.trials)]  # the random schedule, shared by all

    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="crash-bench-") as tmp:
        root = Path(tmp)
        commit, append = floor(root)
        print(f"Machine floor: bare durable SQLite commit {commit:.2f} ms, fsynced append {append:.2f} ms")
        medians = overheads(present, args.overhead_runs, root, rounds=1 if args.quick else 3)
        rows = []
        for fw in present:
            row = Row(fw, medians[fw.key])
            if "random" in schedules:
                row.window_s = window(fw, root, runs=1 if args.quick else 3)
            first = f"; a first run in a fresh process takes up to {row.window_s * 1e3:.0f} ms"
            print(
                f"{fw.title()}: {row.overhead_ms:.2f} ms per clean workflow (median of {args.overhead_runs})"
                + (first if row.window_s else "")
            )
            t0 = time.perf_counter()
            jobs = []
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                for schedule in schedules:
                    for i in range(args.trials):
                        after = fractions[i] * row.window_s if schedule == "random" else None
                        jobs.append(pool.submit(trial, fw, schedule, after, root, i))
                row.trials = [j.result() for j in jobs]
            print(f"  {len(row.trials)} crash trials in {time.perf_counter() - t0:.0f} s")
            rows.append(row)
        print(f"load average after the run {os.getloadavg()[0]:.2f}")
    print_tables(rows, missing, schedules, args.trials)
    if args.json:
        result = {
            "floor_ms": {"sqlite_commit": commit, "fsynced_append": append},
            "rows": {
                r.framework.key: {
                    "label": r.framework.title(),
                    "overhead_ms": r.overhead_ms,
                    **r.summary(),
                    "per_schedule": {s: r.summary(s) for s in schedules},
                }
                for r in rows
            },
            "not_installed": [f.key for f in missing],
        }
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
