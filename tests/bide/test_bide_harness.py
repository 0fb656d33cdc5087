"""The crash-point harness: bide never fires twice; a mislabelled tool does (the harness is not vacuous)."""

from __future__ import annotations

from pathlib import Path

import bide
from bide.testing import BideCrashSystem, ScheduleResult, run_crash_schedules


def test_every_single_crash_point_and_random_schedules() -> None:
    system = BideCrashSystem()
    report = run_crash_schedules(system, random_schedules=150, seed=7)
    points = system.writes() + 2
    assert len(report.results) == points + 150
    assert report.max_fired == 1 and report.missed == 0 and report.ok
    for r in report.results:
        assert r.completed or r.halted, r
        if r.completed:
            assert r.fired == 1
    singles = {r.schedule[0]: r for r in report.results[:points]}
    # A clean run makes 3 writes: header+start+first model turn+attempt marker, result, final turn+end.
    # Crash points 2 (marker committed, reply lost), 3 (inside the call, after the effect) and 4 (before
    # the result is sent) are the window; only they halt, and only 2 halts without the effect.
    assert system.writes() == 3 * 3
    assert sorted(k for k, r in singles.items() if r.halted) == [2, 3, 4]
    assert singles[2].false_halt and not singles[3].false_halt and not singles[4].false_halt
    assert report.false_halts == sum(r.false_halt for r in report.results) > 0
    assert "max_fired=1" in report.summary()


def test_reconciler_closes_the_window() -> None:
    report = run_crash_schedules(BideCrashSystem(reconcile=True), random_schedules=100, seed=3)
    assert report.ok and report.max_fired == 1
    assert report.halts == 0 and report.completed == len(report.results)


def test_mislabelled_side_effect_double_fires() -> None:
    report = run_crash_schedules(BideCrashSystem(safety=bide.Idempotent), random_schedules=50, seed=1)
    assert report.max_fired >= 2 and not report.ok


def test_report_flags() -> None:
    r = ScheduleResult((1,), steps=2, fired=0, completed=False, halted=True)
    assert r.false_halt and not r.missed
    assert ScheduleResult((1,), 1, 0, True, False).missed


def test_sqlite_several_drivers_and_a_clock_that_goes_both_ways(tmp_path: Path) -> None:
    """Two drivers per restart on one SQLite store; restarts come an hour later, a little earlier (the
    clock went back), or a little later while the crashed driver's lease still runs: never two fires, and
    every schedule ends completed or halted."""
    system = BideCrashSystem(
        store_url=f"sqlite:///{tmp_path / 'crash.db'}", drivers=2, clock_steps=(0.5, -2.0, 3600.0, 1.0)
    )
    try:
        report = run_crash_schedules(system, random_schedules=40, seed=11)
    finally:
        system.close()
    assert report.ok and report.max_fired == 1, report.summary()
    for r in report.results:
        assert r.completed or r.halted, r
    assert "drivers=2" in report.system and "store=sqlite" in report.system


def test_several_drivers_with_a_mislabelled_tool_still_double_fire() -> None:
    system = BideCrashSystem(safety=bide.Idempotent, drivers=3, clock_steps=(3600.0, -1.0))
    report = run_crash_schedules(system, random_schedules=40, seed=5)
    assert report.max_fired >= 2 and not report.ok
