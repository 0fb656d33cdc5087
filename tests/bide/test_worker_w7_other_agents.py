"""Runs of an agent no app of this worker defines (another app's on a shared store, or an agent renamed in a
deploy): never resumed by this worker, and before, nothing but the plain report's wording said so. The pass
report counts them by agent name (plain and --json's `other_agent_runs`), and a serving worker says it once
per agent name, not at every pass. Information, not trouble: the exit codes are unchanged.

Each worker is a real process (`python -m bide._cli worker`) on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from worker_process import WorkerProcess

import bide
from bide.testing import Fail, ScriptedModel, call

APP = '''
import bide
from bide.testing import ScriptedModel, call, reply


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


def build(store):
    return bide.Agent(ScriptedModel([call("look"), reply("done")] * 5), store=store, tools=[look], name="a")
'''


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


def crashed_run(url: str, prefix: str, agent_name: str, run_id: str) -> None:
    """Run `run_id` of agent `agent_name` whose drive failed after its first turn: a worker's to resume."""
    store = bide.open_store(url, table_prefix=prefix)
    try:
        model = ScriptedModel([call("look"), Fail(bide.ModelError("down"))])
        agent = bide.Agent(model, store=store, tools=[look], name=agent_name)
        with pytest.raises(bide.ModelError):
            agent.run_sync(run_id, "charge o-1")
    finally:
        store.close()


def once(tmp_path: Path, url: str, prefix: str, *extra: str) -> tuple[int, str, str]:
    worker = WorkerProcess(tmp_path, APP, url, "--table-prefix", prefix, "--once", *extra)
    try:
        code, out = worker.ended()
    finally:
        worker.kill()
    return code, out, worker.stderr()


def test_a_pass_counts_the_runs_of_agents_no_app_here_defines_by_name(
    tmp_path: Path, durable_store_spec: tuple[str, str]
) -> None:
    url, prefix = durable_store_spec
    for agent_name, run_id in (("old", "r1"), ("old", "r2"), ("gone", "r3"), ("a", "mine")):
        crashed_run(url, prefix, agent_name, run_id)
    code, out, errors = once(tmp_path, url, prefix, "--json")
    assert code == 0, errors
    report = json.loads(out)
    assert report["other_agent_runs"] == {"gone": 1, "old": 2}, report
    assert report["other_agents"] == {"r1": "agent:old", "r2": "agent:old", "r3": "agent:gone"}, report
    assert report["completed"] == 1, report
    code, out, errors = once(tmp_path, url, prefix)  # (run "mine" completed: only the three are left)
    assert code == 0, errors
    assert (
        "3 runs of agents no app here defines: 'gone' (1), 'old' (2); "
        "a worker whose app defines them drives them"
    ) in out.splitlines(), out


def test_a_pass_names_a_single_agent_in_the_singular(
    tmp_path: Path, durable_store_spec: tuple[str, str]
) -> None:
    url, prefix = durable_store_spec
    crashed_run(url, prefix, "old", "r1")
    code, out, errors = once(tmp_path, url, prefix)
    assert code == 0, errors
    said = "1 run of an agent no app here defines: 'old' (1); a worker whose app defines it drives it"
    assert said in out, out


SAID = "runs of agent 'old' are left alone"


def test_a_serving_worker_says_it_once_per_agent_name(
    tmp_path: Path, durable_store_spec: tuple[str, str]
) -> None:
    url, prefix = durable_store_spec
    crashed_run(url, prefix, "old", "r1")
    crashed_run(url, prefix, "gone", "r2")
    worker = WorkerProcess(tmp_path, APP, url, "--table-prefix", prefix, "--poll", "0.05")
    try:
        worker.says(SAID)
        worker.says("runs of agent 'gone' are left alone")
        # Another run of the same agent, read at a later pass; then one of the app's own, which shows that the
        # passes after it ran.
        crashed_run(url, prefix, "old", "r3")
        crashed_run(url, prefix, "a", "mine")
        worker.says("run mine completed")
        crashed_run(url, prefix, "a", "mine-2")
        worker.says("run mine-2 completed")
        worker.process.send_signal(signal.SIGTERM)
        code, _ = worker.ended()
    finally:
        worker.kill()
    errors = worker.stderr()
    assert code == 0, errors
    assert errors.count(SAID) == 1, errors
    assert errors.count("runs of agent 'gone' are left alone") == 1, errors
    assert "a worker whose app defines it drives them" in errors, errors
    assert " ERROR " not in errors and " WARNING " not in errors, errors


def test_a_serving_worker_that_meets_no_such_run_says_nothing_of_them(
    tmp_path: Path, durable_store_spec: tuple[str, str]
) -> None:
    url, prefix = durable_store_spec
    bide.open_store(url, table_prefix=prefix).close()  # (bide worker serves a store, never creates it)
    worker = WorkerProcess(tmp_path, APP, url, "--table-prefix", prefix, "--poll", "0.05")
    try:
        worker.says("SIGINT, SIGTERM or SIGHUP stops it")
        crashed_run(url, prefix, "a", "mine")
        worker.says("run mine completed")
        worker.process.send_signal(signal.SIGTERM)
        code, _ = worker.ended()
    finally:
        worker.kill()
    assert code == 0, worker.stderr()
    assert "are left alone" not in worker.stderr(), worker.stderr()
