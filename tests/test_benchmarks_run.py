"""Every benchmark script still runs (in its small smoke mode) and prints its figures.

This checks that the scripts work, not how fast anything is: speed is read from the scripts' output by
people, never asserted by a test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

SMOKE_RUNS = {
    "bide_runs.py": ["--quick"],
    "governed.py": ["--quick"],
    "eventlog.py": ["--quick"],
    "audit.py": ["--leaves", "2000", "--sql-leaves", "1000", "--samples", "100", "--appends", "20"],
    "govern_build.py": ["--quick"],
    "oracle.py": [],
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
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts - set(SMOKE_RUNS) == {"certificate.py"}
