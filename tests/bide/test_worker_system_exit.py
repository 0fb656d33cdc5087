"""A tool or an app that raises SystemExit (sys.exit(), or argparse or click inside it) is that run's, or
that app's, failure: never the worker's end.

Found by an adversarial review: one run's sync tool calling sys.exit(1) escaped the event loop (the tool's
thread is awaited through a task of its own, and a task lets SystemExit out of the loop), which cancelled
every other drive of the pass: three side effects that had run to completion were never journaled, and
their runs halted for a person; `bide worker --once --json` printed tracebacks and no report. An app
module that called sys.exit() on import, or whose build function did, ended `bide worker` with that code
(0, "success") and no word.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import bide
from bide.testing import Fail, ScriptedModel, call, reply

REPO = Path(__file__).resolve().parents[2]
FIRED: list[str] = []
LOCK = threading.Lock()


@bide.tool(safety=bide.ReadOnly)
def peek(order: str) -> str:
    """Look an order up."""
    return f"order {order}"


@bide.tool(safety=bide.ReadOnly)
def parse(text: str) -> str:
    """Parse with a library that exits on bad input."""
    raise SystemExit(3)


@bide.tool(timeout=30)
def charge(order: str) -> str:
    """Charge the order (takes a while: the failing run's exit comes while it runs)."""
    time.sleep(0.3)
    with LOCK:
        FIRED.append(order)
    return "charged"


def _agents(store: bide.Store) -> list[bide.Agent]:
    bad = ScriptedModel([call("peek", order="o"), call("parse", text="?"), reply("x")])
    good = ScriptedModel([call("peek", order="o"), call("charge", order="o"), reply("done")])
    return [
        bide.Agent(bad, store=store, tools=[peek, parse], name="bad"),
        bide.Agent(good, store=store, tools=[peek, charge], name="good"),
    ]


def _crashed(store: bide.Store, name: str, run_id: str) -> None:
    """A run of agent `name` whose first drive died after its first turn (the model went down)."""
    model = ScriptedModel([call("peek", order="o"), Fail(bide.ModelError("down"))])
    with pytest.raises(bide.ModelError):
        bide.Agent(model, store=store, tools=[peek], name=name).run_sync(run_id, "go")


def test_a_tool_exiting_fails_its_own_run_and_the_other_drives_journal_their_effects(tmp_path: Path) -> None:
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    _crashed(store, "bad", "bad-1")
    for i in range(3):
        _crashed(store, "good", f"good-{i}")
    FIRED.clear()
    worker = bide.Worker(store, _agents(store), concurrency=4)
    report = asyncio.run(worker.run_once())
    assert report.completed == 3 and report.failed == 1, report
    assert report.errors == {"bad-1": "SystemExit: 3"}
    assert FIRED == ["o", "o", "o"]  # each effect once, and each one journaled:
    for i in range(3):
        journal = bide.Journal(store, f"good-{i}").load()
        assert journal.has("run:end") and journal.has("result:c1.0"), i
    store.close()


def test_a_drive_whose_sync_tool_exits_raises_system_exit_in_the_caller(tmp_path: Path) -> None:
    """Outside a worker the exit goes on to the program, from the drive itself (not as the exception of a
    task nobody retrieves), and the run's lease is given back on the way."""
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    agent = bide.Agent(ScriptedModel([call("parse", text="?"), reply("x")]), store=store, tools=[parse])

    async def drive() -> None:
        await agent.run("r", "go")

    with pytest.raises(SystemExit) as exited:
        asyncio.run(drive())
    assert exited.value.code == 3
    # Given back: the run is among those a worker may take now (a live lease would keep it out for 30 s).
    assert [lease.run_id for lease in store.expired_leases(now_ms=int(time.time() * 1000))] == ["r"]
    store.close()


APP = """
import sys
import bide
from bide.testing import ScriptedModel, reply

{body}
"""


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("sys.exit(0)", "cannot import 'exiting_app' for --app: SystemExit(0)"),
        ("sys.exit(3)", "cannot import 'exiting_app' for --app: SystemExit(3)"),
        ("def build(store):\n    sys.exit(0)", "building the agents raised SystemExit(0)"),
    ],
    ids=["import-0", "import-3", "build-0"],
)
def test_an_app_that_exits_is_a_usage_error_with_a_message(tmp_path: Path, body: str, said: str) -> None:
    (tmp_path / "exiting_app.py").write_text(APP.format(body=body))
    bide.open_store(f"sqlite:///{tmp_path / 'w.db'}").close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "bide._cli", "worker", "--store", f"sqlite:///{tmp_path / 'w.db'}",
         "--app", "exiting_app:build", "--once", "--json"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["exit_code"] == 2 and said in doc["message"], doc
    assert said in done.stderr and "Traceback" not in done.stderr
