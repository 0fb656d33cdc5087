"""`bide worker --once --json` as a process: its standard output is the report (or the failure document)
and nothing else, and a reader of the pipe sees its end once the report is written.

1. Once the report was written, the worker gave file descriptor 1 back to standard output: what the app
   printed after the command returned (a thread a tool left running, an exit function, the interpreter's
   teardown) followed the JSON document there, and `bide worker --once --json | jq` failed. A reader of
   the pipe also waited for the process's end (for that thread) to see the report's end.
2. A re-test found the first fix's edges: the failure document of an error the command leaves to bide's
   CLI (Ctrl-C before the pass, a bug) went to stderr, stdout left empty; a child a tool forked held the
   report's pipe open (its reader waited for the child); and a process started with stdout closed (`>&-`)
   gave its tools' subprocesses no descriptor 1 at all.

Each worker is a real process (`python -m bide._cli worker`, or the `bide` console script) on a real SQLite
store; the signals are real."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
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

PLAIN_APP = '''
import bide
from bide.testing import ScriptedModel, call, reply


@bide.tool(safety=bide.ReadOnly)
def look() -> str:
    """Look the order up."""
    return "o-1 is due"


@bide.tool(safety=bide.Idempotent)
def act() -> str:
    """Act on the order (the resumed drive's call)."""
    return "acted"


def build(store):
    model = ScriptedModel([call("look"), call("act"), reply("done")])
    return bide.Agent(model, store=store, tools=[look, act], name="behind")
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
    (tmp_path / f"{module}.py").write_text(PLAIN_APP)
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


# -- 2. the re-test's edges -------------------------------------------------------------------------------


def _worker(tmp_path: Path, url: str, module: str) -> list[str]:
    """`bide worker --once --json` of the app `module` in `tmp_path`."""
    app = f"{module}:build"
    return [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", app, "--once", "--json"]


def test_ctrl_c_before_the_pass_has_its_failure_document_on_stdout(tmp_path: Path, url: str) -> None:
    """SIGINT while the app is imported: exit 130 and the --json failure document on stdout (bide._cli writes
    it; before, it went to stderr and stdout was empty)."""
    (tmp_path / "slow_app.py").write_text(
        "import pathlib, time\n"
        "pathlib.Path(__file__).with_name('importing').touch()\n"
        "time.sleep(60)\n"
        "build = None\n"
    )
    process = subprocess.Popen(_worker(tmp_path, url, "slow_app"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=_env(tmp_path),
                               cwd=tmp_path)  # fmt: skip
    try:
        wait_until(lambda: (tmp_path / "importing").exists(), "the app to be imported")
        process.send_signal(signal.SIGINT)
        out, errors = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, errors
    failure = json.loads(out)
    assert failure["exit_code"] == 130 and "interrupted" in failure["message"], failure


def test_a_bug_has_its_failure_document_on_stdout(tmp_path: Path, url: str) -> None:
    """An error the command does not expect (here the app breaks the worker's pass): exit 3, and the failure
    document on stdout."""
    (tmp_path / "broken_app.py").write_text(
        PLAIN_APP
        + "\nimport bide._worker\n\n"
        "async def _broken(self, *args, **kwargs):\n"
        "    raise RuntimeError('a bug in the pass')\n\n"
        "bide._worker.Worker.run_once = _broken\n"
    )
    done = subprocess.run(_worker(tmp_path, url, "broken_app"), capture_output=True, text=True,
                          env=_env(tmp_path), cwd=tmp_path, timeout=60)  # fmt: skip
    assert done.returncode == 3, done.stderr
    failure = json.loads(done.stdout)
    assert failure["exit_code"] == 3, failure


def test_a_child_a_tool_forks_does_not_hold_the_reports_pipe(tmp_path: Path, url: str) -> None:
    """A tool forks a child that outlives the pass (a multiprocessing pool's worker, say): the reader of the
    report sees its end once the report is written, while the child still runs."""
    (tmp_path / "forking_app.py").write_text(
        PLAIN_APP.replace(
            'return "acted"',
            'import os, pathlib, time\n'
            '    if os.fork() == 0:\n'
            '        release = pathlib.Path(__file__).with_name("release")\n'
            '        while not release.exists():\n'
            '            time.sleep(0.01)\n'
            '        os._exit(0)\n'
            '    return "acted"',
        )
    )
    process = subprocess.Popen(_worker(tmp_path, url, "forking_app"), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env=_env(tmp_path), cwd=tmp_path)  # fmt: skip
    try:
        assert process.stdout is not None
        read: list[bytes] = []
        reader = threading.Thread(target=lambda: read.append(process.stdout.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout=60)  # (before: the end came only with the child's, after the release below)
        assert read, "stdout did not end with the report while the forked child ran"
        report = json.loads(read[0])
        assert report["completed"] == 1, report
    finally:
        (tmp_path / "release").touch()
        process.wait(timeout=60)
    assert process.returncode == 0


def test_a_tools_subprocess_has_a_stdout_when_the_worker_started_with_it_closed(
    tmp_path: Path, url: str
) -> None:
    """Started with standard output closed (`>&-`): a tool's subprocess writes to /dev/null, as it would to
    a closed stdout's stand-in, and goes on (before: it had no descriptor 1, and its first echo failed)."""
    (tmp_path / "shell_app.py").write_text(
        PLAIN_APP.replace(
            'return "acted"',
            'import pathlib, subprocess\n'
            '    here = pathlib.Path(__file__).parent\n'
            '    subprocess.run(["sh", "-ec", "echo starting; touch marker"], cwd=here, check=True)\n'
            '    return "acted"',
        )
    )
    command = " ".join(shlex.quote(part) for part in _worker(tmp_path, url, "shell_app"))
    done = subprocess.run(["sh", "-c", f"exec {command} >&-"], capture_output=True, text=True,
                          env=_env(tmp_path), cwd=tmp_path, timeout=60)  # fmt: skip
    assert (tmp_path / "marker").exists(), done.stderr
    # The run completed; only the report is lost, which the command says, exit 2 (docs/cli.md).
    assert done.returncode == 2 and "standard output is closed" in done.stderr, done.stderr
    assert "run r1 completed" in done.stderr, done.stderr
