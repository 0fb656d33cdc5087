"""A store that several apps share: each app's `bide worker` defines only its own agents. A run started by an
agent its --app does not define (another app's, however healthy: an idle thread, a run waiting for its own
worker) made every `--once` pass exit 4, "needs a person", on every pass. Such runs are listed apart, in
the report's `other_agents` (run id to entry point), logged at debug level only (a line per run at every
pass of a `--once` from cron was thousands of lines of nothing wrong), parked like idle runs (they were
read again and again with backoff, forever), and are not the worker's trouble: the pass exits as its own
runs say. A run no pass can drive (a damaged record) still exits 4. And a pass whose
drives failed both ways (the store, and otherwise) names both on stderr (the others were dropped)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import bide
from bide._cli_common import EXIT_NOT_FOUND, EXIT_OK, EXIT_STORE
from bide._worker import PassReport
from bide._worker_cli import _once_exit_code
from bide.testing import Fail, ScriptedModel, call, reply

REPO = Path(__file__).resolve().parents[2]

APPS = '''
import bide
from bide.testing import ScriptedModel, call, reply


@bide.tool(safety=bide.ReadOnly)
def peek() -> str:
    """Look."""
    return "open"


def agent(store, name):
    model = ScriptedModel([call("peek"), reply("done")] * 5)  # a first turn is replayed from the journal
    return bide.Agent(model, store=store, tools=[peek], name=name, lease_ttl=0.5)


def build_a(store):
    return agent(store, "a")


def build_b(store):
    return agent(store, "b")
'''

OTHER_APP_RUN = "which this worker's agents do not define"


@bide.tool(safety=bide.ReadOnly)
def peek() -> str:
    """Look."""
    return "open"


def shared_store(db: Path) -> None:
    """App a's idle thread and finished run; app b's idle thread and a run left unfinished (its lease
    released: its model failed), for b's worker to resume."""
    store = bide.open_store(f"sqlite:///{db}")
    try:
        a = bide.Agent(ScriptedModel([reply("hello"), reply("done")]), store=store, name="a")
        a.thread("chat-a").send_sync("hi")
        a.run_sync("done-a", "x")
        b = bide.Agent(ScriptedModel([reply("hello")]), store=store, name="b")
        b.thread("chat-b").send_sync("hi")
        crashing = ScriptedModel([call("peek"), Fail(bide.ModelError("the model is down"))])
        with pytest.raises(bide.ModelError):
            b = bide.Agent(crashing, store=store, tools=[peek], name="b", lease_ttl=0.5)
            b.run_sync("crashed-b", "go")
    finally:
        store.close()


def worker_once(db: Path, cwd: Path, app: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), str(REPO), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "bide._cli", "worker", "--store", f"sqlite:///{db}", "--app", app]
    return subprocess.run(
        [*command, "--once", *extra], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_each_app_on_a_shared_store_passes_with_the_other_apps_runs_listed_apart(tmp_path: Path) -> None:
    (tmp_path / "apps.py").write_text(APPS)
    db = tmp_path / "runs.db"
    shared_store(db)
    for _ in range(2):  # every pass alike: the other app's runs never turn into trouble
        passed = worker_once(db, tmp_path, "apps:build_a", "--json")
        assert passed.returncode == EXIT_OK, passed.stderr
        report = json.loads(passed.stdout)
        assert report["unresumable"] == {}, report
        assert report["other_agents"] == {"chat-b": "thread:b", "crashed-b": "agent:b"}, report
        assert report["driven"] == 0, report
        assert "needs a person" not in passed.stderr and "bide worker:" not in passed.stderr, passed.stderr
        # No line per run (the report counts them).
        assert OTHER_APP_RUN not in passed.stderr, passed.stderr
    # Said in the plain report too.
    plain = worker_once(db, tmp_path, "apps:build_a")
    assert plain.returncode == EXIT_OK, plain.stderr
    assert "2 started by agents --app does not define: left to the worker of an app that defines them" in (
        plain.stdout
    )
    # App b's worker resumes its own run, and lists app a's thread apart.
    theirs = worker_once(db, tmp_path, "apps:build_b", "--json")
    assert theirs.returncode == EXIT_OK, theirs.stderr
    report = json.loads(theirs.stdout)
    assert report["completed"] == 1 and report["other_agents"] == {"chat-a": "thread:a"}, report
    assert report["unresumable"] == {}, report


def test_a_damaged_run_beside_another_apps_run_still_exits_4_naming_only_it(tmp_path: Path) -> None:
    (tmp_path / "apps.py").write_text(APPS)
    db = tmp_path / "runs.db"
    shared_store(db)
    with sqlite3.connect(db) as conn:
        edit = "UPDATE bide_records SET data = ? WHERE run_id = 'crashed-b' AND key = 'run:start'"
        conn.execute(edit, (b"{not json",))
    passed = worker_once(db, tmp_path, "apps:build_a", "--json")
    assert passed.returncode == EXIT_NOT_FOUND, passed.stderr
    report = json.loads(passed.stdout)
    assert list(report["unresumable"]) == ["crashed-b"], report
    assert report["other_agents"] == {"chat-b": "thread:b"}, report
    [said] = [line for line in passed.stderr.splitlines() if line.startswith("bide worker:")]
    assert "1 run cannot be resumed" in said and "chat-b" not in said, said


def test_the_report_lists_runs_of_agents_the_worker_does_not_define_apart(store: bide.Store) -> None:
    theirs = bide.Agent(ScriptedModel([reply("hello")]), store=store, name="theirs")
    theirs.thread("their-chat").send_sync("hi")
    crashing = ScriptedModel([call("peek"), Fail(bide.ModelError("down"))])
    with pytest.raises(bide.ModelError):
        bide.Agent(crashing, store=store, tools=[peek], name="theirs", lease_ttl=0.5).run_sync("r", "go")
    mine = bide.Agent(ScriptedModel([reply("never asked")]), store=store, name="mine")
    for agents in (mine, lambda name: mine if name == "mine" else None):
        report = asyncio.run(bide.Worker(store, agents).run_once())
        assert report.other_agents == {"their-chat": "thread:theirs", "r": "agent:theirs"}, report
        assert report.unresumable == {} and report.driven == 0 and report.skipped == 2, report


def test_a_pass_whose_drives_failed_both_ways_names_every_failure() -> None:
    """`failed = by_store or other` dropped the drives that failed otherwise when the store also failed."""
    report = PassReport(
        errors={"s": "StoreError: disk full", "m": "ModelError: the model is down"},
        causes={"s": "store", "m": "error"},
    )
    code, why = _once_exit_code(report)
    assert code == EXIT_STORE
    assert "the store failed in 1 drive (run s: StoreError: disk full)" in why, why
    assert "1 drive failed (run m: ModelError: the model is down)" in why, why
    report.unresumable["u"] = "its record 'run:start' is damaged"
    code, why = _once_exit_code(report)
    assert code == EXIT_STORE and "run s:" in why and "run m:" in why and "run u:" in why, why
    report.other_agents["t"] = "thread:theirs"  # another app's: no trouble, not said
    assert _once_exit_code(report) == (code, why)
    assert _once_exit_code(PassReport(other_agents={"t": "thread:theirs"})) == (EXIT_OK, "")


def test_another_apps_runs_are_parked_not_read_again_and_again(
    store: bide.Store, journal_reads: Callable[[bide.Store], list[str]]
) -> None:
    theirs = bide.Agent(ScriptedModel([reply("hello"), reply("again")]), store=store, name="theirs")
    theirs.thread("their-chat").send_sync("hi")
    mine = bide.Agent(ScriptedModel([reply("never asked")]), store=store, name="mine")
    clock = [1_000_000.0]
    worker = bide.Worker(store, mine, clock=lambda: clock[0], backoff=1, max_backoff=1)
    reads = journal_reads(store)
    assert asyncio.run(worker.run_once()).other_agents == {"their-chat": "thread:theirs"}
    assert reads == ["their-chat"]
    for _ in range(5):  # past any backoff: nothing about the run changed, nothing is read
        clock[0] += 60
        report = asyncio.run(worker.run_once())
        assert report.driven == 0 and report.other_agents == {}, report
    assert reads == ["their-chat"], reads
    theirs.thread("their-chat").send_sync("more")  # their worker's (or their app's) news: read once again
    reads.clear()
    assert asyncio.run(worker.run_once()).other_agents == {"their-chat": "thread:theirs"}
    assert reads == ["their-chat"], reads
