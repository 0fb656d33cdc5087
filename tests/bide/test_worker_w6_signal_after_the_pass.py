"""A stop signal that lands once `bide worker` is done, and what a second signal says it drops.

1. Once a `--once` pass was over, the worker put back the signals' default actions, then printed its report
   and exited: a SIGTERM landing then (a supervisor re-sending it, a double Ctrl-C whose first dropped the
   listing) killed it (exit -15, 143 in a shell), sometimes before its report was written; a SIGINT printed
   a bare "interrupted". A serving worker had the same window. The worker's handling stays on until the
   process exits: a signal then does not cut the report short (the exit code is the worker's), and a third
   in all exits at once.
2. A second signal while the pass's listing was unanswered said "its drives stopped where they were", of a
   pass that drove nothing, and the --json failure document had no `"listed": false`.
3. While the exit waited for synchronous tool calls running past their timeout, the signals spoke of "the
   store", and the second's last line of drives stopped where they were, although the drives had ended and
   the calls ran on to journal their outcomes.
4. The first fix of 1 ignored the signals once the worker was done: a worker whose exit waited for a thread
   a tool left could then only be killed, and the processes started meanwhile inherited the ignored signals.
5. With stderr a full pipe, the third signal's words blocked, so the worker never exited; and signals that
   landed in a tool's thread while the main thread waited in C (for that thread, at exit; for the lock of a
   stderr another thread held) were never handled: Python runs handlers in the main thread only.

Each worker is a real process (`python -m bide._cli worker`, or the `bide` console script) taking real
signals. To land a signal in the window of 1 every time, the app registers an `atexit` function that holds
the process's exit (after the worker is done) until the test lets it go: the test sends the signal while it
is held."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from worker_process import REPO, WorkerProcess, wait_until

import bide
from bide.testing import Fail, ScriptedModel, call

# Holds the process's exit (atexit: after the worker is done) until the file EXIT_RELEASE exists; with
# LISTING_RELEASE, holds the pass's listing statement in the store's thread until that file exists.
APP = '''
import atexit
import os
import sys
import time

import bide
from bide.testing import ScriptedModel, call, reply

EXIT_RELEASE = {exit_release!r}
LISTING_RELEASE = {listing_release!r}


def _held(path):
    while not os.path.exists(path):
        time.sleep(0.005)


def _exit_held():
    print("exit held", file=sys.stderr, flush=True)
    _held(EXIT_RELEASE)


atexit.register(_exit_held)


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


def build(store):
    if LISTING_RELEASE:
        apply = store._apply

        def held(cur, req):
            if req.op == "expired":
                print("listing", file=sys.stderr, flush=True)
                _held(LISTING_RELEASE)
            return apply(cur, req)

        store._apply = held
    return bide.Agent(ScriptedModel([call("look"), reply("done")]), store=store, tools=[look], name="a")
'''

# A run whose synchronous call runs past its timeout (1 s) until the file CALL_RELEASE exists.
LATE_APP = '''
import os
import pathlib
import time

import bide
from bide.testing import ScriptedModel, call, reply

HERE = pathlib.Path(__file__).parent
CALL_RELEASE = {call_release!r}


@bide.tool(timeout=1.0)
def slow_charge(order: str) -> str:
    """Charge an order (synchronous): it runs past its timeout."""
    while not os.path.exists(CALL_RELEASE):
        time.sleep(0.005)
    with open(HERE / "ledger", "a") as ledger:
        ledger.write(order + "\\n")
    return "charged"


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


def build(store):
    model = ScriptedModel([call("look"), call("slow_charge", order="o-1"), reply("done")])
    return bide.Agent(model, store=store, tools=[look, slow_charge], name="late")
'''

LATE_FIRST = (
    "still waiting for synchronous tool calls running past their timeout to return and journal their "
    "outcomes before exiting"
)


Worker = WorkerProcess


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    bide.open_store(url).close()  # (bide worker serves a store, never creates its file)
    return url


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


def crashed_run(url: str, agent_name: str) -> None:
    """Run "r1" of agent `agent_name` whose drive failed after its first turn (the model went down): the
    worker's to resume."""
    store = bide.open_store(url)
    try:
        model = ScriptedModel([call("look"), Fail(bide.ModelError("down"))])
        agent = bide.Agent(model, store=store, tools=[look], name=agent_name)
        with pytest.raises(bide.ModelError):
            agent.run_sync("r1", "charge o-1")
    finally:
        store.close()


def app(tmp_path: Path, *, hold_listing: bool = False) -> tuple[str, Path, Path]:
    exit_release, listing_release = tmp_path / "exit-release", tmp_path / "listing-release"
    held = str(listing_release) if hold_listing else ""
    source = APP.format(exit_release=str(exit_release), listing_release=held)
    return source, exit_release, listing_release


# -- 1. a signal once the worker is done --------------------------------------------------------------------


@pytest.mark.parametrize("console_script", [False, True])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_once_a_pass_is_over_leaves_its_report_and_exit_code(
    tmp_path: Path, url: str, signum: int, console_script: bool
) -> None:
    crashed_run(url, "a")
    source, exit_release, _ = app(tmp_path)
    worker = Worker(tmp_path, source, url, "--once", "--json", console_script=console_script)
    try:
        worker.says("exit held")  # the pass is over, its report written: the process has not exited
        worker.process.send_signal(signum)
        exit_release.touch()
        code, out = worker.ended()
    finally:
        exit_release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 0, errors
    assert "Traceback" not in errors and "KeyboardInterrupt" not in errors, errors
    report = json.loads(out)
    assert (report["completed"], report["listed"]) == (1, True), json.dumps(report)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_after_a_pass_stopped_while_listing_leaves_its_report_and_exits_130(
    tmp_path: Path, url: str, second: int
) -> None:
    """The double Ctrl-C: the first drops the listing (the pass is over at once), the second lands while
    the process ends."""
    source, exit_release, listing_release = app(tmp_path, hold_listing=True)
    worker = Worker(tmp_path, source, url, "--once", "--json")
    try:
        worker.says("listing")
        worker.signal_then_wait_for(signal.SIGINT, "stopping while this pass lists the runs")
        listing_release.touch()
        worker.says("exit held")
        worker.process.send_signal(second)
        exit_release.touch()
        code, out = worker.ended()
    finally:
        listing_release.touch()
        exit_release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 130, errors
    assert "Traceback" not in errors, errors
    report = json.loads(out)
    assert report["listed"] is False and report["driven"] == 0, report


def test_a_signal_once_a_serving_worker_stopped_leaves_its_exit_code(tmp_path: Path, url: str) -> None:
    source, exit_release, _ = app(tmp_path)
    worker = Worker(tmp_path, source, url, "--poll", "0.05")
    try:
        worker.says("SIGINT, SIGTERM or SIGHUP stops it")
        worker.signal_then_wait_for(signal.SIGTERM, "exit held")
        worker.process.send_signal(signal.SIGTERM)
        exit_release.touch()
        code, _ = worker.ended()
    finally:
        exit_release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 0, errors
    assert "Traceback" not in errors, errors


def test_a_program_calling_the_command_in_process_gets_its_default_handlers_back(
    tmp_path: Path, url: str
) -> None:
    """Kept to the process's exit only in the bide command: a program that goes on has its handlers back."""
    source, exit_release, _ = app(tmp_path)
    exit_release.touch()
    module = "w6host_app"
    (tmp_path / f"{module}.py").write_text(source)
    code = (
        "import signal, sys\n"
        "from bide._cli import main\n"
        f"code = main(['worker', '--store', sys.argv[1], '--app', '{module}:build', '--once'])\n"
        "print(code, signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,\n"
        "      signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    )
    path = os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 True True", done.stdout


# -- 2. a second signal while the listing is unanswered -----------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_a_second_signal_while_the_listing_is_unanswered_says_the_pass_drove_nothing(
    tmp_path: Path, url: str, as_json: bool
) -> None:
    source, exit_release, listing_release = app(tmp_path, hold_listing=True)
    exit_release.touch()
    worker = Worker(tmp_path, source, url, "--once", *(["--json"] if as_json else []))
    try:
        worker.says("listing")
        worker.signal_then_wait_for(signal.SIGTERM, "stopping while this pass lists the runs")
        worker.signal_then_wait_for(signal.SIGTERM, "this pass is cancelled")
        listing_release.touch()
        code, out = worker.ended()
    finally:
        listing_release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 130, errors
    assert "stopped while it listed the runs to recover: it drove none" in errors, errors
    assert "drives stopped where they were" not in errors, errors
    if as_json:
        failure = json.loads(out)
        assert failure["exit_code"] == 130 and failure["listed"] is False, failure
        assert "it drove none" in failure["message"] and "drives stopped" not in failure["message"], failure
    else:
        assert out == "", out


# -- 3. the exit waiting for synchronous calls past their timeout -------------------------------------------


def late_worker(tmp_path: Path, url: str, *extra: str) -> tuple[Worker, Path]:
    """A worker resuming run r1, whose synchronous call runs on past its timeout until the file returned
    exists."""
    call_release = tmp_path / "call-release"
    crashed_run(url, "late")
    return Worker(tmp_path, LATE_APP.format(call_release=str(call_release)), url, *extra), call_release


def test_signals_while_a_pass_waits_for_calls_past_their_timeout_say_so(tmp_path: Path, url: str) -> None:
    worker, call_release = late_worker(tmp_path, url, "--once")
    try:
        worker.says("waiting for synchronous tool calls running past their timeout")  # the drives are over
        worker.signal_then_wait_for(signal.SIGTERM, LATE_FIRST)
        worker.signal_then_wait_for(signal.SIGTERM, "this pass is cancelled: its drives had ended")
        call_release.touch()
        code, out = worker.ended()
    finally:
        call_release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 130, errors
    assert out == ""
    assert "waiting for the store" not in errors and "once the store has answered" not in errors, errors
    assert "drives stopped where they were" not in errors, errors
    assert "the pass was cancelled by a second signal once its drives had ended" in errors, errors
    assert (tmp_path / "ledger").read_text() == "o-1\n"  # the call ran on and journaled its outcome
    store = bide.open_store(url, create=False)
    try:
        assert bide.run_status(store, "r1").status != "halted"
    finally:
        store.close()


def test_a_second_signal_while_a_serving_worker_waits_for_calls_says_so(tmp_path: Path, url: str) -> None:
    worker, call_release = late_worker(tmp_path, url, "--poll", "0.05")
    try:
        worker.says("runs on past its timeout")  # its drive is over
        worker.signal_then_wait_for(signal.SIGTERM, "waiting for synchronous tool calls running past")
        worker.signal_then_wait_for(signal.SIGTERM, LATE_FIRST)
        call_release.touch()
        code, _ = worker.ended()
    finally:
        call_release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 0, errors
    assert "waiting for the store" not in errors, errors


# -- 4. the signals once the worker is done are counted, never ignored ---------------------------------------

# A run whose tool leaves work behind: a thread of its own (not a daemon: the process's exit waits for it)
# that, once the file SPAWN exists, starts a process and writes its pid to CHILD_PID, then waits for the file
# RELEASE; or (ASYNC) an async tool awaiting `asyncio.to_thread` of that wait, which the end of
# `asyncio.run` waits for.
THREAD_APP = '''
import asyncio
import os
import pathlib
import subprocess
import sys
import threading
import time

import bide
from bide.testing import ScriptedModel, call, reply

HERE = pathlib.Path(__file__).parent
RELEASE, SPAWN = HERE / "release", HERE / "spawn"
ASYNC = {use_async!r}


def _wait(path):
    while not path.exists():
        time.sleep(0.005)


def _behind():
    _wait(SPAWN)
    child = subprocess.Popen(["sleep", "60"])
    (HERE / "child-pid").write_text(str(child.pid))
    _wait(RELEASE)
    child.kill()


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


@bide.tool(safety=bide.Idempotent)
def flush() -> str:
    """Flush the metrics (a thread left running)."""
    threading.Thread(target=_behind, daemon=False).start()
    return "flushing"


@bide.tool(safety=bide.Idempotent)
async def wait_a_while() -> str:
    """Wait on a thread."""
    (HERE / "started").touch()
    await asyncio.to_thread(_wait, RELEASE)
    return "waited"


def build(store):
    second = call("wait_a_while") if ASYNC else call("flush")
    model = ScriptedModel([call("look"), second, reply("done")])
    return bide.Agent(model, store=store, tools=[look, flush, wait_a_while], name="behind")
'''


def test_a_third_signal_exits_at_once_while_the_end_of_the_loop_waits_for_a_to_thread_call(
    tmp_path: Path, url: str
) -> None:
    """Two signals cancel the pass (its async tool awaits `asyncio.to_thread`, whose thread the end of the
    event loop waits for): the third exits at once, as the second said. Before, it was ignored."""
    crashed_run(url, "behind")
    worker = Worker(tmp_path, THREAD_APP.format(use_async=True), url, "--once")
    try:
        wait_until((tmp_path / "started").exists, "the tool to start")
        worker.signal_then_wait_for(signal.SIGTERM, "stopping once this pass's drives finish")
        worker.signal_then_wait_for(signal.SIGTERM, "a third signal exits at once")
        worker.process.send_signal(signal.SIGTERM)
        code, _ = worker.ended()
    finally:
        (tmp_path / "release").touch()
        worker.kill()
    assert code == 128 + signal.SIGTERM, worker.stderr()


def test_a_process_started_once_the_worker_is_done_takes_signals_by_their_default_action(
    tmp_path: Path, url: str
) -> None:
    """Ignored signals are inherited: a process a tool's thread started once the worker was done survived
    SIGTERM."""
    crashed_run(url, "behind")
    worker = Worker(tmp_path, THREAD_APP.format(use_async=False), url, "--once")
    try:
        wait_until(lambda: "resumed 1 run" in "".join(worker.out), "the pass's report")
        (tmp_path / "spawn").touch()
        wait_until(lambda: (tmp_path / "child-pid").exists(), "the process to start")
        child = int((tmp_path / "child-pid").read_text())
        status = Path(f"/proc/{child}/status").read_text()
        ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGTERM - 1)) == 0, status
        assert ignored & (1 << (signal.SIGINT - 1)) == 0, status
        (tmp_path / "release").touch()
        code, _ = worker.ended()
    finally:
        (tmp_path / "release").touch()
        worker.kill()
    assert code == 0, worker.stderr()


# An app whose tool, once the worker has its report out, fills stderr (a pipe the test stops reading) and
# then holds the exit for a thread: the worker's own words then block.
FULL_STDERR_APP = THREAD_APP + '''

import fcntl


def _fill_stderr_then_wait():
    _wait(SPAWN)
    flags = fcntl.fcntl(2, fcntl.F_GETFL)
    fcntl.fcntl(2, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        while True:
            os.write(2, b"y" * 4096)
    except BlockingIOError:
        pass
    fcntl.fcntl(2, fcntl.F_SETFL, flags)
    (HERE / "full").touch()
    _wait(RELEASE)


@bide.tool(safety=bide.Idempotent)
def fill() -> str:
    """Fill stderr later."""
    threading.Thread(target=_fill_stderr_then_wait, daemon=False).start()
    return "filling"


def build(store):
    model = ScriptedModel([call("look"), call("fill"), reply("done")])
    return bide.Agent(model, store=store, tools=[look, fill], name="behind")
'''


def test_a_third_signal_exits_at_once_with_stderr_a_full_pipe(tmp_path: Path, url: str) -> None:
    """Before, the third signal's words blocked on the full pipe and the worker lived on (six SIGTERM)."""
    crashed_run(url, "behind")
    module = f"w6app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(FULL_STDERR_APP.format(use_async=False))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO), env.get("PYTHONPATH", "")])
    read_end, write_end = os.pipe()  # stderr: read by nobody once it is full
    process = subprocess.Popen(
        [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", f"{module}:build", "--once"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=write_end, text=True,
    )  # fmt: skip
    os.close(write_end)
    try:
        assert process.stdout is not None
        assert "resumed 1 run" in process.stdout.readline()
        (tmp_path / "spawn").touch()
        wait_until((tmp_path / "full").exists, "stderr to be full")
        for _ in range(3):
            process.send_signal(signal.SIGTERM)
            time.sleep(0.1)
        code = process.wait(timeout=20)
    finally:
        (tmp_path / "release").touch()
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(read_end)
    assert code == 128 + signal.SIGTERM


# A tool's thread that sends the stop signals to itself (the kernel may deliver a process's signals to any
# thread) once the file SPAWN exists, while the exit waits for it.
SELF_SIGNALLING_APP = THREAD_APP + '''

import signal


def _signals_here():
    _wait(SPAWN)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.pthread_kill(threading.get_ident(), signum)
        time.sleep(0.05)
    _wait(RELEASE)


@bide.tool(safety=bide.Idempotent)
def flush() -> str:
    """Flush the metrics (a thread left running)."""
    threading.Thread(target=_signals_here, daemon=False).start()
    return "flushing"
'''


def test_three_signals_landing_in_a_tool_s_thread_while_the_exit_waits_for_it_exit_at_once(
    tmp_path: Path, url: str
) -> None:
    """Python runs signal handlers in the main thread only, and the main thread waited in C for this thread:
    before, the signals were never handled and the worker never exited."""
    crashed_run(url, "behind")
    worker = Worker(tmp_path, SELF_SIGNALLING_APP.format(use_async=False), url, "--once")
    try:
        wait_until(lambda: "resumed 1 run" in "".join(worker.out), "the pass's report")
        (tmp_path / "spawn").touch()
        code, _ = worker.ended()
    finally:
        (tmp_path / "release").touch()
        worker.kill()
    assert code == 128 + signal.SIGHUP, worker.stderr()
    assert "exiting now" in worker.stderr()
