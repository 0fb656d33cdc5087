"""Every benchmark script still runs (in its small smoke mode) and prints its figures.

This checks that the scripts work, not how fast anything is: speed is read from the scripts' output by
people, never asserted by a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

SMOKE_RUNS = {
    "bide_runs.py": ["--quick"],
    "governed.py": ["--quick"],
    "eventlog.py": ["--quick"],
    "audit.py": [
        *("--leaves", "2000", "--sql-leaves", "1000", "--samples", "100", "--appends", "20"),
        *("--pymerkle-sizes", "2000", "--gates", "20"),  # pymerkle: only where it is installed
    ],
    "govern_build.py": ["--quick"],
    "oracle.py": [],
    "symbolic.py": ["--repeat", "1"],
    "worker.py": ["--quick"],
    "compose.py": ["--copies", "3,10", "--repeat", "1"],
    "parallel_calls.py": ["--seconds", "0.05"],
    "streaming.py": ["--quick"],
}


@pytest.mark.parametrize("script", sorted(SMOKE_RUNS))
def test_benchmark_script_runs(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *SMOKE_RUNS[script]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.strip().splitlines()) >= 3, proc.stdout


def test_every_benchmark_has_a_smoke_run_or_is_listed() -> None:
    # certificate.py builds and checks the chain(20) certificate (about 15 s); tests/certify covers its code.
    # Modules named _*.py are helpers the scripts import (make bench skips them too).
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts - set(SMOKE_RUNS) == {"certificate.py"}


@pytest.mark.slow
def test_crash_benchmark_runs_and_bide_fires_at_most_once(tmp_path: Path) -> None:
    """The crash comparison in smoke mode. Whatever peers are installed, bide's rows are measured for real:
    killed in the window after a side effect, the run halts (no reconciler) or completes through the
    reconciler, and no effect ever fired twice; killed before the effect, the halt is one that never
    started. A peer's row is either measured (its processes really died, its effects really fired) or
    reported as not installed."""
    out = tmp_path / "crash.json"
    schedules = ["after:charge", "before:charge", "random"]
    trials = 1  # per schedule and framework: every process start costs a second or more
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "crash" / "run.py"),
            *("--trials", str(trials), "--overhead-runs", "3", "--quick"),
            *("--schedules", ",".join(schedules), "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]

    plain = rows["bide"]
    window, before = plain["per_schedule"]["after:charge"], plain["per_schedule"]["before:charge"]
    assert window["killed"] == window["halts"] == trials and window["max_fired"] == 1
    assert window["halts_never_started"] == 0 and window["completed"] == 0
    assert before["killed"] == before["halts"] == before["halts_never_started"] == trials
    assert before["max_fired"] == 0
    assert plain["max_fired"] <= 1 and plain["fired_twice"] == 0 and plain["missed"] == 0
    assert plain["human_resolutions"] == plain["halts"] and plain["overhead_ms"] > 0

    reconciled = rows["bide+reconciler"]
    assert reconciled["completed"] == reconciled["trials"] == trials * len(schedules)
    assert reconciled["max_fired"] == 1 and reconciled["halts"] == reconciled["human_resolutions"] == 0
    assert reconciled["missed"] == 0

    for peer in ("dbos", "langgraph"):
        if peer in result["not_installed"]:
            assert peer not in rows
            continue
        measured = rows[peer]["per_schedule"]["after:charge"]
        assert measured["killed"] == trials and measured["max_fired"] >= 1, rows[peer]
    table = proc.stdout[proc.stdout.index("Crash table") :]
    assert "bide (SQLite), no reconciler" in table and "bide (SQLite), reconciler" in table
    assert table.count("not installed") == len(result["not_installed"])
