"""An event tool's call that fails before its append (the producer's last event cannot be read: a migration
locks the log, a database restarts) may be the retry of a call whose earlier drive appended the event and
was killed before its result was journaled. The model must not be told "failed" then (it would call again
and a second event would be recorded, docs/governed-agents.md): the tool reads its event id back, and the
call succeeds when the event is there, is in doubt when that cannot be told, and fails only when the event
is surely not in the log."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

import bide
import govern
from bide.testing import ScriptedModel, call, reply
from govern.runtime._agents import event_id_for


def stock() -> govern.Machine:
    reg = govern.Registry("stock")
    n = reg.int("n", 0, 5)
    reg.event("restock", guard=n < 5, effect={n: n + 1})
    return reg.build()


class _Unreadable(govern.EventLog):
    """A real log whose reads of a producer's last event fail (and, with `gets_fail`, reads by id too)."""

    gets_fail = False

    def last_by_producer(self, producer: str) -> Any:
        raise govern.LogTimeout("read on event log 'main' waited longer than the log's timeout")

    def get(self, event_id: str) -> Any:
        if self.gets_fail:
            raise govern.LogTimeout("read on event log 'main' waited longer than the log's timeout")
        return super().get(event_id)


def drive(log: govern.EventLog, machine: govern.Machine) -> tuple[bide.RunResult, ScriptedModel]:
    model = ScriptedModel([call("restock", record="order-1"), reply("done")])
    agent = bide.Agent(
        model, store=bide.open_store("memory://"), tools=[govern.event_tool(machine, log, "restock")]
    )
    return agent.run_sync("run-1", "restock order-1 once"), model


def earlier_drive_appended(log: govern.EventLog, machine: govern.Machine) -> str:
    """What a drive killed right after its append left in the log: the event of call c0.0 of run-1."""
    event_id = event_id_for("run-1", "c0.0", "restock", "order-1")
    log.append(
        govern.Event(id=event_id, machine=machine.digest, record="order-1", event="restock", producer="run-1")
    )
    return event_id


def test_a_retry_whose_event_is_in_the_log_succeeds_though_the_producer_cannot_be_read() -> None:
    machine = stock()
    log = _Unreadable("memory://", machine=machine)
    event_id = earlier_drive_appended(log, machine)
    result, model = drive(log, machine)
    [told] = [m for m in model.requests[1].messages if m.role == "tool"]
    assert not told.is_error and '"newly_recorded":false' in told.content.replace(" ", "")  # type: ignore[union-attr]
    assert result.answer == "done" and [e.id for e in log.read()] == [event_id]


def test_a_call_is_in_doubt_when_its_event_cannot_be_looked_up_either() -> None:
    machine = stock()
    log = _Unreadable("memory://", machine=machine)
    log.gets_fail = True
    earlier_drive_appended(log, machine)
    with pytest.raises(bide.CallInDoubt, match="may or may not be in the log"):
        drive(log, machine)


def test_a_call_whose_event_is_surely_absent_is_in_doubt_after_a_lock_wait() -> None:
    """A wait that timed out may be on an earlier drive's uncommitted append: in doubt, not failed."""
    machine = stock()
    log = _Unreadable("memory://", machine=machine)
    with pytest.raises(bide.CallInDoubt):
        drive(log, machine)
    assert log.read() == []


def test_a_call_with_too_little_time_left_succeeds_when_an_earlier_drive_appended_its_event(
    tmp_path: Path,
) -> None:
    """A tool timeout lowered below what the log may take refuses before appending ("nothing was
    appended"), but only once it has looked its event id up: the retry of a call whose event an earlier
    drive appended succeeded."""
    machine = stock()
    log = govern.EventLog(f"sqlite:///{tmp_path / 'events.db'}", machine=machine, timeout=10)
    event_id = earlier_drive_appended(log, machine)
    tool = govern.event_tool(machine, log, "restock")
    tool.timeout = 2.0  # far below the five log calls of up to 20 s each the tool may need
    model = ScriptedModel([call("restock", record="order-1"), reply("done")])
    bide.Agent(model, store=bide.open_store("memory://"), tools=[tool]).run_sync("run-1", "restock order-1")
    [told] = [m for m in model.requests[1].messages if m.role == "tool"]
    assert not told.is_error, told.content  # type: ignore[union-attr]
    assert [e.id for e in log.read()] == [event_id]
    log.close()


def _told(model: ScriptedModel) -> str:
    [told] = [m for m in model.requests[1].messages if m.role == "tool"]
    assert not told.is_error, told.content  # type: ignore[union-attr]
    return str(told.content).replace(" ", "")  # type: ignore[union-attr]


def test_an_event_an_earlier_drive_appended_is_not_newly_recorded_after_a_lock_wait(tmp_path: Path) -> None:
    """The retry's append waits for a lock another session holds past the log's timeout, then reads its event
    id back and finds what an earlier drive appended: that is not this call's recording."""
    machine = stock()
    path = tmp_path / "events.db"
    log = govern.EventLog(f"sqlite:///{path}", machine=machine, timeout=1.0)
    event_id = earlier_drive_appended(log, machine)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # a migration, say, holds the log's write lock
    release = threading.Timer(2.5, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        result, model = drive(log, machine)
    finally:
        release.join()
        holder.close()
    assert '"newly_recorded":false' in _told(model)
    assert result.answer == "done" and [e.id for e in log.read()] == [event_id]
    log.close()


def test_an_append_whose_acknowledgement_was_lost_is_newly_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append committed and then failed (its acknowledgement lost): the event carries this append's token,
    so this call recorded it."""
    machine = stock()
    log = govern.EventLog(f"sqlite:///{tmp_path / 'events.db'}", machine=machine, timeout=1.0)
    log.bind(machine)  # the tool's own bind, done here before appends start failing
    backend = log._backend  # type: ignore[attr-defined]
    commit = backend.transaction

    def committed_then_lost(*args: Any, **kwargs: Any) -> Any:
        commit(*args, **kwargs)
        raise govern.EventLogError("the connection dropped before the commit was acknowledged")

    monkeypatch.setattr(backend, "transaction", committed_then_lost)
    result, model = drive(log, machine)
    assert '"newly_recorded":true' in _told(model)
    assert result.answer == "done" and len(log.read()) == 1
    log.close()
