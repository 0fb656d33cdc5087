"""Real crash evidence: an agent process is killed with SIGKILL at many points and restarted.

The side effect appends a line to a file. Whatever the kill point, the file never gets two lines; the
restarted run completes, or halts with OutcomeUnknown exactly when the kill landed between the attempt
marker and the journaled result. A halted run is then resolved through the `bide` CLI and completes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from child_harness import effect_lines, finish, kill_at_point, release_barrier, spawn

CHILD = Path(__file__).with_name("sigkill_child.py")
# kill point -> (halts on restart?, lines in the effect file after the kill)
POINTS = {
    "before_marker": (False, 0),
    "before_call": (True, 0),  # marker committed, tool not yet called: the documented price of safety
    "inside_call": (True, 1),
    "after_call": (True, 1),  # effect fired, result not journaled: the dangerous window
    "after_result": (False, 1),
    "before_answer": (False, 1),
    "after_end": (False, 1),
}


def lines(path: Path) -> int:
    return len(effect_lines(path))


def run_child(url: str, effect: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return spawn(CHILD, url, "run-1", str(effect), env=env)


def outcome_of(proc: subprocess.Popen[str]) -> dict[str, object]:
    return finish(proc, timeout=60)[0]


def bide_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bide._cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
@pytest.mark.parametrize("point", list(POINTS))
def test_sigkill_at_point(point: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    effect = tmp_path / "effect.txt"
    signal_file = tmp_path / "signal"
    kill_at_point(CHILD, url, "run-1", str(effect), point=point, signal_file=signal_file)
    halts, fired = POINTS[point]
    assert lines(effect) == fired

    outcome = outcome_of(run_child(url, effect))
    # The restart never fires an effect that fired already; it fires it once if it never fired.
    assert lines(effect) == (fired if halts else 1)
    if not halts:
        assert outcome == {"outcome": "completed", "answer": "done"}
        assert lines(effect) == 1
        return
    assert outcome["outcome"] == "halted"
    assert outcome["call_id"] == "c0.0" and outcome["tool"] == "append_line"
    assert outcome["arguments"] == {"text": "charged alice 500"}
    shown = bide_cli("show", "--store", url, "run-1", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run"]["status"] == "halted"

    # Resolve from the system of record (the file), through the CLI, once the call's deadline passed.
    what = ["--succeeded", '"appended"'] if lines(effect) == 1 else ["--not-started"]
    for _ in range(100):
        res = bide_cli("resolve", "--store", url, "run-1", "c0.0", *what, "--clock-skew", "0.1")
        if res.returncode != 7:  # not yet: the call's deadline plus the skew has not passed
            break
        assert "may still be running" in res.stderr
        time.sleep(0.1)
    assert res.returncode == 0, res.stderr
    assert outcome_of(run_child(url, effect)) == {"outcome": "completed", "answer": "done"}
    assert lines(effect) == 1


@pytest.mark.slow
def test_processes_racing_on_one_run_fire_once(durable_store_spec: tuple[str, str], tmp_path: Path) -> None:
    """Five processes drive the same run at the same moment: the effect file gets exactly one line, and every
    process finishes with the answer: the four that find the run's lease held wait for it (lease_wait) and
    read the answer its holder journaled, instead of halting."""
    url, prefix = durable_store_spec
    effect = tmp_path / "effect.txt"
    go = tmp_path / "go"
    env = {"BIDE_TEST_PREFIX": prefix, "BIDE_TEST_GO": str(go)}
    procs = [run_child(url, effect, env) for _ in range(5)]
    release_barrier(go, len(procs))
    outcomes = [outcome_of(p) for p in procs]
    assert lines(effect) == 1
    assert outcomes == [{"outcome": "completed", "answer": "done"}] * len(procs)
    again = outcome_of(run_child(url, effect, {"BIDE_TEST_PREFIX": prefix}))
    assert again == {"outcome": "completed", "answer": "done"} and lines(effect) == 1
