"""`bide worker --once` exits 4 when its pass met a run no pass of it can drive (`unresumable`: a record
edited or damaged in the database, a journal in another format). It exited 0, and a cron job reading 0 as
"all fine" never told anyone; such a run needs a person. A run of an agent the app does not define is
another app's on a shared store (test_worker_edges_w3_shared_store.py): listed apart, not exit 4."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide._cli_common import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_STORE
from bide._worker import PassReport
from bide._worker_cli import _once_exit_code
from bide.testing import Fail, ScriptedModel, call

REPO = Path(__file__).resolve().parents[2]

APP = '''
import bide
from bide.testing import ScriptedModel, call, reply


@bide.tool(safety=bide.ReadOnly)
def peek() -> str:
    """Look."""
    return "open"


def build(store):
    model = ScriptedModel([call("peek"), reply("done")])  # its first turn is replayed from the journal
    return bide.Agent(model, store=store, tools=[peek], name="a", lease_ttl=0.5)
'''


@bide.tool(safety=bide.ReadOnly)
def peek() -> str:
    """Look."""
    return "open"


def crashed(db: Path, run_id: str, agent_name: str = "a") -> None:
    """Leave `run_id` unfinished, its lease released (its second model turn failed), for a worker."""
    store = bide.open_store(f"sqlite:///{db}")
    try:
        model = ScriptedModel([call("peek"), Fail(bide.ModelError("the model is down"))])
        agent = bide.Agent(model, store=store, tools=[peek], name=agent_name, lease_ttl=0.5)
        with pytest.raises(bide.ModelError):
            agent.run_sync(run_id, "hi")
    finally:
        store.close()


def worker_once(db: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), str(REPO), env.get("PYTHONPATH", "")])
    url = f"sqlite:///{db}"
    command = [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", "w2app:build"]
    return subprocess.run(
        [*command, "--once", *extra], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("as_json", [False, True])
def test_a_pass_that_met_a_damaged_run_exits_4_naming_it(tmp_path: Path, as_json: bool) -> None:
    (tmp_path / "w2app.py").write_text(APP)
    db = tmp_path / "runs.db"
    crashed(db, "damaged")
    crashed(db, "sound")
    with sqlite3.connect(db) as conn:
        edit = "UPDATE bide_records SET data = ? WHERE run_id = 'damaged' AND key = 'run:start'"
        conn.execute(edit, (b"{not json",))
    done = worker_once(db, tmp_path, *(["--json"] if as_json else []))
    assert done.returncode == EXIT_NOT_FOUND, (done.stdout, done.stderr)
    said = [line for line in done.stderr.splitlines() if line.startswith("bide worker:")]
    assert len(said) == 1, done.stderr
    assert "1 run cannot be resumed by this worker and needs a person" in said[0], said
    assert "run damaged:" in said[0] and "--app has it" not in said[0], said
    assert "'run:start' is damaged" in said[0] and "restore the store from a backup" in said[0], said
    if as_json:
        report = json.loads(done.stdout)
        assert report["completed"] == 1 and list(report["unresumable"]) == ["damaged"], report
    else:
        assert "resumed 1 run: 1 completed" in done.stdout, done.stdout


def test_a_pass_that_met_a_run_of_an_agent_the_app_does_not_define_lists_it_and_exits_0(
    tmp_path: Path,
) -> None:
    (tmp_path / "w2app.py").write_text(APP)
    db = tmp_path / "runs.db"
    crashed(db, "theirs", agent_name="other")
    done = worker_once(db, tmp_path, "--json")
    assert done.returncode == EXIT_OK, done.stderr
    assert "run theirs" not in done.stderr  # logged at debug level only: the report lists it
    assert "needs a person" not in done.stderr
    report = json.loads(done.stdout)
    assert report["unresumable"] == {} and report["other_agents"] == {"theirs": "agent:other"}, report
    # A worker whose app defines its agent drives it.
    (tmp_path / "w2app.py").write_text(APP.replace('name="a"', 'name="other"'))
    fixed = worker_once(db, tmp_path, "--json")
    assert fixed.returncode == EXIT_OK and json.loads(fixed.stdout)["completed"] == 1, fixed.stderr


def test_which_code_a_pass_exits_with_when_several_things_went_wrong() -> None:
    """The store failing (6) outranks a run needing a person (4), which outranks a drive to retry (1): a
    drive retried at the next pass must not hide a run no pass will drive. Each is said."""
    report = PassReport(unresumable={f"u{i}": "its record 'run:start' is damaged" for i in range(5)})
    code, why = _once_exit_code(report)
    assert code == EXIT_NOT_FOUND
    assert "5 runs cannot be resumed" in why and "run u0: its record" in why and "and 2 more" in why
    report.errors["f"], report.causes["f"] = "ModelError: the model is down", "error"
    code, why = _once_exit_code(report)
    assert code == EXIT_NOT_FOUND and "1 drive failed" in why and "5 runs cannot be resumed" in why
    report.errors["s"], report.causes["s"] = "StoreError: disk full", "store"
    code, why = _once_exit_code(report)
    assert code == EXIT_STORE and "the store failed" in why and "5 runs cannot be resumed" in why
    assert _once_exit_code(PassReport(errors={"f": "x"}, causes={"f": "error"}))[0] == EXIT_FAILED
    assert _once_exit_code(PassReport(halted=2, skipped=3)) == (EXIT_OK, "")
