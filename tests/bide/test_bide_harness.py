"""The crash-point harness: bide never fires twice; a mislabelled tool does (the harness is not vacuous)."""

from __future__ import annotations

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
