"""A driver paused inside its event append, past its lease, while another driver takes the run over.

The paused driver holds the log's lock with its event written but not committed. The new driver calls
the tool again for the same call (the same event id); its append times out on the lock, and reading the
id back finds nothing, since the paused append has not committed. The call was journaled as failed, and
the model called again as a new call: once the paused driver woke up and committed, the log held two
restocks for one intent. The call is in doubt instead (`bide.CallInDoubt`: nothing journaled, the model
told nothing), and the next drive settles it with the same event id: one event.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from paused import pause

import bide
from bide._messages import ModelRequest, ToolMessage
from bide.testing import ScriptedModel, Turn, call, reply
from govern.runtime._agents import event_tool
from govern.runtime._eventlog import EventLog

from .machines import order_machine

HERE = Path(__file__).resolve().parent
LEASE_TTL = 1.0
CLOCK_SKEW = 0.2


def restocking_agent(store_url: str, log: EventLog) -> bide.Agent:
    """An agent that restocks order o1 and, told that the restock failed, restocks it again (a model
    does what it was asked)."""

    def after_restock(request: ModelRequest) -> Turn:
        told = request.messages[-1]
        failed = isinstance(told, ToolMessage) and told.is_error
        return call("restock", record="o1") if failed else reply("restocked")

    machine = order_machine()
    model = ScriptedModel([call("restock", record="o1"), after_restock, reply("restocked")])
    return bide.Agent(
        model,
        store=bide.open_store(store_url),
        tools=[event_tool(machine, log, "restock")],
        name="clerk",
        lease_ttl=LEASE_TTL,
        clock_skew=CLOCK_SKEW,
    )


def paused_holder_problem(log_url: str, log_name: str, backend_pid: str) -> str | None:
    """Why the paused driver (its PostgreSQL session `backend_pid`) does not hold the log's lock, or None
    when it does: another session cannot take the lock, and on PostgreSQL the paused session is still
    in its write phase ("active", waiting for its next statement: no server timeout ends it)."""
    engine = sa.create_engine(log_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                try:
                    conn.exec_driver_sql("PRAGMA busy_timeout = 0")
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                except sa.exc.OperationalError:
                    return None  # the paused driver holds the write lock
                return "nothing holds the log's write lock"
            session = conn.execute(
                sa.text("SELECT state, wait_event, left(query, 60) AS query FROM pg_stat_activity "
                        "WHERE pid = :pid"),
                {"pid": int(backend_pid)},
            ).one_or_none()  # fmt: skip
            try:
                conn.execute(
                    sa.text('SELECT 1 FROM govern_logs WHERE "name" = :log FOR UPDATE NOWAIT'),
                    {"log": log_name},
                )
            except sa.exc.OperationalError as exc:
                locked = getattr(exc.orig, "sqlstate", None) == "55P03"
            else:
                locked = False
            conn.rollback()
    finally:
        engine.dispose()
    if session is not None and session.state == "active" and locked:
        return None
    found = "gone" if session is None else f"{session.state!r} ({session.wait_event}, {session.query!r})"
    return (
        f"its session {backend_pid} is {found}, and the log's lock is {'held' if locked else 'free'}: the "
        "server ended the session between the append's read and its writes, which reached it only after "
        "idle_in_transaction_session_timeout (half the child's log timeout): the machine stalled the child "
        "or its server process that long"
    )


@pytest.mark.slow
def test_a_call_whose_append_waited_on_a_paused_earlier_drive_is_in_doubt_not_failed(
    log_url: str, log_name: str, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path}/journal.db"
    log = EventLog(log_url, name=log_name, timeout=2.0)
    agent = restocking_agent(store_url, log)  # made first: event_tool binds the log, a write
    run_id = f"{log_name}-run"
    child = subprocess.Popen(
        [sys.executable, str(HERE / "_paused_append_worker.py"), store_url, log_url, log_name, run_id,
         str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "in-append").exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child never reached its append"
            time.sleep(0.02)
        pause(child.pid)
        (tmp_path / "go").touch()  # it goes on (commits) only once woken
        time.sleep(LEASE_TTL + CLOCK_SKEW + 0.5)  # its lease is over: another driver may take the run
        problem = paused_holder_problem(log_url, log_name, (tmp_path / "in-append").read_text())
        assert problem is None, f"the paused driver holds no lock, the premise of this test: {problem}"
        with pytest.raises(bide.CallInDoubt, match="earlier drive of this call"):
            agent.run_sync(run_id, "restock o1")
        journal = bide.Journal(agent.store, run_id).load()
        assert not [r for r in journal.records() if isinstance(r, bide.ToolResult)]  # the model: told nothing
    finally:
        os.kill(child.pid, signal.SIGCONT)
    out, err = child.communicate(timeout=60)
    assert "LeaseLost" in out or "RunInFlight" in out, (out, err)  # its late result was refused
    assert [e.event for e in log.read()] == ["restock"]  # the woken driver's commit landed
    assert restocking_agent(store_url, log).run_sync(run_id, "restock o1").answer == "restocked"
    assert [e.event for e in log.read()] == ["restock"]  # settled by the same event id: once
    journal = bide.Journal(agent.store, run_id).load()
    [result] = [r for r in journal.records() if isinstance(r, bide.ToolResult)]
    assert not result.is_error and result.result["newly_recorded"] is False
