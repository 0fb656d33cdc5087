"""A synchronous side effect whose drive ends while its thread still runs: the process keeps the run's lease
until the call returns, then records its outcome, whatever ended the drive (its timeout, a cancellation,
Ctrl-C) and even when a lease renewal fails on the way. Another process's driver, with an honest reconciler,
waits meanwhile instead of deciding that the call never happened and calling it again.

Process A runs the call (it says when it started, and returns once the test lets it, past its 2 s timeout)
and process B, here, keeps driving the same run until it completes; the effect is a line appended to a
file, with the call's idempotency key. The timeout leaves a loaded machine room to start the call (a
synchronous call starts only inside its window, once a worker thread picks it up), and the test acts on
what A did, not on how long it should have taken."""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import drop_prefix

import bide
from bide._journal import Journal
from bide.testing import Call, ScriptedModel, Turn, call, reply

POSTGRES_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

_AGENT = '''
import asyncio, os, sys, time
import bide
from bide.testing import ScriptedModel, call, reply


def effects(path):
    try:
        with open(path) as f:
            return [line for line in f.read().splitlines() if line]
    except FileNotFoundError:
        return []


def make_agent(url, path, tag, release=None):
    """An agent whose charge appends a line to `path`; with `release`, the charge first writes
    `path`.started and waits (at most 60 s) until the file `release` exists."""

    def find(attempt):
        done = any(attempt.idempotency_key in line for line in effects(path))
        return bide.Outcome.succeeded("charged") if done else bide.Outcome.not_started()

    def charge(customer: str) -> str:
        """Charge a customer (synchronous)."""
        if release is not None:
            with open(path + ".started.tmp", "w"):
                pass
            os.replace(path + ".started.tmp", path + ".started")
            give_up = time.monotonic() + 60
            while not os.path.exists(release) and time.monotonic() < give_up:
                time.sleep(0.01)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{tag} {bide.current_call().idempotency_key}\\n".encode())
        os.fsync(fd)
        os.close(fd)
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=2.0, reconcile=find)
    model = ScriptedModel([call("charge", customer="alice"), reply("done")])
    return bide.Agent(model, store=bide.open_store(url), tools=[tool], lease_ttl=1.5, clock_skew=0.5)


if __name__ == "__main__":
    url, run_id, path, how = sys.argv[1:5]
    agent = make_agent(url, path, "A", path + ".release")

    async def drive():
        task = asyncio.ensure_future(agent.run(run_id, "charge alice"))
        if how == "cancelled":  # the drive is cancelled while the tool runs in its thread
            while not os.path.exists(path + ".started") and not task.done():
                await asyncio.sleep(0.01)
            task.cancel()
        await task

    try:
        asyncio.run(drive())
    except BaseException as exc:
        print("A:", type(exc).__name__, flush=True)
'''


def _kill_connections_of(application: str) -> int:
    import psycopg

    plain_url = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain_url, autocommit=True) as c:
        row = c.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (application,),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize(
    ("backend", "how"),
    [
        ("sqlite", "cancelled"),
        ("sqlite", "interrupted"),
        pytest.param("postgres", "cancelled", marks=pytest.mark.postgres),
        pytest.param("postgres", "renewal fails", marks=pytest.mark.postgres),
    ],
)
def test_a_synchronous_call_that_outlives_its_drive_fires_once_and_is_recorded(
    tmp_path: Path, backend: str, how: str
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db" if backend == "sqlite" else POSTGRES_URL
    run_id, path = f"overrun-{uuid.uuid4().hex[:10]}", tmp_path / "effects"
    script = tmp_path / "agent_a.py"
    script.write_text(_AGENT)
    child = runpy.run_path(str(script))  # B's agent and the effect file reader, as A has them
    effects, make_agent = child["effects"], child["make_agent"]
    store = bide.open_store(url)
    application = f"bide-a-{uuid.uuid4().hex[:8]}"
    a = subprocess.Popen(
        [sys.executable, str(script), url, run_id, str(path), how],
        env={**os.environ, "PGAPPNAME": application},
        stdout=subprocess.PIPE,
        text=True,
    )
    started, release = Path(f"{path}.started"), Path(f"{path}.release")
    try:
        give_up = time.monotonic() + 60
        while not started.exists():  # A's call has started in its thread
            assert a.poll() is None, a.communicate()
            assert time.monotonic() < give_up, "A's call never started"
            time.sleep(0.01)
        if how == "interrupted":
            a.send_signal(signal.SIGINT)  # Ctrl-C while the tool runs in its thread
        [marker] = [r for r in bide.Journal(store, run_id).load().records() if isinstance(r, bide.Attempt)]
        deadline = marker.deadline_ms / 1000  # on the wall clock, which A's agent uses
        # A's call returns (the test lets it) 1.5 s after B's reconciler could first decide it (the deadline
        # plus the 0.5 s skew), and at least 3 s after a failed renewal: past the 1.5 s lease and its skew,
        # had A stopped renewing.
        let_go = deadline + 2.0
        if how == "renewal fails":
            # Past the call's deadline: the drive timed out; a thread keeps the lease while the call runs on.
            time.sleep(max(0.0, deadline + 0.5 - time.time()))
            assert _kill_connections_of(application) >= 1  # one dropped connection under that thread
            let_go = time.time() + 3.0
        # B drives the same run: past the deadline and the skew, its reconciler would find no effect yet
        # and call the tool again, unless A still held the lease.
        answer = None
        give_up = time.monotonic() + 60
        while answer is None and time.monotonic() < give_up:
            time.sleep(0.2)
            if time.time() >= let_go:
                release.touch()
            b = make_agent(url, str(path), "B")
            try:
                answer = b.run_sync(run_id, "charge alice").answer
            except (bide.RunInFlight, bide.OutcomeUnknown, bide.HaltInFlight):
                continue
            finally:
                b.store.close()  # (each try opens a store: a PostgreSQL session each, left open otherwise)
        release.touch()
        out, _ = a.communicate(timeout=30)
    finally:
        release.touch()
        if a.poll() is None:
            a.kill()
    try:
        assert answer == "done", out
        fired = effects(str(path))
        assert len(fired) == 1 and fired[0].startswith("A "), fired  # A's call, once; B never called it
        results = [r for r in bide.Journal(store, run_id).load().records() if isinstance(r, bide.ToolResult)]
        assert [r.result for r in results] == ["charged"]  # A's outcome, recorded by A
        assert bide.run_status(store, run_id).status == "completed"
    finally:
        store.close()


_ENDS_RIGHT_AFTER = '''
import asyncio, sys, time
import bide
from bide.testing import ScriptedModel, call, reply

url, how = sys.argv[1:3]


@bide.tool(timeout=2.0)  # room for a loaded machine to start the call in its window
def charge(customer: str) -> str:
    """Charge a customer (synchronous): a second past its deadline, at most 2 s after it started."""
    time.sleep(3.0)
    return "charged"


store = bide.open_store(url)
agent = bide.Agent(ScriptedModel([call("charge", customer="alice"), reply("done")]), store=store,
                   tools=[charge], lease_ttl=30)
try:
    if how == "run_sync, then close":
        agent.run_sync("r", "charge alice")
    else:
        asyncio.run(agent.run("r", "charge alice"))
except bide.OutcomeUnknown as exc:
    print("halted:", exc.cause, flush=True)
if how.endswith("then close"):
    store.close()
'''


@pytest.mark.parametrize("how", ["run_sync, then close", "asyncio.run, then exit", "asyncio.run, then close"])
def test_a_script_that_ends_right_after_an_overrun_still_records_its_outcome(
    tmp_path: Path, how: str
) -> None:
    """A synchronous call runs past its timeout; the drive halts, and the script then closes its store or
    simply ends. The outcome is journaled first (run_sync returns only once it is; a normal exit waits for
    the keeper; closing the store waits for it too: closed under it, the keeper could not free the lease,
    held then for lease_ttl, nor, had the call returned later, journal its outcome), so the next drive goes
    on from it at once instead of halting for a person."""
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    script = tmp_path / "ends.py"
    script.write_text(_ENDS_RIGHT_AFTER)
    done = subprocess.run([sys.executable, str(script), url, how], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "still running past its 2s timeout" in done.stdout
    store = bide.open_store(url, create=False)
    try:
        results = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.ToolResult)]
        assert [r.result for r in results] == ["charged"]

        @bide.tool
        def charge(customer: str) -> str:
            """Charge a customer."""
            raise AssertionError("charged twice")

        model = ScriptedModel([call("charge", customer="alice"), reply("done")])  # turn 0 is replayed
        again = bide.Agent(model, store=store, tools=[charge])
        assert again.run_sync("r", "charge alice").answer == "done"  # the lease was freed, the result read
    finally:
        store.close()


_SLOW_SIBLING = '''
import asyncio, os, sys, time
import bide
from bide.testing import Call, ScriptedModel, Turn, reply

url, effects = sys.argv[1:3]


@bide.tool(timeout=2.0)  # room for a loaded machine to start the call in its window
def charge(customer: str) -> str:
    """Charge a customer (synchronous): a second past its deadline, at most 2 s after it started."""
    time.sleep(3.0)
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"charged\\n")
    os.fsync(fd)
    os.close(fd)
    return "charged"


@bide.tool(timeout=60.0, safety=bide.Idempotent)
async def ship(customer: str) -> str:
    """Ship (waits until the process is killed)."""
    await asyncio.sleep(3600)
    return "shipped"


turn = Turn(calls=(Call("charge", {"customer": "alice"}), Call("ship", {"customer": "alice"})))
store = bide.open_store(url, table_prefix=sys.argv[3])
agent = bide.Agent(ScriptedModel([turn, reply("done")]), store=store, tools=[charge, ship], lease_ttl=2.0)
asyncio.run(agent.run("r", "charge and ship"))
'''


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_sigkill_while_a_sibling_runs_keeps_the_result_of_a_call_that_overran_and_returned(
    tmp_path: Path, backend: str
) -> None:
    """A synchronous side effect runs past its timeout and then returns, while the other call of its turn
    still runs (for up to its 60 s timeout); the process is killed (SIGKILL) as soon as the call's result
    is journaled, which happens when it returns (before the fix, only once the sibling ended). The next
    drive goes on from it: no halt for a person, no second charge."""
    prefix = f"ovk{uuid.uuid4().hex[:8]}_"
    url = f"sqlite:///{tmp_path}/runs.db" if backend == "sqlite" else POSTGRES_URL
    effects = tmp_path / "effects"
    script = tmp_path / "slow_sibling.py"
    script.write_text(_SLOW_SIBLING)
    child = subprocess.Popen([sys.executable, str(script), url, str(effects), prefix])
    try:
        deadline = time.monotonic() + 60
        while not effects.exists() and time.monotonic() < deadline:
            assert child.poll() is None
            time.sleep(0.01)
        assert effects.exists(), "the call never returned"
        # Well inside the sibling's 60 s: waited for by polling, not for a fixed time a loaded machine
        # may not keep to.
        journaled = time.monotonic() + 20
        reader = bide.open_store(url, table_prefix=prefix)
        try:
            while reader.get("r", "result:c0.0") is None:
                assert child.poll() is None
                assert time.monotonic() < journaled, "the result waited for the sibling"
                time.sleep(0.01)
        finally:
            reader.close()
    finally:
        child.kill()
        child.wait()
    assert effects.read_text() == "charged\n"

    @bide.tool(timeout=60.0)
    def charge(customer: str) -> str:
        """Charge a customer (must not run again)."""
        raise AssertionError("charged twice")

    @bide.tool(timeout=60.0, safety=bide.Idempotent)
    async def ship(customer: str) -> str:
        """Ship."""
        return "shipped"

    turn = Turn(calls=(Call("charge", {"customer": "alice"}), Call("ship", {"customer": "alice"})))
    store = bide.open_store(url, table_prefix=prefix)
    try:
        model = ScriptedModel([turn, reply("done")])
        agent = bide.Agent(model, store=store, tools=[charge, ship], lease_ttl=2.0, lease_wait=60)
        assert agent.run_sync("r", "charge and ship").answer == "done"
        journal = Journal(store, "r").load()
        results = {r.call_id: r.result for r in journal.records() if isinstance(r, bide.ToolResult)}
        assert results == {"c0.0": "charged", "c0.1": "shipped"}
    finally:
        store.close()
        if backend == "postgres":
            drop_prefix(POSTGRES_URL, prefix)


def test_a_synchronous_call_that_returns_as_its_deadline_passes_keeps_its_result() -> None:
    """The call returns after its timeout fired but before the drive took in the timeout (an event loop
    busy with other runs widens that gap): what it returned is known, so it is the call's result, not a
    halt for a person. Once the call has started, the loop is held past the deadline, then the call is let
    return while the drive's wake-up for the timeout is still queued behind it. The choreography is timed
    from the call's start, and the timeout (1 s) leaves a loaded machine room to start the call, whose
    deadline is at most the timeout after it started."""
    import asyncio
    import threading

    from bide._inflight import running

    may_return, returned = threading.Event(), threading.Event()
    loop: list[asyncio.AbstractEventLoop] = []

    @bide.tool(timeout=1.0)
    def charge(customer: str) -> str:
        """Charge a customer (synchronous)."""
        loop[0].call_soon_threadsafe(hold_up, time.monotonic())
        may_return.wait(10)
        returned.set()
        return "charged"

    store = bide.open_store("memory://")
    model = ScriptedModel([call("charge", customer="alice"), reply("done")])
    agent = bide.Agent(model, store=store, tools=[charge])

    def hold_up(started: float) -> None:
        # On the loop's clock (the monotonic one), the call's deadline timer is due by started + 1 s. The
        # loop is busy until past it; then let_it_return runs after the timeout fired, before the drive.
        loop[0].call_at(started + 1.1, let_it_return)
        time.sleep(max(0.0, started + 1.2 - time.monotonic()))

    def let_it_return() -> None:
        may_return.set()
        returned.wait(10)
        [marker] = [r for r in Journal(store, "r").load().records() if isinstance(r, bide.Attempt)]
        give_up = time.monotonic() + 10
        while running(marker.claim) is not None and time.monotonic() < give_up:
            time.sleep(0.001)  # its thread records what it returned

    async def scenario() -> bide.RunResult:
        loop.append(asyncio.get_running_loop())
        return await agent.run("r", "charge alice")

    result = asyncio.run(scenario())
    assert result.answer == "done"
    outcome = Journal(store, "r").load().get("result:c0.0")
    assert isinstance(outcome, bide.ToolResult) and outcome.result == "charged"


@pytest.mark.parametrize(
    "closed_from", ["the event loop", "the event loop, as the drive is cancelled", "the tool's own thread"]
)
def test_closing_a_store_while_a_cancelled_synchronous_call_runs_neither_blocks_nor_loses_it(
    tmp_path: Path, closed_from: str
) -> None:
    """Closing waited for the call's keeper: on an event loop it held the loop up for as long as the call
    ran, and from the tool's own thread it waited for ever (the keeper waits for that very call). Now
    close() returns at once and the store is released once the keeper is done: the call's outcome is
    journaled and its run's lease freed."""
    import asyncio
    import threading

    from bide._store import EVERY_LEASE_MS

    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    started, cancelled = threading.Event(), threading.Event()
    closed, finish, returned = threading.Event(), threading.Event(), threading.Event()

    @bide.tool(timeout=60)
    def charge(customer: str) -> str:
        """Charge a customer."""
        started.set()
        if closed_from == "the tool's own thread":
            cancelled.wait(60)  # its drive is over: a keeper waits for this call
            store.close()
            closed.set()
        finish.wait(20)
        returned.set()
        return "charged"

    model = ScriptedModel([call("charge", customer="alice"), reply("done")])
    agent = bide.Agent(model, store=store, tools=[charge], lease_ttl=60)

    async def cancelled_during_the_call() -> None:
        drive = asyncio.ensure_future(agent.run("r", "charge alice"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        drive.cancel()
        if closed_from == "the event loop, as the drive is cancelled":
            # Before the drive saw its cancellation and handed the call to its keeper.
            store.close()
            closed.set()
        with pytest.raises(asyncio.CancelledError):
            await drive
        cancelled.set()
        if closed_from == "the event loop":
            store.close()
            closed.set()
        await asyncio.to_thread(closed.wait, 60)
        assert closed.is_set() and not returned.is_set()  # close() returned while the call still ran
        # Closed for everyone but the call's keeper: a drive started now would fire an effect whose result
        # the store, closing under it, could not take.
        with pytest.raises(bide.StoreError, match="is closed"):
            store.load("r")
        with pytest.raises(bide.StoreError, match="is closed"):
            await agent.run("another", "charge bob")
        finish.set()

    asyncio.run(cancelled_during_the_call())
    for thread in threading.enumerate():
        if thread.name.startswith(("bide-overrun", "bide-store-close")):
            thread.join(60)
    again = bide.open_store(url)
    try:
        assert [e.key for e in again.load("r")][-1] == "result:c0.0"
        [lease] = [lease for lease in again.expired_leases(now_ms=EVERY_LEASE_MS) if lease.run_id == "r"]
        assert lease.expires_ms == 0  # freed by the keeper, not left to expire
    finally:
        again.close()


_OVERRUN_APP = '''
import os, pathlib, time
import bide
from bide.testing import ScriptedModel, call, reply

HERE = pathlib.Path(__file__).parent


@bide.tool(timeout=1.0)
def slow_charge(order: str) -> str:
    """Charge an order (synchronous): it runs past its timeout."""
    (HERE / "started").write_text("started")
    time.sleep(float(os.environ.get("SLOW", "4")))
    with open(HERE / "ledger", "a") as ledger:
        ledger.write(order + "\\n")
    return "charged"


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


def build(store):
    model = ScriptedModel([call("look"), call("slow_charge", order="o-1"), reply("done")])
    return bide.Agent(model, store=store, tools=[look, slow_charge], name="ov", lease_ttl=3)
'''


def _overrun_app(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A store whose run "r1" failed after its first turn (the model went down), so that a worker resumes
    it, and the app (overrun_app:build) whose synchronous charge then runs past its timeout."""
    from bide.testing import Fail

    (tmp_path / "overrun_app.py").write_text(_OVERRUN_APP)
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    try:
        model = ScriptedModel([call("look"), Fail(bide.ModelError("down"))])
        app = runpy.run_path(str(tmp_path / "overrun_app.py"))
        agent = bide.Agent(model, store=store, tools=[app["look"], app["slow_charge"]], name="ov")
        with pytest.raises(bide.ModelError):
            agent.run_sync("r1", "charge o-1")
    finally:
        store.close()
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (str(tmp_path), root, os.environ.get("PYTHONPATH")) if p)
    return url, {**os.environ, "PYTHONPATH": path}


def test_a_worker_pass_counts_a_call_running_on_past_its_timeout_as_waiting(tmp_path: Path) -> None:
    """`bide worker --once` drove a run whose synchronous charge ran past its timeout, waited for the call to
    return and journal its result, then reported the run as "halted" (need a person): a person paged for it
    found the outcome recorded (`bide resolve`: exit 5). The call runs on in the worker, which journals its
    outcome: the run is counted as waiting, and the next pass goes on from the result."""
    url, env = _overrun_app(tmp_path)
    command = [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", "overrun_app:build"]
    command.append("--once")
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["halted"], report["waiting"]) == (0, 1), report
    assert (tmp_path / "ledger").read_text() == "o-1\n"
    again = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr
    store = bide.open_store(url, create=False)
    try:
        assert bide.run_status(store, "r1").status == "completed"
    finally:
        store.close()
    assert (tmp_path / "ledger").read_text() == "o-1\n"


def test_a_stop_signal_while_only_calls_past_their_timeout_run_says_what_the_worker_waits_for(
    tmp_path: Path,
) -> None:
    """A serving worker stopped (SIGTERM) while its only work was a synchronous call running on past its
    timeout (its drive over) printed nothing and exited once the call returned, seconds later: an operator
    saw a worker ignoring SIGTERM, and might SIGKILL it and turn a call about to be journaled into a halt for
    a person. It says what it waits for, at each signal."""
    url, env = _overrun_app(tmp_path)
    env["SLOW"] = "8"
    worker = subprocess.Popen(
        [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", "overrun_app:build", "--poll",
         "0.2"], stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert worker.stderr is not None
    lines: list[str] = []
    try:
        while not any("still running past its" in line for line in lines):
            line = worker.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        time.sleep(0.5)  # the halted drive ends: nothing is in flight but the call's thread
        worker.send_signal(signal.SIGTERM)
        rest = worker.communicate(timeout=120)[1]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    said = "".join(lines) + rest
    assert worker.returncode == 0, said
    assert "synchronous tool calls run on past their timeout" in said, said
    assert (tmp_path / "ledger").read_text() == "o-1\n"
