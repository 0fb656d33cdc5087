"""Two processes drive one conversation thread at the same moment (SQLite and PostgreSQL).

A thread is one run, so its drivers share the run's lease (docs/guarantee.md, "What a second driver
sees"). Each process sends one message through `thread_race_child.py`, after a start barrier; the driver
that takes the lease is held inside its model turn or its side-effect call until the other has tried, so
the two really overlap. Whatever the order: each message's side effect fires at most once, no message is
answered twice or lost (the journal's history holds each answered message once, with its answer), and the
second driver either raised `RunInFlight` (no `lease_wait`), waited and got the recorded answer
(`replayed=True`), or was refused with `RunMismatch` for a message index the thread is not at.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from child_harness import effect_lines, finish, release_barrier, spawn, wait_for_file
from thread_race_child import agent

import bide

CHILD = Path(__file__).with_name("thread_race_child.py")
THREAD = "chat-1"

Driver = tuple[str, str, str, float]  # message, segment ("-": none), "send" or "stream", lease_wait


class Race:
    """One thread (message 0 answered) on a fresh durable store, and the files its drivers share."""

    def __init__(self, spec: tuple[str, str], tmp_path: Path) -> None:
        self.url, self.prefix = spec
        self.tmp = tmp_path
        self.effect = tmp_path / "effects.txt"
        self.held = tmp_path / "held"
        self.release = tmp_path / "release"
        self.store = bide.open_store(self.url, table_prefix=self.prefix)
        first = agent(self.store, str(self.effect), 0.0).thread(THREAD).send_sync("m0", segment=0)
        assert first.answer == "answered m0"

    def start(self, hold: str, *drivers: Driver) -> list[subprocess.Popen[str]]:
        """Start the drivers together; returns once one of them is held at `hold` ("model" or "tool")."""
        go = self.tmp / "go"
        env = {
            "BIDE_TEST_GO": str(go),
            "BIDE_TEST_HOLD": hold,
            "BIDE_TEST_HELD": str(self.held),
            "BIDE_TEST_RELEASE": str(self.release),
        }
        procs = [
            spawn(CHILD, self.url, self.prefix, THREAD, str(self.effect), m, seg, via, str(wait), env=env)
            for m, seg, via, wait in drivers
        ]
        release_barrier(go, len(procs))
        wait_for_file(self.held)
        return procs

    def holder(self, procs: list[subprocess.Popen[str]]) -> int:
        """The index of the driver held with the lease."""
        pid = int(self.held.read_text())
        return next(i for i, p in enumerate(procs) if p.pid == pid)

    def let_go(self, procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
        self.release.write_text("go")
        return [finish(p)[0] for p in procs]

    def history(self) -> list[tuple[str, str]]:
        """(role, text) of the thread's journaled messages, tool calls shown as `call <text>`."""
        messages = asyncio.run(agent(self.store, str(self.effect), 0.0).thread(THREAD).history())
        out: list[tuple[str, str]] = []
        for m in messages:
            if m.role == "assistant" and m.tool_calls:  # type: ignore[union-attr]
                out += [("call", str(c.arguments["text"])) for c in m.tool_calls]  # type: ignore[union-attr,index]
            else:
                out.append((m.role, str(m.content)))
        return out

    def close(self) -> None:
        self.store.close()


class _LeaseWatch:
    """Passes every call to `store`; sets `refused` once a lease request finds another driver's lease."""

    def __init__(self, store: bide.Store, refused: asyncio.Event) -> None:
        self.store = store
        self.url = store.url
        self.durable = store.durable
        self.refused = refused

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def alease(self, *args: Any, **kwargs: Any) -> Any:
        granted = asyncio.ensure_future(self.store.alease(*args, **kwargs))  # a sent request stays as it is

        def seen(lease: asyncio.Future[bide.Lease]) -> None:
            if not lease.cancelled() and lease.exception() is None and not lease.result().held:
                self.refused.set()

        granted.add_done_callback(seen)
        return granted


def answered(*messages: str) -> list[tuple[str, str]]:
    """The history of a thread that answered `messages`, in this order, each once."""
    out: list[tuple[str, str]] = []
    for m in messages:
        out += [("user", m), ("call", m), ("tool", f"recorded {m}"), ("assistant", f"answered {m}")]
    return out


@pytest.fixture
def race(durable_store_spec: tuple[str, str], tmp_path: Path) -> Any:
    r = Race(durable_store_spec, tmp_path)
    yield r
    r.close()


@pytest.mark.slow
def test_a_second_driver_without_lease_wait_is_told_the_thread_is_in_flight(race: Race) -> None:
    """Both send message 1; the one that took the lease is held inside its side effect. The other raises
    RunInFlight at once (nothing done) and the thread's status shows the call in flight; once released,
    the holder answers, and the effect fired once."""
    procs = race.start("tool", ("m1", "1", "send", 0.0), ("m1", "1", "send", 0.0))
    held = race.holder(procs)
    other = procs[1 - held]
    other.wait(timeout=120)  # it tries while the holder is held
    status = bide.run_status(race.store, THREAD)
    assert (status.status, status.input, status.tool) == ("halted", "m1", "record")  # in flight: see docs
    outcomes = race.let_go(procs)
    assert outcomes[1 - held] == {"outcome": "in_flight"}
    assert outcomes[held] == {
        "outcome": "completed",
        "answer": "answered m1",
        "segment": 1,
        "replayed": False,
    }
    assert effect_lines(race.effect) == ["m0", "m1"]
    assert race.history() == answered("m0", "m1")
    assert bide.run_status(race.store, THREAD).status == "idle"


@pytest.mark.slow
def test_a_second_driver_with_lease_wait_waits_and_streams_the_recorded_answer(race: Race) -> None:
    """Both send message 1 (one through `stream`), with a lease_wait; the lease holder is held inside its
    first model turn. The other waits, then returns the recorded answer (replayed) without calling the
    model or the tool: the streamer's events are the same whichever driver it was, replayed iff it waited."""
    procs = race.start("model", ("m1", "1", "send", 60.0), ("m1", "1", "stream", 60.0))
    held = race.holder(procs)
    time.sleep(0.3)  # the other driver is waiting for the lease now (the assertions do not rest on it)
    sent, streamed = race.let_go(procs)
    for i, out in enumerate((sent, streamed)):
        assert (out["outcome"], out["answer"], out["segment"]) == ("completed", "answered m1", 1)
        assert out["replayed"] is (i != held)
    mark = "(replayed)" if streamed["replayed"] else ""
    assert streamed["events"] == [
        f"ModelTurnEvent{mark}", f"ToolCallStarted{mark}", f"ToolCallFinished{mark}",
        f"ModelTurnEvent{mark}", f"Finished{mark}",
    ]  # fmt: skip
    assert effect_lines(race.effect) == ["m0", "m1"]
    assert race.history() == answered("m0", "m1")


@pytest.mark.slow
def test_drivers_of_two_different_message_indexes(race: Race) -> None:
    """One sends message 1, the other message 2, at once. Message 1 is answered once. Message 2 is answered
    after it (its driver waited for the lease) or, if its driver got the lease first, refused with
    RunMismatch (the thread is at message 1) with nothing written or fired."""
    procs = race.start("tool", ("m1", "1", "send", 60.0), ("m2", "2", "send", 60.0))
    assert race.holder(procs) == 0  # only message 1's driver can get as far as its side effect first
    time.sleep(0.3)
    first, second = race.let_go(procs)
    assert first == {"outcome": "completed", "answer": "answered m1", "segment": 1, "replayed": False}
    if second["outcome"] == "mismatch":
        assert effect_lines(race.effect) == ["m0", "m1"]
        assert race.history() == answered("m0", "m1")
    else:
        assert second == {"outcome": "completed", "answer": "answered m2", "segment": 2, "replayed": False}
        assert effect_lines(race.effect) == ["m0", "m1", "m2"]
        assert race.history() == answered("m0", "m1", "m2")


@pytest.mark.slow
def test_two_new_messages_at_once_are_both_answered_one_after_the_other(race: Race) -> None:
    """Two different messages, no index given, with a lease_wait: the lease holder (held in its model turn)
    answers its message as message 1; the other waits and answers its own as message 2. Neither is lost
    nor answered twice, and each answer follows its own message in the history."""
    procs = race.start("model", ("x", "-", "send", 60.0), ("y", "-", "send", 60.0))
    held = race.holder(procs)
    time.sleep(0.3)
    outcomes = race.let_go(procs)
    first, second = ("x", "y") if held == 0 else ("y", "x")
    by_message = {out["answer"]: out for out in outcomes}
    assert by_message[f"answered {first}"]["segment"] == 1
    assert by_message[f"answered {second}"]["segment"] == 2
    assert all(out["outcome"] == "completed" and not out["replayed"] for out in outcomes)
    assert effect_lines(race.effect) == ["m0", first, second]
    assert race.history() == answered("m0", first, second)


@pytest.mark.slow
def test_a_paused_driver_whose_message_another_driver_answered_returns_that_answer(race: Race) -> None:
    """The driver of message 1 (sent without its index) is paused (SIGSTOP) in its answering turn, past its
    lease; another driver resumes the thread and answers the message. The paused one, woken, has its write
    refused (the lease is no longer its own) and returns the recorded answer instead of RunInFlight, which
    would have its caller send the text again: a second message 1, and a second side effect."""
    (proc,) = race.start("answer", ("m1", "-", "send", 0.0))
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        other = asyncio.run(agent(race.store, str(race.effect), 30.0).thread(THREAD).resume())
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert (other.answer, other.segment, other.replayed) == ("answered m1", 1, False)
    (woken,) = race.let_go([proc])
    assert woken == {"outcome": "completed", "answer": "answered m1", "segment": 1, "replayed": True}
    assert effect_lines(race.effect) == ["m0", "m1"]
    assert race.history() == answered("m0", "m1")


@pytest.mark.slow
def test_the_same_text_sent_while_another_driver_answers_it_waits_for_that_answer(race: Race) -> None:
    """Message 1 is being answered by one driver (held in its answering turn) when a second driver sends the
    same text without an index, with a lease_wait: that send is the message's (docs/bide.md), so once the
    first driver answers, it returns that answer (replayed) instead of sending the text again as message
    2 once the thread is idle (which would fire its side effect a second time)."""
    (proc,) = race.start("answer", ("m1", "-", "send", 0.0))

    async def send_again() -> bide.RunResult[str]:
        refused = asyncio.Event()
        store = _LeaseWatch(race.store, refused)
        second = agent(store, str(race.effect), 60.0)  # type: ignore[arg-type]  # a store, watched
        sending = asyncio.ensure_future(second.thread(THREAD).send("m1"))
        # Once it found the first driver's lease (sent after the answer, the text would be a new message):
        # waited for, not assumed after a fixed time a loaded machine may not keep to.
        await asyncio.wait_for(refused.wait(), 60)
        race.release.write_text("go")
        return await sending

    again = asyncio.run(send_again())
    (first,) = race.let_go([proc])
    assert first == {"outcome": "completed", "answer": "answered m1", "segment": 1, "replayed": False}
    assert (again.answer, again.segment, again.replayed) == ("answered m1", 1, True)
    assert effect_lines(race.effect) == ["m0", "m1"]
    assert race.history() == answered("m0", "m1")


@pytest.mark.slow
def test_the_same_text_refused_as_in_flight_is_told_the_index_that_sends_it_once(race: Race) -> None:
    """Without a lease_wait, the same text sent while another driver answers it is refused (RunInFlight),
    and told to send it again with the message's index: sent again without it once answered, it would be a
    new message, answered (and its side effect fired) a second time."""
    (proc,) = race.start("answer", ("m1", "-", "send", 0.0))
    try:
        with pytest.raises(bide.RunInFlight, match=r"Send it again later with segment=1 \(its answer"):
            agent(race.store, str(race.effect), 0.0).thread(THREAD).send_sync("m1")
    finally:
        (first,) = race.let_go([proc])
    assert first == {"outcome": "completed", "answer": "answered m1", "segment": 1, "replayed": False}
    again = agent(race.store, str(race.effect), 0.0).thread(THREAD).send_sync("m1", segment=1)
    assert (again.answer, again.replayed) == ("answered m1", True)
    assert effect_lines(race.effect) == ["m0", "m1"]


@pytest.mark.slow
def test_a_paused_streamer_streams_only_its_message_and_marks_the_other_drivers_turns(race: Race) -> None:
    """As above, through `thread.stream`, and the other driver also answers message 2 before the paused one
    wakes. The woken stream ends with message 1's answer; it streams none of message 2's turns, and the
    answering turn the other driver journaled is marked replayed (this drive did not produce it)."""
    (proc,) = race.start("answer", ("m1", "-", "stream", 0.0))
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        other = agent(race.store, str(race.effect), 30.0).thread(THREAD)
        assert asyncio.run(other.resume()).answer == "answered m1"
        assert other.send_sync("m2").segment == 2
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    (woken,) = race.let_go([proc])
    assert (woken["answer"], woken["segment"], woken["replayed"]) == ("answered m1", 1, True)
    assert woken["events"] == [
        "ModelTurnEvent", "ToolCallStarted", "ToolCallFinished",
        "ModelTurnEvent(replayed)", "Finished(replayed)",
    ]  # fmt: skip
    assert effect_lines(race.effect) == ["m0", "m1", "m2"]
    assert race.history() == answered("m0", "m1", "m2")
