"""A stop signal once `bide worker` is done (its pass over, its journal committed, its report written or being
written) but its process has not exited: it waited for a thread a tool left running, for its exit functions,
or for its report's write to a full pipe. Only the THIRD stop signal ended it: `timeout 10 bide worker ...`
(one SIGTERM) waited for ever. Nothing is left to protect then, so the first signal ends it (128 plus its
number), saying on stderr what it abandoned; a process that exits by itself meanwhile keeps its own exit
code, and a program that called the command in-process keeps running with its own handlers.

Each worker is a real process (`python -m bide._cli worker`) taking real signals, on SQLite and PostgreSQL."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from worker_process import REPO, WorkerProcess, wait_until

import bide
from bide.testing import Fail, ScriptedModel, call

# With LEAVE "thread", the app's tool leaves a thread running (not a daemon: the process's exit waits for it)
# until the file RELEASE exists; with "exit", an exit function holds the process's exit instead, saying
# "exit held"; with "", neither.
APP = '''
import atexit
import pathlib
import sys
import threading
import time

import bide
from bide.testing import ScriptedModel, call, reply

HERE = pathlib.Path(__file__).parent
RELEASE = HERE / "release"
LEAVE = {leave!r}


def _wait():
    while not RELEASE.exists():
        time.sleep(0.005)


def _exit_held():
    print("exit held", file=sys.stderr, flush=True)
    _wait()


if LEAVE == "exit":
    atexit.register(_exit_held)


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


@bide.tool(safety=bide.Idempotent)
def flush() -> str:
    """Flush the metrics (a thread left running)."""
    if LEAVE == "thread":
        threading.Thread(target=_wait, daemon=False).start()
    return "flushing"


def build(store):
    model = ScriptedModel([call("look"), call("flush"), reply("done")] * 3)
    return bide.Agent(model, store=store, tools=[look, flush], name="behind")
'''

LEFT_THREADS = "exiting now, without waiting for the end of its process"
REPORT_UNWRITTEN = "exiting now, without waiting for its report to be written out"


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


def crashed_run(url: str, prefix: str) -> None:
    """Run "r1" of agent "behind" whose drive failed after its first turn: the worker's to resume."""
    store = bide.open_store(url, table_prefix=prefix)
    try:
        model = ScriptedModel([call("look"), Fail(bide.ModelError("down"))])
        agent = bide.Agent(model, store=store, tools=[look], name="behind")
        with pytest.raises(bide.ModelError):
            agent.run_sync("r1", "charge o-1")
    finally:
        store.close()


def completed(url: str, prefix: str) -> bool:
    store = bide.open_store(url, table_prefix=prefix, create=False)
    try:
        return bide.run_status(store, "r1").status == "completed"
    finally:
        store.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_one_signal_ends_a_pass_whose_exit_waits_for_a_thread_a_tool_left(
    tmp_path: Path, durable_store_spec: tuple[str, str], signum: int
) -> None:
    url, prefix = durable_store_spec
    crashed_run(url, prefix)
    worker = WorkerProcess(tmp_path, APP.format(leave="thread"), url, "--table-prefix", prefix, "--once")
    try:
        wait_until(lambda: "resumed 1 run" in "".join(worker.out), "the pass's report")
        worker.process.send_signal(signum)
        code, out = worker.ended()  # (before: it waited for ever, the thread never ending)
    finally:
        (tmp_path / "release").touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 128 + signum, errors
    assert LEFT_THREADS in errors and "its report is written" in errors, errors
    assert "Traceback" not in errors, errors
    assert "resumed 1 run: 1 completed" in out, out
    assert completed(url, prefix)


def test_one_signal_ends_a_json_pass_whose_exit_waits_for_a_thread_a_tool_left(
    tmp_path: Path, durable_store_spec: tuple[str, str]
) -> None:
    url, prefix = durable_store_spec
    crashed_run(url, prefix)
    source = APP.format(leave="thread")
    worker = WorkerProcess(tmp_path, source, url, "--table-prefix", prefix, "--once", "--json")
    try:
        wait_until(lambda: "".join(worker.out).endswith("\n"), "the pass's report")
        worker.process.send_signal(signal.SIGTERM)
        code, out = worker.ended()
    finally:
        (tmp_path / "release").touch()
        worker.kill()
    assert code == 128 + signal.SIGTERM, worker.stderr()
    assert LEFT_THREADS in worker.stderr(), worker.stderr()
    assert json.loads(out)["completed"] == 1, out


def test_the_signal_that_stopped_a_serving_worker_ends_it_when_its_exit_is_held(
    tmp_path: Path, durable_store_spec: tuple[str, str]
) -> None:
    """One SIGTERM stops it (its drives finish, its leases go back) and, once it is done, ends it if its exit
    is held (what `systemctl stop` and `timeout` send). Before, a second signal was needed (before that, a
    third): a signal taken before the worker was done never ended it."""
    url, prefix = durable_store_spec
    crashed_run(url, prefix)
    source = APP.format(leave="exit")
    worker = WorkerProcess(tmp_path, source, url, "--table-prefix", prefix, "--poll", "0.05")
    try:
        worker.says("run r1 completed")
        worker.signal_then_wait_for(signal.SIGTERM, "exit held")
        code, _ = worker.ended()
    finally:
        (tmp_path / "release").touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 128 + signal.SIGTERM, errors
    assert LEFT_THREADS in errors, errors


def full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is full: a blocking write to its write end waits until someone reads."""
    read_end, write_end = os.pipe()
    flags = fcntl.fcntl(write_end, fcntl.F_GETFL)
    fcntl.fcntl(write_end, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        while True:
            os.write(write_end, b"x" * 4096)
    except BlockingIOError:
        pass
    fcntl.fcntl(write_end, fcntl.F_SETFL, flags)
    return read_end, write_end


def writing_to_a_pipe(pid: int) -> bool:
    """Whether the process's main thread waits in a write to a full pipe."""
    try:
        return "pipe_write" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("as_json", [False, True])
def test_one_signal_ends_a_pass_whose_report_waits_for_a_full_pipe(
    tmp_path: Path, durable_store_spec: tuple[str, str], as_json: bool
) -> None:
    url, prefix = durable_store_spec
    crashed_run(url, prefix)
    module = f"w7app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP.format(leave=""))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--table-prefix", prefix,
               "--app", f"{module}:build", "--once", *(["--json"] if as_json else [])]  # fmt: skip
    read_end, write_end = full_pipe()
    process = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    try:
        wait_until(lambda: writing_to_a_pipe(process.pid), "the report's write to wait for the full pipe")
        assert completed(url, prefix)  # the pass is over: its journal is committed
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)  # (before: it waited for ever, nobody reading the pipe)
        assert process.stderr is not None
        errors = process.stderr.read().decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(read_end)
    assert code == 128 + signal.SIGTERM, errors
    assert REPORT_UNWRITTEN in errors, errors


# A program that calls the command in-process: the command's report lands a SIGTERM (as a supervisor's
# could), once the pass is over; the program goes on well past the time a signal gives a worker to exit.
HOST = """
import signal, sys, threading, time
import bide._worker_cli
from bide._cli import main


class Report:
    def __init__(self):
        self.sent = False

    def write(self, text):
        if text.strip() and not self.sent:
            self.sent = True
            signal.raise_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                isinstance(t, threading.Timer) for t in threading.enumerate()
            ):
                time.sleep(0.01)
        return len(text)

    def flush(self):
        pass


real = sys.stdout
sys.stdout = Report()
code = main(["worker", "--store", sys.argv[1], "--table-prefix", sys.argv[2], "--app", sys.argv[3],
             "--once"])
sys.stdout = real
time.sleep(2 * getattr(bide._worker_cli, "_DONE_EXITS_WITHIN_S", 2.0))  # (well past it)
print(code, "alive", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
"""


def test_a_program_calling_the_command_in_process_is_not_ended_by_a_signal_it_took(
    tmp_path: Path, durable_store_spec: tuple[str, str]
) -> None:
    url, prefix = durable_store_spec
    crashed_run(url, prefix)
    module = f"w7host_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP.format(leave=""))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", HOST, url, prefix, f"{module}:build"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 alive True", (done.stdout, done.stderr)


# A read-only lookup that runs past its 1 s timeout until RELEASE exists: the run goes on without it.
SLOW_APP = '''
import pathlib
import time

import bide
from bide.testing import ScriptedModel, call, reply

RELEASE = pathlib.Path(__file__).parent / "release"


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


@bide.tool(safety=bide.ReadOnly, timeout=1)
def slow() -> str:
    """A lookup that hangs past its timeout."""
    while not RELEASE.exists():
        time.sleep(0.005)
    return "late"


def build(store):
    model = ScriptedModel([call("look"), call("slow"), reply("done")])
    return bide.Agent(model, store=store, tools=[look, slow], name="behind")
'''


def test_the_report_is_written_while_a_read_only_call_past_its_timeout_still_runs(
    tmp_path: Path, durable_store_spec: tuple[str, str]
) -> None:
    """The run completed without the lookup; the report came only once the lookup's thread returned (the end
    of asyncio.run waits for it), and a signal meanwhile ended the worker without it."""
    url, prefix = durable_store_spec
    crashed_run(url, prefix)
    worker = WorkerProcess(tmp_path, SLOW_APP, url, "--table-prefix", prefix, "--once")
    try:
        wait_until(lambda: "resumed 1 run" in "".join(worker.out), "the report, the lookup still running")
        assert worker.process.poll() is None  # (the lookup holds the exit)
        worker.process.send_signal(signal.SIGTERM)
        code, out = worker.ended()
    finally:
        (tmp_path / "release").touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 128 + signal.SIGTERM, errors
    assert LEFT_THREADS in errors and "its report is written" in errors, errors
    assert "resumed 1 run: 1 completed" in out, out
    assert completed(url, prefix)
