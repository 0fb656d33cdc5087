"""Real crash evidence for conversations and streaming: a child process is killed with SIGKILL in the middle
of a thread's second message, or in the middle of a stream, and restarted. Side effects append lines to a
file: each fires exactly once across the kill (the kill points are after a result is journaled or before
the call is claimed, so nothing is in doubt), and the restarted process finishes the conversation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from child_harness import effect_lines, finish, kill_at_point, spawn

import bide

CHILD = Path(__file__).with_name("thread_child.py")


def child(url: str, effect: Path, mode: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return spawn(CHILD, url, "t-1", str(effect), mode, env=env)


# kill point (a journal key whose write has committed) -> effects fired before the kill
POINTS = {
    "seg:1": ["m0"],  # message 1 opened with its first turn (the first call's marker), call not made yet
    "result:c2.0": ["m0", "m1 first"],  # message 1's first side effect recorded
    "model:3": ["m0", "m1 first"],  # message 1's second turn journaled with its call's marker
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(POINTS))
def test_thread_killed_mid_message_resumes_that_message(point: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    effect = tmp_path / "effect.txt"
    ready = tmp_path / "ready"
    kill_at_point(CHILD, url, "t-1", str(effect), "thread", point=point, signal_file=ready)
    assert effect_lines(effect) == POINTS[point]
    store = bide.open_store(url)
    try:
        assert bide.run_status(store, "t-1").status in ("running", "halted")
    finally:
        store.close()

    outcome, _ = finish(child(url, effect, "thread"))
    if point == "seg:1" or point == "model:3":
        # A marker was committed and the kill came before the call: the marker is this crash's doubt.
        assert outcome["outcome"] == "halted"
        assert effect_lines(effect) == POINTS[point]  # nothing fired twice, and nothing in doubt was fired
        store = bide.open_store(url)
        try:
            st = bide.run_status(store, "t-1")
            assert st.status == "halted" and st.input == "do two things"
            call_id = str(outcome["call_id"])
            while True:  # the killed call's deadline (its 1 s timeout, plus clock skew) must pass first
                try:
                    bide.resolve_halt(store, "t-1", call_id, outcome=bide.Outcome.not_started())
                    break
                except bide.HaltInFlight as wait:
                    time.sleep(max(0.05, wait.retry_after - time.time()))
        finally:
            store.close()
        outcome, _ = finish(child(url, effect, "thread"))
    assert outcome == {"outcome": "completed", "answers": ["message 0 done", "message 1 done"]}
    assert effect_lines(effect) == ["m0", "m1 first", "m1 second"]  # each exactly once across the kill
    store = bide.open_store(url)
    try:
        st = bide.run_status(store, "t-1")
        assert st.status == "idle" and st.answer == "message 1 done"
    finally:
        store.close()


@pytest.mark.slow
def test_stream_killed_mid_run_is_resumed_by_run_and_replayed_by_stream(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    effect = tmp_path / "effect.txt"
    proc = child(url, effect, "stream", {"BIDE_TEST_STOP_AFTER": "ToolCallFinished:c0.0"})
    assert proc.stdout is not None
    seen: list[dict[str, object]] = []
    while not seen or seen[-1].get("call_id") != "c0.0":
        line = proc.stdout.readline()
        assert line, proc.communicate()
        seen.append(json.loads(line))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [e["type"] for e in seen] == ["ModelTurnEvent", "ToolCallStarted", "ToolCallFinished"]
    assert effect_lines(effect) == ["s first"]

    outcome, _ = finish(child(url, effect, "run"))
    assert outcome == {"outcome": "completed", "answer": "all appended"}
    assert effect_lines(effect) == ["s first", "s second"]

    # Streaming the finished run replays its events, marked as replayed, without the model's deltas.
    outcome, lines = finish(child(url, effect, "stream"))
    events = [json.loads(line) for line in lines]
    assert [e["type"] for e in events] == [
        "ModelTurnEvent", "ToolCallStarted", "ToolCallFinished",
        "ModelTurnEvent", "ToolCallStarted", "ToolCallFinished",
        "ModelTurnEvent", "Finished",
    ]  # fmt: skip
    assert all(e["replayed"] for e in events)
    assert effect_lines(effect) == ["s first", "s second"]
