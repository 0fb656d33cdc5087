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
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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


@bide.tool(safety=bide.ReadOnly, name="parse")
async def parse_async(text: str) -> str:
    """Parse with a library that exits on bad input (an async tool: it runs in a task of its own)."""
    raise SystemExit(3)


@bide.tool(timeout=30, name="charge")
async def charge_async(order: str) -> str:
    """Charge the order, asynchronously."""
    await asyncio.sleep(0.3)
    with LOCK:
        FIRED.append(order)
    return "charged"


def _agents(store: bide.Store, *, async_tools: bool = False) -> list[bide.Agent]:
    bad = ScriptedModel([call("peek", order="o"), call("parse", text="?"), reply("x")])
    good = ScriptedModel([call("peek", order="o"), call("charge", order="o"), reply("done")])
    exits, charges = (parse_async, charge_async) if async_tools else (parse, charge)
    return [
        bide.Agent(bad, store=store, tools=[peek, exits], name="bad"),
        bide.Agent(good, store=store, tools=[peek, charges], name="good"),
    ]


def _crashed(store: bide.Store, name: str, run_id: str) -> None:
    """A run of agent `name` whose first drive died after its first turn (the model went down)."""
    model = ScriptedModel([call("peek", order="o"), Fail(bide.ModelError("down"))])
    with pytest.raises(bide.ModelError):
        bide.Agent(model, store=store, tools=[peek], name=name).run_sync(run_id, "go")


@pytest.mark.parametrize("async_tools", [False, True])
def test_a_tool_exiting_fails_its_own_run_and_the_other_drives_journal_their_effects(
    tmp_path: Path, async_tools: bool
) -> None:
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    _crashed(store, "bad", "bad-1")
    for i in range(3):
        _crashed(store, "good", f"good-{i}")
    FIRED.clear()
    worker = bide.Worker(store, _agents(store, async_tools=async_tools), concurrency=4)
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


def test_a_streamed_run_whose_tool_exits_raises_it_from_the_iteration(tmp_path: Path) -> None:
    """`Agent.stream` drives the run in a task of its own: a tool's exit left the event loop from there,
    cancelling another run being driven in the same loop after its side effect, before its answer."""
    store = bide.MemoryStore()
    FIRED.clear()

    async def main() -> str:
        other = bide.Agent(
            ScriptedModel([call("charge", order="b"), reply("done")]), store=store, tools=[charge]
        )
        driving = asyncio.create_task(other.run("b", "charge b"))
        exiting = bide.Agent(ScriptedModel([call("parse", text="?"), reply("x")]), store=store, tools=[parse])
        await asyncio.sleep(0.05)
        with pytest.raises(SystemExit):
            async for _ in exiting.stream("a", "go"):
                pass
        return (await driving).answer

    assert asyncio.run(main()) == "done"
    assert FIRED == ["b"] and bide.Journal(store, "b").load().has("run:end")


def test_an_agent_lookup_that_exits_fails_only_its_run() -> None:
    """A worker's agent lookup function raising SystemExit for one run ended the worker, every other run
    undriven (`run_once` and `run_forever` alike)."""
    store = bide.MemoryStore()
    _crashed(store, "bad", "bad-1")
    _crashed(store, "good", "good-1")
    agents = {a.name: a for a in _agents(store)}

    def lookup(name: str) -> bide.Agent | None:
        if name == "bad":
            raise SystemExit(3)
        return agents.get(name)

    report = asyncio.run(bide.Worker(store, lookup).run_once())
    assert (report.completed, report.failed, report.errors) == (1, 1, {"bad-1": "SystemExit: 3"})

    async def serve() -> None:
        worker = bide.Worker(store, lookup, poll_interval=0.05)
        serving = asyncio.create_task(worker.run_forever())
        await asyncio.sleep(0.3)
        worker.stop()
        await serving  # ends when stopped, not with SystemExit

    _crashed(store, "good", "good-2")
    asyncio.run(serve())
    assert bide.Journal(store, "good-2").load().has("run:end")


def test_a_resolve_whose_claim_loses_a_race_says_when_to_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another resolver claimed the attempt between this one's read and its write: exit 7 ("not yet") had
    `retry_after` null, though the table promises a time; it is now (the next try reads what won)."""
    import contextlib
    import io

    from bide import _cli
    from bide._journal import Journal
    from bide._records import Attempt

    url = f"sqlite:///{tmp_path / 'race.db'}"
    store = bide.open_store(url)
    FIRED.clear()

    @bide.tool(timeout=30)
    def send(to: str) -> str:
        """Send (the connection drops after the request went out)."""
        raise OSError("lost after the request went out")

    with contextlib.suppress(bide.OutcomeUnknown):  # the agent's clock a minute behind: its deadline passed
        agent = bide.Agent(ScriptedModel([call("send", to="x"), reply("ok")]), store=store, tools=[send],
                           clock=lambda: time.time() - 60)  # fmt: skip
        agent.run_sync("stuck", "go")
    store.close()
    write = Journal.awrite_one

    async def racing(self: Journal, record: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(record, Attempt) and record.by == "resolver":  # another resolver's claim lands first
            await write(self, dataclasses.replace(record, claim="someone-else"), *args, **kwargs)
        return await write(self, record, *args, **kwargs)

    monkeypatch.setattr(Journal, "awrite_one", racing)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = _cli.main(["resolve", "--store", url, "stuck", "c0.0", "--failed", "lost", "--json"])
    doc = json.loads(out.getvalue())
    assert code == 7 and doc["reason"] == "not yet" and "claimed by another" in doc["message"], doc
    assert isinstance(doc["retry_after"], float) and abs(doc["retry_after"] - time.time()) < 30
