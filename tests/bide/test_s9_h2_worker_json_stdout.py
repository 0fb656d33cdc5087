"""`bide worker --once --json` as a process: its standard output is the report and nothing else, and a stop
signal in the interpreter's last teardown leaves the pass's exit code.

1. Once the report was written, the worker gave file descriptor 1 back to standard output: what the app
   printed after the command returned (a thread a tool left running, an exit function, the interpreter's
   teardown) followed the JSON document there, and `bide worker --once --json | jq` failed. A reader of
   the pipe also waited for the process's end (for that thread) to see the report's end.
2. A stop signal landing in the interpreter's last teardown (after the exit functions: Python puts the
   signals' default actions back there) killed a worker whose report was written and exit code decided
   (exit 143 for SIGTERM, 130 for SIGINT, instead of the pass's code).

Each worker is a real process (`python -m bide._cli worker`, or the `bide` console script) on a real SQLite
store; the signals are real. To land a signal in the last teardown every time, the app leaves garbage whose
finalizer waits for the test: Python collects it after the exit functions, and after it has put the
signals' default actions back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from worker_process import REPO, WorkerProcess, wait_until

import bide
from bide.testing import Fail, ScriptedModel, call

# The tool `flush` leaves a thread running (not a daemon: the process's exit waits for it) until the file
# RELEASE exists; the thread then prints, to sys.stdout and to file descriptor 1, as an exit function does.
LINGERING_APP = '''
import atexit
import os
import pathlib
import sys
import threading
import time

import bide
from bide.testing import ScriptedModel, call, reply

RELEASE = pathlib.Path(__file__).parent / "release"


def _linger():
    print("lingering", file=sys.stderr, flush=True)
    while not RELEASE.exists():
        time.sleep(0.005)
    print("the thread's last words", flush=True)
    os.write(1, b"the thread's native last words\\n")


def _at_exit():
    print("an exit function's words", flush=True)
    os.write(1, b"an exit function's native words\\n")


atexit.register(_at_exit)


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


@bide.tool(safety=bide.Idempotent)
def flush() -> str:
    """Flush the metrics (a thread left running)."""
    threading.Thread(target=_linger, daemon=False).start()
    return "flushing"


def build(store):
    model = ScriptedModel([call("look"), call("flush"), reply("done")])
    return bide.Agent(model, store=store, tools=[look, flush], name="behind")
'''

# An exit function leaves a reference cycle whose finalizer says "last teardown" on stderr, then waits until
# the file RELEASE exists: the interpreter collects it in its last teardown, after the exit functions. With
# FAILS, the resumed drive fails (the model down again): the pass's exit code is 1.
TEARDOWN_APP = '''
import atexit
import gc
import os
import pathlib
import time

import bide
from bide.testing import Fail, ScriptedModel, call, reply

RELEASE = str(pathlib.Path(__file__).parent / "release")
FAILS = {fails!r}


class _Garbage:
    def __del__(self):
        os.write(2, b"last teardown\\n")
        while not os.path.exists(RELEASE):
            time.sleep(0.005)


def _leave_garbage():
    gc.disable()  # (collected only by the interpreter's last collection)
    garbage = _Garbage()
    garbage.cycle = garbage


atexit.register(_leave_garbage)


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


def build(store):
    model = ScriptedModel([call("look"), Fail(bide.ModelError("down again")) if FAILS else reply("done")])
    return bide.Agent(model, store=store, tools=[look], name="behind")
'''


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


def _env(tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store holding run "r1" of agent "behind", whose drive failed after its first turn (the model
    went down): the worker's to resume."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url)
    try:
        model = ScriptedModel([call("look"), Fail(bide.ModelError("down"))])
        agent = bide.Agent(model, store=store, tools=[look], name="behind")
        with pytest.raises(bide.ModelError):
            agent.run_sync("r1", "charge o-1")
    finally:
        store.close()
    return url


# -- 1. standard output holds the report only ---------------------------------------------------------------


@pytest.mark.parametrize("console_script", [False, True])
def test_stdout_is_the_report_and_ends_with_it_while_a_thread_a_tool_left_still_runs(
    tmp_path: Path, url: str, console_script: bool
) -> None:
    release = tmp_path / "release"
    worker = WorkerProcess(tmp_path, LINGERING_APP, url, "--once", "--json", console_script=console_script)
    stdout_reader = worker.readers[1]
    try:
        worker.says("lingering")
        # (before: stdout ended only with the process, after the thread's words)
        wait_until(lambda: not stdout_reader.is_alive(), "stdout to end with the report")
        assert worker.process.poll() is None  # the thread still holds the process
        report = json.loads("".join(worker.out))
        release.touch()
        code, out = worker.ended()
    finally:
        release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == 0, errors
    assert (report["completed"], report["driven"]) == (1, 1), report
    assert json.loads(out) == report, out  # nothing came after it
    for words in ("the thread's last words", "the thread's native last words", "an exit function's words",
                  "an exit function's native words"):  # fmt: skip
        assert words in errors, errors  # what the app printed went to stderr
    assert "Traceback" not in errors, errors


def test_a_failure_document_is_all_that_stdout_holds_too(tmp_path: Path) -> None:
    """The --json failure of a worker that did not run (its store does not exist): stdout is that document,
    and what the app printed at exit goes to stderr."""
    (tmp_path / "loud.py").write_text(
        "import atexit\natexit.register(print, 'an exit function prints')\nbuild = None\n"
    )
    env = _env(tmp_path)
    command = [sys.executable, "-m", "bide._cli", "worker", "--store", f"sqlite:///{tmp_path / 'runs.db'}",
               "--app", "loud:build", "--once", "--json"]  # fmt: skip
    bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}").close()  # (bide worker never creates its file)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    failure = json.loads(done.stdout)
    assert failure["exit_code"] == 2 and "must give a bide.Agent" in failure["message"], failure
    assert "an exit function prints" in done.stderr, done.stderr


def test_a_program_calling_the_command_in_process_has_its_stdout_back(tmp_path: Path, url: str) -> None:
    """Only the bide command keeps file descriptor 1 on stderr: a program that calls it in-process and goes on
    prints to its standard output again, after the report."""
    module = "h2host_app"
    (tmp_path / f"{module}.py").write_text(TEARDOWN_APP.format(fails=False).replace("gc.disable()", "pass"))
    (tmp_path / "release").touch()
    host = (
        "import os, sys\n"
        "from bide._cli import main\n"
        f"code = main(['worker', '--store', sys.argv[1], '--app', '{module}:build', '--once', '--json'])\n"
        "print('after', code, flush=True)\n"
        "os.write(1, b'native after\\n')\n"
    )
    env = _env(tmp_path)
    done = subprocess.run([sys.executable, "-c", host, url], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report, after, native = done.stdout.splitlines()
    assert json.loads(report)["completed"] == 1, report
    assert (after, native) == ("after 0", "native after"), done.stdout


# -- 2. a stop signal in the interpreter's last teardown ----------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "as_json", "console_script", "fails"),
    [
        (signal.SIGTERM, True, False, False),
        (signal.SIGINT, True, False, False),
        (signal.SIGHUP, True, False, False),
        (signal.SIGTERM, False, False, False),
        (signal.SIGTERM, True, True, False),
        (signal.SIGINT, False, True, True),
        (signal.SIGTERM, True, False, True),
    ],
)
def test_a_signal_in_the_last_teardown_leaves_the_pass_exit_code(
    tmp_path: Path, url: str, signum: int, as_json: bool, console_script: bool, fails: bool
) -> None:
    release = tmp_path / "release"
    source = TEARDOWN_APP.format(fails=fails)
    extra = ["--once", *(["--json"] if as_json else [])]
    worker = WorkerProcess(tmp_path, source, url, *extra, console_script=console_script)
    try:
        worker.says("last teardown")  # the report is written, the exit code decided, the exit functions run
        worker.process.send_signal(signum)
        release.touch()
        code, out = worker.ended()
    finally:
        release.touch()
        worker.kill()
    errors = worker.stderr()
    assert code == (1 if fails else 0), (code, errors)  # (before: -signum, killed by the default action)
    assert "Traceback" not in errors and "KeyboardInterrupt" not in errors, errors
    if as_json:
        report = json.loads(out)
        assert (len(report["errors"]), report["completed"]) == ((1, 0) if fails else (0, 1)), report
    else:
        assert out.startswith("resumed 1 run: "), out
